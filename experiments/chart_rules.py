"""The decisions behind every chart, kept apart from the drawing so that tests can check them:
which colour scale a metric gets, which jobs a crowded chart shows, which cells differ
significantly from the baseline, and the colours that say better, worse, win, tie and loss.

A colour scale spans the metric's natural range (metric_info's span: 0–1 for shares and ranks),
never just the observed values: a scale stretched over 0.39–0.49 paints noise inside a ±0.16 CI
as a decisive difference. Metrics without a natural range (latency in ms) start at zero, so a bar or
colour twice as long means twice as slow.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from experiments import metric_info as MI

# Okabe & Ito's colour-blind-safe palette (https://jfly.uni-koeln.de/color/), in the order used
# for series; blue and orange stay apart under every common colour-vision deficiency.
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
BETTER = "#0072B2"  # blue
WORSE = "#D55E00"  # vermilion
WIN, TIE, LOSS = "#0072B2", "#BBBBBB", "#E69F00"  # blue, grey, orange

MAX_JOBS_SHOWN = 5  # more series than this on one chart no longer read at a glance
UNIT_RANGE = (0.0, 1.0)


def natural_range(metric: str, values: Iterable[Any] = ()) -> tuple[float, float] | None:
    """The range a metric's values can take (metric_info's span), None for unbounded ones
    (latency, unknown metrics). A cosine's −1 is dropped when no value is negative: text
    embeddings rarely disagree that much, and half the scale would stay unused."""
    span = MI.info(metric).span
    if span is None:
        return None
    lo, hi = float(span[0]), float(span[1])
    vals = _finite(values)
    if lo < 0 <= hi and (not len(vals) or float(vals.min()) >= 0):
        lo = 0.0
    return lo, hi


def scale_family(metric: str, values: Iterable[Any] = ()) -> str:
    """Metrics that share one colour scale across panels: every metric of one range (all 0–1
    ones together), each unbounded one on its own."""
    rng = natural_range(metric, values)
    return metric if rng is None else f"{rng[0]:g}–{rng[1]:g}"


def _finite(values: Iterable[Any]) -> np.ndarray:
    arr = np.asarray([float(v) for v in values if v is not None], float)
    return arr[np.isfinite(arr)]


def value_limits(metric: str, values: Iterable[Any]) -> tuple[float, float]:
    """The colour (or axis) limits of a metric: its natural range, widened only if a value falls
    outside it; from zero to the largest value for unbounded ones."""
    vals = _finite(values)
    rng = natural_range(metric, vals)
    if rng is not None:
        lo, hi = rng
        if len(vals):
            lo, hi = min(lo, float(vals.min())), max(hi, float(vals.max()))
        return lo, hi
    if not len(vals):
        return UNIT_RANGE
    lo = min(0.0, float(vals.min()))
    hi = float(vals.max())
    return (lo, hi * 1.05) if hi > lo else (lo, lo + 1.0)


def family_limits(values_by_metric: dict[str, Sequence[Any]]) -> dict[str, tuple[float, float]]:
    """One pair of limits per metric, equal for every metric of one scale family."""
    fams = {m: scale_family(m, vals) for m, vals in values_by_metric.items()}
    pooled: dict[str, list[Any]] = {}
    for m, vals in values_by_metric.items():
        pooled.setdefault(fams[m], []).extend(vals)
    first = {fam: next(m for m in fams if fams[m] == fam) for fam in pooled}
    return {m: value_limits(first[fams[m]], pooled[fams[m]]) for m in values_by_metric}


def axis_unit(metric: str, k: Any = "k") -> str:
    """What an axis of the metric's values counts, e.g. 'share of questions, 0–1', 'ms per question'."""
    return MI.info(metric).unit.format(k=k)


# ---------------------------------------------------------------------------------------------
# which jobs a crowded chart shows


