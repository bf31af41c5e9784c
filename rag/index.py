"""FAISS vector indexes behind one small interface.

`build(vectors)`, `search(queries, n, allowed=None) -> Hits`, `save(path)`, `load(path)`.
Scores are "higher is better": inner products as they are, L2 distances negated. `allowed`
restricts the search to a set of rows (metadata filtering) with FAISS's own ID selectors, so the
filter is applied inside the search rather than by over-fetching and dropping results.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from rag.types import Hits, RagError
from rag.vector_rows import read_rows, take_rows

log = logging.getLogger(__name__)

INDEX_FILE = "index.faiss"
# Below this many queries a search runs on one OpenMP thread. FAISS's thread pool costs more to
# wake and join than a single query's scan saves: on 2 cores, a flat 100k single query took 24-32
# ms on two threads vs 6-7 ms on one, and 99 vs 79 ms at 1M (docs/bench.md). Retrieval asks one
# question at a time (rag.query.retrieve_rerank), so this is the latency every run reports.
FEW_QUERIES = 8
# FAISS trains on one in-memory array, so training reads a sample of at most this many bytes
# (~1.4M rows at 384-d) unless the index asks for more (see _max_train): at 10M chunks all the
# rows would be 15 GB.
MAX_TRAIN_BYTES = 2 << 30
# Corpora up to this many rows always train on every row, in order, as before sampling existed.
MIN_TRAIN_ROWS = 65536
# FAISS's k-means uses at most this many points a centroid (ClusteringParameters
# .max_points_per_centroid), subsampling the rest away: reading more rows only to be dropped.
FAISS_POINTS_PER_CENTROID = 256
TRAIN_SEED = 0


@contextmanager
def _omp_threads(n: int | None) -> Iterator[None]:
    if n is None:
        yield
        return
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(n)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


class VectorIndex:
    """Base class: subclasses create the FAISS index in `_new` and may tune search params."""

    metric: str = "l2"

    def __init__(self) -> None:
        self.index: Any = None
        self._selector_cache: tuple[np.ndarray, Any] | None = None

    # The artifact cache key of an index: everything that determines the built structure.
    @property
    def params(self) -> dict[str, Any]:
        return {"type": type(self).__name__, "metric": self.metric}

    def _new(self, dim: int, n: int) -> Any:
        raise NotImplementedError

    def _search_params(self, selector: Any) -> Any:
        return faiss.SearchParameters(sel=selector)

    def build(self, vectors: np.ndarray, batch_size: int = 65536) -> VectorIndex:
        """`vectors` may be the cache's memory-mapped file: rows are read from it in batches (and
        a training sample), never mapped whole into this process."""
        if not isinstance(vectors, np.ndarray):
            vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] == 0 or vectors.dtype.kind not in "fiu":
            raise RagError(f"index: need a non-empty 2-d array of vectors, got shape {vectors.shape} "
                           f"of {vectors.dtype}")
        n, dim = vectors.shape
        self.index = self._new(dim, n)
        self._selector_cache = None
        if not self.index.is_trained:
            self.index.train(self._training_rows(vectors))
        # Adding in bounded batches keeps the temporary copies FAISS makes small, and lets a long
        # build (HNSW: ~7.5 min for 1M vectors on 2 cores) report its progress. It is not made
        # resumable: at that length a rerun is cheaper than checkpointing a graph FAISS can only
        # write whole, and the cache never publishes a half-built index.
        t0 = time.perf_counter()
        for i in range(0, n, batch_size):
            self.index.add(read_rows(vectors, i, i + batch_size))
            done = min(n, i + batch_size)
            if n > batch_size:
                elapsed = time.perf_counter() - t0
                log.info("index %s: %d/%d vectors added (%.0f s, about %.0f s left)", type(self).__name__,
                         done, n, elapsed, elapsed / done * (n - done))
        self._after_build()
        self.use_vectors(vectors)
        return self

    def _max_train(self, n: int, dim: int) -> int:
        """The most rows training reads. Here: what fits in MAX_TRAIN_BYTES (an 8-bit scalar
        quantizer, HNSWSQ8Index's, learns each dimension's range from every row it is given)."""
        return max(MIN_TRAIN_ROWS, MAX_TRAIN_BYTES // (4 * dim))

    def _training_rows(self, vectors: np.ndarray) -> np.ndarray:
        n, dim = vectors.shape
        limit = self._max_train(n, dim)
        if n <= limit:
            return read_rows(vectors, 0, n)
        # Sorted, so the file is read front to back; seeded, so a rebuild trains the same index.
        rows = np.sort(np.random.default_rng(TRAIN_SEED).choice(n, limit, replace=False))
        log.info("index %s: training on a sample of %d of the %d vectors", type(self).__name__, limit, n)
        return take_rows(vectors, rows)

    def _after_build(self) -> None:
        pass

    def use_vectors(self, vectors: np.ndarray) -> None:
        """The float32 vectors the index was built from (memory-mapped from the cache): an index
        that re-scores exactly reads them here instead of keeping a copy (IVFPQIndex's refine)."""

    @property
    def dim(self) -> int:
        return int(self.index.d)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def search(self, queries: np.ndarray, n: int, allowed: np.ndarray | None = None) -> Hits:
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.shape[1] != self.dim:
            raise RagError(
                f"index: query dimension {queries.shape[1]} differs from the index dimension {self.dim} "
                "(embedder changed? the index must be rebuilt with the same embedder)"
            )
        n = max(1, min(n, self.ntotal))
        params = None
        if allowed is not None:
            if len(allowed) == 0:
                return Hits.empty(len(queries), n)
            params = self._search_params(self._selector(allowed))
        with _omp_threads(1 if len(queries) < FEW_QUERIES else None):
            dist, ids = self.index.search(queries, n, params=params)
        scores = dist if self.metric == "ip" else -dist
        scores = np.where(ids >= 0, scores, -np.inf)
        return Hits(ids, scores)

    def _selector(self, allowed: np.ndarray) -> Any:
        # A filter's rows come from ChunkSet.rows_of_sources, which returns the same array for the
        # same filter; building FAISS's selector (a hash set of up to every row) once per filter
        # instead of once per question matters at a million chunks.
        cached = self._selector_cache
        if cached is not None and cached[0] is allowed:
            return cached[1]
        sel = faiss.IDSelectorBatch(np.ascontiguousarray(allowed, dtype=np.int64))
        self._selector_cache = (allowed, sel)
        return sel

    def save(self, directory: Path) -> None:
        faiss.write_index(self.index, str(Path(directory) / INDEX_FILE))

    def load(self, directory: Path) -> VectorIndex:
        self.index = faiss.read_index(str(Path(directory) / INDEX_FILE))
        self._selector_cache = None
        self._after_build()
        return self


def _metric(metric: str) -> int:
    if metric == "l2":
        return faiss.METRIC_L2
    if metric == "ip":
        return faiss.METRIC_INNER_PRODUCT
    raise RagError(f"index.metric must be 'l2' or 'ip', got {metric!r}")


class FlatL2Index(VectorIndex):
    """Exact search by Euclidean distance (faiss.IndexFlatL2)."""

    metric = "l2"

    def _new(self, dim: int, n: int) -> Any:
        return faiss.IndexFlatL2(dim)


class FlatIPIndex(VectorIndex):
    """Exact search by inner product; cosine similarity when vectors are normalized."""

    metric = "ip"

    def _new(self, dim: int, n: int) -> Any:
        return faiss.IndexFlatIP(dim)


class HNSWIndex(VectorIndex):
    """Approximate search on a hierarchical navigable small-world graph (faiss.IndexHNSWFlat)."""

    def __init__(self, M: int = 32, ef_construction: int = 200, ef_search: int = 128, metric: str = "l2"):
        super().__init__()
        for name, v in (("M", M), ("ef_construction", ef_construction), ("ef_search", ef_search)):
            if int(v) <= 0:
                raise RagError(f"index.{name} must be positive, got {v}")
        self.M, self.ef_construction, self.ef_search = int(M), int(ef_construction), int(ef_search)
        _metric(metric)
        self.metric = metric

    @property
    def params(self) -> dict[str, Any]:
        # ef_search is a query-time knob, not part of the built graph, so it stays out of the key.
        return {**super().params, "M": self.M, "ef_construction": self.ef_construction}

    def _new(self, dim: int, n: int) -> Any:
        index = faiss.IndexHNSWFlat(dim, self.M, _metric(self.metric))
        index.hnsw.efConstruction = self.ef_construction
        return index

    def _after_build(self) -> None:
        self.index.hnsw.efSearch = self.ef_search

    def _search_params(self, selector: Any) -> Any:
        return faiss.SearchParametersHNSW(sel=selector, efSearch=self.ef_search)


class IVFIndex(VectorIndex):
    """Inverted file over k-means cells (faiss.IndexIVFFlat); `nprobe` cells are scanned a query."""

    # FAISS warns below ~39 training points per centroid; fewer cells than that on a small corpus.
    MIN_POINTS_PER_CELL = 39

    def __init__(self, nlist: int = 1024, nprobe: int = 16, metric: str = "l2", max_train: int | None = None):
        """`max_train`: the most rows k-means (and the codes' quantizer) trains on; None (the
        default) reads as many as FAISS would use, see _max_train."""
        super().__init__()
        if int(nlist) <= 0 or int(nprobe) <= 0:
            raise RagError(f"index.nlist and index.nprobe must be positive, got nlist={nlist} nprobe={nprobe}")
        if max_train is not None and (isinstance(max_train, bool) or not isinstance(max_train, int) or max_train < 1):
            raise RagError(f"index.max_train must be a positive integer or null, got {max_train!r}")
        self.nlist, self.nprobe, self.max_train = int(nlist), int(nprobe), max_train
        _metric(metric)
        self.metric = metric

    @property
    def params(self) -> dict[str, Any]:
        # Another sample trains other cells; the default stays out so that earlier keys still hold.
        extra = {} if self.max_train is None else {"max_train": self.max_train}
        return {**super().params, "nlist": self.nlist, **extra}

    def effective_nlist(self, n: int) -> int:
        return max(1, min(self.nlist, n // self.MIN_POINTS_PER_CELL))

    def _centroids(self, n: int) -> int:
        """Centroids of the largest k-means training runs: here the coarse quantizer's cells."""
        return self.effective_nlist(n)

    def _max_train(self, n: int, dim: int) -> int:
        k = self._centroids(n)
        if self.max_train is not None:
            if n > self.max_train and self.max_train < k * self.MIN_POINTS_PER_CELL:
                raise RagError(f"index.max_train ({self.max_train}) must be at least {k * self.MIN_POINTS_PER_CELL} "
                               f"({self.MIN_POINTS_PER_CELL} rows for each of {k} centroids)")
            return self.max_train
        # What FAISS's k-means would keep of all the rows, within MAX_TRAIN_BYTES, but never
        # below what FAISS needs to train without a warning.
        faiss_keeps = FAISS_POINTS_PER_CENTROID * k
        return max(MIN_TRAIN_ROWS, k * self.MIN_POINTS_PER_CELL, min(faiss_keeps, super()._max_train(n, dim)))

    def _cells(self, dim: int, n: int) -> tuple[Any, int]:
        """The coarse quantizer and the number of cells the data supports."""
        nlist = self.effective_nlist(n)
        if nlist < self.nlist:
            log.info("index: %d vectors support only %d IVF cells (asked for %d)", n, nlist, self.nlist)
        return (faiss.IndexFlatL2(dim) if self.metric == "l2" else faiss.IndexFlatIP(dim)), nlist

    def _new(self, dim: int, n: int) -> Any:
        quantizer, nlist = self._cells(dim, n)
        return faiss.IndexIVFFlat(quantizer, dim, nlist, _metric(self.metric))

    def _after_build(self) -> None:
        self.index.nprobe = min(self.nprobe, self.index.nlist)

    def _search_params(self, selector: Any) -> Any:
        return faiss.SearchParametersIVF(sel=selector, nprobe=min(self.nprobe, self.index.nlist))


class IVFSQ8Index(IVFIndex):
    """IVF cells holding 8-bit scalar-quantized vectors (faiss.IndexIVFScalarQuantizer): a byte a
    dimension instead of four."""

    def _new(self, dim: int, n: int) -> Any:
        quantizer, nlist = self._cells(dim, n)
        return faiss.IndexIVFScalarQuantizer(quantizer, dim, nlist, faiss.ScalarQuantizer.QT_8bit, _metric(self.metric))


class IVFPQIndex(IVFIndex):
    """IVF cells holding product-quantized vectors (faiss.IndexIVFPQ): `m` sub-vectors of `nbits`
    bits each, m bytes a vector at 8 bits (48 for 384-d against 1,536 in float32). `refine` > 0
    re-scores the top refine x n candidates of each search exactly, reading their float32 rows
    from the vectors given to `use_vectors` (the cache's memory-mapped file), as
    faiss.IndexRefineFlat does from a copy it keeps in memory: at 10M chunks that copy would be
    15 GB, where the mapped rows a search touches are a few hundred KB of page cache. The codes
    are the same index with or without refine, so both share one cached artifact."""

    def __init__(self, nlist: int = 1024, m: int = 48, nbits: int = 8, nprobe: int = 16, refine: int = 0,
                 metric: str = "l2", max_train: int | None = None):
        super().__init__(nlist=nlist, nprobe=nprobe, metric=metric, max_train=max_train)
        for name, v, lo in (("m", m, 1), ("nbits", nbits, 1), ("refine", refine, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise RagError(f"index.{name} must be an integer >= {lo}, got {v!r}")
        if nbits > 16:
            raise RagError(f"index.nbits must be at most 16, got {nbits}")
        self.m, self.nbits, self.refine = m, nbits, refine
        self._vectors: np.ndarray | None = None

    @property
    def params(self) -> dict[str, Any]:
        return {**super().params, "m": self.m, "nbits": self.nbits}  # refine is a query-time knob

    def use_vectors(self, vectors: np.ndarray) -> None:
        self._vectors = vectors

    def effective_nbits(self, n: int) -> int:
        """Fewer bits when the data cannot train 2^nbits centroids per sub-quantizer."""
        return max(1, min(self.nbits, int(np.log2(max(2, n // self.MIN_POINTS_PER_CELL)))))

    def _centroids(self, n: int) -> int:
        return max(super()._centroids(n), 2 ** self.effective_nbits(n))  # or each sub-quantizer's

    def _new(self, dim: int, n: int) -> Any:
        if dim % self.m:
            raise RagError(f"index.m ({self.m}) must divide the vectors' dimension ({dim})")
        quantizer, nlist = self._cells(dim, n)
        nbits = self.effective_nbits(n)
        if nbits < self.nbits:
            log.info("index: %d vectors train only %d-bit PQ codes (asked for %d)", n, nbits, self.nbits)
        return faiss.IndexIVFPQ(quantizer, dim, nlist, self.m, nbits, _metric(self.metric))

    def _ivf(self) -> Any:
        return faiss.extract_index_ivf(self.index)

    def _after_build(self) -> None:
        ivf = self._ivf()
        ivf.nprobe = min(self.nprobe, ivf.nlist)

    def _search_params(self, selector: Any) -> Any:
        return faiss.SearchParametersIVF(sel=selector, nprobe=min(self.nprobe, self._ivf().nlist))

    def search(self, queries: np.ndarray, n: int, allowed: np.ndarray | None = None) -> Hits:
        if not self.refine:
            return super().search(queries, n, allowed)
        if self._vectors is None:
            raise RagError("index.refine re-scores from the chunk vectors, and none were given (use_vectors)")
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        n = max(1, min(n, self.ntotal))
        wide = super().search(queries, min(self.ntotal, n * self.refine), allowed)
        ids = np.full((len(queries), n), -1, np.int64)
        scores = np.full((len(queries), n), -np.inf, np.float32)
        for q, (row, query) in enumerate(zip(wide.ids, queries)):
            cand = row[row >= 0]
            if not len(cand):
                continue
            # Read, not faulted in through the mapping: the kernel maps readahead around every
            # faulted row, which kept 2.2 GB of the 1M vectors resident after 150 questions.
            vecs = take_rows(self._vectors, cand)
            exact = vecs @ query if self.metric == "ip" else -((vecs - query) ** 2).sum(axis=1)
            best = np.argsort(-exact, kind="stable")[:n]  # ties keep the codes' order
            ids[q, : len(best)], scores[q, : len(best)] = cand[best], exact[best]
        return Hits(ids, scores)


class HNSWSQ8Index(HNSWIndex):
    """The HNSW graph over 8-bit scalar-quantized vectors (faiss.IndexHNSWSQ)."""

    def _new(self, dim: int, n: int) -> Any:
        index = faiss.IndexHNSWSQ(dim, faiss.ScalarQuantizer.QT_8bit, self.M, _metric(self.metric))
        index.hnsw.efConstruction = self.ef_construction
        return index
