"""Hydra callbacks (registered in conf/config.yaml under `hydra.callbacks`).

`SweepSummaryCallback.on_multirun_end` runs once, in the launching process, after every job of a
multirun (basic, joblib or Optuna): it writes summary.csv, comparison.csv, summary.md, charts/ and
report.html into the sweep directory (see experiments.report), and prints the verdict, the
headline table and where those files are: the multirun's last words on the terminal. It also opens and closes the tracker's parent
run for the sweep when tracking is on. It is imported for every run, so it imports nothing heavy
until a multirun ends.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


def _report_settings(config: DictConfig, defaults: dict[str, Any]) -> dict[str, Any]:
    node = config.get("report")
    own = OmegaConf.to_container(node, resolve=True) if node is not None else {}
    return {**defaults, **{k: v for k, v in (own or {}).items() if v is not None}}


def _tracker(config: DictConfig) -> Any:
    node = config.get("tracking")
    if node is None or node.get("_target_") is None:
        return None
    from hydra.utils import instantiate

    tracker = instantiate(node)
    return tracker if getattr(tracker, "enabled", False) else None


class SweepSummaryCallback(Callback):
    def __init__(self, enabled: bool = True, baseline: str | None = None, formats: Any = ("png", "svg"),
                 charts: bool = True, html: bool = True) -> None:
        self.enabled = enabled
        self.defaults = {"baseline": baseline, "formats": list(formats), "charts": charts, "html": html}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            tracker = _tracker(config)
            if tracker is not None:
                tracker.start_sweep(config.hydra.sweep.dir, list(config.hydra.overrides.task))
        except Exception as e:  # noqa: BLE001
            log.warning("tracking: could not start the sweep's run (%s: %s)", type(e).__name__, e)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        files: list[Path] = []
        if self.enabled:
            files = write_sweep_summary(sweep_dir, _report_settings(config, self.defaults))
        try:
            tracker = _tracker(config)
            if tracker is not None:
                tracker.end_sweep(sweep_dir, files)
        except Exception as e:  # noqa: BLE001
            log.warning("tracking: could not close the sweep's run (%s: %s)", type(e).__name__, e)


def write_sweep_summary(sweep_dir: Path, settings: dict[str, Any] | None = None) -> list[Path]:
    """Builds the report of every job under `sweep_dir` into `sweep_dir`. Never raises: a broken
    summary must not turn a finished sweep into a failed command."""
    try:
        from experiments.aggregate import load_records
        from experiments.report import ReportSettings, build_report

        s = settings or {}
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
        )
        rep = build_report(records, sweep_dir, rs, source=f"Sweep directory: `{sweep_dir}`")
        n_failed = int((rep.frame["status"] != "ok").sum())
        log.info("sweep summary: %d jobs (%d failed) -> %s", len(rep.frame), n_failed, sweep_dir / "summary.md")
        print(f"sweep summary: {len(rep.frame)} jobs ({n_failed} failed)")
        print(rep.terminal(), flush=True)
        return rep.files
    except Exception:
        log.exception("sweep summary failed for %s", sweep_dir)
        return []
