"""A regression gate for CI: is the candidate not worse than the baseline on one metric?

    python -m experiments.gate BASELINE CANDIDATE --metric ndcg_at_k --min-effect 0.01
    python -m experiments.gate base/run.trec new/run.trec --qrels qrels.trec --metric ndcg_at_k --k 10
    python -m experiments.gate BASELINE CANDIDATE --metric mrr --min-effect 0 --test superiority

BASELINE and CANDIDATE are run directories (`python run.py`'s, or a sweep's job directories),
read through their per_question.jsonl, or TREC run files scored against `--qrels` with
trec_eval's measures (pytrec_eval). Over the questions both have a value for, the candidate's
paired difference from the baseline (oriented so that positive is better: a lower-is-better
metric such as latency or hallucination is negated) gets a paired-bootstrap confidence interval
(experiments.stats).

- non-inferiority (the default) passes when the interval's worse end is at or above
  `-min_effect`: the candidate is, with that confidence, not worse by more than `min_effect`.
  With `--min-effect 0` it may lose nothing: two runs with identical values pass;
- superiority passes when the worse end is strictly above `+min_effect`: the candidate is, with
  that confidence, better by more than `min_effect`. With `--min-effect 0` it must gain something:
  two runs with identical values fail.

The interval is two-sided at `--confidence` (0.95), so each test is one-sided at 97.5%; it needs
at least 2 shared questions and 1 resample.

Exit status: 0 pass, 1 fail, 2 bad input (one line naming it). Prints one line of verdict, then
the figures as JSON; `--json FILE` is written first, whatever becomes of the printed output.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NoReturn

from experiments import metric_info as MI
from experiments.stats import has_value, paired_bootstrap, shared_ids
from rag.config.cli import HelpFormatter, non_negative_float, positive_int, run_cli, seed_int
from rag.types import RagError

TESTS = ("non-inferiority", "superiority")
# The harness's metric names on TREC files, as trec_eval measures at cut-off k.
TREC_MEASURES = {"ndcg_at_k": "ndcg_cut.{k}", "map_at_k": "map_cut.{k}", "recall_at_k_label": "recall.{k}",
                 "precision_at_k": "P.{k}", "mrr_id": "recip_rank"}


@dataclass(frozen=True)
class GateResult:
    test: str
    metric: str
    min_effect: float
    passed: bool
    n: int  # questions both have a value for
    baseline_mean: float
    candidate_mean: float
    diff: float  # candidate - baseline, in the metric's own direction
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float
    lower_is_better: bool

    worst_gain: float  # the interval's worse end, oriented so that positive is better
    needed: float  # -min_effect (non-inferiority: worst_gain >= needed) or +min_effect (superiority: >)

    def line(self) -> str:
        word = "PASS" if self.passed else "FAIL"
        direction = " (lower is better)" if self.lower_is_better else ""
        holds = "holds" if self.passed else "does not hold"
        inclusive = self.test == "non-inferiority"
        if self.passed:
            compared = ">=" if inclusive else ">"
        else:
            compared = "<" if inclusive else "<="
        return (f"{word}: {self.metric}{direction} candidate {self.candidate_mean:.4f} vs baseline "
                f"{self.baseline_mean:.4f} over {self.n} shared questions, difference {self.diff:+.4f} "
                f"[{self.ci_low:+.4f}, {self.ci_high:+.4f}] ({self.confidence:.0%} paired bootstrap); {self.test} "
                f"with margin {self.min_effect:g} {holds}: the worst plausible gain {self.worst_gain:+.4f} "
                f"{compared} {self.needed:+g}")


def passes(worst_gain: float, needed: float, test: str) -> bool:
    """Non-inferiority is "not worse by more than the margin", so reaching its bound exactly passes
    (identical runs are not inferior at margin 0); superiority is "better by more than the margin",
    so reaching its bound does not (identical runs are not superior at margin 0)."""
    return worst_gain >= needed if test == "non-inferiority" else worst_gain > needed


def gate(baseline: Mapping[str, float | None], candidate: Mapping[str, float | None], metric: str,
         min_effect: float, test: str = "non-inferiority", confidence: float = 0.95, resamples: int = 10_000,
         seed: int = 0) -> GateResult:
    """The gate's decision over per-question values (question id -> value)."""
    if test not in TESTS:
        raise RagError(f"--test must be one of {', '.join(TESTS)}, got {test!r}")
    if not (isinstance(min_effect, (int, float)) and math.isfinite(min_effect) and min_effect >= 0):
        raise RagError(f"--min-effect must be a number >= 0, got {min_effect!r}")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        # zero resamples would make the interval the bare mean: a 0-width "95% interval"
        raise RagError(f"--resamples must be a positive integer, got {resamples!r}")
    lower = MI.lower_is_better(metric)
    d = paired_bootstrap(baseline, candidate, n_resamples=resamples, confidence=confidence, seed=seed)
    if d.n == 0:
        raise RagError(f"the two runs share no question with a value of {metric} (ids differ, or neither scored it)")
    if d.n == 1:
        raise RagError(f"the two runs share only 1 question with a value of {metric}; an interval needs at least 2")
    sign = -1.0 if lower else 1.0
    oriented_low = min(sign * d.ci_low, sign * d.ci_high) + 0.0  # the worse end, positive = better; -0 is 0
    # 0.0 - x rather than -x: a margin of 0 is printed +0, not -0
    margin = 0.0 - float(min_effect) if test == "non-inferiority" else float(min_effect)
    ids = shared_ids(baseline, candidate)
    mean = lambda m: sum(float(m[i]) for i in ids) / len(ids)  # noqa: E731
    return GateResult(test, metric, float(min_effect), passes(oriented_low, margin, test), d.n, mean(baseline),
                      mean(candidate), d.mean_diff, d.ci_low, d.ci_high, confidence, d.p_value, lower,
                      oriented_low, margin)


