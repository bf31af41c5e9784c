"""Run and sweep directories: a results directory only ever holds the results of the run that
wrote it, and a sweep's summary covers exactly the jobs of that sweep.

- Default directories are unique per process (`${ragrig_run_id:}` in conf/config.yaml), so runs
  started in the same second never share one.
- A run claims its directory (`claim`): an exclusive lock held while it runs (a second run pointed
  at the same directory stops with one line), a marker `.ragrig_run.json` (pid, start time and, in
  a sweep, the sweep's id), and the removal of an earlier run's result files and log, so a rerun
  into a fixed `hydra.run.dir` that fails leaves no stale metrics behind.
- A multirun stamps its sweep directory at start (`.ragrig_sweep.json`, a fresh id). A job
  directory belongs to that sweep when its marker carries the id (or, written by a job that died
  before claiming it, is no older than the stamp); job directories left by an earlier sweep in a
  reused `hydra.sweep.dir` are left out of the summary and of `experiments.compare`.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import socket
import time
import uuid
from pathlib import Path
from typing import IO, Any

from rag.cache import atomic_write_text
from rag.types import RagError

log = logging.getLogger(__name__)

RUN_MARKER = ".ragrig_run.json"
SWEEP_STAMP = ".ragrig_sweep.json"
LOCK_FILE = ".ragrig.lock"
# Everything a run writes into its directory besides Hydra's own (.hydra/, the log) and the marker
# and lock: an earlier run's copies are removed when a run claims the directory, so that a rerun
# that fails leaves nothing a reader (compare, a TREC tool, a person) could take for its results.
# tests/test_rundir.py checks that a real run writes nothing that is not listed here.
RESULT_FILES = ("metrics.json", "per_question.jsonl", "config_resolved.yaml", "failure.json",
                "run.trec", "qrels.trec", "report.html", "dry_run.json")
# What a comparison report (a sweep's or experiments.compare's) writes, besides charts/.
REPORT_FILES = ("summary.csv", "summary.md", "comparison.csv", "report.html")
# Temporary names of atomic writes (rag.cache.atomic_write_text) that a killed run left behind.
STAGED_GLOB = ".*.tmp-*"

_held: dict[Path, IO[str]] = {}  # the locks of the directories this process has claimed (held until exit)


def claim(output_dir: str | Path, sweep_dir: str | Path | None = None, job: int | None = None) -> dict[str, Any]:
    """Claims `output_dir` for this process; returns its marker. Raises RagError when another live
    run holds it."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if out.resolve() not in _held:  # a second job of this process in the same directory keeps the lock
        fh = open(out / LOCK_FILE, "a+")  # noqa: SIM115 -- held (locked) until the process exits
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise RagError(
                f"output directory {out} is in use by another run; give each run its own hydra.run.dir "
                "(the default is unique per run)"
            ) from None
        _held[out.resolve()] = fh
    earlier = (out / RUN_MARKER).exists() or any((out / f).exists() for f in RESULT_FILES)
    if earlier:
        stale = [f for f in RESULT_FILES if (out / f).exists()]
        for f in stale:
            (out / f).unlink(missing_ok=True)
        for p in out.glob(STAGED_GLOB):
            if p.is_file():
                p.unlink(missing_ok=True)
        _truncate_logs(out)
        if stale:
            log.warning("%s held the results of an earlier run (%s); they were removed", out, ", ".join(stale))
    stamp = read_sweep_stamp(sweep_dir) if sweep_dir is not None else None
    marker = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.time(),
        "sweep_id": stamp["id"] if stamp else None,
        "job": job,
    }
    atomic_write_text(out / RUN_MARKER, json.dumps(marker, indent=2))
    return marker


def _truncate_logs(out: Path) -> None:
    """An earlier run's lines in the log file Hydra opened (in append mode) for this run."""
    for h in logging.getLogger().handlers:
        name = getattr(h, "baseFilename", None)
        stream = getattr(h, "stream", None)
        if name and stream is not None and Path(name).parent == out.resolve():
            h.acquire()
            try:
                stream.seek(0)
                stream.truncate()
            finally:
                h.release()


def write_sweep_stamp(sweep_dir: str | Path) -> dict[str, Any]:
    d = Path(sweep_dir)
    d.mkdir(parents=True, exist_ok=True)
    stamp = {"id": uuid.uuid4().hex, "started": time.time(), "pid": os.getpid(), "host": socket.gethostname()}
    earlier = read_sweep_stamp(d) is not None or (d / "multirun.yaml").exists()
    if earlier:
        # The earlier sweep's report describes jobs this sweep overwrites: it goes now, so that no
        # stale table or chart sits beside the new one.
        remove_report(d)
        log.warning("sweep directory %s was used by an earlier sweep: its report was removed, and its job "
                    "directories are left out of this sweep's summary (overwritten where numbers repeat)", d)
    atomic_write_text(d / SWEEP_STAMP, json.dumps(stamp, indent=2))
    return stamp


def remove_report(d: Path) -> list[str]:
    """Removes a comparison report (experiments.report: REPORT_FILES and charts/) from `d`, so that
    a new report written there has no stale table or chart of an earlier one beside it; returns
    what it removed."""
    gone = [p.name for p in (d / name for name in REPORT_FILES) if p.is_file()]
    for name in gone:
        (d / name).unlink(missing_ok=True)
    if (d / "charts").is_dir():
        shutil.rmtree(d / "charts", ignore_errors=True)
        gone.append("charts/")
    return gone


def read_sweep_stamp(sweep_dir: str | Path) -> dict[str, Any] | None:
    return _read_json(Path(sweep_dir) / SWEEP_STAMP)


def read_marker(run_dir: str | Path) -> dict[str, Any] | None:
    return _read_json(Path(run_dir) / RUN_MARKER)


def belongs_to_sweep(run_dir: Path, stamp: dict[str, Any]) -> bool:
    """Whether a job directory under a stamped sweep directory was written by that sweep."""
    marker = read_marker(run_dir)
    if marker is not None:
        return marker.get("sweep_id") == stamp.get("id")
    # A job that died before claiming its directory: judge by when Hydra wrote its config.
    try:
        written = (run_dir / ".hydra" / "overrides.yaml").stat().st_mtime
    except OSError:
        return False
    return written >= float(stamp.get("started", 0)) - 1.0


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
