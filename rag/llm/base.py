"""The generator interface and `llm=none`, which makes a retrieval-only run.

`generate(questions, contexts)` gets, per question, its numbered context passages
(`rag.types.Context`: text + source label) and returns one answer string per question, or None
for a retrieval-only run.

What a generator can do besides is said by attributes every generator has: `resumable` (its
answers are independent of each other, so the pipeline caches them one by one and a killed run
resumes), `endpoint` (the server it calls; None in process) with `max_tokens` (the most tokens an
answer may have, where the generator states it), and what its last `generate` measured
(`last_latencies_ms`, `last_details`, `stats`; None where it measures nothing).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rag.cache import ArtifactCache
from rag.types import Context

if TYPE_CHECKING:
    from rag.endpoint import Endpoint

CHARS_PER_TOKEN = 4  # the estimate of tokens where no tokenizer counts them


class Generator:
    resumable: bool = False
    endpoint: Endpoint | None = None
    max_tokens: int = 0  # 0: not stated
    last_latencies_ms: list[float] | None = None  # each question's share of the last generate
    last_details: list[dict[str, Any]] | None = None  # per question: the server's usage, finish reason, model
    stats: dict[str, float] | None = None  # the last generate's token counts and timings, in process

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

    def count_prompt_tokens(self, questions: list[str], contexts: list[list[Context]]) -> tuple[list[int], str]:
        """Each question's prompt tokens, and how they were counted (a dry run's plan); here an
        estimate from the question's and its contexts' characters."""
        chars = [len(q) + sum(len(c.text) for c in ctx) for q, ctx in zip(questions, contexts)]
        return [int(round(n / CHARS_PER_TOKEN)) for n in chars], f"estimated as characters / {CHARS_PER_TOKEN}"


def generate_each(llm: Generator, asks: Sequence[tuple[str, list[Context]]], record: Callable[[int, str], None]) -> None:
    """Asks `llm` each (question, contexts) of `asks` and hands every reply to `record(i, reply)` as
    it arrives, so that the caller records replies one by one and a killed run keeps what it was
    answered. Served generators get 64 at a time (their requests run concurrently; a call's replies
    are recorded before the next call); in-process ones one at a time, because a batch's padding can
    change a greedy reply."""
    llm.warm_up()
    step = 64 if llm.resumable else 1
    for start in range(0, len(asks), step):
        group = asks[start:start + step]
        replies = llm.generate([q for q, _ in group], [c for _, c in group]) or []
        for i, reply in enumerate(replies):
            record(start + i, str(reply or ""))


class NoGenerator(Generator):
    """Generates nothing: the run scores retrieval only, and answer metrics are left out."""

    def generate(self, questions: list[str], contexts: list[list[Context]]) -> list[str] | None:
        return None
