"""The retriever interface, shared by the dense (rag/retriever/dense.py), BM25 (lexical.py) and
hybrid (hybrid.py) retrievers.

A retriever is built by Hydra from `conf/retriever/*.yaml`, then `prepare(artifacts)` builds or
loads what it searches (through the artifact cache), then `search(queries, n, filters)` returns
`Hits` over chunk rows. `filters[q]` is the set of source tags question q may see, or None.

`search_one` answers one question, as a served system would (rag.run.query runs every question of a
run that way). Dense and BM25 candidates are kept in the artifact cache's memory tier (table
`candidates`) under everything that determines them (artifact keys, query, filter, depth), so
the jobs of a sweep over fusion settings (run in one process by Hydra's basic launcher, or by a
benchmark) search once and fuse per job. The tier holds hits, never times: a timed search passes
`reuse=False` and searches anew, so a latency is measured by the job that reports it.
"""
from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np

from rag.embedder.base import Embedder
from rag.retriever.routing import Route, Router
from rag.retriever.source_filter import SourceFilter, check_source_filters, source_filters
from rag.types import Document, Hits

if TYPE_CHECKING:
    # Not imported when run: rag.run.artifacts imports BM25Index from this package, whose __init__
    # imports this module.
    from rag.run.artifacts import Artifacts
    from rag.store.chunk_set import ChunkSet


class DensePart(Protocol):
    """What routing uses of the dense retriever (rag.retriever.dense, which builds on this module):
    the embedder whose space the router works in, and the vectors it encoded, left for the search."""

    embedder: Embedder
    routed_vectors: dict[str, np.ndarray]


