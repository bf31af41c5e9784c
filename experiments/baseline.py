"""Which run a report compares every other run with, and why.

In order: the run the user names (report.baseline, `python -m experiments.compare --baseline`);
v1 when the runs are versions; in a parameter sweep, the run whose varying parameters all have
the configuration's default values (a grid's corner says little about the defaults a user runs);
else the first run, and the verdict says so.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pandas as pd

from experiments.aggregate import RunRecord, param_value, parse_override, same_value, short_names

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BaselineChoice:
    """Which run is the baseline and why: "named" (report.baseline / --baseline), "v1" (the
    versions' own baseline), "default" (the cell with the configuration's default values),
    "first" (none of those, in a set of runs whose parameters differ), "only" (the first of runs
    that differ in nothing, or a single run) or "none" (no successful run)."""

    index: int | None
    how: str
    defaults: dict[str, Any] | None = None  # the varying parameters' default values, when known
    unmatched: str | None = None  # a named baseline that matches no successful run
    failed_default: str | None = None  # the label of the default cell when that job failed


def pick_baseline(records: list[RunRecord], frame: pd.DataFrame, wanted: str | None,
                  varying: list[str] | None = None) -> BaselineChoice:
    """The baseline run: `wanted` as a label, variant or job number; else the first run of variant
    v1 when the variants differ; else the run whose varying parameters all have the
    configuration's default values; else the first successful run."""
    ok = [i for i, r in enumerate(records) if r.ok]
    if not ok:
        return BaselineChoice(None, "none")
    unmatched = None
    if wanted is not None and str(wanted) != "":
        w = str(wanted)
        for i in ok:
            if str(frame.loc[i, "label"]) == w:
                return BaselineChoice(i, "named")
        for i in ok:
            if records[i].variant == w or str(frame.loc[i, "job"]) == w:
                return BaselineChoice(i, "named")
        log.warning("report: baseline %r matches no successful run; using the default", wanted)
        unmatched = w
    if len({records[i].variant for i in ok}) > 1:
        for i in ok:
            if records[i].variant == "v1":
                return BaselineChoice(i, "v1", unmatched=unmatched)
    defaults = None
    keys = [k for k in (varying or []) if k in frame]
    if keys and len(ok) > 1:
        defaults = default_values(records[ok[0]], keys)
        for i in range(len(records)):
            if defaults and all(same_value(frame.loc[i, k], defaults.get(k)) for k in keys):
                if records[i].ok:
                    return BaselineChoice(i, "default", defaults, unmatched)
                return BaselineChoice(ok[0], "first", defaults, unmatched, str(frame.loc[i, "label"]))
    return BaselineChoice(ok[0], "first" if keys and len(ok) > 1 else "only", defaults, unmatched)


def baseline_note(choice: BaselineChoice, label: str | None) -> str:
    """The verdict's first words when the baseline was not named and is not the versions' v1."""
    if choice.how in ("named", "v1", "none", "only") and not choice.unmatched:
        return ""
    asked = f"report.baseline {choice.unmatched!r} matches no successful run. " if choice.unmatched else ""
    if choice.how == "default":
        return f"{asked}Baseline: {label}, the configuration's default values (report.baseline names another)."
    if choice.how != "first":
        return asked.rstrip()
    names = short_names(list(choice.defaults or {}))
    known = ", ".join(f"{names[k]}={v}" for k, v in (choice.defaults or {}).items() if v is not None)
    why = f"no run has the configuration's default values ({known})" if known else \
        "no run has the configuration's default values"
    if choice.failed_default:
        why = f"the run with the configuration's default values ({choice.failed_default}) failed"
    return (f"{asked}Baseline: {label}, the first run: {why}; report.baseline=LABEL "
            "(python -m experiments.compare --baseline LABEL) names another.")


def default_values(rec: RunRecord, keys: list[str]) -> dict[str, Any] | None:
    """What each of `keys` is when a run leaves it alone: the configuration composed (Hydra's
    compose, on the project's conf/) from `rec`'s overrides without those that set `keys`. None
    when it does not compose (a run from another checkout, a config group since removed)."""
    kept = [o for o in rec.overrides if not o.startswith("hydra.")
            and ("variant" if parse_override(o)[0] == "version" else parse_override(o)[0]) not in keys]
    try:
        cfg = _compose(kept)
    except Exception as e:  # noqa: BLE001 - no defaults is a fallback, reported by the caller
        log.info("the configuration's defaults could not be composed (%s: %s)", type(e).__name__, e)
        return None
    from omegaconf import OmegaConf

    choices = dict(OmegaConf.select(cfg, "hydra.runtime.choices") or {})
    out: dict[str, Any] = {}
    for key in keys:
        if key in choices or key in rec.choices:
            out[key] = choices.get(key)
            continue
        try:
            node = OmegaConf.select(cfg, key, default=None)
        except Exception:  # noqa: BLE001 - an interpolation that needs a run (e.g. ${now:})
            node = None
        if OmegaConf.is_config(node):
            node = OmegaConf.to_container(node, resolve=False)
        out[key] = param_value(node)
    return out


def _compose(overrides: list[str]) -> Any:
    """The project's config with `overrides`, its hydra node included (for the group choices).
    Inside a running Hydra app (a sweep's end) through that app's own config loader."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from rag.config.compose import PROJECT_ROOT

    if GlobalHydra.instance().is_initialized():
        return compose(config_name="config", overrides=overrides, return_hydra_config=True)
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=True)
