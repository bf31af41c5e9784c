"""The vector index interface, on FAISS: `build(vectors)`, `search(queries, n, allowed=None) -> Hits`,
`save(path)`, `load(path)`.

Scores are "higher is better": inner products as they are, L2 distances negated. `allowed`
restricts the search to a set of rows (metadata filtering) with FAISS's own ID selectors, so the
filter is applied inside the search rather than by over-fetching and dropping results. The FAISS
index types are in rag/index/faiss_index.py, Chroma in rag/index/chroma.py.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import faiss as faiss_module
import numpy as np

from rag.types import Hits, RagError
from rag.index.vector_rows import read_rows, take_rows

log = logging.getLogger(__name__)
# Untyped, as where faiss ships no stubs: the stubs some versions ship lack the keyword arguments
# of its SWIG classes (SearchParametersIVF(sel=..., nprobe=...)).
faiss: Any = faiss_module

INDEX_FILE = "index.faiss"
# Below this many queries a search runs on one OpenMP thread. FAISS's thread pool costs more to
# wake and join than a single query's scan saves: on 2 cores, a flat 100k single query took 24-32
# ms on two threads vs 6-7 ms on one, and 99 vs 79 ms at 1M (docs/reference/bench.md). Retrieval asks one
# question at a time (rag.run.query.retrieve_rerank), so this is the latency every run reports.
FEW_QUERIES = 8
# FAISS trains on one in-memory array, so training reads a sample of at most this many bytes
# (~1.4M rows at 384-d) unless the index asks for more (see _max_train): at 10M chunks all the
# rows would be 15 GB.
MAX_TRAIN_BYTES = 2 << 30
# Corpora up to this many rows always train on every row, in order, as before sampling existed.
MIN_TRAIN_ROWS = 65536
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
        """Creates the empty FAISS index. Required.

        The runner calls it from `build` (the index is then trained where it needs training on a
        seeded sample of the vectors, filled in batches and cached by `params`).

        Args:
            dim: The vectors' dimension.
            n: How many vectors will be added (to size cells or codes).

        Returns:
            A FAISS index over `metric` ("l2" or "ip"): `faiss.IndexFlatL2(dim)`, an HNSW or IVF
            index, ... Tuning parameters that change the built structure belong in `params`.

        Example:
            Exact inner-product search:

                class FlatIP(VectorIndex):
                    metric = "ip"

                    def _new(self, dim, n):
                        return faiss.IndexFlatIP(dim)
        """
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
