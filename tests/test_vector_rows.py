"""Rows of a memory-mapped vectors file, read and written with file I/O (rag/index/vector_rows.py):
the same rows as indexing the mapping, in any order, from any slice, float16 read as float32."""
import numpy as np

from rag.index.vector_rows import read_rows, take_rows, write_rows
from tests.test_index import mapped, structured


def test_rows_read_from_the_file_are_the_rows_of_the_mapping(tmp_path):
    base, _ = structured(500)
    for array in (base, base.astype(np.float16)):
        m = mapped(tmp_path, array)
        for view in (m, m[37:400]):  # a slice keeps its parent's .offset: its own position is computed
            np.testing.assert_array_equal(read_rows(view, 5, 120), np.asarray(view[5:120], np.float32))
            np.testing.assert_array_equal(read_rows(view, 300, 10**6), np.asarray(view[300:], np.float32))
            rows = np.array([9, 3, 4, 5, 200, 3, 0, len(view) - 1])  # any order, repeats
            np.testing.assert_array_equal(take_rows(view, rows), np.asarray(view[rows], np.float32))
        assert read_rows(m, 10, 20).dtype == np.float32 and read_rows(m, 10, 20).flags.c_contiguous
    out = np.lib.format.open_memmap(tmp_path / "out.npy", mode="w+", dtype=np.float32, shape=base.shape)
    write_rows(out, 100, base[:50])
    np.testing.assert_array_equal(out[100:150], base[:50])  # a file write, seen through the mapping
    del out
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy")[100:150], base[:50])
