"""Rebuild the tables and charts of any set of runs.

    python -m experiments.compare RUN_DIR [RUN_DIR...] [--out DIR] [--baseline v1]

A RUN_DIR is any directory holding metrics.json (a run), a sweep directory, or any parent of
runs (e.g. outputs/runs or outputs/multirun/2025-01-31): every run below it is included, runs
from different days and sweeps mixed freely. Writes summary.csv, comparison.csv, summary.md,
charts/ and report.html into --out (default: a new directory outputs/compare/<timestamp>), and
prints the verdict, the headline table and the paths. A RUN_DIR with no run in or below it is
refused by name: a mistyped directory never drops out of a comparison unnoticed.

Exit status: 0 written, 2 bad input (one line naming it), 130 interrupted (nothing written).
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from experiments import metric_info as MI
from experiments.aggregate import RunRecord, find_run_dirs, load_run, refused_records, with_refused
from experiments.report import ReportSettings
from experiments.report_files import build_report, foreign_in_out
from rag.config.cli import HelpFormatter, positive_int, run_cli, seed_int
from rag.config.schema import CHART_FORMATS
from rag.run.rundir import pooling_pending, remove_report
from rag.types import RagError

DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "outputs" / "compare"


def default_out(root: Path = DEFAULT_ROOT) -> Path:
    """A new directory, created here: two comparisons started in the same second get two."""
    base = root / time.strftime("%Y-%m-%d_%H-%M-%S")
    root.mkdir(parents=True, exist_ok=True)
    out, i = base, 1
    while True:
        try:
            out.mkdir()
            return out
        except FileExistsError:
            out = base.with_name(f"{base.name}-{i}")
            i += 1


def chart_formats(text: str) -> tuple[str, ...]:
    formats = tuple(f.strip().lower() for f in text.split(",") if f.strip())
    bad = [f for f in formats if f not in CHART_FORMATS]
    if bad or not formats:
        raise argparse.ArgumentTypeError(f"unknown chart format(s) {bad or text!r}; choose from {', '.join(CHART_FORMATS)}")
    return formats


def min_effect(text: str) -> tuple[str, str | float]:
    """METRIC=VALUE: the smallest difference of METRIC that matters (report.min_effect)."""
    name, sep, value = text.partition("=")
    parsed: str | float = value.strip()
    try:
        parsed = float(value)
    except ValueError:
        pass
    try:
        if not sep or not name.strip():
            raise RagError(f"METRIC=VALUE expected (ndcg_at_k=0.02, latency_ms=20%), got {text!r}")
        if MI.resolve(name.strip()) not in MI.METRICS:
            raise RagError(f"no such metric {name.strip()!r}; known: {', '.join(MI.METRICS)}")
        MI.min_effect_setting(name.strip(), parsed)
    except RagError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return name.strip(), parsed


def publish(tmp: Path, out: Path) -> None:
    """Moves every file the report wrote from `tmp` into `out` (rename, so no reader sees half a
    file), then removes `tmp`."""
    for src in sorted(p for p in tmp.rglob("*") if p.is_file()):
        dst = out / src.relative_to(tmp)
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)
    shutil.rmtree(tmp, ignore_errors=True)


def parser() -> argparse.ArgumentParser:
    lines = __doc__.strip().splitlines()
    parser = argparse.ArgumentParser(
        prog="python -m experiments.compare", description=lines[0], formatter_class=HelpFormatter,
        epilog="\n".join(lines[3:]),
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run directories, sweep directories or their parents")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: outputs/compare/<timestamp>)")
    parser.add_argument("--baseline", default=None,
                        help="run to compare against: a label, variant or job number (default: v1 if present, else the first run)")
    parser.add_argument("--formats", type=chart_formats, default=("png", "svg"),
                        help="chart formats, comma-separated (default: png,svg)")
    parser.add_argument("--no-charts", action="store_true", help="tables only")
    parser.add_argument("--resamples", type=positive_int, default=None,
                        help="paired-bootstrap resamples (default: the baseline run's eval.bootstrap.resamples)")
    parser.add_argument("--seed", type=seed_int, default=None, help="paired-bootstrap seed (default: the baseline run's)")
    parser.add_argument("--title", default="Run comparison", help="the report's title")
    parser.add_argument("--no-html", action="store_true", help="no report.html")
    parser.add_argument("--max-context-chars", type=positive_int, default=1200,
                        help="report.html: longest context text kept, around its matching span")
    parser.add_argument("--min-effect", type=min_effect, action="append", default=[], metavar="METRIC=VALUE",
                        help="the smallest difference of METRIC that is a win or a loss, in its unit or as N%% of "
                             "the baseline's mean (report.min_effect; repeatable; default: docs/reference/metrics.md)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    try:
        return compare(args)
    except KeyboardInterrupt:
        print("compare: interrupted; nothing was written", file=sys.stderr)
        return 130


def runs_in(paths: list[Path]) -> list[RunRecord]:
    """The runs in or below each path, each once, in the order given; a path holding none is an
    error naming it (alone or beside others)."""
    found: dict[Path, Path] = {}
    for p in paths:
        dirs = find_run_dirs([p])
        if not dirs:
            raise FileNotFoundError(f"{p}: no run in or below it (no metrics.json or failure.json); "
                                    "give run directories, sweep directories or their parents")
        for d in dirs:
            found.setdefault(d.resolve(), d)
    return with_refused([load_run(d) for d in found.values()], refused_records(paths, list(found.values())))


def compare(args: argparse.Namespace) -> int:
    try:
        records = runs_in(args.runs)
    except FileNotFoundError as e:
        print(f"compare: error: {e}", file=sys.stderr)
        return 2
    pending = next(filter(None, (pooling_pending(r.path) for r in records)), None)
    if pending is not None:  # its figures would contradict the tables built from its questions
        print(f"compare: error: {pending}", file=sys.stderr)
        return 2
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        print(f"compare: error: --out {args.out} is a file, not a directory", file=sys.stderr)
        return 2
    foreign = foreign_in_out(args.out) if args.out is not None and args.out.is_dir() else None
    if foreign is not None:  # compare replaces only what an earlier comparison there wrote
        print(f"compare: error: --out {args.out} holds {foreign}, which compare did not write; "
              "give an empty or new --out", file=sys.stderr)
        return 2
    created = args.out is None or not args.out.exists()
    try:
        out = args.out or default_out()
        out.mkdir(parents=True, exist_ok=True)
        # The report is built beside `out` and moved in when complete: an interrupted or failed
        # comparison leaves no half a report there.
        tmp = Path(tempfile.mkdtemp(prefix=".compare-", dir=out.parent))
    except OSError as e:
        print(f"compare: error: cannot create the output directory: {e.strerror}: {e.filename}", file=sys.stderr)
        return 2
    settings = ReportSettings(
        baseline=args.baseline,
        formats=tuple(args.formats),
        charts=not args.no_charts,
        resamples=args.resamples,
        seed=args.seed,
        title=args.title,
        html=not args.no_html,
        max_context_chars=args.max_context_chars,
        min_effect=dict(args.min_effect),
    )
    source = "Runs: " + ", ".join(f"`{p}`" for p in args.runs)
    try:
        rep = build_report(records, tmp, settings, source=source)
        stale = remove_report(out)  # a reused --out: no chart or page of an earlier comparison stays
        if stale:
            logging.getLogger("experiments.compare").warning(
                "%s held an earlier comparison (%s); it was replaced", out, ", ".join(stale))
        publish(tmp, out)
        rep = rep.moved_to(out)
    except BaseException:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n_failed = int((rep.frame["status"] != "ok").sum())
    print(f"{len(rep.frame)} runs ({n_failed} failed), baseline {rep.baseline}")
    for f in rep.files:
        print(f"  {f}")
    print(rep.terminal())
    return 0


if __name__ == "__main__":
    run_cli(main)
