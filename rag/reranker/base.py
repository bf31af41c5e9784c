"""The reranker interface and the identity reranker (`reranker=none`).

The pipeline retrieves `max(k, reranker.top_n)` fused candidates, calls `use_cache(cache)` (the
session's artifact cache, for a reranker that builds or loads a model artifact), `prepare(artifacts)`
once (access to cached chunk vectors), `warm_up()` (load models outside timed stages), then
`rerank(queries, hits, chunks, k, reuse)`, which returns the best k of each row of `hits`.
`reuse=False` (a timed search, rag.latency) means: compute, take nothing remembered from an earlier
call (the cross-encoder records its scores in the cache; the others remember nothing).

A reranker behind a server has an `endpoint` (its own, or its generator's), with `counter` (the
tokenizer that counts what is sent, when set); `usage` is what a reranker that counts its requests
sent (None where it counts nothing).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rag.cache import ArtifactCache
from rag.types import Chunk, Hits, QAItem

if TYPE_CHECKING:
    from rag.endpoint import Endpoint
    from rag.models import TokenCounter


class Reranker:
    #: how many fused candidates the reranker wants to see (the retrieval depth before it)
    top_n: int = 0
    endpoint: Endpoint | None = None
    counter: TokenCounter | None = None
    usage: dict[str, Any] | None = None

    def use_cache(self, cache: ArtifactCache) -> None:
        """Optional: the session's artifact cache (rag.models.UsesCache)."""

    def prepare(self, artifacts: Any) -> None:
        """Optional: receives rag.artifacts.Artifacts (cache, chunk set, cached vectors)."""

    def warm_up(self) -> None:
        """Optional: load models so that the timed rerank stage measures reranking only."""

    def check_questions(self, questions: list[QAItem]) -> None:
        """Optional: refuse (RagError) to rank questions the reranker was trained on."""

    def rerank(self, queries: list[str], hits: Hits, chunks: Sequence[Chunk], k: int, reuse: bool = True) -> Hits:
        raise NotImplementedError


class NoReranker(Reranker):
    """Keeps the retrieval order: the top k of the fused list."""

    def rerank(self, queries: list[str], hits: Hits, chunks: Sequence[Chunk], k: int, reuse: bool = True) -> Hits:
        return hits.top(k)
