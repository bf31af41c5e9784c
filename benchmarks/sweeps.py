"""Sweep costs: what a Hydra sweep costs against the single runs it replaces, each side a
`python run.py` process as a user runs it, so imports, model loading and a multirun's summary and
charts are in what is measured.

- alpha_sweep: a 5-point `sweep=alpha` against one run, cold (each side in its own empty cache)
  and warm (on the main cache, the sides alternated): **alpha_sweep_ratio**, the worse of the two.
- grid_sweep: a 3x3 `sweep=chunk_alpha` against the three runs that build its chunkings, cold, on
  a smaller slice: **grid_sweep_ratio**.

Neither is in a plain `python -m benchmarks` (see SWEEPS); `make bench` runs them
first, into outputs/bench.
"""
from __future__ import annotations

import shutil
import statistics
from pathlib import Path
from typing import Any

from benchmarks.common import (
    cold_cache,
    compose,
    finish,
    run_py,
    scratch_dir,
    start,
    tiny_dataset,
)
from rag.run.result import RunResult

ALPHAS = (0.1, 0.3, 0.5, 0.7, 0.9)
ALPHA_BASE = ["retriever=hybrid", "fusion=weighted"]
# The grid runs on a smaller slice: it builds three chunkings twice (the three runs, then the
# sweep, each in an empty cache), and the ratio, not the corpus size, is what it measures.
GRID_SLICE = ["slice.docs_per_source=20", "slice.questions_per_corpus=10"]
CHUNK_SIZES = (256, 512, 1024)


