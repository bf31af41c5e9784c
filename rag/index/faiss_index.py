"""The FAISS index types (config group conf/index/): exact flat search, HNSW graphs and IVF cells,
with full, 8-bit scalar-quantized or product-quantized vectors. Each creates its FAISS index in
`_new` and may tune the search; building, searching and storing are VectorIndex's
(rag/index/base.py)."""
from __future__ import annotations

import logging
from typing import Annotated, Any

import faiss as faiss_module
import numpy as np

from rag.index.base import MIN_TRAIN_ROWS, VectorIndex
from rag.index.vector_rows import take_rows
from rag.config.schema import NonNegativeInt, PositiveInt, checked, string
from rag.types import Hits, RagError

log = logging.getLogger(__name__)
# Untyped, as where faiss ships no stubs: the stubs some versions ship lack the keyword arguments
# of its SWIG classes (SearchParametersIVF(sel=..., nprobe=...)).
faiss: Any = faiss_module

# FAISS's k-means uses at most this many points a centroid (ClusteringParameters
# .max_points_per_centroid), subsampling the rest away: reading more rows only to be dropped.
FAISS_POINTS_PER_CENTROID = 256

Metric = Annotated[str, string(choices=("l2", "ip"))]


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

    @checked("index")
    def __init__(self, M: PositiveInt = 32, ef_construction: PositiveInt = 200, ef_search: PositiveInt = 128,
                 metric: Metric = "l2"):
        super().__init__()
        self.M, self.ef_construction, self.ef_search = M, ef_construction, ef_search
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

    @checked("index")
    def __init__(self, nlist: PositiveInt = 1024, nprobe: PositiveInt = 16, metric: Metric = "l2",
                 max_train: PositiveInt | None = None):
        """`max_train`: the most rows k-means (and the codes' quantizer) trains on; None (the
        default) reads as many as FAISS would use, see _max_train."""
        super().__init__()
        self.nlist, self.nprobe, self.max_train = nlist, nprobe, max_train
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

    @checked("index")
    def __init__(self, nlist: PositiveInt = 1024, m: PositiveInt = 48, nbits: PositiveInt = 8, nprobe: PositiveInt = 16,
                 refine: NonNegativeInt = 0, metric: Metric = "l2", max_train: PositiveInt | None = None):
        super().__init__(nlist=nlist, nprobe=nprobe, metric=metric, max_train=max_train)
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