# ---- inputs ------------------------------------------------------------------------------------

def run_values(path: Path, metric: str) -> dict[str, float | None]:
    """Per-question values of a finished run directory."""
    from experiments.aggregate import PER_QUESTION_FILE, load_run

    if not (path / "metrics.json").exists() and not (path / "failure.json").exists():
        raise RagError(f"{path}: not a run directory (no metrics.json); give a run's or a sweep job's directory, "
                       "or a TREC run file with --qrels")
    from rag.run.rundir import pooling_pending

    pending = pooling_pending(path)
    if pending is not None:
        raise RagError(pending)
    rec = load_run(path)
    failure = rec.failure or {}
    if not rec.ok and failure.get("error_type") == "CorruptResults":  # finished, but its files do not read
        raise RagError(f"{path}: {failure.get('message')}")
    if not rec.ok:
        raise RagError(f"{path}: the run did not finish ({failure.get('message', 'failed')})")
    if not (path / PER_QUESTION_FILE).is_file():
        raise RagError(f"{path / PER_QUESTION_FILE}: no such file; the gate pairs the runs question by question, "
                       f"and a run's per-question metrics are only there (metrics.json holds their means)")
    from experiments.verdict import question_values

    values = question_values(rec, metric)
    if not any(has_value(v) for v in values.values()):
        have = ", ".join(scored_metrics(rec.per_question())) or "none"
        raise RagError(f"{path}: no per-question values of metric {metric!r}; its {PER_QUESTION_FILE} has: {have}")
    return values


def scored_metrics(rows: list[dict]) -> list[str]:
    """The metrics per_question.jsonl rows hold a number for (the question's id is no metric)."""
    return sorted({k for r in rows for k, v in r.items()
                   if k != "id" and isinstance(v, (int, float)) and not isinstance(v, bool) and has_value(v)})


