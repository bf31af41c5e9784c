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

Everything runs in this one process, calling rag.pipeline.run with configs composed by Hydra's
compose API, so in-process effects (loaded models, memoized candidates) are what a sweep on the
basic launcher sees.
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


def _clear_memo() -> None:
    try:
        from rag.retrieval import clear_memo
    except ImportError:  # an older retriever without in-process memoization
        return
    clear_memo()


def _preload_models(ctx: BenchContext, overrides: list[str]) -> float:
    """Loads the pipeline's and the evaluator's embedders once, so no measurement below pays for
    loading model weights (every measured run finds them in the process, as a sweep's jobs do)."""
    from hydra.utils import instantiate

    cfg = ctx.compose(overrides)
    t0 = time.perf_counter()
    for node in (cfg.embedder, cfg.eval.embedder):
        emb = instantiate(node, _convert_="all")
        emb.encode(["warm-up"], show_progress=False)
        if hasattr(emb, "encode_queries"):
            emb.encode_queries(["warm-up"])
    return time.perf_counter() - t0


ALPHAS = (0.1, 0.3, 0.5, 0.7, 0.9)


@benchmark("alpha_sweep", "cost of a 5-point fusion.alpha sweep relative to one run, cold and on a cached index")
def alpha_sweep(ctx: BenchContext) -> dict[str, Any]:
    """retriever=hybrid fusion=weighted, alpha in 0.1..0.9, all in this process.

    cold: an empty artifact cache (corpus renderings shared): one run at alpha 0.5; then, in
          another empty cache, the 5-point sweep. Skipped with --quick.
    warm: a cache holding every artifact (the cold one, or with --quick the configured cache,
          warmed by one run first): one run at alpha 0.5 and the sweep, alternated `repeats`
          times and reported as medians, so that load from other processes hits both alike.
    The in-process candidate memo is cleared before each measurement, so a 'one run' searches
    from scratch and a sweep's later jobs reuse what its first job searched, as the jobs of a
    multirun on Hydra's basic launcher do.
    """
    base = ["retriever=hybrid", "fusion=weighted"]
    main_cache = Path(ctx.compose(base).paths.cache)
    model_s = _preload_models(ctx, base)

    def one(cache: Path, tag: str) -> tuple[float, dict[str, Any]]:
        _clear_memo()
        result, s = ctx.run(base + ["fusion.alpha=0.5"], tag, cache)
        return s, result

    def sweep(cache: Path, tag: str) -> tuple[float, list[float], list[dict[str, Any]]]:
        _clear_memo()
        per, results = [], []
        t0 = time.perf_counter()
        for a in ALPHAS:
            result, s = ctx.run(base + [f"fusion.alpha={a}"], f"{tag}-alpha{a}", cache)
            per.append(s)
            results.append(result)
        return time.perf_counter() - t0, per, results

    out: dict[str, Any] = {"alphas": list(ALPHAS), "model_load_s": round(model_s, 3)}
    scratch: list[Path] = []
    if ctx.quick:
        warm_cache = main_cache
        one(warm_cache, "warm-up")  # builds whatever is missing
    else:
        warm_cache = ctx.fresh_cache("cold-one", share_corpus_from=main_cache)
        cold_b = ctx.fresh_cache("cold-sweep", share_corpus_from=main_cache)
        scratch += [warm_cache, cold_b]
        cold_one_s, first = one(warm_cache, "cold-one")
        cold_sweep_s, cold_per, _ = sweep(cold_b, "cold-sweep")
        out.update({
            "cold_one_s": round(cold_one_s, 3),
            "cold_sweep_s": round(cold_sweep_s, 3),
            "cold_sweep_per_job_s": [round(s, 3) for s in cold_per],
            "ratio_cold": round(cold_sweep_s / cold_one_s, 3),
            "cold_one_stages_s": first.get("timings_s", {}),
        })

    ones, sweeps, per_jobs, results = [], [], [], []
    for i in range(max(1, ctx.repeats)):
        s1, results_one = one(warm_cache, f"warm-one-{i}")
        s5, per, results = sweep(warm_cache, f"warm-sweep-{i}")
        ones.append(s1)
        sweeps.append(s5)
        per_jobs.append(per)
    for c in scratch:  # benchmark caches are scratch (the corpus link is removed, not followed)
        shutil.rmtree(c, ignore_errors=True)

    warm_one_s, warm_sweep_s = statistics.median(ones), statistics.median(sweeps)
    out.update({
        "warm_one_s": round(warm_one_s, 3),
        "warm_one_repeats_s": [round(s, 3) for s in ones],
        "warm_sweep_s": round(warm_sweep_s, 3),
        "warm_sweep_repeats_s": [round(s, 3) for s in sweeps],
        "warm_sweep_per_job_s": [[round(s, 3) for s in per] for per in per_jobs],
        "ratio_warm": round(warm_sweep_s / warm_one_s, 3),
        "warm_ratio_repeats": [round(b / a, 3) for a, b in zip(ones, sweeps)],
        "warm_sweep_all_artifacts_cached": all(all(a.get("hit") for a in r["artifacts"].values()) for r in results),
        "warm_one_stages_s": results_one.get("timings_s", {}),
        "counts": results_one.get("counts", {}),
        "objective_by_alpha": {str(a): r["objective"]["value"] for a, r in zip(ALPHAS, results)},
    })
    if "cold_one_s" in out:
        out["warm_sweep_vs_one_cold"] = round(warm_sweep_s / out["cold_one_s"], 3)

    n = len(ALPHAS)
    table = []
    if "cold_one_s" in out:
        table += [
            {"measure": "one run, cold cache", "value": out["cold_one_s"], "unit": "s",
             "note": "builds chunks, vectors, indexes (corpus rendering cached)"},
            {"measure": f"{n}-point alpha sweep, cold cache", "value": out["cold_sweep_s"], "unit": "s",
             "note": "the first job builds, the others reuse"},
            {"measure": "cold ratio: sweep / one run", "value": out["ratio_cold"], "unit": "x",
             "note": f"{n} independent cold runs would be {n}x"},
        ]
    reps = len(ones)
    table += [
        {"measure": "one run, cached index", "value": out["warm_one_s"], "unit": "s", "note": f"median of {reps}"},
        {"measure": f"{n}-point alpha sweep, cached index", "value": out["warm_sweep_s"], "unit": "s",
         "note": f"median of {reps}"},
        {"measure": "**alpha-sweep cost ratio** (warm): sweep / one run", "value": out["ratio_warm"], "unit": "x",
         "note": f"{n}x = nothing shared between jobs; per repeat {out['warm_ratio_repeats']}"},
    ]
    if "warm_sweep_vs_one_cold" in out:
        table.append({"measure": "warm sweep / one cold run", "value": out["warm_sweep_vs_one_cold"], "unit": "x",
                      "note": "a whole sweep on a cached index vs building the index once"})
    table.append({"measure": "model loading (excluded above)", "value": out["model_load_s"], "unit": "s", "note": ""})
    out["table"] = table
    return out


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
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every composed config (after --)")
    args = parser.parse_args(argv)

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
    print(f"wrote {args.out / 'bench.md'}")
    return results


if __name__ == "__main__":
    sys.exit(main())
