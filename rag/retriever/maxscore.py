"""The exact BM25 top n of one query without scoring every posting (MaxScore, Turtle and Flood 1995).

bm25s scores a query by adding the whole posting list of each of its terms into an array of every
document. A question's common terms occur in most documents, so at millions of chunks that is
most of a hybrid question's time (docs/reference/bench.md, "Scale"). Most of that work cannot change the
result: a common term has a low idf, so its largest contribution to any document (its *max
impact*) is small.

Split the query's terms into *essential* ones (the shortest lists) and the rest. A document none
of whose essential terms occur scores at most the sum of the others' max impacts (`bound`). The
documents of the essential lists are scored on those terms alone; the 2n best of them, scored
exactly, give a lower bound `lb` on the n-th best score. When `bound < lb`, no document outside
the essential lists can reach the top n, and a document inside them whose partial score plus
`bound` stays below `lb` cannot either; the few left are scored exactly, term by term in the query's order, each term's contribution looked
up in its list (sorted by document), so the scores are bm25s's to the bit. When no split
qualifies, or the essential lists would be a large share of the work, the caller scores
exhaustively.
"""
from __future__ import annotations

import numpy as np

# Bounds are compared with this relative slack, so that float32 rounding in the exact sums can
# only keep more documents, never drop one that belongs in the top n.
SLACK = 1e-4
# Past this share of the query's postings in the essential lists, pruning saves too little.
MAX_ESSENTIAL_SHARE = 0.25


# Each term's largest score, saved beside bm25s's files by the streamed build (rag.retriever.bm25_build), so that a
# first question does not read the whole list of each of its common terms to find it.
IMPACTS_FILE = "max_impact.ragrig.npy"


class MaxImpacts:
    """Each term's largest score: from the saved array when there is one, else computed when a
    query first needs it (a pass over the term's list)."""

    def __init__(self, data: np.ndarray, indptr: np.ndarray, saved: np.ndarray | None = None):
        self.data, self.indptr = data, indptr
        self.saved = saved if saved is not None and len(saved) == len(indptr) - 1 else None
        self._known: dict[int, float] = {}

    def __getitem__(self, term: int) -> float:
        if self.saved is not None:
            return float(self.saved[term])
        found = self._known.get(term)
        if found is None:
            a, b = int(self.indptr[term]), int(self.indptr[term + 1])
            found = self._known[term] = float(self.data[a:b].max()) if b > a else 0.0
        return found


def candidates(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, terms: list[int], n: int,
               impacts: MaxImpacts, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """(rows, exact scores) of a set of rows, ascending, that holds the query's top n, or None
    when pruning does not apply (score exhaustively). `terms`: the query's term ids in order,
    repeats included (each occurrence adds its list once, as bm25s does); `mask`: 1.0 for the
    rows a filter allows, 0.0 elsewhere."""
    unique = list(dict.fromkeys(terms))
    times = {t: terms.count(t) for t in unique}
    span = {t: (int(indptr[t]), int(indptr[t + 1])) for t in unique}
    length = {t: b - a for t, (a, b) in span.items()}
    total = sum(length[t] * times[t] for t in unique)
    by_length = sorted(unique, key=lambda t: length[t])
    essential_postings = 0
    for e in range(1, len(by_length)):
        essential, others = by_length[:e], by_length[e:]
        essential_postings += length[essential[-1]] * times[essential[-1]]
        if essential_postings > MAX_ESSENTIAL_SHARE * total:
            return None
        bound = sum(times[t] * impacts[t] for t in others) * (1 + SLACK)
        candidates, partial = _essential_scores(data, indices, [span[t] for t in essential], [times[t] for t in essential])
        if mask is not None:
            allowed = mask[candidates] > 0
            candidates, partial = candidates[allowed], partial[allowed]
        if len(candidates) < n:
            continue
        # A lower bound on the n-th best score: the n-th best exact score of the 2n best partial
        # ones (exact scores are at least partial, so this bound is at least the partial one).
        leaders = np.sort(candidates[np.argpartition(partial, len(partial) - min(len(partial), 2 * n))[-2 * n :]])
        lb = np.sort(_exact(data, indices, span, terms, leaders))[-n] * (1 - SLACK)
        if not bound < lb:
            continue
        keep = candidates[partial + bound >= lb]  # ascending rows, as np.unique returns them
        return keep, _exact(data, indices, span, terms, keep)
    return None


def _essential_scores(data: np.ndarray, indices: np.ndarray, spans: list[tuple[int, int]],
                      times: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The rows of the essential lists (ascending, distinct) and each row's score on those terms
    alone (float64: a bound, not a result)."""
    if len(spans) == 1:  # one list: its rows are already distinct and ascending
        (a, b), k = spans[0], times[0]
        return np.asarray(indices[a:b]), data[a:b].astype(np.float64) * k
    rows = np.concatenate([indices[a:b] for a, b in spans])
    weights = np.concatenate([data[a:b].astype(np.float64) * k for (a, b), k in zip(spans, times)])
    found, where = np.unique(rows, return_inverse=True)
    return found, np.bincount(where, weights=weights)


def _exact(data: np.ndarray, indices: np.ndarray, span: dict[int, tuple[int, int]], terms: list[int],
           rows: np.ndarray) -> np.ndarray:
    """bm25s's float32 scores of `rows` (ascending): each term's contribution added in the
    query's order, as its exhaustive scoring adds them."""
    found = {t: _lookup(data, indices, span[t], rows) for t in dict.fromkeys(terms)}
    scores = np.zeros(len(rows), np.float32)
    for t in terms:
        scores += found[t]
    return scores


def _lookup(data: np.ndarray, indices: np.ndarray, span: tuple[int, int], rows: np.ndarray) -> np.ndarray:
    """The term's score in each of `rows` (ascending), 0 where it does not occur."""
    a, b = span
    if b == a:
        return np.zeros(len(rows), np.float32)
    listed = indices[a:b]
    at = np.searchsorted(listed, rows)
    inside = np.minimum(at, len(listed) - 1)
    present = (at < len(listed)) & (listed[inside] == rows)
    return np.where(present, data[a:b][inside], np.float32(0))
