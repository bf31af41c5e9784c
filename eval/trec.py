"""TREC run and qrels files, so that a run's ranking can be scored with the usual tools
(trec_eval, pytrec_eval, ir_measures, ranx).

Both are at document level, as BEIR's and TREC's qrels are: a question's top-k chunks become its
documents in the order of their first chunk (max-pooling the chunk scores, since chunks come
best first). The score column is (number of documents - rank + 1): tools sort by score and break
ties by document id, and a strictly falling score makes them see exactly the pipeline's order
(fused and reranked scores tie often). The chunk scores themselves are in per_question.jsonl.

With document-level labels (BEIR qrels, `source`), trec_eval's ndcg_cut.k / recall.k / map_cut.k
on run.trec and qrels.trec give this run's ndcg_at_k / recall_at_k_label / map_at_k exactly.
Span labels cannot be written as qrels; qrels.trec then holds their documents (top grade), and
the tools give the document-level version of the label metrics.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rag.types import QAItem, RagError, Relevance


def _check_id(value: str, what: str) -> str:
    if not value or any(ch.isspace() for ch in value):
        raise RagError(f"{what} {value!r} cannot be written to a TREC file (empty or contains whitespace)")
    return value


def ranked_documents(retrieved: Sequence[dict[str, Any]]) -> list[str]:
    """Document ids in the order of their first retrieved chunk."""
    seen: dict[str, None] = {}
    for r in sorted(retrieved, key=lambda r: r["rank"]):
        seen.setdefault(r["doc_id"], None)
    return list(seen)


def format_run(records: Sequence[dict[str, Any]], tag: str) -> str:
    """`qid Q0 docid rank score tag` lines, from per-question records (eval.scoring.score)."""
    tag = _check_id(str(tag), "run tag")
    lines = []
    for rec in records:
        qid = _check_id(str(rec["id"]), "question id")
        docs = ranked_documents(rec["retrieved"])
        for rank, doc in enumerate(docs, start=1):
            lines.append(f"{qid} Q0 {_check_id(doc, 'document id')} {rank} {len(docs) - rank + 1} {tag}")
    return "".join(line + "\n" for line in lines)


def format_qrels(qa: Sequence[QAItem], labels: Sequence[Sequence[Relevance]] | None = None) -> str:
    """`qid 0 docid grade` lines: each labelled document with its top grade (`labels`: each
    question's labels in place of its own, eval.relevance=llm's)."""
    lines = []
    for q, item in enumerate(qa):
        grades: dict[str, int] = {}
        for r in (item.labels if labels is None else labels[q]):
            grades[r.doc] = max(grades.get(r.doc, 0), int(r.grade))
        for doc, grade in grades.items():
            lines.append(f"{_check_id(item.id, 'question id')} 0 {_check_id(doc, 'document id')} {grade}")
    return "".join(line + "\n" for line in lines)
