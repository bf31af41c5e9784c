"""A reranker that moves up the candidates sharing the most words with the question: the worked
example of docs/how-to/extending.md (run by tests/test_docs.py)."""
from __future__ import annotations

import re
from collections.abc import Sequence

from rag.reranker.base import Reranker
from rag.config.schema import PositiveInt, checked
from rag.types import Chunk, Hits

WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> set[str]:
    return set(WORD.findall(text.lower()))


class WordOverlapReranker(Reranker):
    """Orders each question's top_n candidates by the number of question words they contain;
    ties keep the first stage's order."""

    @checked("reranker")  # each argument must pass its annotation's rule (rag/config/schema.py)
    def __init__(self, top_n: PositiveInt = 20, min_word_chars: PositiveInt = 3) -> None:
        self.top_n = top_n
        self.min_word_chars = min_word_chars

    def rerank(self, queries: list[str], hits: Hits, chunks: Sequence[Chunk], k: int, reuse: bool = True) -> Hits:
        rows = []
        for q, query in enumerate(queries):
            asked = {w for w in words(query) if len(w) >= self.min_word_chars}
            candidates = hits.row(q)[: self.top_n]
            overlap = [len(asked & words(chunks[r].text)) for r, _ in candidates]
            # sorted() is stable: equal overlaps keep the retriever's order.
            order = sorted(range(len(candidates)), key=lambda i: -overlap[i])
            rows.append([(candidates[i][0], float(overlap[i])) for i in order[:k]])
        return Hits.from_rows(rows, k)
