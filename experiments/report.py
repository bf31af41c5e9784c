"""A report over a set of runs: summary.csv, comparison.csv, summary.md and charts/.

Used at the end of every multirun (experiments.callbacks, in the sweep directory) and by
`python -m experiments.compare RUN_DIR...` (any set of runs, into --out).

- summary.csv: one row per job: job number, label, status (ok/failed), error type and message,
  the overrides (all of them, and one column per overridden key), the objective, and every metric
  with its 95% CI columns and n, latency, counts and stage timings.
- comparison.csv: for every run and metric, the paired difference from the baseline run over the
  questions both share, its 95% paired-bootstrap CI, the sign-flip test's p-value, the
  Holm-adjusted p-value, significance after correction, and the minimum detectable effect
  (experiments.verdict).
- summary.md: the verdict in words first, then the tables, differences marked ▲/▼ (better/worse)
  where significant after Holm's correction, the smallest detectable difference per metric, failed jobs,
  and the charts.
- report.html: one self-contained page with all of it and every question (experiments.html_report).

This module computes the report (`analyze`) and its markdown (the numbers here, the layout in
templates/summary.md.j2 and templates/method.md.j2); experiments.report_files
writes every file, report.html included, so that the HTML writer can build on this module without
this module importing it.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import pandas as pd

from eval.stats import bootstrap_ci
from experiments import charts as C
from experiments import faults as F
from experiments import metric_info as MI
from experiments import panels as P
from experiments import fitted as FT
from experiments import provenance as PV
from experiments import verdict as V
from experiments.aggregate import RunRecord, markdown_table, summary_frame
from experiments.baseline import BaselineChoice, baseline_note, pick_baseline
from experiments.stats import PERMUTATIONS
from rag.retriever.routing import routing_lines

log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).parent / "templates"
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
    alpha: float = V.ALPHA  # family-wise error rate of the Holm-corrected comparisons
    permutations: int = PERMUTATIONS  # sign patterns of the paired randomization test
    html: bool = True  # also write report.html
    max_context_chars: int = 1200  # report.html: longest context text kept (around its matching span)
    # metric -> the smallest difference that matters (report.min_effect); unnamed metrics keep metric_info's
    min_effect: dict[str, Any] = field(default_factory=dict)


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
    verdict: str = ""  # the verdict in words (also the opening of summary.md and report.html)
    mde: pd.DataFrame = field(default_factory=pd.DataFrame)  # smallest detectable difference per metric
    n_tests: int = 0  # comparisons in Holm's family
    alpha: float = V.ALPHA
    k: Any = "k"
    unit: str = "characters"
    by_corpus: pd.DataFrame = field(default_factory=pd.DataFrame)  # run, corpus, metric, mean, ci_low, ci_high, n
    html: Path | None = None
    settings: ReportSettings = field(default_factory=ReportSettings)
    source: str = ""
    faults: pd.DataFrame = field(default_factory=pd.DataFrame)  # run, then questions per class (experiments.faults)
    transitions: dict[str, dict[str, Any]] = field(default_factory=dict)  # run -> fixed / broken vs the baseline
    provenance: PV.RunsProvenance = field(default_factory=PV.RunsProvenance)  # generated questions, LLM labels
    fitted: FT.RunsFitted = field(default_factory=FT.RunsFitted)  # parts fitted on other corpora than the runs'
    routing: list[str] = field(default_factory=list)  # each routed run's routing in words (routing_notes)

    def moved_to(self, out_dir: Path) -> "Report":
        """This report after its files moved from the directory it was built in (a staging
        directory) to `out_dir`, so that every path it prints or lists is the final one."""
        old, new = self.out_dir, Path(out_dir)

        def move(p: Path) -> Path:
            return new / Path(p).relative_to(old)

        return replace(self, out_dir=new, charts=[move(p) for p in self.charts],
                       html=move(self.html) if self.html else None)

    @property
    def files(self) -> list[Path]:
        out = [self.out_dir / "summary.csv", self.out_dir / "comparison.csv", self.out_dir / "summary.md"]
        return out + ([self.html] if self.html else []) + list(self.charts)

    @property
    def ok_labels(self) -> list[str]:
        """The labels of the successful runs, in the frame's order."""
        if self.frame.empty:
            return []
        return [str(lab) for lab, st in zip(self.frame["label"], self.frame["status"]) if st == "ok"]

    @property
    def quality_metrics(self) -> list[str]:
        """The compared metrics on a 0–1-like scale (the derived latency has its own charts)."""
        return [m for m in self.metrics if m != MI.LATENCY]

    def headline(self) -> list[str]:
        return V.headline_metrics(self.objective, self.metrics)

    def terminal(self, width: int = V.WIDTH) -> str:
        """The verdict, each run's headline metrics with corrected markers, and where the files are."""
        cmp = V.Comparison(self.comparison, self.mde, self.alpha, self.n_tests)
        table = V.headline_table(self.frame, cmp, self.headline(), self.baseline, self.k, self.objective, width)
        charts_dir = self.out_dir / "charts" if self.charts else None
        paths = {"summary": self.out_dir / "summary.md", "charts": f"{charts_dir}/" if charts_dir else None,
                 "report": self.html}
        return V.terminal_text(self.verdict, table, self.baseline, paths, self.n_tests, width)


