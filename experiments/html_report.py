"""report.html: the verdict, the charts and every question of a set of runs, in one static file.

No server and no network request of any kind: CSS and JavaScript are inline, the charts are the
summary's own SVGs inlined, the per-question evidence is embedded JSON, and a Content-Security-
Policy of `default-src 'none'` forbids the page to fetch anything. It can be mailed or attached to
a paper's supplement and opened offline in any browser.

Everything statistical comes from the Report (experiments.report.analyze): nothing is computed
twice. What is added here is presentational: the per-run configuration, the metric glossary and
the page itself; the per-question evidence the page embeds (every question and run, the ranked
contexts with the span of each chunk that matches the ground truth) is experiments.page_data's.
"""
from __future__ import annotations

import html
import json
import logging
import re
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from experiments import metric_info as MI
from experiments.page_data import Header, page_json
from experiments.stats import has_value

if TYPE_CHECKING:
    from experiments.aggregate import RunRecord
    from experiments.report import Report

log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).parent / "templates"


# ---------------------------------------------------------------------------------------------
# charts, configuration, tables


_XML_PROLOG = re.compile(r"<\?xml.*?\?>\s*|<!DOCTYPE.*?>\s*|<metadata>.*?</metadata>\s*", re.S)
_ID = re.compile(r'\bid="([^"]+)"')
_SIZE = re.compile(r'(<svg\b[^>]*?)\s+width="[^"]*"\s+height="[^"]*"', re.S)
_EXTERNAL = re.compile(r'(?:href|src)\s*=\s*"(?!#|data:)|url\((?!#|data:)|@import', re.I)  # heatmaps are data: PNGs


def inline_svg(svg: str, prefix: str) -> str:
    """A matplotlib SVG ready to inline: no prolog or metadata, ids prefixed (several charts share
    glyph and clip-path ids), scaled to its container; refuses anything that could fetch."""
    svg = _XML_PROLOG.sub("", svg)
    svg = _ID.sub(lambda m: f'id="{prefix}{m.group(1)}"', svg)
    svg = re.sub(r'(xlink:href|href)="#', lambda m: f'{m.group(1)}="#{prefix}', svg)
    svg = re.sub(r"url\(#", f"url(#{prefix}", svg)
    svg = _SIZE.sub(r'\1 width="100%"', svg, count=1)
    if _EXTERNAL.search(svg):
        raise ValueError("chart SVG refers to an external resource")
    return svg.strip()


def chart_svgs(rep: Report) -> list[dict[str, str]]:
    """The summary's charts as inline SVG; rendered into a scratch directory when the summary was
    asked for PNG only."""
    from experiments.report import make_charts

    paths = [p for p in rep.charts if p.suffix == ".svg"]
    tmp = None
    if not paths and not rep.frame.empty and rep.settings.charts:
        tmp = tempfile.TemporaryDirectory(prefix="ragrig-report-")
        try:
            paths = [p for p in make_charts(rep, Path(tmp.name), ("svg",)) if p.suffix == ".svg"]
        except Exception:
            log.exception("report.html: charts failed")
    try:
        return [{"name": p.stem, "title": p.stem.replace("_", " "), "svg": inline_svg(p.read_text(encoding="utf-8"), f"c{i}-")}
                for i, p in enumerate(paths)]
    finally:
        if tmp is not None:
            tmp.cleanup()


