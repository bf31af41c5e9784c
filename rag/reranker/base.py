"""The reranker interface and the identity reranker (`reranker=none`).

The pipeline retrieves `max(k, reranker.top_n)` fused candidates, calls `use_cache(cache)` (the
session's artifact cache, for a reranker that builds or loads a model artifact), `prepare(artifacts)`
once (access to cached chunk vectors), `warm_up()` (load models outside timed stages), then
`rerank(queries, hits, chunks, k, reuse)`, which returns the best k of each row of `hits`.
`reuse=False` (a timed search, rag.run.latency) means: compute, take nothing remembered from an earlier
call (the cross-encoder records its scores in the cache; the others remember nothing).

A reranker behind a server has an `endpoint` (its own, or its generator's), with `counter` (the
tokenizer that counts what is sent, when set); `usage` is what a reranker that counts its requests
sent (None where it counts nothing).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rag.store.cache import ArtifactCache
from rag.types import Chunk, Hits, QAItem

if TYPE_CHECKING:
    from rag.endpoint import Endpoint
    from rag.store.models import TokenCounter


class Reranker:
    #: how many fused candidates the reranker wants to see (the retrieval depth before it)
    top_n: int = 0
    endpoint: Endpoint | None = None
    counter: TokenCounter | None = None
    usage: dict[str, Any] | None = None
    #: the corpora its model learnt from (rag.run.fitted.corpus_record each), once the model is loaded;
    #: None where it is not known (a model trained elsewhere, or no model)
    fitted_on: list[dict[str, Any]] | None = None

    def use_cache(self, cache: ArtifactCache) -> None:
        """Optional: the session's artifact cache (rag.store.models.UsesCache)."""

    def prepare(self, artifacts: Any) -> None:
        """Optional: receives rag.run.artifacts.Artifacts (cache, chunk set, cached vectors)."""

    def warm_up(self) -> None:
        """Optional: load models so that the timed rerank stage measures reranking only."""

    def check_questions(self, questions: list[QAItem]) -> None:
        """Optional: refuse (RagError) to rank questions the reranker was trained on."""

    def rerank(self, queries: list[str], hits: Hits, chunks: Sequence[Chunk], k: int, reuse: bool = True) -> Hits:
        """Reorders each question's fused candidates and keeps the best `k`. Required.

        The runner calls it once per batch of questions, after `use_cache`, `prepare` and
        `warm_up`, with every question's fused top `max(k, top_n)` candidates, best first; row
        `q` of `hits` belongs to `queries[q]`.

        Args:
            queries: The question texts, one per row of `hits`.
            hits: The candidates: `hits.ids[q, j]` is a row of `chunks` (-1 marks an empty slot,
                after the last candidate) and `hits.scores[q, j]` its fused score, higher first.
            chunks: The run's chunks, indexed by the rows in `hits` (`chunks[row].text`).
            k: How many candidates to keep per question.
            reuse: False for a timed search (rag.run.latency): compute afresh, returning nothing
                remembered from an earlier call.

        Returns:
            Hits of width `k`, one row per question, best first; a row with fewer than `k`
            candidates is padded with -1 ids (`Hits.from_rows` pads).

        Example:
            A reranker that keeps the retrieval order, as `reranker=none` does:

                class KeepOrder(Reranker):
                    def rerank(self, queries, hits, chunks, k, reuse=True):
                        return hits.top(k)
        """
        raise NotImplementedError


class NoReranker(Reranker):
    """Keeps the retrieval order: the top k of the fused list."""

    def rerank(self, queries: list[str], hits: Hits, chunks: Sequence[Chunk], k: int, reuse: bool = True) -> Hits:
        return hits.top(k)
