"""Training queries from a labelled question set: real questions whose source document is known,
taken ONLY from the train part of the set's split (rag/qa/base.py QuestionSplit), so that a run which
scores the test part (or the default dev slice, which lies inside it) never scores a question the
model was trained on."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from rag.qa import QuestionSet
from rag.reranker.training.examples import Example
from rag.reranker.training.passages import PassagePool
from rag.types import QAItem, RagError


def question_set(config: Any) -> QuestionSet:
    """The configured question set (an object, or a `_target_` mapping), checked to be a train part."""
    qs = config
    if isinstance(config, Mapping):
        if "_target_" not in config:
            raise RagError("reranker.train.labelled: a mapping needs a '_target_' (e.g. rag.qa.PubMedQAQuestions)")
        from hydra.utils import instantiate

        qs = instantiate(dict(config), _convert_="all")
    if not isinstance(qs, QuestionSet):
        raise RagError(f"reranker.train.labelled: expected a question set with a split, got {type(qs).__name__}")
    if qs.split.part != "train":
        raise RagError(
            f"reranker.train.labelled: split.part must be 'train' (got {qs.split.part!r}): a reranker is "
            "trained on the train part of a question set only, never on questions a run may score"
        )
    return qs


def training_questions(config: Any) -> list[QAItem]:
    return question_set(config).load() if config is not None else []


def questions_fingerprint(items: Sequence[QAItem]) -> str:
    h = hashlib.sha256()
    for q in items:
        h.update(json.dumps([q.id, q.question, q.answer, q.source], ensure_ascii=False).encode())
    return h.hexdigest()


def labelled_examples(items: Sequence[QAItem], pool: PassagePool) -> list[Example]:
    """Each question with the passage of its source document that shares the most words with its
    answer (for PubMedQA: the passage holding the conclusion). Questions without a source or an
    answer, or whose source is not among the training documents, are left out."""
    out: list[Example] = []
    for q in items:
        if q.source is None or q.answer is None:
            continue
        row = pool.best_match(q.source, q.answer)
        if row is not None:
            p = pool.passages[row]
            out.append(Example(p.doc_id, p.source, "labelled", " ".join(q.question.split()), pool.text(row)))
    return out
