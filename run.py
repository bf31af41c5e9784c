"""ragrig's entry point: `python run.py +version=v2`, or a sweep with `python run.py -m ...`.

`main()` returns the configured objective metric so that Hydra sweepers can optimize it.

In a multirun, a job whose pipeline raises does not stop the sweep: it leaves `failure.json`
(error type and a one-line message) in its output directory, logs the error and returns NaN (an
Optuna sweeper records the trial as failed); the summary written at the end of the multirun
(experiments.callbacks) marks it failed. A single run keeps the plain behaviour: a user error
(RagError) is one line on stderr and exit status 2.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from rag.config import register_resolvers

register_resolvers()
log = logging.getLogger("ragrig")


def _track(cfg: DictConfig, output_dir: str, result: dict | None = None, failure: dict | None = None) -> None:
    """Hands the finished (or failed) job to the configured tracker (`tracking=...`). A tracking
    problem is logged, never allowed to fail a run whose results are already written."""
    if cfg.get("tracking") is None or cfg.tracking.get("_target_") is None:
        return
    try:
        from hydra.utils import instantiate

        tracker = instantiate(cfg.tracking)
        if not getattr(tracker, "enabled", False):
            return
        hc = HydraConfig.get()
        multirun = hc.mode == RunMode.MULTIRUN
        tracker.log_job(
            output_dir,
            result=result,
            failure=failure,
            overrides=list(hc.overrides.task),
            choices=dict(hc.runtime.choices),
            sweep_dir=hc.sweep.dir if multirun else None,
            job_name=f"{cfg.get('variant', 'custom')}-{hc.job.num}" if multirun else None,
        )
    except Exception as e:  # noqa: BLE001
        log.warning("tracking failed (%s: %s); the run's results are in %s", type(e).__name__, e, output_dir)


def _quiet_loaders() -> None:
    """Model loaders' own progress bars ("Loading weights") say nothing a user acts on; the
    pipeline's bars (chunking, embedding, generation) stay."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    from rag.pipeline import format_table, run
    from rag.types import RagError

    _quiet_loaders()

    hc = HydraConfig.get()
    output_dir = hc.runtime.output_dir
    multirun = hc.mode == RunMode.MULTIRUN
    try:
        result = run(cfg, output_dir)
    except Exception as e:
        if multirun:
            # Record the failure and let the other jobs of the sweep run.
            from experiments.tracking import job_failure, write_json

            failure = job_failure(e)
            failure["overrides"] = list(hc.overrides.task)
            write_json(Path(output_dir) / "failure.json", failure)
            if isinstance(e, RagError):
                log.error("job %s failed: %s", hc.job.num, failure["message"])
            else:
                log.exception("job %s failed: %s: %s", hc.job.num, failure["error_type"], failure["message"])
            print(f"ragrig: job {hc.job.num} failed: {failure['error_type']}: {failure['message']}", file=sys.stderr)
            _track(cfg, output_dir, failure=failure)
            return float("nan")
        if isinstance(e, RagError):
            # A user error gets one line, not a traceback from deep inside a library.
            log.error("error: %s", e)
            print(f"ragrig: error: {e}", file=sys.stderr)
            sys.exit(2)
        raise
    if multirun:
        (Path(output_dir) / "failure.json").unlink(missing_ok=True)  # a stale one from an earlier attempt
    print(format_table(result))
    print(f"results: {output_dir}")
    _track(cfg, output_dir, result=result)
    return float(result["objective"]["value"])


if __name__ == "__main__":
    main()
