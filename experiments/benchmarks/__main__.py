"""Runs the benchmark families on their own (experiments/bench.py wires them into `make bench`).

    python -m experiments.benchmarks                      # quick: every family but ray_encoding, < 30 min on 2 cores
    python -m experiments.benchmarks --full               # + 1M FAISS/HNSW, v3/v4, longer encodes, Ray
    python -m experiments.benchmarks --only bm25 --only faiss --out outputs/bench/families

Writes <out>/<name>.json per family, <out>/results.json and <out>/bench.md (tables).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from experiments.benchmarks import OPT_IN, REGISTRY, describe
from experiments.benchmarks.common import environment, loadavg
from rag.cache import atomic_write_text
from rag.config import PROJECT_ROOT

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
    ap = argparse.ArgumentParser(prog="python -m experiments.benchmarks")
    ap.add_argument("--full", action="store_true", help="include the long cases")
    ap.add_argument("--only", action="append", choices=sorted(REGISTRY), help="run only this family (repeatable)")
    ap.add_argument("--out", type=Path, default=PROJECT_ROOT / "outputs" / "bench" / "families")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"benchmarks: error: --out {args.out}: {e.strerror}", file=sys.stderr)
        return 2
    names = args.only or [n for n in REGISTRY if args.full or n not in OPT_IN]
    done: list[str] = []
    try:
        return _run(args, names, done)
    except KeyboardInterrupt:
        print(f"benchmarks: interrupted; finished: {', '.join(done) or 'none'} (their <name>.json are complete; "
              "results.json and bench.md were not written)", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace, names: list[str], done: list[str]) -> int:
    env = environment()
    results: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    for name in names:
        print(f"[{time.strftime('%H:%M:%S')}] {name}: {describe(name)} (load {loadavg()})", flush=True)
        try:
            res = REGISTRY[name](quick=not args.full, full=args.full)
        except Exception as e:  # one failing family does not lose the others
            log.exception("benchmark %s failed", name)
            res = {"error": f"{type(e).__name__}: {e}"}
        results[name] = res
        atomic_write_text(args.out / f"{name}.json", json.dumps(res, indent=2, default=str))
        done.append(name)
        for r in res.get("table", []):
            print(f"  {r['measure']:<70} {r['value']!s:>12} {r.get('unit', '')}  {r.get('note', '')}", flush=True)
        print(f"  ({res.get('wall_s', '?')} s)", flush=True)
    summary = {"mode": "full" if args.full else "quick", "total_wall_s": round(time.perf_counter() - t0, 1),
               "loadavg_end": loadavg(), "environment": env, "results": results}
    atomic_write_text(args.out / "results.json", json.dumps(summary, indent=2, default=str))
    atomic_write_text(args.out / "bench.md", markdown(results, env, summary["mode"]) +
                      f"\nTotal wall time: {summary['total_wall_s']} s\n")
    print(f"total {summary['total_wall_s']} s; wrote {args.out / 'bench.md'}")
    return 1 if any("error" in r and "table" not in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
