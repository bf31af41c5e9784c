"""Benchmarks of the harness itself (`make bench`).

    python -m experiments.bench --out outputs/bench                 # every benchmark
    python -m experiments.bench --list
    python -m experiments.bench --quick --repeats 5                  # warm numbers only
    python -m experiments.bench --only alpha_sweep --out outputs/bench -- corpus=jsonl corpus.path=...

Benchmarks live in a registry: a function decorated with `@benchmark("name", "what it measures")`
receives a `BenchContext` (config composition, the output directory, Hydra overrides from the
command line) and returns a dict with a `table` (rows of {measure, value, unit, note}) plus any
raw numbers. Each result is written to <out>/<name>.json; <out>/bench.md collects the tables of
the benchmarks run, <out>/results.json all of their results.

The sweep benchmarks run `python run.py` as a user does, one fresh process per command, so
imports, model loading and a multirun's summary and charts are in what they measure.
`--headline` gathers the issue's ratios (generation_speedup, generation_identical_share,
embed_speedup, alpha_sweep_ratio, grid_sweep_ratio) from this run and the families' into
results.json and headline.json (`make bench` does this last).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag.config import PROJECT_ROOT, register_resolvers

log = logging.getLogger("ragrig.bench")


@dataclass(frozen=True)
class Benchmark:
    name: str
    description: str
    fn: Callable[["BenchContext"], dict[str, Any]]


BENCHMARKS: dict[str, Benchmark] = {}


def benchmark(name: str, description: str) -> Callable[[Callable[["BenchContext"], dict[str, Any]]], Callable[["BenchContext"], dict[str, Any]]]:
    """Registers a benchmark function under `name`."""

    def wrap(fn: Callable[[BenchContext], dict[str, Any]]) -> Callable[[BenchContext], dict[str, Any]]:
        if name in BENCHMARKS:
            raise ValueError(f"benchmark {name!r} is registered twice")
        BENCHMARKS[name] = Benchmark(name, description, fn)
        return fn

    return wrap


@dataclass
class BenchContext:
    out: Path  # this benchmark's own directory under --out
    overrides: list[str] = field(default_factory=list)  # applied to every composed config
    repeats: int = 3
    quick: bool = False  # skip the expensive parts (e.g. cold-cache measurements)

    def compose(self, overrides: list[str] = ()) -> Any:
        from hydra import compose, initialize_config_dir

        register_resolvers()
        with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
            return compose(config_name="config", overrides=[*self.overrides, *overrides])

    def run(self, overrides: list[str], name: str, cache: Path | None = None) -> tuple[dict[str, Any], float]:
        """One pipeline run in this process; returns (metrics document, wall seconds)."""
        from rag.pipeline import run

        extra = [f"paths.cache={cache}"] if cache is not None else []
        cfg = self.compose([*overrides, *extra])
        t0 = time.perf_counter()
        result = run(cfg, self.out / "runs" / name)
        return result, time.perf_counter() - t0

    def fresh_cache(self, name: str, share_corpus_from: Path | None = None) -> Path:
        """An empty artifact cache under the benchmark's directory. The rendered corpora (a data
        preparation step, `make data`) are shared with `share_corpus_from` when given, so a cold
        run builds chunks, vectors and indexes but does not re-render man pages."""
        path = self.out / "caches" / name
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        if share_corpus_from is not None:
            (Path(share_corpus_from) / "corpus").mkdir(parents=True, exist_ok=True)
            os.symlink(Path(share_corpus_from).resolve() / "corpus", path / "corpus")
        return path


ALPHAS = (0.1, 0.3, 0.5, 0.7, 0.9)
ALPHA_BASE = ["retriever=hybrid", "fusion=weighted"]
# The grid runs on a smaller slice: it builds three chunkings twice (the three runs, then the
# sweep, each in an empty cache), and the ratio, not the corpus size, is what it measures.
GRID_SLICE = ["slice.docs_per_source=20", "slice.questions_per_corpus=10"]
CHUNK_SIZES = (256, 512, 1024)
GRID_ALPHAS = (0.3, 0.5, 0.7)


def _process(args: list[str], out: Path, cache: Path, overrides: list[str], multirun: bool = False) -> dict[str, Any]:
    """`python run.py [-m] ...` in a fresh process, as a user runs it: (wall seconds, metrics of
    each job, stage timings). Imports, model loading and, for a multirun, the summary and charts
    written at its end are all in the wall time."""
    import subprocess

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    where = f"hydra.sweep.dir={out}" if multirun else f"hydra.run.dir={out}"
    cmd = [sys.executable, str(PROJECT_ROOT / "run.py"), *(["-m"] if multirun else []), *overrides, *args,
           f"paths.cache={cache}", "embedder.show_progress=false", where]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(PROJECT_ROOT), check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[2:])}: exit {done.returncode}: {done.stderr.strip()[-1200:]}")
    docs = sorted(out.glob("*/metrics.json") if multirun else [out / "metrics.json"], key=lambda f: str(f))
    jobs = [json.loads(d.read_text()) for d in docs]
    return {"wall_s": round(wall, 3), "jobs": len(jobs),
            "stages_s": [j.get("timings_s", {}) for j in jobs],
            "objective": [j["objective"]["value"] for j in jobs],
            "latency_method": [j.get("latency_method") for j in jobs],
            "retrieve_ms_median": [j.get("latency", {}).get("retrieve_ms_median") for j in jobs],
            "all_cached": all(all(a.get("hit") for a in j["artifacts"].values()) for j in jobs)}


def _fresh(ctx: BenchContext, name: str, main_cache: Path) -> Path:
    """An empty cache whose rendered corpora and exported/trained models link to the main cache:
    a cold run builds chunks, vectors and indexes (the ONNX export is timed separately)."""
    from experiments.benchmarks.common import cold_cache

    return cold_cache(ctx.out / "caches" / name, share_from=main_cache)


@benchmark("alpha_sweep", "cost of a 5-point fusion.alpha sweep (python run.py -m sweep=alpha) relative to one run, cold and on a cached index")
def alpha_sweep(ctx: BenchContext) -> dict[str, Any]:
    """Both sides are what a user runs, each in a fresh process: `python run.py retriever=hybrid
    fusion=weighted fusion.alpha=0.5` against `python run.py -m sweep=alpha` (5 jobs on Hydra's
    basic launcher, then the summary and charts).

    cold: each side in its own empty artifact cache (rendered corpora and exported models shared);
          skipped with --quick.
    warm: the main cache holding every artifact (warmed by one run first); the two sides
          alternated `repeats` times (one, sweep, sweep, one, ...) and reported as medians, so that
          load from other processes hits both alike.
    """
    main_cache = Path(ctx.compose(ALPHA_BASE).paths.cache)
    out: dict[str, Any] = {"alphas": list(ALPHAS), "loadavg_start": _loadavg()}
    sweep_args = ["sweep=alpha"]
    one_args = [*ALPHA_BASE, "fusion.alpha=0.5"]
    if not ctx.quick:
        c1, c2 = _fresh(ctx, "cold-one", main_cache), _fresh(ctx, "cold-sweep", main_cache)
        one = _process(one_args, ctx.out / "runs" / "cold-one", c1, ctx.overrides)
        sweep = _process(sweep_args, ctx.out / "runs" / "cold-sweep", c2, ctx.overrides, multirun=True)
        out.update({"cold_one_s": one["wall_s"], "cold_sweep_s": sweep["wall_s"],
                    "ratio_cold": round(sweep["wall_s"] / one["wall_s"], 3),
                    "cold_one_stages_s": one["stages_s"][0], "cold_sweep_stages_s": sweep["stages_s"]})
        for c in (c1, c2):
            shutil.rmtree(c, ignore_errors=True)
    _process(one_args, ctx.out / "runs" / "warm-up", main_cache, ctx.overrides)  # builds whatever is missing
    ones, sweeps = [], []
    for i in range(max(1, ctx.repeats)):
        order = ("one", "sweep") if i % 2 == 0 else ("sweep", "one")
        for side in order:
            if side == "one":
                ones.append(_process(one_args, ctx.out / "runs" / f"warm-one-{i}", main_cache, ctx.overrides))
            else:
                sweeps.append(_process(sweep_args, ctx.out / "runs" / f"warm-sweep-{i}", main_cache, ctx.overrides,
                                       multirun=True))
    one_s = [r["wall_s"] for r in ones]
    sweep_s = [r["wall_s"] for r in sweeps]
    out.update({
        "warm_one_s": round(statistics.median(one_s), 3), "warm_one_repeats_s": one_s,
        "warm_sweep_s": round(statistics.median(sweep_s), 3), "warm_sweep_repeats_s": sweep_s,
        "ratio_warm": round(statistics.median(sweep_s) / statistics.median(one_s), 3),
        "warm_ratio_repeats": [round(b / a, 3) for a, b in zip(one_s, sweep_s)],
        "warm_sweep_all_artifacts_cached": all(r["all_cached"] for r in sweeps),
        "warm_one_stages_s": ones[-1]["stages_s"][0], "warm_sweep_stages_s": sweeps[-1]["stages_s"],
        "objective_by_alpha": dict(zip(map(str, ALPHAS), sweeps[-1]["objective"])),
        "latency_method": sweeps[-1]["latency_method"][0],
        "sweep_jobs_retrieve_ms_median": sweeps[-1]["retrieve_ms_median"],
        "loadavg_end": _loadavg(),
    })
    out["alpha_sweep_ratio"] = max(out["ratio_warm"], out.get("ratio_cold", 0.0))
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
    table += [
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
    out["table"] = table
    return out


@benchmark("grid_sweep", "cost of a 3x3 chunk size x alpha sweep relative to the three runs that build its three chunkings")
def grid_sweep(ctx: BenchContext) -> dict[str, Any]:
    """Cold, each side in its own empty cache, each command in a fresh process, on a smaller slice
    (GRID_SLICE): three runs `chunker.chunk_size=c fusion.alpha=0.5` (c = 256, 512, 1024) in a row
    against `python run.py -m sweep=chunk_alpha` (9 jobs: each chunking is built by its first job
    and reused by the next two, then the summary and charts)."""
    main_cache = Path(ctx.compose(ALPHA_BASE).paths.cache)
    c1, c2 = _fresh(ctx, "grid-runs", main_cache), _fresh(ctx, "grid-sweep", main_cache)
    runs = [_process([*ALPHA_BASE, *GRID_SLICE, f"chunker.chunk_size={c}", "fusion.alpha=0.5"],
                     ctx.out / "runs" / f"run-{c}", c1, ctx.overrides) for c in CHUNK_SIZES]
    sweep = _process(["sweep=chunk_alpha", *GRID_SLICE], ctx.out / "runs" / "grid", c2, ctx.overrides, multirun=True)
    for c in (c1, c2):
        shutil.rmtree(c, ignore_errors=True)
    runs_s = sum(r["wall_s"] for r in runs)
    out = {"runs_s": [r["wall_s"] for r in runs], "three_runs_s": round(runs_s, 3), "sweep_s": sweep["wall_s"],
           "grid_sweep_ratio": round(sweep["wall_s"] / runs_s, 3), "jobs": sweep["jobs"],
           "sweep_stages_s": sweep["stages_s"], "sweep_jobs_retrieve_ms_median": sweep["retrieve_ms_median"],
           "slice": GRID_SLICE}
    out["table"] = [
        {"measure": "three runs building chunk sizes 256/512/1024 (processes)", "value": out["three_runs_s"], "unit": "s",
         "note": f"{out['runs_s']}; slice {' '.join(GRID_SLICE)}"},
        {"measure": "3x3 chunk x alpha sweep (process)", "value": out["sweep_s"], "unit": "s", "note": "summary and charts included"},
        {"measure": "**grid_sweep_ratio**", "value": out["grid_sweep_ratio"], "unit": "x", "note": "target <= 1.1"},
        {"measure": "per-job retrieval latency median (each job measured its own)",
         "value": str(out["sweep_jobs_retrieve_ms_median"]), "unit": "ms", "note": ""},
    ]
    return out


HEADLINE_KEYS = {
    "generation_speedup": ("families", "generation_speed", "generation_speedup"),
    "generation_identical_share": ("families", "generation_speed", "generation_identical_share"),
    "embed_speedup": ("families", "onnx", "embed_speedup"),
    "alpha_sweep_ratio": ("bench", "alpha_sweep", "alpha_sweep_ratio"),
    "grid_sweep_ratio": ("bench", "grid_sweep", "grid_sweep_ratio"),
}


def headline(out: Path) -> dict[str, Any]:
    """The issue's ratios, gathered from this directory's results.json and families/results.json
    into both results.json files and headline.json (null where a benchmark did not run)."""
    bench = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
    fam_file = out / "families" / "results.json"
    families = json.loads(fam_file.read_text()).get("results", {}) if fam_file.exists() else {}
    sources = {"bench": bench, "families": families}
    heads = {}
    for key, (src, name, field_) in HEADLINE_KEYS.items():
        heads[key] = (sources[src].get(name) or {}).get(field_)
    (out / "headline.json").write_text(json.dumps(heads, indent=2))
    if bench:
        bench.update(heads)
        (out / "results.json").write_text(json.dumps(bench, indent=2, default=str))
    if fam_file.exists():
        fam = json.loads(fam_file.read_text())
        fam.update(heads)
        fam_file.write_text(json.dumps(fam, indent=2, default=str))
    return heads


# ---------------------------------------------------------------------------------------------


def _loadavg() -> list[float] | None:
    """The machine may be shared: timings are only comparable at similar load."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine(),
                           "cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                           "loadavg_1_5_15": _loadavg()}
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return env


