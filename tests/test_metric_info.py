"""One name per metric: the table in experiments/metric_info.py gives each metric its key (the
files' contract), one printed label, its direction, range, needs and when it is null; every
printed name comes from it, the gate takes any of its spellings, and docs/reference/metrics.md is
generated from it."""
from __future__ import annotations

import re

import numpy as np
import pytest

from eval import metrics as M
from experiments import metric_info as MI
from experiments.gate import main as gate_main
from rag.config.compose import PROJECT_ROOT
from rag.run.output import format_table
from rag.types import RagError
from tests.test_experiments import write_run


@pytest.mark.parametrize("key", list(MI.METRICS))
def test_every_key_and_printed_label_names_its_metric(key):
    for k in (5, 10):
        assert MI.resolve(key) == key
        assert MI.resolve(MI.label(key, k)) == key  # as the summary prints it, ↓ included
        assert MI.resolve(MI.label(key, k, mark=False).upper()) == key


@pytest.mark.parametrize("typed,key", [
    ("nDCG@5", "ndcg_at_k"), ("ndcg@10", "ndcg_at_k"), ("ndcg_at_k", "ndcg_at_k"), ("NDCG_AT_5", "ndcg_at_k"),
    ("MRR", "mrr"), ("MRR (sim)", "mrr"), ("mrr (source id)", "mrr_id"), ("hit@5", "hit_at_k_id"),
    ("recall@5 (labels)", "recall_at_k_label"), ("recall@5 (similarity)", "recall_at_k"), ("MAP@5", "map_at_k"),
    ("answer-truth similarity", "answer_gt"), ("hallucination rate", "hallucination"),
    ("latency", "latency_ms"), ("retrieval latency ↓", "latency_ms"),
    ("ndcg_cut.10", "ndcg_cut.10"),  # a trec_eval measure the table does not list stays as typed
])
def test_the_obvious_spellings_resolve(typed, key):
    assert MI.resolve(typed) == key


def test_a_name_two_metrics_share_is_refused_naming_both():
    with pytest.raises(MI.AmbiguousMetric) as e:
        MI.resolve("recall@5")
    assert "recall_at_k ('recall@5 (sim)')" in str(e.value) and "recall_at_k_label ('recall@5 (labels)')" in str(e.value)


def test_no_two_metrics_print_the_same_label_and_the_similarity_ones_say_so():
    labels = [MI.label(m, 5) for m in MI.METRICS]
    assert len(set(labels)) == len(labels)
    assert MI.label("recall_at_k", 5) == "recall@5 (sim)" and MI.label("recall_at_k_label", 5) == "recall@5 (labels)"
    assert MI.label("mrr") == "MRR (sim)" and MI.label("mrr_id") == "MRR (source id)"
    assert MI.label(MI.LATENCY) == "retrieval latency ↓"


def test_every_metric_says_what_it_needs_when_it_is_null_and_its_range():
    for key, i in MI.METRICS.items():
        assert i.family and i.needs and i.null_when, key
    assert MI.width("recall_at_k") == 1.0 and MI.width("answer_gt") == 2.0 and MI.width(MI.LATENCY) is None
    assert MI.undetectable("recall_at_k", 1.078) and not MI.undetectable("recall_at_k", 0.3)
    assert not MI.undetectable(MI.LATENCY, 1e6)


def test_the_reference_page_is_the_table():
    """docs/reference/metrics.md holds the generated reference: `python -m experiments.metric_info --write
    docs/reference/metrics.md` after a change to METRICS."""
    page = (PROJECT_ROOT / "docs" / "reference" / "metrics.md").read_text(encoding="utf-8")
    assert MI.page_block(page) == MI.markdown()
    assert "### How to read the verdict" in page


def test_the_reference_is_one_card_per_metric_not_a_wide_table():
    text = MI.markdown()
    assert not [line for line in text.splitlines() if line.count("|") > 4], "no table of many columns"
    for key in MI.METRICS:
        assert f"\n### {MI.label(key, mark=False)}\n\n`{key}` · " in text, key
    assert "\n### retrieval latency\n\n`latency_ms` · cost · lower is better ↓ · ms per question\n" in text
    assert "- **Smallest difference that matters:** 1 ms or 10% of the baseline's mean, whichever is larger." in text


def test_the_reference_names_the_input_fields_of_the_question_format():
    """Questions name their answer's document by `doc_id` (conf/qa/jsonl.yaml); `source` is only
    what older files called it."""
    text = MI.markdown()
    assert "`source`" not in text and "spec's" not in text
    assert "**Needs:** the question's `doc_id`" in text