def shown_jobs(frame: pd.DataFrame, objective: str | None, limit: int = MAX_JOBS_SHOWN) -> list[str]:
    """The labels of the successful jobs a chart shows, in the frame's order: all of them up to
    `limit`; beyond, the baseline and the best of the others by the objective."""
    ok = frame[frame["status"] == "ok"]
    labels = [str(x) for x in ok["label"]]
    if len(labels) <= limit:
        return labels
    base = [str(x) for x, b in zip(ok["label"], ok.get("baseline", [False] * len(ok))) if bool(b)][:1]
    col = objective if objective and objective in ok else "objective_value"
    scores = ok[col].to_numpy(float) if col in ok else np.full(len(ok), np.nan)
    sign = 1.0 if objective and MI.lower_is_better(objective) else -1.0
    # Jobs without a score (no objective recorded) come last, in launch order.
    ranked = sorted((i for i in range(len(labels)) if labels[i] not in base),
                    key=lambda i: (not math.isfinite(scores[i]), sign * scores[i] if math.isfinite(scores[i]) else i))
    keep = set(base) | {labels[i] for i in ranked[: limit - len(base)]}
    return [lab for lab in labels if lab in keep]


def shown_note(shown: Sequence[str], total: int, objective: str | None, k: Any = "k",
               has_baseline: bool = True) -> str:
    """'top 5 of 9 jobs shown: the baseline and the best 4 by MRR', or '' when all are shown."""
    if len(shown) >= total:
        return ""
    best = len(shown) - (1 if has_baseline else 0)
    by = MI.label(objective, k) if objective else "the objective"
    lead = "the baseline and " if has_baseline else ""
    return f"top {len(shown)} of {total} jobs shown: {lead}the best {best} by {by}"


# ---------------------------------------------------------------------------------------------
# differences from the baseline


def change(marker: str) -> str:
    """'better' or 'worse' for a significance marker of the report (metric_info.marker: ▲ better,
    ▼ worse in the metric's own direction); '' for none. Charts print the word beside the glyph,
    so that nobody reads the ▲ of a faster run as 'slower'."""
    return {MI.BETTER: "better", MI.WORSE: "worse"}.get(marker, "")


def significant_changes(comparison: pd.DataFrame | None, metric: str) -> dict[str, str]:
    """Run label -> 'better' / 'worse' for the runs that differ significantly from the baseline
    on `metric` (Holm-corrected, as every ▲/▼ of the report; where the table has no correction,
    a paired CI that excludes zero) by at least the smallest difference that matters
    (report.min_effect, where the table has it): a significant +0.3 ms frames no cell."""
    if comparison is None or comparison.empty or "metric" not in comparison:
        return {}
    rows = comparison[comparison["metric"] == metric]
    out = {}
    for _, r in rows.iterrows():
        if "significant" in rows:
            sig = bool(r["significant"])
        else:
            sig = float(r["ci_low"]) > 0 or float(r["ci_high"]) < 0
        if "matters" in rows:
            sig = sig and bool(r["matters"])
        if sig and math.isfinite(float(r["diff"])) and float(r["diff"]) != 0:
            out[str(r["label"])] = "better" if MI.better(metric, float(r["diff"])) else "worse"
    return out


def cell_changes(frame: pd.DataFrame, x_key: str, y_key: str, xs: list[Any], ys: list[Any],
                 changes: dict[str, str], baseline: str | None) -> dict[tuple[int, int], str]:
    """(row, column) of a grid -> 'baseline', 'better' or 'worse': a cell is marked when every
    successful job in it changed the same way (several jobs share a cell when other parameters vary)."""
    out: dict[tuple[int, int], str] = {}
    ok = frame[frame["status"] == "ok"]
    for i, yv in enumerate(ys):
        for j, xv in enumerate(xs):
            labels = [str(x) for x in ok[(ok[x_key] == xv) & (ok[y_key] == yv)]["label"]]
            if not labels:
                continue
            if baseline in labels and len(labels) == 1:
                out[(i, j)] = "baseline"
                continue
            words = {changes.get(lab, "") for lab in labels}
            if len(words) == 1 and words != {""}:
                out[(i, j)] = words.pop()
    return out
