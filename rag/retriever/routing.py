"""Question routing: pick the source group to search from the question text alone, and filter
the search to it only where that pick can be trusted.

`retriever.source_filter.mode=question` filters by the question's own corpus tag, an oracle that
no deployed system has. `mode=router` instead routes each question to one of the configured
source groups (e.g. PubMed vs technical docs) in the pipeline embedder's space, with a model fit
on the corpus's own chunks, never on questions:

- `centroid`: the group whose mean chunk vector (unit-normalized) is nearest by cosine.
- `logistic`: a class-balanced logistic regression on chunk vectors labelled by their group.

A filter the router gets wrong hides the question's answer, whatever search would have found, so
a question is filtered only when the router is confident: its margin (the best group's score minus
the runner-up's: cosines for `centroid`, probabilities for `logistic`) reaches a threshold
calibrated on the corpus itself; below it the question searches every group. The rule:

1. Pseudo-queries: `router.pseudo_queries` per group, each a span of 6-16 words cut from a chunk
   of that group (chunks drawn with a fixed seed, with replacement when a group has fewer), and
   labelled with its chunk's group. Spans, not whole chunks, because they are as short as
   questions: whole chunk vectors sit far closer to their centroid than questions do, and a
   threshold fitted on them filters the questions the router gets wrong.
2. Cross-fitted: the chunks are split into 5 folds, and a pseudo-query is routed by the model
   fitted without its chunk's fold, so that no pseudo-query is scored by a model that saw it
   (centroids: one pass over the vectors serves every fold; `logistic`: five more fits, seconds
   each at 24k chunks).
3. P(right | margin) by isotonic regression (pool-adjacent-violators) of the pseudo-queries'
   rightness on their margin; each pooled block's rate counts one more right and one more wrong
   pseudo-query than it holds, so that a handful of lucky spans never licenses a filter.
4. The threshold is the lowest margin from which every block's rate is at least
   `router.min_precision`: each filtered question was, by the pseudo-queries' evidence, at least
   that likely to be routed right. A rule on the routed pseudo-queries' precision as a whole would
   filter a band of near coin-flips riding on the confident ones (on the demo's slice at 0.98 it
   filters 146 of the 150 questions, one of the 3 the router gets wrong among them; this rule
   filters 137, none of the 3).

The questions never enter it: the same corpus gives the same threshold whatever the question file
holds. `min_precision: 0` filters every question (the hard router); 1 filters none. The fit and
the calibration are kept in the cache's memory tier, so the jobs of a sweep in one process do them
once; the calibration's cost is encoding the pseudo-queries with the query encoder, whatever the
corpus's size.

What the run reports (`routing` in metrics.json, `routing_report`): the router's accuracy against
the questions' corpus tags (all questions, and the filtered ones), the share filtered, the
calibration, and the recall lost to routing: the filtered questions whose answer's document the
unfiltered search had among its candidates and the filtered search did not (`lost_recall`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from rag.store.cache import MemoryTier
from rag.retriever.source_filter import SourceFilter
from rag.types import RagError

METHODS = ("centroid", "logistic")
_FIT_SEED = 0
FOLDS = 5  # cross-fitting folds of the calibration
SPAN_WORDS = (6, 16)  # a pseudo-query's length in words, drawn uniformly: about a question's


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


@dataclass(frozen=True)
class Route:
    """One question's routing: the group the router picked, its margin over the runner-up (None:
    a single group, nothing to choose) and whether the search is filtered to the pick."""

    group: frozenset[str]
    margin: float | None
    filtered: bool

    @property
    def filter(self) -> SourceFilter:
        """The source filter the search applies: the pick when filtered, else none."""
        return self.group if self.filtered else None


@dataclass(frozen=True)
class Calibration:
    """The filtering threshold and the pseudo-queries it was calibrated on."""

    threshold: float  # lowest margin that filters; inf: none does, -inf: every one does
    min_precision: float
    pseudo_queries: int  # 0: not calibrated (min_precision 0 needs none)
    routed_share: float | None  # of the pseudo-queries, those at or above the threshold
    precision: float | None  # the router's accuracy on those

    def to_json(self) -> dict[str, Any]:
        finite = bool(np.isfinite(self.threshold))
        return {"threshold": round(float(self.threshold), 6) if finite else None,
                "filters": "margin >= threshold" if finite else ("every question" if self.threshold < 0 else "no question"),
                "min_precision": self.min_precision, "pseudo_queries": self.pseudo_queries,
                "routed_share": self.routed_share, "precision": self.precision, "folds": FOLDS, "seed": _FIT_SEED}


class Router:
    """Routes query vectors to source groups. Groups are the configured ones plus one group per
    chunk source tag that no configured group names; groups without chunks are left out."""

    def __init__(self, groups: Any = None, method: str = "centroid", min_precision: float = 0.98,
                 pseudo_queries: int = 100) -> None:
        if method not in METHODS:
            raise RagError(f"retriever.source_filter.router.method must be one of {list(METHODS)}, got {method!r}")
        if isinstance(min_precision, bool) or not isinstance(min_precision, (int, float)) \
                or not 0 <= min_precision <= 1:
            raise RagError("retriever.source_filter.router.min_precision must be a number from 0 (filter every "
                           f"question) to 1 (filter none), got {min_precision!r}")
        if isinstance(pseudo_queries, bool) or not isinstance(pseudo_queries, int) or pseudo_queries < 1:
            raise RagError("retriever.source_filter.router.pseudo_queries must be a whole number of at least 1 "
                           f"(pseudo-queries per group), got {pseudo_queries!r}")
        self.group_map = group_map(groups)
        self.method = method
        self.min_precision = float(min_precision)
        self.pseudo_queries = pseudo_queries
        self.groups: list[frozenset[str]] = []
        self._model: Any = None
        self.calibration: Calibration | None = None

    def fit(self, vectors: np.ndarray, sources: np.ndarray, key: str | None = None,
            memory: MemoryTier | None = None, texts: Callable[[np.ndarray], list[str]] | None = None,
            encode: Callable[[list[str]], np.ndarray] | None = None) -> "Router":
        """`vectors[i]` and `sources[i]` of chunk row i. With `texts` (chunk rows -> their texts)
        and `encode` (texts -> query vectors) the filtering threshold is calibrated too (see the
        module); `decide` needs it unless min_precision is 0. With `key` (the vectors' artifact
        key) and the cache's memory tier, the jobs of a sweep in one process fit each model and
        calibrate each threshold once."""
        present, labels = self._labels(sources)
        self.groups = present
        self.calibration = None
        memo_key = None if key is None or memory is None else (key, tuple(tuple(sorted(g)) for g in present), self.method)
        fitted = None if memo_key is None or memory is None else memory.get("routers", memo_key)
        if fitted is not None:
            self._model = fitted
        else:
            self._model = None if len(present) < 2 else _fit_model(self.method, vectors, labels, len(present))
            if memo_key is not None and memory is not None and self._model is not None:
                memory.put("routers", memo_key, self._model)
        if self.min_precision == 0 or len(present) < 2:
            self.calibration = Calibration(-np.inf, self.min_precision, 0, None, None)
        elif texts is not None and encode is not None:
            calib_key = None if memo_key is None else (*memo_key, "calibration", self.min_precision, self.pseudo_queries)
            found = None if calib_key is None or memory is None else memory.get("routers", calib_key)
            self.calibration = found if found is not None else self._calibrate(vectors, sources, labels, texts, encode)
            if calib_key is not None and memory is not None:
                memory.put("routers", calib_key, self.calibration)
        return self

    def _labels(self, sources: np.ndarray) -> tuple[list[frozenset[str]], np.ndarray]:
        """The groups present among the chunks, in a fixed order, and each chunk's group index."""
        sources = np.asarray(sources, dtype=object)
        # A chunk's source is never None, so neither is its group.
        group = {s: cast(frozenset[str], group_of(s, self.group_map)) for s in set(sources.tolist())}
        present = sorted(set(group.values()), key=lambda g: sorted(g))
        return present, np.array([present.index(group[s]) for s in sources.tolist()], np.int64)

    def pseudo_queries_of(self, sources: np.ndarray, texts: Callable[[np.ndarray], list[str]]) -> tuple[np.ndarray, list[str]]:
        """The calibration's pseudo-queries (none when nothing is calibrated: min_precision 0 or a
        single group): their chunk rows and texts, the same on every call."""
        present, labels = self._labels(sources)
        if self.min_precision == 0 or len(present) < 2:
            return np.zeros(0, np.int64), []
        rng = np.random.default_rng(_FIT_SEED)
        rows = pseudo_query_rows(labels, len(present), self.pseudo_queries, rng)
        return rows, [span_of(t, rng) for t in texts(rows)]

    def _calibrate(self, vectors: np.ndarray, sources: np.ndarray, labels: np.ndarray,
                   texts: Callable[[np.ndarray], list[str]], encode: Callable[[list[str]], np.ndarray]) -> Calibration:
        fold = _folds(len(labels))
        rows, spans = self.pseudo_queries_of(sources, texts)
        queries = np.asarray(encode(spans), np.float32)
        margins = np.zeros(len(rows))
        right = np.zeros(len(rows), bool)
        sums = _fold_sums(vectors, labels, fold, len(self.groups)) if self.method == "centroid" else None
        for f in range(FOLDS):
            at = fold[rows] == f
            if not at.any():
                continue
            # A centroid is the normalized sum of its unit chunk vectors, so a fold's model is the
            # sums without that fold's: one pass over the vectors serves every fold.
            model = _normalize(sums.sum(axis=1) - sums[:, f]) if sums is not None else \
                _fit_model(self.method, vectors, labels, len(self.groups), fold != f)
            scores = _scores(self.method, model, queries[at], len(self.groups))
            margins[at] = _margins(scores)
            right[at] = scores.argmax(axis=1) == labels[rows[at]]
        threshold = calibrated_threshold(margins, right, self.min_precision)
        kept = margins >= threshold
        return Calibration(threshold, self.min_precision, len(rows), round(float(kept.mean()), 4),
                           round(float(right[kept].mean()), 4) if kept.any() else None)

    def route(self, query_vectors: np.ndarray) -> list[frozenset[str]]:
        """The group each query is routed to (the pick, filtered or not)."""
        return [r.group for r in self.decide(query_vectors, calibrated=False)]

    def decide(self, query_vectors: np.ndarray, calibrated: bool = True) -> list[Route]:
        """Each query's pick, margin, and whether its search is filtered to the pick (margin at or
        above the calibrated threshold)."""
        if not self.groups:
            raise RuntimeError("Router.route before fit")
        if calibrated and self.calibration is None:
            raise RuntimeError("Router.decide before a calibrated fit (pass texts and encode to fit)")
        q = _normalize(np.atleast_2d(query_vectors))
        if self._model is None:
            return [Route(self.groups[0], None, False)] * len(q)
        scores = _scores(self.method, self._model, q, len(self.groups))
        margins = _margins(scores)
        threshold = self.calibration.threshold if self.calibration is not None else -np.inf
        return [Route(self.groups[int(i)], round(float(m), 6), bool(m >= threshold))
                for i, m in zip(scores.argmax(axis=1), margins)]


