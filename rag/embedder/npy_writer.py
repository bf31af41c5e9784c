"""The chunk vectors' .npy, written block by block by `encode_to_npy` and resumable after a kill
(`BlockLog` records the finished blocks): the vectors artifact's builder (rag.run.artifacts).

Every embedder's vectors pass through here, so what is stored is checked here, after the float32
cast: a row that is all zeros (values such as 1e-200 underflow to 0.0) or holds NaN or an infinity
can be found by no search, yet ranks as if it could (`refuse_unusable`)."""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rag.store.atomic import atomic_write_text
from rag.embedder.base import Embedder, RowSink
from rag.types import RagError

log = logging.getLogger(__name__)

# Encoding in blocks bounds the memory of one step, shows progress on large corpora, and is what an
# interrupted embedding resumes from (encode_to_npy). RAGRIG_TEST_ENCODE_BLOCK: smaller blocks, for
# the crash tests only (a few hundred chunks then span several blocks).
ENCODE_BLOCK = int(os.environ.get("RAGRIG_TEST_ENCODE_BLOCK", "8192"))


def encode_to_npy(embedder: Embedder, texts: list[str], path: Path,
                  resume: Path | None = None) -> dict:
    """Encode texts into a float32 .npy written block by block (never whole in memory twice).
    Identical texts (boilerplate repeated across documents) are encoded once.

    The embedder yields (rows, vectors) pairs from `encode_blocks`, in any order, so an engine
    that encodes on several workers (rag.embedder.ray_data) writes the very same file. An embedder
    that `writes_rows` is handed the file itself (a RowSink): its workers write their vectors into
    it, on every node of a cluster when the cache is on a shared filesystem, and the pairs they
    yield are (rows, None): recorded as done here, never carried through this process.

    `resume`: a directory that outlives a failed or killed build (the cache's `partial` directory
    of this artifact). The unique texts' vectors are written into a file there, and blocks.json
    lists the blocks of ENCODE_BLOCK texts whose rows are all written and flushed; a later build
    reopens the file and encodes only the other blocks, so an hours-long embedding killed near its
    end loses at most the blocks in flight. The file is moved, not copied, into the artifact."""
    unique: dict[str, int] = {}
    inverse = np.fromiter((unique.setdefault(t, len(unique)) for t in texts), dtype=np.int64, count=len(texts))
    uniq_texts = list(unique)
    dim = embedder.dim
    # With no repeated text (the usual case) the unique vectors are the result: encode straight
    # into the output, not into a second file that is then copied (2x the writes and page cache).
    all_unique = len(uniq_texts) == len(texts)
    blocks = BlockLog(resume, len(uniq_texts), dim)
    if resume is not None:
        uniq_path = resume / "unique.npy"
    else:
        uniq_path = path if all_unique else path.with_name("unique.tmp.npy")
    out_u = blocks.open(uniq_path)
    todo = blocks.todo()  # rows still to encode: whole blocks, in order
    todo_texts = uniq_texts if len(todo) == len(uniq_texts) else [uniq_texts[i] for i in todo]
    if embedder.writes_rows and len(todo):
        out_u.flush()  # the header and the full size are in the file (open_memmap wrote them) before workers write
        pairs = embedder.encode_blocks(todo_texts, ENCODE_BLOCK,
                                       sink=RowSink(str(uniq_path.absolute()), int(out_u.offset), dim, todo))
    else:
        pairs = embedder.encode_blocks(todo_texts, ENCODE_BLOCK)
    written_elsewhere = False
    def text_of(u: int) -> str:  # a unique text as its first row among `texts`
        return f"text {int(np.flatnonzero(inverse == u)[0])} ({shown_text(uniq_texts[u])})"

    for rows, vecs in pairs:
        where = todo[rows]
        if vecs is None:
            written_elsewhere = True  # by the embedder's workers, into the file
        else:
            with np.errstate(over="ignore"):  # a value beyond float32 becomes inf: refused just below
                out_u[where] = vecs
            refuse_unusable(embedder, out_u[where], where, text_of)  # as stored, before it counts as done
        blocks.filled(where, out_u)
    out_u.flush()
    if written_elsewhere:
        # A fresh map: this one may hold pages of the file from before the workers wrote (a shared
        # filesystem revalidates what it cached when the file is opened again).
        del out_u
        out_u = np.lib.format.open_memmap(uniq_path, mode="r")
        for i in range(0, len(todo), ENCODE_BLOCK):
            rows_done = todo[i:i + ENCODE_BLOCK]
            refuse_unusable(embedder, out_u[rows_done], rows_done, text_of)
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
        if uniq_path != path:
            os.replace(uniq_path, path)
    return {"n": len(texts), "unique": len(uniq_texts), "dim": dim, "embedder": json.loads(json.dumps(embedder.id)),
            "resumed_blocks": blocks.restored}


