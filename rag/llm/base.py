"""The generator interface and `llm=none`, which makes a retrieval-only run.

`generate(questions, contexts)` gets, per question, its numbered context passages
(`rag.types.Context`: text + source label) and returns one answer string per question, or None
for a retrieval-only run.
"""
from __future__ import annotations

from typing import Any

from rag.cache import ArtifactCache
from rag.types import Context


class Generator:
    def use_cache(self, cache: ArtifactCache) -> None:
        """Optional: the session's artifact cache, for a generator that builds or loads a model
        artifact (rag.models.UsesCache)."""

    def warm_up(self) -> None:
        """Optional: load the model so that the timed generate stage measures generation only."""

    @property
    def id(self) -> dict[str, Any]:
        """Everything that determines the answers besides the prompts (cache key of answers)."""
        return {"class": type(self).__name__}

    def generate(self, questions: list[str], contexts: list[list[Context]]) -> list[str] | None:
        raise NotImplementedError


class NoGenerator(Generator):
    """Generates nothing: the run scores retrieval only, and answer metrics are left out."""

    def generate(self, questions: list[str], contexts: list[list[Context]]) -> list[str] | None:
        return None