def _first(values: list[Any], default: Any) -> Any:
    for v in values:
        if v is not None and v != "" and not (isinstance(v, float) and math.isnan(v)):
            return v
    return default


def latency_columns(records: list[RunRecord], frame: pd.DataFrame, settings: ReportSettings, resamples: int,
                    seed: int) -> bool:
    """Adds the derived per-question latency (mean with its bootstrap CI) to the frame; False when
    no run recorded per-question latency."""
    if not any(r.ok and V.has_latency(r) for r in records):
        return False
    cols: dict[str, list[float]] = {MI.LATENCY: [], f"{MI.LATENCY}_ci_low": [], f"{MI.LATENCY}_ci_high": [],
                                    f"{MI.LATENCY}_n": []}
    for rec in records:
        v = np.array([x for x in V.question_values(rec, MI.LATENCY).values() if x is not None] if rec.ok else [], float)
        lo, hi = bootstrap_ci(v, resamples, settings.confidence, seed) if len(v) else (np.nan, np.nan)
        for c, x in zip(cols, (float(np.mean(v)) if len(v) else np.nan, lo, hi, len(v))):
            cols[c].append(x)
    for c, vals in cols.items():
        frame[c] = vals
    return True


def corpus_frame(records: list[RunRecord], labels: list[str], metrics: list[str]) -> pd.DataFrame:
    rows = []
    for rec, lab in zip(records, labels):
        for corpus, per in (rec.result.by_corpus if rec.result else {}).items():
            for m in metrics:
                agg = per.get(m)
                if agg:
                    rows.append({"run": lab, "corpus": corpus, "metric": m, "mean": agg["mean"],
                                 "ci_low": agg["ci95"][0], "ci_high": agg["ci95"][1], "n": agg["n"]})
    return pd.DataFrame(rows, columns=["run", "corpus", "metric", "mean", "ci_low", "ci_high", "n"])


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


