"""Runs the benchmarks (`make bench` runs this three times: the sweeps, the families, --headline).

    python -m benchmarks                      # quick: the families but the opt-in ones, < 30 min on 2 cores
    python -m benchmarks --full               # + 1M FAISS/HNSW, v3/v4, longer encodes, Ray
    python -m benchmarks --only bm25 --only faiss --out outputs/bench/families
    python -m benchmarks --only alpha_sweep --only grid_sweep --out outputs/bench
    python -m benchmarks --only alpha_sweep -- corpus=jsonl corpus.path=...   # overrides
    python -m benchmarks --headline --out outputs/bench
    python -m benchmarks --list

Writes <out>/<name>.json per family, <out>/results.json and <out>/bench.md (tables). --headline
gathers the headline figures (HEADLINE_KEYS) from <out>/results.json (the sweeps) and
<out>/families/results.json into both files and <out>/headline.json.
"""
from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import OPT_IN, REGISTRY, SWEEPS, describe
from benchmarks.common import environment, loadavg
from rag.store.atomic import atomic_write_text
from rag.config.compose import PROJECT_ROOT

log = logging.getLogger("ragrig.benchmarks")


def markdown(results: dict[str, dict[str, Any]], env: dict[str, Any], mode: str) -> str:
    header = (f"{env['time']} · {mode} · Python {env['python']} · {env['cpus']} CPUs · load average at start "
              f"{env['loadavg_1_5_15']} · torch {env.get('torch')} · faiss {env.get('faiss')} · "
              f"onnxruntime {env.get('onnxruntime')}")
    lines = ["# ragrig benchmark families", "", header, ""]
    for name, res in results.items():
        lines += [f"## {name}", "", describe(name), ""]
        if "error" in res and "table" not in res:
            lines += [f"failed: `{res['error']}`", ""]
            continue
        stamp = (f"wall {res.get('wall_s')} s · CPU {res.get('cpu_s')} s · load average {res.get('loadavg_start')} -> "
                 f"{res.get('loadavg_end')}")
        lines += [stamp, "", "| measure | value | unit | note |", "|---|---:|---|---|"]
        for r in res.get("table", []):
            lines.append(f"| {r['measure']} | {r['value']} | {r.get('unit', '')} | {r.get('note', '')} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks")
    ap.add_argument("--full", action="store_true", help="include the long cases")
    ap.add_argument("--only", action="append", choices=sorted(REGISTRY), help="run only this family (repeatable)")
    ap.add_argument("--out", type=Path, default=PROJECT_ROOT / "outputs" / "bench" / "families")
    ap.add_argument("--list", action="store_true", help="list the families and exit")
    ap.add_argument("--headline", action="store_true",
                    help="only gather the headline ratios under --out into results.json and headline.json")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for the families that compose configs (after --)")
    args = ap.parse_args(argv)
    if args.list:
        for name in REGISTRY:
            print(f"{name:<20} {describe(name)}")
        return 0
    if args.headline:
        print(json.dumps(headline(args.out), indent=2))
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    problem = check_setup(args.out, args.overrides)
    if problem:
        print(f"benchmarks: error: {problem}", file=sys.stderr)
        return 2
    names = args.only or [n for n in REGISTRY if n not in SWEEPS and (args.full or n not in OPT_IN)]
    done: list[str] = []
    try:
        return _run(args, names, done)
    except KeyboardInterrupt:
        print(f"benchmarks: interrupted; finished: {', '.join(done) or 'none'} (their <name>.json are complete; "
              "results.json and bench.md were not written)", file=sys.stderr)
        return 130


def check_setup(out: Path, overrides: list[str]) -> str | None:
    """The output directory, and the overrides when there are any, checked before a benchmark
    spends minutes: one line naming the problem, or None. (Without overrides nothing is composed:
    the generation family runs where Hydra is not installed.)"""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"--out {out}: {e.strerror}"
    if not overrides:
        return None
    from benchmarks.common import compose
    from rag.config.compose import config_error_line, is_config_error
    from rag.run.settings import validate
    from rag.types import RagError

    try:
        validate(compose(overrides))
    except RagError as e:
        return str(e)
    except Exception as e:
        if not is_config_error(e):
            raise
        return config_error_line(e)
    return None


