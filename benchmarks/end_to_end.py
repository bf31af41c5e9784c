"""End to end: per-stage wall time of the version presets on the embedded default slice, from
each run's metrics.json (`timings_s`), with a cold and a warm artifact cache.

Each run is `python run.py +version=vN` in a fresh process, as a user runs it (so model loading
and imports are in the process wall time, and `load_models` is a stage of its own).
cold: an empty artifact cache, except that rendered corpora and trained/exported models
(cache folders corpus/, cross_encoder/, onnx_model/) are linked from the main cache, as data
preparation; chunks, vectors, indexes, BM25 and answers are built. warm: the same command again
on that cache. quick runs v1 and v2 in one cache, in order (v1 cold, v1 warm, v2 "cold", v2 warm),
as `make demo` does, so v2's cold run reuses v1's chunks and vectors and builds its HNSW index and
BM25; full gives every version an empty cache of its own and adds v3 and v4 (cross-encoder reranking and the
SmolLM2 generator: many minutes each on CPU). The alpha-sweep cost ratio is the alpha_sweep family's
(sweeps.py), not repeated here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.common import (
    cold_cache,
    environment,
    finish,
    main_cache,
    ratio,
    row,
    run_mode,
    run_pipeline_inprocess,
    run_pipeline_subprocess,
    scratch_dir,
    start,
    tiny_dataset,
)

STAGES = ("corpus", "chunk", "embed", "index", "bm25", "load_models", "retrieve", "rerank", "generate", "score")


def _summary(res: dict[str, Any]) -> dict[str, Any]:
    if "error" in res:
        return {"error": res["error"]}
    t = res.get("timings_s", {})
    return {
        "timings_s": t,
        "stages_total_s": round(sum(t.values()), 3),
        "process_wall_s": res["process_wall_s"],
        "outside_stages_s": round(res["process_wall_s"] - sum(t.values()), 3),
        "artifacts_hit": {k: v.get("hit") for k, v in res.get("artifacts", {}).items()},
        "counts": res.get("counts", {}),
        "objective": res.get("objective"),
        "latency": res.get("latency", {}),
    }


def bench_end_to_end(quick: bool = True, full: bool = False, versions: tuple[str, ...] | None = None,
                     tiny: bool = False, overrides: list[str] | None = None,
                     in_process: bool | None = None, cache_per_version: bool | None = None) -> dict[str, Any]:
    """Per-stage wall time of v1, v2 (quick) or v1..v4 (full) on the default slice, cold and warm cache."""
    clock = start()
    versions = tuple(versions or {"tiny": ("v1",), "quick": ("v1", "v2"), "full": ("v1", "v2", "v3", "v4")}[run_mode(tiny, full)])
    overrides = list(overrides or [])
    share = None if tiny else main_cache()
    in_process = tiny if in_process is None else in_process
    cache_per_version = full if cache_per_version is None else cache_per_version
    run_one = run_pipeline_inprocess if in_process else run_pipeline_subprocess
    runs: dict[str, dict[str, Any]] = {}
    with scratch_dir("e2e") as tmp:
        tmp = Path(tmp)
        if tiny and not overrides:  # a dozen abstracts: tests the benchmark code, not the figures
            overrides = tiny_dataset(tmp / "data")
        cache = None
        for v in versions:
            if cache is None or cache_per_version:
                cache = cold_cache(tmp / f"cache-{v}", share_from=share)
            # paths.seed=null: the stages' own cost, not the shipped seed's restore (benchmarks/demo.py has that)
            args = [f"+version={v}", f"paths.cache={cache}", "paths.seed=null", *overrides]
            cold = _summary(run_one(args, tmp / f"out-{v}-cold"))
            warm = _summary(run_one(args, tmp / f"out-{v}-warm"))
            runs[v] = {"cold": cold, "warm": warm}

    table = []
    for v, r in runs.items():
        cold, warm = r["cold"], r["warm"]
        if "error" in cold or "error" in warm:
            table.append(row(f"{v}", "failed", "", (cold.get("error") or warm.get("error"))[:300]))
            continue
        c = cold["counts"]
        first = v == versions[0] or cache_per_version
        label = "cold cache" if first else f"cold for its own artifacts (after {versions[0]}, same cache)"
        table.append(row(f"{v}: process wall, {label}", cold["process_wall_s"], "s",
                         f"{c.get('chunks')} chunks, {c.get('questions')} questions; "
                         f"{cold['outside_stages_s']} s outside stages (imports, config)"))
        table.append(row(f"{v}: process wall, warm cache", warm["process_wall_s"], "s",
                         f"**{ratio(warm['process_wall_s'], cold['process_wall_s'])}x cold**; "
                         f"all artifacts cached: {all(x for x in warm['artifacts_hit'].values())}"))
        for stage in STAGES:
            if stage in cold["timings_s"] or stage in warm["timings_s"]:
                table.append(row(f"{v}: stage {stage}", cold["timings_s"].get(stage), "s",
                                 f"warm {warm['timings_s'].get(stage)} s"))
    result = {"versions": list(versions), "in_process": in_process, "cache_per_version": cache_per_version,
              "runs": runs, "table": table, "environment": environment(), "cold_cache_shares": ["corpus", "cross_encoder", "onnx_model"] if share else []}
    return finish(result, clock)