def make_charts(rep: Report, out_dir: Path, formats: tuple[str, ...]) -> list[Path]:
    """Choose the charts from what varies: variants -> one panel per metric; two numeric
    parameters on a grid -> heatmaps; one numeric parameter -> lines; anything else -> objective
    per job. A latency vs quality scatter whenever two or more jobs report latency, and a
    per-corpus breakdown of the headline metrics when the questions come from several corpora."""
    frame, varying, objective, k, unit = rep.frame, rep.varying, rep.objective, rep.k, rep.unit
    metrics = rep.quality_metrics
    markers = {(str(r["label"]), r["metric"]): r["marker"] for _, r in rep.comparison.iterrows()} \
        if not rep.comparison.empty else {}
    ok = frame[frame["status"] == "ok"]
    if ok.empty:
        return []
    paths: list[Path] = []
    numeric = _numeric_keys(frame, varying)
    categorical = [v for v in varying if v not in numeric]
    chose = False
    if "variant" in varying or not varying or (categorical and not numeric):
        paths += P.version_chart(frame, rep.metrics, out_dir, k=k, markers=markers, formats=formats,
                                 baseline=rep.baseline)
        chose = True
    if len(numeric) >= 2:
        x, y = _pick_grid(numeric)
        nx, ny = frame[x].nunique(), frame[y].nunique()
        cells = len(frame[[x, y]].dropna().drop_duplicates())
        # A grid, not scattered samples (e.g. Optuna's continuous values): most cells are filled.
        if nx <= MAX_GRID_SIDE and ny <= MAX_GRID_SIDE and cells >= 0.75 * nx * ny:
            others = [v for v in varying if v not in (x, y)]
            paths += C.grid_heatmaps(frame, x, y, objective, metrics, out_dir, k=k, unit=unit, others=others,
                                     formats=formats, comparison=rep.comparison, baseline=rep.baseline)
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
        group = next(iter(numeric + varying), None)  # a numeric parameter first
        paths += C.latency_chart(frame, out_dir, k=k, group_col=group, formats=formats, objective=objective)
    if not rep.by_corpus.empty and rep.by_corpus["corpus"].nunique() >= 2:
        paths += P.corpus_chart(rep.by_corpus, rep.headline(), out_dir, k=k, formats=formats, frame=frame,
                                objective=objective)
    paths += P.win_tie_loss_chart(rep.comparison, rep.headline(), out_dir, rep.baseline, k=k, formats=formats)
    return paths


def markdown_env() -> jinja2.Environment:
    """The templates of the markdown this module writes: no escaping (markdown, not HTML), the
    file's last newline kept, and the filters that lay out tables and prose."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=False, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    env.filters.update(row=_md_row, rule=_md_rule, paragraph=_paragraph)
    return env


def _md_rule(header: list[str]) -> str:
    return "|" + "---|" * len(header)


def _paragraph(text: str) -> str:
    """Prose a template writes over several lines, as the one line markdown shows it."""
    return " ".join(line.strip() for line in text.strip().splitlines()) + "\n"


def _cell(row: pd.Series, m: str, marker: str) -> str:
    v = row.get(m)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    lo, hi = row.get(f"{m}_ci_low"), row.get(f"{m}_ci_high")
    s = f"{MI.fmt(m, v)} [{MI.fmt(m, lo)}, {MI.fmt(m, hi)}]"
    return f"{s} {marker}" if marker else s


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def best_run(rep: Report) -> pd.Series | None:
    """The successful run with the best objective, in the objective's direction (None for fewer
    than two)."""
    ok = rep.frame[rep.frame["status"] == "ok"]
    if len(ok) < 2 or rep.objective not in ok or not ok[rep.objective].notna().any():
        return None  # a single run is not "best" of anything
    return ok.loc[ok[rep.objective].idxmin() if MI.lower_is_better(rep.objective) else ok[rep.objective].idxmax()]


def method_note(rep: Report) -> str:
    """How the comparisons are made, for the footnote of summary.md and report.html
    (templates/method.md.j2)."""
    s = rep.settings
    return markdown_env().get_template("method.md.j2").render(
        baseline=rep.baseline, permutations=f"{s.permutations:,}", permutations_plus_one=f"{s.permutations + 1:,}",
        n_tests=rep.n_tests, alpha=f"{rep.alpha:g}", lower_mark=MI.LOWER_MARK,
    ).removesuffix("\n")


def summary_markdown(rep: Report, k: Any, source: str) -> str:
    """summary.md: `summary_view`'s numbers laid out by templates/summary.md.j2."""
    return markdown_env().get_template("summary.md.j2").render(summary_view(rep, k, source))


