"""Chunks on disk, read by row: the chunks artifact's format, and the corpus artifact's.

Ten million chunks held as `Chunk` records take about 10 GB of Python objects; here they take
their own bytes. Texts, document ids and metadata (JSON) are UTF-8 blobs with an int64 end offset
per row; start, end, position and a source code per row are fixed-width columns. Every file is
memory-mapped, so a run that asks for a few thousand chunks (contexts, passages, metrics) reads a
few thousand rows, and the kernel's page cache, not the process, holds the rest.

`ChunkWriter` appends chunks as the chunker produces them and records, after each shard of
documents, how long every file was; a build killed with SIGKILL truncates its files to that
record and goes on from the next document (rag.run.artifacts for chunks, rag.corpus.loading for a
corpus). `ChunkStore` reads a finished set.

A corpus is stored in the same files, each document as one row holding its whole text
(`document_row`), and read back as documents by `DocumentStore`.
"""
from __future__ import annotations

import json
import mmap
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any, TypeVar, overload

import numpy as np
import numpy.typing as npt

from rag.store.atomic import atomic_write_text
from rag.types import Chunk, Document, RagError

T = TypeVar("T")

FORMAT = "ragrig-chunks/1"
STORE_FILE = "chunks.json"  # what is stored: the format, the number of rows, the source names
PROGRESS_FILE = "progress.json"
# column file -> dtype; the blobs hold the bytes the "*_end" columns end (meta: a row's metadata as
# JSON, no bytes for none)
COLUMNS = {"text_end.i64": np.int64, "doc_end.i64": np.int64, "meta_end.i64": np.int64, "start.i64": np.int64,
           "end.i64": np.int64, "position.i64": np.int64, "source.u16": np.uint16}
BLOBS = ("text.bin", "doc.bin", "meta.bin")
FILES = (*BLOBS, *COLUMNS)
# Chunking and corpus reading record their progress every SHARD_DOCS documents (ChunkWriter.checkpoint):
# what a killed build resumes from. RAGRIG_TEST_CHUNK_SHARD: smaller shards, for the crash tests only.
SHARD_DOCS = int(os.environ.get("RAGRIG_TEST_CHUNK_SHARD", "10000"))


class ChunkWriter:
    """Appends chunks to the store's files in `directory`. `docs_done` is how many documents an
    earlier, interrupted writer had finished when it last recorded its progress (0 when there is
    no usable record); the caller skips those documents."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.docs_done, self.n, self.sources = self._restore()
        self._codes = {s: i for i, s in enumerate(self.sources)}
        self._bytes = {name: (self.dir / name).stat().st_size for name in FILES}
        self._reset_buffers()

    def _restore(self) -> tuple[int, int, list[str]]:
        """Truncate every file to the lengths of the last recorded shard; start empty when the
        record is missing, unreadable or does not match the files."""
        try:
            rec = json.loads((self.dir / PROGRESS_FILE).read_text())
            sizes = {name: int(rec["bytes"][name]) for name in FILES}
            if rec.get("format") != FORMAT or any((self.dir / n).stat().st_size < s for n, s in sizes.items()):
                raise ValueError("files shorter than recorded")
            docs, n, sources = int(rec["docs"]), int(rec["n"]), [str(s) for s in rec["sources"]]
        except (OSError, ValueError, KeyError, TypeError):
            docs, n, sources, sizes = 0, 0, [], dict.fromkeys(FILES, 0)
        for name, size in sizes.items():
            with open(self.dir / name, "ab") as f:
                f.truncate(size)
        return docs, n, sources

    def _reset_buffers(self) -> None:
        self._blobs = {name: bytearray() for name in BLOBS}
        self._cols: dict[str, list[int]] = {name: [] for name in COLUMNS}

    def add(self, chunk: Chunk) -> None:
        if chunk.id != f"{chunk.doc_id}#{chunk.position}":  # the store derives ids from the two
            raise ValueError(f"chunk id {chunk.id!r} is not doc_id#position")
        c = self._cols
        meta = json.dumps(chunk.meta, ensure_ascii=False) if chunk.meta else ""
        for blob, value in (("text", chunk.text), ("doc", chunk.doc_id), ("meta", meta)):
            self._blobs[f"{blob}.bin"] += value.encode("utf-8")
            c[f"{blob}_end.i64"].append(self._bytes[f"{blob}.bin"] + len(self._blobs[f"{blob}.bin"]))
        c["start.i64"].append(chunk.start)
        c["end.i64"].append(chunk.end)
        c["position.i64"].append(chunk.position)
        code = self._codes.get(chunk.source)
        if code is None:
            code = self._codes[chunk.source] = len(self.sources)
            self.sources.append(chunk.source)
        c["source.u16"].append(code)
        self.n += 1

    def add_all(self, docs: Iterable[Document], rows: Callable[[Document], Iterable[Chunk]], shard: int) -> int:
        """Add the rows of each document (`rows(doc)`: its chunks, or `document_row`), recording
        progress every `shard` documents; the documents an earlier writer recorded are skipped,
        not turned into rows again. Returns the number of documents."""
        n = 0
        for n, doc in enumerate(docs, 1):
            if n <= self.docs_done:
                continue
            for row in rows(doc):
                self.add(row)
            if n % shard == 0:
                self.checkpoint(n)
        if n < self.docs_done:
            raise RagError(f"{self.dir}: an interrupted build recorded {self.docs_done} documents, but its input "
                           f"has {n}; delete that directory")
        return n

    def checkpoint(self, docs_done: int) -> None:
        """Append the buffered rows and record that the first `docs_done` documents are stored.
        The rows reach the files (the OS) before the record says they did."""
        for name, data in self._blobs.items():
            self._append(name, bytes(data))
        for name, dtype in COLUMNS.items():
            self._append(name, np.asarray(self._cols[name], dtype=dtype).tobytes())
        self._reset_buffers()
        self.docs_done = docs_done
        atomic_write_text(self.dir / PROGRESS_FILE, json.dumps(
            {"format": FORMAT, "docs": docs_done, "n": self.n, "sources": self.sources, "bytes": self._bytes}))

    def _append(self, name: str, data: bytes) -> None:
        with open(self.dir / name, "ab") as f:
            f.write(data)
        self._bytes[name] += len(data)

    def finish(self, docs_done: int, out: Path) -> dict[str, Any]:
        """Store the last rows and move the files into `out` (the artifact's staging directory)."""
        self.checkpoint(docs_done)
        for name in FILES:
            os.replace(self.dir / name, Path(out) / name)
        (Path(out) / STORE_FILE).write_text(json.dumps({"format": FORMAT, "n": self.n, "sources": self.sources}))
        return {"n_chunks": self.n, "n_docs": docs_done}


def document_row(doc: Document) -> tuple[Chunk]:
    """A document as one row of a store: its whole text, start 0, end its length in characters."""
    return (Chunk(f"{doc.id}#0", doc.id, doc.text, doc.source, 0, len(doc.text), 0, doc.meta),)


class _Rows(Sequence[T]):
    """A sequence whose items are built one row at a time by `_row`."""

    def _row(self, i: int) -> T:
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> list[T]: ...

    def __getitem__(self, i: int | slice) -> T | list[T]:
        n = len(self)
        if isinstance(i, slice):
            return [self._row(j) for j in range(*i.indices(n))]
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"row {i} out of range for {n} rows")
        return self._row(i)

    def __iter__(self) -> Iterator[T]:
        return (self._row(i) for i in range(len(self)))


