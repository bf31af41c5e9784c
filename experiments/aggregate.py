"""Collect finished (and failed) runs into one table.

A run directory is any directory holding `metrics.json` (a finished run) or `failure.json` (a
multirun job whose pipeline raised); a Hydra output directory (`.hydra/`) with neither is reported
as failed too (the run never finished: killed, crashed, or a single run that exited on an error). Sweep directories and
any parents of run directories are accepted, and runs from different days can be mixed. Under a
stamped sweep directory (rag.run.rundir), only the jobs of its latest sweep count: job directories
left there by an earlier sweep into the same `hydra.sweep.dir` are skipped, and a job the sweep
recorded as refused its directory (a user's file there, or another run in it) is a failed run.

`python -m experiments.aggregate RUN_DIR_OR_PARENT...` prints a markdown table, one row per run;
`python -m experiments.compare ...` builds the full report (summary.csv/md and charts).
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from eval.record import iter_lines, read_lines
from experiments import metric_info as MI
from rag.run.result import RunResult
from rag.run.rundir import belongs_to_sweep, read_sweep_stamp, refused_jobs
from rag.types import RagError

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.json"
FAILURE_FILE = "failure.json"
PER_QUESTION_FILE = "per_question.jsonl"
# Directories never searched for runs: Hydra's own records and MLflow's artifact copies.
SKIP_DIRS = {".hydra", "mlruns", "__pycache__", ".git"}
# Override keys that say how a run is executed or reported, not what it computes.
NON_PARAM_PREFIXES = ("hydra", "report", "tracking", "sweep", "paths")


@dataclass
class RunRecord:
    path: Path
    status: str  # "ok" | "failed"
    result: RunResult | None = None  # metrics.json
    failure: dict[str, Any] | None = None  # failure.json (or a synthesized one)
    overrides: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)  # resolved config
    choices: dict[str, Any] = field(default_factory=dict)  # Hydra's config-group choices
    job_num: int | None = None
    sweep_dir: Path | None = None
    _per_question: list[dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def variant(self) -> str:
        if self.result:
            return str(self.result.variant)
        return str(self.config.get("variant", "custom"))

    def per_question(self) -> list[dict[str, Any]]:
        if self._per_question is None:
            f = self.path / PER_QUESTION_FILE
            rows: list[dict[str, Any]] = []
            if f.exists():
                rows = read_lines(f)  # strictly: load_run has refused a run whose file does not read
            self._per_question = rows
        return self._per_question

    def question_values(self, metric: str) -> dict[str, float | None]:
        """Question id -> per-question value of `metric` (None where not scored)."""
        return {str(r["id"]): r.get(metric) for r in self.per_question() if "id" in r}


def _natural_key(p: Path) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p))]


def find_run_dirs(paths: list[Path] | list[str]) -> list[Path]:
    """Run directories under each path (the path itself if it is one), in the order the paths
    are given, each path's runs in natural order (job 2 before job 10); duplicates dropped."""
    seen: set[Path] = set()
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"no such run directory: {p}")
        if p.is_file():  # a metrics.json named directly
            p = p.parent
        found: list[Path] = []
        stamps: dict[Path, dict[str, Any] | None] = {}
        stale = 0
        for root, dirs, files in os.walk(p):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
            d = Path(root)
            if not (METRICS_FILE in files or FAILURE_FILE in files or (d / ".hydra" / "overrides.yaml").exists()):
                continue  # (with .hydra only: a Hydra run or sweep job that never finished)
            if d.parent not in stamps:
                stamps[d.parent] = read_sweep_stamp(d.parent)
            stamp = stamps[d.parent]
            if stamp is not None and not belongs_to_sweep(d, stamp):
                stale += 1
                continue
            found.append(d)
        if stale:
            log.debug("left out %d job director%s of an earlier sweep under %s", stale, "y" if stale == 1 else "ies", p)
        for d in sorted(found, key=_natural_key):
            r = d.resolve()
            if r not in seen:
                seen.add(r)
                out.append(d)
    return out


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, yaml.YAMLError):
        return None


