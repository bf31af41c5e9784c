"""experiments/faults.py: each question's fault class from its per-question metrics, and the
questions a run fixes and breaks against the baseline, on synthetic rows."""
from __future__ import annotations

import pytest

from experiments.aggregate import load_records
from experiments.faults import CLASSES, classify, counts, sentence, transitions
from experiments.report import ReportSettings
from experiments.report_files import build_report
from tests.test_experiments import write_run

TAU = 0.5
NAN = float("nan")  # not answered (write_run takes numbers only)


@pytest.mark.parametrize("row,expect", [
    ({"hit_at_k_id": 0.0, "mrr_id": 0.0, "answer_gt": 0.9, "grounding": 0.9}, "retrieval_miss"),
    ({"hit_at_k_id": 1.0, "mrr_id": 0.5}, "ranking"),                                     # retrieval only
    ({"hit_at_k_id": 1.0, "mrr_id": 0.5, "answer_gt": 0.2, "grounding": 0.9}, "ranking"),  # answer wrong, evidence 2nd
    ({"hit_at_k_id": 1.0, "mrr_id": 1.0, "answer_gt": 0.2, "grounding": 0.9}, "generation_miss"),
    ({"hit_at_k_id": 1.0, "mrr_id": 0.5, "answer_gt": 0.8, "grounding": 0.1}, "ungrounded"),
    ({"hit_at_k_id": 1.0, "mrr_id": 0.5, "answer_gt": 0.8, "grounding": 0.7}, "correct"),   # answered right
    ({"hit_at_k_id": 1.0, "mrr_id": 1.0}, "correct"),
    ({"hit_at_k_id": 1.0, "mrr_id": 1.0, "answer_gt": None, "grounding": None}, "correct"),
    ({"mrr": 1.0}, None),                                                                 # no source id: unclassed
])
def test_each_class(row, expect):
    assert classify(row, TAU) == expect


def test_without_answers_a_question_is_classed_by_retrieval():
    row = {"hit_at_k_id": 1.0, "mrr_id": 1.0, "answer_gt": 0.1, "grounding": 0.1}
    assert classify(row, TAU) == "generation_miss" and classify(row, TAU, answers=False) == "correct"


def runs(tmp_path):
    # q0 fixed from a retrieval miss, q1 fixed from ranking, q2 broken into ranking, q3 stays wrong,
    # q4 answered by both: fixed from a generation miss; q5 answered by the baseline only: by retrieval
    base = {"hit_at_k_id": [0, 1, 1, 0, 1, 1], "mrr_id": [0, 0.5, 1, 0, 1, 1],
            "answer_gt": [NAN, NAN, NAN, NAN, 0.1, 0.1], "grounding": [NAN, NAN, NAN, NAN, 0.9, 0.9],
            "mrr": [0.0] * 6}
    new = {"hit_at_k_id": [1, 1, 1, 0, 1, 1], "mrr_id": [1, 1, 0.5, 0, 1, 1],
           "answer_gt": [NAN, NAN, NAN, NAN, 0.9, NAN], "grounding": [NAN, NAN, NAN, NAN, 0.9, NAN],
           "mrr": [0.0] * 6}
    write_run(tmp_path / "v1", variant="v1", overrides=["+version=v1"], values=base)
    write_run(tmp_path / "v2", variant="v2", overrides=["+version=v2"], values=new)
    return load_records([tmp_path / "v1"])[0], load_records([tmp_path / "v2"])[0]


def test_fixed_and_broken_are_counted_under_the_fault_they_had_or_got(tmp_path):
    base, new = runs(tmp_path)
    assert counts(base) == {"retrieval_miss": 2, "ranking": 1, "generation_miss": 2, "ungrounded": 0, "correct": 1}
    assert set(counts(new)) == set(CLASSES)
    t = transitions(base, new)
    assert t["shared"] == 6
    assert t["fixed"] == {"retrieval_miss": 1, "ranking": 1, "generation_miss": 1}
    assert t["broken"] == {"ranking": 1}
    assert t["ids"] == {"fixed": ["q0", "q1", "q4"], "broken": ["q2"]}
    assert sentence("v2", t) == "v2 fixes 3 questions (1 retrieval miss, 1 ranking, 1 generation miss) and breaks 1 (1 ranking)"


def test_the_verdict_and_summary_carry_the_faults(tmp_path):
    runs(tmp_path)
    rep = build_report(load_records([tmp_path]), tmp_path / "out", ReportSettings(charts=False, html=False))
    assert "Question by question against v1" in rep.verdict and "v2 fixes 3 questions" in rep.verdict
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "## Why: questions per fault class" in md and "| v2 | 6 | 3 questions" in md
