"""A million chunks through the harness's own artifact path (make test-scale; a few minutes and
~5 GB of memory, so not in the default run): chunks, vectors, BM25 and a flat index are built in
bounded steps, stay within a few GB, are stored as float32 .npy / FAISS / bm25s files, and come
back from the cache on reuse."""
import pytest

from benchmarks.scale import bench_scale

pytestmark = pytest.mark.scale

N = 1_000_000


@pytest.fixture(scope="module")
def million():
    return bench_scale(quick=True, n_docs=N)


def test_peak_memory_at_a_million_chunks_stays_a_few_gb(million):
    assert "error" not in million, million.get("error")
    assert million["n_docs"] == N
    # chunks (~1 GB as records) + the flat index's own copy of the vectors (1.5 GB) + BM25: the
    # peak must stay well under what a naive build holds (every token as a string, vectors twice).
    assert million["overall_peak_rss_mb"] < 6500, million["phases"]
    assert million["overall_peak_anon_mb"] < 4500, million["phases"]


def test_artifacts_are_float32_files_reused_from_the_cache(million):
    files = million["artifact_files_mb"]
    vector_mb = N * 384 * 4 / 2**20
    assert files["vectors/vectors.npy"] == pytest.approx(vector_mb, rel=0.01)  # float32, nothing else
    assert files["index/index.faiss"] == pytest.approx(vector_mb, rel=0.01)
    assert any(name.startswith("bm25/") for name in files)
    assert million["warm_cache"]["all_hits"]


def test_a_single_flat_query_at_a_million_runs_near_the_memory_bandwidth_floor(million):
    # 1.5 GB read per query; generous bound, as the machine may be shared: the point is that the
    # harness's single-query path is not the 4x-slower thread-pool path (docs/bench.md).
    assert million["flat_vs_floor"] < 2.5, (million["flat_query_ms_median"], million["floor"])
