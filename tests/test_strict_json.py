"""Result files are standard JSON: no NaN or Infinity token, whatever the values held."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rag.store import strict_json


def _parse_strictly(text: str) -> object:
    def refuse(token: str) -> None:
        raise AssertionError(f"non-standard token {token} in {text!r}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), np.float32("nan"), np.float64("inf")])
def test_a_non_finite_value_is_written_as_null(value):
    doc = {"m": value, "rows": [1.0, value], "nested": {"x": (value,)}}
    assert _parse_strictly(strict_json.dumps(doc)) == {"m": None, "rows": [1.0, None], "nested": {"x": [None]}}


def test_numpy_values_become_plain_json():
    doc = {"i": np.int64(3), "f": np.float32(0.5), "a": np.array([[1.0, np.nan]])}
    assert _parse_strictly(strict_json.dumps(doc)) == {"i": 3, "f": 0.5, "a": [[1.0, None]]}


def test_finite_values_and_other_types_are_untouched():
    doc = {"s": "NaN", "b": True, "n": None, "f": 1e308, "neg": -0.0}
    out = _parse_strictly(strict_json.dumps(doc))
    assert out == doc and math.copysign(1, out["neg"]) == -1


def test_the_run_writer_never_writes_a_non_standard_token(tmp_path):
    from rag.run.output import write_results

    result = {"config": {"variant": "v1"}, "metrics": {"mrr": float("nan"), "latency": float("inf")}}
    records = [{"id": "q1", "mrr": float("nan"), "scores": [float("inf"), 1.0]}]
    write_results(tmp_path, result, records)
    assert _parse_strictly((tmp_path / "metrics.json").read_text())["metrics"] == {"mrr": None, "latency": None}
    line = (tmp_path / "per_question.jsonl").read_text().splitlines()[0]
    assert _parse_strictly(line) == {"id": "q1", "mrr": None, "scores": [None, 1.0]}


def test_a_failure_record_is_standard_json(tmp_path):
    from experiments.tracking import write_json

    write_json(tmp_path / "failure.json", {"message": "x", "value": float("nan")})
    assert _parse_strictly((tmp_path / "failure.json").read_text()) == {"message": "x", "value": None}


# ---- reading per_question.jsonl back: strictly, by one reader ---------------------------------------

def _runs_with(tmp_path, token: str, metric: str = "mrr"):
    """Two runs of four questions; the candidate's second line holds `token` as its `metric`."""
    from tests.test_experiments import write_run

    base = write_run(tmp_path / "runs" / "a", variant="v1", values={"mrr": [0.1, 0.5, 0.4, 0.3], "recall_at_k": [1, 0, 1, 1]})
    cand = write_run(tmp_path / "runs" / "b", variant="v2", values={"mrr": [0.2, 0.6, 0.4, 0.3], "recall_at_k": [1, 1, 1, 1]})
    f = cand / "per_question.jsonl"
    lines = f.read_text().splitlines()
    row = json.loads(lines[1])
    lines[1] = json.dumps({**row, metric: "TOKEN"}).replace('"TOKEN"', token)
    f.write_text("\n".join(lines) + "\n")
    return base, cand


@pytest.mark.parametrize("token", ["Infinity", "-Infinity", "NaN", "1e999"])
def test_a_non_standard_number_in_per_question_jsonl_is_refused_naming_its_line(token, tmp_path):
    from eval.record import read_lines
    from rag.types import RagError

    _, cand = _runs_with(tmp_path, token)
    with pytest.raises(RagError) as e:
        read_lines(cand / "per_question.jsonl")
    assert str(e.value) == f"unreadable per_question.jsonl, line 2: {token} at mrr, not a finite number"


@pytest.mark.parametrize("content,problem", [
    (b'{"id": "q0"}\n[1, 2]\n', "line 2: a per-question record is a JSON object, not list"),
    (b'{"id": "q0"}\n{"id": "caf\xe9"}\n', "line 2: not UTF-8 (invalid continuation byte)"),
    (b'{"id": "q0"}\n{"id": "q1", "mrr": \n', "line 2: Expecting value"),
])
def test_a_line_that_is_no_record_is_refused_naming_its_line(content, problem, tmp_path):
    from eval.record import read_lines
    from rag.types import RagError

    (tmp_path / "per_question.jsonl").write_bytes(content)
    with pytest.raises(RagError) as e:
        read_lines(tmp_path / "per_question.jsonl")
    assert str(e.value).startswith(f"unreadable per_question.jsonl, {problem}")


def test_an_answer_holding_a_line_separator_is_one_record(tmp_path):
    from eval.record import read_lines
    from rag.run.output import write_results

    records = [{"id": "q1", "answer": "one\u2028two\u0085three\x1cfour", "mrr": 1.0}, {"id": "q2", "mrr": None}]
    write_results(tmp_path, {"config": {}}, records)
    assert read_lines(tmp_path / "per_question.jsonl") == records


def test_the_gate_refuses_an_infinite_value_in_one_line_with_status_2(tmp_path):
    import subprocess
    import sys

    from rag.config.compose import PROJECT_ROOT

    base, cand = _runs_with(tmp_path, "Infinity")
    done = subprocess.run([sys.executable, "-m", "experiments.gate", str(base), str(cand), "--metric", "mrr",
                           "--min-effect", "0"], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"gate: error: {cand}: unreadable per_question.jsonl, line 2: Infinity at mrr, "
                           "not a finite number\n")


@pytest.mark.parametrize("token", ["Infinity", "NaN"])
def test_compare_and_aggregate_list_the_run_as_unreadable_not_as_a_win_or_a_dropped_question(token, tmp_path):
    from experiments.aggregate import load_records, summary_frame

    _runs_with(tmp_path, token)
    records = load_records([tmp_path / "runs"])
    assert [r.status for r in records] == ["ok", "failed"]
    assert records[1].failure == {"error_type": "CorruptResults",
                                  "message": f"unreadable per_question.jsonl, line 2: {token} at mrr, not a finite number"}
    frame = summary_frame(records)[0]
    assert "inf" not in frame.to_csv()


def test_pooling_refuses_a_judged_run_whose_records_do_not_read(tmp_path):
    from experiments.pooling import read_judged
    from rag.types import RagError

    _, cand = _runs_with(tmp_path, "NaN", metric="ndcg_at_k")
    doc = json.loads((cand / "metrics.json").read_text())
    (cand / "metrics.json").write_text(json.dumps({**doc, "provenance": {"labels": {"source": "llm"}}}))
    with pytest.raises(RagError) as e:
        read_judged(cand)
    assert str(e.value) == f"{cand}: unreadable per_question.jsonl, line 2: NaN at ndcg_at_k, not a finite number"
