"""`import ragrig`: the Python API runs a configuration, loads a run, asks a session and compares
runs, with the command line's results and one-line errors."""
from __future__ import annotations

import json

import pandas as pd
import pytest

import ragrig
from tests.conftest import tiny_overrides


def test_the_stable_surface_is_what_the_package_exports():
    assert set(ragrig.__all__) == {"Answer", "Comparison", "RagError", "Run", "Session", "compare", "compose",
                                  "load_run", "open_session", "run"}
    assert ragrig.RagError is __import__("rag.types", fromlist=["RagError"]).RagError


def test_compose_gives_the_command_lines_configuration():
    cfg = ragrig.compose(["+version=v3", "eval.k=3"])
    assert cfg.variant == "v3" and cfg.eval.k == 3 and cfg.reranker._target_.endswith("CrossEncoderReranker")


@pytest.mark.parametrize("override, words", [
    ("+version=v9", "v9"),                # an unknown group option
    ("eval.kk=3", "eval.kk"),             # a key that does not exist
    ("eval.k=[", "eval.k=["),             # an override that does not parse
])
def test_a_bad_override_is_one_line(override, words):
    with pytest.raises(ragrig.RagError) as e:
        ragrig.compose([override])
    line = str(e.value)
    assert "\n" not in line and words in line


def test_run_returns_the_finished_run_and_writes_what_the_command_line_writes(tiny_files):
    out = tiny_files["out"] / "v1"
    run = ragrig.run(tiny_overrides(tiny_files) + ["+version=v1"], output_dir=out)
    assert isinstance(run, ragrig.Run) and run.path == out and run.variant == "v1"
    metrics = json.loads((out / "metrics.json").read_text())
    assert run.metrics["mrr"] == metrics["metrics"]["mrr"]["mean"]
    assert run.result.objective.name == "mrr" and run.config["variant"] == "v1"
    table = run.per_question()
    assert isinstance(table, pd.DataFrame) and len(table) == 6 and {"id", "mrr", "recall_at_k"} <= set(table.columns)
    assert (out / "run.trec").exists() and (out / "config_resolved.yaml").exists()
    assert ragrig.load_run(out).result == run.result


def test_run_refuses_a_dry_run_and_a_bad_setting_in_one_line(tiny_files):
    with pytest.raises(ragrig.RagError, match="dry_run"):
        ragrig.run(tiny_overrides(tiny_files) + ["dry_run=true"], output_dir=tiny_files["out"] / "dry")
    with pytest.raises(ragrig.RagError, match="eval.k"):
        ragrig.run(tiny_overrides(tiny_files) + ["eval.k=0"], output_dir=tiny_files["out"] / "bad")


def test_load_run_names_a_directory_that_holds_no_run(tmp_path):
    with pytest.raises(ragrig.RagError, match="no metrics.json"):
        ragrig.load_run(tmp_path)
    (tmp_path / "metrics.json").write_text('{"dry_run": true}')
    with pytest.raises(ragrig.RagError, match="dry run"):
        ragrig.load_run(tmp_path)


def test_a_session_answers_questions_with_contexts_and_checks_its_corpus_tag(tiny_files):
    with ragrig.open_session(tiny_overrides(tiny_files) + ["+version=v2"]) as session:
        assert session.variant == "v2" and session.chunks > 9
        got = session.ask("Why was the fcntl64 system call added?", corpus="libc")
        assert isinstance(got, ragrig.Answer) and got.answer is None  # llm=none: retrieval only
        assert got.contexts and got.contexts[0].label == "man:fcntl.2"
        assert set(got.latency_ms) == {"retrieve", "rerank", "generate"}
        with pytest.raises(ragrig.RagError, match="libcc"):
            session.ask("anything", corpus="libcc")
        with pytest.raises(ragrig.RagError, match="empty"):
            session.ask("   ")


def test_compare_gives_the_table_and_the_verdict(tiny_files):
    base = tiny_overrides(tiny_files)
    v1 = ragrig.run(base + ["+version=v1"], output_dir=tiny_files["out"] / "v1")
    v2 = ragrig.run(base + ["+version=v2"], output_dir=tiny_files["out"] / "v2")
    cmp = ragrig.compare([v1, v2.path], out_dir=tiny_files["out"] / "cmp", charts=False)
    assert cmp.baseline == "v1" and list(cmp.table["variant"]) == ["v1", "v2"]
    assert cmp.verdict and "v2" in cmp.verdict
    assert (cmp.out_dir / "summary.md").exists() and cmp.out_dir / "summary.csv" in cmp.files
    assert "baseline" in str(cmp).lower() or "v1" in str(cmp)


