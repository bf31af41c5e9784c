"""Experiment tracking: `tracking=none` (default) or `tracking=mlflow`.

The tracker is built from `cfg.tracking` (`_target_`) by run.py after the pipeline, and by the
sweep callback at the start and end of a multirun:

- per job: params (the run's config-group choices and its overrides, flattened), metrics (each
  metric's mean and CI bounds, per-corpus means, latency, counts, objective), and artifacts
  (metrics.json, per_question.jsonl, config_resolved.yaml, and a chart of the run's metrics);
  a failed job is logged with status FAILED and its error.
- per multirun: a parent run holding the sweep's summary.csv/summary.md and charts; each job's
  run is its child (`mlflow.parentRunId`), found through a small file in the sweep directory.

MLflow is imported only when tracking is on. The store is local by default
(`file:${paths.root}/outputs/mlruns`); browse it with
`MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri outputs/mlruns` (MLflow 3 opens file
stores only on request).
"""
from __future__ import annotations

import logging
import math
import os
import re
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rag.store import strict_json
from rag.store.atomic import atomic_write_text
from rag.run.result import RunResult

log = logging.getLogger(__name__)

PARENT_RUN_FILE = ".mlflow_parent_run"
_PARAM_MAX = 500  # characters kept of a param value (MLflow's own limit is larger)


class Tracker:
    """No tracking: every hook does nothing."""

    enabled = False

    def log_job(self, output_dir: str | Path, result: RunResult | dict[str, Any] | None = None,
                failure: dict[str, Any] | None = None, overrides: Iterable[str] = (),
                choices: dict[str, Any] | None = None, sweep_dir: str | Path | None = None,
                job_name: str | None = None) -> str | None:
        return None

    def start_sweep(self, sweep_dir: str | Path, overrides: Iterable[str] = ()) -> str | None:
        return None

    def end_sweep(self, sweep_dir: str | Path, files: Iterable[Path] = ()) -> None:
        return None


class NullTracker(Tracker):
    def __init__(self, **_: Any) -> None:
        pass


def _safe_key(key: str) -> str:
    # MLflow keys: alphanumerics, underscores, dashes, periods, spaces, slashes.
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", key).strip() or "_"


def flatten_params(overrides: Iterable[str], choices: dict[str, Any] | None) -> dict[str, str]:
    """Config-group choices (`chunker=sliding_window`) then the overrides (`fusion.alpha=0.3`,
    `+version=v2` as `version`), later ones winning; Hydra's own groups are left out."""
    params: dict[str, str] = {}
    for group, choice in (choices or {}).items():
        if group.startswith("hydra") or choice is None:
            continue
        # A nested group (llm/prompt) beside its parent's choice (llm) would be a file and a
        # directory of one name in MLflow's store: name it by its package path instead.
        params[_safe_key(str(group).replace("/", "."))] = str(choice)
    for o in overrides:
        key, sep, value = str(o).partition("=")
        key = key.lstrip("+~")
        if not sep or key.startswith("hydra"):
            continue
        params[_safe_key(key)] = value
    return {k: v[:_PARAM_MAX] for k, v in params.items()}


def as_result(result: RunResult | dict[str, Any] | None) -> RunResult | None:
    """run.py hands over pipeline.run's return value: a metrics.json document today, a RunResult
    once the pipeline builds one; None (or a dry run's plan) has nothing to log."""
    if result is None or isinstance(result, RunResult):
        return result
    return None if "dry_run" in result else RunResult.from_json(result)


def metrics_of(result: RunResult | dict[str, Any] | None) -> dict[str, float]:
    """The run's flat row as MLflow metrics: numbers only (NaN and None left out), no `_n`
    columns, and `objective` is the objective's value (logged last)."""
    result = as_result(result)
    if result is None:
        return {}
    out = result.flatten(with_n=False)
    del out["objective"]
    value = out.pop("objective_value")
    if value is not None:
        out["objective"] = value
    clean = {}
    for k, v in out.items():
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if not math.isnan(f):
            clean[_safe_key(k)] = f
    return clean


def mlflow_client(tracking_uri: str) -> Any:
    """An MlflowClient for `tracking_uri`. MLflow 3 opens a file store (`file:...` or a plain
    path) only when MLFLOW_ALLOW_FILE_STORE=true: it is set here, because the file store is the
    one that parallel jobs (joblib) share without a server (one directory per run, no locking).
    To browse it: MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri outputs/mlruns"""
    if tracking_uri.startswith("file:") or "://" not in tracking_uri:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        Path(tracking_uri.removeprefix("file://").removeprefix("file:")).mkdir(parents=True, exist_ok=True)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


