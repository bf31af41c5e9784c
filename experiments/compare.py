"""Rebuild the tables and charts of any set of runs.

    python -m experiments.compare RUN_DIR [RUN_DIR...] [--out DIR] [--baseline v1]

A RUN_DIR is any directory holding metrics.json (a run), a sweep directory, or any parent of
runs (e.g. outputs/runs or outputs/multirun/2025-01-31): every run below it is included, runs
from different days and sweeps mixed freely. Writes summary.csv, comparison.csv, summary.md,
charts/ and report.html into --out (default: a new directory outputs/compare/<timestamp>), and
prints the verdict, the headline table and the paths.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from experiments.aggregate import load_records
from experiments.report import ReportSettings, build_report

DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "outputs" / "compare"


def default_out(root: Path = DEFAULT_ROOT) -> Path:
    base = root / time.strftime("%Y-%m-%d_%H-%M-%S")
    out, i = base, 1
    while out.exists():
        out = base.with_name(f"{base.name}-{i}")
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.compare", description=__doc__.strip().splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog="\n".join(__doc__.strip().splitlines()[3:]),
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run directories, sweep directories or their parents")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: outputs/compare/<timestamp>)")
    parser.add_argument("--baseline", default=None,
                        help="run to compare against: a label, variant or job number (default: v1 if present, else the first run)")
    parser.add_argument("--formats", default="png,svg", help="chart formats, comma-separated (default: png,svg)")
    parser.add_argument("--no-charts", action="store_true", help="tables only")
    parser.add_argument("--resamples", type=int, default=None,
                        help="paired-bootstrap resamples (default: the baseline run's eval.bootstrap.resamples)")
    parser.add_argument("--seed", type=int, default=None, help="paired-bootstrap seed (default: the baseline run's)")
    parser.add_argument("--title", default="Run comparison")
    parser.add_argument("--no-html", action="store_true", help="no report.html")
    parser.add_argument("--max-context-chars", type=int, default=1200,
                        help="report.html: longest context text kept, around its matching span (default: 1200)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    try:
        records = load_records(args.runs)
    except FileNotFoundError as e:
        print(f"compare: error: {e}", file=sys.stderr)
        return 2
    if not records:
        print("compare: error: no runs (metrics.json or failure.json) under " + ", ".join(map(str, args.runs)),
              file=sys.stderr)
        return 1
    out = args.out or default_out()
    settings = ReportSettings(
        baseline=args.baseline,
        formats=tuple(f.strip() for f in args.formats.split(",") if f.strip()),
        charts=not args.no_charts,
        resamples=args.resamples,
        seed=args.seed,
        title=args.title,
        html=not args.no_html,
        max_context_chars=args.max_context_chars,
    )
    source = "Runs: " + ", ".join(f"`{p}`" for p in args.runs)
    rep = build_report(records, out, settings, source=source)
    n_failed = int((rep.frame["status"] != "ok").sum())
    print(f"{len(rep.frame)} runs ({n_failed} failed), baseline {rep.baseline}")
    for f in rep.files:
        print(f"  {f}")
    print(rep.terminal())
    return 0


if __name__ == "__main__":
    sys.exit(main())
