"""Every command-line entry point (run.py, rag.ask, experiments.compare/aggregate, the benchmark
CLIs) turns a user error into one line and exit status 2, and Ctrl-C into a short message, exit
status 130 and no half-written files. Each case runs the real command in a subprocess."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rag.config.compose import PROJECT_ROOT
from tests.conftest import tiny_overrides
from tests.test_experiments import write_run

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def command(args: list[str], timeout: int = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=PROJECT_ROOT,
                          env=env or ENV, timeout=timeout)


def error_lines(stderr: str) -> list[str]:
    """stderr without log records and progress bars: what the user is told."""
    return [ln for ln in stderr.splitlines()
            if ln.strip() and not ln.startswith(("[20", "INFO ", "WARNING ")) and "%|" not in ln]


def assert_one_line(done: subprocess.CompletedProcess, expect: str, status: int = 2) -> None:
    lines = error_lines(done.stderr)
    assert done.returncode == status, done.stderr[-3000:]
    assert len(lines) == 1 and expect in lines[0], lines
    assert "Traceback" not in done.stderr


# ---- run.py: Hydra's own errors (composing the config, creating the run directory) ------------

@pytest.mark.parametrize("extra,expect", [
    (["eval.kk=3"], "ragrig: error: Could not override 'eval.kk': 'eval' has no key 'kk' (did you mean k?); its keys: embedder, judge, relevance_judge, k,"),
    # a misspelt key names the node, the nearest keys and every key it has
    (["chunker.chunk_sise=10"], "ragrig: error: Could not override 'chunker.chunk_sise': 'chunker' has no key 'chunk_sise' "
                                "(did you mean chunk_size or chunk_overlap?); its keys: chunk_size, chunk_overlap, contextualize. "
                                "To add a new key use +chunker.chunk_sise="),
    (["retriver=hybrid"], "ragrig: error: Could not override 'retriver': the config has no key 'retriver' (did you mean retriever"),
    (["retriever.source_filter.mod=fixed"], "'retriever.source_filter' has no key 'mod' (did you mean mode?); its keys: mode, groups,"),
    (["+chunker.chunk_sise=10"], "ragrig: error: chunker.chunk_sise is not a setting of SlidingWindowChunker (did you mean "
                                 "chunk_size or chunk_overlap?); its settings: chunk_size, chunk_overlap"),
    (["+embedder.batchsize=8"], "embedder.batchsize is not a setting of SentenceTransformerEmbedder (did you mean batch_size?)"),
    (["+version=v5"], "ragrig: error: Could not find 'version/v5' (available: v1, v2, v3, v4)"),
    (["retriever=hybird"], "ragrig: error: Could not find 'retriever/hybird' (available: bm25, dense, hybrid)"),
    (["eval.k=[1,"], "ragrig: error: override 'eval.k=[1,': no viable alternative at input '[1,' (quote a value"),
    (["sweep=nope"], "ragrig: error: Could not find 'sweep/nope' (available: alpha, chunk_alpha, demo, optuna, techniques, versions)"),
    (["+version=v9"], "ragrig: error: Could not find 'version/v9' (available: v1, v2, v3, v4)"),
    (["corpus.path=/data/a,b/c.jsonl"], "ragrig: error: Ambiguous value for argument 'corpus.path=/data/a,b/c.jsonl'"),
    (["corpus.path=/data/docs (copy)/c.jsonl"], "mismatched input ' (' expecting <EOF> (quote a value holding any of"),
    # a setting added to an option that takes none: one line, as for a setting a component lacks
    (["+llm.max_tokens=32"], "ragrig: error: llm.max_tokens is not a setting of NoGenerator, which takes none"),
    (["reranker=none", "+reranker.top_n=5"], "ragrig: error: reranker.top_n is not a setting of NoReranker, which takes none"),
    (["compressor=none", "+compressor.k=5"], "ragrig: error: compressor.k is not a setting of NoCompressor, which takes none"),
])
def test_run_py_config_errors_are_one_line(extra, expect, tiny_files):
    done = command([str(PROJECT_ROOT / "run.py"), f"hydra.run.dir={tiny_files['out']}", *tiny_overrides(tiny_files), *extra])
    assert_one_line(done, expect)
    assert not (tiny_files["out"] / "metrics.json").exists()


def test_run_dir_that_is_a_file_is_one_line(tiny_files, tmp_path):
    blocker = tmp_path / "taken"
    blocker.write_text("a file")
    done = command([str(PROJECT_ROOT / "run.py"), f"hydra.run.dir={blocker}", *tiny_overrides(tiny_files)])
    assert_one_line(done, f"ragrig: error: {blocker}: File exists (check hydra.run.dir / hydra.sweep.dir)")


# ---- rag.ask -----------------------------------------------------------------------------------

def test_ask_keeps_a_question_with_equals_signs(tiny_files):
    done = command(["-m", "rag.ask", "What does a == b mean?", *tiny_overrides(tiny_files), "+version=v1"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Q: What does a == b mean?" in done.stdout


@pytest.mark.parametrize("extra,expect", [
    (["q?", "chunker=nope"], "ragrig ask: error: Could not find 'chunker/nope' (available: paragraph, per_source, recursive"),
    (["--corpus", "other", "q?", "+version=v2", "retriever.source_filter.mode=question"],
     "ragrig ask: error: retriever.source_filter (mode=question): corpus tag 'other' (--corpus 'other') is in no group"),
    (["q?", "eval.k=2.5"], "ragrig ask: error: eval.k must be an integer, got 2.5"),
    (["q?", "eval.kk=1"], "ragrig ask: error: Could not override 'eval.kk': 'eval' has no key 'kk' (did you mean k?)"),
])
def test_ask_errors_are_one_line(extra, expect, tiny_files):
    done = command(["-m", "rag.ask", *extra, *tiny_overrides(tiny_files)])
    assert_one_line(done, expect)


# ---- experiments.compare / aggregate -------------------------------------------------------------

def good_run(path: Path) -> Path:
    return write_run(path, variant="v1", values={"mrr": [0.1, 0.5, 0.9], "recall_at_k": [0, 1, 1]})


@pytest.mark.parametrize("extra,expect", [
    (["--formats", "png,jpgx"], "argument --formats: unknown chart format(s) ['jpgx']"),
    (["--resamples", "0"], "argument --resamples: must be a positive integer, got 0"),
    (["--seed", "-1"], "argument --seed: must be an integer >= 0, got -1"),
])
def test_compare_rejects_bad_options_before_work(extra, expect, tmp_path):
    done = command(["-m", "experiments.compare", str(good_run(tmp_path / "r")), "--out", str(tmp_path / "cmp"), *extra])
    assert done.returncode == 2 and expect in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "cmp").exists()


def printed_paths(stdout: str, root: Path) -> list[Path]:
    """Every path under `root` that a command printed (a word of its output)."""
    words = (w.strip("`'\",;()") for w in stdout.split())
    return [Path(w) for w in words if w.startswith(str(root))]


def test_every_path_compare_prints_exists_after_it_ends(tmp_path):
    """Issue 25 #2: the closing summary:/charts:/report: lines named the staging directory that
    had already been renamed into place."""
    good_run(tmp_path / "runs" / "a")
    write_run(tmp_path / "runs" / "b", variant="v2", values={"mrr": [0.2, 0.6, 0.8], "recall_at_k": [1, 1, 1]})
    done = command(["-m", "experiments.compare", str(tmp_path / "runs"), "--out", str(tmp_path / "cmp")])
    assert done.returncode == 0, done.stderr[-3000:]
    paths = printed_paths(done.stdout, tmp_path)
    for label in ("summary:", "charts:", "report:"):
        assert label in done.stdout
    assert len(paths) >= 6 and all(p.exists() for p in paths), [str(p) for p in paths if not p.exists()]
    assert not list(tmp_path.glob(".compare-*")), "the staging directory is gone"


def test_a_comparison_into_a_reused_out_leaves_nothing_of_the_earlier_one(tmp_path):
    good_run(tmp_path / "runs" / "a")
    write_run(tmp_path / "runs" / "b", variant="v2", values={"mrr": [0.2, 0.6, 0.8], "recall_at_k": [1, 1, 1]})
    first = command(["-m", "experiments.compare", str(tmp_path / "runs"), "--out", str(tmp_path / "cmp")])
    assert first.returncode == 0 and (tmp_path / "cmp" / "charts").is_dir() and (tmp_path / "cmp" / "report.html").exists()
    second = command(["-m", "experiments.compare", str(tmp_path / "runs" / "a"), "--out", str(tmp_path / "cmp"),
                      "--no-charts", "--no-html"])
    assert second.returncode == 0, second.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "cmp").iterdir() if not p.name.startswith(".")) == [
        "comparison.csv", "summary.csv", "summary.md"]  # (and the list of them: .ragrig_report.json)
    assert "held an earlier comparison" in second.stderr


def test_compare_out_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    done = command(["-m", "experiments.compare", str(good_run(tmp_path / "r")), "--out", str(tmp_path / "file")])
    assert_one_line(done, f"compare: error: --out {tmp_path / 'file'} is a file, not a directory")


def test_aggregate_missing_directory_is_one_line(tmp_path):
    done = command(["-m", "experiments.aggregate", str(tmp_path / "nothing")])
    assert_one_line(done, f"aggregate: error: no such run directory: {tmp_path / 'nothing'}")


def test_corrupted_result_files_are_failed_runs_not_tracebacks(tmp_path):
    good_run(tmp_path / "runs" / "ok")
    broken = tmp_path / "runs" / "failed-json"
    broken.mkdir(parents=True)
    (broken / "failure.json").write_text('{"broken')
    bad_rows = good_run(tmp_path / "runs" / "bad-rows")
    (bad_rows / "per_question.jsonl").write_text('{"id": "q0", "mrr": 0.1}\n{"id": "q1", "mrr\n')
    done = command(["-m", "experiments.compare", str(tmp_path / "runs"), "--out", str(tmp_path / "cmp"), "--no-charts"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "3 runs (2 failed)" in done.stdout
    summary = (tmp_path / "cmp" / "summary.csv").read_text()
    assert "unreadable failure.json" in summary and "unreadable per_question.jsonl, line 2" in summary


def test_compare_interrupted_leaves_no_report(tmp_path, monkeypatch):
    from experiments import compare

    def interrupted(records, out_dir, settings, source=""):
        (Path(out_dir) / "summary.csv").write_text("half")
        raise KeyboardInterrupt

    monkeypatch.setattr(compare, "build_report", interrupted)
    out = tmp_path / "cmp"
    assert compare.main([str(good_run(tmp_path / "r")), "--out", str(out)]) == 130
    assert not out.exists() and not list(tmp_path.glob(".compare-*"))


# ---- benchmarks ------------------------------------------------------------------------------

def test_benchmarks_out_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    done = command(["-m", "benchmarks", "--only", "bm25", "--out", str(tmp_path / "file")])
    assert_one_line(done, f"benchmarks: error: --out {tmp_path / 'file'}")


@pytest.mark.parametrize("override,expect", [
    ("eval.k=2.5", "benchmarks: error: eval.k must be an integer, got 2.5"),
    ("chunker=nope", "benchmarks: error: Could not find 'chunker/nope'"),
])
def test_bench_checks_its_overrides_before_any_benchmark(override, expect, tmp_path):
    done = command(["-m", "benchmarks", "--only", "alpha_sweep", "--out", str(tmp_path / "b"), "--",
                    override])
    assert_one_line(done, expect)
    assert not (tmp_path / "b" / "alpha_sweep").exists()


# ---- interrupts ------------------------------------------------------------------------------

def test_ctrl_c_mid_run_is_one_line_130_and_leaves_nothing_half_written(tiny_files):
    """SIGINT while the vectors are being built (held open by the crash-test hook): the run stops
    with one line, no results, and no half-built artifact in the cache."""
    env = {**ENV, "RAGRIG_TEST_PAUSE_BEFORE_PUBLISH": "vectors:120"}
    out = tiny_files["out"]
    # A test process started in the background by a non-interactive shell inherits SIGINT ignored,
    # and Python keeps an ignored SIGINT ignored: the run gets the disposition a terminal gives it.
    proc = subprocess.Popen([sys.executable, str(PROJECT_ROOT / "run.py"), f"hydra.run.dir={out}", *tiny_overrides(tiny_files)],
                            cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    vectors = tiny_files["cache"] / "vectors"
    deadline = time.time() + 240
    while time.time() < deadline and not list(vectors.glob("tmp-*")):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=180)  # generous: a loaded machine delays the handler
    assert proc.returncode == 130, stderr[-3000:]
    assert error_lines(stderr) == ["ragrig: interrupted; nothing half-written was left"]
    assert not (out / "metrics.json").exists() and not (out / "per_question.jsonl").exists()
    assert not list(vectors.glob("tmp-*")) and not any(p.is_dir() for p in vectors.iterdir() if not p.name.startswith("."))


def test_results_interrupted_while_written_are_removed(tmp_path, monkeypatch):
    from rag.run import output

    real = output.atomic_write_text

    def write(path, text):
        if Path(path).name == "metrics.json":
            raise KeyboardInterrupt
        real(path, text)

    monkeypatch.setattr(output, "atomic_write_text", write)
    with pytest.raises(KeyboardInterrupt):
        output.write_results(tmp_path, {"config": {"a": 1}}, [{"id": "q1"}])
    assert list(tmp_path.iterdir()) == []


def test_every_entry_point_answers_help():
    for module in ("rag.ask", "experiments.compare", "experiments.aggregate", "benchmarks"):
        done = command(["-m", module, "--help"], timeout=120)
        assert done.returncode == 0 and "usage" in done.stdout.lower(), (module, done.stderr[-2000:])


# ---- a reader that stops early (| head -1, | grep -q) ------------------------------------------

def to_closed_pipe(args: list[str], env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """The command with its stdout a pipe whose reader has gone, as under `| head -1` once head has
    its line: every write to stdout meets a closed pipe."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, *args], stdout=write, stderr=subprocess.PIPE, text=True,
                              cwd=PROJECT_ROOT, env={**ENV, **(env or {})}, timeout=timeout)
    finally:
        os.close(write)