def test_the_smallest_difference_that_matters_is_per_metric_and_settable():
    assert MI.min_effect("ndcg_at_k", 0.6) == 0.01
    assert MI.min_effect(MI.LATENCY, 5.0) == 1.0, "1 ms on a fast baseline"
    assert MI.min_effect(MI.LATENCY, 1600.0) == pytest.approx(160.0), "10% of a slow one"
    assert MI.min_effect("a_metric_of_my_own", 3.0) == 0.0
    settings = MI.min_effects({"nDCG@5": 0.05, "latency": "25%"})
    assert settings == {"ndcg_at_k": (0.05, 0.0), MI.LATENCY: (0.0, 0.25)}
    assert MI.min_effect("ndcg_at_k", 0.6, settings) == 0.05
    assert MI.min_effect(MI.LATENCY, 8.0, settings) == 2.0, "a setting replaces both parts of the default"


@pytest.mark.parametrize("settings, message", [
    ({"ndcg_at_k": -0.1}, "report.min_effect.ndcg_at_k must be a difference >= 0"),
    ({"ndcg_at_k": "lots"}, "report.min_effect.ndcg_at_k must be a difference >= 0"),
    ({"ndcg_at_k": True}, "report.min_effect.ndcg_at_k must be"),
    ({"speed": 1}, "report.min_effect.speed: no such metric"),
    (0.01, "report.min_effect must be a mapping of metric to smallest difference"),
])
def test_a_bad_smallest_difference_is_one_line_naming_it(settings, message):
    with pytest.raises(RagError, match=re.escape(message)):
        MI.min_effects(settings)


def test_write_page_replaces_only_the_generated_block(tmp_path):
    page = tmp_path / "metrics.md"
    page.write_text(f"# Metrics\n\nprose before\n\n{MI.BEGIN}\nstale\n{MI.END}\n\nprose after\n")
    assert MI.write_page(page) and not MI.write_page(page)
    text = page.read_text()
    assert text.startswith("# Metrics\n\nprose before\n\n") and text.endswith("\n\nprose after\n")
    assert "stale" not in text and MI.page_block(text) == MI.markdown()


def test_the_product_specs_definitions_stand():
    """recall@k = 1 if max over the top-k chunks of cos(E(c), E(G)) >= 0.75; answer-GT = cos(E(A),
    E(G)); grounding = cos(E(A), E(concat C)); hallucination = both below tau_h; MRR."""
    sims = np.array([[0.2, 0.76, 0.9], [0.74, 0.1, 0.0]])
    rel = M.relevant_by_similarity(sims, np.ones_like(sims, bool), 0.75)
    assert M.recall_at_k(rel).tolist() == [1.0, 0.0] and M.reciprocal_rank(rel).tolist() == [0.5, 0.0]
    a, g, c = np.array([1.0, 0.0]), np.array([1.0, 1.0]), np.array([0.0, 1.0])
    assert M.answer_gt_similarity(a, g) == pytest.approx(2 ** -0.5) and M.grounding(a, c) == pytest.approx(0.0)
    assert M.hallucination(np.array([0.4, 0.6]), np.array([0.3, 0.3]), 0.5).tolist() == [1.0, 0.0]
    assert "≥ τ" in MI.METRICS["recall_at_k"].formula and "τ = {tau_recall}" in MI.METRICS["recall_at_k"].threshold


def test_a_runs_terminal_table_prints_the_labels():
    result = {"variant": "v1", "counts": {"questions": 2, "documents": 3, "chunks": 4}, "timings_s": {"score": 0.1},
              "config": {"eval": {"k": 5}},
              "metrics": {m: {"mean": 0.5, "ci95": [0.4, 0.6], "n": 2} for m in ("recall_at_k", "mrr_id", "hallucination")},
              "by_corpus": {"libc": {"recall_at_k": {"mean": 0.5}}}}
    text = format_table(result)
    assert "recall@5 (sim)" in text and "MRR (source id)" in text and "hallucination rate ↓" in text
    assert "recall_at_k" not in text and "mrr_id" not in text


def test_the_gate_takes_the_label_the_summary_prints(tmp_path, capsys):
    rng = np.random.default_rng(0)
    v = rng.uniform(0, 1, 30)
    base = write_run(tmp_path / "a", values={"mrr": list(v), "ndcg_at_k": list(v), "recall_at_k": list((v > 0.5).astype(float))})
    cand = write_run(tmp_path / "b", values={"mrr": list(v), "ndcg_at_k": list(v), "recall_at_k": list((v > 0.5).astype(float))})
    for typed in ("nDCG@5", "ndcg@5", "ndcg_at_k", "MRR (sim)"):
        assert gate_main([str(base), str(cand), "--metric", typed, "--min-effect", "0.01", "--resamples", "200"]) == 0
    assert gate_main([str(base), str(cand), "--metric", "recall@5", "--min-effect", "0.01"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("gate: error: metric 'recall@5' could be recall_at_k") and "recall_at_k_label" in err