def _trec_lines(path: Path, fields: int, what: str) -> list[tuple[int, list[str]]]:
    """(line number, fields) of each line of a TREC file that is not blank."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise RagError(f"{path}: cannot read the {what} ({getattr(e, 'strerror', None) or e})") from None
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != fields:
            raise RagError(f"{path}:{lineno}: a {what} line has {fields} fields, this one has {len(parts)}: {line.strip()[:80]!r}")
        rows.append((lineno, parts))
    if not rows:
        raise RagError(f"{path}: the {what} is empty")
    return rows


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """A TREC qrels file; its grades bounded as every label's (rag.types.MAX_GRADE), negative ones
    (TREC's "junk") included."""
    from rag.types import MAX_GRADE, check_grade

    qrels: dict[str, dict[str, int]] = {}
    for lineno, (qid, _, doc, grade) in _trec_lines(path, 4, "qrels file"):
        try:
            value = int(grade)
        except ValueError:
            raise RagError(f"{path}: a qrels grade must be an integer, got {grade!r} (question {qid})") from None
        qrels.setdefault(qid, {})[doc] = check_grade(value, f"{path}:{lineno}: the grade", lo=-MAX_GRADE)
    return qrels


def read_run(path: Path) -> dict[str, list[str]]:
    """Question id -> document ids, best first (by score, then rank, as trec_eval reads them)."""
    scored: dict[str, list[tuple[float, int, str]]] = {}
    for _, (qid, _, doc, rank, score, _tag) in _trec_lines(path, 6, "TREC run file"):
        try:
            scored.setdefault(qid, []).append((-float(score), int(rank), doc))
        except ValueError:
            raise RagError(f"{path}: rank and score must be numbers, got {rank!r} and {score!r} (question {qid})") from None
    return {q: [d for _, _, d in sorted(rows)] for q, rows in scored.items()}


def trec_values(run: Path, qrels: dict[str, dict[str, int]], metric: str, k: int) -> dict[str, float | None]:
    from eval.labels import trec_measures

    measure = TREC_MEASURES.get(metric, metric).format(k=k)
    try:
        values = trec_measures(qrels, read_run(run), [measure])
    except (ValueError, TypeError) as e:
        known = ", ".join(TREC_MEASURES)
        raise RagError(f"--metric {metric!r} is not a trec_eval measure ({e}); on TREC files use one of {known} "
                       "or a trec_eval name such as ndcg_cut.10") from None
    return {q: v[measure] for q, v in values.items()}


def values_of(path: Path, metric: str, qrels: Path | None, k: int) -> dict[str, float | None]:
    if not path.exists():
        raise RagError(f"{path}: no such file or directory")
    if path.is_dir():
        return run_values(path, metric)
    if qrels is None:
        raise RagError(f"{path}: a TREC run file needs --qrels (the relevance judgements to score it against)")
    return trec_values(path, read_qrels(qrels), metric, k)


# ---- command line ------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not the usage block: CI logs show it whole
        print(f"gate: error: {message} (python -m experiments.gate --help)", file=sys.stderr)
        sys.exit(2)


def parser() -> argparse.ArgumentParser:
    about, _, exits = __doc__.partition("Exit status:")
    ap = _Parser(prog="python -m experiments.gate", description=about.rstrip(), epilog="exit status:" + exits.rstrip(),
                 formatter_class=HelpFormatter)
    ap.add_argument("baseline", type=Path, help="run directory, sweep job directory or TREC run file")
    ap.add_argument("candidate", type=Path, help="run directory, sweep job directory or TREC run file")
    ap.add_argument("--metric", required=True,
                    help="the metric compared (required), e.g. ndcg_at_k, mrr_id, recall_at_k, answer_gt, hallucination")
    ap.add_argument("--min-effect", type=non_negative_float, required=True,
                    help="the margin, in the metric's units, >= 0 (required)")
    ap.add_argument("--test", choices=TESTS, default="non-inferiority", help="which claim the gate checks")
    ap.add_argument("--qrels", type=Path, help="qrels to score TREC run files against (default: none; "
                                                "required when BASELINE and CANDIDATE are TREC run files)")
    ap.add_argument("--k", type=positive_int, default=5, help="cut-off of the measures on TREC run files")
    ap.add_argument("--confidence", type=float, default=0.95, help="two-sided confidence of the interval, in [0.5, 1)")
    ap.add_argument("--resamples", type=positive_int, default=10_000, help="paired-bootstrap resamples (>= 1)")
    ap.add_argument("--seed", type=seed_int, default=0, help="seed of the bootstrap and the sign-flip test")
    ap.add_argument("--json", type=Path, help="also write the figures to this file (default: printed only)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if not 0.5 <= args.confidence < 1:
            raise RagError(f"--confidence must be in [0.5, 1), got {args.confidence}")
        if args.qrels is not None and not args.qrels.is_file():
            raise RagError(f"{args.qrels}: no such qrels file")
        args.metric = MI.resolve(args.metric)  # the printed label ('nDCG@5') names the same metric as its key
        base = values_of(args.baseline, args.metric, args.qrels, args.k)
        cand = values_of(args.candidate, args.metric, args.qrels, args.k)
        res = gate(base, cand, args.metric, args.min_effect, args.test, args.confidence, args.resamples, args.seed)
        doc = json.dumps({**asdict(res), "baseline": str(args.baseline), "candidate": str(args.candidate)},
                         indent=2, allow_nan=False)
        # Before anything is printed: a reader that stops early (| head -1) must not cost the file.
        if args.json is not None:
            write_json(args.json, doc)
    except RagError as e:
        print(f"gate: error: {e}", file=sys.stderr)
        return 2
    print(res.line())
    print(doc)
    return 0 if res.passed else 1


def write_json(path: Path, doc: str) -> None:
    from rag.store.atomic import atomic_write_text

    try:
        atomic_write_text(path, doc + "\n")
    except OSError as e:
        raise RagError(f"--json {e.filename or path}: cannot write it ({e.strerror or e})") from None


if __name__ == "__main__":
    run_cli(main)
