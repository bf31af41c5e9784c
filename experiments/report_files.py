"""Writing a report's files into one directory: summary.csv, comparison.csv, charts/, summary.md
(experiments.report) and report.html (experiments.html_report). Above both, so that neither
imports the other's writer.

A report lists what it wrote in the directory's marker (rag.run.rundir.REPORT_MARKER): a later report
there removes or replaces those files only, and one that would overwrite a file it did not write
(a user's own summary.md or charts/figure1.png) refuses instead."""
from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from pathlib import Path

from experiments.aggregate import RunRecord
from experiments.html_report import write_html
from experiments.report import Report, ReportSettings, analyze, make_charts, summary_markdown
from rag.store.atomic import atomic_write_text
from rag.run.rundir import (CHART_STAGING, REPORT_FILES, REPORT_MARKER, foreign_entry, foreign_line,
                        foreign_report_file, report_listing)
from rag.types import RagError

log = logging.getLogger(__name__)


def build_report(records: list[RunRecord], out_dir: Path, settings: ReportSettings | None = None,
                 source: str = "") -> Report:
    """Writes summary.csv, comparison.csv, charts/, summary.md and report.html into `out_dir`, and
    the marker listing them. Raises RagError, having written nothing, when a file of those names
    there was not written by a ragrig report (or is a link: ragrig writes none).

    The marker is written first, in a "writing" state that claims every file the report may write
    (and keeps the earlier report's listed): an interrupted report leaves only files its marker
    lists, which the next report there replaces. Charts are drawn into a staging folder the marker
    names and moved into charts/ once the marker lists them."""
    settings = settings or ReportSettings()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    clash = foreign_report_file(out_dir)
    if clash is not None:
        raise RagError(foreign_line(out_dir, clash) + " (move it, or write the report elsewhere: "
                       "python -m experiments.compare ... --out NEW_DIR)")
    listed = report_listing(out_dir)
    _drop_staged(out_dir, [f for f in listed if f.startswith(CHART_STAGING)])
    kept = [f for f in listed if not f.startswith(CHART_STAGING) and (out_dir / f).is_file()]
    claimed = sorted({*kept, *REPORT_FILES})
    staging = f"{CHART_STAGING}{uuid.uuid4().hex[:12]}"
    _mark(out_dir, claimed, staging)
    rep = analyze(records, out_dir, settings, source)
    rep.frame.to_csv(out_dir / "summary.csv", index=False)
    rep.comparison.to_csv(out_dir / "comparison.csv", index=False)
    if settings.charts and not rep.frame.empty:
        rep.charts = _draw_charts(rep, out_dir, staging, claimed, tuple(settings.formats))
    (out_dir / "summary.md").write_text(summary_markdown(rep, rep.k, source), encoding="utf-8")
    if settings.html:
        try:
            rep.html = write_html(rep, records, out_dir / "report.html")
        except Exception:  # the page must never cost the tables
            log.exception("report: report.html failed")
    written = {Path(p).relative_to(out_dir).as_posix() for p in rep.files if Path(p).is_file()}
    written |= {f for f in kept if (out_dir / f).is_file()}  # the earlier report's, still there: still its own
    atomic_write_text(out_dir / REPORT_MARKER, json.dumps({"state": "done", "files": sorted(written)}, indent=2))
    return rep


def _drop_staged(out_dir: Path, staged: list[str]) -> None:
    """The charts an interrupted report drew but never moved into charts/ (its marker lists them)."""
    for rel in staged:
        (out_dir / rel).unlink(missing_ok=True)
    for folder in sorted({(out_dir / rel).parent for rel in staged}, key=lambda p: -len(p.parts)):
        while folder != out_dir and folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent


def _mark(out_dir: Path, files: list[str], staging: str) -> None:
    """The marker of a report being written: what it claims so far, and its charts' staging folder."""
    atomic_write_text(out_dir / REPORT_MARKER, json.dumps({"state": "writing", "files": files, "staging": staging},
                                                          indent=2))


def _draw_charts(rep: Report, out_dir: Path, staging: str, claimed: list[str], formats: tuple[str, ...]) -> list[Path]:
    """The report's charts, drawn into `staging` and moved into charts/ once the marker lists them;
    what a failing make_charts drew before it failed is the report's too."""
    stage = out_dir / staging
    drawn: list[Path] = []
    try:
        drawn = make_charts(rep, stage, formats)
    except Exception:  # a chart must never cost the tables
        log.exception("report: charts failed")
    if not stage.is_dir():
        return []
    files = sorted(p for p in stage.rglob("*") if p.is_file() and not p.is_symlink())
    charts = out_dir / "charts"
    _mark(out_dir, sorted({*claimed, *((charts / p.relative_to(stage)).relative_to(out_dir).as_posix() for p in files)}),
          staging)
    for src in files:
        dst = charts / src.relative_to(stage)
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)
    shutil.rmtree(stage, ignore_errors=True)
    return [charts / Path(p).relative_to(stage) for p in drawn]


def foreign_in_out(out_dir: Path) -> str | None:
    """The first file in a comparison's --out that the comparison written there earlier did not
    write (a comparison's directory holds nothing else), or a link; None when there is none."""
    marker = out_dir / REPORT_MARKER
    mine = set(report_listing(out_dir)) | (set() if marker.is_symlink() else {REPORT_MARKER})
    return foreign_entry(out_dir, mine)
