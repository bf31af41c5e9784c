"""Dense retrieval: the harness's FAISS indexes (rag/index/faiss_index.py, settings from conf/index/*.yaml),
and Chroma (rag/index/chroma.py) when its extra is installed, on structured synthetic 384-d vectors.

Per index type and size: build time, one-query latency (median), batched throughput (QPS),
recall@10 against exact search (IndexFlatL2 on the same vectors), and, for the flat scans, the
single-query time against the memory-bandwidth floor measured in the same run: the time of a
plain streaming read of the same n x d float32 array (`X @ q`, BLAS sgemv, and `X.sum()`; the
faster of the two). A ratio near 1 means the scan is as fast as reading the vectors can be.
"""
from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from benchmarks.common import (
    environment,
    finish,
    median,
    per_call_ms,
    ratio,
    row,
    start,
    structured_vectors,
)
from rag.config.compose import PROJECT_ROOT

INDEX_TYPES = ("flat_l2", "flat_ip", "hnsw", "ivf", "ivf_sq8", "ivf_pq", "ivf_pq_refine", "hnsw_sq8",
               "chroma")  # chroma: when the chroma extra is installed
DIM = 384
K = 10
# Cases estimated over ~5 minutes on 2 cores run only with full=True.
FULL_ONLY = {("hnsw", 1_000_000): "HNSW build at 1M takes ~15-30 min on 2 cores"}


def make_index(name: str) -> Any:
    """The index exactly as a run builds it from conf/index/<name>.yaml."""
    from rag.run.session import create

    return create(OmegaConf.load(PROJECT_ROOT / "conf" / "index" / f"{name}.yaml"))


def bandwidth_floor(x: np.ndarray, repeats: int = 9) -> dict[str, float]:
    """Seconds to stream the array once, as the median of `repeats` of three plain reads:
    X @ q with BLAS's own threads, X @ q on one thread, and X.sum(axis=0) (single-threaded SIMD
    adds); the floor is the fastest of the three. (X.sum() is pairwise and slower; BLAS's
    thread pool adds a fixed wake-up cost on a busy machine, hence the one-thread read.)"""
    q = np.ascontiguousarray(x[0])
    x @ q  # page in / warm up
    reads = {"dot_ms": lambda: x @ q, "sum_axis0_ms": lambda: x.sum(axis=0)}
    try:
        from threadpoolctl import threadpool_limits

        def dot_1t() -> None:
            with threadpool_limits(1):
                x @ q

        reads["dot_1thread_ms"] = dot_1t
    except ImportError:
        pass
    out: dict[str, float] = {"bytes": int(x.nbytes)}
    for name, fn in reads.items():
        fn()
        out[name] = round(1000 * float(np.median([_t(fn) for _ in range(repeats)])), 3)
    out["floor_ms"] = min(v for k, v in out.items() if k.endswith("_ms"))
    out["gb_per_s"] = round(x.nbytes / (out["floor_ms"] / 1000) / 1e9, 2)
    return out


