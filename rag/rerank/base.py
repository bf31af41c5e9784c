"""The reranker interface and the identity reranker (`reranker=none`)."""
from __future__ import annotations

from rag.types import Chunk, Hits


class Reranker:
    #: how many fused candidates the reranker wants to see (the retrieval depth before it)
    top_n: int = 0

    def rerank(self, queries: list[str], hits: Hits, chunks: list[Chunk], k: int) -> Hits:
        raise NotImplementedError


class NoReranker(Reranker):
    """Keeps the retrieval order: the top k of the fused list."""

    def rerank(self, queries: list[str], hits: Hits, chunks: list[Chunk], k: int) -> Hits:
        return hits.top(k)
