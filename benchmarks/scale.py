"""Scale: peak memory of the harness building BM25 and a flat index over 1M synthetic chunks,
through its own code paths (rag.artifacts: ChunkSet, encode_to_npy, Artifacts.bm25,
Artifacts.vector_index), in a fresh process.

The chunks are Zipf text (as in the BM25 benchmark) held as `Chunk` records, as a run holds
them; the embedder is a stand-in with the real interface that returns structured 384-d vectors
instantly (encoding 1M chunks with MiniLM would take hours on 2 CPUs), so the vectors path still
runs encode_to_npy's dedupe and 8192-row blocks, the checksum and the memory-mapped reload.
Per phase: wall time, peak RSS during the phase (VmHWM reset before it) and RSS after, split
into anonymous memory and file-backed pages (memory-mapped vectors count there). Then the 1M
flat scan against the memory-bandwidth floor of its own storage, the cost of a warm cache hit
at 1M (checksums included), and the cost of a source filter's row lookup (first and later questions).
"""
from __future__ import annotations

import statistics
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    PeakSampler,
    environment,
    finish,
    mb,
    proc_mem,
    reset_peak,
    row,
    run_case,
    scratch_dir,
    start,
    structured_vectors,
    zipf_queries,
    zipf_texts,
)
from benchmarks.faiss_indexes import _floor_note

SOURCES = ("pubmed", "libc", "pytorch")


class SyntheticEmbedder:
    """The embedder interface (id, dim, encode) returning structured unit vectors, deterministic
    per block of texts."""

    def __init__(self, dim: int = 384):
        self._dim = dim

    @property
    def id(self) -> dict[str, Any]:
        return {"model": "synthetic-structured", "dim": self._dim}

    @property
    def dim(self) -> int:
        return self._dim

    def encode(self, texts: list[str], show_progress: bool | None = None) -> np.ndarray:
        seed = zlib.crc32(texts[0].encode()) if texts else 0
        return structured_vectors(len(texts), self._dim, seed=seed)

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        return self.encode(queries)

    def encode_blocks(self, texts: list[str], block: int) -> Iterator[tuple[slice, np.ndarray]]:
        # The stage's interface (see SentenceTransformerEmbedder.encode_blocks); no token sort, as
        # there is no tokenizer and the vectors cost nothing.
        for i in range(0, len(texts), block):
            part = texts[i : i + block]
            yield slice(i, i + len(part)), self.encode(part)


def _phase(name: str, fn: Any, log: list[dict[str, Any]]) -> Any:
    before = proc_mem()
    reset_peak()
    t0 = time.perf_counter()
    with PeakSampler() as peaks:
        out = fn()
    seconds = time.perf_counter() - t0
    after = proc_mem()
    log.append({"phase": name, "s": round(seconds, 2), "peak_rss_mb": mb(after["VmHWM"]),
                "peak_delta_mb": mb(after["VmHWM"] - before["VmRSS"]), "peak_anon_mb": mb(peaks.peak_anon),
                "peak_file_mb": mb(peaks.peak_file), "rss_after_mb": mb(after["VmRSS"]),
                "anon_after_mb": mb(after.get("RssAnon", 0)), "file_after_mb": mb(after.get("RssFile", 0))})
    return out


def warm_hits(cache: Any, chunk_set: Any, embedder: Any) -> dict[str, Any]:
    """Warm cache: a fresh Artifacts finds everything (checksums of the 1M payloads verified)."""
    from rag.artifacts import Artifacts
    from rag.bm25 import BM25Index
    from rag.index import FlatIPIndex

    arts = Artifacts(cache, chunk_set)
    hit: dict[str, Any] = {}
    hit["vectors_s"] = round(_t(lambda: arts.vectors(embedder)), 3)
    hit["bm25_load_s"] = round(_t(lambda: arts.bm25(BM25Index())), 3)
    hit["flat_index_load_s"] = round(_t(lambda: arts.vector_index(embedder, FlatIPIndex())), 3)
    hit["all_hits"] = all(v["hit"] for v in arts.record.values())
    hit["vectors_again_s"] = round(_t(lambda: Artifacts(cache, chunk_set).vectors(embedder)), 3)  # the score stage's lookup
    return hit


