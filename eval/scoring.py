"""Scores a run: per-question metrics and their aggregates (mean with a bootstrap CI).

Every similarity comes from the evaluation embedder (`eval.embedder`), never the pipeline's own,
so that changing the pipeline's embedder cannot move the yardstick. Only when the evaluation
embedder is the very same model and settings as a cached vector artifact are those vectors
reused: they are then the same numbers the evaluation embedder would compute.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any

import numpy as np

from eval import metrics as M
from eval.labels import LABEL_METRICS, label_metrics
from eval.record import JudgedMetric, QuestionRecord, RetrievedChunk
from eval.stats import bootstrap_ci
from rag.store.cache import ArtifactCache, MemoryTier, make_key
from rag.types import Chunk, Hits, QAItem, RagError, Relevance


class MemoizedEncoder:
    """The evaluation embedder's vectors, kept per text in a memory tier (rag.store.cache.MemoryTier,
    table `eval_vectors`): the jobs of an in-process sweep score the same ground truths, mostly
    the same chunks, and (when only retrieval settings downstream of the contexts change) the same
    answers and contexts, and re-encoding them was the floor of every job's cost. Without a tier
    (a single scoring call) texts are still encoded once each."""

    def __init__(self, embedder: Any, memory: MemoryTier | None = None, store: ArtifactCache | None = None):
        self.embedder = embedder
        self.memory = memory if memory is not None else MemoryTier()
        self.store = store
        self._model = json.dumps(embedder.id, sort_keys=True, default=str)

    def __call__(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), np.float32)
        found: dict[str, np.ndarray] = {}
        missing = []
        for t in dict.fromkeys(texts):
            v = self.memory.get("eval_vectors", (self._model, t))
            if v is None:
                missing.append(t)
            else:
                found[t] = v
        if missing:
            for t, v in zip(missing, self._encode(missing)):
                found[t] = self.memory.put("eval_vectors", (self._model, t), v)
        return np.stack([found[t] for t in texts])

    def _encode(self, texts: list[str]) -> np.ndarray:
        """The vectors of `texts`; with a store, kept on disk under the model and the exact texts
        (kind `eval_vectors`), so that a new process repeating a run's scoring (a warm rerun, the
        demo's second time) neither loads the evaluation model nor encodes again."""
        if self.store is None:
            return np.asarray(self.embedder.encode(texts, show_progress=False), np.float32)
        digest = hashlib.sha256("\0".join(texts).encode("utf-8", "surrogatepass")).hexdigest()
        params = {"model": self._model, "texts": digest, "n": len(texts)}

        def build(tmp: Any) -> dict[str, Any]:
            vectors = np.asarray(self.embedder.encode(texts, show_progress=False), np.float32)
            np.save(tmp / "vectors.npy", vectors, allow_pickle=False)
            return {}

        art = self.store.get_or_build("eval_vectors", make_key("eval_vectors", params), build, inputs=params)
        return np.load(art.file("vectors.npy"), allow_pickle=False)


@dataclass(frozen=True)
class JudgedLabels:
    """eval.relevance=llm's labels per question (eval/relevance.py) and, per question, the judge's
    grade of each retrieved chunk in rank order (None: unjudged)."""

    labels: Sequence[tuple[Relevance, ...]]
    grades: Sequence[Sequence[int | None]]


RETRIEVAL_METRICS = ("recall_at_k", "mrr", "precision_at_k", "hit_at_k_id", "mrr_id") + LABEL_METRICS
ANSWER_METRICS = ("answer_gt", "grounding", "hallucination")
ALL_METRICS = RETRIEVAL_METRICS + ANSWER_METRICS
# Metrics that compare with the ground-truth answer: not computed for a question without one.
SIMILARITY_METRICS = ("recall_at_k", "mrr", "precision_at_k", "answer_gt")


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
        if isinstance(self.bootstrap_resamples, bool) or int(self.bootstrap_resamples) < 1:
            raise RagError(f"eval.bootstrap.resamples must be positive, got {self.bootstrap_resamples}")
        unknown = [m for m in self.metrics if m not in ALL_METRICS]
        if unknown:
            raise RagError(f"eval.metrics: unknown metric(s) {unknown}; known: {list(ALL_METRICS)}")


