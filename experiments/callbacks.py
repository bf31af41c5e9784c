"""Hydra callbacks (registered in conf/config.yaml under `hydra.callbacks`).

`SweepSummaryCallback.on_multirun_end` runs once, in the launching process, after every job of a
multirun (basic, joblib or Optuna): it writes summary.csv, comparison.csv, summary.md, charts/ and
report.html into the sweep directory (see experiments.report), and prints the verdict, the
headline table and where those files are: the multirun's last words on the terminal. It also opens and closes the tracker's parent
run for the sweep when tracking is on. It is imported for every run, so it imports nothing heavy
until a multirun ends.

`on_run_start` and `on_multirun_start` refuse a secret-looking value (rag.serving.secrets) before Hydra
writes anything. `on_multirun_start` (which Hydra calls before its sweeper writes multirun.yaml)
then claims the sweep directory (`claim_sweep_dir`): a file there the sweep would replace that no
ragrig sweep wrote (a user's multirun.yaml or summary.md, a link for charts/) and a directory
another sweep holds are refused in one line, exit status 2, before anything is written; the
directory stays locked until the sweep ends. It stamps the sweep directory with a fresh id
(rag.run.rundir): the summary covers exactly the jobs of this multirun, also in a reused
`hydra.sweep.dir`, and lists a job refused its directory as failed. `sweep_exit_status()` is
what run.py exits with after a multirun: 1 when every job failed (or, with `report.fail_on=any`,
when any job failed), else 0.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

if TYPE_CHECKING:
    from experiments.tracking import Tracker

log = logging.getLogger(__name__)

FAIL_ON = ("all", "any", "never")
_exit_status = 0


def sweep_exit_status() -> int:
    """The exit status the last multirun of this process earned (see the module docstring)."""
    return _exit_status


def _report_settings(config: DictConfig, defaults: dict[str, Any]) -> dict[str, Any]:
    node = config.get("report")
    own = OmegaConf.to_container(node, resolve=True) if node is not None else None
    if not isinstance(own, dict):  # no report node
        return dict(defaults)
    return {**defaults, **{str(k): v for k, v in own.items() if v is not None}}


def _tracker(config: DictConfig) -> Tracker | None:
    node = config.get("tracking")
    if node is None or node.get("_target_") is None:
        return None
    from hydra.utils import instantiate

    from experiments.tracking import Tracker

    tracker = instantiate(node)
    return tracker if isinstance(tracker, Tracker) and tracker.enabled else None


class SweepSummaryCallback(Callback):
    def __init__(self, enabled: bool = True, baseline: str | None = None, formats: Any = ("png", "svg"),
                 charts: bool = True, html: bool = True) -> None:
        self.enabled = enabled
        self.defaults = {"baseline": baseline, "formats": list(formats), "charts": charts, "html": html}

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        refuse_secrets(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from rag.run.rundir import write_sweep_stamp

        global _exit_status
        _exit_status = 0
        refuse_secrets(config)
        claim_sweep_dir(Path(str(config.hydra.sweep.dir)))
        write_sweep_stamp(str(config.hydra.sweep.dir))
        try:
            tracker = _tracker(config)
            if tracker is not None:
                tracker.start_sweep(config.hydra.sweep.dir, list(config.hydra.overrides.task))
        except Exception as e:  # noqa: BLE001
            log.warning("tracking: could not start the sweep's run (%s: %s)", type(e).__name__, e)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from rag.run.rundir import unlock_sweep

        sweep_dir = Path(str(config.hydra.sweep.dir))
        try:
            self._end(config, sweep_dir)
        finally:
            unlock_sweep(sweep_dir)

    def _end(self, config: DictConfig, sweep_dir: Path) -> None:
        global _exit_status
        if config.get("dry_run") or OmegaConf.select(config, "llm.dry_run", default=False):
            _exit_status = report_dry_sweep(sweep_dir)
            return
        files: list[Path] = []
        settings = _report_settings(config, self.defaults)
        if self.enabled:
            files = write_sweep_summary(sweep_dir, settings)
        _exit_status = judge_sweep(sweep_dir, settings.get("fail_on") or "all")
        try:
            tracker = _tracker(config)
            if tracker is not None:
                tracker.end_sweep(sweep_dir, files)
        except Exception as e:  # noqa: BLE001
            log.warning("tracking: could not close the sweep's run (%s: %s)", type(e).__name__, e)


def claim_sweep_dir(sweep_dir: Path) -> None:
    """Refuses the sweep (one line, exit status 2) when `sweep_dir` holds a file the sweep would
    replace that no ragrig sweep or report wrote there (rag.run.rundir.foreign_sweep_file,
    foreign_report_file), or another sweep holds it; else locks it for this process. Called before
    Hydra writes multirun.yaml, so a refused sweep writes nothing; SystemExit, since Hydra turns a
    callback's exceptions into warnings and carries on."""
    import sys

    from rag.run.rundir import foreign_line, foreign_report_file, foreign_sweep_file, lock_sweep
    from rag.types import RagError

    try:
        if sweep_dir.is_dir():  # read only: a refused directory gets not even a lock file
            name = foreign_sweep_file(sweep_dir)
            if name is not None:
                why = (f"{sweep_dir / name} is a link, which a ragrig sweep never writes" if (sweep_dir / name).is_symlink()
                       else f"{sweep_dir / name} was not written by a ragrig sweep")
                raise RagError(f"{why}; the sweep would replace it: move it, or give the sweep a new hydra.sweep.dir")
            name = foreign_report_file(sweep_dir)
            if name is not None:
                raise RagError(f"{foreign_line(sweep_dir, name)}: move it, or give the sweep a new hydra.sweep.dir")
        lock_sweep(sweep_dir)
    except RagError as e:
        print(f"ragrig: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as e:  # the directory cannot be made or locked: Hydra would fail on it next, less clearly
        print(f"ragrig: error: hydra.sweep.dir {sweep_dir}: {e.strerror or e}", file=sys.stderr)
        raise SystemExit(2) from None


def refuse_secrets(config: DictConfig) -> None:
    """Stops the command (one line, exit status 2) when the composed config or an override holds
    a secret-looking value (rag.serving.secrets): called before Hydra writes anything (the run's directory,
    a sweep's multirun.yaml, the jobs' overrides on the terminal). SystemExit, since Hydra turns a
    callback's exceptions into warnings and carries on."""
    import sys

    from rag.serving.secrets import config_problem

    line = config_problem(OmegaConf.to_container(config, resolve=False))
    if line:
        print(f"ragrig: error: {line}", file=sys.stderr)
        raise SystemExit(2)


def report_dry_sweep(sweep_dir: Path) -> int:
    """A dry sweep's last words: the jobs' plans as one (rag.run.plan.combine), printed and written to
    the sweep's dry_run.json; 1 when no job made a plan."""
    import sys

    from rag.run.plan import PLAN_FILE, format_plan, write_sweep_plan

    combined = write_sweep_plan(sweep_dir)
    if combined is None:
        print(f"ragrig: no job of the dry sweep made a plan; see {sweep_dir}", file=sys.stderr)
        return 1
    print(format_plan(combined))
    print(f"plan: {sweep_dir / PLAN_FILE}")
    return 0


def write_sweep_summary(sweep_dir: Path, settings: dict[str, Any] | None = None) -> list[Path]:
    """Builds the report of every job under `sweep_dir` into `sweep_dir`. Never raises: a broken
    summary must not turn a finished sweep into a failed command."""
    import sys

    try:
        from experiments.aggregate import load_records
        from experiments.report import ReportSettings
        from experiments.report_files import build_report

        s = settings or {}
        pool_sweep(sweep_dir)
        records = load_records([sweep_dir])
        if not records:
            log.warning("sweep summary: no jobs found under %s", sweep_dir)
            return []
        rs = ReportSettings(
            baseline=None if s.get("baseline") in (None, "") else str(s["baseline"]),
            formats=tuple(s.get("formats") or ("png", "svg")),
            charts=bool(s.get("charts", True)),
            resamples=s.get("resamples"),
            seed=s.get("seed"),
            title=f"Sweep summary: {sweep_dir.name}",
            html=bool(s.get("html", True)),
            **({"max_context_chars": int(s["max_context_chars"])} if s.get("max_context_chars") else {}),
            min_effect=dict(s.get("min_effect") or {}),
        )
        try:
            rep = build_report(records, sweep_dir, rs, source=f"Sweep directory: `{sweep_dir}`")
        except KeyboardInterrupt:
            from rag.run.rundir import Unfinished

            raise Unfinished(f"the sweep's report in {sweep_dir} was left unfinished (its marker lists what it "
                             f"wrote, so the next sweep there replaces it); the whole report: "
                             f"python -m experiments.compare {sweep_dir}") from None
        n_failed = int((rep.frame["status"] != "ok").sum())
        log.info("sweep summary: %d jobs (%d failed) -> %s", len(rep.frame), n_failed, sweep_dir / "summary.md")
        print(f"sweep summary: {len(rep.frame)} jobs ({n_failed} failed)")
        print(rep.terminal(), flush=True)
        return rep.files
    except Exception as e:
        from rag.types import RagError

        if isinstance(e, RagError):  # a file of the user's where the summary would go: left alone
            print(f"ragrig: the sweep's summary was not written: {e}", file=sys.stderr)
        else:
            log.exception("sweep summary failed for %s", sweep_dir)
        return []


def pool_sweep(sweep_dir: Path) -> None:
    """eval.relevance=llm: every run scored again on the labels of all runs' judged chunks
    (experiments/pooling.py), before the summary reads them."""
    from experiments.aggregate import find_run_dirs
    from experiments.pooling import finish_command, pool_runs

    pool_runs(find_run_dirs([sweep_dir]), finish_command([sweep_dir]))


def judge_sweep(sweep_dir: Path, fail_on: str) -> int:
    """1 when the sweep failed by `fail_on` (all: every job failed or none ran; any: a job failed;
    never), with one line on stderr naming the failed jobs; else 0."""
    import sys

    from experiments.aggregate import load_records

    if fail_on not in FAIL_ON:
        print(f"ragrig: report.fail_on must be one of {', '.join(FAIL_ON)}, got {fail_on!r}; using 'all'", file=sys.stderr)
        fail_on = "all"
    try:
        records = load_records([sweep_dir])
    except Exception as e:  # noqa: BLE001
        log.warning("could not judge the sweep in %s: %s", sweep_dir, e)
        return 0
    failed = [r for r in records if not r.ok]
    names = ", ".join(str(r.job_num if r.job_num is not None else r.path.name) for r in failed)
    if fail_on != "never" and (not records or len(failed) == len(records)):
        n = f"{len(records)} job{'s' if len(records) != 1 else ''}"
        print(f"ragrig: every job of the sweep failed ({n}: {names or 'none ran'}); see {sweep_dir}", file=sys.stderr)
        return 1
    if fail_on == "any" and failed:
        print(f"ragrig: {len(failed)} of {len(records)} jobs failed (jobs {names}; report.fail_on=any)", file=sys.stderr)
        return 1
    return 0
