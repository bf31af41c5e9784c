"""`embedder=precomputed`: chunk vectors computed elsewhere (a GPU box, a serving engine, a
colleague's run), read by chunk id instead of encoded here.

`path` is either a directory holding `vectors.npy` (float32 or float16, one row per id) and
`ids.json` (a list) or `ids.txt` (one id a line), or a Parquet file with an `id` column and a
`vector` column (lists of floats). Every chunk of the run must have a row (ids are the chunks'
`doc_id#position`, as `python -m rag.corpus.export` and per_question.jsonl write them); rows for
other chunks are ignored, a row of another length is refused in one line, and so is an id given
twice once ids are looked up (a file in the chunks' own order is copied by row, see below).
Questions are encoded at search time by `queries`, which must be the model that made the chunk
vectors: its dimension is checked against the file's, and the retriever checks it again against
the index. The vectors are cached like any embedder's, keyed by the file's fingerprint (path,
size, modification time) and the query model.

At 10M chunks the vectors are 15 GB: `write_vectors` copies them into the cache's file batch by
batch with ordinary file reads and writes (not through mappings, whose pages would stay in this
process's memory), and while the file lists the chunks in the run's own order (an export from the
same chunking) it copies row ranges without looking any id up.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from rag.store.cache import ArtifactCache
from rag.corpus.base import file_fingerprint
from rag.embedder.base import Embedder
from rag.store.models import use_cache
from rag.config.schema import FilePath, checked
from rag.types import RagError
from rag.index.vector_rows import read_rows, take_rows, write_rows

BATCH = 65536  # vectors_for's batches: 96 MB of float32 at 384-d


class PrecomputedEmbedder(Embedder):
    vectors_by_id = True
    batch_size = BATCH

    @checked("embedder")
    def __init__(self, path: FilePath, queries: Embedder, normalize: bool = True, show_progress: bool = False):
        # show_progress: the setting every embedder takes (debug=tiny turns it off); nothing is encoded here
        if not isinstance(queries, Embedder):
            raise RagError("embedder.queries must be an embedder config (e.g. the embedder/minilm node) that encodes questions")
        self.path, self.queries, self.normalize = Path(str(path)).expanduser(), queries, bool(normalize)
        self.query_prefix = queries.query_prefix
        self.model_name = f"precomputed:{self.path.name}"
        self._file: tuple[list[str], np.ndarray] | None = None
        self._rows_of: dict[str, int] | None = None

    def __repr__(self) -> str:
        return f"PrecomputedEmbedder({self.path})"

    def use_cache(self, cache: ArtifactCache) -> None:
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
                "normalize": self.normalize, "queries": self.queries.id}

    reference_id = id  # vectors made elsewhere: no local computation is known to reproduce them

    def warm_up(self) -> None:
        self.encode_queries(["warm-up"])

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        return self.queries.encode_queries(queries)

    def encode(self, texts: list[str], show_progress: bool | None = None) -> np.ndarray:
        raise RagError("embedder=precomputed reads chunk vectors by id and encodes no text; "
                       "a component that encodes chunk texts needs an embedder of its own")

    # ---- the vectors ---------------------------------------------------------------------------

    def _load(self) -> tuple[list[str], np.ndarray]:
        """The file's ids and its vectors (vectors.npy memory-mapped), their counts checked."""
        if self._file is not None:
            return self._file
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
        self._file = (ids, vectors)
        return self._file

    def _id_rows(self) -> dict[str, int]:
        """id -> row, built only when the chunks are not in the file's order (the dict of 10M
        ids is most of a GB); a repeated id is refused here."""
        if self._rows_of is not None:
            return self._rows_of
        rows_of: dict[str, int] = {}
        for i, chunk_id in enumerate(self._load()[0]):
            if chunk_id in rows_of:
                raise RagError(f"embedder.path {self.path}: id {chunk_id!r} is given twice "
                               f"(rows {rows_of[chunk_id]} and {i})")
            rows_of[chunk_id] = i
        self._rows_of = rows_of
        return rows_of

    @property
    def dim(self) -> int:
        return int(self._load()[1].shape[1])

    def vectors_for(self, chunk_ids: list[str]) -> np.ndarray:
        """float32 [len(chunk_ids), dim] in the order asked, L2-normalized when `normalize`."""
        out = np.empty((len(chunk_ids), self.dim), np.float32)
        self.write_vectors((chunk_ids[i : i + BATCH] for i in range(0, len(chunk_ids), BATCH)), out)
        return out

    def write_vectors(self, id_batches: Iterable[list[str]], out: np.ndarray) -> dict[str, Any]:
        """Fills `out` (float32 [n_chunks, dim], e.g. np.lib.format.open_memmap's file) with the
        vectors of the chunk ids, batch after batch, L2-normalized when `normalize`. Returns
        {"n": chunks, "dim": dim, "in_order": whether every row was copied by position}.

        While the file's ids are the batch's ids at the same rows, rows are copied by position and
        no id is looked up; from the first batch that differs on, each id is looked up (and the
        file's ids are then checked for repeats). Missing ids are counted over every batch and
        reported together at the end; nothing after the first missing one is written."""
        ids, vectors = self._load()
        dim = int(vectors.shape[1])
        query_dim = int(self.encode_queries(["dimension check"]).shape[1])
        if query_dim != dim:
            raise RagError(f"embedder.path {self.path} holds {dim}-d vectors, but embedder.queries makes "
                           f"{query_dim}-d query vectors: the chunk vectors must come from the query model")
        if out.ndim != 2 or out.shape[1] != dim:
            raise RagError(f"embedder.path {self.path}: {dim}-d vectors cannot fill an array of shape {out.shape}")
        start, in_order, missing = 0, True, 0
        examples: list[str] = []
        for batch in id_batches:
            batch = batch if isinstance(batch, list) else list(batch)
            stop = start + len(batch)
            if stop > len(out):
                raise RagError(f"embedder.path {self.path}: more chunk ids than the {len(out)} rows to fill")
            if in_order and ids[start:stop] == batch:
                block = read_rows(vectors, start, stop)
            else:
                in_order = False
                row_of = self._id_rows()
                rows = [row_of.get(c, -1) for c in batch]
                if -1 in rows:
                    lost = [c for c, r in zip(batch, rows) if r < 0]
                    missing += len(lost)
                    examples += lost[: 3 - len(examples)]
                if missing:  # the run fails; the rest is only counted
                    start = stop
                    continue
                block = take_rows(vectors, np.asarray(rows, np.int64))
            if not np.isfinite(block).all():
                raise RagError(f"embedder.path {self.path}: vectors hold NaN or infinite values")
            if self.normalize:  # a new array: `block` may be a view of the Parquet file's vectors
                block = block / np.maximum(np.linalg.norm(block, axis=1, keepdims=True), 1e-12)
            write_rows(out, start, block)
            start = stop
        if missing:
            raise RagError(f"embedder.path {self.path}: no vector for {missing} of the run's {start} chunks "
                           f"(e.g. {', '.join(repr(m) for m in examples)}); "
                           "were they cut with the same chunker settings?")
        if start != len(out):
            raise RagError(f"embedder.path {self.path}: {start} chunk ids for the {len(out)} rows to fill")
        return {"n": start, "dim": dim, "in_order": in_order}
