"""Collect finished runs (directories holding metrics.json) into one table.

`python -m experiments.aggregate RUN_DIR_OR_PARENT...` prints a markdown table, one row per run.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd


def find_runs(paths: list[Path]) -> list[Path]:
    runs: list[Path] = []
    for p in paths:
        runs.extend(sorted(m.parent for m in Path(p).rglob("metrics.json")))
    return runs


def load_runs(paths: list[Path]) -> pd.DataFrame:
    rows = []
    for run in find_runs(paths):
        m = json.loads((run / "metrics.json").read_text())
        row = {"run": str(run), "variant": m.get("variant")}
        for name, agg in m["metrics"].items():
            row[name] = agg["mean"]
            row[f"{name}_ci_low"], row[f"{name}_ci_high"] = agg["ci95"]
        for corpus, metrics in m.get("by_corpus", {}).items():
            for name, agg in metrics.items():
                row[f"{corpus}/{name}"] = agg["mean"]
        for stage, s in m.get("timings_s", {}).items():
            row[f"t_{stage}_s"] = s
        row.update({f"latency_{k}": v for k, v in m.get("latency", {}).items()})
        row.update({f"n_{k}": v for k, v in m.get("counts", {}).items()})
        rows.append(row)
    return pd.DataFrame(rows)


def markdown_table(df: pd.DataFrame, columns: list[str], digits: int = 3) -> str:
    """A plain markdown table (pandas' to_markdown needs the optional `tabulate` package)."""
    cols = [c for c in columns if c in df.columns]

    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.{digits}f}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df[cols].itertuples(index=False)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    args = parser.parse_args(argv)
    df = load_runs(args.paths)
    if df.empty:
        print("no runs (metrics.json) found under " + ", ".join(map(str, args.paths)), file=sys.stderr)
        return 1
    metric_cols = [c for c in df.columns if "/" not in c and not c.endswith(("_ci_low", "_ci_high"))
                   and c not in ("run",) and not c.startswith(("t_", "latency_", "n_"))]
    print(markdown_table(df, metric_cols))
    print()
    print(markdown_table(df, ["variant"] + [c for c in df.columns if c.startswith("t_")], digits=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
