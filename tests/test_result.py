"""rag.run.result.RunResult: metrics.json read and written back unchanged, and its flat row.

Fixtures (tests/fixtures/metrics): full.json (a run with every key: slice, qa_split, latency_method,
usage, routing, provenance), baseline.json (no usage, no routing), older.json (from before qa_split,
latency_method and provenance). flat_expected.json holds what the sweep summary and MLflow tracking made of them
before RunResult existed (experiments.aggregate.summary_frame, experiments.tracking.metrics_of):
the names and values the flat row must keep.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rag.run.result import ABSENT, KEY_ORDER, Objective, RunResult, metric_columns

FIX = Path(__file__).parent / "fixtures" / "metrics"
NAMES = ("full", "baseline", "older")


def text(name: str) -> str:
    return (FIX / f"{name}.json").read_text()


def expected() -> dict:
    return json.loads((FIX / "flat_expected.json").read_text())


def missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def same(a, b) -> bool:
    return (missing(a) and missing(b)) or a == b


@pytest.mark.parametrize("name", NAMES)
def test_metrics_json_round_trips_byte_for_byte(name):
    doc = json.loads(text(name))
    result = RunResult.from_json(doc)
    back = result.to_json()
    assert back == doc and list(back) == list(doc)
    assert json.dumps(back, indent=2) == text(name)  # as pipeline.write_results writes it


def test_optional_keys_stay_absent_or_present_as_read():
    full, older = RunResult.from_json(json.loads(text("full"))), RunResult.from_json(json.loads(text("older")))
    assert list(full.to_json()) == list(KEY_ORDER)
    assert older.qa_split is ABSENT and older.latency_method is None and older.usage is None
    assert "qa_split" not in older.to_json() and "latency_method" not in older.to_json()
    assert older.provenance is None and "provenance" not in older.to_json()
    assert older.fitted is None and "fitted" not in older.to_json()
    assert older.backends is None and "backends" not in older.to_json()
    assert full.backends["embedder"]["line"].startswith("torch bf16") and full.backends["eval.embedder"]["precision"] == "fp32"
    assert full.fitted["parts"]["reranker"]["this_corpus"] is False and list(full.to_json())[-1] == "fitted"
    assert full.provenance == {"questions": {"human": 4, "generated": 2, "generators": ["SmolLM2-135M-Instruct"]},
                               "labels": {"source": "qa"}}
    # a run without a question split writes "qa_split": null, which is not the same as no key
    doc = {**json.loads(text("baseline")), "qa_split": None}
    assert RunResult.from_json(doc).to_json() == doc and "qa_split" in RunResult.from_json(doc).to_json()
    assert isinstance(full.objective, Objective) and full.objective.name == "mrr" and full.k == 5


def test_unknown_keys_are_kept_and_bad_documents_refused():
    doc = {**json.loads(text("older")), "something_new": {"x": 1}}
    assert RunResult.from_json(doc).to_json() == doc
    with pytest.raises(ValueError, match="dry run"):
        RunResult.from_json({"dry_run": {"requests": 3}})
    with pytest.raises(ValueError, match="no metrics"):
        RunResult.from_json({k: v for k, v in doc.items() if k != "metrics"})
    with pytest.raises(ValueError):
        RunResult.from_json([1, 2])
    with pytest.raises(ValueError, match="objective"):
        RunResult.from_json({**doc, "objective": {"name": "mrr"}})


def usage_column(c: str) -> bool:
    """Columns added after the summary was frozen: served models' requests and cost, compression, routing."""
    return c.endswith("_requests") or c.startswith("cost_") or c == "currency" or c.startswith(("compression_", "routing_"))


def test_flatten_has_what_compression_removed():
    flat = RunResult.from_json(json.loads(text("full"))).flatten()
    assert flat["compression_removed_share"] == 0.5476 and flat["compression_fallbacks"] == 1
    assert "compression_removed_share" not in RunResult.from_json(json.loads(text("older"))).flatten()