def flatten(cfg: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(cfg, dict):
        out: dict[str, str] = {}
        for k, v in cfg.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    value = json.dumps(cfg, ensure_ascii=False) if isinstance(cfg, list) else str(cfg)
    return {prefix.rstrip("."): value}


def config_rows(records: list[RunRecord]) -> list[dict[str, Any]]:
    """Every config key of every run; keys whose values differ first (those are highlighted)."""
    flat = [flatten(r.config or {}) for r in records]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    rows: list[dict[str, Any]] = []
    for k in keys:
        values = [f.get(k, "") for f in flat]
        rows.append({"key": k, "values": values, "differs": len(set(values)) > 1})
    return sorted(rows, key=lambda r: not r["differs"])


def _result_rows(rep: Report) -> list[dict[str, Any]]:
    cmp = {(str(r["label"]), r["metric"]): r for _, r in rep.comparison.iterrows()} if not rep.comparison.empty else {}
    rows = []
    for _, row in rep.frame.iterrows():
        lab = str(row["label"])
        cells = []
        for m in rep.metrics:
            v = row.get(m)
            c = cmp.get((lab, m))
            cell: dict[str, Any] = {
                "value": MI.fmt(m, v) if has_value(v) else "",
                "ci": f"[{MI.fmt(m, row.get(f'{m}_ci_low'))}, {MI.fmt(m, row.get(f'{m}_ci_high'))}]",
                "marker": "", "cls": "", "diff": "", "p": ""}
            if c is not None:
                cell.update(marker=c["marker"], cls=_significance_class(c),
                            diff=f"{MI.fmt(m, c['diff'], True)} [{MI.fmt(m, c['ci_low'], True)}, "
                                 f"{MI.fmt(m, c['ci_high'], True)}]",
                            p=_p(c["p_value"]), p_holm=_p(c["p_holm"]), n=int(c["n"]),
                            wtl=(f"{int(c['wins'])} / {int(c['ties'])} / {int(c['losses'])}"
                                 if "wins" in c and c["wins"] == c["wins"] else ""))
            cells.append(cell)
        rows.append({"label": lab, "job": row["job"], "status": row["status"], "error": row.get("error", ""),
                     "baseline": lab == rep.baseline, "cells": cells})
    return rows


def served_rows(rep: Report) -> tuple[list[str], list[dict[str, Any]]]:
    """(role columns, rows): per run, the requests it sent to served models and their cost
    (metrics.json `usage`; the summary's Cost section)."""
    if rep.frame.empty:
        return [], []
    roles = [c.removesuffix("_requests") for c in rep.frame.columns if c.endswith("_requests")]
    if not roles:
        return [], []
    def num(v: Any, fmt: str) -> str:
        return format(v, fmt) if has_value(v) else ""

    rows = []
    for _, row in rep.frame.iterrows():
        cells = [f"{num(row.get(f'{r}_requests'), '.0f')} / {num(row.get(f'cost_{r}'), '.4f')}" for r in roles]
        rows.append({"label": str(row["label"]), "cells": cells, "total": num(row.get("cost_total"), ".4f"),
                     "currency": row.get("currency") if isinstance(row.get("currency"), str) else ""})
    return roles, rows


def corpus_rows(rep: Report, metrics: list[str]) -> list[dict[str, Any]]:
    """Mean [95% CI] of each headline metric per question corpus and run (from metrics.json)."""
    bc = rep.by_corpus
    if bc.empty:
        return []
    idx = bc.set_index(["corpus", "run", "metric"])
    rows = []
    for corpus in dict.fromkeys(bc["corpus"]):
        for run in dict.fromkeys(bc["run"]):
            cells = []
            for m in metrics:
                if (corpus, run, m) in idx.index:
                    r = idx.loc[(corpus, run, m)]
                    cells.append(f"{MI.fmt(m, r['mean'])} [{MI.fmt(m, r['ci_low'])}, {MI.fmt(m, r['ci_high'])}]")
                else:
                    cells.append("")
            n = bc[(bc["corpus"] == corpus) & (bc["run"] == run)]["n"]
            rows.append({"corpus": corpus, "run": run, "n": int(n.max()) if len(n) else 0, "cells": cells})
    return rows


def sample_notes(records: list[RunRecord]) -> list[str]:
    """Each sample a run took (metrics.json `slice`), once per distinct line; the runs it applies
    to are named when not every run took it: a report never hides that questions were left out."""
    from rag.corpus.slicing import Kept

    ok = [(r, r.result) for r in records if r.ok and r.result is not None]
    runs: dict[str, list[str]] = {}
    for r, result in ok:
        for key, entry in (result.slice or {}).items():
            k = Kept.from_json(key, entry)
            if k.sampled:
                runs.setdefault(k.line(), []).append(r.variant)
    return [line if len(names) == len(ok) else f"{line}: {', '.join(names)}" for line, names in runs.items()]


def stopped_notes(records: list[RunRecord]) -> list[str]:
    """Each run's answers that stopped at the token limit (metrics.json `stopped_answers`), once
    per distinct line, the runs named when not every run has it: cut-off answers score worse, and a
    report says so beside its answer metrics."""
    from rag.llm.base import Stopped

    ok = [r.result for r in records if r.ok and r.result is not None]
    runs: dict[str, list[str]] = {}
    for r in records:
        entry = r.result.stopped_answers if r.ok and r.result is not None else None
        if entry and entry.get("stopped"):
            runs.setdefault(Stopped.from_json(entry).line(), []).append(r.variant)
    return [line if len(names) == len(ok) else f"{line}: {', '.join(names)}" for line, names in runs.items()]


def _significance_class(c: Any) -> str:
    """A compared cell's CSS class: better or worse where significant after correction and at
    least the smallest difference that matters."""
    if not c["significant"] or not c.get("matters", True):
        return ""
    return "better" if c["better"] else "worse"


def _p(p: Any) -> str:
    if not has_value(p):
        return "–"
    return f"{p:.2g}" if p >= 0.001 else f"{p:.0e}"


def _thresholds(records: list[RunRecord]) -> tuple[Any, Any]:
    for r in records:
        ev = (r.config or {}).get("eval") or {}
        if ev:
            return ev.get("tau_recall", 0.75), ev.get("tau_h", 0.5)
    return 0.75, 0.5


# ---------------------------------------------------------------------------------------------
# the page


def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=jinja2.select_autoescape(
        ["html", "j2"]), trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)


