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
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from eval.labels import LABEL_METRICS, label_metrics
from eval.record import QuestionRecord
from eval.relevance import SOURCE, document_labels
from eval.scoring import ScoreSettings, aggregate
from eval.trec import format_qrels
from rag import strict_json
from rag.atomic import atomic_write_text
from rag.cli import run_cli
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
    lines = (run_dir / "per_question.jsonl").read_text(encoding="utf-8").splitlines()
    return JudgedRun(run_dir, metrics, [QuestionRecord.from_json(json.loads(line)) for line in lines if line.strip()])


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


def pool_runs(run_dirs: Sequence[Path]) -> int:
    """Pools the LLM labels of the finished eval.relevance=llm runs among `run_dirs` and scores
    each of them again (see the module docstring). Returns how many runs were pooled (0 or 1:
    nothing to pool). Runs whose judge, prompt or question set differ are not pooled: one line says so."""
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

    for run in runs:
        rescore(run, labels, stats)
        if (run.path / "report.html").exists():  # the run's own page, written before pooling
            write_run_report(run.path)
    log.info("eval.relevance=llm: labels pooled over %d runs (%d pairs, %d unjudged)", len(runs), pairs, unjudged)
    return len(runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.pooling",
                                     description="Pool the LLM relevance labels of eval.relevance=llm runs and rescore them.")
    parser.add_argument("dirs", nargs="+", help="run or sweep directories")
    args = parser.parse_args(argv)
    from experiments.aggregate import find_run_dirs

    try:
        n = pool_runs(find_run_dirs(args.dirs))
    except (FileNotFoundError, RagError) as e:
        print(f"ragrig: error: {e}", file=sys.stderr)
        return 2
    print(f"pooled {n} runs" if n else "nothing to pool (fewer than two eval.relevance=llm runs that agree)")
    return 0


if __name__ == "__main__":
    run_cli(main)
