"""Pooling: at the end of a sweep every eval.relevance=llm run is scored again on the labels of all
runs' judged chunks, so that no run is measured against only what it found itself."""
from __future__ import annotations

import json

import pytest

from experiments.pooling import main, pool_runs
from rag.run.pipeline import run
from tests.scripted_endpoint import ScriptedEndpoint
from tests.test_relevance import grader, judged


def rows(path):
    return {r["id"]: r for r in map(json.loads, (path / "per_question.jsonl").read_text().splitlines())}


def test_runs_are_rescored_on_the_labels_of_every_runs_judged_chunks(tmp_path, compose_cfg, tiny_files):
    with ScriptedEndpoint(chat=grader()) as srv:
        run(compose_cfg(judged(srv, tiny_files, "retriever=dense")), tmp_path / "dense")
        run(compose_cfg(judged(srv, tiny_files, "retriever=bm25", "chunker.chunk_size=60", "chunker.chunk_overlap=0")),
            tmp_path / "bm25")
        before = {name: rows(tmp_path / name) for name in ("dense", "bm25")}
        pairs = {(q, h["text"]) for r in before.values() for q, row in r.items() for h in row["retrieved"]}
        assert len(srv.chat_requests) == len(pairs), "a pair two runs retrieved was asked once"
    assert pool_runs([tmp_path / "dense", tmp_path / "bm25"]) == 2
    after = {name: rows(tmp_path / name) for name in ("dense", "bm25")}
    for q in after["dense"]:
        docs = {h["doc_id"] for r in before.values() for h in r[q]["retrieved"]}
        assert after["dense"][q]["labels"] == after["bm25"][q]["labels"], "one pool, one set of labels"
        assert {lab["doc"] for lab in after["dense"][q]["labels"]} == docs
        for name in after:
            for hit in after[name][q]["retrieved"]:
                best = max(lab["grade"] for lab in after[name][q]["labels"] if lab["doc"] == hit["doc_id"])
                assert hit["grade"] == best and hit["judge_grade"] == next(
                    h["judge_grade"] for h in before[name][q]["retrieved"] if h["text"] == hit["text"])
    for name in after:
        metrics = json.loads((tmp_path / name / "metrics.json").read_text())
        values = [r["ndcg_at_k"] for r in after[name].values() if r["ndcg_at_k"] is not None]
        assert metrics["metrics"]["ndcg_at_k"]["mean"] == sum(values) / len(values)
        assert metrics["metrics"]["ndcg_at_k"]["n"] == len(values)
        labels = metrics["provenance"]["labels"]
        assert labels["pooled_runs"] == 2 and labels["pairs"] == len(pairs) and labels["unjudged"] == 0
    files = {name: [(tmp_path / name / f).read_bytes() for f in ("per_question.jsonl", "metrics.json", "qrels.trec")]
             for name in after}
    assert main([str(tmp_path)]) == 0
    assert files == {name: [(tmp_path / name / f).read_bytes() for f in ("per_question.jsonl", "metrics.json",
                                                                          "qrels.trec")] for name in after}, \
        "pooling again changes nothing"


def test_runs_of_different_judges_are_not_pooled(tmp_path, compose_cfg, tiny_files, caplog):
    with ScriptedEndpoint(chat=grader()) as srv:
        run(compose_cfg(judged(srv, tiny_files)), tmp_path / "a")
        run(compose_cfg(judged(srv, tiny_files, "eval.relevance_judge.relevant_from=3")), tmp_path / "b")
    before = (tmp_path / "a" / "metrics.json").read_bytes()
    assert pool_runs([tmp_path / "a", tmp_path / "b"]) == 0
    assert "not pooled" in caplog.text and (tmp_path / "a" / "metrics.json").read_bytes() == before