class Retriever:
    """Base of the retrievers (config group `retriever`): a new one implements `_prepare` and
    `_search`; source filters, routing, batching by filter and the candidates a sweep's jobs share
    are this class's."""

    def __init__(self, source_filter: Any = None) -> None:
        self._artifacts: Artifacts | None = None
        self.source_filter = dict(source_filter or {})
        if self.source_filter.get("mode") == "oracle":  # the alias, read once here
            self.source_filter["mode"] = "question"
        self.router: Router | None = None
        if self.routes:
            self.router = Router(self.source_filter.get("groups"), **dict(self.source_filter.get("router") or {}))
        # Fail at construction, before any expensive stage, on a bad filter config.
        self.filters_for([])

    @property
    def routes(self) -> bool:
        """Whether questions are routed to a source group by `rag.retriever.routing.Router`."""
        return self.source_filter.get("mode") == "router"

    def filters_for(self, question_corpora: list[str | None], queries: list[str] | None = None) -> list[SourceFilter]:
        """Per-question source filters: from the corpus tags, or (mode=router) from the queries."""
        if self.routes:
            if not question_corpora:
                return []
            if queries is None or len(queries) != len(question_corpora):
                raise ValueError("mode=router routes from the question texts: pass one query per question")
            return self.route(queries)[0]
        f = self.source_filter
        return source_filters(f.get("mode"), f.get("groups"), f.get("sources"), question_corpora)

    def route(self, queries: list[str]) -> tuple[list[SourceFilter], np.ndarray]:
        """mode=router: each query's source filter (its routed group, or None where the router is
        not confident enough to filter) and each routing's latency in milliseconds."""
        routes, ms = self.routes_of(queries)
        return [r.filter for r in routes], ms

    def routes_of(self, queries: list[str]) -> tuple[list[Route], np.ndarray]:
        """mode=router: each query's routing (rag.retriever.routing.Route), one query at a time as
        a served system would route, and each routing's latency in milliseconds (query encoding
        included)."""
        dense = self.dense_part()
        if self.router is None or dense is None or not self.router.groups:
            raise RuntimeError(f"{type(self).__name__}.route needs mode=router and prepare()")
        out: list[Route] = []
        ms = np.zeros(len(queries))
        dense.routed_vectors.clear()
        for q, query in enumerate(queries):
            t0 = time.perf_counter()
            vec = dense.embedder.encode_queries([query])
            out.extend(self.router.decide(vec))
            ms[q] = 1000.0 * (time.perf_counter() - t0)
            # A served system encodes a question once for routing and search: so does this one.
            dense.routed_vectors[query] = vec[0]
        return out, ms

    def dense_part(self) -> DensePart | None:
        """The dense retriever whose embedder's space the router works in (None: cannot route)."""
        return None

    def check_filters(self, askers: Sequence[tuple[str, str | None, str | None]], docs: Sequence[Document]) -> None:
        """Fails, naming the tag, when a question's source filter would hide every document or
        the document that holds its answer: such a question would silently score 0. `askers` are
        (who, corpus tag, id of the answer's document or None), e.g. ("question 'q1'", "libc", "man:fcntl.2")."""
        if self.routes:  # routed filters are predictions; their misses are measured, not refused
            return
        f = self.source_filter
        filters = self.filters_for([corpus for _, corpus, _ in askers])
        check_source_filters(f.get("mode"), f.get("groups"), askers, filters, docs)

    def prepare(self, artifacts: Artifacts) -> "Retriever":
        self._artifacts = artifacts
        self._prepare(artifacts)
        if self.router is not None:
            embedder = cast(DensePart, self.dense_part()).embedder  # routes: a dense part, checked at construction
            vectors = artifacts.vectors(embedder)
            chunk_set = cast("ChunkSet", artifacts.chunk_set)
            with artifacts.timer.stage("route_fit"):
                # The chunks' own texts, not their indexed prefixes: pseudo-queries stand in for questions.
                self.router.fit(vectors, chunk_set.sources, key=artifacts.vectors_key(embedder),
                                memory=artifacts.cache.memory, encode=embedder.encode_queries,
                                texts=lambda rows: [chunk_set.chunks[int(i)].text for i in rows])
        return self

    def _prepare(self, artifacts: Artifacts) -> None:
        """Loads or builds what searching needs, through the artifact cache. Required.

        The runner calls `prepare(artifacts)` once per run, after the chunks exist; it calls this,
        then fits the router where `source_filter.mode=router`.

        Args:
            artifacts: The run's `rag.run.artifacts.Artifacts`: `artifacts.vectors(embedder)`,
                `artifacts.vector_index(...)`, `artifacts.bm25(...)` build on a miss and load on a
                hit; `artifacts.chunk_set` holds the chunks.

        Example:
            See `rag.retriever.dense.DenseRetriever._prepare`: the chunk vectors and their index.
        """
        raise NotImplementedError

    def warm_up(self) -> None:
        """Load what searching needs (e.g. the query encoder) so that timed searches measure
        search, not model loading."""

    def use_cache(self, cache: Any) -> None:
        """The session's artifact cache, for the models of the parts that hold one (an embedder
        exported to ONNX builds its export there)."""
        from rag.store.models import use_cache

        for part in vars(self).values():
            use_cache(part, cache)

    def _allowed(self, f: SourceFilter) -> np.ndarray | None:
        if self._artifacts is None:
            raise RuntimeError(f"{type(self).__name__} used before prepare()")
        return None if f is None else cast("ChunkSet", self._artifacts.chunk_set).rows_of_sources(f)

    def search(self, queries: list[str], n: int, filters: list[SourceFilter] | None = None) -> Hits:
        """Batched: one call per distinct filter, so a batch of questions is a handful of calls."""
        filters = filters or [None] * len(queries)
        groups: dict[SourceFilter, list[int]] = defaultdict(list)
        for q, f in enumerate(filters):
            groups[f].append(q)
        out = Hits.empty(len(queries), n)
        for f, qs in groups.items():
            hits = self._search([queries[q] for q in qs], n, self._allowed(f))
            w = min(n, hits.width)
            out.ids[qs, :w] = hits.ids[:, :w]
            out.scores[qs, :w] = hits.scores[:, :w]
        return out

    def search_one(self, query: str, n: int, f: SourceFilter = None, reuse: bool = True) -> Hits:
        """One query's top `n` (a row of width n, -1 past the last hit). `reuse`: take candidates
        that an earlier search in this process kept (never for a timed search)."""
        hits = self._search_one(query, n, f, reuse)
        out = Hits.empty(1, n)
        w = min(n, hits.width)
        out.ids[0, :w], out.scores[0, :w] = hits.ids[0, :w], hits.scores[0, :w]
        return out

    def _search_one(self, query: str, n: int, f: SourceFilter, reuse: bool) -> Hits:
        signature = self._signature()
        if signature is None:
            return self._search([query], n, self._allowed(f))
        memory, key = cast("Artifacts", self._artifacts).cache.memory, (signature, query, n, f)
        found = memory.get("candidates", key) if reuse else None
        if found is not None:
            return found
        return memory.put("candidates", key, self._search([query], n, self._allowed(f)))

    def _signature(self) -> tuple | None:
        """Everything that determines this retriever's candidates, or None (never memoized)."""
        return None

    def _search(self, queries: list[str], n: int, allowed: np.ndarray | None) -> Hits:
        """Each query's top `n` chunks. Required.

        The runner calls `search` or `search_one`, which group the questions by source filter and
        call this once per filter, after `prepare` and `warm_up`.

        Args:
            queries: The question texts.
            n: How many chunks to return per query.
            allowed: The chunk rows a query may return (its source filter), sorted; None: all.

        Returns:
            Hits of one row per query, best first, chunk rows as ids and higher scores better;
            -1 ids past the last hit.

        Example:
            See `rag.retriever.lexical.BM25Retriever._search` for a retriever over one index.
        """
        raise NotImplementedError
