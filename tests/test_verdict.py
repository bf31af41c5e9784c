"""The verdict in words: which run is the baseline and why, the best cell of a parameter sweep,
what "▲/▼" means, and what a question count too small to show anything says. Synthetic run
directories (tests/test_experiments.py's write_run), so no model is needed."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from experiments.aggregate import load_records
from experiments.report import ReportSettings, analyze
from experiments.report_files import build_report
from tests.test_experiments import write_run

QUIET = ReportSettings(charts=False, html=False)


def versions_like_the_demo(root: Path) -> Path:
    """v1..v4 as one multirun, as `make demo` leaves it: v3 and v4 rerank (higher MRR, 500 ms
    slower) and answer; v1 and v2 do not answer."""
    rng = np.random.default_rng(38)
    n = 60
    sweep = root / "demo"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    base_rank = rng.integers(1, 7, n)
    for job, v in enumerate(("v1", "v2", "v3", "v4")):
        gain = {"v1": 0, "v2": 0, "v3": 2, "v4": 1}[v]
        rank = np.maximum(1, base_rank - (rng.uniform(0, 1, n) < 0.5) * gain)
        mrr = list(np.where(rank <= 5, 1.0 / rank, 0.0))
        values = {"recall_at_k": list((rng.uniform(0, 1, n) < 0.5).astype(float)), "mrr": mrr, "mrr_id": mrr,
                  "hit_at_k_id": list((rank <= 5).astype(float)),
                  "ndcg_at_k": list(np.where(rank <= 5, 1 / np.log2(1 + rank), 0.0))}
        if v in ("v3", "v4"):
            values["answer_gt"] = list(rng.uniform(0, 0.5, n))
            values["hallucination"] = list((rng.uniform(0, 1, n) < 0.6).astype(float))
        latency = rng.uniform(8, 12, n) + (500 if v in ("v3", "v4") else 0)
        write_run(sweep / str(job), variant=v, overrides=[f"+version={v}"], values=values, job=job,
                  question_latency=list(latency))
    return sweep


# What the versions' verdict said before the metrics had one name each, with the new labels
# (MRR -> MRR (sim), recall@5 -> recall@5 (sim)) and nothing else changed.
DEMO_VERDICT = (
    "Against the baseline v1, over 60 shared questions: v3 beats v1 on MRR (sim) by +0.180 [+0.120, +0.233], "
    "MRR (source id) by +0.180 [+0.120, +0.233] and nDCG@5 by +0.145 [+0.099, +0.195], but loses on retrieval "
    "latency ↓ by +499.8 ms [+499.5 ms, +500.2 ms]; v4 beats v1 on MRR (sim) by +0.071 [+0.037, +0.108], "
    "MRR (source id) by +0.071 [+0.037, +0.108] and nDCG@5 by +0.059 [+0.032, +0.086], but loses on retrieval "
    "latency ↓ by +500.0 ms [+499.6 ms, +500.4 ms]. Each is significant after Holm's correction over 18 "
    "comparisons (family-wise α = 0.05). Nothing else differs; at these question counts a paired test detects "
    "(80% power) differences from about: recall@5 (sim) 0.361; MRR (sim) 0.094; MRR (source id) 0.094; "
    "hit@5 (source id) 0.077; nDCG@5 0.074; retrieval latency ↓ 0.8 ms. Not compared: answer–truth "
    "similarity, hallucination rate ↓ (v1 has no values of them). Question by question against v1 (by the "
    "source document's rank in the top 5, and the answer where both answered): v2 fixes 0 questions and "
    "breaks 0; v3 fixes 13 questions (13 ranking) and breaks 0; v4 fixes 4 questions (4 ranking) and breaks 0.")


@pytest.mark.parametrize("named", ["v1", None])  # sweep=demo names v1; without it, v1 is still the baseline
def test_the_versions_verdict_keeps_v1_as_baseline_and_its_words(tmp_path, named):
    sweep = versions_like_the_demo(tmp_path)
    rep = analyze(load_records([sweep]), tmp_path / "out", ReportSettings(charts=False, html=False, baseline=named))
    assert rep.baseline == "v1"
    assert rep.verdict.replace("\u00a0", " ") == DEMO_VERDICT
    assert "Best:" not in rep.verdict and "Baseline:" not in rep.verdict  # versions are no parameter grid


def grid(root: Path, sizes=(256, 512), alphas=(0.3, 0.5, 0.7), n: int = 40) -> Path:
    """A chunk_size x alpha sweep directory whose MRR rises with alpha and falls with chunk size."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0, 1, n)
    sweep = root / "grid"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    job = 0
    for cs in sizes:
        for alpha in alphas:
            mrr = np.clip(base + 0.3 * alpha - 0.0002 * cs + rng.normal(0, 0.02, n), 0, 1)
            write_run(sweep / str(job), job=job, overrides=[f"chunker.chunk_size={cs}", "retriever=hybrid",
                                                            f"fusion.alpha={alpha}"],
                      values={"recall_at_k": list((mrr > 0.5).astype(float)), "mrr": list(mrr)})
            job += 1
    return sweep


