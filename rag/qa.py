"""Question sets: questions with ground-truth answers and, when known, the document holding it
and graded relevance labels (documents, optionally with the answer's character span).

Each set is built from keyword arguments (Hydra) and has `load() -> list[QAItem]` (deterministic
order) and `fingerprint()`, like the corpora, and a `split` (QuestionSplit): the part of the set
that `load()` returns.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rag.corpus.base import (aliased_field, as_path, concatenate_parts, file_fingerprint, jsonl_records, present_field,
                             text_field)
from rag.corpus.beir import BeirQuestions
from rag.corpus.mixed import instantiate_parts, part_fingerprint
from rag.corpus.pubmedqa import document_text, load_pubmedqa, pmid_id
from rag.corpus.slicing import slice_questions
from rag.types import QAItem, RagError, Relevance

__all__ = ["BeirQuestions", "JsonlQuestions", "MixedQuestions", "NoQuestions", "PubMedQAQuestions", "parse_relevant"]

PUBMEDQA_LABELS = ("conclusion", "abstract")

PARTS = ("all", "train", "test")
# The question file's fields other than the three renamable ones, and their old names.
QUESTION_NAMES = ("doc_id", "source", "group", "corpus", "relevant")
SLICE_KEYS = ("questions_per_corpus", "seed")


def _slice_setting(exclude_slice: Mapping[str, Any] | None) -> dict[str, int] | None:
    if exclude_slice is None:
        return None
    if not isinstance(exclude_slice, Mapping) or set(exclude_slice) != set(SLICE_KEYS):
        raise RagError(
            f"PubMedQAQuestions: exclude_slice must be a mapping with exactly the keys {list(SLICE_KEYS)}, "
            f"got {dict(exclude_slice) if isinstance(exclude_slice, Mapping) else exclude_slice!r}"
        )
    out = {}
    for key in SLICE_KEYS:
        value = exclude_slice[key]
        if not isinstance(value, int) or isinstance(value, bool):
            raise RagError(f"PubMedQAQuestions: exclude_slice.{key} must be an integer, got {value!r}")
        out[key] = value
    if out["questions_per_corpus"] <= 0:
        raise RagError(f"PubMedQAQuestions: exclude_slice.questions_per_corpus must be positive, "
                       f"got {out['questions_per_corpus']}")
    return out



def split_hash(question_id: str, seed: int) -> float:
    """The question's place in [0, 1) under `seed`. The same seeded SHA-256 as the slice's stable
    order (rag.corpus.slicing), so that the questions a slice keeps first are the ones with the
    smallest values: a slice of the test part, with the same seed, is the slice of the whole set
    whenever the test part holds at least as many questions as the slice keeps."""
    return int(hashlib.sha256(f"{seed}:{question_id}".encode()).hexdigest(), 16) / float(1 << 256)


@dataclass(frozen=True)
class QuestionSplit:
    """A deterministic train/test split of a question set by a seeded hash of each question id:
    `fraction` of the questions (in expectation) form the test part, the rest the train part.
    `part` is what `load()` returns: all (the default: the split changes nothing), train or test.
    A question's part depends only on its id, the seed and the fraction, never on the other
    questions, so adding questions to a set moves none of the old ones across the line."""

    fraction: float = 0.2
    seed: int = 0
    part: str = "all"

    def __post_init__(self) -> None:
        if self.part not in PARTS:
            raise RagError(f"qa.split.part must be one of {list(PARTS)}, got {self.part!r}")
        if isinstance(self.fraction, bool) or not isinstance(self.fraction, (int, float)) or not 0 < self.fraction < 1:
            raise RagError(f"qa.split.fraction must be a number in (0, 1), got {self.fraction!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise RagError(f"qa.split.seed must be an integer, got {self.seed!r}")

    @classmethod
    def of(cls, split: "QuestionSplit | Mapping[str, Any] | None") -> "QuestionSplit":
        if split is None or isinstance(split, QuestionSplit):
            return split or cls()
        if not isinstance(split, Mapping):
            raise RagError(f"qa.split must be a mapping (fraction, seed, part), got {type(split).__name__}")
        unknown = sorted(set(split) - {"fraction", "seed", "part"})
        if unknown:
            raise RagError(f"qa.split: unknown key(s) {unknown}; known: fraction, seed, part")
        return cls(**dict(split))

    def in_test(self, question_id: str) -> bool:
        return split_hash(question_id, self.seed) < self.fraction

    def part_of(self, question_id: str) -> str:
        return "test" if self.in_test(question_id) else "train"

    def apply(self, items: Sequence[QAItem]) -> list[QAItem]:
        if self.part == "all":
            return list(items)
        return [q for q in items if self.part_of(q.id) == self.part]

    def with_part(self, part: str) -> "QuestionSplit":
        return QuestionSplit(self.fraction, self.seed, part)

    @property
    def id(self) -> dict[str, Any]:
        return asdict(self)


class QuestionSet:
    """Base of the question sets: `load()` is the split's part of `items()`."""

    def __init__(self, split: QuestionSplit | Mapping[str, Any] | None = None) -> None:
        self.split = QuestionSplit.of(split)

    def items(self) -> list[QAItem]:
        raise NotImplementedError

    def inputs_fingerprint(self) -> dict[str, Any]:
        raise NotImplementedError

    def fingerprint(self) -> dict[str, Any]:
        return {"class": type(self).__name__, **self.inputs_fingerprint(), "split": self.split.id}

    def load(self) -> list[QAItem]:
        items = self.split.apply(self.items())
        if not items:
            raise RagError(f"{type(self).__name__}: the {self.split.part} part of the question set is empty")
        return items