def unusable_row(vecs: np.ndarray) -> tuple[int, str] | None:
    """The first row of `vecs` that no search can use, with what is wrong with it; None when every
    row is usable. A zero vector has no direction (no cosine, and an L2 index ranks it by the
    query's norm alone); NaN or an infinity poisons every distance it enters."""
    vecs = np.asarray(vecs)
    if vecs.ndim != 2 or not len(vecs):
        return None
    bad = ~np.isfinite(vecs).all(axis=1)
    zero = ~vecs.any(axis=1)
    either = np.flatnonzero(bad | zero)
    if not len(either):
        return None
    row = int(either[0])
    if bad[row]:
        return row, "holds NaN or an infinite value"
    return row, "is all zeros (a zero vector has no direction, so no cosine)"


def refuse_unusable(embedder: Embedder, stored: np.ndarray, rows: np.ndarray, text_of: Callable[[int], str]) -> None:
    """A RagError naming the embedder and the text when a row of `stored` (the float32 vectors of
    the rows `rows`, as written) is unusable; `text_of(row)` says which text the row is."""
    found = unusable_row(stored)
    if found is None:
        return
    row, problem = found
    name = embedder.model_name or type(embedder).__name__
    raise RagError(f"embedder {name}: the vector of {text_of(int(rows[row]))} {problem} as stored in float32; "
                   "the embedder's output is refused and no vectors are cached")


def shown_text(text: str, limit: int = 60) -> str:
    """A text cut short and quoted for one line: its control characters escaped (repr)."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


class BlockLog:
    """Which blocks of encode_to_npy's unique-vectors file are complete: blocks.json in its resume
    directory, rewritten atomically after each block's rows are flushed (None: no directory,
    nothing recorded, a fresh file every time)."""

    def __init__(self, directory: Path | None, n: int, dim: int):
        self.dir, self.n, self.dim = directory, n, dim
        self.count = np.zeros(-(-n // ENCODE_BLOCK), np.int64)  # rows filled per block
        self.done: set[int] = set()
        self.restored = 0

    def _rows(self, b: int) -> slice:
        return slice(b * ENCODE_BLOCK, min(self.n, (b + 1) * ENCODE_BLOCK))

    def _size(self, b: int) -> int:
        return self._rows(b).stop - self._rows(b).start

    def open(self, file: Path) -> np.memmap:
        """The unique vectors' memory map: an interrupted build's file with its finished blocks when
        it matches (same rows, dimension and block size), else a new one."""
        shape = (self.n, self.dim)
        if self.dir is not None and file.is_file():
            try:
                done = self._read(self.dir, self.n, self.dim)
                out = np.lib.format.open_memmap(file, mode="r+")
                if done is not None and (out.shape, out.dtype) == (shape, np.float32):
                    self.done = done
                    for b in self.done:
                        self.count[b] = self._size(b)
                    self.restored = len(self.done)
                    if self.restored:
                        log.info("embedding resumes: %d of %d blocks were encoded by an earlier, interrupted build",
                                 self.restored, len(self.count))
                    return out
                del out
            except (OSError, ValueError, KeyError, TypeError):
                pass  # unreadable or another shape: encoded anew
        self._record()
        return np.lib.format.open_memmap(file, mode="w+", dtype=np.float32, shape=shape)

    @staticmethod
    def _read(directory: Path, n: int, dim: int | None) -> set[int] | None:
        """The finished blocks blocks.json records for `n` texts of `dim` values (any dimension
        when None), or None when it records another build; errors are the caller's."""
        record = json.loads((directory / "blocks.json").read_text())
        if (record["n"], record["block"]) != (n, ENCODE_BLOCK) or dim not in (None, record["dim"]):
            return None
        return {int(b) for b in record["done"] if 0 <= int(b) < -(-n // ENCODE_BLOCK)}

    @classmethod
    def recorded(cls, directory: Path | None, n: int) -> set[int]:
        """The blocks an interrupted build of `n` unique texts recorded in `directory` (what a
        rerun will not encode again; the dry run counts the rest). The dimension is not checked:
        it is known only once the model answers."""
        if directory is None:  # no interrupted build
            return set()
        try:
            if (directory / "unique.npy").is_file():
                return cls._read(directory, n, None) or set()
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return set()

    def todo(self) -> np.ndarray:
        rows = [np.arange(self._rows(b).start, self._rows(b).stop) for b in range(len(self.count)) if b not in self.done]
        return np.concatenate(rows) if rows else np.zeros(0, np.int64)

    def filled(self, rows: np.ndarray, out: np.memmap) -> None:
        if self.dir is None:
            return
        blocks, counts = np.unique(np.asarray(rows) // ENCODE_BLOCK, return_counts=True)
        finished = False
        for b, c in zip(blocks.tolist(), counts.tolist()):
            self.count[b] += c
            if self.count[b] == self._size(b):
                self.done.add(b)
                finished = True
        if finished:
            out.flush()  # the rows reach the file before the record says they did
            self._record()

    def _record(self) -> None:
        if self.dir is not None:
            atomic_write_text(self.dir / "blocks.json", json.dumps(
                {"n": self.n, "dim": self.dim, "block": ENCODE_BLOCK, "done": sorted(self.done)}))
