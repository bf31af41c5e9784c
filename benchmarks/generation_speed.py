"""Generation on the CPU: the generator's runtime and decoding against the runtime before them,
on v3's own prompts, with the limits this machine puts on a 135M-parameter model.

Prompts: `+version=v3 reranker=mmr` on the default slice (its retrieval, reranking and contexts,
from the artifact cache, built if missing; MMR, v3's reranker before the cross-encoder, so that a
fresh machine does not train a cross-encoder to measure generation and the prompts stay those of
the earlier measurements), `n_per_corpus` questions of each corpus spread evenly over the
question list. Variants, in one process, on the same prompts:

- `before`: the runtime before this change - transformers' `generate`, batches of 4, float32, one
  torch thread, 96 new tokens, no stop rule (`llm.runtime=generate`);
- `after_same_decoding`: `llm=smollm2`'s runtime settings (the decoding loop, its batch size and
  threads) with the decoding of `before`: **generation_speedup** (tokens/s ratio) and
  **generation_identical_share** (answers identical to `before`'s) come from this pair;
- `bfloat16_same_decoding` (optional, `bf16=True`): the same with bfloat16 weights;
- `after`: `llm=smollm2` as configured (its stop rules and length cap): tokens per answer, wall
  time, and answer-GT / grounding / hallucination from the evaluation embedder, against `before`.

Limits: the float32 and bfloat16 GEMM rates (torch.matmul on the prompt's shapes, 1 thread and
all threads) and the read bandwidth (numpy, 512 MB) measured in the same run; the prefill FLOPs of
the prompts (2 x non-embedding parameters per token, plus attention) and the bytes a decoding
step reads (weights, plus each live row's KV cache) turn them into a floor in seconds.

Phases: `llm=smollm2` as configured, one question at a time, its prefill and its decoding steps
timed apart on the generator's own loop; prefill GFLOP/s against the float32 GEMM rate, and, as
decoding one row is bound by memory rather than arithmetic, the bytes a step reads against the
read bandwidth.
"""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.common import compose, environment, finish, ratio, row, run_mode, start
from benchmarks.encoding import attention_flops

OLD_DECODING = {"max_new_tokens": 96, "stop": [], "repeat_stop_ngram": 0, "no_repeat_ngram_size": 0}
BEFORE = {"runtime": "generate", "batch_size": 4, "num_threads": 1, "dtype": "float32", **OLD_DECODING}


PROMPTS = ["reranker=mmr"]  # see the module's docstring


