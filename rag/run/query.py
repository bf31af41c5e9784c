"""One question's path through a prepared pipeline: retrieve (one query at a time, as a served
system would), then rerank, each timed. A run's main pass, its latency sample (rag.run.latency) and
`rag.ask` all go through `retrieve_rerank`, so they measure the same thing.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

from rag.reranker.base import Reranker
from rag.retriever.base import Retriever
from rag.retriever.source_filter import SourceFilter
from rag.types import Chunk, Hits


def retrieve_rerank(retriever: Retriever, reranker: Reranker, query: str, source_filter: SourceFilter, depth: int,
                    chunks: Sequence[Chunk], k: int, reuse: bool = True) -> tuple[Hits, float, float]:
    """(the top k after reranking, retrieve ms, rerank ms). `reuse=False` for a timed search: the
    candidates kept by an earlier search in this process are not taken (rag.retriever)."""
    t0 = time.perf_counter()
    fused = retriever.search_one(query, depth, source_filter, reuse)
    t1 = time.perf_counter()
    hits = reranker.rerank([query], fused, chunks, k, reuse=reuse)
    return hits, 1000.0 * (t1 - t0), 1000.0 * (time.perf_counter() - t1)


def retrieve_rerank_all(retriever: Retriever, reranker: Reranker, queries: list[str], filters: list[SourceFilter],
                        depth: int, chunks: Sequence[Chunk], k: int) -> tuple[Hits, float, float]:
    """Every question's top k, one question at a time (candidates reused where kept), with the
    milliseconds spent retrieving and reranking in all."""
    out = Hits.empty(len(queries), k)
    spent = [0.0, 0.0]
    for q, (query, f) in enumerate(zip(queries, filters)):
        best, retrieve_ms, rerank_ms = retrieve_rerank(retriever, reranker, query, f, depth, chunks, k)
        spent[0] += retrieve_ms
        spent[1] += rerank_ms
        w = min(k, best.width)
        out.ids[q, :w], out.scores[q, :w] = best.ids[0, :w], best.scores[0, :w]
    return out, spent[0], spent[1]


def unfiltered_candidates(retriever: Retriever, queries: list[str], filters: list[SourceFilter],
                          depth: int) -> dict[int, Hits]:
    """For each question whose search is filtered, the top `depth` candidates of the unfiltered
    search, which measure the recall routing loses (rag.retriever.routing.lost_recall). Run
    before the filtered searches: the encoding the router left for a question is handed on to its
    filtered search, so that the check asks the embedder for nothing more."""
    dense = retriever.dense_part()
    out: dict[int, Hits] = {}
    for q, (query, f) in enumerate(zip(queries, filters)):
        if f is None:
            continue
        kept = None if dense is None else dense.routed_vectors.get(query)
        out[q] = retriever.search_one(query, depth, None)
        if dense is not None and kept is not None:
            dense.routed_vectors[query] = kept
    return out
