"""`qa=pubmedqa`: the questions of PubMedQA PQA-L, answered by their abstracts' conclusions."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rag.corpus.base import as_path, file_fingerprint
from rag.corpus.pubmedqa import document_text, load_pubmedqa, pmid_id
from rag.corpus.slicing import slice_questions
from rag.qa.base import QuestionSet, QuestionSplit
from rag.config.schema import FilePath, checked
from rag.types import QAItem, RagError, Relevance

PUBMEDQA_LABELS = ("conclusion", "abstract")
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

    @checked("qa")
    def __init__(
        self, path: FilePath, exclude_slice: Mapping[str, Any] | None = None, label: str = "conclusion",
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
