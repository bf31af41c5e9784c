"""Scores a run: per-question metrics and their aggregates (mean with a bootstrap CI).

Every similarity comes from the evaluation embedder (`eval.embedder`), never the pipeline's own,
so that changing the pipeline's embedder cannot move the yardstick. Only when the evaluation
embedder is the very same model and settings as a cached vector artifact are those vectors
reused: they are then the same numbers the evaluation embedder would compute.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from eval import metrics as M
from eval.stats import bootstrap_ci
from rag.types import Chunk, Hits, QAItem, RagError

_MEMO_SIZE = 50_000  # texts; ~1.5 KB each for a 384-d model
_memo: "OrderedDict[tuple[str, str], np.ndarray]" = OrderedDict()


def encode_memoized(embedder: Any, texts: list[str]) -> np.ndarray:
    """The evaluation embedder's vectors, memoized per text within the process: the jobs of an
    in-process sweep score the same ground truths and mostly the same chunks, and re-encoding
    them was the floor of every job's cost."""
    model_key = json.dumps(embedder.id, sort_keys=True, default=str)
    missing = list(dict.fromkeys(t for t in texts if (model_key, t) not in _memo))
    if missing:
        for t, v in zip(missing, embedder.encode(missing, show_progress=False)):
            _memo[(model_key, t)] = v
        while len(_memo) > _MEMO_SIZE:
            _memo.popitem(last=False)
    if not texts:
        return np.zeros((0, 0), np.float32)
    return np.stack([_memo[(model_key, t)] for t in texts])


RETRIEVAL_METRICS = ("recall_at_k", "mrr", "precision_at_k", "hit_at_k_id", "mrr_id")
ANSWER_METRICS = ("answer_gt", "grounding", "hallucination")
ALL_METRICS = RETRIEVAL_METRICS + ANSWER_METRICS


@dataclass
class ScoreSettings:
    k: int = 5
    tau_recall: float = 0.75
    tau_h: float = 0.5
    metrics: tuple[str, ...] = ALL_METRICS
    bootstrap_resamples: int = 1000
    bootstrap_seed: int = 0
    context_separator: str = "\n\n"

    def __post_init__(self) -> None:
        if int(self.k) <= 0:
            raise RagError(f"eval.k must be positive, got {self.k}")
        for name in ("tau_recall", "tau_h"):
            v = getattr(self, name)
            if not -1.0 <= float(v) <= 1.0:
                raise RagError(f"eval.{name} is a cosine threshold and must be in [-1, 1], got {v}")
        unknown = [m for m in self.metrics if m not in ALL_METRICS]
        if unknown:
            raise RagError(f"eval.metrics: unknown metric(s) {unknown}; known: {list(ALL_METRICS)}")


def score(
    qa: list[QAItem],
    hits: Hits,
    chunks: list[Chunk],
    eval_embedder: Any,
    settings: ScoreSettings,
    answers: list[str | None] | None = None,
    chunk_vectors: np.ndarray | None = None,
    context_texts: list[list[str]] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Returns (per-question records, aggregates).

    Grounding compares the answer with the concatenated passages the LLM was given
    (`context_texts`); without context expansion those are exactly the top-k chunks."""
    k = settings.k
    top = hits.top(k)
    ids = top.ids
    valid = ids >= 0
    n_q = len(qa)

    e_truth = encode_memoized(eval_embedder, [item.answer for item in qa])
    rows = np.unique(ids[valid])
    if chunk_vectors is not None:
        row_vecs = np.asarray(chunk_vectors[rows], np.float32)
    else:
        row_vecs = encode_memoized(eval_embedder, [chunks[r].text for r in rows])
    pos = {int(r): i for i, r in enumerate(rows)}
    sims = np.full(ids.shape, -1.0)
    for q in range(n_q):
        for j in range(ids.shape[1]):
            if valid[q, j]:
                sims[q, j] = float(M.cosine(row_vecs[pos[int(ids[q, j])]], e_truth[q]))

    rel_sim = M.relevant_by_similarity(sims, valid, settings.tau_recall)
    doc_ids = [[chunks[r].doc_id if r >= 0 else None for r in ids[q]] for q in range(n_q)]
    rel_id = M.relevant_by_id(doc_ids, [item.source for item in qa])
    values: dict[str, np.ndarray] = {
        "recall_at_k": M.recall_at_k(rel_sim),
        "mrr": M.reciprocal_rank(rel_sim),
        "precision_at_k": M.precision_at_k(rel_sim, k),
    }
    has_source = np.array([item.source is not None for item in qa])
    values["hit_at_k_id"] = np.where(has_source, M.recall_at_k(rel_id), np.nan)
    values["mrr_id"] = np.where(has_source, M.reciprocal_rank(rel_id), np.nan)

    if context_texts is None:
        context_texts = [[chunks[r].text for r in ids[q] if r >= 0] for q in range(n_q)]
    contexts = [settings.context_separator.join(texts) for texts in context_texts]
    if answers is not None:
        # Questions without an answer (None: outside the answered sample) get no answer metrics.
        answered = [q for q, a in enumerate(answers) if a is not None]
        for m in ANSWER_METRICS:
            values[m] = np.full(n_q, np.nan)
        if answered:
            e_answer = eval_embedder.encode([answers[q] for q in answered], show_progress=False)
            e_context = eval_embedder.encode([contexts[q] for q in answered], show_progress=False)
            gt = M.answer_gt_similarity(e_answer, e_truth[answered])
            grounded = M.grounding(e_answer, e_context)
            values["answer_gt"][answered] = gt
            values["grounding"][answered] = grounded
            values["hallucination"][answered] = M.hallucination(gt, grounded, settings.tau_h)

    reported = [m for m in settings.metrics if m in values]
    records = []
    for q, item in enumerate(qa):
        rec: dict[str, Any] = {
            "id": item.id,
            "question": item.question,
            "ground_truth": item.answer,
            "source": item.source,
            "corpus": item.corpus,
            "retrieved": [
                {
                    "rank": j + 1,
                    "chunk_id": chunks[int(r)].id,
                    "doc_id": chunks[int(r)].doc_id,
                    "score": float(top.scores[q, j]),
                    "sim_to_truth": round(float(sims[q, j]), 4),
                    "relevant": bool(rel_sim[q, j]),
                    "text": chunks[int(r)].text,
                }
                for j, r in enumerate(ids[q])
                if r >= 0
            ],
        }
        if answers is not None and answers[q] is not None:
            rec["answer"] = answers[q]
        for m in reported:
            v = values[m][q]
            rec[m] = None if np.isnan(v) else float(v)
        records.append(rec)

    aggregates = aggregate(records, reported, settings)
    return records, aggregates


def aggregate(records: list[dict[str, Any]], metrics: list[str], settings: ScoreSettings) -> dict[str, Any]:
    """Mean and 95% bootstrap CI of each metric, overall and per question corpus."""

    def summarize(recs: list[dict[str, Any]]) -> dict[str, Any]:
        out = {}
        for m in metrics:
            v = np.array([r[m] for r in recs if r.get(m) is not None], np.float64)
            if len(v) == 0:
                continue
            lo, hi = bootstrap_ci(v, settings.bootstrap_resamples, 0.95, settings.bootstrap_seed)
            out[m] = {"mean": float(v.mean()), "ci95": [lo, hi], "n": int(len(v))}
        return out

    by_corpus: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_corpus.setdefault(r.get("corpus") or "unlabelled", []).append(r)
    return {
        "overall": summarize(records),
        "by_corpus": {c: summarize(rs) for c, rs in sorted(by_corpus.items())},
        "n_questions": len(records),
    }
