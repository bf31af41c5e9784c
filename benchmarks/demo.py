"""The demo's time: `make demo`'s command, `python run.py -m sweep=demo`, as a new user runs it
after `make setup`, cold (an empty artifact cache: corpora rendered, the embedder exported, the
shipped cross-encoder restored, the GGUF model converted, the chunk vectors and cross-encoder
scores restored from the shipped seed (data/seed/), the rest built and generated) and then warm
(the same command on that cache). With `full`, also cold without the seed (`paths.seed=null`:
every vector embedded and every candidate scored, as any other corpus is).

Headline keys, with their targets in docs/reference/bench.md: **demo_cold_s** and **demo_warm_s** (the
sweep's process wall time, summary, charts and report included) and **rerank_ms_per_question**
(v3's timed reranking of one question in its latency sample, where every question is scored anew;
its median over the sample).
Not in a plain `python -m benchmarks` (about 5 minutes on 2 cores, 12 with `full`): `make bench`
runs it with the sweeps.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from benchmarks.common import finish, row, scratch_dir, start, tiny_dataset
from benchmarks.sweeps import run_process
from rag.run.result import RunResult


def jobs_by_variant(sweep_dir: Path) -> dict[str, RunResult]:
    """A finished sweep's jobs, by their variant (v1..v4)."""
    return {r.variant: r for r in (RunResult.read(m) for m in sorted(sweep_dir.glob("*/metrics.json")))}


def bench_demo(quick: bool = True, full: bool = False, tiny: bool = False, overrides: list[str] | None = None,
               work_dir: Path | None = None) -> dict[str, Any]:
    """`make demo` cold (empty artifact cache) and warm, wall seconds and the reranker's cost per question."""
    clock = start()
    args = ["sweep=demo"]
    with scratch_dir("demo") as tmp:
        overrides = list(overrides or [])
        if tiny:  # the benchmark's code on a dozen abstracts, v1 and v2 only (no models to load)
            overrides = overrides or tiny_dataset(tmp / "data")
            args.append("+version=v1,v2")
        work = Path(work_dir) if work_dir is not None else tmp
        cache = work / "cache"
        shutil.rmtree(cache, ignore_errors=True)  # cold means cold: nothing shared with the main cache
        out: dict[str, Any] = {"command": " ".join(["python run.py -m", *args, *overrides])}
        sides = ["cold_unseeded", "cold", "warm"] if full else ["cold", "warm"]
        for side in sides:
            sweep_dir = work / "runs" / side
            shutil.rmtree(sweep_dir, ignore_errors=True)
            if side != "warm":
                shutil.rmtree(cache, ignore_errors=True)  # each cold side starts from an empty cache
            res = run_process(args, sweep_dir, cache, overrides, multirun=True, seed=side != "cold_unseeded")
            jobs = jobs_by_variant(sweep_dir)
            out[f"demo_{side}_s"] = res["wall_s"]
            out[f"{side}_stages_s"] = {v: j.timings_s for v, j in jobs.items()}
            out[f"{side}_objective"] = {v: j.objective.value for v, j in jobs.items()}
            if side == "cold" and "v3" in jobs:
                median = jobs["v3"].latency.get("rerank_ms_median")
                out["rerank_ms_per_question"] = None if median is None else round(float(median), 1)
        out["same_objectives_warm"] = out["cold_objective"] == out["warm_objective"]
        if full:
            out["same_objectives_unseeded"] = out["cold_objective"] == out["cold_unseeded_objective"]
        shutil.rmtree(cache, ignore_errors=True)
    out["table"] = [
        row("demo_cold_s", out["demo_cold_s"], "s", "empty artifact cache; target <= 300 s on 2 cores"),
        row("demo_warm_s", out["demo_warm_s"], "s", "same command again; target <= 45 s"),
        row("rerank_ms_per_question", out.get("rerank_ms_per_question"), "ms",
            "v3's latency sample: top 20 scored per question, median"),
        row("warm run repeats the cold objectives", out["same_objectives_warm"]),
    ]
    if full:
        out["table"] += [row("demo_cold_unseeded_s", out["demo_cold_unseeded_s"], "s", "paths.seed=null: nothing restored"),
                         row("the seed changes no objective", out["same_objectives_unseeded"])]
    return finish(out, clock)
