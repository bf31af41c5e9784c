"""Rerankers: `rerank(queries, hits, chunks, k) -> Hits` reorders the fused top-N down to k."""
from rag.reranker.base import NoReranker, Reranker

__all__ = ["NoReranker", "Reranker"]