def _fit_model(method: str, vectors: np.ndarray, labels: np.ndarray, n_groups: int,
               rows: np.ndarray | None = None) -> Any:
    """Centroids (unit rows, a group without chunks a zero row) or a logistic regression, fitted
    on the chunks where `rows` (a mask) holds, all of them by default."""
    use = np.ones(len(labels), bool) if rows is None else rows
    if method == "centroid":
        dim = vectors.shape[1]
        centroids = np.stack([_normalize(vectors[use & (labels == g)]).mean(axis=0) if (use & (labels == g)).any()
                              else np.zeros(dim, np.float32) for g in range(n_groups)])
        return _normalize(centroids)
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression(class_weight="balanced", max_iter=1000, random_state=_FIT_SEED)
    return clf.fit(_normalize(vectors[use]), labels[use])


def _fold_sums(vectors: np.ndarray, labels: np.ndarray, fold: np.ndarray, n_groups: int,
               block: int = 65_536) -> np.ndarray:
    """[groups, folds, dim]: the sums of the unit chunk vectors per group and fold, read in blocks
    of rows (the vectors may be a memory map larger than memory)."""
    sums = np.zeros((n_groups, FOLDS, vectors.shape[1]), np.float64)
    for start in range(0, len(labels), block):
        v = _normalize(vectors[start:start + block])
        cell = labels[start:start + block] * FOLDS + fold[start:start + block]
        onehot = (cell[None, :] == np.arange(n_groups * FOLDS)[:, None]).astype(np.float32)
        sums += (onehot @ v).reshape(n_groups, FOLDS, -1)
    return sums


