"""`embedder=precomputed`: chunk vectors computed elsewhere (a GPU box, a serving engine, a
colleague's run), read by chunk id instead of encoded here.

`path` is either a directory holding `vectors.npy` (float32 or float16, one row per id) and
`ids.json` (a list) or `ids.txt` (one id a line), or a Parquet file with an `id` column and a
`vector` column (lists of floats). Every chunk of the run must have a row (ids are the chunks'
`doc_id#position`, as `python -m rag.corpus.export` and per_question.jsonl write them); rows for
other chunks are ignored, an id given twice or a row of another length is refused in one line.
Questions are encoded at search time by `queries`, which must be the model that made the chunk
vectors: its dimension is checked against the file's, and the retriever checks it again against
the index. The vectors are cached like any embedder's, keyed by the file's fingerprint (path,
size, modification time) and the query model.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from rag.corpus.base import file_fingerprint
from rag.models import use_cache
from rag.types import RagError


class PrecomputedEmbedder:
    def __init__(self, path: str, queries: Any, normalize: bool = True, show_progress: bool = False):
        # show_progress: the setting every embedder takes (debug=tiny turns it off); nothing is encoded here
        if not hasattr(queries, "encode_queries"):
            raise RagError("embedder.queries must be an embedder config (e.g. the embedder/minilm node) that encodes questions")
        self.path, self.queries, self.normalize = Path(str(path)).expanduser(), queries, bool(normalize)
        self._table: tuple[dict[str, int], np.ndarray] | None = None

    def __repr__(self) -> str:
        return f"PrecomputedEmbedder({self.path})"

    def use_cache(self, cache: Any) -> None:
        use_cache(self.queries, cache)

    def _files(self) -> list[Path]:
        if self.path.is_dir():
            ids = next((self.path / n for n in ("ids.json", "ids.txt") if (self.path / n).is_file()), None)
            if not (self.path / "vectors.npy").is_file() or ids is None:
                raise RagError(f"embedder.path {self.path}: a directory must hold vectors.npy and ids.json or ids.txt")
            return [self.path / "vectors.npy", ids]
        if self.path.suffix == ".parquet" and self.path.is_file():
            return [self.path]
        raise RagError(f"embedder.path {self.path}: no such directory (vectors.npy + ids) or .parquet file")

    @property
    def id(self) -> dict[str, Any]:
        return {"engine": "precomputed", "files": [file_fingerprint(f) for f in self._files()],
                "normalize": self.normalize, "queries": getattr(self.queries, "id", repr(self.queries))}

    reference_id = id  # vectors made elsewhere: no local computation is known to reproduce them

    @property
    def query_prefix(self) -> str:
        return getattr(self.queries, "query_prefix", "")

    @property
    def model_name(self) -> str:
        return f"precomputed:{self.path.name}"

    def warm_up(self) -> None:
        self.encode_queries(["warm-up"])

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        return self.queries.encode_queries(queries)

    def encode(self, texts: list[str], show_progress: bool | None = None) -> np.ndarray:
        raise RagError("embedder=precomputed reads chunk vectors by id and encodes no text; "
                       "a component that encodes chunk texts needs an embedder of its own")

    # ---- the vectors ---------------------------------------------------------------------------

    def _load(self) -> tuple[dict[str, int], np.ndarray]:
        if self._table is not None:
            return self._table
        files = self._files()
        where = str(self.path)
        try:
            if len(files) == 1:
                import pyarrow.parquet as pq

                table = pq.read_table(files[0], columns=["id", "vector"])
                ids = [str(x) for x in table.column("id").to_pylist()]
                rows = table.column("vector").to_pylist()
                lengths = {len(r) for r in rows if r is not None}
                if None in rows or len(lengths) > 1:
                    raise RagError(f"embedder.path {where}: every row's vector must be present and of one length, "
                                   f"found lengths {sorted(lengths)}")
                vectors = np.asarray(rows, dtype=np.float32)
            else:
                vectors = np.load(files[0], mmap_mode="r", allow_pickle=False)
                text = files[1].read_text(encoding="utf-8")
                ids = ([str(x) for x in json.loads(text)] if files[1].suffix == ".json"
                       else [line for line in text.splitlines() if line.strip()])
        except RagError:
            raise
        except (OSError, ValueError, KeyError) as e:
            raise RagError(f"embedder.path {where}: cannot read the vectors ({type(e).__name__}: {e})") from None
        if vectors.ndim != 2 or vectors.shape[1] == 0:
            raise RagError(f"embedder.path {where}: vectors must be a 2-d array, got shape {vectors.shape}")
        if len(ids) != vectors.shape[0]:
            raise RagError(f"embedder.path {where}: {len(ids)} ids for {vectors.shape[0]} vectors")
        rows_of: dict[str, int] = {}
        for i, chunk_id in enumerate(ids):
            if chunk_id in rows_of:
                raise RagError(f"embedder.path {where}: id {chunk_id!r} is given twice (rows {rows_of[chunk_id]} and {i})")
            rows_of[chunk_id] = i
        self._table = (rows_of, vectors)
        return self._table

    @property
    def dim(self) -> int:
        return int(self._load()[1].shape[1])

    def vectors_for(self, chunk_ids: list[str]) -> np.ndarray:
        """float32 [len(chunk_ids), dim] in the order asked, L2-normalized when `normalize`."""
        rows_of, vectors = self._load()
        missing = [c for c in chunk_ids if c not in rows_of]
        if missing:
            raise RagError(f"embedder.path {self.path}: no vector for {len(missing)} of the run's {len(chunk_ids)} chunks "
                           f"(e.g. {', '.join(repr(m) for m in missing[:3])}); were they cut with the same chunker settings?")
        query_dim = int(self.encode_queries(["dimension check"]).shape[1])
        if query_dim != vectors.shape[1]:
            raise RagError(f"embedder.path {self.path} holds {vectors.shape[1]}-d vectors, but embedder.queries makes "
                           f"{query_dim}-d query vectors: the chunk vectors must come from the query model")
        out = np.asarray(vectors[[rows_of[c] for c in chunk_ids]], dtype=np.float32)
        if not np.isfinite(out).all():
            raise RagError(f"embedder.path {self.path}: vectors hold NaN or infinite values")
        if self.normalize:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out