class ChunkStore(_Rows[Chunk]):
    """The chunks of a finished store, read by row (`store[i]` builds one `Chunk`)."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        head = json.loads((self.dir / STORE_FILE).read_text())
        if head.get("format") != FORMAT:
            raise ValueError(f"{self.dir / STORE_FILE}: unknown format {head.get('format')!r}")
        self.n = int(head["n"])
        self.source_names = [str(s) for s in head["sources"]]
        self.cols = {name[: name.index(".")]: _map_column(self.dir / name, dtype, self.n) for name, dtype in COLUMNS.items()}
        self._blobs = {name: _map_blob(self.dir / f"{name}.bin") for name in ("text", "doc", "meta")}

    def __len__(self) -> int:
        return self.n

    def _row(self, i: int) -> Chunk:
        doc_id = self.doc_id(i)
        position = int(self.cols["position"][i])
        return Chunk(id=f"{doc_id}#{position}", doc_id=doc_id, text=self.text(i),
                     source=self.source_names[self.cols["source"][i]], start=int(self.cols["start"][i]),
                     end=int(self.cols["end"][i]), position=position, meta=self.meta(i))

    def _span(self, ends: np.ndarray, i: int) -> tuple[int, int]:
        return (int(ends[i - 1]) if i else 0), int(ends[i])

    def _field(self, name: str, i: int) -> str:
        a, b = self._span(self.cols[f"{name}_end"], i)
        return self._blobs[name][a:b].decode("utf-8")

    def text(self, i: int) -> str:
        return self._field("text", i)

    def doc_id(self, i: int) -> str:
        return self._field("doc", i)

    def meta(self, i: int) -> dict[str, Any]:
        raw = self._field("meta", i)
        return json.loads(raw) if raw else {}

    def texts(self, start: int = 0, stop: int | None = None) -> list[str]:
        """The texts of rows [start, stop), decoded from one read of the blob."""
        stop = self.n if stop is None else min(stop, self.n)
        if start >= stop:
            return []
        ends = np.asarray(self.cols["text_end"][start:stop])
        base = int(self.cols["text_end"][start - 1]) if start else 0
        # A read, not the mapping: a build that streams every text (BM25, embedding) would
        # otherwise keep the whole blob resident in its own memory (4 GB at 10M chunks).
        with open(self.dir / "text.bin", "rb") as f:
            blob = os.pread(f.fileno(), int(ends[-1]) - base, base)
        cuts = [0, *(ends - base).tolist()]
        return [blob[a:b].decode("utf-8") for a, b in pairwise(cuts)]

    def ids(self, start: int = 0, stop: int | None = None) -> list[str]:
        """The chunk ids (doc_id#position) of rows [start, stop)."""
        stop = self.n if stop is None else min(stop, self.n)
        positions = self.cols["position"][start:stop].tolist()
        return [f"{self.doc_id(i)}#{p}" for i, p in zip(range(start, stop), positions)]

    def source_codes(self) -> np.ndarray:
        return self.cols["source"]


def _map_column(path: Path, dtype: npt.DTypeLike, n: int) -> np.ndarray:
    size = path.stat().st_size
    if size != n * np.dtype(dtype).itemsize:
        raise ValueError(f"{path}: {size} bytes for {n} rows of {np.dtype(dtype).name}")
    if n == 0:
        return np.zeros(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,))


def _map_blob(path: Path) -> bytes | mmap.mmap:
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


class DocumentStore(_Rows[Document]):
    """The documents of a corpus stored as `document_row`s, read by row."""

    def __init__(self, directory: Path):
        self.rows = ChunkStore(directory)

    def __len__(self) -> int:
        return len(self.rows)

    def _row(self, i: int) -> Document:
        c = self.rows._row(i)
        return Document(c.doc_id, c.text, c.source, c.meta)
