"""How far generated questions and LLM relevance labels can stand in for human ones, measured the
way the literature validates a synthetic test collection: do they order the configurations as
the human ones do (Kendall's tau), do the verdict's significant differences hold, and does the
judge agree with the human labels (Cohen's kappa, the confusion table).

    python -m experiments.validation questions HUMAN_SWEEP GENERATED_SWEEP   # the same configurations, two question sets
    python -m experiments.validation labels LABELS_SWEEP LLM_SWEEP           # the same runs, labels vs eval.relevance=llm
    python -m experiments.validation study [--served URL --model M]          # all of it on the shipped corpus

Each prints a markdown report and, with --out, writes it with a JSON twin. The sweeps are read from
the files their summary wrote (summary.csv, comparison.csv, each job's per_question.jsonl).
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from scipy.stats import kendalltau

from eval.record import read_lines
from eval.relevance import SOURCE as LLM_SOURCE
from rag.store.atomic import atomic_write_text
from rag.config.cli import run_cli
from rag.types import RagError

# The retrieval metrics both kinds of question set have (a generated question has an answer and a
# source document, so the similarity metrics and the metrics by source id both apply).
METRICS = ("recall_at_k", "mrr", "precision_at_k", "hit_at_k_id", "mrr_id", "ndcg_at_k", "recall_at_k_label", "map_at_k")


def _sweep_files(sweep: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    for name in ("summary.csv", "comparison.csv"):
        if not (sweep / name).exists():
            raise RagError(f"{sweep}: no {name} (is it a finished sweep's directory?)")
    summary = pd.read_csv(sweep / "summary.csv")
    return summary[summary["status"] == "ok"], pd.read_csv(sweep / "comparison.csv")


@dataclass
class Ordering:
    metric: str
    configurations: int
    tau: float | None  # Kendall's tau-b of the two orderings by the metric's mean; None: undefined
    p_value: float | None
    human: dict[str, float] = field(default_factory=dict)
    generated: dict[str, float] = field(default_factory=dict)


@dataclass
class Difference:
    label: str
    metric: str
    human_diff: float
    generated_diff: float | None
    outcome: str  # held | same direction, not significant | reversed | not measured


def orderings(human: pd.DataFrame, generated: pd.DataFrame, metrics: Sequence[str]) -> list[Ordering]:
    """Per metric, Kendall's tau between the configurations' means on the two question sets."""
    out = []
    shared = [lab for lab in human["label"] if lab in set(generated["label"])]
    for m in metrics:
        if m not in human or m not in generated:
            continue
        h = human.set_index("label").loc[shared, m].astype(float)
        g = generated.set_index("label").loc[shared, m].astype(float)
        ok = h.notna() & g.notna()
        tau, p = (kendalltau(h[ok], g[ok]) if ok.sum() >= 2 else (math.nan, math.nan))
        out.append(Ordering(m, int(ok.sum()), None if math.isnan(tau) else float(tau),
                            None if math.isnan(p) else float(p), h[ok].round(4).to_dict(), g[ok].round(4).to_dict()))
    return out


def differences(human: pd.DataFrame, generated: pd.DataFrame, metrics: Sequence[str]) -> list[Difference]:
    """The verdict's significant differences on human questions, and what became of each on the
    generated ones."""
    gen = {(r.label, r.metric): r for r in generated.itertuples()}
    out = []
    for r in human.itertuples():
        if r.metric not in metrics or not bool(r.significant):
            continue
        g = gen.get((r.label, r.metric))
        if g is None or pd.isna(g.diff):
            out.append(Difference(str(r.label), str(r.metric), float(r.diff), None, "not measured"))
            continue
        same = math.copysign(1, float(g.diff)) == math.copysign(1, float(r.diff)) and float(g.diff) != 0
        outcome = ("held" if same and bool(g.significant) else "same direction, not significant" if same else "reversed")
        out.append(Difference(str(r.label), str(r.metric), float(r.diff), float(g.diff), outcome))
    return out


def new_differences(human: pd.DataFrame, generated: pd.DataFrame, metrics: Sequence[str]) -> list[tuple[str, str, float]]:
    """Significant on generated questions only."""
    sig = {(r.label, r.metric) for r in human.itertuples() if bool(r.significant)}
    return [(str(r.label), str(r.metric), float(r.diff)) for r in generated.itertuples()
            if r.metric in metrics and bool(r.significant) and (r.label, r.metric) not in sig]


def cohen_kappa(a: Sequence[int], b: Sequence[int]) -> float | None:
    """Cohen's kappa of two raters' labels of the same items; None when chance agreement is total."""
    n = len(a)
    if n == 0:
        return None
    observed = sum(x == y for x, y in zip(a, b)) / n
    ca, cb = Counter(a), Counter(b)
    expected = sum(ca[k] * cb[k] for k in set(ca) | set(cb)) / (n * n)
    return None if expected == 1 else (observed - expected) / (1 - expected)


@dataclass
class Agreement:
    pairs: int  # distinct (question, chunk) pairs with a human label
    unjudged: int  # of those, the judge gave no grade
    kappa: float | None  # binary: human grade > 0 against judge grade >= relevant_from
    agreement: float | None
    relevant_from: int
    confusion: dict[str, dict[str, int]]  # human grade -> judge grade (or "unjudged") -> pairs
    human_relevant: int
    judge_relevant: int


def _job_dirs(sweep: Path, summary: pd.DataFrame) -> dict[str, Path]:
    return {str(r.label): sweep / str(int(r.job)) for r in summary.itertuples()}


def _rows(run: Path) -> list[dict[str, Any]]:
    try:
        return read_lines(run / "per_question.jsonl")
    except RagError as e:
        raise RagError(f"{run}: {e}") from None


def _two_sweeps(first: Path, second: Path, what: str) -> None:
    """Refuses one sweep given twice: it agrees with itself perfectly (tau 1, kappa 1), which
    says nothing of the questions or the labels."""
    if first.resolve() == second.resolve():
        raise RagError(f"{what}: {first} is given twice; compare two sweeps ({first} against itself agrees by "
                       "construction)")


def _labels_source(sweep: Path, dirs: dict[str, Path]) -> dict[str, str]:
    """Each job's label source (metrics.json `provenance.labels.source`: qa, the question set's
    labels, or llm, eval.relevance=llm's judge), by the job's label."""
    out = {}
    for label, run in dirs.items():
        try:
            metrics = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise RagError(f"{run}: unreadable metrics.json ({getattr(e, 'strerror', None) or e})") from None
        out[label] = str(((metrics.get("provenance") or {}).get("labels") or {}).get("source") or "qa")
    return out


def _check_sources(labels_sweep: Path, human: dict[str, str], llm_sweep: Path, llm: dict[str, str]) -> None:
    """The first sweep's labels must be the question set's (a person's), the second's the judge's:
    LLM labels on both sides would agree with themselves."""
    judged = sorted(label for label, source in human.items() if source == LLM_SOURCE)
    if judged:
        raise RagError(f"{labels_sweep}: its labels came from an LLM judge (job {judged[0]}: provenance.labels.source="
                       f"{LLM_SOURCE}); the first sweep must be scored with the question set's labels "
                       "(eval.relevance=labels)")
    unjudged = sorted(label for label, source in llm.items() if source != LLM_SOURCE)
    if unjudged:
        raise RagError(f"{llm_sweep}: job {unjudged[0]} was not scored by an LLM judge (provenance.labels.source="
                       f"{llm[unjudged[0]]}); the second sweep must be run with eval.relevance=llm")


def agreement(labels_sweep: Path, llm_sweep: Path) -> Agreement:
    """The judge's grades (an eval.relevance=llm sweep) against the human labels' grades (the same
    sweep with the question set's labels), over the distinct (question, chunk) pairs both retrieved."""
    human_summary, _ = _sweep_files(labels_sweep)
    llm_summary, _ = _sweep_files(llm_sweep)
    _two_sweeps(labels_sweep, llm_sweep, "labels")
    human_dirs, llm_dirs = _job_dirs(labels_sweep, human_summary), _job_dirs(llm_sweep, llm_summary)
    for sweep, dirs in ((labels_sweep, human_dirs), (llm_sweep, llm_dirs)):
        if not dirs:
            raise RagError(f"{sweep}: no finished job (its summary.csv lists none with status ok)")
    _check_sources(labels_sweep, _labels_source(labels_sweep, human_dirs), llm_sweep,
                   _labels_source(llm_sweep, llm_dirs))
    metrics = json.loads((next(iter(llm_dirs.values())) / "metrics.json").read_text())
    relevant_from = int(((metrics.get("provenance") or {}).get("labels") or {}).get("relevant_from") or 2)
    pairs: dict[tuple[str, str], tuple[int, int | None]] = {}
    for label, run in llm_dirs.items():
        if label not in human_dirs:
            continue
        human = {(r["id"], h["chunk_id"]): h.get("grade") for r in _rows(human_dirs[label]) for h in r["retrieved"]}
        for r in _rows(run):
            for h in r["retrieved"]:
                grade = human.get((r["id"], h["chunk_id"]))
                if grade is not None:
                    pairs.setdefault((r["id"], h["text"]), (int(grade), h.get("judge_grade")))
    confusion: dict[str, dict[str, int]] = {}
    for grade, judged in pairs.values():
        row = confusion.setdefault(str(grade), {})
        key = "unjudged" if judged is None else str(judged)
        row[key] = row.get(key, 0) + 1
    judged_pairs = [(g, j) for g, j in pairs.values() if j is not None]
    a = [int(g > 0) for g, _ in judged_pairs]
    b = [int(j >= relevant_from) for _, j in judged_pairs]
    kappa = cohen_kappa(a, b)
    return Agreement(len(pairs), len(pairs) - len(judged_pairs), kappa,
                     sum(x == y for x, y in zip(a, b)) / len(a) if a else None, relevant_from,
                     {k: dict(sorted(v.items())) for k, v in sorted(confusion.items())}, sum(a), sum(b))


def _fmt(v: float | None, digits: int = 3) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def questions_report(human_sweep: Path, generated_sweep: Path, metrics: Sequence[str] = METRICS) -> tuple[str, dict[str, Any]]:
    hs, hc = _sweep_files(human_sweep)
    gs, gc = _sweep_files(generated_sweep)
    _two_sweeps(human_sweep, generated_sweep, "questions")
    orders = orderings(hs, gs, metrics)
    diffs = differences(hc, gc, metrics)
    new = new_differences(hc, gc, metrics)
    lines = [f"Human questions: `{human_sweep}` ({int(hs['mrr_n'].max()) if 'mrr_n' in hs else '?'} questions); "
             f"generated: `{generated_sweep}` ({int(gs['mrr_n'].max()) if 'mrr_n' in gs else '?'} questions).", "",
             "| metric | configurations | Kendall's tau | p |", "|---|---|---|---|"]
    lines += [f"| {o.metric} | {o.configurations} | {_fmt(o.tau, 2)} | {_fmt(o.p_value, 3)} |" for o in orders]
    lines += ["", "Significant differences on human questions (Holm, as the verdict), on generated ones:", ""]
    if diffs:
        lines += ["| configuration | metric | human diff | generated diff | outcome |", "|---|---|---|---|---|"]
        lines += [f"| {d.label} | {d.metric} | {d.human_diff:+.3f} | "
                  f"{'–' if d.generated_diff is None else f'{d.generated_diff:+.3f}'} | {d.outcome} |" for d in diffs]
    else:
        lines.append("(none on human questions)")
    held = sum(d.outcome == "held" for d in diffs)
    lines += ["", f"Held: {held} of {len(diffs)}; significant on generated questions only: {len(new)}"
              + (" (" + "; ".join(f"{lab} {m} {d:+.3f}" for lab, m, d in new) + ")" if new else "") + "."]
    data = {"orderings": [asdict(o) for o in orders], "differences": [asdict(d) for d in diffs],
            "held": held, "significant_on_human": len(diffs), "new_on_generated": [list(x) for x in new]}
    return "\n".join(lines) + "\n", data


def labels_report(labels_sweep: Path, llm_sweep: Path) -> tuple[str, dict[str, Any]]:
    ag = agreement(labels_sweep, llm_sweep)
    grades = sorted({k for row in ag.confusion.values() for k in row}, key=lambda k: (k == "unjudged", k))
    lines = [f"{ag.pairs} distinct (question, chunk) pairs with a human label; {ag.unjudged} unjudged by the judge.",
             f"Binary agreement (human grade > 0 against judge grade >= {ag.relevant_from}): "
             f"{_fmt(ag.agreement, 3)}; Cohen's kappa {_fmt(ag.kappa, 3)}; relevant by the human labels "
             f"{ag.human_relevant}, by the judge {ag.judge_relevant} (of {ag.pairs - ag.unjudged} judged).", "",
             "| human grade \\ judge grade | " + " | ".join(grades) + " |", "|---" * (len(grades) + 1) + "|"]
    lines += [f"| {h} | " + " | ".join(str(row.get(g, 0)) for g in grades) + " |" for h, row in ag.confusion.items()]
    return "\n".join(lines) + "\n", asdict(ag)


def _write(out: Path | None, text: str, data: dict[str, Any]) -> None:
    print(text, end="")
    if out is not None:
        atomic_write_text(out.with_suffix(".md"), text)
        atomic_write_text(out.with_suffix(".json"), json.dumps(data, indent=2) + "\n")


# -- the whole study --------------------------------------------------------------------------------


def _run(args: list[str]) -> None:
    print("+ " + " ".join(args), flush=True)
    done = subprocess.run([sys.executable, *args], check=False)
    if done.returncode != 0:
        raise RagError(f"`{' '.join(args)}` exited with status {done.returncode}")


def study(out: Path, n: int, label_questions: int, served: str | None, model: str | None, grid: bool,
          extra: Sequence[str]) -> str:
    """The validation on the shipped corpus, end to end: a generated question set from the same
    documents; sweep=versions (and the chunk x alpha grid) on the human and on the generated
    questions; the versions again with LLM labels on a sample of the human questions; the reports."""
    out.mkdir(parents=True, exist_ok=True)
    llm = ["llm=openai", f"llm.base_url={served}", f"llm.model={model}"] if served else []
    judge = (["llm@eval.relevance_judge.llm=openai", f"eval.relevance_judge.llm.base_url={served}",
              f"eval.relevance_judge.llm.model={model}"] if served else [])
    questions = out / "generated.jsonl"
    if not questions.exists():
        _run(["-m", "rag.testset", f"testset.n={n}", f"testset.out={questions}", *llm, *extra])
    gen = ["qa=jsonl", f"qa.path={questions}", "slice.questions_per_corpus=null"]
    sweeps = {"versions_human": ["sweep=demo"], "versions_generated": ["sweep=demo", *gen]}
    if grid:
        sweeps |= {"grid_human": ["sweep=chunk_alpha"], "grid_generated": ["sweep=chunk_alpha", *gen]}
    sample = [f"slice.questions_per_corpus={label_questions}", "slice.answer_questions_per_corpus=1", "eval.latency.sample=0"]
    sweeps |= {"labels_human": ["sweep=versions", *sample], "labels_llm": ["sweep=versions", *sample,
                                                                           "eval.relevance=llm", *judge]}
    for name, args in sweeps.items():
        if not (out / name / "comparison.csv").exists():
            _run(["run.py", "-m", *args, *extra, f"hydra.sweep.dir={out / name}"])
    parts = ["# Generated questions and LLM labels against human ones", ""]
    data: dict[str, Any] = {}
    for kind in ("versions", "grid") if grid else ("versions",):
        text, data[kind] = questions_report(out / f"{kind}_human", out / f"{kind}_generated")
        parts += [f"## Orderings: sweep={'versions' if kind == 'versions' else 'chunk_alpha'}", "", text]
    text, data["labels"] = labels_report(out / "labels_human", out / "labels_llm")
    parts += ["## LLM labels against the human labels", "", text]
    report = "\n".join(parts)
    _write(out / "validation", report, data)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.validation", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    q = sub.add_parser("questions", help="Kendall's tau and held differences: human against generated questions")
    q.add_argument("human", type=Path)
    q.add_argument("generated", type=Path)
    q.add_argument("--metric", action="append", help=f"(repeatable) default: {', '.join(METRICS)}")
    q.add_argument("--out", type=Path, help="write OUT.md and OUT.json")
    lab = sub.add_parser("labels", help="Cohen's kappa and the confusion table: human labels against LLM labels")
    lab.add_argument("labels", type=Path)
    lab.add_argument("llm", type=Path)
    lab.add_argument("--out", type=Path)
    s = sub.add_parser("study", help="the whole validation on the shipped corpus (slow with an in-process LLM)")
    s.add_argument("--out", type=Path, default=Path("outputs/validation"))
    s.add_argument("--n", type=int, default=120, help="questions asked for (default 120; the filters keep a share)")
    s.add_argument("--label-questions", type=int, default=10, help="human questions per corpus judged by the LLM")
    s.add_argument("--served", help="an OpenAI-compatible base URL for the generator and the judge")
    s.add_argument("--model", help="the served model's id")
    s.add_argument("--no-grid", action="store_true", help="leave out the chunk x alpha grid")
    s.add_argument("overrides", nargs="*", help="more overrides for every run (e.g. paths.cache=...)")
    args = parser.parse_args(argv)
    try:
        if args.what == "questions":
            _write(args.out, *questions_report(args.human, args.generated, tuple(args.metric or METRICS)))
        elif args.what == "labels":
            _write(args.out, *labels_report(args.labels, args.llm))
        else:
            if bool(args.served) != bool(args.model):
                raise RagError("--served and --model go together")
            study(args.out, args.n, args.label_questions, args.served, args.model, not args.no_grid, args.overrides)
    except (RagError, FileNotFoundError) as e:
        print(f"ragrig: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    run_cli(main)