UNBUFFERED = {"PYTHONUNBUFFERED": "1"}  # as CI runners often set it: every print meets the pipe at once


def entry_points() -> dict[str, Path]:
    """Every command line ragrig has, found rather than listed: run.py, each module under rag/,
    eval/, experiments/ and benchmarks/ with an `if __name__ == "__main__":` block, and each
    package's __main__.py. Name (what `python -m` takes, or run.py) -> file."""
    import re

    found = {"run.py": PROJECT_ROOT / "run.py"}
    for top in ("rag", "eval", "experiments", "benchmarks"):
        for f in sorted((PROJECT_ROOT / top).rglob("*.py")):
            if f.name == "__main__.py" or re.search(r"^if __name__ == ['\"]__main__['\"]:", f.read_text(), re.M):
                parts = f.relative_to(PROJECT_ROOT).with_suffix("").parts
                found[".".join(parts[:-1] if f.name == "__main__.py" else parts)] = f
    return found


ENTRY_POINTS = entry_points()


def _calls_run_cli(nodes: list) -> bool:
    import ast

    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "run_cli"
               for stmt in nodes for n in ast.walk(stmt))


def _main_block(tree) -> list:
    import ast

    for stmt in tree.body:
        if (isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Compare) and isinstance(stmt.test.left, ast.Name)
                and stmt.test.left.id == "__name__"):
            return list(stmt.body)
    return []


