"""Fusion of several ranked lists (`Hits`) into one.

- `RRFFusion`: Reciprocal Rank Fusion (Cormack et al., 2009): score(d) = sum_r 1 / (k + rank_r(d)),
  ranks from 1; scores of the inputs are ignored, so it needs no calibration between retrievers.
- `WeightedFusion`: per query, min-max normalize each list's scores to [0, 1] and take
  alpha * dense + (1 - alpha) * lexical; a chunk missing from a list contributes 0 for it.

Both are cheap array code, so sweeping `alpha` or `k` reuses the retrievers' cached candidates.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from rag.config.schema import Fraction, NonNegativeInt, checked
from rag.types import Hits, RagError


class Fusion:
    def __call__(self, hits: list[Hits], n: int) -> Hits:
        if not hits:
            raise ValueError("fusion needs at least one list of hits")
        if len({h.n_queries for h in hits}) != 1:
            raise ValueError("fusion: all lists must cover the same queries")
        rows = [self._fuse_query([h.row(q) for h in hits]) for q in range(hits[0].n_queries)]
        return Hits.from_rows(rows, n)

    def _fuse_query(self, lists: list[list[tuple[int, float]]]) -> list[tuple[int, float]]:
        raise NotImplementedError

    @staticmethod
    def _sorted(scores: dict[int, float]) -> list[tuple[int, float]]:
        # Ties break by chunk row so that results are deterministic.
        return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))


class RRFFusion(Fusion):
    @checked("fusion")
    def __init__(self, k: NonNegativeInt = 60):
        self.k = k

    def _fuse_query(self, lists: list[list[tuple[int, float]]]) -> list[tuple[int, float]]:
        fused: dict[int, float] = defaultdict(float)
        for ranked in lists:
            for rank, (row, _) in enumerate(ranked, start=1):
                fused[row] += 1.0 / (self.k + rank)
        return self._sorted(fused)


class WeightedFusion(Fusion):
    """Two lists only: the first is dense (weight alpha), the second lexical (1 - alpha)."""

    @checked("fusion")
    def __init__(self, alpha: Fraction = 0.5):
        self.alpha = float(alpha)

    @staticmethod
    def _minmax(ranked: list[tuple[int, float]]) -> dict[int, float]:
        if not ranked:
            return {}
        s = np.array([score for _, score in ranked], dtype=np.float64)
        lo, hi = s.min(), s.max()
        # A single candidate (or all equal) is fully relevant within its own list.
        norm = np.ones_like(s) if hi == lo else (s - lo) / (hi - lo)
        return {row: float(v) for (row, _), v in zip(ranked, norm)}

    def _fuse_query(self, lists: list[list[tuple[int, float]]]) -> list[tuple[int, float]]:
        if len(lists) != 2:
            raise RagError(f"fusion=weighted combines exactly two retrievers (dense, lexical), got {len(lists)}")
        dense, lexical = (self._minmax(r) for r in lists)
        fused = {
            row: self.alpha * dense.get(row, 0.0) + (1.0 - self.alpha) * lexical.get(row, 0.0)
            for row in dense.keys() | lexical.keys()
        }
        return self._sorted(fused)
