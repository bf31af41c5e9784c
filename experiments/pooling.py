"""Pooling LLM relevance labels over the runs of a sweep (eval.relevance=llm, eval/relevance.py).

Each run grades its own top-k chunks (each (question, chunk) pair once for the whole sweep, through
the artifact cache) and is first scored against the labels of its own pool only: a run that finds
little would then be measured against little. Once every run has finished, `pool_runs` gives
every question the labels of all runs' judged chunks together, as TREC pools the runs of its
participants, and scores every run's label metrics again against them: per_question.jsonl,
qrels.trec and metrics.json (its label metrics, their CIs and `provenance.labels`, which then
says how many runs were pooled). Nothing is asked: the grades are in each run's per_question.jsonl
(`judge_grade` of each retrieved chunk), so pooling again gives the same files.

The sweep's end (experiments.callbacks) calls it; `python -m experiments.pooling DIR...` pools
runs made separately (the same question set and judge).

Each pooled run is marked "pooling pending" (rag.run.rundir.mark_pooling, written atomically) before
the first of them is rewritten, and the marks are cleared only once all are: a pooling stopped
half-way (Ctrl-C, SIGKILL) leaves runs whose per_question.jsonl and metrics.json may disagree,
which compare and the gate then refuse, naming the one command that finishes them (pooling again
gives every run the same files).
"""
from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from eval.labels import LABEL_METRICS, label_metrics
from eval.record import QuestionRecord, read_lines
from eval.relevance import SOURCE, document_labels
from eval.scoring import ScoreSettings, aggregate
from eval.trec import format_qrels
from rag.store import strict_json
from rag.store.atomic import atomic_write_text
from rag.config.cli import run_cli
from rag.run.rundir import POOLING_PENDING, Unfinished, clear_pooling, mark_pooling
from rag.types import Chunk, QAItem, RagError, Relevance

log = logging.getLogger(__name__)


@dataclass
class JudgedRun:
    path: Path
    metrics: dict[str, Any]
    records: list[QuestionRecord]

    @property
    def labels_from(self) -> dict[str, Any]:
        return dict((self.metrics.get("provenance") or {}).get("labels") or {})

    def judge(self) -> tuple[Any, ...]:
        """What must agree between pooled runs: the judge, its prompt and its cut."""
        lf = self.labels_from
        return lf.get("judge"), lf.get("prompt"), lf.get("relevant_from")


def read_judged(run_dir: Path) -> JudgedRun | None:
    """A finished run scored with eval.relevance=llm, or None."""
    metrics_file = run_dir / "metrics.json"
    if not metrics_file.exists():
        return None
    metrics = json.loads(metrics_file.read_text(encoding="utf-8"))
    if ((metrics.get("provenance") or {}).get("labels") or {}).get("source") != SOURCE:
        return None
    try:
        rows = read_lines(run_dir / "per_question.jsonl")
    except RagError as e:
        raise RagError(f"{run_dir}: {e}") from None
    return JudgedRun(run_dir, metrics, [QuestionRecord.from_json(row) for row in rows])


def pooled_labels(runs: Sequence[JudgedRun], relevant_from: int) -> tuple[dict[str, tuple[Relevance, ...]], int, int]:
    """Per question id, the labels of every run's judged chunks; the pooled pairs and those unjudged."""
    pairs: dict[tuple[str, str], tuple[str, int | None]] = {}  # (question id, chunk text) -> (document, grade)
    for run in runs:
        for rec in run.records:
            for hit in rec.retrieved:
                pairs.setdefault((rec.id, hit.text), (hit.doc_id, hit.extra.get("judge_grade")))
    by_question: dict[str, list[tuple[str, int | None]]] = {}
    for (qid, _), judged in pairs.items():
        by_question.setdefault(qid, []).append(judged)
    unjudged = sum(1 for _, grade in pairs.values() if grade is None)
    return ({qid: document_labels(judged, relevant_from) for qid, judged in by_question.items()},
            len(pairs), unjudged)


