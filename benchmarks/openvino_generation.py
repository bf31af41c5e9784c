"""Generation on OpenVINO GenAI (`llm=openvino`, int8 weights) against today's default engine
(`llm=smollm2`: transformers + torch, float32), in one process, on v3's prompts (the prompts of
benchmarks.generation_speed: `n_per_corpus` questions of each corpus of the default slice).

Both engines run the same configured decoding (greedy, 64 new tokens, the repetition guard) with
the same threads. Measured per engine: prefill tokens/s (every prompt with one new token),
end-to-end tokens/s of the full answers and the decode rate that leaves, best of `repeats` after a
warm-up; then **generation_speedup_openvino** (fp32's wall time over OpenVINO's for the same
questions; the tokens/s ratio beside it), the identical-answer
share, and the paired differences of answer-GT, grounding and hallucination (fp32 as the
baseline: mean, paired-bootstrap 95% CI, Holm-corrected p-values of the paired randomization test,
as the verdict computes them).

Beside them, **decode_ratio_openvino_native**: llm=openvino's decode rate (one prompt at a time,
its decoding rules applied per token by a Python streamer) over the ceiling, OpenVINO GenAI's own
`generate` with no callback on the same prompts and GenerationConfig (greedy, the cap, the
end-of-turn ids), both by OpenVINO's own clock after the first token. The two paths alternate
prompt by prompt, best of `repeats` each, so that a busy machine slows both alike; the native
tokens, cut by the same rules afterwards, must give llm=openvino's answers.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.common import environment, finish, ratio, row, run_mode, start
from benchmarks.generation_speed import answer_scores, v3_prompts


def _engine(name: str, base_llm: dict[str, Any], threads: int) -> Any:
    from rag.llm.hf import HFGenerator
    from rag.llm.openvino import OpenVINOGenerator

    args = {k: v for k, v in base_llm.items() if k != "_target_"}
    args["num_threads"] = threads
    if name == "fp32":
        return HFGenerator(**args)
    keep = ("model", "gguf_file", "max_new_tokens", "temperature", "seed", "prompt", "system_prompt", "stop",
            "repeat_stop_ngram")
    ov_args = {k: args[k] for k in keep if k in args}
    # llm=openvino's default: one prompt at a time; beside it, fp32's batch size (left-padded
    # batches, whose answers are not those of the prompts alone)
    ov_args["batch_size"] = args["batch_size"] if name == "openvino_batched" else 1
    return OpenVINOGenerator(weights="int8", **ov_args, num_threads=threads)


def _timed(gen: Any, prompts: dict[str, Any], max_new_tokens: int | None, repeats: int) -> tuple[float, list[str], dict]:
    cap = gen.rules.max_new_tokens
    if max_new_tokens is not None:
        gen.rules = type(gen.rules)(max_new_tokens, gen.rules.stop, gen.rules.repeat_stop_ngram,
                                    gen.rules.no_repeat_ngram_size)
        gen.max_new_tokens = max_new_tokens
    try:
        best, answers, stats = float("inf"), [], {}
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = gen.generate(prompts["questions"], prompts["contexts"])
            wall = time.perf_counter() - t0
            if wall < best:
                best, answers, stats = wall, out, dict(gen.stats)
        return best, answers, stats
    finally:
        gen.rules = type(gen.rules)(cap, gen.rules.stop, gen.rules.repeat_stop_ngram, gen.rules.no_repeat_ngram_size)
        gen.max_new_tokens = cap


def measure(name: str, base_llm: dict[str, Any], prompts: dict[str, Any], threads: int, repeats: int) -> dict[str, Any]:
    gen = _engine(name, base_llm, threads)
    t0 = time.perf_counter()
    gen.warm_up()
    load_s = time.perf_counter() - t0
    gen.generate(prompts["questions"][:1], prompts["contexts"][:1])  # kernels and allocator warm
    prefill_s, _, pre = _timed(gen, prompts, 1, repeats)
    wall, answers, st = _timed(gen, prompts, None, repeats)
    n = len(prompts["questions"])
    prefill_tokens = pre["prefill_tokens"]
    decode_tokens = st["new_tokens"] - n  # the first new token of each answer comes with its prefill
    return {"engine": name, "load_s": round(load_s, 1), "wall_s": round(wall, 2), "answers": answers,
            "new_tokens": st["new_tokens"], "prefill_tokens": prefill_tokens,
            "prefill_tokens_per_s": round(prefill_tokens / prefill_s, 1),
            "tokens_per_s": round(st["new_tokens"] / wall, 2),
            # None where the load made the answers' best run faster than the prefill's: the
            # difference of two wall times is then no decode time
            "decode_tokens_per_s": round(decode_tokens / (wall - prefill_s), 2) if wall > prefill_s else None,
            **({"native_ceiling": native_ceiling(gen, prompts, repeats)} if name == "openvino" else {})}


def native_ceiling(gen: Any, prompts: dict[str, Any], repeats: int) -> dict[str, Any]:
    """llm=openvino's streamer path against OpenVINO's `generate` with no callback (see the
    module's docstring): decode tokens, seconds and rate, wall time, and identical answers."""
    from rag.llm.decoding import finish_text

    texts = gen.prompts(prompts["questions"], prompts["contexts"])
    encoded = [gen._tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    eos = gen._eos()

    def native(prompt: list[int]) -> tuple[Any, int, tuple[int, float]]:
        # a batch of one: no padding, no streamer, the rules cut the tokens afterwards
        made, timing = gen._generate_rows([prompt], eos)
        return made[0][0], made[0][1], timing

    def ragrig(prompt: list[int]) -> tuple[Any, int, tuple[int, float]]:
        made, timing = gen._generate_one(prompt, eos)
        return made[0][0], made[0][1], timing

    paths = {"native": native, "ragrig": ragrig}
    best: dict[str, list[dict[str, Any]]] = {name: [{} for _ in encoded] for name in paths}
    for rep in range(repeats):
        for i, prompt in enumerate(encoded):
            for name in sorted(paths, reverse=(rep + i) % 2 == 1):
                t0 = time.perf_counter()
                answer, generated, (decoded, decode_s) = paths[name](prompt)
                wall = time.perf_counter() - t0
                text = finish_text(gen._tok.decode(answer.kept(), skip_special_tokens=True), gen.rules)
                b = best[name][i]
                if not b or wall < b["wall_s"]:
                    b.update(wall_s=wall, new_tokens=generated, text=text)
                if not b.get("decode_s") or decode_s < b["decode_s"]:
                    b.update(decode_tokens=decoded, decode_s=decode_s)
    out: dict[str, Any] = {}
    for name, rows in best.items():
        tokens, seconds = sum(r["decode_tokens"] for r in rows), sum(r["decode_s"] for r in rows)
        out[name] = {"decode_tokens": tokens, "decode_s": round(seconds, 3),
                     "decode_tokens_per_s": round(tokens / seconds, 2) if seconds > 0 else None,
                     "new_tokens": sum(r["new_tokens"] for r in rows),
                     "wall_s": round(sum(r["wall_s"] for r in rows), 2)}
    out["identical_answers"] = sum(a["text"] == b["text"] for a, b in zip(best["native"], best["ragrig"]))
    out["n"] = len(encoded)
    return out


def paired(baseline: np.ndarray, other: np.ndarray) -> dict[str, Any]:
    """The verdict's paired comparison (experiments.stats) of two engines' per-question values."""
    from experiments.stats import paired_bootstrap

    ids = [str(i) for i in range(len(baseline))]
    d = paired_bootstrap(dict(zip(ids, map(float, baseline))), dict(zip(ids, map(float, other))), n_resamples=10_000)
    return {"mean_diff": round(d.mean_diff, 4), "ci95": [round(d.ci_low, 4), round(d.ci_high, 4)], "p": d.p_value}


def _missing_engine() -> str | None:
    import importlib.util

    from rag.llm.openvino import DEFAULT_EXPORT_PYTHON

    if importlib.util.find_spec("openvino_genai") is None or not DEFAULT_EXPORT_PYTHON.exists():
        return "openvino-genai or its export environment is not installed (make openvino)"
    return None


def bench_openvino_generation(quick: bool = True, full: bool = False, tiny: bool = False,
                              n_per_corpus: int | None = None, threads: int = 2, repeats: int | None = None,
                              overrides: Sequence[str] = ()) -> dict[str, Any]:
    """llm=openvino against llm=smollm2 on v3's prompts: speed, identical answers, answer metrics."""
    clock = start()
    missing = _missing_engine()
    if missing:
        return finish({"skipped": missing, "table": [row("llm=openvino", "skipped", "", missing)]}, clock)
    n = n_per_corpus or {"tiny": 1, "quick": 8, "full": 50}[run_mode(tiny, full)]
    repeats = repeats or (1 if tiny else 3)
    prompts = v3_prompts(n, list(overrides))
    runs = {name: measure(name, prompts["llm"], prompts, threads, repeats)
            for name in ("fp32", "openvino", "openvino_batched")}
    fp, ov = runs["fp32"], runs["openvino"]
    scores = {name: answer_scores(r["answers"], prompts) for name, r in runs.items()}
    diffs = {m: paired(scores["fp32"][m].astype(float), scores["openvino"][m].astype(float))
             for m in ("answer_gt", "grounding", "hallucination")}
    from experiments.stats import holm

    adjusted = holm([d["p"] for d in diffs.values()])
    for d, p in zip(diffs.values(), adjusted):
        d["p_holm"] = None if np.isnan(p) else round(float(p), 4)
        d["significant"] = bool(p < 0.05)
    identical = float(np.mean([a == b for a, b in zip(fp["answers"], ov["answers"])]))
    batched = runs["openvino_batched"]
    out = {
        "n_questions": len(prompts["questions"]), "threads": threads, "repeats": repeats,
        "engine": "openvino-genai int8 (llm=openvino) vs transformers fp32 (llm=smollm2)",
        # Wall time for the same questions, not tokens/s: the OpenVINO engine cuts repeating answers
        # after generating (fp32's loop stops as they start repeating), so its token count holds
        # tokens no answer keeps, and a tokens/s ratio would credit it for them.
        "generation_speedup_openvino": ratio(fp["wall_s"], ov["wall_s"]),
        "tokens_per_s_ratio_openvino": ratio(ov["tokens_per_s"], fp["tokens_per_s"]),
        "generation_speedup_openvino_batched": ratio(fp["wall_s"], batched["wall_s"]),
        "batched_identical_share": round(float(np.mean([a == b for a, b in zip(batched["answers"], ov["answers"])])), 4),
        "prefill_speedup_openvino": ratio(ov["prefill_tokens_per_s"], fp["prefill_tokens_per_s"]),
        "decode_speedup_openvino": ratio(ov["decode_tokens_per_s"], fp["decode_tokens_per_s"]),
        "openvino_identical_share": round(identical, 4),
        "decode_ratio_openvino_native": ratio(ov["native_ceiling"]["ragrig"]["decode_tokens_per_s"],
                                              ov["native_ceiling"]["native"]["decode_tokens_per_s"]),
        "answer_differences": diffs,
        "quality": {name: {m: round(float(v.mean()), 4) for m, v in s.items()} for name, s in scores.items()},
        "differing_answers": [{"question": q, "fp32": a, "openvino": b} for q, a, b in
                              zip(prompts["questions"], fp["answers"], ov["answers"]) if a != b],
        "engines": runs, "environment": environment(),
    }
    out["table"] = table(out)
    return finish(out, clock)


def table(out: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [row("questions (v3 prompts, default slice)", out["n_questions"], "",
                f"{out['threads']} threads, best of {out['repeats']}")]
    for name, r in out["engines"].items():
        rows.append(row(f"{name}: prefill / decode / end-to-end tokens/s",
                        f"{r['prefill_tokens_per_s']} / {r['decode_tokens_per_s']} / {r['tokens_per_s']}", "tok/s",
                        f"{r['wall_s']} s for {r['new_tokens']} tokens; load {r['load_s']} s"))
    rows += [
        row("**generation_speedup_openvino** (wall time, same questions)", out["generation_speedup_openvino"], "x",
            f"tokens/s {out['tokens_per_s_ratio_openvino']}x; prefill {out['prefill_speedup_openvino']}x, "
            f"decode {out['decode_speedup_openvino']}x"),
        row("openvino in padded batches: speedup (wall time)", out["generation_speedup_openvino_batched"], "x",
            f"answers identical to one at a time: {out['batched_identical_share']}"),
        row("identical answers (openvino vs fp32)", out["openvino_identical_share"], "share",
            f"{len(out['differing_answers'])} differ"),
    ]
    c = out["engines"]["openvino"]["native_ceiling"]
    for name, label in (("native", "OpenVINO generate, no callback (ceiling)"), ("ragrig", "llm=openvino")):
        r = c[name]
        rows.append(row(f"{label}: decode tokens/s", r["decode_tokens_per_s"], "tok/s",
                        f"{r['decode_tokens']} tokens in {r['decode_s']} s after the first; "
                        f"wall {r['wall_s']} s for {r['new_tokens']} tokens"))
    rows.append(row("**decode_ratio_openvino_native** (llm=openvino / ceiling)", out["decode_ratio_openvino_native"],
                    "x", f"answers identical to the ceiling's cut by the rules: {c['identical_answers']} of {c['n']}"))
    for m, d in out["answer_differences"].items():
        rows.append(row(f"{m}: openvino - fp32", d["mean_diff"], "",
                        f"95% CI [{d['ci95'][0]}, {d['ci95'][1]}], Holm p {d['p_holm']}"
                        + (" (significant)" if d["significant"] else "")))
    return rows