def score(
    qa: list[QAItem],
    hits: Hits,
    chunks: Sequence[Chunk],
    eval_embedder: Any,
    settings: ScoreSettings,
    answers: list[str | None] | None = None,
    chunk_vectors: np.ndarray | None = None,
    context_texts: list[list[str]] | None = None,
    memory: MemoryTier | None = None,
    store: ArtifactCache | None = None,
    judged: JudgedLabels | None = None,
) -> tuple[list[QuestionRecord], dict[str, Any]]:
    """Returns (per-question records, aggregates).

    Grounding compares the answer with the concatenated passages the LLM was given
    (`context_texts`); without context expansion those are exactly the top-k chunks. A question
    without a ground-truth answer (a BEIR query) gets None for the metrics that need one.
    `memory`: where the evaluation vectors of texts are kept between calls, `store`: the artifact
    cache that keeps them between processes (MemoizedEncoder). `judged`: eval.relevance=llm's
    labels, in place of the question set's, and each retrieved chunk's own grade."""
    encode = MemoizedEncoder(eval_embedder, memory, store)
    k = settings.k
    top = hits.top(k)
    ids = top.ids
    n_q = len(qa)
    has_answer = np.array([item.answer is not None for item in qa], bool)

    e_truth, sims = truth_similarities(qa, ids, chunks, encode, chunk_vectors)
    rel_sim = M.relevant_by_similarity(sims, ids >= 0, settings.tau_recall)
    values = retrieval_values(qa, ids, chunks, rel_sim, k)
    ranked = [[chunks[int(r)] for r in ids[q] if r >= 0] for q in range(n_q)]
    label_values, grades = label_metrics(qa, ranked, k, None if judged is None else judged.labels)
    values.update(label_values)

    if context_texts is None:
        context_texts = [[chunks[r].text for r in ids[q] if r >= 0] for q in range(n_q)]
    contexts = [settings.context_separator.join(texts) for texts in context_texts]
    if answers is not None:
        values.update(answer_values(answers, contexts, e_truth, encode, settings.tau_h))
    for m in SIMILARITY_METRICS + ("hallucination",):
        if m in values:
            values[m] = np.where(has_answer, values[m], np.nan)

    reported = [m for m in settings.metrics if m in values]
    records = []
    for q, item in enumerate(qa):
        slots = [(j, int(r)) for j, r in enumerate(ids[q]) if r >= 0]
        labelled = grades[q]
        own = judged.grades[q] if judged is not None else None
        records.append(QuestionRecord(
            id=item.id, question=item.question, ground_truth=item.answer, source=item.source, corpus=item.corpus,
            labels=list(item.labels if judged is None else judged.labels[q]), provenance=item.provenance,
            retrieved=[
                RetrievedChunk(
                    rank=j + 1, chunk_id=chunks[r].id, doc_id=chunks[r].doc_id, score=float(top.scores[q, j]),
                    sim_to_truth=round(float(sims[q, j]), 4) if has_answer[q] else None,
                    relevant=bool(rel_sim[q, j]) if has_answer[q] else None,
                    grade=None if labelled is None else labelled[i],
                    relevant_label=None if labelled is None else labelled[i] > 0,
                    text=chunks[r].text,
                    extra={} if own is None else {"judge_grade": own[i]},
                )
                for i, (j, r) in enumerate(slots)
            ],
            answer=None if answers is None else answers[q],
            metrics={m: _value(values[m][q]) for m in reported},
        ))

    aggregates = aggregate(records, reported, settings)
    return records, aggregates


def _value(v: float) -> float | None:
    return None if np.isnan(v) else float(v)


def retrieval_values(qa: list[QAItem], ids: np.ndarray, chunks: Sequence[Chunk], rel_sim: np.ndarray,
                     k: int) -> dict[str, np.ndarray]:
    """The seed's similarity metrics and the metrics by source id, per question."""
    doc_ids = [[chunks[r].doc_id if r >= 0 else None for r in ids[q]] for q in range(len(qa))]
    rel_id = M.relevant_by_id(doc_ids, [item.source for item in qa])
    has_source = np.array([item.source is not None for item in qa])
    return {
        "recall_at_k": M.recall_at_k(rel_sim),
        "mrr": M.reciprocal_rank(rel_sim),
        "precision_at_k": M.precision_at_k(rel_sim, k),
        "hit_at_k_id": np.where(has_source, M.recall_at_k(rel_id), np.nan),
        "mrr_id": np.where(has_source, M.reciprocal_rank(rel_id), np.nan),
    }


def answer_values(answers: list[str | None], contexts: list[str], e_truth: np.ndarray | None,
                  encode: MemoizedEncoder, tau_h: float) -> dict[str, np.ndarray]:
    """answer-GT, grounding and hallucination per question. Questions without an answer (None:
    outside the answered sample) get none of them; questions without a ground truth get
    grounding only."""
    values = {m: np.full(len(answers), np.nan) for m in ANSWER_METRICS}
    answered = [q for q, a in enumerate(answers) if a is not None]
    if not answered:
        return values
    e_answer = encode([a for a in answers if a is not None])
    e_context = encode([contexts[q] for q in answered])
    grounded = M.grounding(e_answer, e_context)
    values["grounding"][answered] = grounded
    if e_truth is not None:
        gt = M.answer_gt_similarity(e_answer, e_truth[answered])
        values["answer_gt"][answered] = gt
        values["hallucination"][answered] = M.hallucination(gt, grounded, tau_h)
    return values