def _t(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _floor_note(fl: dict[str, float]) -> str:
    parts = [f"X@q {fl['dot_ms']} ms"]
    if "dot_1thread_ms" in fl:
        parts.append(f"X@q 1 thread {fl['dot_1thread_ms']} ms")
    parts.append(f"X.sum(axis=0) {fl['sum_axis0_ms']} ms")
    return ", ".join(parts) + f" -> {fl['gb_per_s']} GB/s"


def recall_at_k(approx: np.ndarray, exact: np.ndarray, k: int = K) -> float:
    hits = [len(set(a[:k].tolist()) & set(e[:k].tolist())) / k for a, e in zip(approx, exact)]
    return round(float(np.mean(hits)), 4)


def bench_case(name: str, x: np.ndarray, queries: np.ndarray, exact_ids: np.ndarray | None, n_single: int) -> dict[str, Any]:
    index = make_index(name)
    t0 = time.perf_counter()
    index.build(x)
    build_s = time.perf_counter() - t0
    index.search(queries[:1], K)  # warm-up
    one_at_a_time = [queries[i : i + 1] for i in range(n_single)]
    # The harness's single query (rag.index: one OpenMP thread below FEW_QUERIES queries) against
    # the same call straight into FAISS with its default pool (every core): a single query cannot
    # use a second core well, and the pool's wake-up and barrier cost more than the scan.
    import faiss

    threads = faiss.omp_get_max_threads()
    single = per_call_ms(lambda q: index.search(q, K), one_at_a_time)
    # (Chroma has no FAISS index beneath: its own search is its only one)
    raw = index.index.search if index.index is not None else (lambda q, k: index.search(q, k))
    single_raw = per_call_ms(lambda q: raw(q, K), one_at_a_time)
    t0 = time.perf_counter()
    hits = index.search(queries, K)
    batch_s = time.perf_counter() - t0
    return {
        "index": name,
        "params": index.params,
        "build_s": round(build_s, 3),
        "query_ms_median": median(single),
        "query_ms_p95": round(float(np.percentile(single, 95)), 4),
        "omp_threads": threads,
        "query_ms_median_faiss_default_threads": median(single_raw),
        "harness_vs_faiss_default": ratio(median(single_raw), median(single)),
        "batch_queries": len(queries),
        "batch_s": round(batch_s, 4),
        "qps_batched": round(len(queries) / batch_s, 1),
        "recall_at_10": None if exact_ids is None else recall_at_k(hits.ids, exact_ids),
        "_ids": hits.ids,
    }


def bench_faiss(quick: bool = True, full: bool = False, sizes: tuple[int, ...] | None = None,
                tiny: bool = False, n_queries: int = 1000, n_single: int = 50) -> dict[str, Any]:
    """FAISS indexes (flat_l2, flat_ip, hnsw, ivf): build, latency, QPS, recall@10 and the flat
    scan against the memory-bandwidth floor. quick: 100k vectors; full: 100k and 1M (HNSW 1M too)."""
    clock = start()
    if tiny:
        sizes, n_queries, n_single = sizes or (3000,), 50, 5
    sizes = tuple(sizes or ((100_000, 1_000_000) if full else (100_000,)))
    cases: list[dict[str, Any]] = []
    floors: dict[int, dict[str, float]] = {}
    skipped: list[dict[str, Any]] = []
    for n in sizes:
        x = structured_vectors(n, DIM, seed=0)
        queries = structured_vectors(n_queries, DIM, seed=1)
        floors[n] = bandwidth_floor(x)
        exact_ids = None
        for name in INDEX_TYPES:
            if name == "chroma" and importlib.util.find_spec("chromadb") is None:
                skipped.append({"index": name, "n": n, "reason": 'chromadb is not installed (pip install -e ".[chroma]")'})
                continue
            if (name, n) in FULL_ONLY and not full:
                skipped.append({"index": name, "n": n, "reason": FULL_ONLY[(name, n)] + " (full=True runs it)"})
                continue
            case = bench_case(name, x, queries, exact_ids, n_single)
            if name == "flat_l2":
                exact_ids = case["_ids"]
                case["recall_at_10"] = 1.0
            case.pop("_ids")
            case["n"] = n
            if name.startswith("flat"):
                case["floor_ms"] = floors[n]["floor_ms"]
                case["vs_bandwidth_floor"] = ratio(case["query_ms_median"], floors[n]["floor_ms"])
                case["vs_bandwidth_floor_1thread_read"] = ratio(case["query_ms_median"], floors[n]["dot_1thread_ms"])
                case["faiss_default_vs_bandwidth_floor"] = ratio(case["query_ms_median_faiss_default_threads"],
                                                                 floors[n]["floor_ms"])
            cases.append(case)
        del x

    table = []
    for n, fl in floors.items():
        table.append(row(f"memory-bandwidth floor, {n:,} x {DIM} float32 ({fl['bytes'] / 2**20:.0f} MiB)", fl["floor_ms"], "ms",
                         _floor_note(fl)))
    for c in cases:
        label = f"{c['index']} @ {c['n']:,}"
        table.append(row(f"{label}: build", c["build_s"], "s"))
        note = f"p95 {c['query_ms_p95']} ms"
        if "vs_bandwidth_floor" in c:
            note += (f"; **{c['vs_bandwidth_floor']}x the bandwidth floor**, "
                     f"{c['vs_bandwidth_floor_1thread_read']}x a one-thread read")
        table.append(row(f"{label}: 1-query latency (median, harness: 1 OpenMP thread)", c["query_ms_median"], "ms", note))
        note = f"{c['faiss_default_vs_bandwidth_floor']}x the bandwidth floor" if "vs_bandwidth_floor" in c else ""
        table.append(row(f"{label}: 1-query latency (median, FAISS default: {c['omp_threads']} OpenMP threads)",
                         c["query_ms_median_faiss_default_threads"], "ms",
                         f"harness is {c['harness_vs_faiss_default']}x faster" + (f"; {note}" if note else "")))
        table.append(row(f"{label}: batched QPS ({c['batch_queries']} queries)", c["qps_batched"], "q/s"))
        table.append(row(f"{label}: recall@10 vs exact", c["recall_at_10"], "", ""))
    for s in skipped:
        table.append(row(f"{s['index']} @ {s['n']:,}", "skipped", "", s["reason"]))
    result = {"sizes": list(sizes), "dim": DIM, "k": K, "n_queries": n_queries, "n_single": n_single,
              "vectors": "structured: 2000 clusters in a 48-d subspace + isotropic noise, unit norm",
              "floors": {str(k): v for k, v in floors.items()}, "cases": cases, "skipped": skipped, "table": table,
              "environment": environment()}
    return finish(result, clock)