def rescore(run: JudgedRun, labels: dict[str, tuple[Relevance, ...]], stats: dict[str, Any]) -> None:
    """`run`'s label metrics against the pooled labels, written back whole (per_question.jsonl,
    qrels.trec, then metrics.json)."""
    config = run.metrics.get("config") or {}
    ev = config.get("eval") or {}
    k = int(ev.get("k", 5))
    reported = [m for m in LABEL_METRICS if m in (ev.get("metrics") or LABEL_METRICS)]
    items = [QAItem(r.id, r.question or "", r.ground_truth, r.source, r.corpus) for r in run.records]
    own = [labels.get(r.id, ()) for r in run.records]
    ranked = [[Chunk(h.chunk_id, h.doc_id, h.text, "", 0, 0, 0) for h in r.retrieved] for r in run.records]
    values, grades = label_metrics(items, ranked, k, own)
    for q, rec in enumerate(run.records):
        rec.labels = list(own[q])
        chunk_grades = grades[q]
        rec.retrieved = [replace(h, grade=None if chunk_grades is None else chunk_grades[j],
                                 relevant_label=None if chunk_grades is None else chunk_grades[j] > 0)
                         for j, h in enumerate(rec.retrieved)]
        for m in reported:
            v = float(values[m][q])
            rec.metrics[m] = None if v != v else v
    boot = ev.get("bootstrap") or {}
    settings = ScoreSettings(k=k, bootstrap_resamples=int(boot.get("resamples", 1000)), bootstrap_seed=int(boot.get("seed", 0)))
    fresh = aggregate(run.records, reported, settings)
    doc = run.metrics
    for m in reported:
        _replace(doc["metrics"], m, fresh["overall"].get(m))
        for corpus, ms in (doc.get("by_corpus") or {}).items():
            _replace(ms, m, (fresh["by_corpus"].get(corpus) or {}).get(m))
    objective = doc.get("objective") or {}
    if objective.get("name") in reported and objective.get("name") in doc["metrics"]:
        objective["value"] = doc["metrics"][objective["name"]]["mean"]
    # the pool's counts replace the run's own; what this run asked for is no longer its account
    doc.setdefault("provenance", {})["labels"] = {**{k: v for k, v in run.labels_from.items() if k != "asked"}, **stats}
    atomic_write_text(run.path / "per_question.jsonl",
                      "".join(strict_json.dumps(r.to_json(), ensure_ascii=False) + "\n" for r in run.records))
    if (run.path / "qrels.trec").exists():
        atomic_write_text(run.path / "qrels.trec", format_qrels(items, own))
    atomic_write_text(run.path / "metrics.json", strict_json.dumps(doc, indent=2, default=str))


def _replace(table: dict[str, Any], metric: str, summary: dict[str, Any] | None) -> None:
    if summary is None:
        table.pop(metric, None)
    else:
        table[metric] = summary


def finish_command(dirs: Sequence[Path | str]) -> str:
    """The command that pools `dirs` again (and so finishes a pooling of them that was stopped)."""
    return "python -m experiments.pooling " + " ".join(shlex.quote(str(d)) for d in dirs)


def pool_runs(run_dirs: Sequence[Path], command: str | None = None) -> int:
    """Pools the LLM labels of the finished eval.relevance=llm runs among `run_dirs` and scores
    each of them again (see the module docstring). Returns how many runs were pooled (0 or 1:
    nothing to pool). Runs whose judge, prompt or question set differ are not pooled: one line says so.
    `command` finishes a pooling that is stopped (default: pooling `run_dirs` again); a Ctrl-C
    while runs are rewritten is rag.run.rundir.Unfinished, which names it."""
    runs = [r for r in (read_judged(Path(d)) for d in run_dirs) if r is not None]
    if len(runs) < 2:
        return 0
    judges = {r.judge() for r in runs}
    questions = {tuple((rec.id, rec.question) for rec in r.records) for r in runs}
    if len(judges) > 1 or len(questions) > 1:
        what = "judges or prompts" if len(judges) > 1 else "question sets"
        log.warning("eval.relevance=llm: the runs have different %s, so their LLM labels were not pooled; "
                    "each run is scored on its own judged chunks only", what)
        return 0
    relevant_from = int(runs[0].labels_from.get("relevant_from") or 2)
    labels, pairs, unjudged = pooled_labels(runs, relevant_from)
    stats = {"pooled_runs": len(runs), "pairs": pairs, "unjudged": unjudged}
    from experiments.html_report import write_run_report

    pooled = [run.path for run in runs]
    command = command or finish_command(run_dirs)
    try:
        mark_pooling(pooled, command)
        for run in runs:
            rescore(run, labels, stats)
            if (run.path / "report.html").exists():  # the run's own page, written before pooling
                write_run_report(run.path)
        clear_pooling(pooled)  # last: every pooled run is whole
    except KeyboardInterrupt:
        raise Unfinished(f"{len(pooled)} runs are marked pooling pending ({POOLING_PENDING}); their "
                         f"per_question.jsonl and metrics.json may disagree until: {command}") from None
    log.info("eval.relevance=llm: labels pooled over %d runs (%d pairs, %d unjudged)", len(runs), pairs, unjudged)
    return len(runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.pooling",
                                     description="Pool the LLM relevance labels of eval.relevance=llm runs and rescore them.")
    parser.add_argument("dirs", nargs="+", help="run or sweep directories")
    args = parser.parse_args(argv)
    from experiments.aggregate import find_run_dirs

    try:
        n = pool_runs(find_run_dirs(args.dirs), finish_command(args.dirs))
    except (FileNotFoundError, RagError) as e:
        print(f"ragrig: error: {e}", file=sys.stderr)
        return 2
    except Unfinished as e:
        print(f"ragrig: interrupted; {e.left}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("ragrig: interrupted; no run was rewritten", file=sys.stderr)
        return 130
    print(f"pooled {n} runs" if n else "nothing to pool (fewer than two eval.relevance=llm runs that agree)")
    return 0


if __name__ == "__main__":
    run_cli(main)
