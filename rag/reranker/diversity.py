"""Round-robin across source documents: the best chunk of each document first, then the second
best of each, and so on, so that k contexts cover as many documents as the candidates allow."""
from __future__ import annotations

from collections.abc import Sequence

from rag.reranker.base import Reranker
from rag.config.schema import PositiveInt, checked
from rag.types import Chunk, Hits


class DiversityReranker(Reranker):
    @checked("reranker")
    def __init__(self, top_n: PositiveInt = 20):
        self.top_n = int(top_n)

    def rerank(self, queries: list[str], hits: Hits, chunks: Sequence[Chunk], k: int, reuse: bool = True) -> Hits:
        rows = []
        for q in range(hits.n_queries):
            per_doc: dict[str, list[int]] = {}
            for r, _ in hits.row(q)[: self.top_n]:
                per_doc.setdefault(chunks[r].doc_id, []).append(r)
            order: list[int] = []
            depth = 0
            while len(order) < k and any(depth < len(v) for v in per_doc.values()):
                order += [v[depth] for v in per_doc.values() if depth < len(v)]
                depth += 1
            # Scores are the new ranks' reciprocals: the input scores no longer order the list.
            rows.append([(r, 1.0 / (i + 1)) for i, r in enumerate(order[:k])])
        return Hits.from_rows(rows, k)
