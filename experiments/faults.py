"""Why a question went wrong, from the per-question metrics every run already has, and which
questions a variant fixes or breaks against the baseline.

A question's class, first match wins (k the run's eval.k, tau its eval.tau_h):

- retrieval_miss: no chunk of the question's source document in the top k (`hit_at_k_id` = 0);
- ranking: the source document is retrieved but not first (`mrr_id` < 1), and either the run
  gave no answer to score or the answer is far from the truth (`answer_gt` < tau);
- generation_miss: the source document is first, and the answer is far from the truth;
- ungrounded: the answer is close to the truth but not to the retrieved contexts
  (`grounding` < tau: it came from somewhere else);
- correct: everything else (the source first and, where answered, an answer close to the truth
  and to the contexts).

Two runs are compared on the questions both classify, on a common basis: a question one of them
did not answer is classed from its retrieval alone in both. A question is *fixed* when the
baseline's class is a fault and the run's is correct, *broken* the other way round; it is counted
under the fault it had (fixed) or got (broken).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from experiments.aggregate import RunRecord

CLASSES = ("retrieval_miss", "ranking", "generation_miss", "ungrounded", "correct")
FAULTS = CLASSES[:-1]
WORDS = {"retrieval_miss": "retrieval miss", "ranking": "ranking", "generation_miss": "generation miss",
         "ungrounded": "ungrounded answer", "correct": "correct"}
DEFAULT_TAU = 0.5


def _num(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def classify(row: Mapping[str, Any], tau: float = DEFAULT_TAU, answers: bool = True) -> str | None:
    """The question's class, or None when the run has no source id to judge retrieval by.
    answers=False classes the question from its retrieval alone."""
    hit, first = _num(row.get("hit_at_k_id")), _num(row.get("mrr_id"))
    if hit is None:
        return None
    if hit <= 0:
        return "retrieval_miss"
    answer_gt = _num(row.get("answer_gt")) if answers else None
    on_top = first is not None and first >= 1.0
    if answer_gt is None:
        return "correct" if on_top else "ranking"
    if answer_gt < tau:
        return "generation_miss" if on_top else "ranking"
    grounding = _num(row.get("grounding"))
    if grounding is not None and grounding < tau:
        return "ungrounded"
    return "correct"


def tau_of(rec: RunRecord) -> float:
    value = ((rec.config or {}).get("eval") or {}).get("tau_h")
    return float(value) if isinstance(value, (int, float)) else DEFAULT_TAU


def run_classes(rec: RunRecord) -> dict[str, str]:
    """Question id -> class, for the questions the run can classify."""
    tau = tau_of(rec)
    out = {}
    for row in rec.per_question():
        c = classify(row, tau)
        if "id" in row and c is not None:
            out[str(row["id"])] = c
    return out


def counts(rec: RunRecord) -> dict[str, int]:
    found = Counter(run_classes(rec).values())
    return {c: found.get(c, 0) for c in CLASSES}


def transitions(base: RunRecord, other: RunRecord) -> dict[str, Any]:
    """Questions fixed and broken by `other` against `base`: per fault class, and the ids."""
    rows_b = {str(r["id"]): r for r in base.per_question() if "id" in r}
    rows_o = {str(r["id"]): r for r in other.per_question() if "id" in r}
    tau_b, tau_o = tau_of(base), tau_of(other)
    fixed: Counter[str] = Counter()
    broken: Counter[str] = Counter()
    ids: dict[str, list[str]] = {"fixed": [], "broken": []}
    shared = 0
    for q in sorted(rows_b.keys() & rows_o.keys()):
        answered = _num(rows_b[q].get("answer_gt")) is not None and _num(rows_o[q].get("answer_gt")) is not None
        a, b = classify(rows_b[q], tau_b, answered), classify(rows_o[q], tau_o, answered)
        if a is None or b is None:
            continue
        shared += 1
        if a != "correct" and b == "correct":
            fixed[a] += 1
            ids["fixed"].append(q)
        elif a == "correct" and b != "correct":
            broken[b] += 1
            ids["broken"].append(q)
    return {"shared": shared, "fixed": dict(fixed), "broken": dict(broken), "ids": ids}


def _by_class(c: Mapping[str, int]) -> str:
    parts = [f"{n} {WORDS[k]}" for k, n in sorted(c.items(), key=lambda kv: (-kv[1], FAULTS.index(kv[0]))) if n]
    return ", ".join(parts)


def fixed_words(t: Mapping[str, Any]) -> str:
    n = sum(t["fixed"].values())
    return f"{n} question{'s' * (n != 1)}" + (f" ({_by_class(t['fixed'])})" if n else "")


def broken_words(t: Mapping[str, Any]) -> str:
    n = sum(t["broken"].values())
    return f"{n}" + (f" ({_by_class(t['broken'])})" if n else "")


def sentence(label: str, t: Mapping[str, Any]) -> str:
    """e.g. "v3 fixes 14 questions (9 ranking, 5 retrieval miss) and breaks 3 (3 ranking)"."""
    return f"{label} fixes {fixed_words(t)} and breaks {broken_words(t)}"
