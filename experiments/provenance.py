"""Where the questions and relevance labels of a set of runs came from, as the reports say it:
summary.md's "Questions and labels", the lines under report.html's title, and the verdict's
sentence (experiments.verdict.provenance_words). Each run's own words are rag.run.provenance's, from
its metrics.json `provenance`.

Generated questions and LLM labels are never mixed silently with human ones: when the runs differ,
each distinct account is listed with the runs it holds for. Runs whose questions were all written
by people and whose labels came from the question file (and runs from before the key) say nothing,
so their reports read as they always have.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rag.run.provenance import marked, provenance_lines

if TYPE_CHECKING:
    from experiments.aggregate import RunRecord

DIFFER = "The runs differ in where their questions or relevance labels came from:"
DEFAULT = "Questions: human-written. Relevance labels: from the question file."
NOT_RECORDED = "Questions and labels: not recorded (a run from before they were)."


@dataclass(frozen=True)
class RunsProvenance:
    """`lines`: what holds for every run (empty when there is nothing to say or the runs differ);
    `groups`: when the runs differ, each account in words with the runs it holds for."""

    lines: list[str] = field(default_factory=list)
    groups: list[tuple[str, list[str]]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.lines or self.groups)

    def view(self) -> dict[str, Any] | None:
        """summary.md's section (None: no section)."""
        if not self:
            return None
        return {"lines": self.lines, "differ": DIFFER,
                "runs": [{"label": ", ".join(runs), "text": text} for text, runs in self.groups]}

    def page_lines(self) -> list[str]:
        """report.html's lines under its title."""
        if self.groups:
            return [DIFFER] + [f"{', '.join(runs)}: {text}" for text, runs in self.groups]
        return list(self.lines)


def of_runs(records: Sequence[RunRecord], labels: Sequence[str]) -> RunsProvenance:
    """The successful runs' provenance (`labels`: the runs' labels, in `records` order)."""
    runs = [(lab, rec.result.provenance) for rec, lab in zip(records, labels) if rec.ok and rec.result is not None]
    if not any(marked(p) for _, p in runs):
        return RunsProvenance()
    accounts: dict[str, list[str]] = {}
    for lab, p in runs:
        text = " ".join(provenance_lines(p)) or (NOT_RECORDED if p is None else DEFAULT)
        accounts.setdefault(text, []).append(lab)
    if len(accounts) == 1:
        return RunsProvenance(lines=provenance_lines(runs[0][1]))
    return RunsProvenance(groups=list(accounts.items()))


def provenances(records: Sequence[RunRecord]) -> list[dict[str, Any] | None]:
    """The successful runs' metrics.json `provenance` (None: a run from before it was recorded)."""
    return [rec.result.provenance for rec in records if rec.ok and rec.result is not None]
