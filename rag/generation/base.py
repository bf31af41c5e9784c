"""The generator interface and `llm=none`, which makes a retrieval-only run."""
from __future__ import annotations


class Generator:
    def generate(self, questions: list[str], contexts: list[list[str]]) -> list[str] | None:
        raise NotImplementedError


class NoGenerator(Generator):
    """Generates nothing: the run scores retrieval only, and answer metrics are left out."""

    def generate(self, questions: list[str], contexts: list[list[str]]) -> list[str] | None:
        return None
