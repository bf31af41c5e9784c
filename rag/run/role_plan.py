"""One served role's part of a dry run (rag/run/plan.py): what it would send, by cache key, and how
its prompts' tokens are counted."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rag.llm.base import CHARS_PER_TOKEN, Generator
from rag.serving.served import Served
from rag.run.settings import Pricing
from rag.types import Context


def batches(n: int, size: int) -> int:
    """How many batches of at most `size` hold `n` items."""
    return -(-n // size)


def chars_estimate(texts: list[str]) -> int:
    return int(round(sum(len(t) for t in texts) / CHARS_PER_TOKEN))


@dataclass
class RolePlan:
    """What one role would send: `units` by cache key (each [requests, items, input tokens, output
    tokens at most]), the rest (not cached between runs: queries, timed searches, bounds) in `other`."""

    role: str
    base_url: str
    model: str
    items_are: str  # what `items` counts: texts, documents, windows, answers, verdicts
    exact: bool = True
    tokens_method: str = ""
    notes: list[str] = field(default_factory=list)
    cached: int = 0  # units the cache already holds (not sent)
    units: dict[str, list[int]] = field(default_factory=dict)
    other: list[int] = field(default_factory=lambda: [0, 0, 0, 0])

    def add(self, requests: int, items: int, tokens_in: int, tokens_out: int = 0, key: str | None = None) -> None:
        row = self.units.setdefault(key, [0, 0, 0, 0]) if key else self.other
        for i, v in enumerate((requests, items, tokens_in, tokens_out)):
            row[i] += int(v)

    def totals(self) -> list[int]:
        return [sum(col) for col in zip(self.other, *self.units.values())]

    def to_json(self, pricing: Pricing | None) -> dict[str, Any]:
        requests, items, tokens_in, tokens_out = self.totals()
        price = (pricing or Pricing()).price(self.role)
        return {"base_url": self.base_url, "model": self.model, "exact": self.exact, "requests": requests,
                "items": items, "items_are": self.items_are, "cached": self.cached, "input_tokens": tokens_in,
                "output_tokens_at_most": tokens_out, "tokens_method": self.tokens_method,
                "cost": round(price.cost(requests, tokens_in, tokens_out), 6),
                "price": {"input": price.input, "output": price.output, "request": price.request},
                "notes": self.notes, "units": self.units, "other": self.other}


def endpoint_of(part: Served) -> tuple[str, str]:
    """The base URL and model of a served part's server."""
    ep = part.endpoint
    if ep is None:
        raise ValueError(f"{type(part).__name__} is not served")
    return ep.base_url, ep.model


def prompt_tokens(llm: Generator, query: str, contexts: list[Context]) -> int:
    return int(llm.count_prompt_tokens([query], [contexts])[0][0])


def prompt_method(llm: Generator) -> str:
    """How the generator counts a prompt's tokens."""
    return llm.count_prompt_tokens(["x"], [[]])[1]