def routing_notes(records: list[RunRecord], labels: list[str]) -> list[str]:
    """Each routed run's routing (metrics.json `routing`) in words, after its label: how many
    questions its router filtered, how often it was right, and the recall the filter lost."""
    return [f"{label}: " + "; ".join(routing_lines(r.result.routing)) for r, label in zip(records, labels)
            if r.ok and r.result is not None and r.result.routing]


def summary_view(rep: Report, k: Any, source: str) -> dict[str, Any]:
    """Everything summary.md shows, formatted: its sentences' numbers and its tables' cells."""
    frame = rep.frame
    ok = frame[frame["status"] == "ok"]
    failed = frame[frame["status"] != "ok"]
    best = best_run(rep)
    markers = {(str(r["label"]), r["metric"]): r["marker"] for _, r in rep.comparison.iterrows()} \
        if not rep.comparison.empty else {}
    results = [[str(row["job"]), _run_label(rep, row), str(row["status"])]
               + [_cell(row, m, markers.get((str(row["label"]), m), "")) for m in rep.metrics]
               for _, row in frame.iterrows()]
    view: dict[str, Any] = {
        "title": rep.settings.title, "verdict": rep.verdict, "source": source, "provenance": rep.provenance.view(),
        "fitted": rep.fitted.view(), "routing": rep.routing,
        "jobs": len(frame), "ok": len(ok), "failed": len(failed),
        "objective": rep.objective, "objective_label": C.metric_label(rep.objective, k),
        "direction": "lower" if MI.lower_is_better(rep.objective) else "higher",
        "generated": time.strftime("%Y-%m-%d %H:%M:%S"),
        "varying": ", ".join(f"`{v}`" for v in rep.varying),
        "best": None if best is None else _best_view(best, rep.objective),
        "compared": rep.baseline is not None and bool(rep.n_tests), "baseline": rep.baseline,
        "marker_note": MI.MARKER_NOTE.format(baseline="the baseline"), "n_tests": rep.n_tests,
        "alpha": f"{rep.alpha:g}", "lower_note": MI.LOWER_NOTE, "k": k,
        "results": _table(["job", "run", "status"] + [C.metric_label(m, k) for m in rep.metrics], results),
        "failed_table": None if failed.empty else markdown_table(failed, ["job", "label", "error_type", "error",
                                                                          "overrides"]),
        "charts": _chart_entries(rep) if rep.charts else None,
        "method": method_note(rep) if rep.baseline is not None and rep.n_tests else "",
        "html": rep.settings.html,
    }
    view.update(_comparison_tables(rep, k))
    view.update(_cost_tables(frame, ok))
    return view


def _best_view(best: pd.Series, objective: str) -> dict[str, Any]:
    job = str(best["job"])
    return {"label": best["label"], "job": f" (job {job})" if job != "" else "", "value": _cell(best, objective, "")}


def _table(header: list[str], rows: list[list[str]]) -> dict[str, Any]:
    return {"header": header, "rows": rows}


def _run_label(rep: Report, row: pd.Series) -> str:
    return str(row["label"]) + (" (baseline)" if str(row["label"]) == rep.baseline else "")


def _difference_cell(m: str, r: pd.Series | None) -> str:
    if r is None:
        return ""
    return (f"{MI.fmt(m, r['diff'], True)} [{MI.fmt(m, r['ci_low'], True)}, {MI.fmt(m, r['ci_high'], True)}] "
            f"p={V.p_text(r['p_holm'])} {r['marker']}").rstrip()


