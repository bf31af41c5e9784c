"""Where a run's questions and relevance labels came from.

A question file written by `python -m rag.testset` gives each question a `provenance` object (its
kind, the passages it was written from as document spans, the generator's id, prompt digests and
filter scores); `qa=jsonl` keeps it on the QAItem, and scoring copies it into the question's record.
Here the run adds what the reports need of it: each passage's text, cut from the run's documents
(the question file holds only the span), in per_question.jsonl; and metrics.json's `provenance`,
how many questions were written by people and how many generated, and by what, beside where the
relevance labels came from. `provenance_lines` says it in words, for a run's table on the terminal
and for every report (experiments.provenance), wherever results are shown.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from eval.record import QuestionRecord
from rag.types import Document, QAItem

# metrics.json `provenance.labels` when the labels are the question file's (`relevant`, or `doc_id`)
QA_LABELS: dict[str, Any] = {"source": "qa"}
TEMPLATES = "templates"
TESTSET = "python -m rag.testset"


def generator_name(generator: Any) -> str:
    """A short readable name of a generator's id: its model's last path part
    ("HuggingFaceTB/SmolLM2-135M-Instruct" -> "SmolLM2-135M-Instruct"), else its class; "templates"
    for questions made from templates."""
    if not isinstance(generator, Mapping):
        return str(generator) if generator else "unknown"
    if generator.get("class") == TEMPLATES:
        return TEMPLATES
    for key in ("model", "model_name"):
        v = generator.get(key)
        if isinstance(v, str) and v.strip("/"):
            return v.strip("/").rsplit("/", 1)[-1]
    for key in ("_target_", "class"):
        v = generator.get(key)
        if isinstance(v, str) and v:
            return v.rsplit(".", 1)[-1]
    return "unknown"


def question_counts(qa: Sequence[QAItem]) -> dict[str, Any]:
    """metrics.json `provenance.questions`: questions written by people (no provenance) and
    generated ones, and the generators' names in order of first appearance."""
    generated = [q.provenance for q in qa if q.provenance is not None]
    names = dict.fromkeys(generator_name(p.get("generator")) for p in generated)
    return {"human": len(qa) - len(generated), "generated": len(generated), "generators": list(names)}


def run_provenance(qa: Sequence[QAItem], labels: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """metrics.json `provenance`: the questions' counts, and `labels` (default: the question
    file's)."""
    return {"questions": question_counts(qa), "labels": dict(labels if labels is not None else QA_LABELS)}


def add_passage_texts(records: Sequence[QuestionRecord], docs: Sequence[Document]) -> None:
    """Each generated question's passages with their `text` (the document's text over the
    passage's span), for the reports. The record gets new dicts: the QAItem's provenance, shared
    with the process's other runs, is left as read. A passage whose document is not among the
    run's (sliced away) or whose span does not fit it keeps no text."""
    texts: dict[str, str] | None = None
    for rec in records:
        prov = rec.provenance
        if not prov or not isinstance(prov.get("passages"), list):
            continue
        if texts is None:
            texts = {d.id: d.text for d in docs}
        rec.provenance = {**prov, "passages": [_with_text(p, texts) for p in prov["passages"]]}


def _with_text(passage: Any, texts: Mapping[str, str]) -> Any:
    if not isinstance(passage, Mapping):
        return passage
    text = texts.get(str(passage.get("doc_id")))
    start, end = _offset(passage.get("start")), _offset(passage.get("end"))
    if text is None or start is None or end is None or not 0 <= start < end <= len(text):
        return dict(passage)
    return {**passage, "text": text[start:end]}


def _offset(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


# -- in words -------------------------------------------------------------------------------------


def marked(provenance: Mapping[str, Any] | None) -> bool:
    """Whether a run's questions or labels are other than the default: some generated questions,
    or labels not from the question file. (None: a run from before it was recorded.)"""
    if not provenance:
        return False
    return bool(generated(provenance)) or labels_source(provenance) != QA_LABELS["source"]


def generated(provenance: Mapping[str, Any] | None) -> int:
    return int(((provenance or {}).get("questions") or {}).get("generated") or 0)


def human(provenance: Mapping[str, Any] | None) -> int:
    return int(((provenance or {}).get("questions") or {}).get("human") or 0)


def labels_source(provenance: Mapping[str, Any] | None) -> str:
    return str(((provenance or {}).get("labels") or QA_LABELS).get("source", QA_LABELS["source"]))


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def question_line(provenance: Mapping[str, Any]) -> str:
    """The questions in words: `Questions: 20 generated by SmolLM2-135M-Instruct (python -m
    rag.testset), not human-written.`, or `Questions: 40 human-written, 20 generated by ...`, or
    `Questions: 40 human-written.`"""
    n_human, n_gen = human(provenance), generated(provenance)
    if not n_gen:
        return f"Questions: {n_human} human-written."
    names = [str(n) for n in (provenance.get("questions") or {}).get("generators") or []] or ["unknown"]
    by = "from templates" if names == [TEMPLATES] else f"by {_and(names)}"
    made = f"{n_gen} generated {by} ({TESTSET})"
    return f"Questions: {made}, not human-written." if not n_human else f"Questions: {n_human} human-written, {made}."


def labels_line(provenance: Mapping[str, Any]) -> str:
    """The labels in words: `Relevance labels: graded 0-3 by an LLM judge (<judge>, pooled over 4
    runs; 3 of 200 pairs unjudged).` or `Relevance labels: from the question file.`"""
    labels = provenance.get("labels") or QA_LABELS
    if labels.get("source") == QA_LABELS["source"]:
        return "Relevance labels: from the question file."
    if labels.get("source") != "llm":
        return f"Relevance labels: {labels.get('source')}."
    runs = int(labels.get("pooled_runs") or 0)
    pooled = f"pooled over {runs} runs" if runs > 1 else "from this run's own retrieved chunks"
    unjudged = f"{labels.get('unjudged', 0)} of {labels.get('pairs', 0)} pairs unjudged"
    return f"Relevance labels: graded 0-3 by an LLM judge ({labels.get('judge', 'unknown')}, {pooled}; {unjudged})."


def provenance_lines(provenance: Mapping[str, Any] | None) -> list[str]:
    """Where a run's questions and labels came from, in words; none when both are the default
    (questions written by people, labels from the question file), so such a run's outputs read as
    they always have."""
    if provenance is None or not marked(provenance):
        return []
    return [question_line(provenance), labels_line(provenance)]
