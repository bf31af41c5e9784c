"""Per-question retrieval latency on the full corpus: the harness's retrievers (rag.retriever, as
a run times them: `search_one(..., reuse=False)`, one question at a time, never from memory) against FAISS and bm25s
called directly on the same vectors, index files and query tokens.

The full `mixed` corpus (slice off) cut by the default chunker, the default embedder; the flat
(IndexFlatL2, v1) and HNSW (v2-v4) indexes and BM25 index from the artifact cache (built on first
use: embedding the corpus takes minutes). Questions: `n_questions` spread over the full question
set, no source filter; `warmup` questions first, then `repeats` rounds over all of them; per
question the median of its repeats; reported p50 and p95 over questions.

- dense (flat, HNSW): harness = query encoding + `VectorIndex.search`; direct = `faiss.Index.search`
  on the same query vector (encoded once, outside the timing), so harness - direct is the
  encoding plus the harness's own overhead, reported apart.
- BM25: harness = tokenizing + `BM25Index.search`; direct = `bm25s.BM25.retrieve` on the same
  token ids (tokenized outside the timing).
- hybrid: harness = `HybridRetriever` (dense HNSW + BM25 candidates, fused); direct = the two
  direct searches on pre-encoded / pre-tokenized queries plus the same fusion.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.common import compose, environment, finish, ratio, row, run_mode, start

FULL = ["slice.docs_per_source=null", "slice.questions_per_corpus=null", "embedder.show_progress=false"]


def _timed(fn: Any, items: list[Any], warmup: int, repeats: int) -> np.ndarray:
    import time

    for x in items[:warmup]:
        fn(x)
    t = np.zeros((len(items), repeats))
    for r in range(repeats):
        for i, x in enumerate(items):
            t0 = time.perf_counter()
            fn(x)
            t[i, r] = 1000 * (time.perf_counter() - t0)
    return np.median(t, axis=1)


def _pct(ms: np.ndarray) -> dict[str, float]:
    return {"p50_ms": round(float(np.percentile(ms, 50)), 3), "p95_ms": round(float(np.percentile(ms, 95)), 3)}


def _dense(r: Any, queries: list[str], k: int, warmup: int, repeats: int) -> dict[str, Any]:
    vecs = r.embedder.encode_queries(queries)
    raw, rows = r.index.index, list(range(len(queries)))
    return {"direct_faiss": _pct(_timed(lambda i: raw.search(vecs[i : i + 1], k), rows, warmup, repeats)),
            "harness_index_only": _pct(_timed(lambda i: r.index.search(vecs[i : i + 1], k), rows, warmup, repeats)),
            "query_encoding": _pct(_timed(lambda q: r.embedder.encode_queries([q]), queries, warmup, repeats))}


def _tokens(bm: Any, queries: list[str]) -> list[list[str]]:
    from rag.retriever.tokens import tokenize

    return [[t for t in tokenize([q], bm.stopwords, bm.stem)[0] if t in bm.model.vocab_dict] for q in queries]


def _bm25(r: Any, queries: list[str], k: int, warmup: int, repeats: int) -> dict[str, Any]:
    bm = r.bm25
    toks = _tokens(bm, queries)
    live = [i for i, x in enumerate(toks) if x]
    direct = _timed(lambda i: bm.model.retrieve([toks[i]], k=k, show_progress=False, n_threads=0), live, warmup, repeats)
    return {"direct_bm25s": _pct(direct), "questions_with_known_terms": len(live)}


def _hybrid(r: Any, fusion: Any, queries: list[str], k: int, warmup: int, repeats: int) -> dict[str, Any]:
    from rag.types import Hits

    vecs = r.dense.embedder.encode_queries(queries)
    raw, bm = r.dense.index.index, r.lexical.bm25
    width = max(k, r.candidates)
    toks = _tokens(bm, queries)

    def direct_one(i: int) -> Any:
        d, di = raw.search(vecs[i : i + 1], width)
        lists = [Hits(di, -d)]
        if toks[i]:
            docs, sc = bm.model.retrieve([toks[i]], k=min(width, bm.n_docs), show_progress=False, n_threads=0)
            lists.append(Hits(np.asarray(docs, np.int64), np.asarray(sc, np.float32)))
        return fusion(lists, k)

    direct = _timed(direct_one, list(range(len(queries))), warmup, repeats)
    enc = _timed(lambda q: r.dense.embedder.encode_queries([q]), queries, warmup, repeats)
    return {"direct_faiss_bm25s_fused": _pct(direct), "query_encoding": _pct(enc)}


def bench_retrieval_latency(quick: bool = True, full: bool = False, tiny: bool = False, n_questions: int | None = None,
                            repeats: int = 3, warmup: int = 5, overrides: Sequence[str] = (),
                            full_corpus: bool = True) -> dict[str, Any]:
    """Per-question retrieval latency (p50/p95) on the full corpus: dense flat, dense HNSW, BM25 and
    hybrid through the harness, against FAISS and bm25s called directly on the same data."""
    from rag.run.session import create, open_session
    from rag.run.settings import load

    clock = start()
    n_q = n_questions or {"tiny": 8, "quick": 200, "full": 400}[run_mode(tiny, full)]
    base = FULL if full_corpus and not tiny else ["embedder.show_progress=false"]
    cases = {"flat": ["retriever=dense", "index=flat_l2"], "hnsw": ["retriever=dense", "index=hnsw"],
             "bm25": ["retriever=bm25"], "hybrid": ["retriever=hybrid", "index=hnsw", "fusion=rrf"]}
    results: dict[str, Any] = {}
    for name, ov in cases.items():
        cfg = compose([*base, *ov, *overrides])
        s = open_session(load(cfg))
        qs = [q.question for q in s.qa]
        pick = np.unique(np.linspace(0, len(qs) - 1, min(n_q, len(qs))).round().astype(int))
        queries = [qs[i] for i in pick]
        k, r = s.score.k, s.retriever
        harness = _timed(lambda q, r=r, k=k: r.search_one(q, k, None, reuse=False), queries, warmup, repeats)
        res: dict[str, Any] = {"harness": _pct(harness), "chunks": len(s.chunk_set), "questions": len(queries)}
        if name in ("flat", "hnsw"):
            res.update(_dense(r, queries, k, warmup, repeats))
        elif name == "bm25":
            res.update(_bm25(r, queries, k, warmup, repeats))
        else:
            res.update(_hybrid(r, create(cfg.fusion), queries, k, warmup, repeats))
        results[name] = res
    return finish({"table": table(results, repeats, warmup), "results": results, "environment": environment()}, clock)


def table(results: dict[str, Any], repeats: int, warmup: int) -> list[dict[str, Any]]:
    rows = []
    for name, res in results.items():
        direct_key = next((k for k in res if k.startswith("direct")), None)
        h, d = res["harness"], res.get(direct_key, {})
        note = f"{res['chunks']} chunks, {res['questions']} questions x {repeats} repeats (median each), {warmup} warm-up"
        if "query_encoding" in res:
            note += f"; query encoding p50 {res['query_encoding']['p50_ms']} ms"
        if "harness_index_only" in res:
            note += f"; rag.index search alone p50 {res['harness_index_only']['p50_ms']} ms"
        rows.append(row(f"{name}: harness p50 / p95", f"{h['p50_ms']} / {h['p95_ms']}", "ms", note))
        if d:
            rows.append(row(f"{name}: {direct_key} p50 / p95", f"{d['p50_ms']} / {d['p95_ms']}", "ms",
                            f"harness / direct at p50: {ratio(h['p50_ms'], d['p50_ms'])}x"))
    return rows
