"""Contextual compression: a stage between reranking and generation that cuts each question's
contexts down to what bears on the question (the reference design's algorithm notes: an
embedding filter at cosine 0.76, or an LLM extracting the relevant excerpts).

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
    contexts: list[list[Context]]
    stats: dict[str, Any]


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
        raise NotImplementedError

    def compress(self, queries: list[str], contexts: list[list[Context]]) -> Compressed:
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