def load_run(path: Path) -> RunRecord:
    path = Path(path)
    overrides = _read_yaml(path / ".hydra" / "overrides.yaml") or []
    hydra_cfg = (_read_yaml(path / ".hydra" / "hydra.yaml") or {}).get("hydra", {}) or {}
    choices = dict((hydra_cfg.get("runtime") or {}).get("choices") or {})
    job_num = (hydra_cfg.get("job") or {}).get("num")
    job_num = job_num if isinstance(job_num, int) else None  # '???' outside a multirun
    sweep_dir = None
    if hydra_cfg.get("mode") == "MULTIRUN" or (path.parent / "multirun.yaml").exists():
        sweep_dir = path.parent
    if job_num is None and sweep_dir is not None and path.name.isdigit():
        job_num = int(path.name)

    result = failure = None
    mfile, ffile = path / METRICS_FILE, path / FAILURE_FILE
    if mfile.exists():
        try:
            result = RunResult.read(mfile)
        except ValueError as e:  # not JSON, or JSON that is not a run's result
            failure = {"error_type": "CorruptResults", "message": f"unreadable metrics.json: {e}"}
    if ffile.exists():
        try:
            failed = json.loads(ffile.read_text(encoding="utf-8"))
        except ValueError as e:
            failed = {"error_type": "CorruptResults", "message": f"unreadable failure.json: {e}"}
        # A failure newer than the metrics (a re-run into the same directory) wins.
        if result is None or ffile.stat().st_mtime >= mfile.stat().st_mtime:
            failure, result = failed, None
    if result is not None:
        problem = _check_per_question(path / PER_QUESTION_FILE)
        if problem:
            failure, result = {"error_type": "CorruptResults", "message": problem}, None
    if result is None and failure is None:
        failure = {"error_type": "Unfinished", "message": "the job wrote no metrics.json (killed or crashed?)"}

    config = (result.config if result else None) or _read_yaml(path / "config_resolved.yaml") or {}
    if not config:
        config = _read_yaml(path / ".hydra" / "config.yaml") or {}
    return RunRecord(
        path=path,
        status="ok" if result is not None else "failed",
        result=result,
        failure=failure,
        overrides=[str(o) for o in overrides],
        config=config if isinstance(config, dict) else {},
        choices=choices,
        job_num=int(job_num) if job_num is not None else None,
        sweep_dir=sweep_dir,
    )


def _check_per_question(f: Path) -> str | None:
    """A finished run's per_question.jsonl must parse (the paired comparisons read it): the problem
    in one line, or None."""
    if not f.exists():
        return None
    try:
        for _ in iter_lines(f):  # (read as every reader reads it: NaN and Infinity are refused)
            pass
    except RagError as e:
        return str(e)
    return None


def load_records(paths: list[Path] | list[str]) -> list[RunRecord]:
    found = find_run_dirs(paths)
    return with_refused([load_run(p) for p in found], refused_records(paths, found))


def with_refused(records: list[RunRecord], refused: list[RunRecord]) -> list[RunRecord]:
    """`records` with each refused job in its place among the jobs of its sweep (job 2 before
    job 10), or after them all."""
    out = list(records)
    for r in refused:
        same = [i for i, x in enumerate(out) if x.path.parent == r.path.parent]
        later = [i for i in same if _natural_key(out[i].path) > _natural_key(r.path)]
        out.insert(later[0] if later else (same[-1] + 1 if same else len(out)), r)
    return out