def scale_case(n_docs: int, workdir: str, dim: int = 384) -> dict[str, Any]:
    """Runs in its own process (run_case)."""
    import faiss

    from benchmarks.faiss_indexes import bandwidth_floor
    from rag.artifacts import Artifacts, ChunkSet
    from rag.bm25 import BM25Index
    from rag.cache import ArtifactCache, make_key
    from rag.index import FlatIPIndex
    from rag.types import Chunk

    phases: list[dict[str, Any]] = []
    start = proc_mem()

    def chunks() -> ChunkSet:
        out = []
        for i, t in enumerate(zipf_texts(n_docs)):
            out.append(Chunk(id=f"d{i}#0", doc_id=f"d{i}", text=t, source=SOURCES[i % 3], start=0, end=len(t), position=0))
        return ChunkSet(make_key("chunks", {"synthetic": n_docs}), out)

    chunk_set = _phase(f"chunks in memory ({n_docs:,} Chunk records)", chunks, phases)
    cache = ArtifactCache(Path(workdir) / "cache")
    embedder = SyntheticEmbedder(dim)
    arts = Artifacts(cache, chunk_set)
    _phase("vectors: encode_to_npy + checksum + publish", lambda: arts.vectors(embedder), phases)
    bm25 = _phase("BM25 (bm25s): tokenize + index + save", lambda: arts.bm25(BM25Index())[0], phases)
    index = _phase("flat index (FlatIP): build from the memory map + save",
                   lambda: arts.vector_index(embedder, FlatIPIndex())[0], phases)
    overall_peak = max(p["peak_rss_mb"] for p in phases)
    overall_anon = max(p["peak_anon_mb"] for p in phases)

    # The 1M flat scan against the bandwidth floor of its own storage (a zero-copy view).
    xb = faiss.rev_swig_ptr(index.index.get_xb(), index.ntotal * dim).reshape(index.ntotal, dim)
    floor = bandwidth_floor(xb, repeats=5)
    q = embedder.encode(["query"])
    index.search(q, 10)
    # The harness's single query (one OpenMP thread, rag.index.FEW_QUERIES) and FAISS's own call
    # with its default pool of every core.
    flat_ms = [1000 * _t(lambda: index.search(q, 10)) for _ in range(15)]
    threads = faiss.omp_get_max_threads()
    index.index.search(q, 10)
    flat_default_ms = [1000 * _t(lambda: index.index.search(q, 10)) for _ in range(15)]
    bm25_ms = [1000 * _t(lambda qq=qq: bm25.search([qq], 10)) for qq in zipf_queries(20)]
    # A source filter's rows are computed on first use and reused by every later question.
    filt = frozenset({"pubmed"})
    filter_first_ms = 1000 * _t(lambda: chunk_set.rows_of_sources(filt))
    filter_ms = [1000 * _t(lambda: chunk_set.rows_of_sources(filt)) for _ in range(5)]
    allowed = chunk_set.rows_of_sources(filt)
    filtered_flat_ms = [1000 * _t(lambda: index.search(q, 10, allowed)) for _ in range(6)]
    filtered_bm25_ms = [1000 * _t(lambda qq=qq: bm25.search([qq], 10, allowed)) for qq in zipf_queries(6)]
    del xb

    hit = warm_hits(cache, chunk_set, embedder)
    disk = {p.parent.parent.name + "/" + p.name: mb(p.stat().st_size) for p in (Path(workdir) / "cache").rglob("*")
            if p.is_file() and p.stat().st_size > 2**20}
    return {
        "n_docs": n_docs, "dim": dim, "start_rss_mb": mb(start["VmRSS"]), "phases": phases,
        "overall_peak_rss_mb": overall_peak, "overall_peak_anon_mb": overall_anon, "final_rss_mb": mb(proc_mem()["VmRSS"]),
        "vector_bytes_mb": mb(n_docs * dim * 4),
        "flat_query_ms_median": round(statistics.median(flat_ms), 3), "floor": floor,
        "flat_vs_floor": round(statistics.median(flat_ms) / floor["floor_ms"], 3),
        "flat_vs_floor_1thread_read": round(statistics.median(flat_ms) / floor["dot_1thread_ms"], 3)
        if "dot_1thread_ms" in floor else None,
        "omp_threads": threads,
        "flat_query_ms_median_faiss_default_threads": round(statistics.median(flat_default_ms), 3),
        "faiss_default_vs_floor": round(statistics.median(flat_default_ms) / floor["floor_ms"], 3),
        "bm25_query_ms_median": round(statistics.median(bm25_ms), 3),
        "source_filter_rows_first_ms": round(filter_first_ms, 2),
        "source_filter_rows_ms_median": round(statistics.median(filter_ms), 4),
        "filtered_flat_query_ms_median": round(statistics.median(filtered_flat_ms[1:]), 2),
        "filtered_flat_first_query_ms": round(filtered_flat_ms[0], 2),
        "filtered_bm25_query_ms_median": round(statistics.median(filtered_bm25_ms[1:]), 2),
        "warm_cache": hit, "artifact_files_mb": disk,
    }