def markdown(results: dict[str, dict[str, Any]], env: dict[str, Any], overrides: list[str]) -> str:
    lines = ["# ragrig benchmarks", "",
             f"{env.get('time')} · Python {env.get('python')} · {env.get('cpus')} CPUs · torch {env.get('torch', '-')}"
             f" · load average {env.get('loadavg_1_5_15')}"
             + (f" · overrides: `{' '.join(overrides)}`" if overrides else ""), ""]
    for name, res in results.items():
        lines += [f"## {name}", "", BENCHMARKS[name].description + ".", ""]
        if "error" in res:
            lines += [f"failed: `{res['error']}`", ""]
            continue
        lines += ["| measure | value | unit | note |", "|---|---:|---|---|"]
        for row in res.get("table", []):
            v = row["value"]
            v = f"{v:.3f}" if isinstance(v, float) else str(v)
            lines.append(f"| {row['measure']} | {v} | {row.get('unit', '')} | {row.get('note', '')} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench", description=__doc__.strip().splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "outputs" / "bench")
    parser.add_argument("--only", action="append", default=None, metavar="NAME",
                        help="run only this benchmark (repeatable); default: all")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each timed measurement (median)")
    parser.add_argument("--quick", action="store_true", help="skip expensive parts (cold-cache measurements)")
    parser.add_argument("--headline", action="store_true",
                        help="only gather the issue's ratios from --out's results into results.json and headline.json")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every composed config (after --)")
    args = parser.parse_args(argv)

    if args.headline:
        print(json.dumps(headline(args.out), indent=2))
        return 0
    if args.list:
        for b in BENCHMARKS.values():
            print(f"{b.name:<20} {b.description}")
        return 0
    names = args.only or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"bench: unknown benchmark(s) {unknown}; known: {sorted(BENCHMARKS)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    problem = _check_setup(args.out, list(args.overrides))
    if problem:
        print(f"bench: error: {problem}", file=sys.stderr)
        return 2
    done: list[str] = []
    try:
        results = _run_all(args, names, done)
    except KeyboardInterrupt:
        print(f"bench: interrupted; finished: {', '.join(done) or 'none'} (their <name>.json are complete; "
              "results.json and bench.md were not written)", file=sys.stderr)
        return 130
    return 1 if any("error" in r for r in results.values()) else 0


