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
- A sweep locks its directory for as long as it runs (`lock_sweep`, the same lock as a run
  directory's): a second sweep into the same `hydra.sweep.dir` stops with one line. A job refused
  its directory (a user's file there, or another run in it) is recorded in the sweep directory
  (`record_refused`), so that the summary lists it as a failed job rather than losing it.
- A report's marker (`.ragrig_report.json`) lists the files it wrote: relative paths inside the
  directory only, never through a link (`report_listing` ignores any other entry). It is written
  first, in a "writing" state that already claims the files the report is about to write, so
  that the leftovers of an interrupted report are known as ragrig's.
- A run whose labels are being pooled carries `pooling_pending.json` (experiments.pooling) from
  before its files are rewritten until every pooled run is done; readers refuse it, naming the
  one command that finishes it.
- ragrig writes no links: a link where ragrig would write or remove a file is never its own.
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

from rag.store.atomic import atomic_write_text
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
                "run.trec", "qrels.trec", "report.html", "dry_run.json", "pooling_pending.json")
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
# A run whose files experiments.pooling is rewriting (see `mark_pooling`).
POOLING_PENDING = "pooling_pending.json"
# The lock a sweep holds on its directory while it runs, and the record of its refused jobs.
SWEEP_LOCK = ".ragrig_sweep.lock"
REFUSED_DIR = ".ragrig_refused"
# What Hydra or ragrig write at the top of a sweep directory besides the report and the stamp:
# ragrig's only where its stamp says a ragrig sweep used the directory.
SWEEP_FILES = ("multirun.yaml", "dry_run.json", "optimization_results.yaml")
# A report's charts are drawn here first (a fresh name each time) and moved into charts/ once
# the marker lists them.
CHART_STAGING = ".charts.tmp-"
# Temporary names of atomic writes (rag.store.atomic.atomic_write_text) that a killed run left behind.
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
    # a second job of this process in the same directory keeps the lock
    _lock(out / LOCK_FILE, f"output directory {out} is in use by another run{{holder}}; give each run its own "
                           "hydra.run.dir (the default is unique per run)")
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
    _unlock(Path(output_dir) / LOCK_FILE)


def _lock(path: Path, busy: str) -> None:
    """Takes the exclusive lock of `path` for this process, held until it exits or `_unlock`s;
    RagError `busy` (its `{holder}` filled in) when another process holds it. The kernel drops a
    lock with its holder, so a lock file a killed process left never blocks. The holder's pid and
    command line are written into the file for that message only, and named there only while that
    pid is alive with that command line (a pid is reused; the file may be anyone's copy)."""
    key = path.parent.resolve() / path.name
    if key in _held:
        return
    try:  # never through a link: the pid written below would overwrite the link's target
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError:
        if path.is_symlink():
            raise RagError(f"{path} is a link; ragrig's lock file never is one: remove it") from None
        raise
    fh = os.fdopen(fd, "r+", encoding="utf-8")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fh.read())
        fh.close()
        raise RagError(busy.replace("{holder}", holder)) from None
    fh.seek(0)
    fh.truncate()
    fh.write(json.dumps({"pid": os.getpid(), "cmdline": _cmdline(os.getpid())}))
    fh.flush()
    _held[key] = fh


def _unlock(path: Path) -> None:
    fh = _held.pop(path.parent.resolve() / path.name, None)
    if fh is not None:
        fh.close()


def _cmdline(pid: int) -> list[str] | None:
    """A process's command line, redacted (it is written into the lock file and may be shown), or
    None where it cannot be read (no /proc, or no such process)."""
    from rag.serving.secrets import redact

    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [redact(a.decode("utf-8", "replace")) for a in raw.split(b"\0") if a] or None


def _holder(text: str) -> str:
    """' (pid N: its command)' for the holder a lock file names, when that pid is alive and runs
    the command line recorded beside it; else '' (nothing known is better than a wrong pid)."""
    try:
        data = json.loads(text)
        pid, recorded = int(data["pid"]), data["cmdline"]
    except (ValueError, KeyError, TypeError):
        return ""
    if not recorded or pid <= 0 or _cmdline(pid) != recorded:
        return ""
    return f" (pid {pid}: {' '.join(str(a) for a in recorded)[:160]})"


def lock_sweep(sweep_dir: str | Path) -> None:
    """Holds the sweep directory for this process until it exits or `unlock_sweep`: a second sweep
    into it stops with one line (RagError) before it writes anything."""
    d = Path(sweep_dir)
    d.mkdir(parents=True, exist_ok=True)
    _lock(d / SWEEP_LOCK, f"sweep directory {d} is in use by another sweep{{holder}}; give this sweep its own "
                          "hydra.sweep.dir (the default is unique per sweep)")


