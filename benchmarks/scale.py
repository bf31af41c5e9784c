"""Scale: 1M, 3M and 10M synthetic chunks through the harness's own streaming build and query
path, against the 10M-chunk targets on this 2-core, 24 GB machine.

Each size runs in fresh processes. First the inputs a researcher would bring (not timed as the
build): clustered 384-d unit vectors written as float16 `vectors.npy` + `ids.txt`, as if encoded
elsewhere. Then the build, through rag.run.artifacts as a run does it: documents streamed from a
generator (Zipf text, one chunk each) into the chunk store, `embedder=precomputed` copying the
vectors into the cache by chunk id, IVF-PQ trained on a sample and filled from the file in
batches, BM25 written by the streaming builder and memory-mapped. Then 150 questions, one at a
time through the harness's retrievers (dense IVF-PQ with refine; hybrid = dense + BM25 fused by
RRF), each fetching its top 10 texts from the store by row, and the dense top 10 against exact
search over every vector.

Per phase: wall time, peak RSS (VmHWM reset before it) and its anonymous / file-backed split.
Peak RSS counts file-backed pages a process keeps mapped; reads through the page cache do not.
"""
from __future__ import annotations

import shutil
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from rag.embedder.base import Embedder

from benchmarks.common import (
    PeakSampler,
    environment,
    finish,
    mb,
    proc_mem,
    reset_peak,
    row,
    run_case,
    run_mode,
    scratch_dir,
    start,
    structured_vectors,
    zipf_queries,
    zipf_texts,
)

SOURCES = ("pubmed", "libc", "pytorch")
N_QUESTIONS = 150
# The targets for 10M chunks on this machine (docs/reference/bench.md).
TARGETS = {"peak_rss_mb": 12 * 1024, "hybrid_p50_ms": 50.0, "recall_at_10": 0.95, "build_s": 3600.0}
# IVF cells per size: fewer than sqrt(n) at 10M, as k-means over 4096 cells (25 iterations on a
# 1M-row sample) and assigning 10M rows to them would take most of the build on 2 cores.
NLIST = {1_000_000: 1024, 3_000_000: 1024, 10_000_000: 2048}
VECTOR_BLOCK = 200_000
T = TypeVar("T")


class SyntheticQueries(Embedder):
    """`embedder.queries` for precomputed vectors: a question's vector is drawn from the corpus's
    distribution, seeded by the question's text (the same vector for the same question)."""

    def __init__(self, dim: int = 384):
        self._dim = dim

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def id(self) -> dict[str, Any]:
        return {"model": "synthetic-structured-queries", "dim": self.dim}

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        return np.concatenate([structured_vectors(1, self.dim, seed=zlib.crc32(q.encode()) + 10**6) for q in queries])


def documents(n: int) -> Iterator[Any]:
    from rag.types import Document

    for i, text in enumerate(zipf_texts(n)):
        yield Document(f"d{i}", text, SOURCES[i % 3])


