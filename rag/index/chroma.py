"""`index=chroma`: the chunk vectors in Chroma (chromadb's embedded PersistentClient), the vector
store of three of the reference documents, searched like any index here.

Chroma gets the run's own vectors (the same artifact the FAISS indexes are built from; Chroma
embeds nothing), one record per chunk with its row as id and metadata, in Chroma's HNSW under
`space` (cosine or l2). Its directory is an artifact cache entry keyed by these settings, the
vectors' key and the chromadb version: a directory written by another chromadb version is never
opened by this one (a new entry is built, and `load` refuses a mismatched directory in one line).
A source filter is Chroma's metadata filter on the allowed rows. How close its approximate search
comes to exact FAISS search: benchmarks/faiss_indexes.py (recall@10), docs/explanation/techniques.md.

chromadb is an optional extra (`pip install -e ".[chroma]"`; `make test-chroma`).
"""
from __future__ import annotations

import json
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Annotated, Any, cast

import numpy as np

from rag.index.base import VectorIndex
from rag.config.schema import PositiveInt, checked, string
from rag.types import Hits, RagError

MANIFEST = "ragrig_chroma.json"
COLLECTION = "chunks"
SPACES = ("cosine", "l2")


def _chromadb() -> Any:
    try:
        import chromadb
    except ImportError:
        raise RagError('index=chroma needs chromadb: pip install -e ".[chroma]"') from None
    return chromadb


class ChromaIndex(VectorIndex):
    @checked("index")
    def __init__(self, space: Annotated[str, string(choices=SPACES)] = "cosine", M: PositiveInt = 32,
                 ef_construction: PositiveInt = 200, ef_search: PositiveInt = 128):
        super().__init__()
        self.metric = self.space = space
        self.M, self.ef_construction, self.ef_search = M, ef_construction, ef_search
        self._client: Any = None
        self._collection: Any = None
        self._dim = self._n = 0
        self._path: str | None = None

    @property
    def params(self) -> dict[str, Any]:
        return {"type": "ChromaIndex", "metric": self.space, "M": self.M, "ef_construction": self.ef_construction,
                "chromadb": _chromadb().__version__}

    # ---- building and storing ---------------------------------------------------------------------

    def _open(self, path: str, create: bool) -> None:
        chromadb = _chromadb()
        from chromadb.config import Settings

        client = self._client = chromadb.PersistentClient(path=path, settings=Settings(anonymized_telemetry=False))
        if create:
            config = {"hnsw": {"space": self.space, "max_neighbors": self.M, "ef_construction": self.ef_construction,
                               "ef_search": self.ef_search}}
            self._collection = client.create_collection(COLLECTION, configuration=config, embedding_function=None)
        else:
            self._collection = client.get_collection(COLLECTION)
        self._path = path

    def _close(self) -> None:
        """Lets Chroma's files go (its client stops), so that they can be copied or removed."""
        if self._client is not None:
            self._collection = None
            self._client.close()
            self._client = None

    def build(self, vectors: np.ndarray, batch_size: int = 65536) -> "ChromaIndex":
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] == 0:
            raise RagError(f"index: need a non-empty 2-d array of vectors, got shape {vectors.shape}")
        self._close()
        self._open(self._workdir(), create=True)
        step = min(batch_size, self._client.get_max_batch_size())
        for i in range(0, len(vectors), step):
            rows = range(i, min(len(vectors), i + step))
            self._collection.add(ids=[str(r) for r in rows], embeddings=vectors[i:i + step],
                                 metadatas=[{"row": r} for r in rows])
        self._dim, self._n = int(vectors.shape[1]), int(vectors.shape[0])
        return self

    def save(self, directory: Path) -> None:
        """Chroma's files for the cache entry (copied whole once the client has let them go)."""
        built = cast(str, self._path)  # set by build() or load()
        self._close()
        shutil.copytree(built, Path(directory), dirs_exist_ok=True)
        (Path(directory) / MANIFEST).write_text(json.dumps(
            {"chromadb": _chromadb().__version__, "space": self.space, "dim": self._dim, "ntotal": self._n}))
        self._open(built, create=False)  # searchable again, as a built FAISS index is

    def load(self, directory: Path) -> "ChromaIndex":
        manifest = Path(directory) / MANIFEST
        try:
            info = json.loads(manifest.read_text())
        except (OSError, ValueError):
            raise RagError(f"index=chroma: {directory} holds no {MANIFEST}; not a Chroma index built here") from None
        version = _chromadb().__version__
        if info.get("chromadb") != version:
            raise RagError(f"index=chroma: {directory} was written by chromadb {info.get('chromadb')}, this is {version}; "
                           f"remove that directory (it is rebuilt) or install chromadb=={info.get('chromadb')}")
        self._close()
        work = self._workdir()
        shutil.copytree(directory, work, dirs_exist_ok=True)
        self._open(work, create=False)
        self._dim, self._n = int(info["dim"]), int(info["ntotal"])
        return self

    def _workdir(self) -> str:
        """A private directory the client may write in: Chroma writes into its directory whenever a
        client opens it, so a (checksummed, shared) cache entry is never opened in place."""
        work = tempfile.mkdtemp(prefix="ragrig-chroma-")
        weakref.finalize(self, shutil.rmtree, work, True)
        return work

    # ---- searching ------------------------------------------------------------------------------------

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def ntotal(self) -> int:
        return self._n

    def search(self, queries: np.ndarray, n: int, allowed: np.ndarray | None = None) -> Hits:
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if self._collection is None:
            raise RuntimeError("ChromaIndex.search before build() or load()")
        if queries.shape[1] != self.dim:
            raise RagError(f"index: query dimension {queries.shape[1]} differs from the index dimension {self.dim} "
                           "(embedder changed? the index must be rebuilt with the same embedder)")
        n = max(1, min(n, self.ntotal))
        out = Hits.empty(len(queries), n)
        where = None
        if allowed is not None:
            if len(allowed) == 0:
                return out
            where = {"row": {"$in": [int(r) for r in allowed]}}
            n_q = min(n, len(allowed))
        else:
            n_q = n
        got = self._collection.query(query_embeddings=queries, n_results=n_q, where=where, include=["distances"])
        for q, (ids, dist) in enumerate(zip(got["ids"], got["distances"])):
            out.ids[q, :len(ids)] = [int(i) for i in ids]
            out.scores[q, :len(ids)] = -np.asarray(dist, np.float32)
        return out
