"""`python -m experiments.gate`: a non-inferiority (or superiority) test of a candidate against a
baseline on one metric, over the questions both have, for CI. Decisions on synthetic runs, the
command line's exit status and one-line errors, TREC run files, and two real runs of the
pipeline (one passes, one fails)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments.gate import gate, main
from rag.config.compose import PROJECT_ROOT
from rag.types import RagError
from tests.test_experiments import write_run

N = 60


def values(mean: float, spread: float = 0.05, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.2, 0.8, N)
    return {f"q{i}": float(np.clip(base[i] + mean + rng.normal(0, spread), 0, 1)) for i in range(N)}


BASE = values(0.0)


@pytest.mark.parametrize("shift,test,margin,passed", [
    (+0.10, "non-inferiority", 0.01, True),   # clearly better
    (+0.10, "superiority", 0.01, True),
    (-0.002, "non-inferiority", 0.05, True),  # a hair worse, well inside the margin
    (-0.002, "superiority", 0.0, False),      # ... but not better
    (-0.10, "non-inferiority", 0.01, False),  # clearly worse
    (+0.03, "superiority", 0.10, False),      # better, not by the margin asked for
])
def test_the_decision_follows_the_interval_and_the_margin(shift, test, margin, passed):
    res = gate(BASE, values(shift), "ndcg_at_k", margin, test, resamples=2000)
    assert res.passed is passed, res.line()
    assert res.n == N and res.line().startswith("PASS" if passed else "FAIL")
    assert (res.worst_gain > res.needed) is passed


def test_a_lower_is_better_metric_is_turned_round():
    fewer = {q: max(0.0, v - 0.2) for q, v in BASE.items()}
    assert gate(BASE, fewer, "hallucination", 0.01).passed  # fewer hallucinations: better
    assert not gate(fewer, BASE, "hallucination", 0.01).passed
    assert "(lower is better)" in gate(BASE, fewer, "hallucination", 0.01).line()


def test_only_shared_questions_with_values_count():
    cand = {**values(0.1), "extra": 1.0, "q0": None}
    assert gate(BASE, cand, "mrr", 0.0).n == N - 1


def test_bad_decisions_are_refused():
    with pytest.raises(RagError, match="share no question"):
        gate(BASE, {"other": 1.0}, "mrr", 0.0)
    with pytest.raises(RagError, match="--min-effect must be a number >= 0"):
        gate(BASE, BASE, "mrr", -0.1)


def run_dirs(tmp_path: Path) -> tuple[Path, Path, Path]:
    base = write_run(tmp_path / "base", values={"mrr": list(BASE.values()), "ndcg_at_k": list(BASE.values())},
                     ids=list(BASE))
    better = values(0.1)
    good = write_run(tmp_path / "good", values={"mrr": list(better.values()), "ndcg_at_k": list(better.values())},
                     ids=list(better))
    worse = values(-0.1)
    bad = write_run(tmp_path / "sweep" / "3", job=3, values={"mrr": list(worse.values()), "ndcg_at_k": list(worse.values())},
                    ids=list(worse))
    return base, good, bad


def test_the_command_exits_0_on_pass_and_1_on_fail_and_writes_json(tmp_path, capsys):
    base, good, bad = run_dirs(tmp_path)
    assert main([str(base), str(good), "--metric", "ndcg_at_k", "--min-effect", "0.01", "--json",
                 str(tmp_path / "gate.json")]) == 0
    out = capsys.readouterr().out
    line, doc = out.split("\n", 1)
    assert line.startswith("PASS: ndcg_at_k candidate") and "non-inferiority with margin 0.01 holds" in line
    assert json.loads(doc)["passed"] is True and json.loads((tmp_path / "gate.json").read_text())["n"] == N
    # a sweep's job directory works as well
    assert main([str(base), str(bad), "--metric", "ndcg_at_k", "--min-effect", "0.01"]) == 1
    assert capsys.readouterr().out.startswith("FAIL: ndcg_at_k")


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    base, good, _ = run_dirs(tmp_path)
    other = write_run(tmp_path / "other-questions", values={"mrr": [0.5] * 5}, ids=[f"x{i}" for i in range(5)])
    run = tmp_path / "run.trec"
    run.write_text("q1 Q0 d1 1 2 t\n")
    cases = [
        ([str(base), str(other), "--metric", "mrr", "--min-effect", "0"], "share no question"),
        ([str(base), str(good), "--metric", "bleu", "--min-effect", "0"], "no per-question values of metric 'bleu'"),
        ([str(base), str(good), "--metric", "mrr", "--min-effect", "-0.1"], "--min-effect: must be a number >= 0"),
        ([str(base), str(good), "--metric", "mrr", "--min-effect", "abc"], "--min-effect: must be a number, got 'abc'"),
        ([str(run), str(run), "--metric", "ndcg_at_k", "--min-effect", "0"], "needs --qrels"),
        ([str(tmp_path / "nowhere"), str(good), "--metric", "mrr", "--min-effect", "0"], "no such file or directory"),
        ([str(tmp_path), str(good), "--metric", "mrr", "--min-effect", "0"], "not a run directory"),
    ]
    for argv, expect in cases:
        done = subprocess.run([sys.executable, "-m", "experiments.gate", *argv], capture_output=True, text=True,
                              cwd=PROJECT_ROOT, timeout=120)
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        assert done.returncode == 2 and len(lines) == 1 and expect in lines[0], (argv, done.stderr)
        assert "Traceback" not in done.stderr


def write_trec(tmp_path: Path) -> tuple[Path, Path, Path]:
    qrels = tmp_path / "qrels.trec"
    qrels.write_text("".join(f"q{i} 0 rel{i} 1\n" for i in range(40)))

    def run(path: Path, hit_rank: int) -> Path:
        lines = []
        for i in range(40):
            ranked = [f"junk{i}-{j}" for j in range(5)]
            ranked.insert(hit_rank, f"rel{i}")
            lines += [f"q{i} Q0 {d} {r + 1} {10 - r} tag\n" for r, d in enumerate(ranked[:5])]
        path.write_text("".join(lines))
        return path

    return qrels, run(tmp_path / "top.trec", 0), run(tmp_path / "third.trec", 2)



def test_trec_run_files_are_scored_against_the_qrels(tmp_path, capsys):
    qrels, top, third = write_trec(tmp_path)
    assert main([str(third), str(top), "--qrels", str(qrels), "--metric", "mrr_id", "--min-effect", "0",
                 "--test", "superiority"]) == 0
    doc = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert doc["n"] == 40 and doc["candidate_mean"] == pytest.approx(1.0) and doc["baseline_mean"] == pytest.approx(1 / 3)
    assert main([str(top), str(third), "--qrels", str(qrels), "--metric", "ndcg_cut.5", "--min-effect", "0.1"]) == 1


def test_two_real_runs_one_passes_one_fails(tiny_files, tmp_path):
    """The tiny corpus through the pipeline: BM25 against itself passes; a dense run with one-token
    chunks (nothing to match) against it fails."""
    from rag.run.pipeline import run
    from tests.conftest import tiny_overrides
    from hydra import compose, initialize_config_dir

    def do(out: Path, *extra: str) -> Path:
        with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
            run(compose(config_name="config", overrides=[*tiny_overrides(tiny_files), *extra]), out)
        return out

    base = do(tmp_path / "base", "retriever=hybrid")
    same = do(tmp_path / "same", "retriever=hybrid")
    worse = do(tmp_path / "worse", "retriever=hybrid", "fusion.alpha=1.0", "chunker.chunk_size=8", "chunker.chunk_overlap=0")
    assert main([str(base), str(same), "--metric", "mrr", "--min-effect", "0.01"]) == 0
    assert main([str(base), str(worse), "--metric", "mrr", "--min-effect", "0.01"]) == 1


# ---- the boundary of --min-effect, the bootstrap's size, the inputs' files -------------------------

EIGHTHS = {f"q{i}": (i % 5) / 8 for i in range(N)}  # dyadic values: every difference and mean is exact


def shifted(by: float) -> dict[str, float]:
    return {q: v + by for q, v in EIGHTHS.items()}


@pytest.mark.parametrize("candidate,test,margin,passed", [
    (EIGHTHS, "non-inferiority", 0.0, True),       # identical runs lose nothing: not inferior at margin 0
    (EIGHTHS, "superiority", 0.0, False),          # ... and gain nothing: not superior at margin 0
    (shifted(-0.25), "non-inferiority", 0.25, True),   # worse by exactly the margin: still within it
    (shifted(-0.25), "non-inferiority", 0.125, False),  # worse by more than the margin
    (shifted(+0.25), "superiority", 0.25, False),      # better by exactly the margin: not by more
    (shifted(+0.25), "superiority", 0.125, True),
])
def test_the_margin_is_inclusive_for_non_inferiority_and_strict_for_superiority(candidate, test, margin, passed):
    res = gate(EIGHTHS, candidate, "ndcg_at_k", margin, test, resamples=500)
    assert res.passed is passed, res.line()
    sign = (">=" if test == "non-inferiority" else ">") if passed else ("<" if test == "non-inferiority" else "<=")
    assert res.line().endswith(f"the worst plausible gain {res.worst_gain:+.4f} {sign} {res.needed:+g}")


def test_identical_runs_on_a_lower_is_better_metric_are_not_inferior_either():
    res = gate(EIGHTHS, EIGHTHS, "hallucination", 0.0)
    assert res.passed and res.line().endswith("the worst plausible gain +0.0000 >= +0")
    assert not gate(EIGHTHS, EIGHTHS, "hallucination", 0.0, "superiority").passed


def test_two_identical_runs_pass_non_inferiority_at_margin_0_on_the_command_line(tmp_path, capsys):
    base, _, _ = run_dirs(tmp_path)
    assert main([str(base), str(base), "--metric", "ndcg_at_k", "--min-effect", "0"]) == 0
    assert capsys.readouterr().out.startswith("PASS: ndcg_at_k")
    assert main([str(base), str(base), "--metric", "ndcg_at_k", "--min-effect", "0", "--test", "superiority"]) == 1


@pytest.mark.parametrize("resamples", ["0", "-5"])
def test_a_bootstrap_of_no_resamples_is_refused(resamples, tmp_path, capsys):
    base, good, _ = run_dirs(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main([str(base), str(good), "--metric", "mrr", "--min-effect", "0", "--resamples", resamples])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"gate: error: argument --resamples: must be a positive integer, got {int(resamples)} "
        "(python -m experiments.gate --help)"]
    with pytest.raises(RagError, match="--resamples must be a positive integer, got 0"):
        gate(BASE, values(0.1), "mrr", 0.0, resamples=0)


def test_one_shared_question_is_no_interval():
    with pytest.raises(RagError, match="share only 1 question with a value of mrr; an interval needs at least 2"):
        gate({"q1": 0.5, "q2": 0.1}, {"q1": 0.9}, "mrr", 0.0)


def test_a_run_without_per_question_values_names_the_missing_file(tmp_path, capsys):
    base, good, _ = run_dirs(tmp_path)
    (good / "per_question.jsonl").unlink()
    assert main([str(base), str(good), "--metric", "ndcg_at_k", "--min-effect", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gate: error: {good / 'per_question.jsonl'}: no such file; the gate pairs the runs question by "
                   "question, and a run's per-question metrics are only there (metrics.json holds their means)"]


def test_a_metric_no_question_has_lists_the_per_question_metrics(tmp_path, capsys):
    base = write_run(tmp_path / "base", values={"mrr": list(BASE.values()), "ndcg_at_k": list(BASE.values())},
                     ids=list(BASE))
    rows = [json.loads(line) for line in (base / "per_question.jsonl").read_text().splitlines()]
    (base / "per_question.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "ndcg_at_k"}) + "\n"
                                                     for r in rows))
    assert main([str(base), str(base), "--metric", "ndcg_at_k", "--min-effect", "0"]) == 2
    # metrics.json still has ndcg_at_k's mean: the list is of what the pairing can use
    assert capsys.readouterr().err.strip() == (f"gate: error: {base}: no per-question values of metric 'ndcg_at_k'; "
                                               "its per_question.jsonl has: mrr")


@pytest.mark.parametrize("unbuffered", [False, True])
def test_behind_a_closed_pipe_the_exit_status_is_the_verdict_and_the_json_is_written(unbuffered, tmp_path):
    from tests.test_cli_errors import UNBUFFERED, to_closed_pipe

    base, good, bad = run_dirs(tmp_path)
    env = UNBUFFERED if unbuffered else None
    for cand, status in ((good, 0), (bad, 1)):
        out = tmp_path / f"gate-{status}.json"
        done = to_closed_pipe(["-m", "experiments.gate", str(base), str(cand), "--metric", "ndcg_at_k",
                               "--min-effect", "0.01", "--json", str(out)], env=env, timeout=120)
        assert done.returncode == status and done.stderr == "", done.stderr[-3000:]
        assert json.loads(out.read_text())["passed"] is (status == 0)


def test_help_lists_the_exit_status_and_every_option_with_its_default():
    from experiments.gate import parser

    text = parser().format_help()
    assert "exit status: 0 pass, 1 fail, 2 bad input" in text
    assert "two runs with identical values pass" in text and "two runs with identical values fail" in text
    for option, default in [("--test", "non-inferiority"), ("--k", "5"), ("--confidence", "0.95"),
                            ("--resamples", "10000"), ("--seed", "0")]:
        assert f"(default: {default})" in option_help(text, option), option
    assert all(a.help for a in parser()._actions)


def option_help(help_text: str, option: str) -> str:
    """What `--help` says of one option, on one line."""
    options = " ".join(help_text.split("\noptions:", 1)[1].split())
    return options.split(f" {option} ", 1)[1].split(" --", 1)[0]


def test_a_run_whose_pooling_was_interrupted_is_refused_naming_the_command(tmp_path, capsys):
    from rag.run.rundir import mark_pooling

    base, cand, _ = run_dirs(tmp_path)
    mark_pooling([cand], f"python -m experiments.pooling {cand.parent}")
    assert main([str(base), str(cand), "--metric", "mrr", "--min-effect", "0.01"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gate: error: {cand}: pooling its relevance labels was interrupted (pooling_pending.json)")
    assert err.rstrip().endswith(f"finish it with: python -m experiments.pooling {cand.parent}") and err.count("\n") == 1