def make_inputs(n: int, workdir: str, dim: int = 384) -> dict[str, Any]:
    """The precomputed vectors (float16, as a GPU box would ship them) and their ids, written
    block by block."""
    out = Path(workdir) / "precomputed"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(out / "vectors.npy", "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f2", "fortran_order": False, "shape": (n, dim)})
        for a in range(0, n, VECTOR_BLOCK):
            m = min(VECTOR_BLOCK, n - a)
            f.write(structured_vectors(m, dim, seed=a // VECTOR_BLOCK).astype(np.float16).tobytes())
    with open(out / "ids.txt", "w") as f:
        for a in range(0, n, VECTOR_BLOCK):
            f.write("".join(f"d{i}#0\n" for i in range(a, min(n, a + VECTOR_BLOCK))))
    return {"s": round(time.perf_counter() - t0, 1), "vectors_mb": mb((out / "vectors.npy").stat().st_size)}


def _phase(name: str, fn: Callable[[], T], log: list[dict[str, Any]]) -> T:
    before = proc_mem()
    reset_peak()
    t0 = time.perf_counter()
    with PeakSampler(interval=0.2) as peaks:
        out = fn()
    seconds = time.perf_counter() - t0
    after = proc_mem()
    log.append({"phase": name, "s": round(seconds, 2), "peak_rss_mb": mb(after["VmHWM"]),
                "peak_delta_mb": mb(after["VmHWM"] - before["VmRSS"]), "peak_anon_mb": mb(peaks.peak_anon),
                "peak_file_mb": mb(peaks.peak_file), "rss_after_mb": mb(after["VmRSS"]),
                "anon_after_mb": mb(after.get("RssAnon", 0)), "file_after_mb": mb(after.get("RssFile", 0))})
    return out


def parts(n: int, workdir: str, dim: int = 384) -> dict[str, Any]:
    """The harness's components for a scale run over the inputs of make_inputs."""
    from rag.chunker.sliding_window import SlidingWindowChunker
    from rag.embedder.precomputed import PrecomputedEmbedder
    from rag.index.faiss_index import IVFPQIndex
    from rag.retriever.dense import DenseRetriever
    from rag.retriever.fusion import RRFFusion
    from rag.retriever.hybrid import HybridRetriever
    from rag.retriever.lexical import BM25Retriever

    embedder = PrecomputedEmbedder(str(Path(workdir) / "precomputed"), queries=SyntheticQueries(dim))
    index = IVFPQIndex(nlist=NLIST.get(n, max(64, 2 ** int(np.log2(max(4096, n)) / 2))), m=48, nprobe=32, refine=10)
    dense = DenseRetriever(embedder, index)
    lexical = BM25Retriever(mmap=True)
    # One chunk a document: windows longer than any generated text.
    return {"chunker": SlidingWindowChunker(chunk_size=100_000, chunk_overlap=0), "chunker_cfg": {"synthetic": "one chunk a doc"},
            "embedder": embedder, "dense": dense, "lexical": lexical,
            "hybrid": HybridRetriever(dense, lexical, RRFFusion(), candidates=100)}


def build(n: int, workdir: str, stages: tuple[str, ...] = ("chunks", "vectors", "bm25", "index"),
          phases: list[dict[str, Any]] | None = None) -> tuple[Any, dict[str, Any]]:
    """The streaming build of `stages` (resumable: a killed build run again goes on from its
    finished shards), each as a timed phase; (artifacts, components)."""
    from rag.run.artifacts import Artifacts
    from rag.store.cache import ArtifactCache

    phases = [] if phases is None else phases
    p = parts(n, workdir)
    arts = Artifacts(ArtifactCache(Path(workdir) / "cache", seed=None))
    for stage in stages:
        if stage == "chunks":
            _phase(f"chunks: {n:,} documents streamed into the store", lambda: arts.chunks(
                p["chunker"], p["chunker_cfg"], documents(n), corpus_fp=f"synthetic-zipf-{n}"), phases)
        elif stage == "vectors":
            _phase("vectors: embedder=precomputed, copied by chunk id", lambda: arts.vectors(p["embedder"]), phases)
        elif stage == "bm25":
            _phase("BM25: streaming build, memory-mapped", lambda: p["lexical"].prepare(arts), phases)
        elif stage == "index":
            _phase(f"IVF-PQ index (nlist {p['dense'].index.nlist}, m 48): sample-trained, filled in batches",
                   lambda: p["dense"].prepare(arts), phases)
    return arts, p


def exact_top10(vectors: np.ndarray, queries: np.ndarray, k: int = 10) -> np.ndarray:
    """Exact L2 top-k of every query over every row, read in blocks (not mapped)."""
    from rag.index.vector_rows import read_rows

    n = len(vectors)
    best_d = np.full((len(queries), k), np.inf, np.float32)
    best_i = np.full((len(queries), k), -1, np.int64)
    qn = (queries**2).sum(1)[:, None]
    for a in range(0, n, VECTOR_BLOCK):
        block = read_rows(vectors, a, min(n, a + VECTOR_BLOCK))
        d = qn - 2 * queries @ block.T + (block**2).sum(1)[None, :]
        cand_d = np.concatenate([best_d, d], axis=1)
        cand_i = np.concatenate([best_i, np.broadcast_to(np.arange(a, a + len(block)), d.shape)], axis=1)
        top = np.argpartition(cand_d, k - 1, axis=1)[:, :k]
        best_d, best_i = np.take_along_axis(cand_d, top, 1), np.take_along_axis(cand_i, top, 1)
    return best_i


def other_indexes(arts: Any, p: dict[str, Any], queries: np.ndarray, exact: np.ndarray) -> list[dict[str, Any]]:
    """The other compressed indexes over the same vectors: build time, one-query p50 and
    recall@10 against exact search (`--full` at 1M; HNSW's build alone takes minutes there)."""
    from rag.index.faiss_index import HNSWSQ8Index, IVFSQ8Index

    out = []
    for name, index in (("ivf_sq8", IVFSQ8Index(nlist=p["dense"].index.nlist, nprobe=32)), ("hnsw_sq8", HNSWSQ8Index())):
        t0 = time.perf_counter()
        arts.vector_index(p["embedder"], index)
        build_s = time.perf_counter() - t0
        rows, ms = [], []
        for q in queries:
            t = time.perf_counter()
            rows.append(index.search(q[None, :], 10).ids[0])
            ms.append(1000 * (time.perf_counter() - t))
        recall = float(np.mean([len(set(e.tolist()) & set(r.tolist())) / 10 for e, r in zip(exact, rows)]))
        out.append({"index": name, "build_s": round(build_s, 1), "query_ms_p50": round(float(np.median(ms)), 3),
                    "recall_at_10": round(recall, 4), "params": index.params})
    return out


def scale_case(n: int, workdir: str, more_indexes: bool = False) -> dict[str, Any]:
    """Runs in its own process (run_case): the build, then the questions."""
    phases: list[dict[str, Any]] = []
    begin = proc_mem()
    arts, p = build(n, workdir, phases=phases)
    build_peak = max(ph["peak_rss_mb"] for ph in phases)
    _phase("hybrid retriever: prepare (every artifact a hit)", lambda: p["hybrid"].prepare(arts), phases)

    questions = zipf_queries(N_QUESTIONS)
    chunks = arts.chunk_set.chunks
    passes: list[dict[str, list[float]]] = []
    dense_rows = []

    def ask() -> None:
        """Each question through the dense and the hybrid retriever, then its top 10 texts read
        from the store (what contexts and metrics read), each timed on its own."""
        timings: dict[str, list[float]] = {"dense": [], "hybrid": [], "fetch": []}
        for q in questions:
            t0 = time.perf_counter()
            hits = p["dense"].search_one(q, 10, reuse=False)
            t1 = time.perf_counter()
            fused = p["hybrid"].search_one(q, 10, reuse=False)
            t2 = time.perf_counter()
            texts = [chunks[r].text for r, _ in fused.row(0)]
            t3 = time.perf_counter()
            assert texts, q
            for name, ms in (("dense", t1 - t0), ("hybrid", t2 - t1), ("fetch", t3 - t2)):
                timings[name].append(1000 * ms)
            if not passes:
                dense_rows.append(hits.ids[0])
        passes.append(timings)

    # The first pass reads postings, vectors and texts from disk as a first question does after a
    # build; the second finds them in the page cache, as questions on a warm machine do.
    _phase(f"{N_QUESTIONS} questions, one at a time", ask, phases)
    _phase(f"the {N_QUESTIONS} questions again (page cache warm)", ask, phases)
    peak = max(ph["peak_rss_mb"] for ph in phases)
    vectors = np.load(arts.cache.lookup("vectors", arts.vectors_key(p["embedder"])).file("vectors.npy"), mmap_mode="r")
    t0 = time.perf_counter()
    query_vectors = p["embedder"].encode_queries(questions)
    exact = exact_top10(vectors, query_vectors)
    exact_s = time.perf_counter() - t0
    recall = float(np.mean([len(set(e.tolist()) & set(d.tolist())) / 10 for e, d in zip(exact, dense_rows)]))
    disk = {kind: mb(sum(f.stat().st_size for f in (Path(workdir) / "cache" / kind).rglob("*") if f.is_file()))
            for kind in ("chunks", "vectors", "bm25", "index")}
    others = other_indexes(arts, p, query_vectors, exact) if more_indexes else []
    stage_s = {ph["phase"].split(":")[0]: ph["s"] for ph in phases[:4]}  # the build's four stages

    def pct(name: str, q: float, run: int = 0) -> float:
        return round(float(np.percentile(passes[run][name], q)), 2)

    return {
        "n": n, "phases": phases, "start_rss_mb": mb(begin["VmRSS"]),
        "peak_rss_mb": peak, "build_peak_rss_mb": build_peak,
        "peak_anon_mb": max(ph["peak_anon_mb"] for ph in phases),
        "build_s": round(sum(ph["s"] for ph in phases[:4]), 1),
        "build_s_excluding_vectors": round(sum(ph["s"] for ph in phases[:4] if not ph["phase"].startswith("vectors")), 1),
        "stage_s": stage_s,
        "dense_ms_p50": pct("dense", 50), "dense_ms_p95": pct("dense", 95),
        "hybrid_ms_p50": pct("hybrid", 50), "hybrid_ms_p95": pct("hybrid", 95),
        "fetch_texts_ms_p50": pct("fetch", 50),
        "warm": {f"{name}_ms_{q}": pct(name, int(q[1:]), 1) for name in ("dense", "hybrid", "fetch") for q in ("p50", "p95")},
        "recall_at_10": round(recall, 4), "exact_search_s": round(exact_s, 1), "other_indexes": others,
        "disk_mb": disk, "chunk_set_is_store": type(chunks).__name__ == "ChunkStore",
    }


def against_targets(res: dict[str, Any]) -> dict[str, Any]:
    """Each target with the measured figure and whether it is met."""
    got = {"peak_rss_mb": res["peak_rss_mb"], "hybrid_p50_ms": res["hybrid_ms_p50"],
           "recall_at_10": res["recall_at_10"], "build_s": res["build_s_excluding_vectors"]}
    return {k: {"target": TARGETS[k], "measured": got[k],
                "met": got[k] >= TARGETS[k] if k == "recall_at_10" else got[k] <= TARGETS[k]} for k in TARGETS}


def run_size(n: int, tiny: bool = False, more_indexes: bool = False) -> dict[str, Any]:
    with scratch_dir(f"scale-{n}") as tmp:
        if tiny:
            inputs = make_inputs(n, str(tmp))
            res = scale_case(n, str(tmp), more_indexes)
        else:
            inputs = run_case("benchmarks.scale", "make_inputs", {"n": n, "workdir": str(tmp)}, timeout=3600)
            if "error" in inputs:
                return {"n": n, "error": "inputs: " + inputs["error"]}
            res = run_case("benchmarks.scale", "scale_case", {"n": n, "workdir": str(tmp), "more_indexes": more_indexes},
                           timeout=4 * 3600)
        shutil.rmtree(tmp, ignore_errors=True)
    if "error" not in res:
        res["inputs"] = inputs
        res["targets"] = against_targets(res)
    return res


def bench_scale(quick: bool = True, full: bool = False, n_docs: int | None = None, tiny: bool = False,
                sizes: list[int] | None = None) -> dict[str, Any]:
    """The streaming build and the query path at 1M chunks (`--full`: 1M, 3M and 10M), each
    against the 10M targets."""
    clock = start()
    if sizes is None:
        by_mode = {"tiny": [3000], "quick": [1_000_000], "full": [1_000_000, 3_000_000, 10_000_000]}
        sizes = [n_docs] if n_docs else by_mode[run_mode(tiny, full)]
    # --full: the other compressed indexes' recall at the smallest size
    runs = {str(n): run_size(n, tiny=tiny, more_indexes=(full or tiny) and n == min(sizes)) for n in sizes}
    table = []
    for n, res in runs.items():
        if "error" in res:
            table.append(row(f"scale @ {int(n):,}", "failed", "", res["error"][:300]))
            continue
        t = res["targets"]
        table.append(row(f"**peak RSS @ {int(n):,} chunks** (build and questions)", res["peak_rss_mb"], "MiB",
                         f"target <= {TARGETS['peak_rss_mb']} at 10M: {'met' if t['peak_rss_mb']['met'] else 'NOT met'}; "
                         f"anonymous peak {res['peak_anon_mb']} MiB"))
        table.append(row(f"**build without embedding @ {int(n):,}**", res["build_s_excluding_vectors"], "s",
                         f"target <= {TARGETS['build_s']:.0f} at 10M; stages {res['stage_s']}"))
        w = res["warm"]
        table.append(row(f"**hybrid question p50 / p95 @ {int(n):,}** (first pass after the build)",
                         f"{res['hybrid_ms_p50']} / {res['hybrid_ms_p95']}", "ms",
                         f"target p50 <= {TARGETS['hybrid_p50_ms']}; page cache warm: {w['hybrid_ms_p50']} / "
                         f"{w['hybrid_ms_p95']} ms; dense alone {res['dense_ms_p50']} / {res['dense_ms_p95']} ms "
                         f"(warm {w['dense_ms_p50']} / {w['dense_ms_p95']})"))
        table.append(row(f"top 10 texts read from the store by row @ {int(n):,}", res["fetch_texts_ms_p50"], "ms",
                         f"p50 after the hybrid search; page cache warm: {w['fetch_ms_p50']} ms"))
        table.append(row(f"**dense recall@10 vs exact @ {int(n):,}** (IVF-PQ, refine 10)", res["recall_at_10"], "",
                         f"target >= {TARGETS['recall_at_10']}"))
        for o in res["other_indexes"]:
            table.append(row(f"{o['index']} recall@10 vs exact @ {int(n):,}", o["recall_at_10"], "",
                             f"build {o['build_s']} s, one query p50 {o['query_ms_p50']} ms"))
        table.append(row(f"disk @ {int(n):,}", sum(res["disk_mb"].values()), "MiB", str(res["disk_mb"])))
        for ph in res["phases"]:
            table.append(row(f"phase @ {int(n):,}: {ph['phase']}", ph["s"], "s",
                             f"peak RSS {ph['peak_rss_mb']} MiB, anon <= {ph['peak_anon_mb']}, file-backed <= "
                             f"{ph['peak_file_mb']}; after: anon {ph['anon_after_mb']}, file {ph['file_after_mb']} MiB"))
    return finish({"sizes": runs, "targets": TARGETS, "table": table, "environment": environment()}, clock)