def refused_records(paths: list[Path] | list[str], found: list[Path]) -> list[RunRecord]:
    """The jobs a sweep recorded as refused their directories (rag.run.rundir.record_refused: a
    user's file there, or another run in it), as failed runs: their directories hold nothing of
    theirs to read. Looked for in each path given and in the sweep directory of each run found."""
    known = {d.resolve() for d in found}
    sweeps = dict.fromkeys(Path(p) for p in [*paths, *(d.parent for d in found)])
    out = []
    for sweep in sweeps:
        for r in refused_jobs(sweep):
            job_dir = Path(str(r.get("dir") or sweep))
            if job_dir.resolve() in known:  # refused after its directory was claimed: it is found already
                continue
            known.add(job_dir.resolve())
            job = r.get("job")
            out.append(RunRecord(path=job_dir, status="failed",
                                 failure={"error_type": str(r.get("error_type") or "Refused"),
                                          "message": str(r.get("message") or "")},
                                 overrides=[str(o) for o in r.get("overrides") or []],
                                 job_num=job if isinstance(job, int) else None, sweep_dir=sweep))
    return out


# ---------------------------------------------------------------------------------------------
# Parameters: what was overridden, and what varies between runs


def parse_override(o: str) -> tuple[str, str | None]:
    """'+version=v1' -> ('version', 'v1'); '~key' -> ('key', None)."""
    key, _, value = o.partition("=")
    deleted = key.startswith("~")
    key = key.lstrip("+~")
    return key, (None if deleted else value)


def is_param_key(key: str) -> bool:
    return not any(key == p or key.startswith(p + ".") or key.startswith(p + "/") for p in NON_PARAM_PREFIXES)


def coerce(v: Any) -> Any:
    """Numbers from override strings ('256' -> 256, '0.3' -> 0.3), other values as they are."""
    if isinstance(v, str):
        s = v.strip().strip("'\"")
        for conv in (int, float):
            try:
                return conv(s)
            except ValueError:
                pass
        if s.lower() in ("true", "false"):
            return s.lower() == "true"
        if s.lower() in ("null", "none"):
            return None
        return s
    return v