class MLflowTracker(Tracker):
    enabled = True

    def __init__(self, tracking_uri: str, experiment: str = "ragrig", log_artifacts: bool = True,
                 run_chart: bool = True, tags: dict[str, Any] | None = None) -> None:
        self.tracking_uri = str(tracking_uri)
        self.experiment = str(experiment)
        self.log_artifacts = bool(log_artifacts)
        self.run_chart = bool(run_chart)
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self._client: Any = None
        self._experiment_id: str | None = None

    # -- MLflow plumbing --------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = mlflow_client(self.tracking_uri)
        return self._client

    def experiment_id(self) -> str:
        if self._experiment_id is None:
            exp = self.client.get_experiment_by_name(self.experiment)
            if exp is None:
                try:
                    self._experiment_id = self.client.create_experiment(self.experiment)
                except Exception:  # parallel jobs: another process created it first
                    exp = self.client.get_experiment_by_name(self.experiment)
                    if exp is None:
                        raise
                    self._experiment_id = exp.experiment_id
            else:
                self._experiment_id = exp.experiment_id
        return self._experiment_id

    def _log_batch(self, run_id: str, params: dict[str, str], metrics: dict[str, float],
                   tags: dict[str, str]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        ts = int(time.time() * 1000)
        p = [Param(k, v) for k, v in params.items()]
        m = [Metric(k, v, ts, 0) for k, v in metrics.items()]
        t = [RunTag(k, v) for k, v in tags.items()]
        for i in range(0, max(len(p), len(m), len(t), 1), 100):  # MLflow's batch limits
            self.client.log_batch(run_id, metrics=m[i:i + 100], params=p[i:i + 100], tags=t[i:i + 100])

    def _log_files(self, run_id: str, files: Iterable[Path], artifact_path: str | None = None) -> None:
        for f in files:
            f = Path(f)
            if f.is_file():
                self.client.log_artifact(run_id, str(f), artifact_path)

    # -- hooks ------------------------------------------------------------------------------------

    def log_job(self, output_dir: str | Path, result: RunResult | dict[str, Any] | None = None,
                failure: dict[str, Any] | None = None, overrides: Iterable[str] = (),
                choices: dict[str, Any] | None = None, sweep_dir: str | Path | None = None,
                job_name: str | None = None) -> str | None:
        out = Path(output_dir)
        result = as_result(result)
        tags = {**self.tags, "ragrig.output_dir": str(out.resolve())}
        variant = (result.variant if result else None) or (choices or {}).get("version") or "custom"
        tags["ragrig.variant"] = str(variant)
        if sweep_dir is not None:
            tags["ragrig.sweep_dir"] = str(Path(sweep_dir).resolve())
            parent = Path(sweep_dir) / PARENT_RUN_FILE
            if parent.exists():
                tags["mlflow.parentRunId"] = parent.read_text().strip()
        if failure:
            tags["ragrig.error_type"] = str(failure.get("error_type", ""))
            tags["ragrig.error"] = str(failure.get("message", ""))[:5000]
        run = self.client.create_run(self.experiment_id(), run_name=job_name or f"{variant}-{out.name}", tags=tags)
        run_id = run.info.run_id
        status = "FAILED" if failure else "FINISHED"
        try:
            self._log_batch(run_id, flatten_params(overrides, choices), metrics_of(result), {})
            if self.log_artifacts:
                files = [out / n for n in ("metrics.json", "per_question.jsonl", "config_resolved.yaml", "failure.json")]
                self._log_files(run_id, files)
                if result and self.run_chart:
                    from experiments.panels import run_chart

                    with tempfile.TemporaryDirectory() as tmp:
                        self._log_files(run_id, run_chart(result, Path(tmp)), "charts")
        except Exception:
            status = "FAILED"
            raise
        finally:
            self.client.set_terminated(run_id, status=status)
        return run_id

    def start_sweep(self, sweep_dir: str | Path, overrides: Iterable[str] = ()) -> str | None:
        sweep_dir = Path(sweep_dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        tags = {**self.tags, "ragrig.sweep_dir": str(sweep_dir.resolve()), "ragrig.kind": "sweep"}
        run = self.client.create_run(self.experiment_id(), run_name=f"sweep-{sweep_dir.name}", tags=tags)
        params = {_safe_key(f"sweep_arg.{i}"): str(o)[:_PARAM_MAX] for i, o in enumerate(overrides)}
        if params:
            self._log_batch(run.info.run_id, params, {}, {})
        (sweep_dir / PARENT_RUN_FILE).write_text(run.info.run_id)
        return run.info.run_id

    def end_sweep(self, sweep_dir: str | Path, files: Iterable[Path] = ()) -> None:
        sweep_dir = Path(sweep_dir)
        marker = sweep_dir / PARENT_RUN_FILE
        if not marker.exists():
            return
        run_id = marker.read_text().strip()
        try:
            if self.log_artifacts:
                for f in files:
                    f = Path(f)
                    rel = f.relative_to(sweep_dir).parent.as_posix() if f.is_relative_to(sweep_dir) else ""
                    self._log_files(run_id, [f], rel if rel not in ("", ".") else None)
            summary = sweep_dir / "summary.csv"
            if summary.exists():
                import pandas as pd

                df = pd.read_csv(summary)
                stats = {"jobs": float(len(df)), "jobs_failed": float((df["status"] != "ok").sum())}
                if "objective_value" in df and df["objective_value"].notna().any():
                    stats["best_objective"] = float(df["objective_value"].max())
                self._log_batch(run_id, {}, stats, {})
        finally:
            self.client.set_terminated(run_id, status="FINISHED")


def job_failure(exc: BaseException) -> dict[str, Any]:
    """The small record a failed multirun job leaves behind (failure.json)."""
    message = " ".join(str(exc).split()) or type(exc).__name__
    return {"error_type": type(exc).__name__, "message": message[:2000],
            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, strict_json.dumps(obj, indent=2))
