"""Pointwise rerankers: score each (query, candidate) on its own and sort, the shared part of
the cross-encoder (rag/reranker/cross_encoder.py) and a reranking server (rag/reranker/http.py).

Only the first `top_n` candidates of the first stage are scored, each question's in one call of
its own (so its scores do not depend on which questions share a call). Those scores are recorded in
the artifact cache (kind `rerank_scores`, keyed by the scorer's identity, the query and the
candidates' texts), so a run that reranks the same candidates again (a repeated demo, a sweep over
settings downstream of reranking) reads them instead of scoring; a timed search (`reuse=False`,
rag.run.latency) always scores. `fuse` combines the scorer's order with the first stage's order (see
`fuse_scores`).
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from rag.store.cache import make_key
from rag.store.models import UsesCache
from rag.reranker.base import Reranker
from rag.reranker.training.passages import with_label
from rag.types import Chunk, Hits, RagError

log = logging.getLogger(__name__)

FUSE_METHODS = ("none", "rrf", "linear")
SCORES = "rerank_scores"  # record kind: one question's scores for its candidates


def fuse_scores(ce: np.ndarray, method: str, weight: float, k: int = 60) -> np.ndarray:
    """Scores of the head candidates (given in first-stage order) to sort by.

    none:   the cross-encoder's logits.
    rrf:    weight / (k + cross-encoder rank) + (1 - weight) / (k + first-stage rank), ranks from 1:
            reciprocal rank fusion of the two orders.
    linear: weight * z + (1 - weight) * prior, with z the logits standardized within the question
            and prior = -ln(first-stage rank): a candidate the first stage ranked high needs a
            clearly better logit to be overtaken.
    """
    n = len(ce)
    if method == "none" or n == 0:
        return ce
    first = np.arange(1, n + 1, dtype=np.float64)
    if method == "rrf":
        ce_rank = np.empty(n)
        ce_rank[np.argsort(-ce, kind="stable")] = first
        return (weight / (k + ce_rank) + (1 - weight) / (k + first)).astype(np.float32)
    z = (ce - ce.mean()) / (ce.std() + 1e-6)
    return (weight * z - (1 - weight) * np.log(first)).astype(np.float32)


class PointwiseReranker(UsesCache, Reranker):
    """Subclasses set `top_n` and `_identity` (what the scores depend on besides the texts), call
    `set_fuse`, and implement `score_passages`."""

    top_n: int = 20
    label_passages: bool | None = False
    _identity: dict[str, Any]
    _recording = True  # false once the cache refused a record (read-only)

    def set_fuse(self, fuse: dict[str, Any] | None) -> None:
        fuse = dict(fuse or {})
        unknown = sorted(set(fuse) - {"method", "weight", "k"})
        if unknown:
            raise RagError(f"reranker.fuse: unknown key(s) {unknown}; known: method, weight, k")
        self.fuse_method = str(fuse.get("method", "none"))
        if self.fuse_method not in FUSE_METHODS:
            raise RagError(f"reranker.fuse.method must be one of {list(FUSE_METHODS)}, got {self.fuse_method!r}")
        try:
            self.fuse_weight, self.fuse_k = float(fuse.get("weight", 0.5)), int(fuse.get("k", 60))
        except (TypeError, ValueError):
            raise RagError(f"reranker.fuse: weight must be a number and k an integer, got {fuse}") from None
        if not 0 <= self.fuse_weight <= 1 or self.fuse_k < 0:
            raise RagError(f"reranker.fuse: weight must be in [0, 1] and k >= 0, got {fuse}")

    def score_passages(self, query: str, passages: list[str]) -> np.ndarray:
        """One question's scores for its candidates' passages, in their order."""
        raise NotImplementedError

    def passage(self, chunk: Chunk) -> str:
        """The text scored for a candidate: with its document's label first when the scorer was
        trained so (`label_passages`, the trained cross-encoder's passages)."""
        if self.label_passages:
            return with_label(chunk.doc_id, chunk.text)
        return chunk.text

    def before_rerank(self) -> None:
        """Optional: settle what the passages depend on (the cross-encoder's labels)."""

    def scores_key(self, query: str, passages: list[str], identity: dict[str, Any] | None = None) -> str:
        """The record key of one question's scores of its passages, computed by this scorer (or by
        the one `identity` names)."""
        h = hashlib.sha256()
        for p in passages:
            h.update(p.encode("utf-8", "surrogatepass") + b"\0")
        return make_key(SCORES, self._identity if identity is None else identity,
                        {"query": query, "passages": h.hexdigest()})

    def recorded_scores(self, query: str, passages: list[str]) -> np.ndarray | None:
        """The scores recorded for these passages, or None (also rag.run.plan's: is a request due?)."""
        rec = self.cache.get_record(SCORES, self.scores_key(query, passages))
        if rec is not None and len(rec.get("scores", ())) == len(passages):
            return np.asarray(rec["scores"], np.float32)
        return None

    def question_scores(self, query: str, passages: list[str], reuse: bool) -> np.ndarray:
        """One question's scores: recorded ones when `reuse` and present, else scored (and recorded)."""
        key = self.scores_key(query, passages)
        if reuse:
            found = self.recorded_scores(query, passages)
            if found is not None:
                return found
        scores = self.score_passages(query, passages) if passages else np.zeros(0, np.float32)
        if reuse and self._recording:
            try:
                self.cache.put_record(SCORES, key, {"scores": [float(x) for x in scores]})
            except OSError as e:
                self._recording = False
                log.warning("reranker: scores are not recorded in the cache (%s); every run scores anew", e)
        return scores

    def rerank(self, queries: list[str], hits: Hits, chunks: Sequence[Chunk], k: int, reuse: bool = True) -> Hits:
        """The valid candidates among the first top_n of each row, rescored and sorted (ties keep
        the retrieval order); candidates past top_n follow in retrieval order with lower scores."""
        if len(queries) != hits.n_queries:
            raise RagError(f"reranker: {len(queries)} queries but {hits.n_queries} rows of candidates")
        k = int(k)
        if k <= 0:
            return Hits.empty(hits.n_queries, 0)
        self.before_rerank()
        rows: list[list[tuple[int, float]]] = []
        for q in range(hits.n_queries):
            valid = [int(i) for i in hits.ids[q] if i >= 0]
            head, tail = valid[: self.top_n], valid[self.top_n :]
            logits = self.question_scores(queries[q], [self.passage(chunks[i]) for i in head], reuse)
            s = fuse_scores(logits, self.fuse_method, self.fuse_weight, self.fuse_k)
            order = np.argsort(-s, kind="stable")  # stable: ties keep the retrieval order
            row = [(head[j], float(s[j])) for j in order[:k]]
            if len(row) < k and tail:
                floor = (float(s.min()) if len(s) else 0.0) - 1.0
                row += [(i, floor - j) for j, i in enumerate(tail[: k - len(row)])]
            rows.append(row)
        return Hits.from_rows(rows, k)