def test_the_entry_points_are_found_not_listed():
    assert {"run.py", "experiments.aggregate", "benchmarks", "rag.ask", "rag.testset", "rag.reranker.training",
            "benchmarks.generation", "experiments.metric_info"} <= set(ENTRY_POINTS)


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_every_entry_point_goes_through_the_shared_handler(name):
    """rag.config.cli.run_cli is what keeps a closed pipe from ending in a traceback: every command line
    calls it, from its `__main__` block (or, for a package's __main__.py, anywhere at its top)."""
    import ast

    tree = ast.parse(ENTRY_POINTS[name].read_text())
    body = tree.body if ENTRY_POINTS[name].name == "__main__.py" else _main_block(tree)
    assert _calls_run_cli(body), f"{name}: its entry point does not call rag.config.cli.run_cli"


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_every_entry_point_survives_a_closed_pipe(name):
    entry = [str(ENTRY_POINTS[name])] if name == "run.py" else ["-m", name]
    done = to_closed_pipe([*entry, "--help"], env=UNBUFFERED, timeout=120)
    assert done.returncode == 0 and done.stderr == "", (entry, done.stderr[-2000:])


def test_aggregate_and_the_benchmark_list_behind_head_exit_0_without_a_traceback(tmp_path):
    good_run(tmp_path / "runs" / "a")
    write_run(tmp_path / "runs" / "b", variant="v2", values={"mrr": [0.2, 0.6, 0.8], "recall_at_k": [1, 1, 1]})
    for args in (["-m", "experiments.aggregate", str(tmp_path / "runs")], ["-m", "benchmarks", "--list"]):
        done = to_closed_pipe(args, env=UNBUFFERED, timeout=120)
        assert done.returncode == 0 and "BrokenPipeError" not in done.stderr and "Traceback" not in done.stderr, \
            (args, done.stderr[-2000:])