def v3_prompts(n_per_corpus: int, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Questions, their v3 contexts and ground truths, `n_per_corpus` of each corpus."""
    from rag.run.query import retrieve_rerank_all
    from rag.run.session import open_session
    from rag.run.settings import load

    cfg = compose(["+version=v3", *PROMPTS, "llm=none", "embedder.show_progress=false", *overrides])
    s = open_session(load(cfg))
    by_corpus: dict[str, list[int]] = {}
    for i, q in enumerate(s.qa):
        by_corpus.setdefault(q.corpus or "-", []).append(i)
    rows = []
    for members in by_corpus.values():
        pick = np.unique(np.linspace(0, len(members) - 1, min(n_per_corpus, len(members))).round().astype(int))
        rows += [members[j] for j in pick]
    qa = [s.qa[i] for i in rows]
    queries = [q.question for q in qa]
    filters = s.retriever.filters_for([q.corpus for q in qa], queries)
    hits, _, _ = retrieve_rerank_all(s.retriever, s.reranker, queries, filters, s.depth, s.chunk_set.chunks, s.score.k)
    contexts = s.context_builder.build(hits, s.chunk_set)
    return {"questions": queries, "contexts": contexts, "truths": [q.answer for q in qa],
            "corpora": [q.corpus for q in qa], "llm": dict(cfg_llm(overrides))}


def cfg_llm(overrides: Sequence[str] = ()) -> Any:
    from omegaconf import OmegaConf

    cfg = compose(["+version=v3", *overrides])
    return OmegaConf.to_container(cfg.llm, resolve=True)


def machine_limits(threads: int) -> dict[str, float]:
    """GEMM rates on the prefill's shapes (a 700-token prompt through a 576 -> 1536 projection)
    and the read bandwidth, best of 5."""
    import torch

    def best(fn: Any, r: int = 5) -> float:
        fn()
        ts = []
        for _ in range(r):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return min(ts)

    out: dict[str, float] = {}
    a = np.ones(64 * 2**20, np.float64)  # 512 MB: far past the caches
    out["read_gb_s"] = round(a.nbytes / best(a.sum) / 1e9, 2)
    previous = torch.get_num_threads()
    m, k, n = 2048, 576, 1536
    for t in sorted({1, threads}):
        torch.set_num_threads(t)
        for dt in (torch.float32, torch.bfloat16):
            x, w = torch.randn(m, k, dtype=dt), torch.randn(k, n, dtype=dt)
            rate = 2 * m * k * n / best(lambda x=x, w=w: x @ w) / 1e9
            out[f"gemm_{str(dt).split('.')[-1]}_{t}t_gflop_s"] = round(rate, 1)
    torch.set_num_threads(previous)
    return out


def model_costs(lm: Any) -> dict[str, float]:
    """Parameters and per-token costs of the model (Llama-style: GQA attention, gated MLP)."""
    c = lm.config
    params = sum(p.numel() for p in lm.parameters())
    embed = c.vocab_size * c.hidden_size
    head_dim = getattr(c, "head_dim", c.hidden_size // c.num_attention_heads)
    kv_bytes_per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * 4
    return {"params": params, "non_embedding_params": params - embed, "embedding_params": embed,
            "kv_bytes_per_token_fp32": kv_bytes_per_token, "layers": c.num_hidden_layers,
            "hidden": c.hidden_size, "attention_heads": c.num_attention_heads}


def floor_seconds(costs: dict[str, float], stats: dict[str, float], limits: dict[str, float], dtype: str,
                  threads: int) -> dict[str, float]:
    """Seconds the work of a run cannot go below on this machine: prefill FLOPs at the GEMM rate,
    plus decoding steps' reads (weights once per step and batch; KV per live row) at the read
    bandwidth. Decoding steps are counted from the run's own row-steps and batches."""
    bytes_w = 4 if dtype == "float32" else 2
    # machine_limits measures every dtype on one thread, and on `threads` when that is another count
    gemm = limits.get(f"gemm_{dtype}_{threads}t_gflop_s") or limits[f"gemm_{dtype}_1t_gflop_s"]
    prefill_flops = 2 * costs["non_embedding_params"] * stats["padded_prefill_tokens"]
    prefill_s = prefill_flops / (gemm * 1e9)
    # weights: once per decoding step of a batch; the lm head's share (tied embedding) included
    steps = stats["decode_steps"]
    weight_bytes = costs["params"] * bytes_w * steps
    kv_bytes = stats["decode_row_steps"] * costs["kv_bytes_per_token_fp32"] * (bytes_w / 4) * stats.get("mean_context", 0)
    decode_s = (weight_bytes + kv_bytes) / (limits["read_gb_s"] * 1e9)
    return {"prefill_s": round(prefill_s, 2), "decode_s": round(decode_s, 2), "total_s": round(prefill_s + decode_s, 2),
            "gemm_gflop_s": gemm}


def phases(gen: Any, prompts: dict[str, Any], costs: dict[str, float], n: int, new_tokens: int,
           repeats: int = 2) -> dict[str, Any]:
    """Prefill and decoding of the first `n` prompts, one at a time, on the generator's own loop
    with answers of `new_tokens` tokens that nothing ends early (no end-of-turn, no stop rule): the
    model's forward passes timed by hooks, the first a prefill, the others decoding steps; best of
    `repeats` each. Their work: 2 x non-embedding parameters per token plus attention over the
    context (causal: a prompt's position attends to itself and those before it); the bytes a step
    reads: every weight (the tied output head reads the embedding) and the KV cache so far."""
    import torch

    from rag.llm.decoding import DecodingRules, greedy_batch

    previous = torch.get_num_threads()
    gen.warm_up()  # its threads, as generate() sets them (and restores them: below)
    tok, lm = gen.load()
    texts = gen.prompts(prompts["questions"][:n], prompts["contexts"][:n])
    layers, hidden = int(costs["layers"]), int(costs["hidden"])
    per_token_flop = 2.0 * costs["non_embedding_params"]
    weight_bytes = costs["params"] * next(lm.parameters()).element_size()
    kv_per_token = costs["kv_bytes_per_token_fp32"]
    out: dict[str, Any] = {"prompts": len(texts), "threads": torch.get_num_threads(), "prefill_tokens": 0,
                           "prefill_s": 0.0, "prefill_gflop": 0.0, "decode_steps": 0, "decode_s": 0.0,
                           "decode_gflop": 0.0, "decode_gb": 0.0}
    forwards: list[float] = []
    hooks = [lm.register_forward_pre_hook(lambda *a: forwards.append(-time.perf_counter())),
             lm.register_forward_hook(lambda *a: forwards.append(forwards.pop() + time.perf_counter()))]
    rules = DecodingRules(new_tokens)
    try:
        with torch.inference_mode():
            for text in texts:
                ids = tok(text, add_special_tokens=False)["input_ids"]
                runs = []
                for _ in range(repeats):
                    forwards.clear()
                    greedy_batch(lm, tok, [ids], rules, eos=set())
                    runs.append((forwards[0], sum(forwards[1:]), len(forwards) - 1))
                length, steps = len(ids), runs[0][2]
                contexts = np.arange(length + 1, length + 1 + steps)
                out["prefill_tokens"] += length
                out["prefill_s"] += min(r[0] for r in runs)
                out["prefill_gflop"] += (per_token_flop * length
                                         + attention_flops(layers, hidden, length, (length + 1) / 2)) / 1e9
                out["decode_steps"] += steps
                out["decode_s"] += min(r[1] for r in runs)
                out["decode_gflop"] += (per_token_flop * steps + attention_flops(layers, hidden, 1, contexts.sum())) / 1e9
                out["decode_gb"] += (weight_bytes * steps + kv_per_token * contexts.sum()) / 1e9
    finally:
        for h in hooks:
            h.remove()
        torch.set_num_threads(previous)
    return out


def against_limits(ph: dict[str, Any], limits: dict[str, float]) -> dict[str, Any]:
    """The phases' rates and their share of the machine's: GFLOP/s over the float32 GEMM rate at the
    threads they ran on, and decoding's GB/s read over the read bandwidth."""
    gemm = limits.get(f"gemm_float32_{ph['threads']}t_gflop_s") or limits["gemm_float32_1t_gflop_s"]
    prefill, decode = ph["prefill_gflop"] / ph["prefill_s"], ph["decode_gflop"] / ph["decode_s"]
    read = ph["decode_gb"] / ph["decode_s"]
    return {"gemm_gflop_s": gemm, "prefill_tokens_per_s": round(ph["prefill_tokens"] / ph["prefill_s"], 1),
            "prefill_gflop_s": round(prefill, 1), "prefill_vs_gemm": ratio(prefill, gemm),
            "decode_tokens_per_s": round(ph["decode_steps"] / ph["decode_s"], 1),
            "decode_gflop_s": round(decode, 2), "decode_vs_gemm": ratio(decode, gemm),
            "decode_gb_s": round(read, 2), "decode_vs_bandwidth": ratio(read, limits["read_gb_s"]),
            "decode_mb_per_token": round(1000 * ph["decode_gb"] / ph["decode_steps"], 1)}


def run_variant(name: str, settings: dict[str, Any], base_llm: dict[str, Any], prompts: dict[str, Any]) -> dict[str, Any]:
    import torch

    from rag.llm import loading as llm_module
    from rag.llm.hf import HFGenerator

    args = {k: v for k, v in base_llm.items() if k != "_target_"}
    args.update(settings)
    gen = HFGenerator(**args)
    llm_module.clear_loaded()
    gen.warm_up()
    gen.generate(prompts["questions"][:1], prompts["contexts"][:1])  # kernels and allocator warm
    t0 = time.perf_counter()
    answers = gen.generate(prompts["questions"], prompts["contexts"])
    wall = time.perf_counter() - t0
    st = dict(gen.stats)
    used = gen._auto_threads if gen.num_threads == "auto" else gen.num_threads
    st["threads_used"] = int(used or torch.get_num_threads())
    return {"name": name, "settings": {k: args[k] for k in ("runtime", "batch_size", "num_threads", "dtype")},
            "decoding": gen.rules.id, "wall_s": round(wall, 2), "stats": st, "answers": answers,
            "tokens_per_s": round(st["new_tokens"] / wall, 2),
            "tokens_per_answer": round(st["answer_tokens"] / len(answers), 1),
            "generated_per_answer": round(st["new_tokens"] / len(answers), 1), "generator": gen}


def single_question_ms(gen: Any, prompts: dict[str, Any], n: int = 4) -> float:
    """One question alone, as `rag.ask` serves it: median wall time over n questions."""
    ts = []
    for i in range(min(n, len(prompts["questions"]))):
        t0 = time.perf_counter()
        gen.generate(prompts["questions"][i : i + 1], prompts["contexts"][i : i + 1])
        ts.append(1000 * (time.perf_counter() - t0))
    return round(statistics.median(ts), 1)


def answer_scores(answers: list[str], prompts: dict[str, Any], tau_h: float = 0.5) -> dict[str, np.ndarray]:
    """answer-GT, grounding and hallucination per question (eval/metrics.py, conf/eval's embedder)."""
    from eval import metrics as M
    from eval.scoring import ScoreSettings
    from rag.run.session import create

    embedder = create(compose([]).eval.embedder)
    sep = ScoreSettings().context_separator
    e_t = embedder.encode(prompts["truths"], show_progress=False)
    e_c = embedder.encode([sep.join(c.text for c in ctx) for ctx in prompts["contexts"]], show_progress=False)
    e_a = embedder.encode(answers, show_progress=False)
    gt = M.answer_gt_similarity(e_a, e_t)
    gr = M.grounding(e_a, e_c)
    return {"answer_gt": gt, "grounding": gr, "hallucination": M.hallucination(gt, gr, tau_h)}


def bench_generation_speed(quick: bool = True, full: bool = False, tiny: bool = False, n_per_corpus: int | None = None,
                           bf16: bool = True, overrides: Sequence[str] = (), n_single: int = 4) -> dict[str, Any]:
    """Generation on the CPU: tokens/s of the generator against the runtime before it on v3's
    prompts (same decoding: speed-up and identical answers), the new decoding's answer length and
    quality, and the machine's limits."""
    clock = start()
    n = n_per_corpus or {"tiny": 1, "quick": 8, "full": 50}[run_mode(tiny, full)]
    prompts = v3_prompts(n, list(overrides))
    base_llm = prompts["llm"]
    threads = os.cpu_count() or 1
    tiny_cap = {"max_new_tokens": 8} if tiny else {}
    variants: list[tuple[str, dict[str, Any]]] = [
        ("before", {**BEFORE, **tiny_cap}), ("after_same_decoding", {**OLD_DECODING, **tiny_cap}),
        ("after", dict(tiny_cap))]
    if bf16 and not tiny:
        variants.insert(2, ("bfloat16_same_decoding", {**OLD_DECODING, "dtype": "bfloat16"}))
    results: dict[str, Any] = {}
    for name, settings in variants:
        results[name] = run_variant(name, settings, base_llm, prompts)
    before, same = results["before"], results["after_same_decoding"]
    single = {"before": single_question_ms(before["generator"], prompts, n_single),
              "after": single_question_ms(results["after"]["generator"], prompts, n_single)}
    costs = model_costs(before["generator"]._lm[1])
    phase = phases(results["after"]["generator"], prompts, costs, n=1 if tiny else 4, new_tokens=4 if tiny else 32)
    for r in results.values():
        del r["generator"]
    limits = machine_limits(threads)
    phase.update(against_limits(phase, limits))
    mean_ctx = float(np.mean([s for s in [before["stats"]["prefill_tokens"] / len(prompts["questions"])]]))
    for r in results.values():
        r["stats"]["mean_context"] = mean_ctx
        r["floor"] = floor_seconds(costs, r["stats"], limits, r["settings"]["dtype"], r["stats"]["threads_used"])
        r["identical_to_before"] = round(float(np.mean([a == b for a, b in zip(r["answers"], before["answers"])])), 4)
    quality = {}
    for name in ("before", "after"):
        sc = answer_scores(results[name]["answers"], prompts)
        quality[name] = {k: round(float(v.mean()), 4) for k, v in sc.items()}
    out = {
        "n_questions": len(prompts["questions"]),
        "generation_speedup": ratio(same["tokens_per_s"], before["tokens_per_s"]),
        "generation_identical_share": same["identical_to_before"],
        "differing_answers": [{"question": q, "before": a, "after": b} for q, a, b in
                              zip(prompts["questions"], before["answers"], same["answers"]) if a != b],
        "variants": results, "single_question_ms": single, "quality": quality, "limits": limits, "model": costs,
        "phases": phase,
        "threads": threads, "environment": environment(),
    }
    out["table"] = table(out)
    return finish(out, clock)


def table(out: dict[str, Any]) -> list[dict[str, Any]]:
    v = out["variants"]
    b = v["before"]
    rows = [row("questions (v3 prompts, default slice)", out["n_questions"], "",
                f"mean prompt {v['before']['stats']['mean_context']:.0f} tokens")]
    for name, r in v.items():
        s = r["settings"]
        rows.append(row(f"{name}: tokens/s", r["tokens_per_s"], "tok/s",
                        f"{s['runtime']}, batch {s['batch_size']}, {r['stats']['threads_used']} thread(s) ({s['num_threads']}), {s['dtype']}; "
                        f"{r['wall_s']} s for {r['stats']['new_tokens']} tokens ({r['generated_per_answer']} per answer); "
                        f"{ratio(r['tokens_per_s'], b['tokens_per_s'])}x before; identical to before: "
                        f"{r['identical_to_before']}; floor {r['floor']['total_s']} s (prefill {r['floor']['prefill_s']} "
                        f"+ decode {r['floor']['decode_s']}) = {ratio(r['floor']['total_s'], r['wall_s'])}x the wall time"))
    rows += [
        row("**generation_speedup** (same decoding)", out["generation_speedup"], "x", "after_same_decoding / before, tokens/s"),
        row("**generation_identical_share**", out["generation_identical_share"], "share",
            f"{len(out['differing_answers'])} answer(s) differ"),
        row("one question alone (rag.ask): before / after", f"{out['single_question_ms']['before']} / "
            f"{out['single_question_ms']['after']}", "ms", "median over questions; after = new runtime and decoding"),
    ]
    for name, q in out["quality"].items():
        rows.append(row(f"{name}: answer-GT / grounding / hallucination", f"{q['answer_gt']} / {q['grounding']} / "
                        f"{q['hallucination']}", "", f"{v[name]['tokens_per_answer']} tokens per answer"))
    ph, lim = out["phases"], out["limits"]
    who = (f"llm=smollm2 (fp32), one question at a time, first {ph['prompts']} prompt(s), {ph['threads']} thread(s); "
           "2 x non-embedding parameters per token plus attention")
    rows += [
        row("after: prefill", ph["prefill_gflop_s"], "GFLOP/s",
            f"{ph['prefill_vs_gemm']}x the float32 GEMM rate ({ph['gemm_gflop_s']} GFLOP/s); "
            f"{ph['prefill_tokens_per_s']} prompt tokens/s; {who}"),
        row("after: decode, one row", ph["decode_gflop_s"], "GFLOP/s",
            f"{ph['decode_vs_gemm']}x the float32 GEMM rate: one token a step is bound by memory, not arithmetic; "
            f"{ph['decode_tokens_per_s']} tokens/s; {who}"),
        row("after: decode, one row, weights and KV cache read", ph["decode_gb_s"], "GB/s",
            f"{ph['decode_vs_bandwidth']}x the read bandwidth ({lim['read_gb_s']} GB/s); "
            f"{ph['decode_mb_per_token']} MB a token (every fp32 weight, the tied head included, plus the KV cache)"),
    ]
    rows.append(row("machine: read bandwidth / GEMM fp32 1t, {t}t / bf16 1t, {t}t".format(t=out["threads"]),
                    f"{lim['read_gb_s']} GB/s / " + ", ".join(str(lim[k]) for k in lim if k.startswith("gemm_float32"))
                    + " / " + ", ".join(str(lim[k]) for k in lim if k.startswith("gemm_bfloat16")), "GFLOP/s", ""))
    return rows
