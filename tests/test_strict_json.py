"""Result files are standard JSON: no NaN or Infinity token, whatever the values held."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rag import strict_json


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
    from rag.output import write_results

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
