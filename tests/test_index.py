"""Every index type returns the exact neighbours on a small case; approximate ones within a stated
recall on a larger structured case; filters restrict results; save/load round-trips."""
import numpy as np
import pytest

from rag.index.faiss_index import (FlatIPIndex, FlatL2Index, HNSWIndex, HNSWSQ8Index, IVFIndex, IVFPQIndex,
                                   IVFSQ8Index)
from rag.types import RagError


def unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def small():
    rng = np.random.default_rng(0)
    return unit(rng.normal(size=(200, 16))), unit(rng.normal(size=(10, 16)))


def exact_l2(base, queries, n):
    d = ((queries[:, None, :] - base[None, :, :]) ** 2).sum(-1)
    return np.argsort(d, axis=1, kind="stable")[:, :n]


ALL = [
    lambda: FlatL2Index(),
    lambda: FlatIPIndex(),
    lambda: HNSWIndex(M=16, ef_construction=100, ef_search=200),
    lambda: IVFIndex(nlist=4, nprobe=4),  # probing every cell makes IVF exact
]


@pytest.mark.parametrize("make", ALL, ids=["flat_l2", "flat_ip", "hnsw", "ivf"])
def test_small_case_returns_exact_neighbours(make, small):
    base, queries = small
    hits = make().build(base).search(queries, 5)
    # On unit vectors the L2 and inner-product orders are the same.
    np.testing.assert_array_equal(hits.ids, exact_l2(base, queries, 5))
    assert np.all(np.diff(hits.scores, axis=1) <= 1e-6), "scores must be sorted, higher is better"


def test_l2_scores_are_negated_distances(small):
    base, queries = small
    hits = FlatL2Index().build(base).search(queries[:1], 1)
    d = ((base[hits.ids[0, 0]] - queries[0]) ** 2).sum()
    assert hits.scores[0, 0] == pytest.approx(-d, abs=1e-5)


@pytest.mark.parametrize("make,min_recall", [(ALL[2], 0.95), (lambda: IVFIndex(nlist=32, nprobe=8), 0.85)], ids=["hnsw", "ivf"])
def test_approximate_indexes_reach_stated_recall(make, min_recall):
    # Low-rank structure plus noise: uniform random vectors would make approximate search look broken.
    rng = np.random.default_rng(1)
    basis = rng.normal(size=(8, 64))
    base = unit(rng.normal(size=(4000, 8)) @ basis + 0.3 * rng.normal(size=(4000, 64)))
    queries = unit(rng.normal(size=(100, 8)) @ basis + 0.3 * rng.normal(size=(100, 64)))
    truth = FlatL2Index().build(base).search(queries, 10).ids
    got = make().build(base).search(queries, 10).ids
    recall = np.mean([len(set(t) & set(g)) / 10 for t, g in zip(truth, got)])
    assert recall >= min_recall


@pytest.mark.parametrize("make", ALL, ids=["flat_l2", "flat_ip", "hnsw", "ivf"])
def test_filter_keeps_only_allowed_rows(make, small):
    base, queries = small
    allowed = np.arange(0, 200, 3)
    hits = make().build(base).search(queries, 5, allowed=allowed)
    assert set(hits.ids.ravel()) <= set(allowed.tolist())
    expected = allowed[exact_l2(base[allowed], queries, 5)]
    np.testing.assert_array_equal(hits.ids, expected)


@pytest.mark.parametrize("make", ALL, ids=["flat_l2", "flat_ip", "hnsw", "ivf"])
def test_save_and_load_round_trip(make, small, tmp_path):
    base, queries = small
    idx = make().build(base)
    idx.save(tmp_path)
    again = make().load(tmp_path)
    np.testing.assert_array_equal(idx.search(queries, 5).ids, again.search(queries, 5).ids)


def test_asking_for_more_neighbours_than_vectors_returns_all(small):
    base, queries = small
    hits = FlatL2Index().build(base[:3]).search(queries, 10)
    assert hits.width == 3 and (hits.ids >= 0).all()