def _scores(method: str, model: Any, q: np.ndarray, n_groups: int) -> np.ndarray:
    """[queries, groups]: cosines to the centroids, or the classifier's probabilities (a group the
    classifier never saw gets 0)."""
    q = _normalize(np.atleast_2d(q))
    if method == "centroid":
        return np.asarray(q @ model.T, np.float64)
    out = np.zeros((len(q), n_groups))
    out[:, model.classes_] = model.predict_proba(q)
    return out


def _margins(scores: np.ndarray) -> np.ndarray:
    top = np.sort(scores, axis=1)
    return top[:, -1] - top[:, -2]


def _folds(n: int) -> np.ndarray:
    """Each chunk row's cross-fitting fold, the same on every call."""
    return np.random.default_rng(_FIT_SEED).permutation(n) % FOLDS


def pseudo_query_rows(labels: np.ndarray, n_groups: int, per_group: int, rng: np.random.Generator) -> np.ndarray:
    """`per_group` chunk rows of each group (with replacement where a group has fewer chunks),
    so that every group weighs the same in the calibration whatever its size."""
    rows = []
    for g in range(n_groups):
        members = np.flatnonzero(labels == g)
        if len(members):
            rows.append(rng.choice(members, per_group, replace=len(members) < per_group))
    return np.sort(np.concatenate(rows)) if rows else np.zeros(0, np.int64)


