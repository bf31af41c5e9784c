"""The cached artifacts built from one chunk set: vectors, vector indexes, BM25 indexes.

Each is keyed by the chunk set's key plus the settings that determine it (see rag/cache.py), so
changing fusion, k or the reranker reuses them, while a new chunking or embedder builds anew.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rag.bm25 import BM25Index
from rag.cache import ArtifactCache, make_key
from rag.embedder.sentence_transformer import SentenceTransformerEmbedder
from rag.index import VectorIndex
from rag.timing import StageTimer
from rag.types import Chunk, RagError

log = logging.getLogger(__name__)

VECTORS_FILE = "vectors.npy"
# Encoding in blocks bounds the memory of one step and shows progress on large corpora.
ENCODE_BLOCK = 8192


@dataclass
class ChunkSet:
    key: str
    chunks: list[Chunk]
    sources: np.ndarray = field(init=False)  # chunk row -> source tag, for metadata filters

    def __post_init__(self) -> None:
        self.sources = np.array([c.source for c in self.chunks], dtype=object)
        self._positions: dict[tuple[str, int], int] | None = None
        self._rows_by_sources: dict[frozenset[str], np.ndarray] = {}

    @property
    def texts(self) -> list[str]:
        return [c.text for c in self.chunks]

    def row_of(self, doc_id: str, position: int) -> int | None:
        """Chunk row of a document's chunk at `position` (None past either end)."""
        if self._positions is None:
            self._positions = {(c.doc_id, c.position): i for i, c in enumerate(self.chunks)}
        return self._positions.get((doc_id, position))

    def rows_of_sources(self, sources: frozenset[str]) -> np.ndarray:
        """Rows whose source is in `sources`; the same (read-only) array for the same filter, so
        that it is computed once per filter, not once per question (13 ms at 1M chunks), and
        the indexes can reuse what they derive from it."""
        rows = self._rows_by_sources.get(sources)
        if rows is None:
            rows = np.flatnonzero(np.isin(self.sources, list(sources))).astype(np.int64)
            rows.flags.writeable = False
            self._rows_by_sources[sources] = rows
        return rows

    def __len__(self) -> int:
        return len(self.chunks)


class Artifacts:
    """Builds or loads the artifacts of one chunk set, recording hits and stage times."""

    def __init__(self, cache: ArtifactCache, chunk_set: ChunkSet, timer: StageTimer | None = None):
        self.cache = cache
        self.chunk_set = chunk_set
        self.timer = timer or StageTimer()
        self.record: dict[str, dict] = {}  # artifact kind -> {key, hit}

    def _note(self, kind: str, key: str, hit: bool) -> None:
        # The first use is the one that says whether this run built the artifact; later reuses
        # within the same run (e.g. by the evaluation) are hits by construction.
        self.record.setdefault(kind, {"key": key, "hit": hit})

    def vectors_key(self, embedder: SentenceTransformerEmbedder) -> str:
        return make_key("vectors", embedder.id, {"chunks": self.chunk_set.key})

    def vectors(self, embedder: SentenceTransformerEmbedder) -> np.ndarray:
        """float32 [n_chunks, dim], memory-mapped from the cache."""
        key = self.vectors_key(embedder)

        def build(tmp: Path) -> dict:
            return encode_to_npy(embedder, self.chunk_set.texts, tmp / VECTORS_FILE)

        with self.timer.stage("embed"):
            art = self.cache.get_or_build("vectors", key, build, inputs={"chunks": self.chunk_set.key, **embedder.id})
        self._note("vectors", key, art.hit)
        vecs = np.load(art.file(VECTORS_FILE), mmap_mode="r", allow_pickle=False)
        if vecs.shape[0] != len(self.chunk_set):
            raise RagError(f"cached vectors {art.path} hold {vecs.shape[0]} rows for {len(self.chunk_set)} chunks")
        return vecs

    def vector_index(self, embedder: SentenceTransformerEmbedder, index: VectorIndex) -> VectorIndex:
        vectors = self.vectors(embedder)
        key = make_key("index", index.params, {"vectors": self.vectors_key(embedder)})

        def build(tmp: Path) -> dict:
            index.build(vectors)
            index.save(tmp)
            return {"ntotal": index.ntotal, "dim": index.dim}

        with self.timer.stage("index"):
            art = self.cache.get_or_build("index", key, build, inputs=index.params)
            if art.hit:
                index.load(art.path)
        self._note("index", key, art.hit)
        return index

    def bm25(self, bm25: BM25Index) -> BM25Index:
        key = make_key("bm25", bm25.params, {"chunks": self.chunk_set.key})
        with self.timer.stage("bm25"):
            if not bm25.persistent:
                # rank_bm25 has no file format; it is rebuilt in memory (it is the slow reference).
                bm25.build(self.chunk_set.texts)
                self._note("bm25", key, False)
                return bm25

            def build(tmp: Path) -> dict:
                bm25.build(self.chunk_set.texts)
                bm25.save(tmp)
                return {"n_docs": bm25.n_docs}

            art = self.cache.get_or_build("bm25", key, build, inputs=bm25.params)
            if art.hit:
                bm25.load(art.path)
        self._note("bm25", key, art.hit)
        return bm25


def encode_to_npy(embedder: SentenceTransformerEmbedder, texts: list[str], path: Path) -> dict:
    """Encode texts into a float32 .npy written block by block (never whole in memory twice).
    Identical texts (boilerplate repeated across documents) are encoded once.

    The embedder yields (rows, vectors) pairs from `encode_blocks`, in any order, so an engine
    that encodes on several workers (rag.embedder.ray_data) writes the very same file."""
    unique: dict[str, int] = {}
    inverse = np.fromiter((unique.setdefault(t, len(unique)) for t in texts), dtype=np.int64, count=len(texts))
    uniq_texts = list(unique)
    dim = embedder.dim
    # With no repeated text (the usual case) the unique vectors are the result: encode straight
    # into the output, not into a second file that is then copied (2x the writes and page cache).
    all_unique = len(uniq_texts) == len(texts)
    uniq_path = path if all_unique else path.with_name("unique.tmp.npy")
    out_u = np.lib.format.open_memmap(uniq_path, mode="w+", dtype=np.float32, shape=(len(uniq_texts), dim))
    for rows, vecs in embedder.encode_blocks(uniq_texts, ENCODE_BLOCK):
        out_u[rows] = vecs
    out_u.flush()
    if not all_unique:
        out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(len(texts), dim))
        for i in range(0, len(texts), ENCODE_BLOCK):
            out[i : i + ENCODE_BLOCK] = out_u[inverse[i : i + ENCODE_BLOCK]]
        out.flush()
        del out
        del out_u
        uniq_path.unlink()
    else:
        del out_u
    return {"n": len(texts), "unique": len(uniq_texts), "dim": dim, "embedder": json.loads(json.dumps(embedder.id))}