def render_html(rep: Report, records: list[RunRecord]) -> str:
    from experiments.report import best_run, method_note
    from experiments.verdict import headline_metrics, mde_text

    k = rep.k
    tau_recall, tau_h = _thresholds(records)
    ok_labels = rep.ok_labels
    metric_meta = [{**MI.describe(m, k, tau_recall, tau_h), "short": MI.label(m, k)} for m in rep.metrics]
    key = headline_metrics(rep.objective, rep.metrics, 3)
    header: Header = {"runs": ok_labels, "baseline": rep.baseline, "metrics": metric_meta, "objective": rep.objective,
                      "key": key[:2], "tau_recall": tau_recall}
    payload, data = page_json(rep, records, header)
    best = best_run(rep)
    return _env().get_template("report.html.j2").render(
        title=rep.settings.title, source=rep.source, generated=time.strftime("%Y-%m-%d %H:%M:%S"),
        verdict=rep.verdict, baseline=rep.baseline, n_tests=rep.n_tests, alpha=rep.alpha, k=k,
        metrics=metric_meta, results=_result_rows(rep), has_comparison=not rep.comparison.empty,
        mde=[{"label": MI.label(r["metric"], k), "mde": mde_text(r["metric"], r["mde"]),
              "nominal": mde_text(r["metric"], r["mde_nominal"]), "sd": MI.fmt(r["metric"], r["sd_diff"]),
              "n": int(r["n"]), "basis": r["basis"]} for _, r in rep.mde.iterrows()] if not rep.mde.empty else [],
        mde_alpha=f"{rep.alpha:g}/{max(rep.n_tests, 1)}", method=method_note(rep) if rep.n_tests else "",
        charts=chart_svgs(rep), runs=[str(x) for x in rep.frame["label"]] if not rep.frame.empty else [],
        config=config_rows(records), objective=MI.label(rep.objective, k), varying=rep.varying,
        corpus_metrics=[MI.label(m, k) for m in rep.headline()], corpus_rows=corpus_rows(rep, rep.headline()),
        served=served_rows(rep),
        best=None if best is None else {"label": best["label"], "value": MI.fmt(rep.objective, best[rep.objective])},
        n_questions=len(data["questions"]), context_limit=data["context_limit"], lower_note=MI.LOWER_NOTE,
        samples=sample_notes(records), stopped=stopped_notes(records), provenance=rep.provenance.page_lines(),
        fitted=rep.fitted.lines(), routing=rep.routing,
        data_json=payload, css=(TEMPLATES / "report.css").read_text(encoding="utf-8"),
        js=(TEMPLATES / "report.js").read_text(encoding="utf-8"), esc=html.escape,
    )


def write_html(rep: Report, records: list[RunRecord], path: Path) -> Path:
    """Renders the page and writes it atomically (a half-written report is never left behind)."""
    from rag.store.cache import atomic_write_text

    path = Path(path)
    atomic_write_text(path, render_html(rep, records))
    return path


def write_run_report(run_dir: Path, max_context_chars: int = 1200) -> Path | None:
    """report.html next to one run's metrics.json (its metrics, charts and every question). Never
    raises: the run's results are already written, a report problem is only logged."""
    try:
        from experiments.aggregate import load_records
        from experiments.report import ReportSettings, analyze

        run_dir = Path(run_dir)
        records = [r for r in load_records([run_dir]) if r.path.resolve() == run_dir.resolve()]
        if not records or not records[0].ok:
            return None
        # No charts: a run's page must stay cheap (no matplotlib), its tables carry the numbers.
        settings = ReportSettings(title=f"Run {records[0].variant}: {run_dir.name}", charts=False,
                                  max_context_chars=max_context_chars)
        rep = analyze(records, run_dir, settings, source=f"Run directory: `{run_dir}`")
        return write_html(rep, records, run_dir / "report.html")
    except Exception as e:
        from rag.store.cache import storage_fault

        fault = storage_fault(e)
        if fault is not None:  # a full or read-only disk is no bug: one line, no traceback
            log.warning("report.html for %s not written (%s: %s); the run's results are unaffected",
                        run_dir, fault.strerror, fault.filename or run_dir)
        else:
            log.exception("report.html for %s failed; the run's results are unaffected", run_dir)
        return None
