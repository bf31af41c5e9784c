"""Writing a report's files into one directory: summary.csv, comparison.csv, charts/, summary.md
(experiments.report) and report.html (experiments.html_report). Above both, so that neither
imports the other's writer."""
from __future__ import annotations

import logging
from pathlib import Path

from experiments.aggregate import RunRecord
from experiments.html_report import write_html
from experiments.report import Report, ReportSettings, analyze, make_charts, summary_markdown

log = logging.getLogger(__name__)


def build_report(records: list[RunRecord], out_dir: Path, settings: ReportSettings | None = None,
                 source: str = "") -> Report:
    """Writes summary.csv, comparison.csv, charts/, summary.md and report.html into `out_dir`."""
    settings = settings or ReportSettings()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
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
    return rep