def test_a_grid_is_compared_with_its_default_cell_and_names_its_best_cell(tmp_path):
    rep = analyze(load_records([grid(tmp_path)]), tmp_path / "out", QUIET)
    assert rep.baseline == "chunk_size=512 alpha=0.5"  # conf/: chunk_size 512, weighted fusion alpha 0.5
    words = rep.verdict
    assert words.startswith("Baseline: chunk_size=512 alpha=0.5, the configuration's default values "
                            "(report.baseline names another). Best: chunk_size=256 alpha=0.7 (job 2), MRR (sim) 0.")
    assert "; against chunk_size=512 alpha=0.5 +0.1" in words
    assert "significantly better after Holm's correction (Holm-adjusted p = " in words
    assert "Best:" in rep.terminal()  # the terminal's verdict names it too


def test_a_grid_without_its_defaults_falls_back_to_the_first_cell_and_says_so(tmp_path):
    rep = analyze(load_records([grid(tmp_path, alphas=(0.3, 0.7))]), tmp_path / "out", QUIET)
    assert rep.baseline == "chunk_size=256 alpha=0.3"
    assert rep.verdict.startswith(
        "Baseline: chunk_size=256 alpha=0.3, the first run: no run has the configuration's default values "
        "(chunk_size=512, alpha=0.5); report.baseline=LABEL (python -m experiments.compare --baseline LABEL) "
        "names another. Best: chunk_size=256 alpha=0.7 (job 1)")


def test_a_named_baseline_wins_and_the_best_cell_may_be_the_baseline_itself(tmp_path):
    sweep = grid(tmp_path)
    named = ReportSettings(charts=False, html=False, baseline="chunk_size=256 alpha=0.7")
    rep = analyze(load_records([sweep]), tmp_path / "out", named)
    assert rep.baseline == "chunk_size=256 alpha=0.7"
    assert rep.verdict.startswith("Best: the baseline chunk_size=256 alpha=0.7 (job 2) itself, MRR (sim) 0.")

    wrong = ReportSettings(charts=False, html=False, baseline="chunk_size=999")
    rep = analyze(load_records([sweep]), tmp_path / "out2", wrong)
    assert rep.verdict.startswith("report.baseline 'chunk_size=999' matches no successful run. "
                                  "Baseline: chunk_size=512 alpha=0.5, the configuration's default values")


def test_a_best_cell_that_does_not_differ_says_so(tmp_path):
    sweep = tmp_path / "flat"
    rng = np.random.default_rng(2)
    base = rng.uniform(0, 1, 30)
    for job, alpha in enumerate((0.3, 0.5, 0.7)):
        write_run(sweep / str(job), job=job, overrides=["retriever=hybrid", f"fusion.alpha={alpha}"],
                  values={"mrr": list(np.clip(base + rng.normal(0, 0.05, 30), 0, 1))})
    rep = analyze(load_records([sweep]), tmp_path / "out", QUIET)
    assert rep.baseline == "alpha=0.5"
    assert "not significantly different after Holm's correction" in rep.verdict


def few_questions(root: Path) -> Path:
    """Two versions on 6 questions, as a user's first own question set might be: they find the
    answer on different questions (recall) and rank it differently (MRR)."""
    write_run(root / "v1", variant="v1", overrides=["+version=v1"],
              values={"recall_at_k": [1, 0, 1, 0, 1, 0], "mrr": [0.9, 0.1, 0.8, 0.2, 0.5, 0.5]})
    write_run(root / "v2", variant="v2", overrides=["+version=v2"],
              values={"recall_at_k": [0, 1, 0, 1, 1, 0], "mrr": [0.1, 0.9, 0.2, 0.8, 0.5, 0.5]})
    return root