def _t(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_scale(quick: bool = True, full: bool = False, n_docs: int | None = None, tiny: bool = False) -> dict[str, Any]:
    """Peak RSS of the harness building BM25 + a flat index over 1M synthetic chunks (fresh
    process), the 1M flat scan vs the bandwidth floor, and warm-cache costs at 1M."""
    clock = start()
    n_docs = n_docs or (3000 if tiny else 1_000_000)
    with scratch_dir("scale") as tmp:
        if tiny:
            res = scale_case(n_docs, str(tmp))
            res["in_process"] = True
        else:
            res = run_case("benchmarks.scale", "scale_case", {"n_docs": n_docs, "workdir": str(tmp)})
    table = []
    if "error" in res:
        table.append(row(f"scale @ {n_docs:,}", "failed", "", res["error"][:300]))
    else:
        table.append(row(f"**peak RSS, chunks + vectors + BM25 + flat index @ {n_docs:,}**", res["overall_peak_rss_mb"], "MiB",
                         f"anonymous (non-file) peak {res['overall_peak_anon_mb']} MiB; process start "
                         f"{res['start_rss_mb']} MiB; the vectors alone are {res['vector_bytes_mb']} MiB"))
        for p in res["phases"]:
            table.append(row(f"phase: {p['phase']}", p["s"], "s",
                             f"peak RSS {p['peak_rss_mb']} MiB (+{p['peak_delta_mb']}), of it anon <= {p['peak_anon_mb']}, "
                             f"file-backed <= {p['peak_file_mb']}; after: anon {p['anon_after_mb']} MiB, "
                             f"file-backed {p['file_after_mb']} MiB"))
        fl = res["floor"]
        table.append(row(f"flat 1-query latency @ {n_docs:,} (harness: 1 OpenMP thread)", res["flat_query_ms_median"], "ms",
                         f"**{res['flat_vs_floor']}x the bandwidth floor**, {res['flat_vs_floor_1thread_read']}x a "
                         f"one-thread read; floor {fl['floor_ms']} ms: {_floor_note(fl)}"))
        table.append(row(f"flat 1-query latency @ {n_docs:,} (FAISS default: {res['omp_threads']} OpenMP threads)",
                         res["flat_query_ms_median_faiss_default_threads"], "ms",
                         f"{res['faiss_default_vs_floor']}x the bandwidth floor"))
        table.append(row(f"bm25s 1-query latency @ {n_docs:,}", res["bm25_query_ms_median"], "ms",
                         f"with a source filter {res['filtered_bm25_query_ms_median']} ms"))
        table.append(row("source filter: rows_of_sources, first question / later ones",
                         f"{res['source_filter_rows_first_ms']} / {res['source_filter_rows_ms_median']}", "ms",
                         f"filtered flat search: first {res['filtered_flat_first_query_ms']} ms (builds the selector), "
                         f"then {res['filtered_flat_query_ms_median']} ms"))
        w = res["warm_cache"]
        table.append(row("warm cache: vectors / BM25 / flat index", f"{w['vectors_s']} / {w['bm25_load_s']} / {w['flat_index_load_s']}",
                         "s", f"checksums verified once per file per process; again in the same process: vectors "
                              f"{w['vectors_again_s']} s; all hits: {w['all_hits']}"))
    result = {**res, "table": table, "environment": environment()}
    return finish(result, clock)
