"""The data that flows between stages.

Documents and chunks are small frozen records; retrieval results (`Hits`) are arrays over chunk
row numbers so that fusion and metrics stay vectorized.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


class RagError(Exception):
    """A user-facing error: its message is one line that names the offending file, field or value."""


@dataclass(frozen=True)
class Document:
    """One document of a corpus.

    Attributes:
        id: The document id, unique in the corpus (a corpus file's `id`).
        text: Its text; chunks are character spans of it.
        source: Its group tag (a corpus file's `group`): "pubmed", "libc", "pytorch", or any tag a
            corpus of yours declares; source filters, per-group chunking and metrics read it.
        meta: Every other field of the corpus file, kept as it is (title, URL, ...).
    """

    id: str
    text: str
    source: str  # "pubmed" | "libc" | "pytorch" | anything a user corpus declares
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Document":
        return cls(id=d["id"], text=d["text"], source=d["source"], meta=d.get("meta") or {})


@dataclass(frozen=True)
class Chunk:
    id: str  # f"{doc_id}#{position}"
    doc_id: str
    text: str  # always equal to document.text[start:end]
    source: str
    start: int
    end: int
    position: int  # index of the chunk within its document (for context expansion)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Chunk":
        return cls(**{**d, "meta": d.get("meta") or {}})


def make_chunk(doc: Document, start: int, end: int, position: int, **meta: Any) -> Chunk:
    return Chunk(
        id=f"{doc.id}#{position}",
        doc_id=doc.id,
        text=doc.text[start:end],
        source=doc.source,
        start=start,
        end=end,
        position=position,
        meta=dict(meta),
    )


@dataclass(frozen=True)
class Relevance:
    """One relevance label of a question: a document, its grade (higher is more relevant), and
    optionally the character span [start, end) of the answer inside the document's text. Labels
    name documents and offsets, never chunks, so re-chunking never invalidates them."""

    doc: str
    grade: int = 1
    span: tuple[int, int] | None = None

    @property
    def unit(self) -> str:
        """The label's identity when ranking metrics count what was found: the document id, or
        the document id with the span for a span label."""
        return self.doc if self.span is None else f"{self.doc}@{self.span[0]}-{self.span[1]}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"doc": self.doc, "grade": self.grade}
        if self.span is not None:
            out["span"] = list(self.span)
        return out


# The largest relevance grade a label may carry. Graded collections use 0-3 or 0-4 (TREC, BEIR);
# trec_eval holds a grade in a C int, so a larger one (a score pasted where a grade belongs) would
# pass every other check and crash the scoring after the whole pipeline ran. Checked where labels
# are read: rag.qa (`relevant`), rag.corpus.beir (qrels) and experiments.gate (--qrels).
MAX_GRADE = 1000


def check_grade(grade: int, what: str, lo: int = 0) -> int:
    """`grade` when it lies from `lo` to MAX_GRADE; otherwise RagError naming `what` (the file,
    its line and the field)."""
    if not lo <= grade <= MAX_GRADE:
        raise RagError(f"{what} must be from {lo} to {MAX_GRADE}, got {grade} (a grade is a small whole number, e.g. 0-3)")
    return grade


@dataclass(frozen=True)
class QAItem:
    """One question of a question set.

    Attributes:
        id: The question id, unique in the set.
        question: The question text.
        answer: The ground-truth answer G; None when the set has only relevance labels (BEIR).
        source: The document id of the question's source document, the one that holds its
            answer (a question file's `doc_id`); None when not known.
        corpus: The group tag of that document (a question file's `group`).
        relevant: Graded relevance labels; empty: the source document, grade 1.
        provenance: How a generated question was made (`python -m rag.testset`); None: written by
            a person.
    """

    id: str
    question: str
    answer: str | None  # ground truth G; None when a set has only relevance labels (BEIR queries)
    source: str | None = None  # id of the document that holds the answer, when known
    corpus: str | None = None  # the source tag of that document ("pubmed", "libc", ...)
    relevant: tuple[Relevance, ...] = ()  # graded labels; empty: derived from `source`
    # How a generated question was made (python -m rag.testset: kind, passages, generator, prompts,
    # scores); None: written by a person, or unmarked. Not hashed: a frozen item stays hashable.
    provenance: dict[str, Any] | None = field(default=None, hash=False)

    @property
    def labels(self) -> tuple[Relevance, ...]:
        """The relevance labels: the explicit ones, else the source document with grade 1."""
        if self.relevant:
            return self.relevant
        return () if self.source is None else (Relevance(self.source),)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["relevant"] = [r.to_json() for r in self.relevant]
        if self.provenance is None:
            del out["provenance"]
        return out


@dataclass
class Hits:
    """Top-n results for a batch of queries: `ids[q, j]` is a chunk row (-1 = empty slot) and
    `scores[q, j]` its score, higher is better, rows sorted by descending score."""

    ids: np.ndarray  # int64 [q, n]
    scores: np.ndarray  # float32 [q, n]

    def __post_init__(self) -> None:
        self.ids = np.asarray(self.ids, dtype=np.int64)
        self.scores = np.asarray(self.scores, dtype=np.float32)
        if self.ids.shape != self.scores.shape or self.ids.ndim != 2:
            raise ValueError(f"Hits: ids {self.ids.shape} and scores {self.scores.shape} must be equal 2-d shapes")

    @property
    def n_queries(self) -> int:
        return self.ids.shape[0]

    @property
    def width(self) -> int:
        return self.ids.shape[1]

    @classmethod
    def empty(cls, n_queries: int, width: int) -> "Hits":
        return cls(np.full((n_queries, width), -1, np.int64), np.full((n_queries, width), -np.inf, np.float32))

    @classmethod
    def from_rows(cls, rows: list[list[tuple[int, float]]], width: int) -> "Hits":
        """Build from per-query lists of (chunk row, score), already sorted best first."""
        out = cls.empty(len(rows), width)
        for q, row in enumerate(rows):
            for j, (i, s) in enumerate(row[:width]):
                out.ids[q, j] = i
                out.scores[q, j] = s
        return out

    def top(self, k: int) -> "Hits":
        return Hits(self.ids[:, :k].copy(), self.scores[:, :k].copy())

    def row(self, q: int) -> list[tuple[int, float]]:
        """Valid (chunk row, score) pairs of query q, best first."""
        return [(int(i), float(s)) for i, s in zip(self.ids[q], self.scores[q]) if i >= 0]


@dataclass(frozen=True)
class Context:
    """One numbered context passage given to the LLM: the text (a chunk, possibly expanded with
    its neighbours) and a label naming where it comes from (e.g. "man fcntl(2)", "PMID 17304887")."""

    text: str
    label: str | None = None
    chunk_rows: tuple[int, ...] = ()