def test_too_few_questions_are_named_instead_of_a_difference_beyond_the_metrics_range(tmp_path):
    rep = build_report(load_records([few_questions(tmp_path / "runs")]), tmp_path / "out", QUIET)
    mde = rep.mde.set_index("metric")["mde"]
    assert mde["recall_at_k"] > 1 > mde["mrr"]  # a recall difference can be 1 at most
    words = rep.verdict
    assert words.endswith("At these question counts a paired test detects (80% power) differences from about: "
                          f"MRR (sim) {mde['mrr']:.3f}. Too few questions to detect any difference in "
                          "recall@5 (sim) (n=6).")
    assert "recall@5 (sim) 1." not in words
    md = (tmp_path / "out" / "summary.md").read_text()
    assert f"{mde['recall_at_k']:.3f} (beyond the metric's range: too few questions)" in md


def test_one_run_on_few_questions_says_no_difference_could_be_detected(tmp_path):
    write_run(tmp_path / "v1", variant="v1", overrides=["+version=v1"],
              values={"recall_at_k": [1, 0, 1, 0], "mrr": [1, 0, 1, 0]})
    rep = analyze(load_records([tmp_path / "v1"]), tmp_path / "out", QUIET)
    assert rep.verdict.endswith("No baseline to compare with. Too few questions to detect any difference in "
                                "recall@5 (sim) and MRR (sim) (n=4).")


def test_up_and_down_marks_mean_better_and_worse_in_the_metrics_direction(tmp_path):
    n = 60
    rng = np.random.default_rng(9)
    hall = (np.arange(n) % 2).astype(float)
    latency = rng.uniform(8, 12, n)
    write_run(tmp_path / "v1", variant="v1", overrides=["+version=v1"], question_latency=list(latency),
              values={"mrr": list(rng.uniform(0, 1, n)), "hallucination": list(hall)})
    write_run(tmp_path / "v2", variant="v2", overrides=["+version=v2"], question_latency=list(latency + 40),
              values={"mrr": list(rng.uniform(0, 1, n)), "hallucination": list(np.zeros(n))})
    rep = analyze(load_records([tmp_path]), tmp_path / "out", QUIET)
    marks = rep.comparison.set_index("metric")["marker"]
    assert marks["hallucination"] == "▲"  # fewer hallucinations: better, though lower
    assert marks["latency_ms"] == "▼"  # slower: worse, though higher
    assert "▲/▼: better/worse than v1 in the metric's direction" in rep.terminal().replace("\n", " ")


def test_a_failed_default_cell_is_named_as_the_reason_for_the_first_cell(tmp_path):
    from tests.test_experiments import synthetic_grid

    rep = analyze(load_records([synthetic_grid(tmp_path, failed=(512, 0.5))]), tmp_path / "out", QUIET)
    assert rep.baseline == "chunk_size=256 alpha=0.3"
    assert rep.verdict.startswith("Baseline: chunk_size=256 alpha=0.3, the first run: the run with the "
                                  "configuration's default values (chunk_size=512 alpha=0.5) failed; ")


GEN = {"questions": {"human": 0, "generated": 20, "generators": ["SmolLM2-135M"]}, "labels": {"source": "qa"}}
HUMAN = {"questions": {"human": 20, "generated": 0, "generators": []}, "labels": {"source": "qa"}}
LLM = {"source": "llm", "judge": "qwen", "prompt": "ab12", "pairs": 90, "unjudged": 1, "pooled_runs": 2}


@pytest.mark.parametrize("provenances, words", [
    ([HUMAN, HUMAN, None], ""),  # people's questions, the file's labels, or a run from before either was recorded
    ([GEN, GEN], "Measured on generated questions, not human-written ones."),
    ([{**GEN, "labels": LLM}], "Measured on generated questions and LLM relevance labels, not human ones."),
    ([{**HUMAN, "labels": LLM}], "Measured with LLM relevance labels, not human ones."),
    ([HUMAN, GEN], "Measured on questions partly generated, not only human-written ones (not in every run: see "
                   "Questions and labels)."),
])
def test_the_verdict_says_when_questions_were_generated_or_labels_graded_by_an_llm(provenances, words):
    from experiments.verdict import provenance_words

    assert provenance_words(provenances) == words


