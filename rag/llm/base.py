"""The generator interface and `llm=none`, which makes a retrieval-only run.

`generate(questions, contexts)` gets, per question, its numbered context passages
(`rag.types.Context`: text + source label) and returns one answer string per question, or None
for a retrieval-only run.

What a generator can do besides is said by attributes every generator has: `resumable` (its
answers are independent of each other, so the pipeline caches them one by one and a killed run
resumes), `endpoint` (the server it calls; None in process) with `max_tokens` (the most tokens an
answer may have, where the generator states it), and what its last `generate` measured
(`last_latencies_ms`, `last_details`, `last_stopped`, `stats`; None where it measures nothing) and
the token limit its answers may stop at (`token_limit`; `Stopped` counts them for a run).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rag.store.cache import ArtifactCache
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
    last_stopped: list[bool] | None = None  # per question: whether its answer stopped at `token_limit`
    stats: dict[str, float] | None = None  # the last generate's token counts and timings, in process

    def use_cache(self, cache: ArtifactCache) -> None:
        """Optional: the session's artifact cache, for a generator that builds or loads a model
        artifact (rag.store.models.UsesCache)."""

    def warm_up(self) -> None:
        """Optional: load the model so that the timed generate stage measures generation only."""

    @property
    def id(self) -> dict[str, Any]:
        """Everything that determines the answers besides the prompts (cache key of answers)."""
        return {"class": type(self).__name__}

    @property
    def token_limit(self) -> tuple[str, int] | None:
        """The setting that bounds an answer's tokens and its value ("llm.max_tokens", 96); None
        where no answer can stop at one (llm=extractive)."""
        return None

    def generate(self, questions: list[str], contexts: list[list[Context]]) -> list[str] | None:
        """Answers each question from its numbered context passages. Required.

        The runner calls it after `use_cache` and `warm_up`, for the answered sample of the
        questions (`slice.answer_questions_per_corpus`); a `resumable` generator gets up to 64
        questions a call and its answers are cached one by one, an in-process one gets one
        question a call (a batch's padding can change a greedy answer). Contexts are what the
        context builder (and a compressor) made: the passages the prompt numbers [1], [2], ...

        Args:
            questions: The question texts.
            contexts: Per question, its context passages in rank order (`Context.text`, and
                `Context.label` naming where the passage comes from, when `context.labels`).

        Returns:
            One answer string per question, in order (an empty string where the generator has
            nothing to say); None for a retrieval-only generator (`llm=none`): answer metrics are
            then left out.

        Example:
            A generator that answers with its first passage:

                class FirstPassage(Generator):
                    def generate(self, questions, contexts):
                        return [ctx[0].text if ctx else "" for ctx in contexts]
        """
        raise NotImplementedError

    def count_prompt_tokens(self, questions: list[str], contexts: list[list[Context]]) -> tuple[list[int], str]:
        """Each question's prompt tokens, and how they were counted (a dry run's plan); here an
        estimate from the question's and its contexts' characters."""
        chars = [len(q) + sum(len(c.text) for c in ctx) for q, ctx in zip(questions, contexts)]
        return [int(round(n / CHARS_PER_TOKEN)) for n in chars], f"estimated as characters / {CHARS_PER_TOKEN}"


@dataclass(frozen=True)
class Stopped:
    """How many of a run's answers stopped at the generator's token limit rather than ending: their
    text is cut off, which scores as a worse answer, so a run says so wherever it reports (`line`;
    metrics.json's `stopped_answers`, `to_json`)."""

    stopped: int
    of: int
    setting: str  # "llm.max_tokens"
    value: int

    def line(self) -> str:
        return f"{self.stopped} of {self.of} answers stopped at {self.setting}={self.value}"

    def to_json(self) -> dict[str, Any]:
        return {"stopped": self.stopped, "of": self.of, "setting": self.setting, "value": self.value}

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> Stopped:
        return cls(int(entry["stopped"]), int(entry["of"]), str(entry["setting"]), int(entry["value"]))


def generate_each(llm: Generator, asks: Sequence[tuple[str, list[Context]]], record: Callable[[int, str], None]) -> int:
    """Asks `llm` each (question, contexts) of `asks` and hands every reply to `record(i, reply)` as
    it arrives, so that the caller records replies one by one and a killed run keeps what it was
    answered. Served generators get 64 at a time (their requests run concurrently; a call's replies
    are recorded before the next call); in-process ones one at a time, because a batch's padding can
    change a greedy reply. A reply that held no answer (a refusal, content null: `withheld` in
    `last_details`) is handed to no one, so that nothing records it and a rerun asks again; the
    caller reads it as missing. Returns how many replies were so withheld."""
    llm.warm_up()
    step = 64 if llm.resumable else 1
    held = 0
    for start in range(0, len(asks), step):
        group = asks[start:start + step]
        replies = llm.generate([q for q, _ in group], [c for _, c in group]) or []
        for i, reply in enumerate(replies):
            if withheld(llm, i) is not None:
                held += 1
                continue
            record(start + i, str(reply or ""))
    return held


def withheld(llm: Generator, i: int = 0) -> str | None:
    """Why reply `i` of `llm`'s last generate held no answer ("refusal", "content null",
    "content_filter": rag.llm.chat_api.withheld), or None for an answer. Whoever records replies
    records none of these: a rerun is to ask again, not to read the empty reply."""
    details = llm.last_details or []
    return details[i].get("withheld") if i < len(details) and details[i] else None


class NoGenerator(Generator):
    """Generates nothing: the run scores retrieval only, and answer metrics are left out."""

    def generate(self, questions: list[str], contexts: list[list[Context]]) -> list[str] | None:
        return None
