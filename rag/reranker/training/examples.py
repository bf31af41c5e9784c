"""What the training-data builders produce: queries with their positive passage (`Example`), and
the same with negatives from other documents (`Group`)."""
from __future__ import annotations

from dataclasses import dataclass

Pair = tuple[str, str, float]  # (query, passage, label)


@dataclass(frozen=True)
class Example:
    """A training query and the passage of its own document that answers it.

    kind names the builder (and its variant): "labelled", "template:return_value", "generated",
    "mined:man_name", ... The positive is the passage text as the model sees it."""

    doc_id: str
    source: str
    kind: str
    query: str
    positive: str


@dataclass(frozen=True)
class Group:
    """One query with its positive passage (first) and negatives from other documents."""

    query: str
    doc_id: str
    source: str
    kind: str
    positive: str
    negatives: tuple[str, ...]

    def pairs(self) -> list[Pair]:
        return [(self.query, self.positive, 1.0)] + [(self.query, n, 0.0) for n in self.negatives]