def faster_by_a_hair(root: Path) -> Path:
    """v2 is 0.3 ms slower than v1 on every one of 60 questions (certainly significant, and no
    user cares) and better on nDCG by 0.005 on every question (the same)."""
    n = 60
    rng = np.random.default_rng(4)
    latency = rng.uniform(4, 6, n)  # 10% of it is under 1 ms: 1 ms is the bar
    ndcg = rng.uniform(0.2, 0.8, n)
    mrr = list(rng.uniform(0, 1, n))
    write_run(root / "v1", variant="v1", overrides=["+version=v1"], question_latency=list(latency),
              values={"mrr": mrr, "ndcg_at_k": list(ndcg)})
    write_run(root / "v2", variant="v2", overrides=["+version=v2"], question_latency=list(latency + 0.3),
              values={"mrr": mrr, "ndcg_at_k": list(ndcg + 0.005)})
    return root


def test_a_significant_difference_smaller_than_what_matters_is_no_win_or_loss(tmp_path):
    rep = analyze(load_records([faster_by_a_hair(tmp_path / "runs")]), tmp_path / "out", QUIET)
    cells = rep.comparison.set_index("metric")
    assert bool(cells.loc["latency_ms", "significant"]) and bool(cells.loc["ndcg_at_k", "significant"])
    assert not cells.loc["latency_ms", "matters"] and not cells.loc["ndcg_at_k", "matters"]
    assert cells.loc["latency_ms", "min_effect"] == 1.0 and cells.loc["ndcg_at_k", "min_effect"] == 0.01
    assert list(cells["marker"]) == ["", "", ""]
    words = rep.verdict.replace("\u00a0", " ")
    assert "loses" not in words and "beats" not in words
    assert ("no run differs from the baseline on any metric by the smallest difference that matters or more "
            "after Holm's correction over 3 comparisons") in words
    assert ("Significant, but smaller than the smallest difference that matters (report.min_effect), so neither a "
            "win nor a loss: v2 on nDCG@5 by +0.005 [+0.005, +0.005] (it takes 0.010) and v2 on retrieval latency ↓ "
            "by +0.3 ms [+0.3 ms, +0.3 ms] (it takes 1.0 ms).") in words


def test_the_smallest_difference_that_matters_is_set_per_metric(tmp_path):
    settings = ReportSettings(charts=False, html=False, min_effect={"latency": 0.1, "nDCG@5": "0.5%"})
    rep = analyze(load_records([faster_by_a_hair(tmp_path / "runs")]), tmp_path / "out", settings)
    marks = rep.comparison.set_index("metric")["marker"]
    assert marks["latency_ms"] == "▼" and marks["ndcg_at_k"] == "▲" and marks["mrr"] == ""
    words = rep.verdict.replace("\u00a0", " ")
    assert "v2 beats v1 on nDCG@5 by +0.005 [+0.005, +0.005], but loses on retrieval latency ↓ by +0.3 ms" in words
    assert "smaller than the smallest difference that matters" not in words


def test_a_latency_difference_matters_from_a_tenth_of_the_baselines_latency(tmp_path):
    """On a 10 ms baseline 1 ms is the bar; on a 2 s one, 200 ms."""
    n = 40
    rng = np.random.default_rng(5)
    slow = rng.uniform(1900, 2100, n)
    mrr = list(rng.uniform(0, 1, n))
    write_run(tmp_path / "v1", variant="v1", overrides=["+version=v1"], question_latency=list(slow), values={"mrr": mrr})
    write_run(tmp_path / "v2", variant="v2", overrides=["+version=v2"], question_latency=list(slow + 50),
              values={"mrr": mrr})
    write_run(tmp_path / "v3", variant="v3", overrides=["+version=v3"], question_latency=list(slow + 400),
              values={"mrr": mrr})
    rep = analyze(load_records([tmp_path]), tmp_path / "out", QUIET)
    cells = rep.comparison[rep.comparison["metric"] == "latency_ms"].set_index("label")
    assert cells.loc["v2", "min_effect"] == pytest.approx(0.1 * float(np.mean(slow)))
    assert cells.loc["v2", "marker"] == "" and cells.loc["v3", "marker"] == "▼"
