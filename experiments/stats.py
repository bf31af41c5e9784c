"""Statistics for comparing runs: paired differences, their tests, Holm's correction and power.

Two variants evaluated on the same questions are compared question by question, over the question
ids both have a value for:
- the interval is a paired bootstrap: question ids are resampled *jointly* (one resample draws the
  same questions for both variants) and the percentile interval is that of the mean per-question
  difference. Much tighter than two independent CIs: the question-to-question difficulty that both
  variants share cancels out;
- the p-value is a paired randomization (sign-flip) test of "no difference": under the null the
  two variants' values of a question are exchangeable, so each per-question difference is as
  likely with either sign. Exact (every sign pattern) when 2^n is within the budget, otherwise
  Monte Carlo with the +1 correction, which keeps it a valid p-value. Unlike the "share of
  bootstrap means beyond zero" it is a test under the null, which is what Holm's procedure needs,
  and it is the test information-retrieval evaluation recommends (Smucker, Allan & Carterette,
  CIKM 2007);
- `holm` adjusts a family of p-values (step-down, controls the family-wise error rate);
- `min_detectable_effect` is the difference a paired test finds with 80% power at a given alpha.

Independent of eval/ (it only needs per-question values keyed by question id), so it works on any
set of finished runs, including runs from different days.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

# Resampling in blocks keeps memory bounded (resamples x questions int64 indices).
_BLOCK_ELEMENTS = 4_000_000
# Sign patterns of the randomization test: a p-value can go down to 1/(PERMUTATIONS + 1), small
# enough for Holm's first step (alpha / m) with m up to 500 compared cells at alpha 0.05.
PERMUTATIONS = 10_000


@dataclass(frozen=True)
class PairedDiff:
    """`other - baseline`, averaged over the questions both have a value for."""

    mean_diff: float
    ci_low: float
    ci_high: float
    n: int  # questions in common (with a value in both)
    p_value: float  # two-sided paired randomization (sign-flip) test of "no difference"
    confidence: float = 0.95
    sd_diff: float = float("nan")  # standard deviation of the per-question differences

    @property
    def significant(self) -> bool:
        """True when the confidence interval of the difference excludes zero (one comparison on its
        own; a report of many comparisons decides with Holm-adjusted p-values instead)."""
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


def has_value(v: object) -> bool:
    """A per-question value that was scored (None and NaN mean "not scored")."""
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def shared_ids(baseline: Mapping[str, object], other: Mapping[str, object]) -> list[str]:
    """The question ids both map to a scored value, sorted: what every paired comparison is over."""
    return sorted(k for k in baseline.keys() & other.keys() if has_value(baseline[k]) and has_value(other[k]))


def sign_flip_p_value(d: np.ndarray, permutations: int = PERMUTATIONS, seed: int = 0) -> float:
    """Two-sided p-value of mean(d) == 0 by flipping the signs of the per-question differences:
    the share of sign patterns whose |mean| is at least the observed one. Every pattern when
    2^n <= permutations (exact), else `permutations` random ones plus the observed (p >= 1/(B+1))."""
    d = np.asarray(d, np.float64)
    n = len(d)
    if n == 0:
        return float("nan")
    observed = abs(float(d.sum()))
    if observed == 0.0:
        return 1.0
    tol = 1e-9 * max(1.0, float(np.abs(d).sum()))  # sums that tie the observed one in exact arithmetic
    if n <= 20 and 2**n <= permutations:
        bits = (np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1
        sums = np.abs((1 - 2 * bits) @ d)
        return float(np.mean(sums >= observed - tol))
    rng = np.random.default_rng(seed)
    block = max(1, _BLOCK_ELEMENTS // n)
    d32, total = d.astype(np.float32), float(d.sum())
    tol = max(tol, 1e-5 * float(np.abs(d).sum()))  # float32 sums below
    hits = 0
    for start in range(0, permutations, block):
        b = min(block, permutations - start)
        # One random bit per question and pattern; sum(sign * d) = 2 * sum(bit * d) - sum(d).
        raw = np.frombuffer(rng.bytes(b * ((n + 7) // 8)), np.uint8).reshape(b, -1)
        bits = np.unpackbits(raw, axis=1, count=n).astype(np.float32)
        hits += int(np.sum(np.abs(2.0 * (bits @ d32).astype(np.float64) - total) >= observed - tol))
    return (hits + 1) / (permutations + 1)


def paired_bootstrap(
    baseline: Mapping[str, float | None],
    other: Mapping[str, float | None],
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    permutations: int = PERMUTATIONS,
) -> PairedDiff:
    """Paired comparison of `other` with `baseline` over the question ids both map to a value:
    mean(other - baseline), its paired-bootstrap CI (question ids resampled with replacement, the
    same draw for both variants), and the sign-flip test's two-sided p-value.

    `baseline` and `other` map question id -> per-question metric value (None/NaN = not scored).
    """
    ids = shared_ids(baseline, other)
    n = len(ids)
    if n == 0:
        nan = float("nan")
        return PairedDiff(nan, nan, nan, 0, nan, confidence)
    d = np.array([float(other[i]) - float(baseline[i]) for i in ids], np.float64)  # type: ignore[arg-type]
    mean = float(d.mean())
    sd = float(d.std(ddof=1)) if n > 1 else float("nan")
    if n_resamples <= 0 or n == 1:
        return PairedDiff(mean, mean, mean, n, float("nan"), confidence, sd)
    means = _resampled_means(d, n_resamples, seed)
    a = (1.0 - confidence) / 2.0
    lo, hi = (float(x) for x in np.quantile(means, [a, 1.0 - a]))
    p = sign_flip_p_value(d, permutations, seed)
    return PairedDiff(mean, lo, hi, n, p, confidence, sd)


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (step-down): the i-th smallest of m is multiplied by
    m - i + 1, made monotone, capped at 1. A comparison is significant at family-wise level alpha
    when its adjusted p-value is below alpha. NaN p-values (no test) stay NaN and do not count in m."""
    p = np.asarray(p_values, np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    m = len(ok)
    if m == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out[order] = adjusted
    return out


def min_detectable_effect(sd_diff: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest mean difference a two-sided paired test at `alpha` detects with `power`, from the
    standard deviation of the per-question differences and the number of questions (normal
    approximation): (z_{1-alpha/2} + z_{power}) * sd_diff / sqrt(n)."""
    if n < 2 or not math.isfinite(sd_diff) or sd_diff <= 0 or not 0 < alpha < 1:
        return float("nan")  # no spread observed: nothing to base a power calculation on
    z = NormalDist()
    return (z.inv_cdf(1 - alpha / 2) + z.inv_cdf(power)) * sd_diff / math.sqrt(n)
