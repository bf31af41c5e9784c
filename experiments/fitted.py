"""The parts of a set of runs that were fitted on corpora other than the runs', as the reports say
it: the verdict's first sentence, summary.md's "Fitted on other corpora" and the lines under
report.html's title. Each run's record is its metrics.json `fitted` (rag/run/fitted.py, which also
writes the words).

A part fitted elsewhere in several runs is said once, naming their versions ("the reranker of v3
and v4 learnt from ..."), with the one command that checks it on this corpus: the ablation sweep of
the run with the most parts fitted elsewhere. Runs whose parts were all fitted on their own corpus
(the demo's) say nothing, so their reports read as they always have.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rag.run.fitted import CHECK, PARTS, flagged_parts, part_words, sentence, who

if TYPE_CHECKING:
    from experiments.aggregate import RunRecord

WHO = "\0"  # stands for the part's name while runs are grouped by what is said of it


@dataclass(frozen=True)
class RunsFitted:
    """`clauses`: each part fitted elsewhere in words, naming the runs' versions; `command`: the
    ablation sweep that checks them on this corpus."""

    clauses: tuple[str, ...] = ()
    command: str | None = None

    def __bool__(self) -> bool:
        return bool(self.clauses)

    def words(self) -> str:
        """The verdict's first sentence (empty when there is nothing to say)."""
        return sentence(self.clauses, self.command) if self else ""

    def view(self) -> dict[str, Any] | None:
        """summary.md's section (None: no section)."""
        return {"sentence": sentence(self.clauses), "command": self.command} if self else None

    def lines(self) -> list[str]:
        """report.html's lines under its title."""
        if not self:
            return []
        return [sentence(self.clauses)] + ([CHECK.format(command=self.command)] if self.command else [])


def of_runs(records: Sequence[RunRecord]) -> RunsFitted:
    """The successful runs' parts fitted elsewhere."""
    said: dict[tuple[str, str], list[str]] = {}  # (part, words with WHO) -> the runs' versions
    command, most = None, 0
    for rec in records:
        if not rec.ok or rec.result is None:
            continue
        fitted: dict[str, Any] | None = rec.result.fitted
        parts = flagged_parts(fitted)
        for part, entry in parts.items():
            said.setdefault((part, part_words(part, entry, WHO)), []).append(rec.variant)
        if len(parts) > most and (fitted or {}).get("check"):
            command, most = str((fitted or {})["check"]), len(parts)
    ordered = sorted(said.items(), key=lambda item: PARTS.index(item[0][0]))
    clauses = tuple(text.replace(WHO, who(part, variants)) for (part, text), variants in ordered)
    return RunsFitted(clauses, command)
