"""Held-out metrics of a reranker on validation groups: each query's positive ranked among its
negatives (MRR, pairwise accuracy), pointwise accuracy at logit 0 and ROC AUC over all pairs."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rag.reranker.training.examples import Group, Pair


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mann-Whitney AUC, ties counted half."""
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    allv = np.concatenate([pos, neg])
    order = np.argsort(allv, kind="mergesort")
    sorted_v = allv[order]
    ranks = np.empty(len(allv))
    i = 0
    while i < len(sorted_v):  # average ranks over ties
        j = i
        while j + 1 < len(sorted_v) and sorted_v[j + 1] == sorted_v[i]:
            j += 1
        ranks[i : j + 1] = (i + j) / 2 + 1
        i = j + 1
    r = np.empty(len(allv))
    r[order] = ranks
    return float((r[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def group_metrics(groups: Sequence[Group], scores: np.ndarray) -> dict[str, Any]:
    """Metrics of per-pair scores laid out as `[g.pairs() for g in groups]` flattened; scores are
    logits (0 = probability 0.5)."""
    labels = np.array([lab for g in groups for _, _, lab in g.pairs()], np.float64)
    scores = np.asarray(scores, np.float64)
    rr: list[float] = []
    pairwise: list[float] = []
    by_kind: dict[str, list[float]] = {}
    at = 0
    for g in groups:
        n = 1 + len(g.negatives)
        s = scores[at : at + n]
        at += n
        better = float((s[1:] > s[0]).sum() + 0.5 * (s[1:] == s[0]).sum())
        rr.append(1.0 / (1.0 + better))
        pairwise.append(float((s[1:] < s[0]).mean() + 0.5 * (s[1:] == s[0]).mean()))
        by_kind.setdefault(g.kind, []).append(rr[-1])
    nan = float("nan")
    return {
        "mrr": round(float(np.mean(rr)), 4) if rr else nan,
        "pairwise_accuracy": round(float(np.mean(pairwise)), 4) if pairwise else nan,
        "accuracy": round(float(((scores > 0) == (labels > 0.5)).mean()), 4) if len(labels) else nan,
        "auc": round(roc_auc(scores, labels), 4),
        "mrr_by_kind": {k: round(float(np.mean(v)), 4) for k, v in sorted(by_kind.items())},
        "queries": len(groups),
    }


def score_pairs(model: Any, pairs: Sequence[Pair], batch_size: int = 64, bf16: bool = False) -> np.ndarray:
    """Raw logits of a CrossEncoder for (query, passage, label) pairs (under bf16 autocast when
    asked: the model trained that way, and it halves the time on CPUs that compute bf16)."""
    from rag.reranker.logits import predict_logits

    return predict_logits(model, [(q, p) for q, p, _ in pairs], batch_size, bf16)


def evaluate(model: Any, groups: Sequence[Group], batch_size: int = 64, bf16: bool = False) -> dict[str, Any]:
    return group_metrics(groups, score_pairs(model, [p for g in groups for p in g.pairs()], batch_size, bf16))


def biencoder_reference(base_path: str, groups: Sequence[Group], device: str = "cpu") -> dict[str, Any]:
    """The same held-out groups ranked by the base model used as a bi-encoder (cosine of mean
    pooled embeddings): what the dense retriever alone would do with them."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(base_path, device=device)
    queries = st.encode([g.query for g in groups], normalize_embeddings=True, show_progress_bar=False)
    passages = st.encode([p for g in groups for _, p, _ in g.pairs()], normalize_embeddings=True,
                         show_progress_bar=False)
    owner = np.array([qi for qi, g in enumerate(groups) for _ in g.pairs()])
    m = group_metrics(groups, (passages * queries[owner]).sum(1))
    return {k: m[k] for k in ("mrr", "pairwise_accuracy", "auc", "mrr_by_kind")}
