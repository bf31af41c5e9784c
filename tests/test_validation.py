"""Validating generated questions and LLM labels against human ones: Kendall's tau of the
configurations' orderings, what became of each significant difference, and Cohen's kappa."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from sklearn.metrics import cohen_kappa_score

from experiments.validation import cohen_kappa, differences, main, new_differences, orderings


def summary(means: dict[str, float]) -> pd.DataFrame:
    return pd.DataFrame({"label": list(means), "mrr": list(means.values()), "status": "ok"})


def test_tau_is_one_for_the_same_order_and_minus_one_for_the_reverse():
    human = summary({"v1": 0.4, "v2": 0.5, "v3": 0.6, "v4": 0.7})
    same = summary({"v1": 0.1, "v2": 0.2, "v3": 0.3, "v4": 0.9})
    (o,) = orderings(human, same, ["mrr"])
    assert o.tau == pytest.approx(1.0) and o.configurations == 4
    (o,) = orderings(human, summary({"v1": 0.9, "v2": 0.8, "v3": 0.7, "v4": 0.1}), ["mrr"])
    assert o.tau == pytest.approx(-1.0)
    (o,) = orderings(human, summary({"v1": 0.1, "v2": 0.3, "v3": 0.2, "v4": 0.4}), ["mrr"])
    assert o.tau == pytest.approx(4 / 6), "one discordant pair of six"


def comparison(rows):
    return pd.DataFrame([{"label": lab, "metric": m, "diff": d, "significant": s} for lab, m, d, s in rows])


def test_each_significant_human_difference_is_held_weakened_reversed_or_unmeasured():
    human = comparison([("v2", "mrr", 0.1, True), ("v3", "mrr", 0.2, True), ("v4", "mrr", -0.1, True),
                        ("v4", "ndcg_at_k", 0.1, True), ("v2", "hit_at_k_id", 0.05, False)])
    gen = comparison([("v2", "mrr", 0.08, True), ("v3", "mrr", 0.05, False), ("v4", "mrr", 0.1, True),
                      ("v2", "hit_at_k_id", 0.2, True)])
    outcomes = {(d.label, d.metric): d.outcome for d in differences(human, gen, ["mrr", "ndcg_at_k", "hit_at_k_id"])}
    assert outcomes == {("v2", "mrr"): "held", ("v3", "mrr"): "same direction, not significant",
                        ("v4", "mrr"): "reversed", ("v4", "ndcg_at_k"): "not measured"}
    assert new_differences(human, gen, ["hit_at_k_id", "mrr"]) == [("v2", "hit_at_k_id", 0.2)]


@pytest.mark.parametrize("a, b", [([1, 1, 0, 0, 1, 0, 1, 1], [1, 0, 0, 0, 1, 1, 1, 1]), ([0, 1] * 5, [0, 1] * 5),
                                  ([1, 0, 1, 0], [0, 1, 0, 1])])
def test_kappa_is_cohens(a, b):
    assert cohen_kappa(a, b) == pytest.approx(cohen_kappa_score(a, b))


def test_a_directory_that_is_no_sweep_is_one_line(tmp_path, capsys):
    assert main(["questions", str(tmp_path), str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"ragrig: error: {tmp_path}: no summary.csv (is it a finished sweep's directory?)"


def test_the_labels_report_compares_the_judges_grades_with_the_human_ones(tmp_path, capsys):
    def job(sweep, grades, judge):
        d = tmp_path / sweep / "0"
        d.mkdir(parents=True)
        hits = [{"chunk_id": f"d{i}#0", "doc_id": f"d{i}", "text": f"t{i}", "grade": g,
                 **({"judge_grade": j} if judge else {})} for i, (g, j) in enumerate(zip(grades, judge or grades))]
        (d / "per_question.jsonl").write_text(json.dumps({"id": "q1", "retrieved": hits}) + "\n")
        (d / "metrics.json").write_text(json.dumps({"provenance": {"labels": {"source": "llm" if judge else "qa",
                                                                              "relevant_from": 2}}}))
        pd.DataFrame({"job": [0], "label": ["v1"], "status": ["ok"]}).to_csv(tmp_path / sweep / "summary.csv")
        pd.DataFrame({"label": [], "metric": []}).to_csv(tmp_path / sweep / "comparison.csv")

    job("human", [1, 0, 0, 1, 0], None)
    job("llm", [1, 0, 0, 1, 0], [3, 1, None, 0, 0])
    assert main(["labels", str(tmp_path / "human"), str(tmp_path / "llm"), "--out", str(tmp_path / "agree")]) == 0
    data = json.loads((tmp_path / "agree.json").read_text())
    assert data["pairs"] == 5 and data["unjudged"] == 1
    assert data["confusion"] == {"0": {"0": 1, "1": 1, "unjudged": 1}, "1": {"0": 1, "3": 1}}
    assert data["kappa"] == pytest.approx(cohen_kappa_score([1, 0, 1, 0], [1, 0, 0, 0]))
    assert "Cohen's kappa" in capsys.readouterr().out


# ---- a sweep against itself, LLM labels on the human side -----------------------------------------

def _labels_sweep(root, name: str, source: str, grades=(1, 0, 0, 1, 0), judge=None):
    """A finished one-job sweep whose labels came from `source` (qa: the question set's, llm: the judge's)."""
    d = root / name / "0"
    d.mkdir(parents=True)
    hits = [{"chunk_id": f"d{i}#0", "doc_id": f"d{i}", "text": f"t{i}", "grade": g,
             **({"judge_grade": judge[i]} if judge else {})} for i, g in enumerate(grades)]
    (d / "per_question.jsonl").write_text(json.dumps({"id": "q1", "retrieved": hits}) + "\n")
    (d / "metrics.json").write_text(json.dumps({"provenance": {"labels": {"source": source, "relevant_from": 2}}}))
    pd.DataFrame({"job": [0], "label": ["v1"], "status": ["ok"]}).to_csv(root / name / "summary.csv")
    pd.DataFrame({"label": [], "metric": []}).to_csv(root / name / "comparison.csv")
    return root / name


@pytest.mark.parametrize("what", ["labels", "questions"])
def test_one_sweep_given_twice_is_refused(what, tmp_path, capsys):
    sweep = _labels_sweep(tmp_path, "llm", "llm", judge=[3, 1, None, 0, 0])
    assert main([what, str(sweep), str(tmp_path / "llm" / ".." / "llm")]) == 2
    captured = capsys.readouterr()
    assert captured.err == (f"ragrig: error: {what}: {sweep} is given twice; compare two sweeps ({sweep} against "
                            "itself agrees by construction)\n")
    assert "kappa" not in captured.out and "tau" not in captured.out


def test_a_human_side_whose_labels_came_from_an_llm_is_refused(tmp_path, capsys):
    first = _labels_sweep(tmp_path, "first", "llm", judge=[3, 1, None, 0, 0])
    second = _labels_sweep(tmp_path, "second", "llm", judge=[3, 1, None, 0, 0])
    assert main(["labels", str(first), str(second)]) == 2
    assert capsys.readouterr().err == (f"ragrig: error: {first}: its labels came from an LLM judge (job v1: "
                                       "provenance.labels.source=llm); the first sweep must be scored with the "
                                       "question set's labels (eval.relevance=labels)\n")


def test_an_llm_side_scored_with_the_question_sets_labels_is_refused(tmp_path, capsys):
    human = _labels_sweep(tmp_path, "human", "qa")
    other = _labels_sweep(tmp_path, "other", "qa")
    assert main(["labels", str(human), str(other)]) == 2
    assert capsys.readouterr().err == (f"ragrig: error: {other}: job v1 was not scored by an LLM judge "
                                       "(provenance.labels.source=qa); the second sweep must be run with "
                                       "eval.relevance=llm\n")


def test_a_sweep_without_a_finished_job_or_with_unreadable_records_is_one_line(tmp_path, capsys):
    human = _labels_sweep(tmp_path, "human", "qa")
    llm = _labels_sweep(tmp_path, "llm", "llm", judge=[3, 1, None, 0, 0])
    pd.DataFrame({"job": [0], "label": ["v1"], "status": ["failed"]}).to_csv(llm / "summary.csv")
    assert main(["labels", str(human), str(llm)]) == 2
    assert capsys.readouterr().err == f"ragrig: error: {llm}: no finished job (its summary.csv lists none with status ok)\n"
    pd.DataFrame({"job": [0], "label": ["v1"], "status": ["ok"]}).to_csv(llm / "summary.csv")
    (llm / "0" / "per_question.jsonl").write_text('{"id": "q1", "retrieved": [{"chunk_id": "d0#0", "grade": NaN}]}\n')
    assert main(["labels", str(human), str(llm)]) == 2
    assert capsys.readouterr().err == (f"ragrig: error: {llm / '0'}: unreadable per_question.jsonl, line 1: NaN at "
                                       "retrieved[0].grade, not a finite number\n")