def family_kwargs(fn: Any, args: argparse.Namespace, name: str) -> dict[str, Any]:
    """What the command line hands a family beyond quick/full: the overrides and its work
    directory, to the families that take them."""
    params = inspect.signature(fn).parameters
    extra = {"overrides": list(args.overrides) or None, "work_dir": args.out / name}
    return {k: v for k, v in extra.items() if k in params and v is not None}


def _run(args: argparse.Namespace, names: list[str], done: list[str]) -> int:
    env = environment()
    results: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    for name in names:
        print(f"[{time.strftime('%H:%M:%S')}] {name}: {describe(name)} (load {loadavg()})", flush=True)
        try:
            fn = REGISTRY[name]
            res = fn(quick=not args.full, full=args.full, **family_kwargs(fn, args, name))
        except Exception as e:  # one failing family does not lose the others
            log.exception("benchmark %s failed", name)
            res = {"error": f"{type(e).__name__}: {e}"}
        results[name] = res
        atomic_write_text(args.out / f"{name}.json", json.dumps(res, indent=2, default=str))
        done.append(name)
        for r in res.get("table", []):
            print(f"  {r['measure']:<70} {r['value']!s:>12} {r.get('unit', '')}  {r.get('note', '')}", flush=True)
        print(f"  ({res.get('wall_s', '?')} s)", flush=True)
    mode = "full" if args.full else "quick"
    summary = {"mode": mode, "total_wall_s": round(time.perf_counter() - t0, 1),
               "loadavg_end": loadavg(), "environment": env, "results": results}
    atomic_write_text(args.out / "results.json", json.dumps(summary, indent=2, default=str))
    atomic_write_text(args.out / "bench.md", markdown(results, env, mode) +
                      f"\nTotal wall time: {summary['total_wall_s']} s\n")
    print(f"total {summary['total_wall_s']} s; wrote {args.out / 'bench.md'}")
    return 1 if any("error" in r and "table" not in r for r in results.values()) else 0


HEADLINE_KEYS = {  # key -> (results.json under --out: the sweeps', or families/results.json; family; key)
    "generation_speedup": ("families", "generation_speed", "generation_speedup"),
    "generation_identical_share": ("families", "generation_speed", "generation_identical_share"),
    # llm=openvino (int8, OpenVINO GenAI) against llm=smollm2 (fp32, torch), same decoding
    "generation_speedup_openvino": ("families", "openvino_generation", "generation_speedup_openvino"),
    "openvino_identical_share": ("families", "openvino_generation", "openvino_identical_share"),
    "embed_speedup": ("families", "onnx", "embed_speedup"),
    "alpha_sweep_ratio": ("sweeps", "alpha_sweep", "alpha_sweep_ratio"),
    "grid_sweep_ratio": ("sweeps", "grid_sweep", "grid_sweep_ratio"),
    "demo_cold_s": ("sweeps", "demo", "demo_cold_s"),
    "demo_warm_s": ("sweeps", "demo", "demo_warm_s"),
    "rerank_ms_per_question": ("sweeps", "demo", "rerank_ms_per_question"),
}


def headline(out: Path) -> dict[str, Any]:
    """The headline ratios, gathered from <out>/results.json and <out>/families/results.json into
    both files and <out>/headline.json (null where a benchmark did not run)."""
    files = {"sweeps": out / "results.json", "families": out / "families" / "results.json"}
    docs = {src: json.loads(f.read_text()) if f.exists() else None for src, f in files.items()}
    # results.json written before the sweeps became families holds the results at its top level
    results = {src: (doc or {}).get("results", doc or {}) for src, doc in docs.items()}
    heads = {key: (results[src].get(name) or {}).get(field) for key, (src, name, field) in HEADLINE_KEYS.items()}
    atomic_write_text(out / "headline.json", json.dumps(heads, indent=2))
    for src, doc in docs.items():
        if doc:
            atomic_write_text(files[src], json.dumps({**doc, **heads}, indent=2, default=str))
    return heads


if __name__ == "__main__":
    from rag.config.cli import run_cli  # a reader that goes away (| head -1) costs no traceback

    run_cli(main)