def _comparison_tables(rep: Report, k: Any) -> dict[str, Any]:
    """The tables against the baseline: differences, fault classes (and what each run fixes and
    breaks), win / tie / loss, and the smallest detectable differences; None where there is none."""
    out: dict[str, Any] = {"differences": None, "faults": None, "transitions": None, "wins": None,
                           "detectable": None}
    cmp = rep.comparison
    if cmp.empty:
        return out
    diffs = {(str(r["label"]), r["metric"]): r for _, r in cmp.iterrows()}
    metrics = [m for m in rep.metrics if m in set(cmp["metric"])]
    runs = list(dict.fromkeys(str(x) for x in cmp["label"]))
    header = ["run"] + [C.metric_label(m, k) for m in metrics]
    lo, hi = int(cmp["n"].min()), int(cmp["n"].max())
    out["differences"] = {"n": str(lo) if lo == hi else f"{lo}–{hi}", **_table(
        header, [[lab] + [_difference_cell(m, diffs.get((lab, m))) for m in metrics] for lab in runs])}
    if not rep.faults.empty:
        out["faults"] = _table(["run"] + [F.WORDS[c] for c in F.CLASSES],
                               [[str(r["run"])] + [str(int(r[c])) for c in F.CLASSES] for _, r in rep.faults.iterrows()])
        if rep.transitions:
            out["transitions"] = _table(
                ["run", "questions", "fixed", "broken", "fixed ids (first 10)", "broken ids (first 10)"],
                [[lab, str(t["shared"]), F.fixed_words(t), F.broken_words(t), ", ".join(t["ids"]["fixed"][:10]),
                  ", ".join(t["ids"]["broken"][:10])] for lab, t in rep.transitions.items()])
    if "wins" in cmp:
        out["wins"] = _table(header, [[lab] + [_wins_cell(diffs.get((lab, m))) for m in metrics] for lab in runs])
    if not rep.mde.empty and rep.mde["mde"].notna().any():
        out["detectable"] = _table(
            ["metric", f"detectable (α/m = {rep.alpha:g}/{max(rep.n_tests, 1)})", f"detectable (α = {rep.alpha:g})",
             "sd of differences", "questions", "basis"],
            [[C.metric_label(r["metric"], k), V.mde_text(r["metric"], r["mde"]),
              V.mde_text(r["metric"], r["mde_nominal"]), MI.fmt(r["metric"], r["sd_diff"]), str(int(r["n"])),
              str(r["basis"])] for _, r in rep.mde.iterrows()])
    return out


def _wins_cell(r: pd.Series | None) -> str:
    return "" if r is None else f"{int(r['wins'])} / {int(r['ties'])} / {int(r['losses'])}"


def _cost_tables(frame: pd.DataFrame, ok: pd.DataFrame) -> dict[str, str | None]:
    """The Cost section's tables: latency, counts and stage time per run, and the requests sent to
    served models with their cost; None where there is none."""
    out: dict[str, str | None] = {"cost_table": None, "served_table": None}
    lat = C.latency_column(ok) if not ok.empty else None
    timing_cols = [c for c in [lat, "n_chunks", "n_questions"] if c and c in frame]
    if not timing_cols or ok.empty:
        return out
    t_cols = [c for c in frame.columns if c.startswith("t_") and c.endswith("_s")]
    tf = ok.assign(t_total_s=ok[t_cols].sum(axis=1, min_count=1)) if t_cols else ok
    for c in ("n_chunks", "n_questions"):
        if c in tf:
            tf = tf.assign(**{c: tf[c].astype("Int64")})
    out["cost_table"] = markdown_table(tf, ["job", "label", *timing_cols, *(["t_total_s"] if t_cols else [])], digits=2)
    served = [c for c in frame.columns if c.endswith("_requests") or c.startswith("cost_")]
    if served:
        out["served_table"] = markdown_table(ok, ["job", "label", *served, *(["currency"] if "currency" in ok else [])],
                                             digits=4)
    return out


def _chart_entries(rep: Report) -> list[dict[str, str]]:
    """The PNG charts, each with its SVG twin when there is one, as paths relative to the report."""
    svgs = {q.with_suffix("") for q in rep.charts if q.suffix == ".svg"}
    out = []
    for p in rep.charts:
        if p.suffix == ".png":
            rel = p.relative_to(rep.out_dir)
            out.append({"name": p.stem, "path": rel.as_posix(),
                        "svg": rel.with_suffix(".svg").as_posix() if p.with_suffix("") in svgs else ""})
    return out