def span_of(text: str, rng: np.random.Generator) -> str:
    """A run of SPAN_WORDS words from `text` at a random place (the whole text when shorter)."""
    words = text.split()
    n = int(rng.integers(SPAN_WORDS[0], SPAN_WORDS[1] + 1))
    if len(words) <= n:
        return " ".join(words)
    start = int(rng.integers(0, len(words) - n + 1))
    return " ".join(words[start:start + n])


def calibrated_threshold(margins: np.ndarray, right: np.ndarray, min_precision: float) -> float:
    """The lowest margin from which P(right | margin), fitted by isotonic regression on the
    pseudo-queries and counting one more right and one more wrong in each pooled block, is at
    least `min_precision` (inf: no margin is)."""
    if min_precision <= 0:
        return -np.inf
    order = np.argsort(margins, kind="stable")
    xs, ys = np.asarray(margins, float)[order], np.asarray(right, float)[order]
    blocks: list[list[float]] = []  # [first index, rights, count], non-decreasing rate
    for i, y in enumerate(ys):
        blocks.append([i, y, 1.0])
        # Equal rates pool too, so that a run of right pseudo-queries is one block, not many small ones.
        while len(blocks) > 1 and blocks[-2][1] * blocks[-1][2] >= blocks[-1][1] * blocks[-2][2]:
            last = blocks.pop()
            blocks[-1][1] += last[1]
            blocks[-1][2] += last[2]
    threshold = np.inf
    for first, rights, count in reversed(blocks):
        if (rights + 1) / (count + 2) < min_precision:
            break
        threshold = float(xs[int(first)])
    return threshold