def test_query_dimension_mismatch_is_a_clear_error(small):
    base, _ = small
    with pytest.raises(RagError, match="dimension"):
        FlatL2Index().build(base).search(np.zeros((1, 8), np.float32), 1)


def test_ivf_uses_fewer_cells_on_a_small_corpus(small):
    base, _ = small
    idx = IVFIndex(nlist=1024).build(base)
    assert idx.index.nlist == 200 // IVFIndex.MIN_POINTS_PER_CELL


def test_bad_parameters_are_rejected():
    with pytest.raises(RagError, match="index.M"):
        HNSWIndex(M=0)
    with pytest.raises(RagError, match="nlist"):
        IVFIndex(nlist=0)
    with pytest.raises(RagError, match="metric"):
        HNSWIndex(metric="cosine")


def test_successive_filters_each_apply_and_a_repeated_filter_is_reused(small):
    """The FAISS selector is derived once per filter array (the same array object comes back for the
    same source filter), yet a different filter is never answered from the previous one."""
    base, queries = small
    index = FlatL2Index().build(base)
    evens, odds = np.arange(0, 200, 2), np.arange(1, 200, 2)
    first = index.search(queries, 5, allowed=evens)
    sel = index._selector_cache[1]
    again = index.search(queries, 5, allowed=evens)
    assert index._selector_cache[1] is sel
    np.testing.assert_array_equal(first.ids, again.ids)
    other = index.search(queries, 5, allowed=odds)
    assert set(other.ids.ravel()) <= set(odds.tolist())
    np.testing.assert_array_equal(other.ids, odds[exact_l2(base[odds], queries, 5)])


def test_a_single_query_runs_on_one_thread_and_restores_the_thread_count(small):
    import faiss

    base, queries = small
    index = FlatL2Index().build(base)
    before = faiss.omp_get_max_threads()
    one = index.search(queries[:1], 5)
    assert faiss.omp_get_max_threads() == before
    np.testing.assert_array_equal(one.ids, exact_l2(base, queries[:1], 5))


def test_index_chroma_without_its_extra_is_one_line(monkeypatch):
    import sys

    from rag.index.chroma import ChromaIndex

    monkeypatch.setitem(sys.modules, "chromadb", None)  # as if not installed
    with pytest.raises(RagError, match=r'index=chroma needs chromadb: pip install -e "\.\[chroma\]"'):
        ChromaIndex().params  # noqa: B018 (the first thing a run asks of an index)


# ---- compressed indexes for corpora whose float32 vectors do not fit in memory --------------------

