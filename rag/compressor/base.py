"""Contextual compression: a stage between reranking and generation that cuts each question's
contexts down to what bears on the question: an embedding filter (sentences within cosine 0.76
of the question), or an LLM extracting the relevant excerpts.

A compressor's `select` returns each question's contexts as it would shorten them; `compress`
adds what every compressor shares: a question whose contexts would lose every sentence keeps its
uncompressed contexts (an empty prompt is no experiment) and is counted as a fallback, and the
characters and estimated tokens before and after are reported per run (metrics.json
`compression`). Grounding is then scored against the compressed contexts, what the LLM read.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rag.types import Context

if TYPE_CHECKING:
    from rag.endpoint import Endpoint

CHARS_PER_TOKEN = 4


@dataclass
class Compressed:
    """What `Compressor.compress` returns."""

    contexts: list[list[Context]]  # per question, the contexts the generator reads
    stats: dict[str, Any]  # metrics.json `compression`: characters and tokens before and after, fallbacks


class Compressor:
    """`select(queries, contexts) -> contexts` per question; `id` what the result depends on."""

    name = "none"
    endpoint: Endpoint | None = None  # the server it calls through its generator; None in process

    @property
    def id(self) -> dict[str, Any]:
        return {"compressor": self.name}

    def warm_up(self) -> None:
        """Load the model, so that compressing is timed apart from loading."""

    def select(self, queries: list[str], contexts: list[list[Context]]) -> list[list[Context]]:
        """Shortens each question's contexts to what bears on the question. Required.

        The runner calls it through `compress`, after `warm_up`, for the answered questions,
        between the context builder and the generator.

        Args:
            queries: The question texts.
            contexts: Per question, its context passages in rank order.

        Returns:
            Per question, its contexts as this compressor shortens them: the same number of lists
            as `contexts`; a context may be cut down, kept or dropped, and its `label` and
            `chunk_rows` should be kept (`dataclasses.replace(context, text=...)`). A question
            left with no text at all gets its contexts back whole from `compress`.

        Example:
            Keep each context's first sentence:

                class FirstSentence(Compressor):
                    name = "first_sentence"

                    def select(self, queries, contexts):
                        return [[replace(c, text=c.text.split(". ")[0]) for c in ctx] for ctx in contexts]
        """
        raise NotImplementedError

    def compress(self, queries: list[str], contexts: list[list[Context]]) -> Compressed:
        """What the runner calls: `select`, with what every compressor shares. Not to override.

        Args:
            queries: The question texts.
            contexts: Per question, its context passages in rank order.

        Returns:
            `Compressed`: the contexts the generator reads (a question whose selection would be
            empty keeps its contexts whole, counted as a fallback) and the run's `compression`
            statistics (characters and estimated tokens before and after, fallbacks, seconds).

        Raises:
            ValueError: `select` returned another number of context lists than questions.
        """
        t0 = time.perf_counter()
        chosen = self.select(queries, contexts)
        if len(chosen) != len(contexts):
            raise ValueError(f"compressor: {len(chosen)} context lists for {len(contexts)} questions")
        out: list[list[Context]] = []
        fallbacks: list[int] = []
        for q, (kept, full) in enumerate(zip(chosen, contexts)):
            if full and not any(c.text.strip() for c in kept):
                fallbacks.append(q)
                kept = full
            out.append(list(kept))
        before = sum(len(c.text) for ctx in contexts for c in ctx)
        after = sum(len(c.text) for ctx in out for c in ctx)
        stats = {
            "compressor": self.name,
            "questions": len(contexts),
            "chars_before": before,
            "chars_after": after,
            "chars_removed_share": round(1 - after / before, 4) if before else 0.0,
            "tokens_removed_estimate": round((before - after) / CHARS_PER_TOKEN),
            "fallback_questions": len(fallbacks),
            "fallbacks": fallbacks,
            "seconds": round(time.perf_counter() - t0, 3),
        }
        return Compressed(out, stats)


class NoCompressor(Compressor):
    """`compressor=none`: the contexts as the context builder made them."""

    def select(self, queries: list[str], contexts: list[list[Context]]) -> list[list[Context]]:
        return contexts

    def compress(self, queries: list[str], contexts: list[list[Context]]) -> Compressed:
        return Compressed(contexts, {})
