"""ragrig's entry point: `python run.py +version=v2`, or a sweep with `python run.py -m ...`.

`main()` returns the configured objective metric so that Hydra sweepers can optimize it.

In a multirun, a job whose pipeline raises does not stop the sweep: it leaves `failure.json`
(error type and a one-line message) in its output directory, logs the error and returns NaN (an
Optuna sweeper records the trial as failed); the summary written at the end of the multirun
(experiments.callbacks) marks it failed. A single run keeps the plain behaviour: a user error
(RagError) is one line on stderr and exit status 2.

Exit status: 0 done; 2 a user error (bad input, a bad override or config value: one line, no
traceback); 130 interrupted (Ctrl-C; results are written whole or not at all); 1 a multirun whose
jobs all failed (`report.fail_on=any`: any job), or an unexpected error (with its traceback).
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from rag.config.compose import register_resolvers

register_resolvers()
log = logging.getLogger("ragrig")
# A log handler that cannot write (run.log on a full disk) must not print a traceback per record:
# the run's own writes fail on the same disk and say so in one line.
logging.raiseExceptions = False


def _track(cfg: DictConfig, output_dir: str, result: dict | None = None, failure: dict | None = None) -> None:
    """Hands the finished (or failed) job to the configured tracker (`tracking=...`). A tracking
    problem is logged, never allowed to fail a run whose results are already written."""
    if cfg.get("tracking") is None or cfg.tracking.get("_target_") is None:
        return
    try:
        from hydra.utils import instantiate

        from experiments.tracking import Tracker

        tracker = instantiate(cfg.tracking)
        if not (isinstance(tracker, Tracker) and tracker.enabled):
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


_task_started = False  # errors before the task are Hydra's (composing the config, making the run dir)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    global _task_started
    _task_started = True
    # Only light imports before the directory is claimed: a library logging as it loads (faiss)
    # would write run.log into a directory the run then refuses.
    from rag.run import rundir
    from rag.logs import FILE_ONLY
    from rag.serving.secrets import redact
    from rag.types import RagError

    hc = HydraConfig.get()
    output_dir = hc.runtime.output_dir
    multirun = hc.mode == RunMode.MULTIRUN
    refused = _secret_line(cfg, list(hc.overrides.task))
    if refused:  # (the callbacks refuse it before Hydra writes anything; this covers a run without them)
        print(f"ragrig: error: {refused}", file=sys.stderr)
        if multirun:
            return float("nan")
        sys.exit(2)
    try:
        rundir.claim(output_dir, hc.sweep.dir if multirun else None, hc.job.num if multirun else None)
        rundir.write_hydra_record(output_dir, _hydra_record(cfg))
    except (OSError, RagError) as e:
        # Another live run owns the directory, or it holds files no ragrig run wrote: write
        # nothing into it, not even a failure record; a sweep's job is recorded as refused in
        # the sweep's own directory instead, so that the summary counts it as failed.
        line = str(e) if isinstance(e, RagError) else _storage_line(e)
        print(f"ragrig: error: {line}", file=sys.stderr)
        if multirun:
            rundir.record_refused(hc.sweep.dir, hc.job.num, output_dir, redact(line),
                                  [redact(str(o)) for o in hc.overrides.task])
            return float("nan")
        sys.exit(2)
    from rag.store.cache import storage_fault
    from rag.run.output import format_table
    from rag.run.pipeline import run
    from rag.run.settings import load

    _quiet_loaders()
    try:
        # The door: the composed config becomes typed, checked settings; nothing below reads cfg.
        result = run(load(cfg), output_dir)
    except Exception as e:
        if multirun:
            # Record the failure and let the other jobs of the sweep run.
            from experiments.tracking import job_failure, write_json

            from rag.serving.secrets import redacted_data

            failure = redacted_data({**job_failure(e), "overrides": [str(o) for o in hc.overrides.task]})
            write_json(Path(output_dir) / "failure.json", failure)
            # the terminal is told in one line below; the log keeps the record (and a traceback)
            if isinstance(e, RagError):
                log.error("job %s failed: %s", hc.job.num, failure["message"], extra=FILE_ONLY)
            else:
                log.exception("job %s failed: %s: %s", hc.job.num, failure["error_type"], failure["message"],
                              extra=FILE_ONLY)
            where = "" if isinstance(e, RagError) else f" (traceback: {Path(output_dir) / rundir.LOG_FILE})"
            print(f"ragrig: job {hc.job.num} failed: {failure['error_type']}: {failure['message']}{where}", file=sys.stderr)
            _track(cfg, output_dir, failure=failure)
            return float("nan")
        if isinstance(e, RagError) or storage_fault(e) is not None:
            # A user error gets one line, not a traceback from deep inside a library.
            line = redact(str(e) if isinstance(e, RagError) else _storage_line(e))
            log.error("error: %s", line, extra=FILE_ONLY)  # the terminal's one line is the next
            print(f"ragrig: error: {line}", file=sys.stderr)
            sys.exit(2)
        raise
    print(format_table(result))
    if "dry_run" in result:  # llm.dry_run=true: nothing was generated or scored
        return float("nan")
    print(f"results: {output_dir}")
    _track(cfg, output_dir, result=result)
    return float(result["objective"]["value"])


def _secret_line(cfg: DictConfig, overrides: list[str]) -> str | None:
    """The refusal of a secret-looking value in the config or the overrides (rag.serving.secrets), or None."""
    from omegaconf import OmegaConf

    from rag.serving.secrets import config_problem

    plain = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(plain, dict), "a DictConfig becomes a dict"
    return config_problem({**plain, "hydra": {"overrides": {"task": overrides}}})


def _hydra_record(cfg: DictConfig) -> dict[str, str]:
    """Hydra's record of the job (what it writes into .hydra/ unless `hydra.output_subdir` is null),
    every string passed through rag.serving.secrets.redact."""
    from omegaconf import OmegaConf

    from rag.serving.secrets import redacted_data

    nodes = {"config.yaml": cfg, "hydra.yaml": HydraConfig.instance().cfg,
             "overrides.yaml": HydraConfig.get().overrides.task}
    return {name: OmegaConf.to_yaml(OmegaConf.create(redacted_data(OmegaConf.to_container(node, resolve=False))))
            for name, node in nodes.items()}


def _output_dir() -> str | None:
    """The run (or sweep) directory, for errors raised while Hydra writes its own files into it:
    Hydra has forgotten its config by the time the error reaches us, so the command line says."""
    try:
        return str(HydraConfig.get().runtime.output_dir)
    except Exception:  # noqa: BLE001
        pass
    for arg in reversed(sys.argv[1:]):
        key, _, value = arg.lstrip("+").partition("=")
        if key in ("hydra.run.dir", "hydra.sweep.dir") and value:
            return value
    return None


def _storage_line(e: BaseException) -> str:
    """One line for a full, read-only or forbidden output directory (the cache's own faults are
    RagErrors naming paths.cache already)."""
    from rag.store.cache import storage_fault

    fault = storage_fault(e)
    if fault is None:  # the path itself is wrong (a file where the directory should be)
        where = getattr(e, "filename", None) or _output_dir() or "the output directory"
        return f"{where}: {getattr(e, 'strerror', None) or e} (check hydra.run.dir / hydra.sweep.dir)"
    where = fault.filename or _output_dir() or "the output directory"
    return f"cannot write {where}: {fault.strerror} (the run's directory is hydra.run.dir, a sweep's hydra.sweep.dir)"


def cli() -> int:
    """`main` with the command line's error handling: Hydra's own configuration errors (an unknown
    group option, an override that does not parse or names no key) become one line and exit
    status 2 instead of Hydra's multi-line report; Ctrl-C is one line and 130."""
    from rag.config.compose import config_error_line, is_config_error
    from rag.serving.secrets import override_problem

    # A secret on the command line is refused before Hydra sees it (--cfg would print it, a run
    # would record it); a secret in a config file is the callbacks' (experiments.callbacks).
    refused = next(filter(None, (override_problem(a) for a in sys.argv[1:] if "=" in a and not a.startswith("-"))), None)
    if refused:
        print(f"ragrig: error: {refused}", file=sys.stderr)
        return 2
    user_full_error = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let Hydra raise them to us rather than print them
    try:
        main()
    except KeyboardInterrupt as e:
        left = getattr(e, "left", None)  # rag.run.rundir.Unfinished: files were left to finish, and how
        if left:
            print(f"ragrig: interrupted; {left}", file=sys.stderr)
            return 130
        sweep = any(a in ("-m", "--multirun") for a in sys.argv[1:])
        hint = " (the sweep's summary: python -m experiments.compare SWEEP_DIR)" if sweep else ""
        print(f"ragrig: interrupted; nothing half-written was left{hint}", file=sys.stderr)
        return 130
    except Exception as e:
        from hydra.errors import ConfigCompositionException, OverrideParseException

        from rag.store.cache import storage_fault

        hydra_error = isinstance(e, (ConfigCompositionException, OverrideParseException))
        # Before the task, Hydra makes the run directory and opens run.log in it; a read-only or
        # full disk surfaces as an OSError, or as logging's ValueError caused by one.
        storage = None
        if not is_config_error(e):
            storage = e if isinstance(e, OSError) else storage_fault(e)
        before_task = not _task_started and (is_config_error(e) or storage is not None)
        if user_full_error or not (hydra_error or before_task):
            raise
        if storage is not None:
            print(f"ragrig: error: {_storage_line(storage)}", file=sys.stderr)
        else:
            print(f"ragrig: error: {config_error_line(e)}", file=sys.stderr)
        return 2
    finally:
        if user_full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
    callbacks = sys.modules.get("experiments.callbacks")
    return callbacks.sweep_exit_status() if callbacks is not None else 0


if __name__ == "__main__":
    from rag.config.cli import run_cli  # a closed pipe (| head) keeps the real exit status

    run_cli(cli)