@pytest.mark.heavy
def test_a_sweep_ends_with_its_runs_pooled_and_says_its_labels_are_an_llms(tmp_path, tiny_files):
    from tests.test_sweeps import multirun, sweep_overrides

    with ScriptedEndpoint(chat=grader()) as srv:
        sweep = tmp_path / "sweep"
        done = multirun(sweep_overrides(tiny_files) + [
            "chunker.chunk_size=120", "retriever=dense,bm25", "eval.latency.sample=0", "eval.relevance=llm",
            "llm@eval.relevance_judge.llm=openai", f"eval.relevance_judge.llm.base_url={srv.base_url}",
            "eval.relevance_judge.llm.model=judge"], sweep)
    labels = [json.loads((sweep / job / "metrics.json").read_text())["provenance"]["labels"] for job in ("0", "1")]
    assert labels[0] == labels[1] and labels[0]["pooled_runs"] == 2
    assert rows(sweep / "0")["q1"]["labels"] == rows(sweep / "1")["q1"]["labels"]
    assert "LLM relevance labels" in done.stdout and "LLM" in (sweep / "summary.md").read_text()


def test_an_interrupted_pooling_is_refused_by_readers_until_the_one_command_it_names_finishes_it(
        tmp_path, compose_cfg, tiny_files, monkeypatch, capsys):
    """Ctrl-C after the first run was rewritten: both runs stay marked pending (compare and the gate
    refuse them, naming the command), and that command leaves the files an uninterrupted pooling
    writes."""
    import shutil

    import experiments.pooling as pooling
    from experiments.compare import main as compare
    from experiments.gate import main as gate
    from rag.run.rundir import POOLING_PENDING, Unfinished

    runs = [tmp_path / "dense", tmp_path / "bm25"]
    with ScriptedEndpoint(chat=grader()) as srv:
        run(compose_cfg(judged(srv, tiny_files, "retriever=dense")), runs[0])
        run(compose_cfg(judged(srv, tiny_files, "retriever=bm25", "chunker.chunk_size=60", "chunker.chunk_overlap=0")),
            runs[1])
    whole = [shutil.copytree(r, tmp_path / "whole" / r.name) for r in runs]
    assert pool_runs(whole) == 2
    real = pooling.rescore

    def stopped_after_the_first(run, labels, stats):
        if run.path != runs[0]:
            raise KeyboardInterrupt
        real(run, labels, stats)

    monkeypatch.setattr(pooling, "rescore", stopped_after_the_first)
    with pytest.raises(Unfinished) as stopped:
        pool_runs(runs)
    command = f"python -m experiments.pooling {runs[0]} {runs[1]}"
    assert stopped.value.left == (f"2 runs are marked pooling pending ({POOLING_PENDING}); their per_question.jsonl "
                                  f"and metrics.json may disagree until: {command}")
    assert all((r / POOLING_PENDING).exists() for r in runs)
    capsys.readouterr()
    line = (f"{runs[0]}: pooling its relevance labels was interrupted ({POOLING_PENDING}), so its per_question.jsonl "
            f"and metrics.json may disagree; finish it with: {command}")
    assert compare([str(tmp_path / "dense"), str(tmp_path / "bm25"), "--out", str(tmp_path / "cmp")]) == 2
    assert capsys.readouterr().err == f"compare: error: {line}\n" and not (tmp_path / "cmp").exists()
    assert gate([str(runs[0]), str(whole[0]), "--metric", "ndcg_at_k", "--min-effect", "0"]) == 2
    assert capsys.readouterr().err == f"gate: error: {line}\n"

    monkeypatch.setattr(pooling, "rescore", real)
    assert main([str(r) for r in runs]) == 0  # the command, as named
    assert not any((r / POOLING_PENDING).exists() for r in runs)
    for r, w in zip(runs, whole):
        for name in ("per_question.jsonl", "metrics.json", "qrels.trec"):
            assert (r / name).read_bytes() == (w / name).read_bytes(), (r.name, name)


def test_an_interrupted_sweep_says_what_it_left_unfinished_and_not_that_nothing_was(monkeypatch, capsys):
    import run as entry
    from rag.run.rundir import Unfinished

    def interrupted() -> None:
        raise Unfinished("2 runs are marked pooling pending (pooling_pending.json); their per_question.jsonl and "
                         "metrics.json may disagree until: python -m experiments.pooling outputs/multirun/x")

    monkeypatch.setattr(entry, "main", interrupted)
    monkeypatch.setattr("sys.argv", ["run.py", "-m", "eval.relevance=llm"])
    assert entry.cli() == 130
    err = capsys.readouterr().err
    assert err.startswith("ragrig: interrupted; 2 runs are marked pooling pending") and "nothing half-written" not in err