def run_process(args: list[str], out: Path, cache: Path, overrides: list[str], multirun: bool = False,
                seed: bool = False) -> dict[str, Any]:
    """`python run.py [-m] ...` in a fresh process: wall seconds, and per job its stage timings,
    objective, latency method, retrieval latency and whether every artifact came from the cache.
    Raises when the command fails (a sweep benchmark without its runs has nothing to report).
    `seed`: whether the cache may restore from the shipped seed; by default not, since a sweep's
    cost is what its stages compute (the demo's time is what a new user waits, seed included)."""
    where = f"hydra.sweep.dir={out}" if multirun else f"hydra.run.dir={out}"
    argv = [*(["-m"] if multirun else []), *overrides, *args, f"paths.cache={cache}", "embedder.show_progress=false",
            where]
    if not seed and not any(a.startswith("paths.seed=") for a in [*overrides, *args]):
        argv.append("paths.seed=null")
    done, wall = run_py(argv, env={"TRANSFORMERS_OFFLINE": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()[-1200:]}")
    docs = sorted(out.glob("*/metrics.json") if multirun else [out / "metrics.json"], key=lambda f: str(f))
    jobs = [RunResult.read(d) for d in docs]
    return {"wall_s": round(wall, 3), "jobs": len(jobs),
            "stages_s": [j.timings_s for j in jobs],
            "objective": [j.objective.value for j in jobs],
            "latency_method": [j.latency_method for j in jobs],
            "retrieve_ms_median": [j.latency.get("retrieve_ms_median") for j in jobs],
            "all_cached": all(all(a.get("hit") for a in j.artifacts.values()) for j in jobs)}


def _setup(tiny: bool, overrides: list[str] | None, work_dir: Path | None, tmp: Path) -> tuple[list[str], Path, Path]:
    """(overrides, work directory, main cache). tiny: a dozen abstracts, and everything (the
    main cache too) under a scratch directory."""
    overrides = list(overrides or [])
    if tiny and not overrides:  # tests the benchmark code, not the figures
        overrides = tiny_dataset(tmp / "data")
    work = Path(work_dir) if work_dir is not None else tmp
    main_cache = tmp / "cache" if tiny else Path(compose([*overrides, *ALPHA_BASE]).paths.cache)
    return overrides, work, main_cache


def bench_alpha_sweep(quick: bool = True, full: bool = False, tiny: bool = False, repeats: int | None = None,
                      cold: bool | None = None, overrides: list[str] | None = None,
                      work_dir: Path | None = None) -> dict[str, Any]:
    """Cost of a 5-point fusion.alpha sweep (python run.py -m sweep=alpha) relative to one run,
    cold and on a cached index.

    Both sides are what a user runs, each in a fresh process: `python run.py retriever=hybrid
    fusion=weighted fusion.alpha=0.5` against `python run.py -m sweep=alpha` (5 jobs on Hydra's
    basic launcher, then the summary and charts). cold: each side in its own empty artifact cache
    (rendered corpora and exported models shared); not with tiny. warm: the main cache holding
    every artifact (warmed by one run first); the two sides alternated `repeats` times (one,
    sweep, sweep, one, ...) and reported as medians, so that load from other processes hits both
    alike. quick and full measure the same (the whole benchmark fits `make bench`)."""
    clock = start()
    repeats = repeats or (1 if tiny else 3)
    cold = not tiny if cold is None else cold
    with scratch_dir("alpha-sweep") as tmp:
        overrides, work, main_cache = _setup(tiny, overrides, work_dir, tmp)
        out: dict[str, Any] = {"alphas": list(ALPHAS), "overrides": overrides}
        if cold:
            out.update(_alpha_cold(work, main_cache, overrides))
        out.update(_alpha_warm(work, main_cache, overrides, repeats))
    out["alpha_sweep_ratio"] = max(out["ratio_warm"], out.get("ratio_cold", 0.0))
    out["table"] = _alpha_table(out)
    return finish(out, clock)


SWEEP_ARGS = ["sweep=alpha"]
ONE_ARGS = [*ALPHA_BASE, "fusion.alpha=0.5"]


def _alpha_cold(work: Path, main_cache: Path, overrides: list[str]) -> dict[str, Any]:
    c1 = cold_cache(work / "caches" / "cold-one", share_from=main_cache)
    c2 = cold_cache(work / "caches" / "cold-sweep", share_from=main_cache)
    one = run_process(ONE_ARGS, work / "runs" / "cold-one", c1, overrides)
    sweep = run_process(SWEEP_ARGS, work / "runs" / "cold-sweep", c2, overrides, multirun=True)
    for c in (c1, c2):
        shutil.rmtree(c, ignore_errors=True)
    return {"cold_one_s": one["wall_s"], "cold_sweep_s": sweep["wall_s"],
            "ratio_cold": round(sweep["wall_s"] / one["wall_s"], 3),
            "cold_one_stages_s": one["stages_s"][0], "cold_sweep_stages_s": sweep["stages_s"]}


def _alpha_warm(work: Path, main_cache: Path, overrides: list[str], repeats: int) -> dict[str, Any]:
    run_process(ONE_ARGS, work / "runs" / "warm-up", main_cache, overrides)  # builds whatever is missing
    ones, sweeps = [], []
    for i in range(max(1, repeats)):
        for side in (("one", "sweep") if i % 2 == 0 else ("sweep", "one")):
            if side == "one":
                ones.append(run_process(ONE_ARGS, work / "runs" / f"warm-one-{i}", main_cache, overrides))
            else:
                sweeps.append(run_process(SWEEP_ARGS, work / "runs" / f"warm-sweep-{i}", main_cache, overrides,
                                          multirun=True))
    one_s = [r["wall_s"] for r in ones]
    sweep_s = [r["wall_s"] for r in sweeps]
    return {
        "warm_one_s": round(statistics.median(one_s), 3), "warm_one_repeats_s": one_s,
        "warm_sweep_s": round(statistics.median(sweep_s), 3), "warm_sweep_repeats_s": sweep_s,
        "ratio_warm": round(statistics.median(sweep_s) / statistics.median(one_s), 3),
        "warm_ratio_repeats": [round(b / a, 3) for a, b in zip(one_s, sweep_s)],
        "warm_sweep_all_artifacts_cached": all(r["all_cached"] for r in sweeps),
        "warm_one_stages_s": ones[-1]["stages_s"][0], "warm_sweep_stages_s": sweeps[-1]["stages_s"],
        "objective_by_alpha": dict(zip(map(str, ALPHAS), sweeps[-1]["objective"])),
        "latency_method": sweeps[-1]["latency_method"][0],
        "sweep_jobs_retrieve_ms_median": sweeps[-1]["retrieve_ms_median"],
    }


def _alpha_table(out: dict[str, Any]) -> list[dict[str, Any]]:
    n = len(ALPHAS)
    table = []
    if "cold_one_s" in out:
        table += [
            {"measure": "one run, cold cache (process)", "value": out["cold_one_s"], "unit": "s",
             "note": "builds chunks, vectors, indexes"},
            {"measure": f"{n}-point alpha sweep, cold cache (process)", "value": out["cold_sweep_s"], "unit": "s",
             "note": "the first job builds, the others reuse; summary and charts included"},
            {"measure": "cold ratio: sweep / one run", "value": out["ratio_cold"], "unit": "x", "note": "target <= 1.15"},
        ]
    one_s, sweep_s = out["warm_one_repeats_s"], out["warm_sweep_repeats_s"]
    return table + [
        {"measure": "one run, cached index (process)", "value": out["warm_one_s"], "unit": "s",
         "note": f"median of {len(one_s)}: {one_s}"},
        {"measure": f"{n}-point alpha sweep, cached index (process)", "value": out["warm_sweep_s"], "unit": "s",
         "note": f"median of {len(sweep_s)}: {sweep_s}"},
        {"measure": "warm ratio: sweep / one run", "value": out["ratio_warm"], "unit": "x",
         "note": f"target <= 1.15; per repeat {out['warm_ratio_repeats']}"},
        {"measure": "**alpha_sweep_ratio** (worse of cold and warm)", "value": out["alpha_sweep_ratio"], "unit": "x", "note": ""},
        {"measure": "per-job retrieval latency median (each job measured its own)",
         "value": str(out["sweep_jobs_retrieve_ms_median"]), "unit": "ms", "note": str(out["latency_method"])},
    ]


def bench_grid_sweep(quick: bool = True, full: bool = False, tiny: bool = False, overrides: list[str] | None = None,
                     work_dir: Path | None = None) -> dict[str, Any]:
    """Cost of a 3x3 chunk size x alpha sweep relative to the three runs that build its three
    chunkings.

    Cold, each side in its own empty cache, each command in a fresh process, on a smaller slice
    (GRID_SLICE): three runs `chunker.chunk_size=c fusion.alpha=0.5` (c = 256, 512, 1024) in a row
    against `python run.py -m sweep=chunk_alpha` (9 jobs: each chunking is built by its first job
    and reused by the next two, then the summary and charts)."""
    clock = start()
    with scratch_dir("grid-sweep") as tmp:
        overrides, work, main_cache = _setup(tiny, overrides, work_dir, tmp)
        c1 = cold_cache(work / "caches" / "grid-runs", share_from=main_cache)
        c2 = cold_cache(work / "caches" / "grid-sweep", share_from=main_cache)
        runs = [run_process([*ALPHA_BASE, *GRID_SLICE, f"chunker.chunk_size={c}", "fusion.alpha=0.5"],
                            work / "runs" / f"run-{c}", c1, overrides) for c in CHUNK_SIZES]
        sweep = run_process(["sweep=chunk_alpha", *GRID_SLICE], work / "runs" / "grid", c2, overrides, multirun=True)
        for c in (c1, c2):
            shutil.rmtree(c, ignore_errors=True)
    runs_s = sum(r["wall_s"] for r in runs)
    out = {"runs_s": [r["wall_s"] for r in runs], "three_runs_s": round(runs_s, 3), "sweep_s": sweep["wall_s"],
           "grid_sweep_ratio": round(sweep["wall_s"] / runs_s, 3), "jobs": sweep["jobs"],
           "sweep_stages_s": sweep["stages_s"], "sweep_jobs_retrieve_ms_median": sweep["retrieve_ms_median"],
           "slice": GRID_SLICE, "overrides": overrides}
    out["table"] = [
        {"measure": "three runs building chunk sizes 256/512/1024 (processes)", "value": out["three_runs_s"], "unit": "s",
         "note": f"{out['runs_s']}; slice {' '.join(GRID_SLICE)}"},
        {"measure": "3x3 chunk x alpha sweep (process)", "value": out["sweep_s"], "unit": "s", "note": "summary and charts included"},
        {"measure": "**grid_sweep_ratio**", "value": out["grid_sweep_ratio"], "unit": "x", "note": "target <= 1.1"},
        {"measure": "per-job retrieval latency median (each job measured its own)",
         "value": str(out["sweep_jobs_retrieve_ms_median"]), "unit": "ms", "note": ""},
    ]
    return finish(out, clock)
