"""Question routing: pick the source group to search from the question text alone.

`retriever.source_filter.mode=question` filters by the question's own corpus tag, an oracle that
no deployed system has. `mode=router` instead routes each question to one of the configured
source groups (e.g. PubMed vs technical docs) in the pipeline embedder's space, with a model fit
on the corpus's own chunks, never on questions:

- `centroid`: the group whose mean chunk vector (unit-normalized) is nearest by cosine.
- `logistic`: a class-balanced logistic regression on chunk vectors labelled by their group.

Both are fit from the chunk vectors the dense index is built from (already cached), in well
under a second (centroid) or a few seconds (logistic) at 24k chunks. The router's accuracy
against the questions' corpus tags is reported per run (`routing` in metrics.json).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from rag.cache import MemoryTier
from rag.types import RagError

METHODS = ("centroid", "logistic")
_FIT_SEED = 0


def group_map(groups: Any) -> dict[str, frozenset[str]]:
    """source tag -> its group, from `source_filter.groups` (a list of lists of tags)."""
    out: dict[str, frozenset[str]] = {}
    for g in groups or []:
        if isinstance(g, str) or not isinstance(g, Sequence):
            raise RagError(f"retriever.source_filter.groups must be a list of lists of source tags, got {g!r}")
        for s in g:
            out[str(s)] = frozenset(str(x) for x in g)
    return out


def group_of(corpus: str | None, groups: dict[str, frozenset[str]]) -> frozenset[str] | None:
    """The group a corpus tag belongs to: its configured group, else a group of its own."""
    return None if corpus is None else groups.get(corpus, frozenset([corpus]))


def _normalize(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, np.float32)
    n = np.linalg.norm(v, axis=-1, keepdims=True)
    return v / np.where(n > 0, n, 1.0)


class Router:
    """Routes query vectors to source groups. Groups are the configured ones plus one group per
    chunk source tag that no configured group names; groups without chunks are left out."""

    def __init__(self, groups: Any = None, method: str = "centroid") -> None:
        if method not in METHODS:
            raise RagError(f"retriever.source_filter.router.method must be one of {list(METHODS)}, got {method!r}")
        self.group_map = group_map(groups)
        self.method = method
        self.groups: list[frozenset[str]] = []
        self._model: Any = None

    def fit(self, vectors: np.ndarray, sources: np.ndarray, key: str | None = None,
            memory: MemoryTier | None = None) -> "Router":
        """`vectors[i]` and `sources[i]` of chunk row i. With `key` (the vectors' artifact key) and
        the cache's memory tier, the jobs of a sweep in one process fit each model once."""
        sources = np.asarray(sources, dtype=object)
        # A chunk's source is never None, so neither is its group.
        group = {s: cast(frozenset[str], group_of(s, self.group_map)) for s in set(sources.tolist())}
        present = sorted(set(group.values()), key=lambda g: sorted(g))
        self.groups = present
        labels = np.array([present.index(group[s]) for s in sources.tolist()], np.int64)
        memo_key = None if key is None or memory is None else (key, tuple(tuple(sorted(g)) for g in present), self.method)
        fitted = None if memo_key is None or memory is None else memory.get("routers", memo_key)
        if fitted is not None:
            self._model = fitted
            return self
        if len(present) < 2:
            self._model = None
        elif self.method == "centroid":
            centroids = np.stack([_normalize(vectors[labels == g]).mean(axis=0) for g in range(len(present))])
            self._model = _normalize(centroids)
        else:
            from sklearn.linear_model import LogisticRegression

            clf = LogisticRegression(class_weight="balanced", max_iter=1000, random_state=_FIT_SEED)
            self._model = clf.fit(_normalize(vectors), labels)
        if memo_key is not None and memory is not None and self._model is not None:
            memory.put("routers", memo_key, self._model)
        return self

    def route(self, query_vectors: np.ndarray) -> list[frozenset[str]]:
        """The group each query is routed to."""
        if not self.groups:
            raise RuntimeError("Router.route before fit")
        q = _normalize(np.atleast_2d(query_vectors))
        if self._model is None:
            return [self.groups[0]] * len(q)
        if self.method == "centroid":
            best = (q @ self._model.T).argmax(axis=1)
        else:
            best = self._model.predict(q)
        return [self.groups[int(i)] for i in best]


def routing_report(routed: Sequence[frozenset[str] | None], corpora: Sequence[str | None], groups: Any) -> dict[str, Any]:
    """Accuracy of the routed groups against the groups of the questions' corpus tags (questions
    without a tag are not counted), overall and per corpus tag."""
    gmap = group_map(groups)
    by_corpus: dict[str, list[bool]] = {}
    for r, c in zip(routed, corpora):
        if c is not None:
            by_corpus.setdefault(c, []).append(r == group_of(c, gmap))
    hits = [x for v in by_corpus.values() for x in v]
    return {
        "accuracy": float(np.mean(hits)) if hits else None,
        "n": len(hits),
        "by_corpus": {c: {"accuracy": float(np.mean(v)), "n": len(v)} for c, v in sorted(by_corpus.items())},
    }