def test_compare_never_writes_into_a_folder_that_holds_other_files(tiny_files):
    v1 = ragrig.run(tiny_overrides(tiny_files) + ["+version=v1"], output_dir=tiny_files["out"] / "v1")
    mine = tiny_files["out"] / "figures"
    mine.mkdir()
    (mine / "figure1_final.png").write_bytes(b"mine")
    with pytest.raises(ragrig.RagError, match="not an empty directory"):
        ragrig.compare([v1], out_dir=mine)
    assert [p.name for p in mine.iterdir()] == ["figure1_final.png"]
    with pytest.raises(ragrig.RagError, match="figures: no run in or below it"):
        ragrig.compare([tiny_files["out"] / "figures"])
    with pytest.raises(ragrig.RagError, match="figures: no run in or below it"):
        ragrig.compare([v1, tiny_files["out"] / "figures"])  # beside a real run, not dropped


def test_a_session_on_your_own_corpus_needs_no_question_set(tiny_files):
    from tests.conftest import MODEL_CACHE

    overrides = ["corpus=jsonl", f"corpus.path={tiny_files['corpus']}", f"paths.cache={tiny_files['cache']}",
                 f"paths.model_cache={MODEL_CACHE}", "embedder.show_progress=false"]
    with ragrig.open_session(overrides) as session:
        got = session.ask("How does AdamW apply weight decay?")
    assert got.contexts[0].label == "torch:torch.optim.AdamW"


# ---- a string where a list belongs; a run without its per-question file --------------------------

@pytest.mark.parametrize("call, expect", [
    (lambda: ragrig.run("+version=v1"), "overrides must be a list, e.g. ['+version=v1']; got str '+version=v1'"),
    (lambda: ragrig.compose("eval.k=3"), "overrides must be a list, e.g. ['+version=v1']; got str 'eval.k=3'"),
    (lambda: ragrig.open_session("+version=v1").__enter__(), "overrides must be a list"),
    (lambda: ragrig.compare("outputs/runs"), "runs must be a list, e.g. ['outputs/a', 'outputs/b'] (run directories, "
                                             "sweep directories or Run objects); got str 'outputs/runs'"),
    (lambda: ragrig.compare(__import__("pathlib").Path("outputs/runs")), "runs must be a list, e.g. ['outputs/a'"),
    (lambda: ragrig.compare(b"outputs/runs"), "runs must be a list"),
])
def test_a_string_given_where_a_list_belongs_is_a_type_error_saying_what_to_pass(call, expect):
    with pytest.raises(TypeError) as e:
        call()
    assert str(e.value).startswith(expect)


def test_compare_given_one_run_object_asks_for_a_list(tmp_path):
    from tests.test_experiments import write_run

    run = ragrig.load_run(write_run(tmp_path / "a", values={"mrr": [0.1, 0.2]}))
    with pytest.raises(TypeError, match=r"^runs must be a list, e.g. \['outputs/a', 'outputs/b'\].*; got Run"):
        ragrig.compare(run)


def test_per_question_of_a_run_without_the_file_or_with_a_bad_line_is_a_rag_error(tmp_path):
    from tests.test_experiments import write_run

    path = write_run(tmp_path / "a", values={"mrr": [0.1, 0.2]})
    run = ragrig.load_run(path)
    assert list(run.per_question()["mrr"]) == [0.1, 0.2]
    (path / "per_question.jsonl").write_text('{"id": "q0", "mrr": 0.1}\n{"id": "q1", "mrr": Infinity}\n')
    with pytest.raises(ragrig.RagError) as e:
        run.per_question()
    assert str(e.value) == f"{path}: unreadable per_question.jsonl, line 2: Infinity at mrr, not a finite number"
    (path / "per_question.jsonl").unlink()
    with pytest.raises(ragrig.RagError) as e:
        run.per_question()
    assert str(e.value) == f"{path / 'per_question.jsonl'}: no such file (the run wrote no per-question records)"


def test_the_api_docstrings_examples_run():
    """The `>>>` examples of ragrig.api's docstrings (the API reference page shows them) give what
    they say."""
    import doctest

    import ragrig.api

    result = doctest.testmod(ragrig.api, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 1 and result.failed == 0