def test_compare_behind_a_closed_pipe_writes_its_report_and_exits_0(tmp_path):
    good_run(tmp_path / "runs" / "a")
    write_run(tmp_path / "runs" / "b", variant="v2", values={"mrr": [0.2, 0.6, 0.8], "recall_at_k": [1, 1, 1]})
    done = to_closed_pipe(["-m", "experiments.compare", str(tmp_path / "runs"), "--out", str(tmp_path / "cmp"),
                           "--no-charts"], env=UNBUFFERED)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert (tmp_path / "cmp" / "summary.md").exists() and (tmp_path / "cmp" / "report.html").exists()


def test_seed_behind_a_closed_pipe_writes_its_index_and_exits_0(tmp_path):
    (tmp_path / "cache").mkdir()
    done = to_closed_pipe(["-m", "rag.store.seed", str(tmp_path / "cache"), "--out", str(tmp_path / "seed")], env=UNBUFFERED)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert (tmp_path / "seed" / "SEED.json").exists()


def test_a_corpus_export_behind_a_closed_pipe_writes_its_jsonl_and_exits_0(tiny_files, tmp_path):
    done = to_closed_pipe(["-m", "rag.corpus.export", "--out", str(tmp_path / "corpora"), "jsonl",
                           f"corpus.path={tiny_files['corpus']}", f"paths.cache={tiny_files['cache']}"], env=UNBUFFERED)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    exported = (tmp_path / "corpora" / "jsonl.jsonl").read_text().splitlines()
    assert len(exported) == len(tiny_files["corpus"].read_text().splitlines())


