"""Retrievers: dense (embedder + vector index), BM25, and hybrid (both, fused).

A retriever is built by Hydra from `conf/retriever/*.yaml`, then `prepare(artifacts)` builds or
loads what it searches (through the artifact cache), then `search(queries, n, filters)` returns
`Hits` over chunk rows. `filters[q]` is the set of source tags question q may see, or None.

`search_one` answers one question, as a served system would (rag.query runs every question of a
run that way). Dense and BM25 candidates are kept in the artifact cache's memory tier (table
`candidates`) under everything that determines them (artifact keys, query, filter, depth), so
the jobs of a sweep over fusion settings (run in one process by Hydra's basic launcher, or by a
benchmark) search once and fuse per job. The tier holds hits, never times: a timed search passes
`reuse=False` and searches anew, so a latency is measured by the job that reports it.
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import numpy as np

from rag.artifacts import Artifacts
from rag.bm25 import BM25Index
from rag.embedder.sentence_transformer import SentenceTransformerEmbedder
from rag.fusion import Fusion
from rag.index import VectorIndex
from rag.routing import Router
from rag.types import Document, Hits, RagError

SourceFilter = frozenset[str] | None

class Retriever:
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
        """Whether questions are routed to a source group by `rag.routing.Router`."""
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
        """mode=router: each query's routed group, one query at a time as a served system would
        route, and each routing's latency in milliseconds (query encoding included)."""
        dense = self._dense_part()
        if self.router is None or dense is None or not self.router.groups:
            raise RuntimeError(f"{type(self).__name__}.route needs mode=router and prepare()")
        out: list[SourceFilter] = []
        ms = np.zeros(len(queries))
        dense.routed_vectors.clear()
        for q, query in enumerate(queries):
            t0 = time.perf_counter()
            vec = dense.embedder.encode_queries([query])
            out.extend(self.router.route(vec))
            ms[q] = 1000.0 * (time.perf_counter() - t0)
            # A served system encodes a question once for routing and search: so does this one.
            dense.routed_vectors[query] = vec[0]
        return out, ms

    def _dense_part(self) -> "DenseRetriever | None":
        """The dense retriever whose embedder's space the router works in (None: cannot route)."""
        return None

    def check_filters(self, askers: list[tuple[str, str | None, str | None]], docs: list[Document]) -> None:
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
            embedder = self._dense_part().embedder
            vectors = artifacts.vectors(embedder)
            with artifacts.timer.stage("route_fit"):
                self.router.fit(vectors, artifacts.chunk_set.sources, key=artifacts.vectors_key(embedder),
                                memory=artifacts.cache.memory)
        return self

    def _prepare(self, artifacts: Artifacts) -> None:
        raise NotImplementedError

    def warm_up(self) -> None:
        """Load what searching needs (e.g. the query encoder) so that timed searches measure
        search, not model loading."""

    def use_cache(self, cache: Any) -> None:
        """The session's artifact cache, for the models of the parts that hold one (an embedder
        exported to ONNX builds its export there)."""
        from rag.models import use_cache

        for part in vars(self).values():
            use_cache(part, cache)

    def _allowed(self, f: SourceFilter) -> np.ndarray | None:
        if self._artifacts is None:
            raise RuntimeError(f"{type(self).__name__} used before prepare()")
        return None if f is None else self._artifacts.chunk_set.rows_of_sources(f)

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
        memory, key = self._artifacts.cache.memory, (signature, query, n, f)
        found = memory.get("candidates", key) if reuse else None
        if found is not None:
            return found
        return memory.put("candidates", key, self._search([query], n, self._allowed(f)))

    def _signature(self) -> tuple | None:
        """Everything that determines this retriever's candidates, or None (never memoized)."""
        return None

    def _search(self, queries: list[str], n: int, allowed: np.ndarray | None) -> Hits:
        raise NotImplementedError


class DenseRetriever(Retriever):
    def __init__(self, embedder: SentenceTransformerEmbedder, index: VectorIndex, source_filter: Any = None):
        super().__init__(source_filter)
        self.embedder, self.index = embedder, index
        self._index_key: str | None = None
        self.routed_vectors: dict[str, np.ndarray] = {}  # query -> vector the router just encoded

    def _prepare(self, artifacts: Artifacts) -> None:
        self._index_key = artifacts.vector_index(self.embedder, self.index)[1]

    def _dense_part(self) -> "DenseRetriever | None":
        return self

    def warm_up(self) -> None:
        dim = self.embedder.encode_queries(["warm-up"]).shape[1]
        if dim != self.index.dim:
            # a served model renamed or swapped behind the same name since its vectors were cached
            raise RagError(f"embedder {getattr(self.embedder, 'model_name', '')!r}: query vectors are {dim}-d but the "
                           f"indexed chunk vectors are {self.index.dim}-d; the model behind embedder.model has changed "
                           "(clear its vectors from the cache, or name the model it now is)")

    def _signature(self) -> tuple | None:
        # ef_search / nprobe are query-time knobs outside the index key, so they join here.
        knobs = tuple(sorted(vars(self.index).items(), key=lambda kv: kv[0]))
        knobs = tuple((k, v) for k, v in knobs if isinstance(v, (int, float, str)))
        return ("dense", self._index_key, self.embedder.query_prefix, knobs)

    def _search(self, queries: list[str], n: int, allowed: np.ndarray | None) -> Hits:
        vecs = [self.routed_vectors.pop(q, None) for q in queries]
        if any(v is None for v in vecs):
            return self.index.search(self.embedder.encode_queries(queries), n, allowed)
        return self.index.search(np.stack(vecs), n, allowed)


