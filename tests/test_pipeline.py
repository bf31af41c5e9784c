"""End to end on a tiny corpus: results files, cache reuse, and what invalidates what."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from rag.store.cache import make_key
from rag.config.compose import PROJECT_ROOT
from rag.embedder.backend_choice import candidate_named
from rag.embedder.sentence_transformer import SentenceTransformerEmbedder
from rag.run.output import format_table
from rag.run.pipeline import run
from rag.types import RagError
from tests.conftest import tiny_overrides


def test_v1_writes_scored_results(tiny_files, compose_cfg):
    cfg = compose_cfg(tiny_overrides(tiny_files) + ["+version=v1"])
    result = run(cfg, tiny_files["out"])
    out = tiny_files["out"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["variant"] == "v1"
    assert metrics["counts"]["questions"] == 6 and metrics["counts"]["documents"] == 9
    for m in ("recall_at_k", "mrr", "precision_at_k", "hit_at_k_id", "mrr_id"):
        o = metrics["metrics"][m]
        assert 0.0 <= o["ci95"][0] <= o["mean"] <= o["ci95"][1] <= 1.0
    assert "answer_gt" not in metrics["metrics"], "no generator: answer metrics are not reported"
    assert set(metrics["by_corpus"]) == {"libc", "pytorch", "pubmed"}
    # each question's own document is easy to find in a 9-document corpus
    assert metrics["metrics"]["hit_at_k_id"]["mean"] == 1.0
    rows = [json.loads(line) for line in (out / "per_question.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    assert rows[0]["retrieved"][0]["text"] and rows[0]["retrieved"][0]["chunk_id"].startswith(rows[0]["retrieved"][0]["doc_id"])
    assert (out / "config_resolved.yaml").exists()
    assert result["objective"] == {"name": "mrr", "value": metrics["metrics"]["mrr"]["mean"]}
    assert "recall@5 (sim)" in format_table(result)  # the metric's printed label (metrics.json keeps the key)


def test_every_run_names_each_embedder_roles_backend_and_why(tiny_files, compose_cfg, caplog):
    """backend: auto by default for both roles; the evaluation's is fp32's own vectors."""
    cfg = compose_cfg(tiny_overrides(tiny_files) + ["+version=v1"])
    with caplog.at_level(logging.INFO, logger="rag.run.pipeline"):
        metrics = run(cfg, tiny_files["out"])
    backends = metrics["backends"]
    assert set(backends) == {"embedder", "eval.embedder"} and backends["eval.embedder"]["precision"] == "fp32"
    said = [r.getMessage() for r in caplog.records if r.name == "rag.run.pipeline"]
    for role, note in backends.items():
        assert note["line"].startswith(f"{note['backend']} {note['precision']}")
        assert f"{role}: {note['line']}" in said
    used = candidate_named(f"{backends['embedder']['backend']} {backends['embedder']['precision']}")
    ident = SentenceTransformerEmbedder(cfg.embedder.model).id_for(used)
    assert metrics["artifacts"]["vectors"]["key"] == make_key(
        "vectors", ident, {"chunks": metrics["artifacts"]["chunks"]["key"]}), "keyed by the backend that made them"


def test_v2_filters_by_source_and_fuses(tiny_files, compose_cfg):
    cfg = compose_cfg(tiny_overrides(tiny_files) + ["+version=v2"])
    run(cfg, tiny_files["out"])
    rows = [json.loads(line) for line in (tiny_files["out"] / "per_question.jsonl").read_text().splitlines()]
    technical = {"libc", "pytorch"}
    for r in rows:
        sources = {c["doc_id"].split(":")[0] for c in r["retrieved"]}
        if r["corpus"] == "pubmed":
            assert sources == {"pmid"}
        else:
            assert sources <= {"man", "torch"}
    metrics = json.loads((tiny_files["out"] / "metrics.json").read_text())
    assert set(metrics["artifacts"]) >= {"chunks", "vectors", "index", "bm25"}
    assert technical


def test_second_run_reuses_every_artifact(tiny_files, compose_cfg):
    cfg = compose_cfg(tiny_overrides(tiny_files) + ["+version=v2"])
    first = run(cfg, tiny_files["out"] / "a")
    second = run(cfg, tiny_files["out"] / "b")
    assert not any(a["hit"] for a in first["artifacts"].values())
    assert all(a["hit"] for a in second["artifacts"].values())
    assert first["metrics"] == second["metrics"]


def test_fusion_change_reuses_vectors_and_indexes(tiny_files, compose_cfg):
    base = tiny_overrides(tiny_files) + ["retriever=hybrid", "fusion=weighted"]
    first = run(compose_cfg(base + ["fusion.alpha=0.3"]), tiny_files["out"] / "a")
    second = run(compose_cfg(base + ["fusion.alpha=0.7"]), tiny_files["out"] / "b")
    for kind in ("chunks", "vectors", "index", "bm25"):
        assert second["artifacts"][kind]["hit"], kind
        assert second["artifacts"][kind]["key"] == first["artifacts"][kind]["key"]


def test_chunk_size_change_rebuilds_chunks_and_vectors(tiny_files, compose_cfg):
    base = tiny_overrides(tiny_files)
    first = run(compose_cfg(base), tiny_files["out"] / "a")
    second = run(compose_cfg(base + ["chunker.chunk_size=200"]), tiny_files["out"] / "b")
    for kind in ("chunks", "vectors", "index"):
        assert not second["artifacts"][kind]["hit"], kind
        assert second["artifacts"][kind]["key"] != first["artifacts"][kind]["key"]


def test_question_naming_an_unknown_document_fails_before_work(tiny_files, compose_cfg):
    bad = tiny_files["qa"].parent / "bad_qa.jsonl"
    bad.write_text(json.dumps({"id": "x", "question": "q?", "answer": "a", "source": "man:nothing.2"}) + "\n")
    cfg = compose_cfg(tiny_overrides(tiny_files) + [f"qa.path={bad}"])
    with pytest.raises(RagError, match="man:nothing.2"):
        run(cfg, tiny_files["out"])
    assert not (tiny_files["out"] / "metrics.json").exists()


@pytest.mark.heavy
def test_run_py_entry_point(tiny_files):
    """Through Hydra's own entry point, as a user runs it; a bad value is one clear line."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    args = [sys.executable, str(PROJECT_ROOT / "run.py"), "+version=v1", f"hydra.run.dir={tiny_files['out']}"]
    args += tiny_overrides(tiny_files)
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "recall@5 (sim)" in done.stdout
    assert (tiny_files["out"] / "metrics.json").exists()

    bad = subprocess.run(args + ["fusion.alpha=1.5"], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode != 0
    assert "fusion.alpha must be in [0, 1], got 1.5" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_generation_adds_answer_metrics_and_caches_answers(tiny_files, compose_cfg):
    base = tiny_overrides(tiny_files) + ["llm=extractive", "reranker=mmr", "context.labels=true", "context.expand_neighbors=1"]
    first = run(compose_cfg(base), tiny_files["out"] / "a")
    for m in ("answer_gt", "grounding", "hallucination"):
        assert m in first["metrics"]
    assert -1.0 <= first["metrics"]["answer_gt"]["mean"] <= 1.0
    assert first["latency"]["generate_ms_median"] >= 0 and "rerank_ms_p95" in first["latency"]
    assert first["artifacts"]["answers"]["hit"] is False
    rows = [json.loads(line) for line in (tiny_files["out"] / "a" / "per_question.jsonl").read_text().splitlines()]
    assert all(r["answer"] and r["contexts"][0]["label"] for r in rows)
    # Changing only an evaluation threshold reuses the answers; changing the contexts does not.
    second = run(compose_cfg(base + ["eval.tau_h=0.3"]), tiny_files["out"] / "b")
    assert second["artifacts"]["answers"]["hit"] is True
    third = run(compose_cfg(base + ["context.expand_neighbors=0"]), tiny_files["out"] / "c")
    assert third["artifacts"]["answers"]["hit"] is False


def test_all_questions_preset_is_every_question_on_the_whole_corpus_retrieval_only(compose_cfg):
    for overrides in (["+preset=all_questions"], ["+version=v4", "+preset=all_questions"]):
        cfg = compose_cfg(overrides)
        assert cfg.slice.docs_per_source is None and cfg.slice.questions_per_corpus is None
        assert cfg.llm._target_ == "rag.llm.NoGenerator"
        assert cfg.qa._target_ == "rag.qa.mixed.MixedQuestions"


def test_answers_for_a_sample_retrieval_for_every_question(tiny_files, compose_cfg):
    """slice.answer_questions_per_corpus: answer metrics on the sample, retrieval on all, and the
    answered questions' scores equal those of a run that answers every question."""
    base = tiny_overrides(tiny_files) + ["+version=v1", "llm=extractive"]
    every = run(compose_cfg(base), tiny_files["out"] / "all")
    sample = run(compose_cfg(base + ["slice.answer_questions_per_corpus=1"]), tiny_files["out"] / "sample")
    assert sample["counts"]["questions"] == 6 and sample["counts"]["answered_questions"] == 3
    assert sample["metrics"]["mrr_id"]["n"] == 6 and sample["metrics"]["answer_gt"]["n"] == 3
    assert sample["metrics"]["mrr"] == every["metrics"]["mrr"]
    rows = {r["id"]: r for r in map(json.loads, (tiny_files["out"] / "sample" / "per_question.jsonl").read_text().splitlines())}
    full = {r["id"]: r for r in map(json.loads, (tiny_files["out"] / "all" / "per_question.jsonl").read_text().splitlines())}
    answered = [q for q, r in rows.items() if "answer" in r]
    assert len(answered) == 3 and len({rows[q]["corpus"] for q in answered}) == 3
    for q, r in rows.items():
        if q in answered:
            assert r["answer"] == full[q]["answer"] and r["answer_gt"] == full[q]["answer_gt"]
            assert "generate" in r["latency_ms"]
        else:
            assert r["answer_gt"] is None and r["hallucination"] is None and "generate" not in r["latency_ms"]