def config_value(cfg: dict[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def run_params(rec: RunRecord, keys: list[str]) -> dict[str, Any]:
    """The value of each key for one run: its own override, else its config-group choice, else
    its resolved config (so a run that did not override a key still has a value for it)."""
    own = {}
    for o in rec.overrides:
        k, v = parse_override(o)
        own["variant" if k == "version" else k] = v
    out: dict[str, Any] = {}
    for key in keys:
        if key == "variant":
            out[key] = rec.variant
        elif key in own:
            out[key] = coerce(own[key])
        elif key in rec.choices:
            out[key] = rec.choices[key]
        else:
            out[key] = param_value(config_value(rec.config, key))
    return out


def param_value(v: Any) -> Any:
    """A config node as one comparable value: a component by its class name."""
    if isinstance(v, dict):
        target = v.get("_target_")
        return str(target).rsplit(".", 1)[-1] if target else json.dumps(v, sort_keys=True)
    if isinstance(v, list):
        return json.dumps(v)
    return v


def same_value(a: Any, b: Any) -> bool:
    """Two parameter values are the same setting ('0.50' from an override and 0.5 from a config)."""
    a, b = coerce(a), coerce(b)
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
    if numbers:
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def param_keys(records: list[RunRecord]) -> list[str]:
    """Every overridden parameter (first-seen order), plus 'variant'."""
    keys: list[str] = ["variant"]
    for rec in records:
        for o in rec.overrides:
            k, _ = parse_override(o)
            k = "variant" if k == "version" else k
            if is_param_key(k) and k not in keys:
                keys.append(k)
    return keys


def _hashable(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    return v if isinstance(v, (str, int, float, bool, type(None))) else str(v)


def varying_keys(params: list[dict[str, Any]], keys: list[str]) -> list[str]:
    """Keys with two or more distinct known values (an unknown value, None, is not a difference:
    a job that died before writing its config, or a parameter a component does not have)."""
    return [k for k in keys if len({_hashable(p.get(k)) for p in params if p.get(k) is not None}) > 1]


# ---------------------------------------------------------------------------------------------
# The summary table


def _fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def short_names(keys: list[str]) -> dict[str, str]:
    """Last dotted component of each key, unless two keys would share it."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def make_labels(records: list[RunRecord], params: list[dict[str, Any]], varying: list[str]) -> list[str]:
    names = short_names(varying)
    labels = []
    for rec, p in zip(records, params):
        if varying == ["variant"]:
            label = str(p["variant"])
        elif varying:
            # A parameter the run does not have (None: e.g. alpha under RRF fusion) is left out.
            label = " ".join(
                (str(p[k]) if k == "variant" else f"{names[k]}={_fmt_value(p[k])}") for k in varying
                if p.get(k) is not None
            ) or rec.path.name
        else:
            label = rec.variant if len(records) == 1 else rec.path.name
        labels.append(label)
    counts: dict[str, int] = {}
    for lab in labels:
        counts[lab] = counts.get(lab, 0) + 1
    seen: dict[str, int] = {}
    out = []
    for rec, lab in zip(records, labels):
        if counts[lab] > 1:  # e.g. the same configuration run on two days
            seen[lab] = seen.get(lab, 0) + 1
            where = f"{rec.path.parent.name}/{rec.path.name}" if rec.sweep_dir else rec.path.name
            lab = f"{lab} [{where}]"
        out.append(lab)
    return out


def metric_names(records: list[RunRecord]) -> list[str]:
    names: list[str] = []
    for rec in records:
        for m in (rec.result.metrics if rec.result else {}):
            if m not in names:
                names.append(m)
    return names


def summary_frame(records: list[RunRecord]) -> tuple[pd.DataFrame, list[str], list[str]]:
    """One row per run: job, label, status and error, overrides (one column per overridden key,
    filled from the config for runs that did not override it), the objective, every metric with
    its CI and n, latency, counts and stage timings. Returns (frame, varying keys, metrics)."""
    keys = param_keys(records)
    params = [run_params(r, keys) for r in records]
    varying = varying_keys(params, keys)
    labels = make_labels(records, params, varying)
    metrics = metric_names(records)
    rows = []
    for rec, p, label in zip(records, params, labels):
        failure = rec.failure or {}
        row: dict[str, Any] = {
            "job": rec.job_num if rec.job_num is not None else "",
            "label": label,
            "status": rec.status,
            "error_type": failure.get("error_type", ""),
            "error": failure.get("message", ""),
            "overrides": " ".join(rec.overrides),
        }
        for k in keys:
            row[k] = p.get(k)
        row.update(rec.result.flatten(metrics) if rec.result
                   else RunResult.unfinished_row(metrics, rec.config.get("objective", "")))
        row["run_dir"] = str(rec.path)
        rows.append(row)
    return pd.DataFrame(rows), varying, metrics


def markdown_table(df: pd.DataFrame, columns: list[str], digits: int = 3) -> str:
    """A plain markdown table (pandas' to_markdown needs the optional `tabulate` package)."""
    cols = [c for c in columns if c in df.columns]

    def fmt(v: object) -> str:
        if isinstance(v, float):
            return "" if math.isnan(v) else f"{v:.{digits}f}"
        return "" if v is None else str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df[cols].itertuples(index=False)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    args = parser.parse_args(argv)
    try:
        records = load_records(args.paths)
    except FileNotFoundError as e:
        print(f"aggregate: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("aggregate: interrupted", file=sys.stderr)
        return 130
    if not records:
        print("aggregate: error: no runs (metrics.json or failure.json) under " + ", ".join(map(str, args.paths)),
              file=sys.stderr)
        return 2
    df, varying, metrics = summary_frame(records)
    ks = {config_value(r.config, "eval.k") for r in records} - {None}
    names = {m: MI.label(m, ks.pop() if len(ks) == 1 else "k") for m in metrics}
    print(markdown_table(df.rename(columns=names), ["job", "label", "status"] + list(names.values()) + ["error"]))
    print()
    print(markdown_table(df, ["label"] + [c for c in df.columns if c.startswith("t_")], digits=2))
    return 0


if __name__ == "__main__":
    from rag.config.cli import run_cli  # a reader that goes away (| head -1) costs no traceback

    run_cli(main)