def test_a_corpus_export_with_an_unknown_corpus_is_one_line(tmp_path):
    done = command(["-m", "rag.corpus.export", "--out", str(tmp_path / "corpora"), "nope"], timeout=120)
    assert_one_line(done, "ragrig data: error: Could not find 'corpus/nope' (available: beir, jsonl,")


@pytest.mark.heavy
def test_a_run_and_a_question_behind_a_closed_pipe_finish_with_status_0(tiny_files):
    done = to_closed_pipe([str(PROJECT_ROOT / "run.py"), f"hydra.run.dir={tiny_files['out']}",
                           *tiny_overrides(tiny_files)], env=UNBUFFERED)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert (tiny_files["out"] / "metrics.json").exists()
    asked = to_closed_pipe(["-m", "rag.ask", "What does O_NONBLOCK do?", *tiny_overrides(tiny_files)], env=UNBUFFERED)
    assert asked.returncode == 0 and "Traceback" not in asked.stderr, asked.stderr[-3000:]


# ---- the command line's contract: named inputs, help a newcomer can start from ------------------

def test_compare_refuses_a_directory_with_no_run_beside_real_runs(tmp_path):
    (tmp_path / "typo").mkdir()
    done = command(["-m", "experiments.compare", str(good_run(tmp_path / "r")), str(tmp_path / "typo"),
                    "--out", str(tmp_path / "cmp")])
    assert_one_line(done, f"compare: error: {tmp_path / 'typo'}: no run in or below it (no metrics.json or "
                          "failure.json); give run directories, sweep directories or their parents")
    assert not (tmp_path / "cmp").exists()


def test_run_py_help_is_a_newcomers_help():
    done = command([str(PROJECT_ROOT / "run.py"), "--help"], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    text = done.stdout
    for needed in ("usage:", "python run.py +version=v3", "python run.py -m sweep=demo",
                   "python run.py -m chunker.chunk_size=256,512 fusion.alpha=0.3,0.7",
                   "corpus=jsonl corpus.path=my_docs.jsonl qa=jsonl qa.path=my_questions.jsonl",
                   "outputs/runs/<date>/", "outputs/multirun/<date>/", "README.md",
                   "python run.py --hydra-help", "python run.py --cfg job", "retriever: bm25, dense, hybrid"):
        assert needed in text, needed
    codes = text.split("exit status:", 1)[1].split("\n\n", 1)[0]
    assert [ln.split()[0] for ln in codes.strip().splitlines()] == ["0", "2", "130", "1"]
    assert "_target_" not in text and len(text.splitlines()) < 80  # not the whole config
    hydras = command([str(PROJECT_ROOT / "run.py"), "--hydra-help"], timeout=120)
    assert hydras.returncode == 0 and "== Flags ==" in hydras.stdout


@pytest.mark.parametrize("module", ["experiments.gate", "experiments.compare", "rag.ask"])
def test_every_option_has_help_and_shows_its_default(module):
    import argparse
    import importlib

    parser = importlib.import_module(module).parser()
    assert "exit status:" in parser.format_help().lower()
    shown = parser._get_formatter()._get_help_string  # the text --help prints for an option
    for action in parser._actions:
        assert action.help, (module, action.dest)
        if action.option_strings and not isinstance(action, (argparse._HelpAction, argparse._StoreTrueAction)):
            assert "(default" in shown(action) or action.required, (module, action.option_strings, shown(action))
