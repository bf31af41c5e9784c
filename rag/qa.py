"""Question sets: questions with ground-truth answers and, when known, the document holding it.

Each set is built from keyword arguments (Hydra) and has `load() -> list[QAItem]` (deterministic
order) and `fingerprint()`, like the corpora.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from rag.corpus.base import as_path, file_fingerprint, iter_jsonl, string_field
from rag.corpus.mixed import instantiate_parts, part_fingerprint
from rag.corpus.pubmedqa import load_pubmedqa
from rag.types import QAItem, RagError


class PubMedQAQuestions:
    """PubMedQA PQA-L: each abstract's QUESTION, answered by its LONG_ANSWER (the conclusion);
    the source is the abstract's document in PubMedQACorpus."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = as_path(path)

    def fingerprint(self) -> dict[str, Any]:
        return {"class": type(self).__name__, "inputs": file_fingerprint(self.path)}

    def load(self) -> list[QAItem]:
        return [
            QAItem(
                id=f"pubmedqa:{pmid}",
                question=rec["QUESTION"],
                answer=rec["LONG_ANSWER"],
                source=f"pmid:{pmid}",
                corpus="pubmed",
            )
            for pmid, rec in load_pubmedqa(self.path).items()
        ]


class JsonlQuestions:
    """One JSON object per line: id, question, answer, optional source (document id) and corpus
    (source tag)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = as_path(path)

    def fingerprint(self) -> dict[str, Any]:
        return {"class": type(self).__name__, "inputs": file_fingerprint(self.path)}

    def load(self) -> list[QAItem]:
        items: list[QAItem] = []
        first_line: dict[str, int] = {}
        for lineno, obj in iter_jsonl(self.path):
            where = f"{self.path}:{lineno}"
            qid = string_field(obj, "id", where)
            if qid in first_line:
                raise RagError(f"{where}: duplicate question id {qid!r} (first on line {first_line[qid]})")
            first_line[qid] = lineno
            items.append(
                QAItem(
                    id=qid,
                    question=string_field(obj, "question", where),
                    answer=string_field(obj, "answer", where),
                    source=string_field(obj, "source", where, required=False),
                    corpus=string_field(obj, "corpus", where, required=False),
                )
            )
        if not items:
            raise RagError(f"{self.path}: the question set is empty")
        return items


class MixedQuestions:
    def __init__(self, parts: Sequence[Any]) -> None:
        self.parts = instantiate_parts(parts, "MixedQuestions")

    def fingerprint(self) -> dict[str, Any]:
        return {"class": type(self).__name__, "parts": [part_fingerprint(p) for p in self.parts]}

    def load(self) -> list[QAItem]:
        items: list[QAItem] = []
        owner: dict[str, int] = {}
        for i, part in enumerate(self.parts):
            for item in part.load():
                if item.id in owner:
                    raise RagError(
                        f"MixedQuestions: duplicate question id {item.id!r} in part {i} "
                        f"({type(part).__name__}), already in part {owner[item.id]}"
                    )
                owner[item.id] = i
                items.append(item)
        if not items:
            raise RagError("MixedQuestions: the question set is empty")
        return items
