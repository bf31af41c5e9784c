"""Run and sweep directories: a results directory only ever holds the results of the run that
wrote it, and a sweep's summary covers exactly the jobs of that sweep.

- Default directories are unique per process (`${ragrig_run_id:}` in conf/config.yaml), so runs
  started in the same second never share one.
- A run claims its directory (`claim`): an exclusive lock held while it runs (a second run pointed
  at the same directory stops with one line), a marker `.ragrig_run.json` (pid, start time, in a
  sweep the sweep's id, and the files the run writes there), and the removal of an earlier run's
  result files and log, so a rerun into a fixed `hydra.run.dir` that fails leaves no stale metrics
  behind. ragrig removes or replaces only what a marker lists: a directory holding anything else
  (files of the user's, or of another program) is refused before anything is written into it.
- Hydra's record of the run (.hydra/config.yaml, hydra.yaml, overrides.yaml) is written by ragrig
  (`write_hydra_record`) once the directory is claimed, with anything secret-looking redacted
  (Hydra's own copy is off: `hydra.output_subdir: null`), so a refused run writes nothing.
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
import socket
import time
import uuid
from pathlib import Path
from typing import IO, Any

from rag.atomic import atomic_write_text
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
# The run's record of its configuration, written by write_hydra_record where Hydra would.
HYDRA_RECORD = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml")
LOG_FILE = "run.log"  # Hydra's job log, <job name>.log (run.py's job is `run`)
# A marker written before markers listed their files: what ragrig wrote into a run directory then.
_LEGACY_FILES = (*RESULT_FILES, *HYDRA_RECORD, LOG_FILE)
# What a comparison report (a sweep's or experiments.compare's) writes, besides charts/.
REPORT_FILES = ("summary.csv", "summary.md", "comparison.csv", "report.html")
# The list of the files a comparison report wrote into its directory (experiments.report_files):
# the only files a later report there removes or replaces.
REPORT_MARKER = ".ragrig_report.json"
# Temporary names of atomic writes (rag.atomic.atomic_write_text) that a killed run left behind.
STAGED_GLOB = ".*.tmp-*"

_held: dict[Path, IO[str]] = {}  # the locks of the directories this process has claimed (held until exit)


def claim(output_dir: str | Path, sweep_dir: str | Path | None = None, job: int | None = None) -> dict[str, Any]:
    """Claims `output_dir` for this process; returns its marker. Raises RagError, having written
    nothing there, when the directory holds a file no ragrig run wrote or another live run holds it."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    foreign = foreign_entry(out, owned(read_marker(out)))
    if foreign is not None:
        setting = "hydra.sweep.dir" if sweep_dir is not None else "hydra.run.dir"
        raise RagError(f"output directory {out} holds {foreign}, which no ragrig run wrote there; ragrig replaces "
                       f"only its own results: give this run a new or empty {setting} (the default is unique per run)")
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
    earlier = (out / RUN_MARKER).exists()
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
        "files": sorted({*RESULT_FILES, *HYDRA_RECORD, *_log_names(out)}),
    }
    atomic_write_text(out / RUN_MARKER, json.dumps(marker, indent=2))
    return marker


def release(output_dir: str | Path) -> None:
    """Gives up this process's claim on `output_dir` (a finished run of the Python API: a notebook
    runs many in one process, which would otherwise hold a lock file open for each)."""
    fh = _held.pop(Path(output_dir).resolve(), None)
    if fh is not None:
        fh.close()


def owned(marker: dict[str, Any] | None) -> set[str]:
    """The files (relative paths) a run directory's marker proves ragrig wrote; with no marker,
    none but an empty log (Hydra may open one before the task, in an empty directory)."""
    if marker is None:
        return {LOCK_FILE}
    files = marker.get("files")
    listed = [str(f) for f in files] if isinstance(files, list) else list(_LEGACY_FILES)
    return {RUN_MARKER, LOCK_FILE, *listed}


def foreign_entry(d: Path, mine: set[str]) -> str | None:
    """The first file under `d` (a relative path; a folder's own files before its subfolders') that
    is not in `mine`, nor a staged copy of one (an atomic write that was interrupted), nor an empty
    log; None when there is none. Folders are judged by their files (ragrig removes none); a link
    to a folder is a file here. Stops at the first: a large folder given by mistake costs little."""
    for top, dirs, files in os.walk(d):
        dirs.sort()
        links = [n for n in dirs if os.path.islink(os.path.join(top, n))]
        for name in sorted([*files, *links]):
            path = Path(top) / name
            rel = path.relative_to(d).as_posix()
            if rel in mine or _staged_target(rel) in mine:
                continue
            if rel == LOG_FILE and path.is_file() and not path.is_symlink() and path.stat().st_size == 0:
                continue
            return rel
    return None


def _staged_target(rel: str) -> str | None:
    """The file an interrupted atomic write was replacing (`.metrics.json.tmp-ab12` -> metrics.json)."""
    head, _, name = rel.rpartition("/")
    if not name.startswith(".") or ".tmp-" not in name:
        return None
    target = name[1:].rpartition(".tmp-")[0]
    return f"{head}/{target}" if head else target


def _log_names(out: Path) -> list[str]:
    """The log files Hydra's handlers write in `out` (run.log unless the job has another name)."""
    files = [Path(name) for h in logging.getLogger().handlers if (name := getattr(h, "baseFilename", None))]
    names = [f.name for f in files if f.parent == out.resolve()]
    return names or [LOG_FILE]


def _truncate_logs(out: Path) -> None:
    """An earlier run's lines in the log file Hydra opened (in append mode) for this run; a log
    not opened yet (delayed until its first record) is removed, to be created afresh."""
    for h in logging.getLogger().handlers:
        name = getattr(h, "baseFilename", None)
        if not name or Path(name).parent != out.resolve():
            continue
        h.acquire()
        try:
            stream = getattr(h, "stream", None)
            if stream is None:
                Path(name).unlink(missing_ok=True)
            else:
                stream.seek(0)
                stream.truncate()
        finally:
            h.release()


def write_hydra_record(out: str | Path, texts: dict[str, str]) -> None:
    """.hydra/config.yaml, hydra.yaml and overrides.yaml (`texts` by file name, YAML as Hydra
    writes it; run.py redacts them), where Hydra would have written them: experiments.aggregate
    reads them."""
    for rel in HYDRA_RECORD:
        atomic_write_text(Path(out) / rel, texts[Path(rel).name])


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


def report_listing(d: Path) -> list[str]:
    """The files (relative paths) the comparison report in `d` wrote there, from its marker."""
    marker = _read_json(Path(d) / REPORT_MARKER)
    files = marker.get("files") if marker else None
    return [str(f) for f in files if isinstance(f, str)] if isinstance(files, list) else []


def remove_report(d: Path) -> list[str]:
    """Removes the comparison report a ragrig report wrote in `d` (the files its marker lists, and
    the folders they leave empty), so that a new report written there has no stale table or chart
    of an earlier one beside it; returns what it removed. Nothing it did not write is touched."""
    d = Path(d)
    gone = []
    for rel in report_listing(d):
        p = d / rel
        if ".." not in Path(rel).parts and (p.is_file() or p.is_symlink()):
            p.unlink(missing_ok=True)
            gone.append(rel)
    for folder in sorted({(d / rel).parent for rel in gone}, key=lambda p: -len(p.parts)):
        if folder != d and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    (d / REPORT_MARKER).unlink(missing_ok=True)
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