def unlock_sweep(sweep_dir: str | Path) -> None:
    _unlock(Path(sweep_dir) / SWEEP_LOCK)


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
    log, or that is a link (whatever its name: ragrig writes none); None when there is none.
    Folders are judged by their files (ragrig removes none); a link to a folder is a file here.
    Stops at the first: a large folder given by mistake costs little."""
    for top, dirs, files in os.walk(d):
        dirs.sort()
        links = [n for n in dirs if os.path.islink(os.path.join(top, n))]
        for name in sorted([*files, *links]):
            path = Path(top) / name
            rel = path.relative_to(d).as_posix()
            if path.is_symlink():  # ragrig writes no links: a listed name that is one was put there since
                return rel
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
    earlier = read_sweep_stamp(d) is not None
    # The earlier sweep's report describes jobs this sweep overwrites: it goes now, so that no
    # stale table or chart sits beside the new one.
    removed = remove_report(d)
    if removed:
        log.warning("sweep directory %s was used by an earlier sweep: its report was removed (%s), and its job "
                    "directories are left out of this sweep's summary (overwritten where numbers repeat)",
                    d, ", ".join(removed))
    elif earlier:
        log.warning("sweep directory %s was used by an earlier sweep: its job directories are left out of this "
                    "sweep's summary (overwritten where numbers repeat)", d)
    for old in _refusal_files(d):  # the earlier sweep's refused jobs are no jobs of this one
        old.unlink(missing_ok=True)
    atomic_write_text(d / SWEEP_STAMP, json.dumps(stamp, indent=2))
    return stamp


def foreign_sweep_file(sweep_dir: str | Path) -> str | None:
    """The first of the files Hydra and ragrig write at the top of a sweep directory
    (SWEEP_FILES: multirun.yaml, ...) that a sweep would overwrite there although no ragrig sweep
    wrote it: any of them in a directory without ragrig's stamp, and a link or folder anywhere."""
    d = Path(sweep_dir)
    stamped = not (d / SWEEP_STAMP).is_symlink() and read_sweep_stamp(d) is not None
    for name in SWEEP_FILES:
        p = d / name
        if p.is_symlink() or (p.exists() and not (stamped and p.is_file())):
            return name
    return None


def record_refused(sweep_dir: str | Path, job: int | None, output_dir: str | Path, message: str,
                   overrides: list[str]) -> None:
    """Records a sweep job that was refused its directory (it holds a user's file, or another run
    is in it) in the sweep directory, where the job itself may write nothing: the summary lists it
    as a failed job. A record that cannot be written is a warning (the job's own line was printed)."""
    d = Path(sweep_dir)
    name = f"{REFUSED_DIR}/{job if job is not None else Path(output_dir).name}.json"
    stamp = read_sweep_stamp(d)
    doc = {"sweep_id": stamp.get("id") if stamp else None, "job": job, "dir": str(output_dir),
           "error_type": "Refused", "message": message, "overrides": overrides}
    try:
        if not inside(d, name):
            raise OSError(f"{d / REFUSED_DIR} is a link")
        atomic_write_text(d / name, json.dumps(doc, indent=2))
    except OSError as e:
        log.warning("could not record the refused job %s in %s: %s", job, d, e)


