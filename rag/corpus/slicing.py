"""What a run reads of a corpus and its questions: a deterministic slice of both, what the slice
kept of each (`Kept`), and the checks that the questions fit the documents (unique ids, sources and
labels that exist).

Loading a corpus through the artifact cache is rag.run.artifacts' (`Artifacts.inputs`)."""
from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rag.types import Document, QAItem, RagError


@dataclass(frozen=True)
class Kept:
    """How much of one input a slice setting kept: `kept` of `of` documents, questions or answered
    questions under `setting` = `value` (None: null, keep all). A run says so wherever it took a
    sample (`line`) and records it in metrics.json's `slice` (`to_json`), so that a user's
    evaluation never loses questions without a word."""

    what: str  # "documents" | "questions" | "answered questions"
    kept: int
    of: int
    setting: str  # "slice.questions_per_corpus"
    value: int | None

    @property
    def sampled(self) -> bool:
        return self.kept < self.of

    def line(self) -> str:
        value = "null" if self.value is None else self.value
        return f"kept {self.kept} of {self.of} {self.what} ({self.setting}={value}; null keeps all)"

    def to_json(self) -> dict[str, Any]:
        return {"kept": self.kept, "of": self.of, "setting": self.setting, "value": self.value}

    @classmethod
    def from_json(cls, key: str, entry: dict[str, Any]) -> Kept:
        """An entry of metrics.json's `slice` under its key (answered_questions: "answered questions")."""
        return cls(key.replace("_", " "), entry["kept"], entry["of"], entry["setting"], entry["value"])


def check_unique_ids(ids: list[str], what: str) -> None:
    dupes = [i for i, n in Counter(ids).items() if n > 1]
    if dupes:
        raise RagError(f"{what}: duplicate id(s) {dupes[:5]}{' ...' if len(dupes) > 5 else ''}")


def content_fingerprint(docs: Iterable[Document]) -> str:
    """Hash of the documents' ids, sources and texts: the identity of a (sliced) corpus."""
    h = hashlib.sha256()
    for d in docs:
        h.update(d.id.encode())
        h.update(b"\0")
        h.update(d.source.encode())
        h.update(b"\0")
        h.update(d.text.encode())
        h.update(b"\1")
    return h.hexdigest()


def _stable_order(ids: list[str], seed: int) -> list[str]:
    # A hash order rather than random.sample: adding one document does not reshuffle the slice.
    return sorted(ids, key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).hexdigest())


def slice_questions(qa: list[QAItem], per_corpus: int | None, seed: int) -> list[QAItem]:
    """At most `per_corpus` questions of each corpus tag, chosen by a stable hash order."""
    if per_corpus is None:
        return qa
    if per_corpus <= 0:
        raise RagError(f"slice.questions_per_corpus must be positive or null, got {per_corpus}")
    by_corpus: dict[str | None, list[str]] = {}
    for q in qa:
        by_corpus.setdefault(q.corpus, []).append(q.id)
    keep = {i for ids in by_corpus.values() for i in _stable_order(ids, seed)[:per_corpus]}
    return [q for q in qa if q.id in keep]


def answer_subset(qa: list[QAItem], per_corpus: int | None, seed: int) -> list[int]:
    """Positions of the questions that get generated answers: at most `per_corpus` of each corpus
    tag, by the same stable hash order as the question slice, so the subset is a prefix of the
    slice's own order. Generation costs seconds a question while retrieval costs milliseconds,
    so a run can score retrieval on every question and answers on a sample."""
    if per_corpus is None:
        return list(range(len(qa)))
    if per_corpus <= 0:
        raise RagError(f"slice.answer_questions_per_corpus must be positive or null, got {per_corpus}")
    keep = {q.id for q in slice_questions(qa, per_corpus, seed)}
    return [i for i, q in enumerate(qa) if q.id in keep]


def slice_documents(docs: list[Document], qa: list[QAItem], per_source: int | None, seed: int) -> list[Document]:
    """Every document a kept question names (its source and labelled documents), plus distractors
    up to `per_source` per source tag."""
    if per_source is None:
        return docs
    if per_source <= 0:
        raise RagError(f"slice.docs_per_source must be positive or null, got {per_source}")
    needed = {q.source for q in qa if q.source is not None} | {r.doc for q in qa for r in q.relevant}
    by_source: dict[str, list[str]] = {}
    for d in docs:
        by_source.setdefault(d.source, []).append(d.id)
    keep = set(needed)
    for ids in by_source.values():
        n_needed = sum(1 for i in ids if i in needed)
        others = [i for i in _stable_order(ids, seed) if i not in needed]
        keep.update(others[: max(0, per_source - n_needed)])
    return [d for d in docs if d.id in keep]
