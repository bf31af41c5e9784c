"""`qa=mixed`: the questions of several sets as one."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rag.corpus.base import concatenate_parts
from rag.corpus.mixed import instantiate_parts, part_fingerprint
from rag.qa.base import QuestionSet, QuestionSplit
from rag.types import QAItem, RagError


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
