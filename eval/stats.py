"""Bootstrap confidence intervals over questions."""
from __future__ import annotations

import numpy as np


def bootstrap_ci(values: np.ndarray, n_resamples: int = 1000, confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean. Resampling questions with replacement is the
    honest unit of variation here: the question set is a sample, the corpus is fixed."""
    if int(n_resamples) < 1:
        # Zero resamples is no interval at all, not a zero-width one (eval.bootstrap.resamples >= 1).
        raise ValueError(f"bootstrap_ci: n_resamples must be >= 1, got {n_resamples}")
    v = np.asarray(values, np.float64)
    v = v[~np.isnan(v)]
    if len(v) == 0:
        return (float("nan"), float("nan"))
    if len(v) == 1:
        return (float(v.mean()), float(v.mean()))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(v), size=(n_resamples, len(v)))
    means = v[idx].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return (float(lo), float(hi))