def lost_recall(answers: Sequence[set[str]], filtered: Sequence[set[str]], unfiltered: Sequence[set[str]]) -> dict[str, int]:
    """Per filtered question: the documents that answer it, those its filtered search found and
    those the unfiltered search found. `lost`: questions whose answer the unfiltered search found
    and the filtered one did not; `gained`: the other way round; `questions`: filtered questions
    with an answer's document to look for."""
    lost = gained = n = 0
    for docs, f, u in zip(answers, filtered, unfiltered):
        if not docs:
            continue
        n += 1
        lost += bool(docs & u) and not docs & f
        gained += bool(docs & f) and not docs & u
    return {"questions": n, "lost": lost, "gained": gained}


def routing_report(routes: Sequence[Route], corpora: Sequence[str | None], groups: Any,
                   calibration: Calibration | None = None, lost: dict[str, int] | None = None,
                   depth: int | None = None) -> dict[str, Any]:
    """The router's picks against the groups of the questions' corpus tags (questions without a
    tag are not counted): `accuracy` over all of them, `routed_accuracy` over the filtered ones,
    per corpus too; the share of questions filtered, the calibration and the recall lost to
    routing (`lost_recall`, at `depth` candidates)."""
    gmap = group_map(groups)
    by_corpus: dict[str, list[tuple[bool, bool]]] = {}
    for r, c in zip(routes, corpora):
        if c is not None:
            by_corpus.setdefault(c, []).append((r.group == group_of(c, gmap), r.filtered))
    hits = [x for v in by_corpus.values() for x in v]
    routed_hits = [right for right, filtered in hits if filtered]
    filtered = sum(r.filtered for r in routes)
    out: dict[str, Any] = {
        "accuracy": float(np.mean([right for right, _ in hits])) if hits else None,
        "n": len(hits),
        "by_corpus": {c: {"accuracy": float(np.mean([right for right, _ in v])), "n": len(v),
                          "routed": sum(f for _, f in v)} for c, v in sorted(by_corpus.items())},
        "routed": filtered,
        "routed_share": round(filtered / len(routes), 4) if routes else None,
        "routed_accuracy": float(np.mean(routed_hits)) if routed_hits else None,
    }
    if calibration is not None:
        out["calibration"] = calibration.to_json()
    if lost is not None:
        out["lost_recall"] = {**lost, "depth": depth}
    return out


def routing_lines(routing: dict[str, Any] | None) -> list[str]:
    """metrics.json `routing` in words, for the run's table and the reports (none: no router)."""
    if not routing:
        return []
    n, routed, acc = routing.get("n") or 0, routing.get("routed"), routing.get("accuracy")
    accuracy = f"router accuracy {'-' if acc is None else f'{acc:.3f}'} on {n} tagged questions"
    if routed is None:  # a run from before the calibrated filter, which filtered every question
        return [f"routing ({routing.get('method')}): every question filtered to its group; {accuracy}"]
    share = routing.get("routed_share")
    first = f"routing ({routing.get('method')}): {routed} questions filtered to one group" \
            + ("" if share is None else f" ({share:.0%})") + ", the others searched every group"
    calib = routing.get("calibration") or {}
    if calib.get("pseudo_queries"):
        thr, prec = calib.get("threshold"), calib.get("precision")
        on = f"precision >= {calib.get('min_precision')} on {calib.get('pseudo_queries')} pseudo-queries from the corpus"
        first += f"; no margin reaches {on}" if thr is None else f"; threshold margin {thr:.3f}, calibrated for {on}" \
            + ("" if prec is None else f" ({calib.get('routed_share'):.0%} of them above it, precision {prec:.3f})")
    elif calib:
        first += f"; router.min_precision={calib.get('min_precision')} filters {calib.get('filters')}"
    racc = routing.get("routed_accuracy")
    second = accuracy + ("" if racc is None else f", {racc:.3f} on the filtered ones")
    lost = routing.get("lost_recall")
    if lost:
        second += f"; recall lost to routing: {lost.get('lost')} of {lost.get('questions')} filtered questions " \
                  f"(answer's document in the unfiltered top {lost.get('depth')}, not in the filtered), " \
                  f"{lost.get('gained')} gained"
    return [first, second]
