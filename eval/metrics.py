"""Retrieval and answer metrics as pure functions on arrays.

Notation (DEVELOPERS.md): E(x) is an embedding from the fixed evaluation embedder, sim the cosine,
G the ground-truth answer, A the generated answer, C the top-k chunks.

- A retrieved chunk c is *relevant* when sim(E(c), E(G)) >= tau_recall.
- recall@k       = 1 if any of the top-k chunks is relevant, else 0.
- MRR            = 1 / rank of the first relevant chunk (ranks from 1), 0 if none.
- precision@k    = (number of relevant chunks in the top k) / k.
- answer-GT      = sim(E(A), E(G)).
- grounding      = sim(E(A), E(concat C)).
- hallucination  = 1 if answer-GT < tau_h and grounding < tau_h, else 0.
- ID-based hit@k / MRR use the question's source document instead of similarity: a chunk is
  relevant when it comes from that document.

Arrays: `sims[q, j]` for question q and its j-th retrieved chunk; `valid[q, j]` is False for empty
slots (fewer than k results), which are never relevant.
"""
from __future__ import annotations

import numpy as np


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two [n, d] arrays (or two [d] vectors)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    num = (a * b).sum(-1)
    den = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)


def relevant_by_similarity(sims: np.ndarray, valid: np.ndarray, tau_recall: float) -> np.ndarray:
    return (np.asarray(sims) >= tau_recall) & np.asarray(valid, bool)


def relevant_by_id(retrieved_doc_ids: list[list[str | None]], source_ids: list[str | None]) -> np.ndarray:
    k = max((len(r) for r in retrieved_doc_ids), default=0)
    rel = np.zeros((len(retrieved_doc_ids), k), bool)
    for q, (docs, src) in enumerate(zip(retrieved_doc_ids, source_ids)):
        if src is not None:
            rel[q, : len(docs)] = [d == src for d in docs]
    return rel


def recall_at_k(relevant: np.ndarray) -> np.ndarray:
    return np.asarray(np.asarray(relevant, bool).any(axis=1), np.float64)


def reciprocal_rank(relevant: np.ndarray) -> np.ndarray:
    rel = np.asarray(relevant, bool)
    first = rel.argmax(axis=1)
    return np.where(rel.any(axis=1), 1.0 / (first + 1), 0.0)


def precision_at_k(relevant: np.ndarray, k: int) -> np.ndarray:
    """Divides by k even when fewer than k chunks came back: missing results are not relevant."""
    return np.asarray(relevant, bool)[:, :k].sum(axis=1) / float(k)


def answer_gt_similarity(e_answer: np.ndarray, e_truth: np.ndarray) -> np.ndarray:
    return cosine(e_answer, e_truth)


def grounding(e_answer: np.ndarray, e_context: np.ndarray) -> np.ndarray:
    return cosine(e_answer, e_context)


def hallucination(answer_gt: np.ndarray, grounding_sim: np.ndarray, tau_h: float) -> np.ndarray:
    return ((np.asarray(answer_gt) < tau_h) & (np.asarray(grounding_sim) < tau_h)).astype(np.float64)
