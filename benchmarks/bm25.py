"""Lexical retrieval: the harness's BM25Index (rag/retriever/bm25.py) with its two backends, bm25s and
rank-bm25, on a synthetic Zipf corpus at 10k, 100k and 1M chunks.

Corpus: a 50k pseudo-word vocabulary, token frequencies Zipf(s=1.1), ~60 tokens a chunk
(Poisson); queries of 3-6 terms from the same law. Each (backend, size) runs in a fresh Python
process reading the corpus from a file, so its peak memory is its own: RSS is read from
/proc/self/status, and VmHWM is reset (/proc/self/clear_refs) after the corpus is loaded, so
"peak build memory" is VmHWM after the build minus RSS before it (tracemalloc would miss
numpy's and C extensions' memory). Build time includes the harness's tokenizer (regex,
stopwords, Snowball stemming), because that is what a run pays.

rank-bm25 is skipped at a size where its build plus queries would take over 5 minutes,
extrapolated linearly from the previous size (its build and its per-query scan are both linear
in the corpus).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    PeakSampler,
    environment,
    finish,
    mb,
    median,
    per_call_ms,
    proc_mem,
    ratio,
    read_lines,
    reset_peak,
    row,
    run_case,
    scratch_dir,
    start,
    write_lines,
    zipf_queries,
    zipf_texts,
)

SIZES = (10_000, 100_000, 1_000_000)
BACKENDS = ("bm25s", "rank_bm25")
VOCAB, ZIPF_S, MEAN_LEN = 50_000, 1.1, 60
N_QUERIES, K = 50, 10
RANK_BM25_LIMIT_S = 300.0
REFERENCE_1M_MS = {"rank_bm25": 1474.0, "bm25s": 1.1}  # measured earlier on this machine


def bm25_case(backend: str, corpus_file: str, n_queries: int = N_QUERIES, k: int = K, query_budget_s: float = 90.0,
              tokenize_sample: int = 100_000) -> dict[str, Any]:
    """One (backend, corpus) case; meant to run in its own process (see run_case)."""
    from rag.retriever.bm25 import BM25Index
    from rag.retriever.tokens import tokenize

    texts = read_lines(corpus_file)
    queries = zipf_queries(n_queries, VOCAB, ZIPF_S)
    before = proc_mem()
    peak_reset = reset_peak()
    t0 = time.perf_counter()
    with PeakSampler() as peaks:
        index = BM25Index(backend=backend).build(texts)
    build_s = time.perf_counter() - t0
    after = proc_mem()
    index.search([queries[0]], k)  # warm-up (first-call compilation, page-in)
    lat = per_call_ms(lambda q: index.search([q], k), queries, budget_s=query_budget_s, min_calls=10)
    out: dict[str, Any] = {
        "backend": backend,
        "n_docs": len(texts),
        "build_s": round(build_s, 3),
        "rss_before_build_mb": mb(before["VmRSS"]),
        "peak_build_delta_mb": mb(after["VmHWM"] - before["VmRSS"]),
        "peak_anon_delta_mb": mb(peaks.peak_anon - before.get("RssAnon", 0)),
        "retained_delta_mb": mb(after["VmRSS"] - before["VmRSS"]),
        "peak_rss_mb": mb(after["VmHWM"]),
        "peak_reset": peak_reset,
        "queries_timed": len(lat),
        "query_ms_median": median(lat),
        "query_ms_p95": round(sorted(lat)[int(0.95 * (len(lat) - 1))], 4),
    }
    if backend == "bm25s":
        # The same queries through bm25s.retrieve, i.e. with bm25s's own top-k selection, which
        # BM25Index replaced with rag.retriever.bm25.top_k (argpartition over every chunk is pathological on
        # mostly-zero scores): the ratio is what that change is worth.
        def bm25s_retrieve(q: str) -> None:
            toks = [[t for t in index._tok([q])[0] if t in index.model.vocab_dict]]
            if toks[0]:
                index.model.retrieve(toks, k=k, show_progress=False, n_threads=0)

        bm25s_retrieve(queries[0])
        lat1 = per_call_ms(bm25s_retrieve, queries, budget_s=query_budget_s, min_calls=10)
        out["query_ms_median_bm25s_retrieve"] = median(lat1)
    if backend == "bm25s":  # retriever.mmap: the saved index read into memory vs memory-mapped
        out.update(_load_cases(index, queries, k, query_budget_s))
    if backend == "bm25s":  # how much of the build is the harness's tokenizer
        sample = texts[: min(len(texts), tokenize_sample)]
        t0 = time.perf_counter()
        tokenize(sample)
        out["tokenize_s_estimate"] = round((time.perf_counter() - t0) * len(texts) / len(sample), 3)
        out["tokenize_share_of_build"] = round(out["tokenize_s_estimate"] / build_s, 3)
    return out


def _load_cases(index: Any, queries: list[str], k: int, query_budget_s: float) -> dict[str, Any]:
    """Saves the built index, drops it, then loads it twice: read into memory and memory-mapped
    (`retriever.mmap=true`): anonymous memory each load adds, and query latency on each (the
    mapped files warm in the page cache after the first queries)."""
    import gc
    import shutil
    import tempfile

    from rag.retriever.bm25 import BM25Index

    folder = Path(tempfile.mkdtemp(prefix="bm25-load-"))
    out: dict[str, Any] = {}
    try:
        index.save(folder)
        out["saved_mb"] = mb(sum(f.stat().st_size for f in folder.iterdir()))
        del index
        for name, mapped in (("loaded", False), ("mmap", True)):
            gc.collect()
            before = proc_mem().get("RssAnon", 0)
            t0 = time.perf_counter()
            idx = BM25Index("bm25s", mmap=mapped).load(folder)
            out[f"{name}_load_s"] = round(time.perf_counter() - t0, 3)
            out[f"{name}_anon_delta_mb"] = mb(proc_mem().get("RssAnon", 0) - before)
            idx.search([queries[0]], k)

            def one_query(q: str, index: BM25Index = idx) -> object:
                return index.search([q], k)

            lat = per_call_ms(one_query, queries, budget_s=query_budget_s / 3, min_calls=10)
            out[f"{name}_query_ms_median"] = median(lat)
            del idx, one_query  # both hold the index: the next load's memory is measured without it
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return out


def bench_bm25(quick: bool = True, full: bool = False, sizes: tuple[int, ...] | None = None, tiny: bool = False,
               n_queries: int = N_QUERIES, isolate: bool | None = None) -> dict[str, Any]:
    """BM25 bm25s vs rank-bm25 at 10k/100k/1M synthetic Zipf chunks: build time, peak build
    memory (RSS, fresh process per case) and one-query latency; ratios rank-bm25 / bm25s."""
    clock = start()
    if tiny:
        sizes, n_queries = sizes or (2_000,), 10
    sizes = tuple(sorted(sizes or SIZES))
    isolate = not tiny if isolate is None else isolate  # tiny (tests): in-process, no interpreter start-up
    cases: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    with scratch_dir("bm25") as tmp:
        estimate_next: float | None = None  # rank_bm25 seconds predicted for the next size
        prev: dict[str, Any] | None = None
        for n in sizes:
            corpus = Path(tmp) / f"corpus-{n}.txt"
            t0 = time.perf_counter()
            write_lines(corpus, zipf_texts(n, VOCAB, ZIPF_S, MEAN_LEN, seed=0))
            gen_s = time.perf_counter() - t0
            for backend in BACKENDS:
                if backend == "rank_bm25" and prev is not None:
                    scale = n / prev["n_docs"]
                    estimate_next = scale * (prev["build_s"] + prev["query_ms_median"] * n_queries / 1000.0)
                    if estimate_next > RANK_BM25_LIMIT_S:
                        skipped.append({"backend": backend, "n_docs": n, "estimated_s": round(estimate_next, 1),
                                        "reason": f"estimated {estimate_next:.0f} s (> {RANK_BM25_LIMIT_S:.0f} s) "
                                                  f"from {prev['n_docs']:,} chunks, scaled linearly"})
                        continue
                kwargs: dict[str, Any] = {"backend": backend, "corpus_file": str(corpus), "n_queries": n_queries,
                                          "query_budget_s": 30.0 if backend == "rank_bm25" else 90.0}
                if isolate:
                    res = run_case("benchmarks.bm25", "bm25_case", kwargs)
                else:
                    res = bm25_case(**kwargs)
                    res["in_process"] = True  # peak memory then includes earlier cases
                res.setdefault("backend", backend)
                res.setdefault("n_docs", n)
                res["corpus_generation_s"] = round(gen_s, 2)
                if backend == "rank_bm25" and estimate_next is not None:
                    res["estimated_s_before_running"] = round(estimate_next, 1)
                cases.append(res)
                if backend == "rank_bm25" and "error" not in res:
                    prev = res
            corpus.unlink()

    comparisons, table = compare_cases(cases, skipped, sizes)
    result = {"sizes": list(sizes), "vocab": VOCAB, "zipf_s": ZIPF_S, "mean_tokens": MEAN_LEN, "n_queries": n_queries,
              "k": K, "reference_1m_query_ms": REFERENCE_1M_MS, "cases": cases, "comparisons": comparisons,
              "skipped": skipped, "table": table, "environment": environment()}
    return finish(result, clock)


def compare_cases(cases: list[dict[str, Any]], skipped: list[dict[str, Any]],
                  sizes: tuple[int, ...]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per size, rank-bm25 against bm25s (ratios), and the table rows of every case."""
    by = {(c["backend"], c["n_docs"]): c for c in cases if "error" not in c}
    comparisons = []
    table = []
    for n in sizes:
        s, r = by.get(("bm25s", n)), by.get(("rank_bm25", n))
        if s is None:
            continue
        comp = {"n_docs": n, "bm25s": s, "rank_bm25": r,
                "build_ratio": ratio(r["build_s"] if r else None, s["build_s"]),
                "peak_memory_ratio": ratio(r["peak_build_delta_mb"] if r else None, s["peak_build_delta_mb"]),
                "query_speedup": ratio(r["query_ms_median"] if r else None, s["query_ms_median"])}
        comparisons.append(comp)
        table.append(row(f"{n:,} chunks: bm25s build", s["build_s"], "s",
                         f"tokenizer ~{s.get('tokenize_share_of_build', 0):.0%} of it"))
        table.append(row(f"{n:,} chunks: bm25s peak build memory (RSS delta)", s["peak_build_delta_mb"], "MiB",
                         f"retained {s['retained_delta_mb']} MiB"))
        table.append(row(f"{n:,} chunks: bm25s 1-query latency (median)", s["query_ms_median"], "ms",
                         f"p95 {s['query_ms_p95']} ms; through bm25s.retrieve (its own top-k selection) "
                         f"{s.get('query_ms_median_bm25s_retrieve')} ms = "
                         f"{ratio(s.get('query_ms_median_bm25s_retrieve'), s['query_ms_median'])}x"))
        if "mmap_anon_delta_mb" in s:
            table.append(row(f"{n:,} chunks: bm25s index loaded / memory-mapped (retriever.mmap=true)",
                             f"{s['loaded_anon_delta_mb']} / {s['mmap_anon_delta_mb']}", "MiB anon",
                             f"saved {s['saved_mb']} MiB; load {s['loaded_load_s']} / {s['mmap_load_s']} s; query "
                             f"median {s['loaded_query_ms_median']} / {s['mmap_query_ms_median']} ms (page cache warm)"))
        if r is not None:
            table.append(row(f"{n:,} chunks: rank-bm25 build", r["build_s"], "s", f"{comp['build_ratio']}x bm25s"))
            table.append(row(f"{n:,} chunks: rank-bm25 peak build memory (RSS delta)", r["peak_build_delta_mb"], "MiB",
                             f"{comp['peak_memory_ratio']}x bm25s; retained {r['retained_delta_mb']} MiB"))
            table.append(row(f"{n:,} chunks: rank-bm25 1-query latency (median)", r["query_ms_median"], "ms",
                             f"over {r['queries_timed']} queries"))
            table.append(row(f"{n:,} chunks: **query speed-up bm25s vs rank-bm25**", comp["query_speedup"], "x",
                             "rank-bm25 ms / bm25s ms"))
    for sk in skipped:
        table.append(row(f"{sk['n_docs']:,} chunks: rank-bm25", "skipped", "", sk["reason"]))
    for c in cases:
        if "error" in c:
            table.append(row(f"{c['n_docs']:,} chunks: {c['backend']}", "failed", "", c["error"][:200]))
    return comparisons, table
