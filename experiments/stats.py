"""Statistics for comparing runs: paired bootstrap of the difference of two variants' means.

Two variants evaluated on the same questions are compared question by question: the unit of
variation is the question set, so question ids are resampled *jointly* (one resample draws the same
questions for both variants) and the interval is that of the mean per-question difference. This is
much tighter than comparing two independent CIs, because the question-to-question difficulty that
both variants share cancels out.

Independent of eval/ (it only needs per-question values keyed by question id), so it works on any
set of finished runs, including runs from different days.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

# Resampling in blocks keeps memory bounded (resamples x questions int64 indices).
_BLOCK_ELEMENTS = 4_000_000


@dataclass(frozen=True)
class PairedDiff:
    """`other - baseline`, averaged over the questions both have a value for."""

    mean_diff: float
    ci_low: float
    ci_high: float
    n: int  # questions in common (with a value in both)
    p_value: float  # two-sided bootstrap p-value of "no difference" (approximate)
    confidence: float = 0.95

    @property
    def significant(self) -> bool:
        """True when the confidence interval of the difference excludes zero."""
        if math.isnan(self.ci_low) or math.isnan(self.ci_high):
            return False
        return self.ci_low > 0.0 or self.ci_high < 0.0

    @property
    def direction(self) -> int:
        """+1 significantly higher than the baseline, -1 significantly lower, 0 otherwise."""
        if not self.significant:
            return 0
        return 1 if self.mean_diff > 0 else -1

    def marker(self) -> str:
        return {1: "▲", -1: "▼", 0: ""}[self.direction]


def _resampled_means(d: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = len(d)
    block = max(1, _BLOCK_ELEMENTS // max(1, n))
    out = np.empty(n_resamples, np.float64)
    for start in range(0, n_resamples, block):
        stop = min(n_resamples, start + block)
        idx = rng.integers(0, n, size=(stop - start, n))
        out[start:stop] = d[idx].mean(axis=1)
    return out


def _valid(v: object) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def paired_bootstrap(
    baseline: Mapping[str, float | None],
    other: Mapping[str, float | None],
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairedDiff:
    """Paired bootstrap CI of mean(other - baseline) over the question ids both map to a value.

    `baseline` and `other` map question id -> per-question metric value (None/NaN = not scored).
    Question ids are resampled with replacement, the same draw for both variants.
    """
    ids = sorted(k for k in baseline.keys() & other.keys() if _valid(baseline[k]) and _valid(other[k]))
    n = len(ids)
    if n == 0:
        nan = float("nan")
        return PairedDiff(nan, nan, nan, 0, nan, confidence)
    d = np.array([float(other[i]) - float(baseline[i]) for i in ids], np.float64)  # type: ignore[arg-type]
    mean = float(d.mean())
    if n_resamples <= 0 or n == 1:
        return PairedDiff(mean, mean, mean, n, float("nan"), confidence)
    means = _resampled_means(d, n_resamples, seed)
    a = (1.0 - confidence) / 2.0
    lo, hi = (float(x) for x in np.quantile(means, [a, 1.0 - a]))
    if np.all(d == 0):
        p = 1.0
    else:
        # Share of resampled means on the other side of zero, doubled (two-sided), with the +1
        # correction so that a p-value is never exactly 0 from a finite number of resamples.
        tail = min(int(np.sum(means <= 0.0)), int(np.sum(means >= 0.0)))
        p = min(1.0, 2.0 * (tail + 1) / (n_resamples + 1))
    return PairedDiff(mean, lo, hi, n, p, confidence)
