"""The passages questions are written from, and which of them are asked about.

Documents are cut by a chunker (`testset.passages`: whole sentences up to 500 characters by
default), each passage keeping its character span in its document. A passage too short or not
prose is never asked about. The passages asked about are drawn so that every source (group) and,
within it, every document gets its share: sources in turn, and within a source its documents in
turn, each in a seeded order, before any document gives a second passage. Each drawn passage gets
the question kind furthest below its share so far; a two-passage question needs a second passage
of the same document.
"""
from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rag.reranker.training.dataset import take_in_turn
from rag.reranker.training.passages import Passage
from rag.reranker.training.text import clean_markup, is_prose
from rag.testset.prompts import TWO_PASSAGE
from rag.types import Document


@dataclass(frozen=True)
class Slot:
    """One question to ask for: its kind and its passages' rows (two of one document for a
    two-passage question)."""

    kind: str
    rows: tuple[int, ...]


class Passages:
    """Every passage of the documents, in document order, with its id (`<doc_id>#<n>`)."""

    def __init__(self, docs: Sequence[Document], chunker: Any) -> None:
        self.items: list[Passage] = []
        self.ids: list[str] = []
        self.by_doc: dict[str, list[int]] = {}
        for d in docs:
            for n, c in enumerate(chunker.split(d)):
                self.by_doc.setdefault(d.id, []).append(len(self.items))
                self.ids.append(f"{d.id}#{n}")
                self.items.append(Passage(d.id, d.source, d.text[c.start:c.end], c.start, c.end))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, row: int) -> Passage:
        return self.items[row]

    def containing(self, doc_id: str, offset: int) -> int | None:
        """The row of the passage of `doc_id` whose span holds `offset`."""
        return next((r for r in self.by_doc.get(doc_id, ()) if self.items[r].start <= offset < self.items[r].end), None)


def prose_share(text: str) -> float:
    """The share of a passage's characters on lines that read as prose (markup resolved; a line of
    code, a table row or a table of contents entry does not)."""
    lines = [clean_markup(line) for line in text.splitlines()]
    total = sum(len(line) for line in lines)
    return sum(len(line) for line in lines if line and is_prose(line)) / total if total else 0.0


def askable(passages: Passages, min_chars: int, min_prose: float) -> tuple[list[int], dict[str, int]]:
    """The rows long enough and prose enough to be asked about, and how many each rule dropped."""
    rows: list[int] = []
    dropped = {"short": 0, "not_prose": 0}
    for row, p in enumerate(passages.items):
        if len(" ".join(p.text.split())) < min_chars:
            dropped["short"] += 1
        elif prose_share(p.text) < min_prose:
            dropped["not_prose"] += 1
        else:
            rows.append(row)
    return rows, dropped


def round_robin(queues: Sequence[Sequence[Any]]) -> list[Any]:
    """One item of each queue in turn, each queue's order kept, until all are empty."""
    out: list[Any] = []
    for i in range(max((len(q) for q in queues), default=0)):
        out.extend(q[i] for q in queues if i < len(q))
    return out


def spread(keys: Sequence[tuple[str, str]], rng: random.Random) -> list[int]:
    """The items' indices in drawing order, given each item's (source, document): sources in turn,
    a source's documents in turn, both in a seeded order, a document's items in a seeded order."""
    by_source: dict[str, dict[str, list[int]]] = {}
    for i, (source, doc) in enumerate(keys):
        by_source.setdefault(source, {}).setdefault(doc, []).append(i)
    per_source = []
    for source in sorted(by_source, key=lambda s: (rng.random(), s)):
        # take_in_turn visits its buckets in sorted key order: a random number first shuffles them
        docs = {(rng.random(), doc): items for doc, items in sorted(by_source[source].items())}
        per_source.append(take_in_turn(docs, sum(map(len, docs.values())), rng))
    return round_robin(per_source)


def draw(rows: Sequence[int], passages: Passages, m: int, kinds: Sequence[tuple[str, float]],
         seed: int) -> list[Slot]:
    """Up to m slots over the askable `rows` (module docstring)."""
    rng = random.Random(f"testset:{seed}")
    askable_rows = set(rows)
    partner: dict[int, int] = {}  # a passage's neighbour in its document, for a two-passage question
    for doc_rows in passages.by_doc.values():
        ok = [r for r in doc_rows if r in askable_rows]
        for a, b in zip(ok, ok[1:] + ok[-2:-1]):
            if a != b:
                partner[a] = b
    counts = {k: 0 for k, _ in kinds}
    slots: list[Slot] = []
    keys = [(passages[r].source, passages[r].doc_id) for r in rows]
    for r in [rows[i] for i in spread(keys, rng)][:m]:
        possible = [(k, share) for k, share in kinds if k != TWO_PASSAGE or r in partner]
        if not possible:
            continue
        n = len(slots) + 1
        kind = max(possible, key=lambda ks: ks[1] * n - counts[ks[0]])[0]
        counts[kind] += 1
        slots.append(Slot(kind, tuple(sorted((r, partner[r]))) if kind == TWO_PASSAGE else (r,)))
    return slots


def spread_counts(counts: Mapping[str, int], keys: Sequence[str]) -> dict[str, float]:
    """min, median and max of the counts over `keys` (a key with no count counts 0)."""
    values = sorted(counts.get(k, 0) for k in keys)
    if not values:
        return {"min": 0, "median": 0, "max": 0}
    mid = len(values) // 2
    median = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
    return {"min": values[0], "median": median, "max": values[-1]}