class PubMedQAQuestions(QuestionSet):
    """PubMedQA PQA-L: each abstract's QUESTION, answered by its LONG_ANSWER (the conclusion);
    the source is the abstract's document in PubMedQACorpus.

    `label` says what is relevant: "conclusion" (default) labels the conclusion's exact character
    span in that document, so only chunks holding part of the answer count; "abstract" labels the
    whole document (any of its chunks counts), like the by-source-id metrics.

    `exclude_slice` ({questions_per_corpus, seed}) leaves out the questions that a run's question
    slice with those settings would pick from the full set: with the default run's settings this
    is the held-out remainder, disjoint from the PubMed questions the dev runs see (qa=heldout).
    """

    def __init__(
        self, path: str | os.PathLike[str], exclude_slice: Mapping[str, Any] | None = None, label: str = "conclusion",
        split: QuestionSplit | Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(split)
        if label not in PUBMEDQA_LABELS:
            raise RagError(f"qa.label must be one of {list(PUBMEDQA_LABELS)}, got {label!r}")
        self.path = as_path(path)
        self.exclude_slice = _slice_setting(exclude_slice)
        self.label = label

    def inputs_fingerprint(self) -> dict[str, Any]:
        fp: dict[str, Any] = {"inputs": file_fingerprint(self.path)}
        if self.exclude_slice is not None:
            fp["exclude_slice"] = self.exclude_slice
        if self.label != "conclusion":
            fp["label"] = self.label
        return fp

    def items(self) -> list[QAItem]:
        items = []
        for pmid, rec in load_pubmedqa(self.path).items():
            span = document_text(rec)[1] if self.label == "conclusion" else None
            items.append(
                QAItem(
                    id=f"pubmedqa:{pmid}",
                    question=rec["QUESTION"],
                    answer=rec["LONG_ANSWER"],
                    source=pmid_id(pmid),
                    corpus="pubmed",
                    relevant=(Relevance(pmid_id(pmid), 1, span),),
                )
            )
        if self.exclude_slice is None:
            return items
        # Every item carries the same corpus tag, so this is exactly the run slice's pick of them.
        dev = {q.id for q in slice_questions(items, self.exclude_slice["questions_per_corpus"], self.exclude_slice["seed"])}
        return [q for q in items if q.id not in dev]


def parse_relevant(value: Any, where: str) -> tuple[Relevance, ...]:
    """The optional `relevant` field of a JSONL question: a list of {"doc", "grade" (int >= 0,
    default 1), "span" ([start, end) character offsets into the document text, optional)}."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise RagError(f"{where}: field 'relevant' must be a list of objects, got {type(value).__name__}")
    labels = []
    for i, obj in enumerate(value):
        at = f"{where}: relevant[{i}]"
        if not isinstance(obj, dict):
            raise RagError(f"{at} must be an object with 'doc', 'grade' and optional 'span', got {type(obj).__name__}")
        unknown = sorted(set(obj) - {"doc", "grade", "span"})
        if unknown:
            raise RagError(f"{at}: unknown field(s) {unknown}; expected 'doc', 'grade', 'span'")
        doc = text_field(obj, "doc", at, is_id=True)
        grade = obj.get("grade", 1)
        if isinstance(grade, bool) or not isinstance(grade, int) or grade < 0:
            raise RagError(f"{at}: 'grade' must be a non-negative integer, got {grade!r}")
        span = obj.get("span")
        if span is not None:
            ok = (isinstance(span, list) and len(span) == 2
                  and all(isinstance(x, int) and not isinstance(x, bool) for x in span) and 0 <= span[0] < span[1])
            if not ok:
                raise RagError(f"{at}: 'span' must be [start, end] character offsets with 0 <= start < end, got {span!r}")
            span = (span[0], span[1])
        labels.append(Relevance(doc, grade, span))
    if not labels:
        raise RagError(f"{where}: field 'relevant' is an empty list; leave it out to use 'source'")
    return tuple(labels)


class JsonlQuestions(QuestionSet):
    """One JSON object per line: id, question, answer, and optionally doc_id (the id of the
    document that holds the answer), group (the question's group tag, as the corpus file's
    `group`) and relevant (graded labels, see `parse_relevant`; without it, `doc_id` is the one
    relevant document, grade 1). A question with labels may leave out the answer.

        {"id": "q1", "question": "When do backups run?", "answer": "Nightly at 02:00.", "doc_id": "note-1", "group": "ops"}

    Files written before these names read as well: `source` is the old name of `doc_id` and
    `corpus` of `group`. `id_field`, `question_field` and `answer_field` read those from fields
    of other names."""

    def __init__(self, path: str | os.PathLike[str], split: QuestionSplit | Mapping[str, Any] | None = None,
                 id_field: str = "id", question_field: str = "question", answer_field: str = "answer") -> None:
        super().__init__(split)
        self.path = as_path(path)
        self.fields = {"id": id_field, "question": question_field, "answer": answer_field}

    def inputs_fingerprint(self) -> dict[str, Any]:
        renamed = {f"{k}_field": v for k, v in self.fields.items() if v != k}
        # Only renamed fields: the default reading keeps the fingerprint it always had.
        return {"inputs": file_fingerprint(self.path), **({"fields": renamed} if renamed else {})}

    def items(self) -> list[QAItem]:
        items: list[QAItem] = []
        id_field, question_field, answer_field = self.fields.values()
        read = {*self.fields.values(), *QUESTION_NAMES}
        for where, qid, obj in jsonl_records(self.path, id_field, "question", "qa.id_field", read - {id_field}):
            relevant = parse_relevant(obj.get("relevant"), where)
            question = present_field(obj, question_field, where, "qa.question_field", taken=read - {question_field})
            # Labelled questions may leave the answer out: only the similarity metrics need it.
            answer = (text_field(obj, answer_field, where, required=False) if relevant else
                      present_field(obj, answer_field, where, "qa.answer_field", taken=read - {answer_field},
                                    otherwise="(or give graded 'relevant' labels)"))
            items.append(
                QAItem(
                    id=qid,
                    question=question,
                    answer=answer,
                    source=aliased_field(obj, "doc_id", "source", where, is_id=True)[0],
                    corpus=aliased_field(obj, "group", "corpus", where)[0],
                    relevant=relevant,
                )
            )
        if not items:
            raise RagError(f"{self.path}: the question set is empty")
        return items


class NoQuestions(QuestionSet):
    """qa=none: no question set. `python -m rag.ask` answers typed questions without one; a run,
    which scores questions, says what to add (rag.session)."""

    HINT = "qa=none: a run scores a question set; add qa=jsonl qa.path=my_questions.jsonl (python -m rag.ask needs none)"

    def inputs_fingerprint(self) -> dict[str, Any]:
        return {}

    def items(self) -> list[QAItem]:
        return []

    def load(self) -> list[QAItem]:
        return []


class MixedQuestions(QuestionSet):
    """The questions of several sets, in order (ids must be unique across them). Each part
    applies its own split first, then this set's split applies to the union."""

    def __init__(self, parts: Sequence[Any], split: QuestionSplit | Mapping[str, Any] | None = None) -> None:
        super().__init__(split)
        self.parts = instantiate_parts(parts, "MixedQuestions")

    def inputs_fingerprint(self) -> dict[str, Any]:
        return {"parts": [part_fingerprint(p) for p in self.parts]}

    def items(self) -> list[QAItem]:
        items = concatenate_parts(self.parts, "MixedQuestions", "question")
        if not items:
            raise RagError("MixedQuestions: the question set is empty")
        return items
