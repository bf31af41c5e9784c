"""What each metric is called, which way is better, and what it means: the one table the report,
the charts, the verdict and the HTML page read.

Metrics are handled generically everywhere else (any numeric per-question field listed in
metrics.json "metrics"); a metric missing here gets its own name as label, no unit, and is taken
as higher-is-better. `{k}`, `{tau_recall}` and `{tau_h}` are filled from the runs' config.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

LOWER_MARK = "↓"  # appended to the label of every lower-is-better metric, on every chart and table
LOWER_NOTE = "↓ lower is better"
# Derived at report time from per_question.jsonl: the question's retrieval latency (every stage but
# generation). Generation is left out: it runs in batches (each question is charged its batch's
# share) and may cover a sample of the questions only (slice.answer_questions_per_corpus), so a
# sum with it would compare unlike questions; its cost is in the summary's Cost table.
LATENCY = "latency_ms"
LATENCY_EXCLUDED_STAGES = ("generate",)


@dataclass(frozen=True)
class MetricInfo:
    label: str
    unit: str = "mean over questions"
    higher_is_better: bool = True
    formula: str = ""
    threshold: str = ""
    high: str = ""
    low: str = ""
    decimals: int = 3


_SIM = "cosine of the fixed evaluation embedder's vectors"
METRICS: dict[str, MetricInfo] = {
    "recall_at_k": MetricInfo(
        "recall@{k}", "share of questions, 0–1",
        formula="1 if any of the top-{k} chunks has sim(E(chunk), E(ground truth)) ≥ τ, else 0 (" + _SIM + ")",
        threshold="τ = {tau_recall} (eval.tau_recall)",
        high="the answer's content is somewhere in the top {k} for most questions",
        low="the retriever rarely brings back a passage resembling the answer"),
    "mrr": MetricInfo(
        "MRR", "mean reciprocal rank, 0–1",
        formula="1 / rank of the first chunk with sim(E(chunk), E(ground truth)) ≥ τ; 0 if none in the top {k}",
        threshold="τ = {tau_recall} (eval.tau_recall)",
        high="a passage resembling the answer comes first or near the top",
        low="such passages are missing or ranked low"),
    "precision_at_k": MetricInfo(
        "precision@{k}", "share of top-{k} chunks, 0–1",
        formula="(chunks in the top {k} with sim(E(chunk), E(ground truth)) ≥ τ) / {k}",
        threshold="τ = {tau_recall} (eval.tau_recall)",
        high="most of the context given to the LLM is on topic",
        low="the context is mostly noise (even when one good chunk is in it)"),
    "hit_at_k_id": MetricInfo(
        "hit@{k} (source id)", "share of questions, 0–1",
        formula="1 if any of the top-{k} chunks comes from the question's source document, else 0",
        threshold="exact match of document ids (no threshold)",
        high="the right document is found for most questions",
        low="retrieval lands in other documents"),
    "mrr_id": MetricInfo(
        "MRR (source id)", "mean reciprocal rank, 0–1",
        formula="1 / rank of the first chunk from the question's source document; 0 if none in the top {k}",
        threshold="exact match of document ids (no threshold)",
        high="the source document's chunks rank first",
        low="the source document is missing or ranked low"),
    "answer_gt": MetricInfo(
        "answer–truth similarity", "cosine similarity",
        formula="sim(E(answer), E(ground truth)) (" + _SIM + ")",
        threshold="none (a mean of cosines); hallucination uses τ_h = {tau_h}",
        high="answers say what the ground truth says",
        low="answers miss or contradict the ground truth"),
    "grounding": MetricInfo(
        "grounding", "cosine similarity",
        formula="sim(E(answer), E(concatenated contexts given to the LLM))",
        threshold="none (a mean of cosines); hallucination uses τ_h = {tau_h}",
        high="answers stay close to the passages they were given",
        low="answers drift away from their context (made up, or generic)"),
    "hallucination": MetricInfo(
        "hallucination rate", "share of questions, 0–1", higher_is_better=False,
        formula="1 if answer–truth similarity < τ_h and grounding < τ_h, else 0",
        threshold="τ_h = {tau_h} (eval.tau_h)",
        high="many answers match neither the truth nor their context",
        low="few answers are unsupported"),
    # The label metrics (eval/labels.py) rank relevance units: the labelled documents or answer
    # spans that the top-{k} chunks find, each counted once, so their ideal does not depend on the
    # chunker. trec_eval computes them (ndcg_cut, recall, map_cut).
    "ndcg_at_k": MetricInfo(
        "nDCG@{k}", "0–1",
        formula="DCG of the labelled units the top {k} chunks find, by grade / DCG of the ideal ranking of the labels",
        threshold="relevance labels (graded; a span label is found by a chunk that overlaps it)",
        high="labelled documents or spans are found, and found first",
        low="labelled documents or spans are missing or ranked low"),
    "recall_at_k_label": MetricInfo(
        "recall@{k} (labels)", "share of a question's labels, 0–1",
        formula="labelled units found by the top {k} chunks / all labelled units of the question",
        threshold="relevance labels (grade > 0)",
        high="most labelled evidence is retrieved",
        low="most labelled evidence is missed"),
    "map_at_k": MetricInfo(
        "MAP@{k}", "0–1",
        formula="sum over the labelled units found in the top {k} of precision at their rank / all labelled units",
        threshold="relevance labels (grade > 0)",
        high="labelled units are found and ranked above unlabelled ones",
        low="labelled units are missing or buried"),
    "judge_faithfulness": MetricInfo(
        "faithfulness (judge)", "share of measured questions, 0–1",
        formula="LLM judge (eval.judge): 1 if every claim of the answer is supported by its passages, else 0; "
                "mean of the measured repeats",
        threshold="the judge's verdict; unmeasured judgements are counted beside the mean, not averaged",
        high="the judge finds the answers supported by their passages",
        low="the judge finds unsupported claims"),
    "judge_correctness": MetricInfo(
        "correctness (judge)", "share of measured questions, 0–1",
        formula="LLM judge (eval.judge): correct 1, partially correct 0.5, incorrect 0 against the ground truth; "
                "mean of the measured repeats",
        threshold="the judge's verdict; unmeasured judgements are counted beside the mean, not averaged",
        high="the judge finds the answers correct",
        low="the judge finds the answers wrong"),
    LATENCY: MetricInfo(
        "retrieval latency", "ms per question", higher_is_better=False, decimals=1,
        formula="the question's retrieve + rerank time (every stage but generation, which runs in batches and "
                "may cover a sample of the questions), from per_question.jsonl",
        threshold="none (wall-clock; depends on the machine and its load)",
        high="slow retrieval (e.g. a reranker's cost)", low="fast retrieval"),
}


def info(name: str) -> MetricInfo:
    return METRICS.get(name) or MetricInfo(name)


def lower_is_better(name: str) -> bool:
    return not info(name).higher_is_better


def label(name: str, k: Any = "k", unit: bool = False, mark: bool = True) -> str:
    """'recall@5', 'hallucination rate ↓', with unit: 'MRR (mean reciprocal rank, 0–1)'."""
    i = info(name)
    text = i.label.format(k=k)
    if unit:
        text = f"{text} ({i.unit.format(k=k)})"
    if mark and not i.higher_is_better:
        text = f"{text} {LOWER_MARK}"
    return text


def describe(name: str, k: Any = "k", tau_recall: Any = 0.75, tau_h: Any = 0.5) -> dict[str, Any]:
    """Every field of the metric's entry, placeholders filled (for the report's metric glossary)."""
    i = info(name)
    fill = {"k": k, "tau_recall": tau_recall, "tau_h": tau_h}
    return {
        "name": name, "label": label(name, k, mark=False), "unit": i.unit.format(**fill),
        "higher_is_better": i.higher_is_better, "formula": i.formula.format(**fill) or "see metrics.json",
        "threshold": i.threshold.format(**fill), "high": i.high.format(**fill), "low": i.low.format(**fill),
        "decimals": i.decimals,
    }


def better(name: str, diff: float) -> bool:
    """Whether a difference (run − baseline) is an improvement in the metric's direction."""
    return diff < 0 if lower_is_better(name) else diff > 0


def fmt(name: str, value: Any, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    d = info(name).decimals
    return f"{float(value):+.{d}f}" if signed else f"{float(value):.{d}f}"


def fmt_unit(name: str, value: Any, signed: bool = False, seconds: bool | None = None) -> str:
    """`fmt` with the metric's unit where it has one worth printing: latency in ms, or in s from
    1000 ms (`seconds` forces one scale, e.g. for a difference and its CI together). A no-break
    space keeps number and unit on one line."""
    if name != LATENCY or value is None or (isinstance(value, float) and math.isnan(value)):
        return fmt(name, value, signed)
    v = float(value)
    if seconds if seconds is not None else abs(v) >= 1000:
        return (f"{v / 1000:+.2f}" if signed else f"{v / 1000:.2f}") + "\u00a0s"
    return f"{fmt(name, v, signed)}\u00a0ms"