def structured(n: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    basis = rng.normal(size=(8, 64))
    base = unit(rng.normal(size=(n, 8)) @ basis + 0.3 * rng.normal(size=(n, 64)))
    return base, unit(rng.normal(size=(100, 8)) @ basis + 0.3 * rng.normal(size=(100, 64)))


COMPRESSED = {
    "ivf_sq8": (lambda: IVFSQ8Index(nlist=32, nprobe=8), 0.85),
    "ivf_pq": (lambda: IVFPQIndex(nlist=32, m=16, nbits=8, nprobe=8), 0.35),
    "ivf_pq_refined": (lambda: IVFPQIndex(nlist=32, m=16, nbits=8, nprobe=8, refine=10), 0.85),
    "hnsw_sq8": (lambda: HNSWSQ8Index(M=16, ef_construction=100, ef_search=200), 0.9),
}


@pytest.mark.parametrize("name", list(COMPRESSED))
def test_compressed_indexes_reach_their_recall_and_refine_recovers_pq(name, tmp_path):
    make, min_recall = COMPRESSED[name]
    base, queries = structured(6000)
    truth = FlatL2Index().build(base).search(queries, 10).ids
    index = make().build(base)
    got = index.search(queries, 10).ids
    recall = np.mean([len(set(t) & set(g)) / 10 for t, g in zip(truth, got)])
    assert recall >= min_recall, recall
    index.save(tmp_path)
    again = make().load(tmp_path)
    again.use_vectors(base)  # what rag.run.artifacts does after a load: the cache's vectors, mapped
    np.testing.assert_array_equal(again.search(queries, 10).ids, got)
    allowed = np.arange(0, 6000, 7)
    hits = again.search(queries[:5], 5, allowed=allowed)
    assert set(hits.ids[hits.ids >= 0].tolist()) <= set(allowed.tolist()) and (hits.ids >= 0).sum() > 0


def test_pq_settings_are_checked_and_a_tiny_corpus_trains_fewer_bits(small):
    with pytest.raises(RagError, match=r"index.m \(5\) must divide the vectors' dimension \(16\)"):
        IVFPQIndex(nlist=4, m=5).build(small[0])
    with pytest.raises(RagError, match="index.refine must be >= 0"):
        IVFPQIndex(refine=-1)
    index = IVFPQIndex(nlist=4, m=4, nbits=8, nprobe=4).build(small[0])  # 200 vectors: 2 cells, 2-bit codes
    assert index.effective_nbits(200) == 2 and index.search(small[1], 5).ids.shape == (10, 5)
    assert IVFPQIndex(refine=4).params == IVFPQIndex().params, "one cached index with or without refine"


def test_refine_rescores_from_the_mapped_vectors_as_faiss_refine_flat_does_from_its_copy(tmp_path):
    import faiss

    base, queries = structured(6000)
    np.save(tmp_path / "vectors.npy", base)
    mapped = np.load(tmp_path / "vectors.npy", mmap_mode="r")
    index = IVFPQIndex(nlist=32, m=16, nbits=8, nprobe=8, refine=10).build(mapped)
    assert np.shares_memory(index._vectors, mapped), "the mapped file is read, no copy is kept"
    ours = index.search(queries, 10)
    ref = faiss.IndexRefineFlat(faiss.clone_index(index.index), faiss.swig_ptr(base))  # its own float32 copy
    ref.k_factor = 10.0
    dist, ids = ref.search(queries, 10)
    np.testing.assert_array_equal(ours.ids, ids)
    np.testing.assert_allclose(-ours.scores, dist, rtol=1e-5, atol=1e-5)
    fresh = IVFPQIndex(nlist=32, m=16, nbits=8, nprobe=8, refine=10)
    index.save(tmp_path)
    fresh.load(tmp_path)
    with pytest.raises(RagError, match="index.refine re-scores from the chunk vectors, and none were given"):
        fresh.search(queries, 10)


# ---- building from the cache's memory-mapped vectors ---------------------------------------------

def mapped(tmp_path, array, name="vectors.npy"):
    np.save(tmp_path / name, array)
    return np.load(tmp_path / name, mmap_mode="r")


@pytest.mark.parametrize("make", [lambda: FlatL2Index(), lambda: IVFIndex(nlist=32, nprobe=8),
                                  lambda: IVFPQIndex(nlist=32, m=16, nbits=8, nprobe=8)], ids=["flat", "ivf", "ivf_pq"])
def test_an_index_built_from_the_mapped_file_is_the_one_built_in_memory(make, tmp_path):
    import faiss

    base, queries = structured(6000)
    in_memory, from_file = make().build(base), make().build(mapped(tmp_path, base), batch_size=1000)
    assert np.array_equal(faiss.serialize_index(in_memory.index), faiss.serialize_index(from_file.index))
    np.testing.assert_array_equal(in_memory.search(queries, 10).ids, from_file.search(queries, 10).ids)


def test_float16_vectors_are_read_as_float32_a_batch_at_a_time(tmp_path):
    import faiss

    base, _ = structured(3000)
    half = base.astype(np.float16)
    from_file = IVFIndex(nlist=16).build(mapped(tmp_path, half), batch_size=700)
    assert np.array_equal(faiss.serialize_index(from_file.index),
                          faiss.serialize_index(IVFIndex(nlist=16).build(half.astype(np.float32)).index))
    with pytest.raises(RagError, match="need a non-empty 2-d array"):
        FlatL2Index().build(np.zeros((0, 8), np.float32))


def test_a_corpus_larger_than_max_train_trains_on_a_fixed_sample(caplog):
    import faiss

    base, queries = structured(6000)
    truth = FlatL2Index().build(base).search(queries, 10).ids
    with caplog.at_level("INFO", logger="rag.index"):
        index = IVFIndex(nlist=32, nprobe=8, max_train=2000).build(base)
    assert "training on a sample of 2000 of the 6000 vectors" in caplog.text
    recall = np.mean([len(set(t) & set(g)) / 10 for t, g in zip(truth, index.search(queries, 10).ids)])
    assert recall >= 0.85, recall
    again = IVFIndex(nlist=32, nprobe=8, max_train=2000).build(base)
    assert np.array_equal(faiss.serialize_index(index.index), faiss.serialize_index(again.index))
    # Another sample trains other cells, so it is another cached index; the default keeps its old key.
    assert IVFIndex(nlist=32, max_train=2000).params["max_train"] == 2000
    assert "max_train" not in IVFIndex(nlist=32).params and "max_train" not in IVFPQIndex().params
    with pytest.raises(RagError, match=r"index.max_train \(100\) must be at least 1248"):
        IVFIndex(nlist=32, max_train=100).build(base)
    with pytest.raises(RagError, match="index.max_train must be positive or null"):
        IVFIndex(max_train=0)


def test_the_default_sample_is_what_faiss_trains_on_within_a_memory_bound():
    from rag.index.base import MAX_TRAIN_BYTES

    # Up to 65,536 rows everything trains, as before sampling; beyond, FAISS's k-means keeps 256 a cell.
    assert IVFIndex(nlist=16)._max_train(10**7, 384) == 65536
    assert IVFIndex(nlist=1024)._max_train(10**7, 384) == 256 * 1024
    assert IVFPQIndex(nlist=64, nbits=10)._max_train(10**7, 384) == 256 * 2**10  # its sub-quantizers' k-means
    # Too many cells for MAX_TRAIN_BYTES: the bound, but never below 39 rows a cell.
    assert IVFIndex(nlist=8192)._max_train(10**7, 384) == MAX_TRAIN_BYTES // (4 * 384)
    assert IVFIndex(nlist=65536)._max_train(10**7, 384) == 65536 * IVFIndex.MIN_POINTS_PER_CELL


def resident_file_bytes():
    """File-backed (and shared-memory: tmpfs) pages of this process's resident set, in bytes."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssFile", "RssShmem"):
                fields[key] = int(value.split()[0]) * 1024
    if len(fields) < 2:
        pytest.skip("needs Linux's /proc/self/status RssFile and RssShmem")
    return sum(fields.values())


def test_building_from_the_mapped_file_does_not_keep_it_resident(tmp_path):
    n, dim = 200_000, 384  # 307 MB of float32
    out = np.lib.format.open_memmap(tmp_path / "vectors.npy", mode="w+", dtype=np.float32, shape=(n, dim))
    block = np.random.default_rng(0).standard_normal((10_000, dim), dtype=np.float32)
    for i in range(0, n, len(block)):
        out[i : i + len(block)] = block + i
    del out  # unmapped: its pages leave this process's resident set
    vectors = np.load(tmp_path / "vectors.npy", mmap_mode="r")
    before = resident_file_bytes()
    IVFSQ8Index(nlist=16, max_train=20_000).build(vectors)
    assert resident_file_bytes() - before < vectors.nbytes // 10
    np.asarray(vectors[: n // 2]).sum()  # what the test would see from rows read through the mapping
    assert resident_file_bytes() - before > vectors.nbytes // 3
