"""The cross-encoder's backends against the machine: v3's reranker (reranker=cross_encoder, the
shipped model) with each candidate of `reranker.backend=auto` (torch fp32, torch bf16 autocast
where the CPU computes bf16 natively, ONNX Runtime fp32, OpenVINO fp32 and bf16 where installed),
and what `auto` picks here.

Pairs: the backend probe's (rag.reranker.backend_choice.probe_pairs: PubMedQA questions, each with
a pool of reranker.top_n passages) cut at reranker.max_length tokens. Each pool is scored in a call
of its own, as v3 scores a question's candidates, so every backend does the same padded work;
rates are the best of interleaved rounds (backend_choice.measure). The work in GFLOP is counted as
for the embedder (benchmarks.encoding.encode_flops), and its rate is set against the GEMM ceiling
of the candidate's precision (benchmarks.encoding.gemm_ceilings), measured in the same run.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import cold_cache, compose, environment, finish, main_cache, ratio, row, run_mode, scratch_dir, start
from benchmarks.encoding import encode_flops, gemm_ceilings
from rag.reranker import backend_choice

QUESTIONS = {"tiny": 1, "quick": 16, "full": 32}


def per_question(score: backend_choice.Score, pool: int) -> backend_choice.Score:
    """`score` called once per question's pool, as the reranker calls it, on the pairs of several
    pools laid end to end."""
    def run(pairs: list[tuple[str, str]]) -> np.ndarray:
        return np.concatenate([score(pairs[i:i + pool]) for i in range(0, len(pairs), pool)])
    return run


def bench_reranker_backends(quick: bool = True, full: bool = False, tiny: bool = False, questions: int | None = None,
                            rounds: int | None = None) -> dict[str, Any]:
    """The cross-encoder's backends (torch fp32 and bf16, ONNX fp32, OpenVINO fp32 and bf16) on v3's pools:
    pairs/s, GFLOP/s against the fp32 and bf16 GEMM ceilings, top-5 overlap with fp32, and what
    `reranker.backend=auto` picks."""
    from rag.store.cache import ArtifactCache
    from rag.embedder.backend_choice import REFERENCE, cpu_flags
    from rag.embedder.probe import probe_texts
    from rag.run.session import create

    clock = start()
    n = questions or QUESTIONS[run_mode(tiny, full)]
    rounds = rounds or (1 if tiny else backend_choice.ROUNDS)
    with scratch_dir("reranker") as tmp:
        reranker = create(compose(["reranker=cross_encoder"]).reranker)
        if tiny:
            reranker.probe_questions = 1
        # An empty cache but for the models: `auto` measures its probe afresh, as on a new machine.
        reranker.use_cache(ArtifactCache(cold_cache(Path(tmp) / "cache", main_cache())))
        t0 = time.perf_counter()
        model = reranker.model
        settle_s = time.perf_counter() - t0
        auto = reranker.backend_note or {}
        passages, qs = probe_texts()
        pools = backend_choice.probe_pairs(passages, qs[:n], reranker.top_n)
        scorers = reranker.scorers(model, reranker.model_path(), reranker.allowed(cpu_flags()))
        measured = backend_choice.measure({c: per_question(s, reranker.top_n) for c, s in scorers.items()}, pools,
                                          rounds, speed_questions=len(pools))
    work = [encode_flops(model, pool, reranker.batch_size) for pool in pools]
    gflop = sum(w["gflop"] for w in work)
    tokens, padded = sum(w["tokens"] for w in work), sum(w["padded_tokens"] for w in work)
    ceilings = gemm_ceilings(any(m.candidate.precision == "bf16" for m in measured))
    pairs = sum(map(len, pools))
    reference = next(m for m in measured if m.candidate == REFERENCE)
    backends = {}
    for m in measured:
        seconds = pairs / m.rate
        backends[m.candidate.name] = {
            **m.to_json(), "seconds": round(seconds, 3), "speedup_vs_fp32": ratio(m.rate, reference.rate),
            "gflops": round(gflop / seconds, 1), "vs_gemm_ceiling": ratio(gflop / seconds, ceilings[m.candidate.precision]),
            "ceiling": m.candidate.precision, "eligible": m.eligible}
    out = {"questions": len(pools), "pool": reranker.top_n, "pairs": pairs, "max_length": reranker.max_length,
           "batch_size": reranker.batch_size, "rounds": rounds, "tokens": tokens, "padded_tokens": padded,
           "non_embedding_params": work[0]["non_embedding_params"], "gflop": round(gflop, 2), "gemm_gflops": ceilings,
           "backends": backends, "auto": {**auto, "settle_s": round(settle_s, 1),
                                          "picks": f"{auto.get('backend')} {auto.get('precision')}"},
           "this_run_picks": backend_choice.choose(measured).candidate.name, "environment": environment()}
    out["table"] = table(out)
    return finish(out, clock)


def table(out: dict[str, Any]) -> list[dict[str, Any]]:
    auto = out["auto"]
    rows = [row("**reranker.backend=auto picks**", auto["picks"], "", auto.get("line", "")),
            row("the same rule on this run's longer measurement picks", out["this_run_picks"], "",
                f"the probe, the model's load and the ONNX export took {auto['settle_s']} s"),
            row("pairs", out["pairs"], "pairs",
                f"{out['questions']} PubMedQA questions x pools of {out['pool']} passages, {out['max_length']} tokens at "
                f"most, a call per pool; {out['tokens']} tokens, {out['padded_tokens']} padded; {out['gflop']} GFLOP "
                f"({out['non_embedding_params']} non-embedding parameters)"),
            row("float32 GEMM ceiling", out["gemm_gflops"]["fp32"], "GFLOP/s", "torch, 8192x384 @ 384x1536, same run")]
    if "bf16" in out["gemm_gflops"]:
        rows.append(row("bf16 GEMM ceiling", out["gemm_gflops"]["bf16"], "GFLOP/s", "the same matmul in bf16"))
    for name, b in out["backends"].items():
        agree = "" if name == "torch fp32" else (
            f"; {b['speedup_vs_fp32']}x torch fp32; top-{backend_choice.TOP} overlap with fp32 {b['overlap']} "
            f"(auto needs >= {backend_choice.MIN_OVERLAP}), logits within {b['max_diff']}")
        rows.append(row(name, b["rate"], "pairs/s",
                        f"{b['gflops']} GFLOP/s = {b['vs_gemm_ceiling']}x the {b['ceiling']} GEMM ceiling{agree}"))
    return rows
