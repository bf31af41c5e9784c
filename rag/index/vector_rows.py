"""Rows of a vectors file read and written with ordinary file I/O instead of through its mapping.

The artifact cache hands out vectors as memory maps (np.load(..., mmap_mode="r")). A pass over a
mapped file makes every page it touches part of the process's resident memory until the mapping
goes: 15 GB of file-backed RSS after reading 10M 384-d vectors once. A read through the page cache
costs the same and stays out of the process. These helpers do that for arrays mapped from a file,
and plain indexing for any other array.
"""
from __future__ import annotations

import mmap
from typing import Any

import numpy as np

from rag.types import RagError


def _file_span(array: np.ndarray, writable: bool = False) -> tuple[str, int] | None:
    """(file, byte position of row 0) when `array` is a C-contiguous view of a file mapping (a
    np.memmap, as np.load(..., mmap_mode=...) and open_memmap return, or a row slice of one)."""
    if not array.flags.c_contiguous:
        return None
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not isinstance(root, np.memmap) or not isinstance(root.base, mmap.mmap) or root.filename is None:
        return None
    if writable and root.mode not in ("r+", "w+"):  # a copy-on-write mapping would not see the writes
        return None
    # A slice keeps its parent's .offset; its own position is its distance from the parent's start.
    return root.filename, root.offset + (array.ctypes.data - root.ctypes.data)


def _row_bytes(array: np.ndarray) -> int:
    return array.dtype.itemsize * int(np.prod(array.shape[1:]))


def _read_into(f: Any, pos: int, buf: np.ndarray) -> None:
    view = buf.reshape(-1).view(np.uint8).data
    f.seek(pos)
    got = 0
    while got < len(view):
        k = f.readinto(view[got:])
        if not k:
            raise RagError(f"{f.name} ends at byte {pos + got}, before the rows its header promises "
                           "(truncated?)")
        got += k


def read_rows(vectors: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Rows start:stop (slice semantics) as C-contiguous float32: read from the file when
    `vectors` is mapped from one, else a slice (no copy for a C-contiguous float32 array)."""
    start, stop, _ = slice(start, stop).indices(len(vectors))
    span = _file_span(vectors)
    if span is None:
        return np.ascontiguousarray(vectors[start:stop], dtype=np.float32)
    buf = np.empty((max(0, stop - start),) + vectors.shape[1:], vectors.dtype)
    if len(buf):
        with open(span[0], "rb", buffering=0) as f:
            _read_into(f, span[1] + start * _row_bytes(vectors), buf)
    return buf.astype(np.float32, copy=False)


def take_rows(vectors: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """vectors[rows] as C-contiguous float32, in the order of `rows`; from a mapped file, each
    run of consecutive rows is one read, in ascending order."""
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    span = _file_span(vectors)
    if span is None or not len(rows):
        return np.ascontiguousarray(vectors[rows], dtype=np.float32)
    if rows.min() < 0 or rows.max() >= len(vectors):
        raise IndexError(f"rows out of range for {len(vectors)} rows")
    order = np.argsort(rows, kind="stable")
    ascending = rows[order]
    buf = np.empty((len(rows),) + vectors.shape[1:], vectors.dtype)
    firsts = np.flatnonzero(np.diff(ascending, prepend=-2) != 1)  # where each run starts in `ascending`
    ends = np.append(firsts[1:], len(rows))
    with open(span[0], "rb", buffering=0) as f:
        for a, b in zip(firsts.tolist(), ends.tolist()):
            _read_into(f, span[1] + int(ascending[a]) * _row_bytes(vectors), buf[a:b])
    got = buf.astype(np.float32, copy=False)
    if (order == np.arange(len(rows))).all():
        return got
    out = np.empty_like(got)
    out[order] = got
    return out


def write_rows(out: np.ndarray, start: int, block: np.ndarray) -> None:
    """out[start:start + len(block)] = block: with a file write when `out` is a writable file
    mapping (np.lib.format.open_memmap's), so that what is written does not stay resident."""
    stop = start + len(block)
    if not 0 <= start <= stop <= len(out):
        raise IndexError(f"rows {start}:{stop} out of range for {len(out)} rows")
    span = _file_span(out, writable=True)
    if span is None or stop == start:
        out[start:stop] = block
        return
    data = np.ascontiguousarray(block, dtype=out.dtype)
    if data.shape[1:] != out.shape[1:]:
        raise ValueError(f"rows of shape {data.shape[1:]} written to rows of shape {out.shape[1:]}")
    with open(span[0], "r+b", buffering=0) as f:
        f.seek(span[1] + start * _row_bytes(out))
        view = data.reshape(-1).view(np.uint8).data
        while view:
            view = view[f.write(view):]
