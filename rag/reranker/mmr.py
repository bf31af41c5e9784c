"""Maximal Marginal Relevance (Carbonell & Goldstein, 1998).

Greedily picks the candidate maximizing  lambda * sim(q, d) - (1 - lambda) * max_{s in S} sim(d, s),
with cosine similarities from the pipeline's embedder. Chunk vectors come from the cached vector
artifact (no re-encoding); only the query is encoded.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rag.store.cache import ArtifactCache
from rag.store.models import use_cache
from rag.reranker.base import Reranker
from rag.config.schema import Fraction, PositiveInt, checked
from rag.types import Chunk, Hits


class MMRReranker(Reranker):
    @checked("reranker")
    def __init__(self, embedder: Any, lambda_mult: Fraction = 0.7, top_n: PositiveInt = 20):
        self.embedder, self.lambda_mult, self.top_n = embedder, float(lambda_mult), int(top_n)
        self._vectors: np.ndarray | None = None

    def use_cache(self, cache: ArtifactCache) -> None:
        use_cache(self.embedder, cache)  # the embedder's ONNX export (queries are encoded here)

    def prepare(self, artifacts: Any) -> None:
        self._vectors = artifacts.vectors(self.embedder)

    def warm_up(self) -> None:
        self.embedder.encode_queries(["warm-up"])

    def _chunk_vectors(self, rows: list[int], chunks: Sequence[Chunk]) -> np.ndarray:
        if self._vectors is not None:
            return np.asarray(self._vectors[rows], np.float32)
        return self.embedder.encode([chunks[r].text for r in rows], show_progress=False)

    def rerank(self, queries: list[str], hits: Hits, chunks: Sequence[Chunk], k: int, reuse: bool = True) -> Hits:
        q_vecs = self.embedder.encode_queries(queries)
        out: list[list[tuple[int, float]]] = []
        for q in range(hits.n_queries):
            rows = [r for r, _ in hits.row(q)[: self.top_n]]
            if not rows:
                out.append([])
                continue
            vecs = _normalize(self._chunk_vectors(rows, chunks))
            relevance = vecs @ _normalize(q_vecs[q : q + 1])[0]
            out.append(mmr_order(relevance, vecs @ vecs.T, self.lambda_mult, k, rows))
        return Hits.from_rows(out, k)


def mmr_order(relevance: np.ndarray, pairwise: np.ndarray, lambda_mult: float, k: int, rows: list[int]) -> list[tuple[int, float]]:
    """The MMR selection over candidates (indices into `rows`), with each pick's MMR score."""
    chosen: list[int] = []
    picked: list[tuple[int, float]] = []
    remaining = list(range(len(rows)))
    while remaining and len(chosen) < k:
        redundancy = pairwise[np.ix_(remaining, chosen)].max(axis=1) if chosen else np.zeros(len(remaining))
        mmr = lambda_mult * relevance[remaining] - (1.0 - lambda_mult) * redundancy
        best = int(np.argmax(mmr))
        i = remaining.pop(best)
        chosen.append(i)
        picked.append((rows[i], float(mmr[best])))
    # MMR scores are not monotone along the picks; rank-reciprocal scores keep the order explicit.
    return [(r, 1.0 / (j + 1)) for j, (r, _) in enumerate(picked)]


def _normalize(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(n > 0, n, 1.0)