class BM25Retriever(Retriever):
    def __init__(
        self,
        backend: str = "bm25s",
        k1: float = 1.5,
        b: float = 0.75,
        stopwords: bool = True,
        stem: bool = True,
        source_filter: Any = None,
        mmap: bool = False,
    ):
        super().__init__(source_filter)
        if self.routes:
            raise RagError("retriever.source_filter.mode=router routes in the dense embedder's space: "
                           "use retriever=dense or retriever=hybrid")
        self.bm25 = BM25Index(backend=backend, k1=k1, b=b, stopwords=stopwords, stem=stem, mmap=mmap)
        self._key: str | None = None

    def _prepare(self, artifacts: Artifacts) -> None:
        self._key = artifacts.bm25(self.bm25)[1]

    def warm_up(self) -> None:
        self.bm25.search(["warm-up"], 1)

    def _signature(self) -> tuple | None:
        return ("bm25", self._key)

    def _search(self, queries: list[str], n: int, allowed: np.ndarray | None) -> Hits:
        return self.bm25.search(queries, n, allowed)


class HybridRetriever(Retriever):
    """Dense and lexical candidates (`candidates` each), fused into one ranking."""

    def __init__(
        self,
        dense: DenseRetriever,
        lexical: BM25Retriever,
        fusion: Fusion,
        candidates: int = 100,
        source_filter: Any = None,
    ):
        super().__init__(source_filter)
        if int(candidates) <= 0:
            raise RagError(f"retriever.candidates must be positive, got {candidates}")
        self.dense, self.lexical, self.fusion, self.candidates = dense, lexical, fusion, int(candidates)

    def _prepare(self, artifacts: Artifacts) -> None:
        self.dense.prepare(artifacts)
        self.lexical.prepare(artifacts)

    def _dense_part(self) -> "DenseRetriever | None":
        return self.dense

    def warm_up(self) -> None:
        self.dense.warm_up()
        self.lexical.warm_up()

    def _search(self, queries: list[str], n: int, allowed: np.ndarray | None) -> Hits:
        width = max(n, self.candidates)
        lists = [r._search(queries, width, allowed) for r in (self.dense, self.lexical)]
        return self.fusion(lists, n)

    def _search_one(self, query: str, n: int, f: SourceFilter, reuse: bool) -> Hits:
        width = max(n, self.candidates)
        lists = [r._search_one(query, width, f, reuse) for r in (self.dense, self.lexical)]
        return self.fusion(lists, n)


def source_filters(mode: str | None, groups: Any, sources: Any, question_corpora: list[str | None]) -> list[SourceFilter]:
    """Per-question allowed source tags.

    - mode None/"none": no filtering.
    - "fixed": every question sees only `sources`.
    - "question" (alias "oracle"): a question tagged with corpus c sees the sources of the group
      that contains c (e.g. PubMed questions search PubMed, libc/PyTorch questions search the
      technical docs); an untagged question is not filtered. The tag is the question's own
      ground truth, which no deployed system has: this is the oracle ablation of "router".
    - "router": routed from the question text (`Retriever.route`), not decided here.
    """
    if mode in (None, "none"):
        return [None] * len(question_corpora)
    if mode == "fixed":
        if not sources:
            raise RagError("retriever.source_filter.sources must list at least one source when mode=fixed")
        f = frozenset(sources)
        return [f] * len(question_corpora)
    if mode == "oracle":
        mode = "question"
    if mode == "question":
        group_of: dict[str, frozenset[str]] = {}
        for g in groups or []:
            for s in g:
                group_of[s] = frozenset(g)
        return [None if c is None else group_of.get(c, frozenset([c])) for c in question_corpora]
    raise RagError(f"retriever.source_filter.mode must be none, fixed, question (oracle) or router, got {mode!r}")


def check_source_filters(mode: str | None, groups: Any, askers: list[tuple[str, str | None, str | None]],
                         filters: list[SourceFilter], docs: list[Document]) -> None:
    """See Retriever.check_filters. Tags are compared exactly (case-sensitive), as filtering does."""
    source_of = {d.id: d.source for d in docs}
    source_set = set(source_of.values())
    sources = sorted(source_set)
    grouped = {s for g in groups or [] for s in g}
    where = f"retriever.source_filter (mode={mode})"
    seen: set[tuple[str | None, str | None]] = set()
    for (who, corpus, answer_doc), allowed in zip(askers, filters):
        if allowed is None or (corpus, answer_doc) in seen:
            continue
        seen.add((corpus, answer_doc))
        if not allowed & source_set:
            if mode == "question" and corpus not in grouped:
                raise RagError(
                    f"{where}: corpus tag {corpus!r} ({who}) is in no group of retriever.source_filter.groups "
                    f"{groups} and no document has that source; document sources: {sources} (tags are case-sensitive)"
                )
            if mode == "fixed":
                raise RagError(f"retriever.source_filter.sources {sorted(allowed)} matches no document's source; "
                               f"document sources: {sources} (tags are case-sensitive)")
            raise RagError(
                f"{where}: {who} may only search sources {sorted(allowed)}, but no document has any of them; "
                f"document sources: {sources} (tags are case-sensitive; groups: {groups})"
            )
        tag = source_of.get(answer_doc) if answer_doc is not None else None
        if mode == "question" and tag is not None and tag not in allowed:
            raise RagError(
                f"{where}: {who} has corpus tag {corpus!r}, but its answer's document {answer_doc!r} has source "
                f"{tag!r}, which its filter {sorted(allowed)} excludes (groups: {groups}; tags are case-sensitive)"
            )
