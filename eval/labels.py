"""Relevance from labels, and the standard IR measures on it (computed by trec_eval itself,
through pytrec_eval).

A question's labels name documents with grades, optionally with the answer's character span
(rag.types.Relevance). Chunk relevance is derived here, at evaluation time, from the chunk's
document id and character offsets, so a new chunker never invalidates a label:

- a chunk *matches* a label when it comes from the label's document and, for a span label,
  shares at least one character with the span; its grade is the highest grade it matches (0: none).
- Each label is one *relevance unit*, found at most once: the top-k chunks are read best first
  and each found unit takes the next rank. A chunk that matches no label stands for its
  document, as a non-relevant unit; a document's later chunks add nothing (max-pooling). This is
  the ranking of documents (or spans) that the chunks give, as in passage-to-document retrieval.
- nDCG@k, recall@k and MAP@k are trec_eval's `ndcg_cut.k`, `recall.k` and `map_cut.k` on that
  ranking against the labels as qrels. The ideal ranking is the labels sorted by grade: it does
  not depend on the chunker, so scores of different chunkings of the same corpus compare.

See docs/reference/metrics.md for the reasoning and the corner cases.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytrec_eval

from rag.types import Chunk, QAItem, Relevance

# metric name -> trec_eval measure (with the cutoff k filled in)
LABEL_MEASURES = {"ndcg_at_k": "ndcg_cut.{k}", "recall_at_k_label": "recall.{k}", "map_at_k": "map_cut.{k}"}
LABEL_METRICS = tuple(LABEL_MEASURES)


def matches(chunk: Chunk, label: Relevance) -> bool:
    if chunk.doc_id != label.doc:
        return False
    return label.span is None or (chunk.start < label.span[1] and label.span[0] < chunk.end)


def chunk_grade(chunk: Chunk, labels: Sequence[Relevance]) -> int:
    """The highest grade of the labels the chunk matches; 0 when it matches none."""
    return max((r.grade for r in labels if matches(chunk, r)), default=0)


def found_units(chunks: Sequence[Chunk], labels: Sequence[Relevance]) -> list[str]:
    """The ranked relevance units that ranked chunks find (see the module docstring). Units that
    one chunk finds together are ordered by grade, then id."""
    out: list[str] = []
    seen: set[str] = set()
    for c in chunks:
        hit = sorted((r for r in labels if matches(c, r)), key=lambda r: (-r.grade, r.unit))
        for unit in [r.unit for r in hit] or [c.doc_id]:
            if unit not in seen:
                seen.add(unit)
                out.append(unit)
    return out


def qrels_of(labels: Sequence[Relevance]) -> dict[str, int]:
    """The labels as trec_eval qrels: unit -> grade (a unit labelled twice keeps its top grade)."""
    out: dict[str, int] = {}
    for r in labels:
        out[r.unit] = max(out.get(r.unit, 0), int(r.grade))
    return out


def trec_measures(qrels: dict[str, dict[str, int]], run: dict[str, list[str]], measures: Sequence[str]) -> dict[str, dict[str, float]]:
    """trec_eval's per-query values of `measures` (e.g. "ndcg_cut.5") for ranked lists of ids.
    The scores given to trec_eval fall strictly with rank, so it sees exactly this order (it sorts
    by score and breaks ties by id). A query with no retrieved id scores 0."""
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, set(measures))
    scored = {q: {d: float(len(ids) - i) for i, d in enumerate(ids)} for q, ids in run.items() if ids}
    result = evaluator.evaluate(scored)
    keys = [m.replace(".", "_") for m in measures]
    return {q: {m: float(result.get(q, {}).get(key, 0.0)) for m, key in zip(measures, keys)} for q in qrels}


def label_metrics(qa: Sequence[QAItem], ranked: Sequence[Sequence[Chunk]], k: int,
                  labels: Sequence[Sequence[Relevance]] | None = None) -> tuple[dict[str, np.ndarray], list[list[int] | None]]:
    """Per-question nDCG@k, recall@k and MAP@k on the labels (NaN for a question without a
    positive label), and each retrieved chunk's grade (None for an unlabelled question).
    `ranked[q]` holds question q's top-k chunks, best first. `labels`: each question's labels in
    place of its own (eval.relevance=llm's; empty: unlabelled)."""
    n = len(qa)
    values = {m: np.full(n, np.nan) for m in LABEL_METRICS}
    grades: list[list[int] | None] = []
    qrels: dict[str, dict[str, int]] = {}
    run: dict[str, list[str]] = {}
    for q, (item, chunks) in enumerate(zip(qa, ranked)):
        own = item.labels if labels is None else labels[q]
        grades.append([chunk_grade(c, own) for c in chunks] if own else None)
        if any(r.grade > 0 for r in own):
            key = str(q)  # positions, not question ids: ids are not guaranteed free of whitespace
            qrels[key] = qrels_of(own)
            run[key] = found_units(chunks[:k], own)
    if qrels:
        measures = [t.format(k=k) for t in LABEL_MEASURES.values()]
        per_q = trec_measures(qrels, run, measures)
        for key, vals in per_q.items():
            for name, measure in zip(LABEL_METRICS, measures):
                values[name][int(key)] = vals[measure]
    return values, grades