def _check_setup(out: Path, overrides: list[str]) -> str | None:
    """The output directory and the overrides, checked before any benchmark spends minutes: one
    line naming the problem, or None."""
    from rag.config import config_error_line, is_config_error
    from rag.schema import validate
    from rag.types import RagError

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"--out {out}: {e.strerror}"
    try:
        validate(BenchContext(out=out, overrides=overrides).compose())
    except RagError as e:
        return str(e)
    except Exception as e:
        if not is_config_error(e):
            raise
        return config_error_line(e)
    return None


def _run_all(args: argparse.Namespace, names: list[str], done: list[str]) -> dict[str, dict[str, Any]]:
    from rag.cache import atomic_write_text

    env = _environment()
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        ctx = BenchContext(out=args.out / name, overrides=list(args.overrides), repeats=args.repeats, quick=args.quick)
        ctx.out.mkdir(parents=True, exist_ok=True)
        print(f"bench {name}: {BENCHMARKS[name].description}", flush=True)
        t0 = time.perf_counter()
        load_start = _loadavg()
        try:
            res = BENCHMARKS[name].fn(ctx)
        except Exception as e:  # one broken benchmark does not lose the others' numbers
            log.exception("benchmark %s failed", name)
            res = {"error": f"{type(e).__name__}: {e}"}
        res["wall_s"] = round(time.perf_counter() - t0, 3)
        res["loadavg_start"], res["loadavg_end"] = load_start, _loadavg()
        res["overrides"] = list(args.overrides)
        res["environment"] = env
        results[name] = res
        atomic_write_text(args.out / f"{name}.json", json.dumps(res, indent=2, default=str))
        done.append(name)
        for row in res.get("table", []):
            print(f"  {row['measure']:<55} {row['value']:>10} {row.get('unit', '')}")
    atomic_write_text(args.out / "results.json", json.dumps(results, indent=2, default=str))
    atomic_write_text(args.out / "bench.md", markdown(results, env, list(args.overrides)))
    headline(args.out)
    print(f"wrote {args.out / 'bench.md'}")
    return results


if __name__ == "__main__":
    sys.exit(main())
