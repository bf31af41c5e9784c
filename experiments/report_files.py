"""Writing a report's files into one directory: summary.csv, comparison.csv, charts/, summary.md
(experiments.report) and report.html (experiments.html_report). Above both, so that neither
imports the other's writer.

A report lists what it wrote in the directory's marker (rag.rundir.REPORT_MARKER): a later report
there removes or replaces those files only, and one that would overwrite a file it did not write
(a user's own summary.md or charts/figure1.png) refuses instead."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from experiments.aggregate import RunRecord
from experiments.html_report import write_html
from experiments.report import Report, ReportSettings, analyze, make_charts, summary_markdown
from rag.atomic import atomic_write_text
from rag.rundir import REPORT_FILES, REPORT_MARKER, foreign_entry, report_listing
from rag.types import RagError

log = logging.getLogger(__name__)


def build_report(records: list[RunRecord], out_dir: Path, settings: ReportSettings | None = None,
                 source: str = "") -> Report:
    """Writes summary.csv, comparison.csv, charts/, summary.md and report.html into `out_dir`, and
    the marker listing them. Raises RagError, having written nothing, when a file of those names
    there was not written by a ragrig report."""
    settings = settings or ReportSettings()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    clash = overwritten_foreign(out_dir)
    if clash is not None:
        raise RagError(f"{out_dir / clash} was not written by a ragrig report; the report would replace it "
                       "(move it, or write the report elsewhere: python -m experiments.compare ... --out NEW_DIR)")
    charts_before = set((out_dir / "charts").rglob("*")) if (out_dir / "charts").is_dir() else set()
    rep = analyze(records, out_dir, settings, source)
    rep.frame.to_csv(out_dir / "summary.csv", index=False)
    rep.comparison.to_csv(out_dir / "comparison.csv", index=False)
    if settings.charts and not rep.frame.empty:
        try:
            rep.charts = make_charts(rep, out_dir / "charts", tuple(settings.formats))
        except Exception:  # a chart must never cost the tables
            log.exception("report: charts failed")
    (out_dir / "summary.md").write_text(summary_markdown(rep, rep.k, source), encoding="utf-8")
    if settings.html:
        try:
            rep.html = write_html(rep, records, out_dir / "report.html")
        except Exception:  # the page must never cost the tables
            log.exception("report: report.html failed")
    # charts a failed make_charts wrote before failing are the report's too
    new_charts = [p for p in (out_dir / "charts").rglob("*") if p.is_file() and p not in charts_before] \
        if (out_dir / "charts").is_dir() else []
    written = {p.relative_to(out_dir).as_posix() for p in [*rep.files, *new_charts] if Path(p).is_file()}
    atomic_write_text(out_dir / REPORT_MARKER, json.dumps({"files": sorted(written)}, indent=2))
    return rep


def overwritten_foreign(out_dir: Path) -> str | None:
    """The first file a report would write over in `out_dir` that no ragrig report wrote there."""
    mine = set(report_listing(out_dir))
    for name in REPORT_FILES:
        if (out_dir / name).exists() and name not in mine:
            return name
    charts = out_dir / "charts"
    if not charts.is_dir():
        return None
    inside = foreign_entry(charts, {m.removeprefix("charts/") for m in mine})
    return f"charts/{inside}" if inside else None


def foreign_in_out(out_dir: Path) -> str | None:
    """The first file in a comparison's --out that the comparison written there earlier did not
    write (a comparison's directory holds nothing else); None when there is none."""
    return foreign_entry(out_dir, {REPORT_MARKER, *report_listing(out_dir)})