def refused_jobs(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """The jobs of the sweep that last stamped `sweep_dir` that were refused their directories
    (`record_refused`), in job order."""
    stamp = read_sweep_stamp(sweep_dir)
    if stamp is None:
        return []
    found = [r for r in map(_read_json, _refusal_files(Path(sweep_dir))) if r and r.get("sweep_id") == stamp.get("id")]
    return sorted(found, key=lambda r: (not isinstance(r.get("job"), int), r.get("job") or 0, str(r.get("dir"))))


def _refusal_files(d: Path) -> list[Path]:
    folder = d / REFUSED_DIR
    if folder.is_symlink() or not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.json") if p.is_file() and not p.is_symlink())


def inside(d: Path, rel: str) -> bool:
    """Whether `rel` names a path strictly inside `d`, reached without a link: relative, no '..'
    or empty part, and no part of it (itself included) a link. What a marker lists is used only so."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(part in ("", ".", "..") for part in parts):
        return False
    p = Path(d)
    for part in parts:
        p = p / part
        if p.is_symlink():
            return False
    return True


def _listing(d: Path) -> tuple[list[str], list[str]]:
    """(the entries of `d`'s report marker that name files inside `d`, those that do not). A marker
    that is itself a link lists nothing."""
    if (d / REPORT_MARKER).is_symlink():
        return [], []
    marker = _read_json(d / REPORT_MARKER) or {}
    files = marker.get("files")
    listed = [str(f) for f in files if isinstance(f, str)] if isinstance(files, list) else []
    safe = [f for f in listed if inside(d, f)]
    staging = marker.get("staging")
    if (isinstance(staging, str) and staging.startswith(CHART_STAGING) and "/" not in staging
            and inside(d, staging) and (d / staging).is_dir()):
        # an interrupted report's charts, drawn but not yet moved into charts/: all its own
        for top, _, names in os.walk(d / staging):
            safe += [(Path(top) / n).relative_to(d).as_posix() for n in sorted(names)
                     if not os.path.islink(os.path.join(top, n))]
    return safe, [f for f in listed if f not in safe]


def report_listing(d: Path) -> list[str]:
    """The files (relative paths inside `d`, reached without a link) the comparison report in `d`
    wrote or was writing there, from its marker."""
    return _listing(Path(d))[0]


def foreign_report_file(out_dir: Path) -> str | None:
    """The first file a report would write over in `out_dir` that no ragrig report wrote there, or
    a link where a report writes (its marker, a table, charts/ or a chart: ragrig writes no link,
    and one would carry the report's writes and removals out of the directory)."""
    marker = out_dir / REPORT_MARKER
    if marker.is_symlink() or (marker.exists() and not marker.is_file()):
        return REPORT_MARKER
    mine = set(report_listing(out_dir))
    for name in REPORT_FILES:
        p = out_dir / name
        if p.is_symlink() or (p.exists() and (name not in mine or not p.is_file())):
            return name
    charts = out_dir / "charts"
    if charts.is_symlink() or (charts.exists() and not charts.is_dir()):
        return "charts"
    if not charts.is_dir():
        return None
    entry = foreign_entry(charts, {m.removeprefix("charts/") for m in mine})
    return f"charts/{entry}" if entry else None


def foreign_line(out_dir: Path, name: str) -> str:
    """What is wrong with the file `foreign_report_file` found, in words."""
    if (out_dir / name).is_symlink():
        return f"{out_dir / name} is a link, which a ragrig report never writes; the report would write through it"
    return f"{out_dir / name} was not written by a ragrig report; the report would replace it"


def remove_report(d: Path) -> list[str]:
    """Removes the comparison report a ragrig report wrote in `d` (the files its marker lists, and
    the folders they leave empty), so that a new report written there has no stale table or chart
    of an earlier one beside it; returns what it removed. Nothing it did not write is touched: an
    entry naming a path outside `d` or through a link is ignored (a results folder may come from
    anyone), and so is a listed name that is now a link or a folder."""
    d = Path(d)
    safe, ignored = _listing(d)
    if ignored:
        log.warning("%s lists %s, which %s not inside %s: left alone", d / REPORT_MARKER, ", ".join(map(repr, ignored)),
                    "is" if len(ignored) == 1 else "are", d)
    gone = []
    for rel in safe:
        p = d / rel
        if p.is_file() and not p.is_symlink():
            p.unlink(missing_ok=True)
            gone.append(rel)
    folders = {parent for rel in gone for parent in (d / rel).parents if parent != d and d in parent.parents}
    for folder in sorted(folders, key=lambda p: -len(p.parts)):
        if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
            folder.rmdir()
    if not (d / REPORT_MARKER).is_symlink():
        (d / REPORT_MARKER).unlink(missing_ok=True)
    return gone


class Unfinished(KeyboardInterrupt):
    """A Ctrl-C that left result files unfinished: `left` says which, and how to finish them (the
    command's interrupt line must not say that nothing half-written was left)."""

    def __init__(self, left: str) -> None:
        super().__init__(left)
        self.left = left


def mark_pooling(run_dirs: list[Path], command: str) -> None:
    """Marks each run "pooling pending" before any of them is rewritten (experiments.pooling): until
    `clear_pooling`, its per_question.jsonl and metrics.json may disagree, and `command` finishes them."""
    doc = json.dumps({"command": command, "runs": [str(r) for r in run_dirs]}, indent=2)
    for r in run_dirs:
        atomic_write_text(Path(r) / POOLING_PENDING, doc)


def clear_pooling(run_dirs: list[Path]) -> None:
    for r in run_dirs:
        p = Path(r) / POOLING_PENDING
        if not p.is_symlink():
            p.unlink(missing_ok=True)


def pooling_pending(run_dir: str | Path) -> str | None:
    """Why a reader must not use a run that pooling was interrupted in (its per_question.jsonl and
    metrics.json may disagree), naming the one command that finishes it; None when its files are whole."""
    p = Path(run_dir) / POOLING_PENDING
    if not (p.exists() or p.is_symlink()):
        return None
    command = (_read_json(p) or {}).get("command") or f"python -m experiments.pooling {run_dir}"
    return (f"{run_dir}: pooling its relevance labels was interrupted ({POOLING_PENDING}), so its "
            f"per_question.jsonl and metrics.json may disagree; finish it with: {command}")


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