def test_flatten_has_the_summary_columns():
    """Each run's own flat row: the summary's columns for it, with the same values."""
    exp = expected()
    for i, (name, row) in enumerate(zip(NAMES, exp["summary_rows"])):
        flat = {c: v for c, v in RunResult.from_json(json.loads(text(name))).flatten().items() if not usage_column(c)}
        own = {c: v for c, v in row.items() if c in flat}
        assert set(flat) <= set(exp["summary_columns"])
        if i == 0:  # the first run sets the frame's column order
            assert [c for c in exp["summary_columns"] if c in flat] == list(flat)
        assert all(same(flat[c], v) for c, v in own.items())
        missing = set(exp["summary_columns"]) - set(flat)  # only other runs' metrics
        assert all(row[c] is None or (c.endswith("_n") and row[c] == 0) for c in missing)


def test_flatten_has_requests_and_cost_per_served_role():
    doc = json.loads(text("full"))
    doc["usage"] = {"embed": {"requests_sent": 3, "prompt_tokens": 900, "cost": 0.0009},
                    "generate": {"requests_sent": 6, "prompt_tokens": 100, "completion_tokens": 50, "cost": 0.25},
                    "currency": "EUR"}
    flat = RunResult.from_json(doc).flatten()
    assert {c: flat[c] for c in flat if usage_column(c) and not c.startswith(("compression_", "routing_"))} == {
        "embed_requests": 3, "cost_embed": 0.0009, "generate_requests": 6, "cost_generate": 0.25,
        "cost_total": pytest.approx(0.2509), "currency": "EUR"}
    assert not any(usage_column(c) for c in RunResult.from_json(json.loads(text("baseline"))).flatten())


def test_flatten_without_n_is_what_tracking_logs():
    exp = expected()["tracking"]
    for name in NAMES:
        flat = RunResult.from_json(json.loads(text(name))).flatten(with_n=False)
        logged = set(exp[name]) - {"objective"}
        assert logged <= set(flat) and not any(c.endswith("_n") and c[:-2] in flat for c in logged)
        assert all(same(flat[c], exp[name][c]) for c in logged)


def test_metric_columns_fill_missing_metrics():
    assert metric_columns({"mrr": {"mean": 0.5, "ci95": [0.4, 0.6], "n": 3}}, ["mrr", "x"]) == pytest.approx(
        {"mrr": 0.5, "mrr_ci_low": 0.4, "mrr_ci_high": 0.6, "mrr_n": 3,
         "x": math.nan, "x_ci_low": math.nan, "x_ci_high": math.nan, "x_n": 0}, nan_ok=True)
    row = RunResult.unfinished_row(["mrr"], "mrr")
    assert row["objective"] == "mrr" and math.isnan(row["objective_value"]) and row["mrr_n"] == 0


# -- the callers: each keeps what it produced before RunResult -----------------------------------


def test_summary_frame_rows_are_unchanged(tmp_path):
    from experiments.aggregate import load_records, summary_frame

    for i, name in enumerate(NAMES):
        (tmp_path / "sweep" / str(i)).mkdir(parents=True)
        (tmp_path / "sweep" / str(i) / "metrics.json").write_text(text(name))
    (tmp_path / "sweep" / "3").mkdir()
    (tmp_path / "sweep" / "3" / "failure.json").write_text(json.dumps({"error_type": "RagError", "message": "boom"}))
    df, _, _ = summary_frame(load_records([tmp_path / "sweep"]))
    exp = expected()
    cols = [c for c in df.columns if not usage_column(c)]
    assert cols[cols.index("objective"):cols.index("run_dir")] == exp["summary_columns"]
    for (_, got), want in zip(df.iterrows(), exp["summary_rows"]):
        assert all(same(got[c], v) for c, v in want.items()), want["objective"]


def test_tracking_metrics_are_unchanged():
    from experiments.tracking import metrics_of

    exp = expected()["tracking"]
    for name in NAMES:
        got = {k: v for k, v in metrics_of(json.loads(text(name))).items() if not usage_column(k)}
        assert list(got) == list(exp[name]) and all(same(got[k], v) for k, v in exp[name].items())