def truth_similarities(
    qa: list[QAItem], ids: np.ndarray, chunks: Sequence[Chunk], encode: MemoizedEncoder, chunk_vectors: np.ndarray | None
) -> tuple[np.ndarray | None, np.ndarray]:
    """The ground truths' vectors (a zero row for a question without an answer; None when no
    question has one) and sim(E(chunk), E(G)) per retrieved slot (-1 for empty slots and for
    questions without an answer)."""
    valid = ids >= 0
    has_answer = np.array([item.answer is not None for item in qa], bool)
    e_truth: np.ndarray | None = None
    if has_answer.any():
        e_truth = encode([item.answer for item in qa if item.answer is not None])
        if not has_answer.all():
            full = np.zeros((len(qa), e_truth.shape[1]), e_truth.dtype)
            full[has_answer] = e_truth
            e_truth = full
    rows = np.unique(ids[valid])
    if e_truth is None:
        row_vecs = None
    elif chunk_vectors is not None:
        row_vecs = np.asarray(chunk_vectors[rows], np.float32)
    else:
        row_vecs = encode([chunks[r].text for r in rows])
    pos = {int(r): i for i, r in enumerate(rows)}
    sims = np.full(ids.shape, -1.0)
    if e_truth is None or row_vecs is None:  # no question has a ground truth
        return e_truth, sims
    for q in range(len(qa)):
        for j in range(ids.shape[1]):
            if valid[q, j] and has_answer[q]:
                sims[q, j] = float(M.cosine(row_vecs[pos[int(ids[q, j])]], e_truth[q]))
    return e_truth, sims


def aggregate(records: list[QuestionRecord], metrics: list[str], settings: ScoreSettings) -> dict[str, Any]:
    """Mean and 95% bootstrap CI of each metric, overall and per question corpus."""

    def summarize(recs: list[QuestionRecord]) -> dict[str, Any]:
        out = {}
        for m in metrics:
            summary = _mean_ci([v for r in recs if (v := r.metrics.get(m)) is not None], settings)
            if summary is not None:
                out[m] = summary
        return out

    return {
        "overall": summarize(records),
        "by_corpus": {c: summarize(rs) for c, rs in _by_corpus(records).items()},
        "n_questions": len(records),
    }


def _mean_ci(values: list[float], settings: ScoreSettings) -> dict[str, Any] | None:
    v = np.array(values, np.float64)
    if len(v) == 0:
        return None
    lo, hi = bootstrap_ci(v, settings.bootstrap_resamples, 0.95, settings.bootstrap_seed)
    return {"mean": float(v.mean()), "ci95": [lo, hi], "n": int(len(v))}


def _by_corpus(records: list[QuestionRecord]) -> dict[str, list[QuestionRecord]]:
    groups: dict[str, list[QuestionRecord]] = {}
    for r in records:
        groups.setdefault(r.corpus or "unlabelled", []).append(r)
    return dict(sorted(groups.items()))


def add_judge_scores(records: list[QuestionRecord], aggregates: dict[str, Any], judged: dict[str, Any],
                     settings: ScoreSettings) -> list[str]:
    """Adds the judge's metrics (`judge_<metric>`, eval/judge.py) beside the others: per question
    the repeats and the mean of the measured ones (None when unmeasured), in `judge`; per aggregate mean, CI and n over the measured questions, with `unmeasured` (questions
    without any measured judgement) and `judgements_unmeasured` (of `judgements` asked) beside
    them, and agreement of the repeats. Returns the metric names added."""
    from eval.judge import question_score

    names = []
    for metric in judged["metrics"]:
        name = f"judge_{metric}"
        names.append(name)
        for rec, slots in zip(records, judged["per_question"]):
            rec.judge[metric] = JudgedMetric(slots[metric], question_score(slots[metric]))
        aggregates["overall"][name] = _judge_summary(records, metric, judged["repeats"], settings)
        for corpus, recs in _by_corpus(records).items():
            aggregates["by_corpus"].setdefault(corpus, {})[name] = _judge_summary(recs, metric, judged["repeats"], settings)
    return names


def _judge_summary(records: list[QuestionRecord], metric: str, repeats: int, settings: ScoreSettings) -> dict[str, Any]:
    from eval.judge import RUBRICS, agreement, fleiss_kappa

    slots = [r.judge[metric].verdicts for r in records]
    scores = [r.judge[metric].score for r in records]
    errors = [e for s in slots for e in s["errors"] if e]
    out = _mean_ci([v for v in scores if v is not None], settings) or {"mean": None, "ci95": [None, None], "n": 0}
    out.update(unmeasured=sum(v is None for v in scores), judgements=sum(len(s["scores"]) for s in slots),
               judgements_unmeasured=len(errors),
               unmeasured_causes={c: sum(e.startswith(c) for e in errors) for c in ("unparseable", "request failed")})
    if repeats > 1:
        out["agreement"], out["agreement_n"] = agreement(slots)
        out["fleiss_kappa"], out["fleiss_kappa_n"] = fleiss_kappa(slots, list(RUBRICS[metric].verdicts))
    return out