def analyze(records: list[RunRecord], out_dir: Path, settings: ReportSettings | None = None,
            source: str = "") -> Report:
    """Everything the report says, computed once: the summary frame, the corrected comparisons,
    the minimum detectable effects and the verdict. Writes nothing."""
    settings = settings or ReportSettings()
    frame, varying, metrics = summary_frame(records)
    objective = _first([r.result.objective.name if r.result else None for r in records]
                       + [r.config.get("objective") for r in records], "mrr")
    if not frame.empty:
        frame["objective_value"] = frame[objective] if objective in frame else np.nan
    configs = [r.config for r in records if r.config]
    ks = {((c.get("eval") or {}).get("k")) for c in configs} - {None}
    k = next(iter(ks)) if len(ks) == 1 else "k"
    unit = C.chunk_unit(configs[0] if configs else None)

    choice = pick_baseline(records, frame, settings.baseline, varying) if not frame.empty else BaselineChoice(None, "none")
    base = choice.index
    bcfg = (((records[base].config or {}).get("eval") or {}).get("bootstrap") or {}) if base is not None else {}
    resamples = int(settings.resamples if settings.resamples is not None else bcfg.get("resamples", 1000))
    seed = int(settings.seed if settings.seed is not None else bcfg.get("seed", 0))
    if not frame.empty and latency_columns(records, frame, settings, resamples, seed):
        metrics = [*metrics, MI.LATENCY]
    labels = [str(x) for x in frame["label"]] if not frame.empty else []
    cmp = V.compare(records, labels, metrics, base, resamples, seed, settings.confidence, settings.alpha,
                    settings.permutations, MI.min_effects(settings.min_effect))
    baseline_label = labels[base] if base is not None else None
    if not frame.empty:
        frame.insert(3, "baseline", [i == base for i in range(len(frame))])
    rep = Report(Path(out_dir), frame, cmp.table, varying, metrics, objective, baseline_label, mde=cmp.mde,
                 n_tests=cmp.n_tests, alpha=settings.alpha, k=k, unit=unit,
                 by_corpus=corpus_frame(records, labels, metrics), settings=settings, source=source,
                 provenance=PV.of_runs(records, labels), fitted=FT.of_runs(records),
                 routing=routing_notes(records, labels))
    single = None
    if base is not None and objective in frame:
        row = frame.loc[base]
        single = {"mean": row[objective], "lo": row.get(f"{objective}_ci_low"), "hi": row.get(f"{objective}_ci_high"),
                  "n": int(row.get(f"{objective}_n", 0) or 0)}
    runs = [lab for i, lab in enumerate(labels) if records[i].ok and i != base]
    best = best_run(rep) if varying and "variant" not in varying else None
    best_words = "" if best is None else V.best_words(best, baseline_label, cmp.table, objective, k)
    rep.verdict = " ".join(x for x in (rep.fitted.words(),  # first: what the numbers below are evidence of
                                       V.provenance_words(PV.provenances(records)), baseline_note(choice, baseline_label),
                                       best_words,
                                       V.verdict_text(cmp, baseline_label, runs, k, objective, single),
                                       V.cost_words(frame)) if x)
    _fault_analysis(rep, records, labels, base)
    return rep


def _fault_analysis(rep: Report, records: list[RunRecord], labels: list[str], base: int | None) -> None:
    """Questions per fault class for every run, what each run fixes and breaks against the
    baseline, and one sentence of it in the verdict (experiments.faults)."""
    counts = [(labels[i], F.counts(rec)) for i, rec in enumerate(records) if rec.ok]
    rep.faults = pd.DataFrame([{"run": lab, **n} for lab, n in counts if sum(n[c] for c in F.CLASSES)])
    if base is None or rep.faults.empty:
        return
    for i, rec in enumerate(records):
        if rec.ok and i != base:
            t = F.transitions(records[base], rec)
            if t["shared"]:
                rep.transitions[labels[i]] = t
    if rep.transitions:
        said = "; ".join(F.sentence(lab, t) for lab, t in rep.transitions.items())
        rep.verdict += (f" Question by question against {labels[base]} (by the source document's rank in the "
                        f"top {rep.k}, and the answer where both answered): {said}.")
