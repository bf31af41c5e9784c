"""A report over a set of runs: summary.csv, comparison.csv, summary.md and charts/.

Used at the end of every multirun (experiments.callbacks, in the sweep directory) and by
`python -m experiments.compare RUN_DIR...` (any set of runs, into --out).

- summary.csv: one row per job: job number, label, status (ok/failed), error type and message,
  the overrides (all of them, and one column per overridden key), the objective, and every metric
  with its 95% CI columns and n, latency, counts and stage timings.
- comparison.csv: for every run and metric, the paired-bootstrap difference from the baseline run
  (same question ids resampled jointly) with its 95% CI and whether the CI excludes zero.
- summary.md: the tables in markdown, differences marked ▲/▼, failed jobs, and the charts.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from experiments import charts as C
from experiments.aggregate import RunRecord, markdown_table, summary_frame
from experiments.stats import PairedDiff, paired_bootstrap

log = logging.getLogger(__name__)

# Preferred axes of a grid heatmap (x, y) when they vary; otherwise the first two numeric ones.
GRID_X_PREFERENCE = ("fusion.alpha", "chunker.chunk_overlap", "eval.k", "retriever.candidates", "reranker.top_n")
GRID_Y_PREFERENCE = ("chunker.chunk_size",)
MAX_GRID_SIDE = 12


@dataclass
class ReportSettings:
    baseline: str | None = None  # a label, variant or job number; None: v1 if present, else the first run
    formats: tuple[str, ...] = C.FORMATS
    charts: bool = True
    resamples: int | None = None  # None: the baseline run's eval.bootstrap.resamples
    seed: int | None = None  # None: the baseline run's eval.bootstrap.seed
    confidence: float = 0.95
    title: str = "Sweep summary"


@dataclass
class Report:
    out_dir: Path
    frame: pd.DataFrame
    comparison: pd.DataFrame
    varying: list[str]
    metrics: list[str]
    objective: str
    baseline: str | None
    charts: list[Path] = field(default_factory=list)

    @property
    def files(self) -> list[Path]:
        return [self.out_dir / "summary.csv", self.out_dir / "comparison.csv", self.out_dir / "summary.md", *self.charts]


def _first(values: list[Any], default: Any) -> Any:
    for v in values:
        if v is not None and v != "" and not (isinstance(v, float) and math.isnan(v)):
            return v
    return default


def pick_baseline(records: list[RunRecord], frame: pd.DataFrame, wanted: str | None) -> int | None:
    """Row index of the baseline run: `wanted` as a label, variant or job number; else the first
    run of variant v1; else the first successful run."""
    ok = [i for i, r in enumerate(records) if r.ok]
    if not ok:
        return None
    if wanted is not None and str(wanted) != "":
        w = str(wanted)
        for i in ok:
            if str(frame.loc[i, "label"]) == w:
                return i
        for i in ok:
            if records[i].variant == w or str(frame.loc[i, "job"]) == w:
                return i
        log.warning("report: baseline %r matches no successful run; using the default", wanted)
    for i in ok:
        if records[i].variant == "v1":
            return i
    return ok[0]


def compare_to_baseline(records: list[RunRecord], frame: pd.DataFrame, metrics: list[str], base: int | None,
                        settings: ReportSettings) -> pd.DataFrame:
    rows = []
    if base is None:
        return pd.DataFrame(rows)
    bcfg = ((records[base].config or {}).get("eval") or {}).get("bootstrap") or {}
    resamples = int(settings.resamples if settings.resamples is not None else bcfg.get("resamples", 1000))
    seed = int(settings.seed if settings.seed is not None else bcfg.get("seed", 0))
    base_vals = {m: records[base].question_values(m) for m in metrics}
    for i, rec in enumerate(records):
        if not rec.ok or i == base:
            continue
        for m in metrics:
            other = rec.question_values(m)
            if not base_vals[m] or not other:
                continue
            d: PairedDiff = paired_bootstrap(base_vals[m], other, resamples, settings.confidence, seed)
            if d.n == 0:
                continue
            rows.append({
                "job": frame.loc[i, "job"], "label": frame.loc[i, "label"], "metric": m,
                "baseline": frame.loc[base, "label"], "diff": d.mean_diff, "ci_low": d.ci_low, "ci_high": d.ci_high,
                "n": d.n, "p_value": d.p_value, "significant": d.significant, "marker": d.marker(),
            })
    return pd.DataFrame(rows)


def _numeric_keys(frame: pd.DataFrame, keys: list[str]) -> list[str]:
    return [k for k in keys if k != "variant" and C._is_numeric(frame[k].tolist())]


def _pick_grid(numeric: list[str]) -> tuple[str, str]:
    y = next((k for k in GRID_Y_PREFERENCE if k in numeric), None)
    x = next((k for k in GRID_X_PREFERENCE if k in numeric and k != y), None)
    rest = [k for k in numeric if k not in (x, y)]
    if y is None:
        y = rest.pop(0) if x is not None else rest.pop(1)
    if x is None:
        x = rest.pop(0)
    return x, y


def make_charts(frame: pd.DataFrame, varying: list[str], metrics: list[str], objective: str, out_dir: Path,
                k: Any, unit: str, markers: dict[tuple[str, str], str], formats: tuple[str, ...],
                baseline: str | None = None) -> list[Path]:
    """Choose the charts from what varies: variants -> grouped bars; two numeric parameters on a
    grid -> heatmaps; one numeric parameter -> lines; anything else -> objective per job. A latency
    vs quality scatter whenever two or more jobs report latency."""
    ok = frame[frame["status"] == "ok"]
    if ok.empty:
        return []
    paths: list[Path] = []
    numeric = _numeric_keys(frame, varying)
    categorical = [v for v in varying if v not in numeric]
    chose = False
    if "variant" in varying or not varying or (categorical and not numeric):
        paths += C.version_chart(frame, metrics, out_dir, k=k, markers=markers, formats=formats, baseline=baseline)
        chose = True
    if len(numeric) >= 2:
        x, y = _pick_grid(numeric)
        nx, ny = frame[x].nunique(), frame[y].nunique()
        cells = len(frame[[x, y]].dropna().drop_duplicates())
        # A grid, not scattered samples (e.g. Optuna's continuous values): most cells are filled.
        if nx <= MAX_GRID_SIDE and ny <= MAX_GRID_SIDE and cells >= 0.75 * nx * ny:
            others = [v for v in varying if v not in (x, y)]
            paths += C.grid_heatmaps(frame, x, y, objective, metrics, out_dir, k=k, unit=unit, others=others,
                                     formats=formats)
            chose = True
    elif len(numeric) == 1:
        x = numeric[0]
        if frame[x].nunique() >= 2:
            series = None
            if categorical:
                frame = frame.assign(_series=frame[categorical].astype(str).agg(" ".join, axis=1))
                series = "_series"
            paths += C.line_chart(frame, x, metrics, out_dir, k=k, unit=unit, series_col=series,
                                  objective=objective, formats=formats)
            chose = True
    if not chose or len(numeric) >= 3:
        paths += C.jobs_chart(frame, objective, out_dir, k=k, formats=formats)
    if len(ok) >= 2:
        group = numeric[0] if numeric else (varying[0] if varying else None)
        paths += C.latency_chart(frame, out_dir, k=k, group_col=group, formats=formats)
    return paths


def _cell(row: pd.Series, m: str, marker: str) -> str:
    v = row.get(m)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    lo, hi = row.get(f"{m}_ci_low"), row.get(f"{m}_ci_high")
    s = f"{v:.3f} [{lo:.3f}, {hi:.3f}]"
    return f"{s} {marker}" if marker else s


def summary_markdown(rep: Report, frame: pd.DataFrame, records: list[RunRecord], k: Any, settings: ReportSettings,
                     source: str) -> str:
    ok = frame[frame["status"] == "ok"]
    failed = frame[frame["status"] != "ok"]
    lines = [f"# {settings.title}", ""]
    if source:
        lines.append(f"{source}  ")
    lines.append(f"{len(frame)} jobs: {len(ok)} ok, {len(failed)} failed. Objective: "
                 f"**{C.metric_label(rep.objective, k)}** (`{rep.objective}`, higher is better). "
                 f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')}.")
    if rep.varying:
        lines.append(f"Varying: {', '.join(f'`{v}`' for v in rep.varying)}.")
    lines.append("")
    if not ok.empty and rep.objective in ok and ok[rep.objective].notna().any():
        best = ok.loc[ok[rep.objective].idxmax()]
        lines.append(f"Best: **{best['label']}** (job {best['job']}): {C.metric_label(rep.objective, k)} = "
                     f"{best[rep.objective]:.3f} [{best[f'{rep.objective}_ci_low']:.3f}, "
                     f"{best[f'{rep.objective}_ci_high']:.3f}].")
        lines.append("")

    markers: dict[tuple[str, str], str] = {}
    diffs: dict[tuple[str, str], pd.Series] = {}
    if not rep.comparison.empty:
        for _, r in rep.comparison.iterrows():
            markers[(str(r["label"]), r["metric"])] = r["marker"]
            diffs[(str(r["label"]), r["metric"])] = r

    lines += ["## Results", ""]
    if rep.baseline is not None:
        nq = int(rep.comparison["n"].max()) if not rep.comparison.empty else 0
        lines.append(f"Mean [95% bootstrap CI] per metric. Baseline: **{rep.baseline}**. "
                     f"▲/▼: higher/lower than the baseline, the paired-bootstrap 95% CI of the difference "
                     f"(same {nq} question ids resampled jointly) excludes zero. No correction for multiple "
                     f"comparisons.")
        lines.append("")
    header = ["job", "run", "status"] + [C.metric_label(m, k) for m in rep.metrics]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for _, row in frame.iterrows():
        label = str(row["label"]) + (" (baseline)" if str(row["label"]) == rep.baseline else "")
        cells = [str(row["job"]), label, str(row["status"])]
        cells += [_cell(row, m, markers.get((str(row["label"]), m), "")) for m in rep.metrics]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines.append("")

    if diffs:
        lines += [f"## Differences vs baseline ({rep.baseline})", "",
                  "Mean per-question difference (run − baseline) [paired bootstrap 95% CI].", ""]
        labels = list(dict.fromkeys(str(x) for x in rep.comparison["label"]))
        lines.append("| run | " + " | ".join(C.metric_label(m, k) for m in rep.metrics) + " |")
        lines.append("|" + "---|" * (len(rep.metrics) + 1))
        for lab in labels:
            cells = [lab]
            for m in rep.metrics:
                r = diffs.get((lab, m))
                cells.append("" if r is None else f"{r['diff']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] {r['marker']}".rstrip())
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        lines.append("")

    if not failed.empty:
        lines += ["## Failed jobs", ""]
        lines.append(markdown_table(failed, ["job", "label", "error_type", "error", "overrides"]))
        lines.append("")

    lat = C.latency_column(ok) if not ok.empty else None
    timing_cols = [c for c in [lat, "n_chunks", "n_questions"] if c and c in frame]
    if timing_cols and not ok.empty:
        lines += ["## Cost", ""]
        t_cols = [c for c in frame.columns if c.startswith("t_") and c.endswith("_s")]
        tf = ok.assign(t_total_s=ok[t_cols].sum(axis=1, min_count=1)) if t_cols else ok
        for c in ("n_chunks", "n_questions"):
            if c in tf:
                tf = tf.assign(**{c: tf[c].astype("Int64")})
        lines.append(markdown_table(tf, ["job", "label", *timing_cols, *(["t_total_s"] if t_cols else [])], digits=2))
        lines.append("")

    if rep.charts:
        lines += ["## Charts", ""]
        for p in rep.charts:
            if p.suffix == ".png":
                rel = p.relative_to(rep.out_dir)
                lines.append(f"![{p.stem}]({rel.as_posix()})  ")
                lines.append(f"`{rel.as_posix()}` (also `{rel.with_suffix('.svg').as_posix()}`)" if ".svg" in
                             {q.suffix for q in rep.charts} else f"`{rel.as_posix()}`")
                lines.append("")
    lines += ["Files: `summary.csv` (one row per job: overrides, every metric with CI columns, status, error), "
              "`comparison.csv` (paired differences vs the baseline).", ""]
    return "\n".join(lines)


def build_report(records: list[RunRecord], out_dir: Path, settings: ReportSettings | None = None,
                 source: str = "") -> Report:
    settings = settings or ReportSettings()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    frame, varying, metrics = summary_frame(records)
    objective = _first([(r.metrics or {}).get("objective", {}).get("name") for r in records]
                       + [r.config.get("objective") for r in records], "mrr")
    if not frame.empty:
        frame["objective_value"] = frame[objective] if objective in frame else np.nan
    configs = [r.config for r in records if r.config]
    ks = {((c.get("eval") or {}).get("k")) for c in configs} - {None}
    k = next(iter(ks)) if len(ks) == 1 else "k"
    unit = C.chunk_unit(configs[0] if configs else None)

    base = pick_baseline(records, frame, settings.baseline) if not frame.empty else None
    comparison = compare_to_baseline(records, frame, metrics, base, settings)
    baseline_label = str(frame.loc[base, "label"]) if base is not None else None
    if not frame.empty:
        frame.insert(3, "baseline", [i == base for i in range(len(frame))])
    rep = Report(out_dir, frame, comparison, varying, metrics, objective, baseline_label)

    frame.to_csv(out_dir / "summary.csv", index=False)
    comparison.to_csv(out_dir / "comparison.csv", index=False)
    if settings.charts and not frame.empty:
        markers = {(str(r["label"]), r["metric"]): r["marker"] for _, r in comparison.iterrows()} if not comparison.empty else {}
        try:
            rep.charts = make_charts(frame, varying, metrics, objective, out_dir / "charts", k, unit, markers,
                                     tuple(settings.formats), baseline_label)
        except Exception:  # a chart must never cost the tables
            log.exception("report: charts failed")
    (out_dir / "summary.md").write_text(summary_markdown(rep, frame, records, k, settings, source), encoding="utf-8")
    return rep
