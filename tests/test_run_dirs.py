"""Results are never lost or mixed: every run gets its own directory (also runs started in the same
second), a directory in use is refused, a rerun into a fixed directory leaves no stale results, a
sweep's summary covers exactly its own jobs (also in a reused sweep directory), and a sweep whose
jobs all failed exits non-zero. Real commands in subprocesses on the tiny corpus (rag/run/rundir.py)."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from rag.config.compose import PROJECT_ROOT
from rag.run.pipeline import run
from rag.run.rundir import LOCK_FILE, RESULT_FILES, RUN_MARKER, SWEEP_STAMP
from tests.conftest import TINY_DOCS, tiny_overrides
from tests.test_cli_errors import ENV, assert_one_line, error_lines, printed_paths

RUN = str(PROJECT_ROOT / "run.py")


def start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, RUN, *args], cwd=PROJECT_ROOT, env=env or ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=400)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_py(args: list[str]) -> subprocess.CompletedProcess:
    return finish(start(args))


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> dict[str, Path]:
    """The tiny files and a cache warmed once, shared by the module's runs."""
    root = tmp_path_factory.mktemp("rundirs")
    from tests.conftest import TINY_QA, write_jsonl

    files = {
        "corpus": write_jsonl(root / "corpus.jsonl", [{"id": i, "text": t, "source": s} for i, s, t in TINY_DOCS]),
        "qa": write_jsonl(root / "qa.jsonl", [{"id": i, "question": q, "answer": a, "source": s, "corpus": c}
                                             for i, q, a, s, c in TINY_QA]),
        "cache": root / "cache", "out": root / "warm-out", "root": root,
    }
    done = run_py([f"hydra.run.dir={files['out']}", *tiny_overrides(files), "retriever=hybrid"])
    assert done.returncode == 0, done.stderr[-3000:]
    return files


@pytest.mark.heavy
def test_runs_started_together_never_share_a_directory(warm, tmp_path):
    """The issue's reproduction: two runs started in the same second with the default run dir
    (under paths.root); each reports its own directory holding its own results and log."""
    procs = {k: start([f"paths.root={tmp_path}", *tiny_overrides(warm), "retriever=hybrid", f"eval.k={k}"]) for k in (3, 4)}
    done = {k: finish(p) for k, p in procs.items()}
    dirs = {}
    for k, d in done.items():
        assert d.returncode == 0, d.stderr[-3000:]
        dirs[k] = Path(d.stdout.strip().splitlines()[-1].removeprefix("results: "))
    assert dirs[3] != dirs[4] and dirs[3].parent == dirs[4].parent == tmp_path / "outputs" / "runs" / dirs[3].parent.name
    for k, d in dirs.items():
        assert json.loads((d / "metrics.json").read_text())["config"]["eval"]["k"] == k
        assert f"eval.k={k}" in (d / ".hydra" / "overrides.yaml").read_text()
        assert json.loads((d / RUN_MARKER).read_text())["pid"] == procs[k].pid
        assert (d / "run.log").read_text().count("stage score") == 1, "one run's log only"


def test_a_directory_in_use_is_refused(warm, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    with open(out / LOCK_FILE, "a+") as held:  # another live run holds it
        fcntl.flock(held, fcntl.LOCK_EX)
        done = run_py([f"hydra.run.dir={out}", *tiny_overrides(warm)])
    assert_one_line(done, f"ragrig: error: output directory {out} is in use by another run")
    assert not (out / "metrics.json").exists() and not (out / RUN_MARKER).exists()


def test_a_failed_rerun_into_a_fixed_directory_leaves_no_stale_results(warm, tmp_path):
    out = tmp_path / "fixed"
    shutil.copytree(warm["out"], out)  # an earlier run's complete results
    assert (out / "metrics.json").exists()
    assert {"report.html", "run.trec", "qrels.trec"} <= {p.name for p in out.iterdir()}
    (out / ".metrics.json.tmp-x1y2").write_text("{")  # a write the earlier run was killed in
    done = run_py([f"hydra.run.dir={out}", *tiny_overrides(warm), "eval.k=0"])
    assert_one_line(done, "ragrig: error: eval.k must be positive, got 0")
    left = sorted(p.name for p in out.iterdir())
    assert not set(left) & set(RESULT_FILES), f"an earlier run's results beside a failed run: {left}"
    assert not [n for n in left if ".tmp-" in n]
    log = (out / "run.log").read_text()
    assert "stage score" not in log and "eval.k must be positive" in log, "the earlier run's log lines are gone"


# What a run directory may hold besides RESULT_FILES: Hydra's config copy and log, the run's marker
# and lock. Anything else would survive a failed rerun (rag.run.rundir.claim removes RESULT_FILES).
NOT_RESULTS = {".hydra", "run.log", RUN_MARKER, LOCK_FILE}


def test_every_file_a_run_writes_is_a_listed_result_file(warm):
    written = {p.name for p in warm["out"].iterdir()}
    assert written - NOT_RESULTS <= set(RESULT_FILES), written - NOT_RESULTS - set(RESULT_FILES)
    assert {"metrics.json", "per_question.jsonl", "run.trec", "report.html"} <= written


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_result_files_and_cache_entries_follow_the_umask(warm, tmp_path, umask):
    out = tmp_path / "shared-results"
    cache = tmp_path / "cache"
    done = finish(subprocess.Popen(
        [sys.executable, RUN, f"hydra.run.dir={out}", *tiny_overrides({**warm, "cache": cache}), "eval.k=2"],
        cwd=PROJECT_ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: os.umask(umask)))
    assert done.returncode == 0, done.stderr[-3000:]
    files = [p for p in out.iterdir() if p.name in RESULT_FILES] + [p for p in cache.rglob("*") if p.is_file()]
    assert {"metrics.json", "per_question.jsonl", "config_resolved.yaml", "run.trec", "report.html"} <= {p.name for p in files}
    modes = {str(p): oct(p.stat().st_mode & 0o777) for p in files if p.stat().st_mode & 0o777 != 0o666 & ~umask}
    assert not modes, f"not {oct(0o666 & ~umask)} under umask {oct(umask)}: {modes}"
    dirs = {str(p): oct(p.stat().st_mode & 0o777) for p in cache.rglob("*") if p.is_dir()
            and p.stat().st_mode & 0o777 != 0o777 & ~umask}
    assert not dirs, f"cache directories not {oct(0o777 & ~umask)}: {dirs}"


def sweep(warm: dict[str, Path], sweep_dir: Path, *args: str) -> subprocess.CompletedProcess:
    overrides = [o for o in tiny_overrides(warm)]
    return run_py(["-m", *overrides, "retriever=hybrid", *args, f"hydra.sweep.dir={sweep_dir}"])


@pytest.mark.heavy
def test_a_reused_sweep_dir_summarizes_only_the_new_sweep_and_all_failed_exits_1(warm, tmp_path):
    d = tmp_path / "fixed-sweep"
    first = sweep(warm, d, "fusion.alpha=0.3,0.7")
    assert first.returncode == 0, first.stderr[-3000:]
    assert len(pd.read_csv(d / "summary.csv")) == 2 and (d / "charts").is_dir()
    shown = printed_paths(first.stdout, d)
    assert {"summary.md", "charts", "report.html"} <= {p.name for p in shown} and all(p.exists() for p in shown)
    stamp = json.loads((d / SWEEP_STAMP).read_text())["id"]

    # one job, into the same directory, failing: the sweep fails as a whole
    second = sweep(warm, d, "fusion.alpha=1.5")
    assert second.returncode == 1, second.stderr[-3000:]
    assert "ragrig: every job of the sweep failed (1 job: 0)" in second.stderr and "Traceback" not in second.stderr
    df = pd.read_csv(d / "summary.csv")
    assert df["status"].tolist() == ["failed"] and df.loc[0, "error"] == "fusion.alpha must be in [0, 1], got 1.5"
    assert json.loads((d / SWEEP_STAMP).read_text())["id"] != stamp
    # job 0 holds only the new job's failure, job 1 (the old sweep's) is left out, old charts are gone
    assert (d / "0" / "failure.json").exists() and not (d / "0" / "metrics.json").exists()
    assert (d / "1" / "metrics.json").exists() and "fusion.alpha=0.7" not in (d / "summary.md").read_text()
    assert not (d / "charts").exists()

    from experiments.aggregate import load_records

    assert [r.path.name for r in load_records([d])] == ["0"], "compare sees the same jobs as the summary"


def test_fail_on_decides_the_exit_status_of_a_partly_failed_sweep(tmp_path, capsys):
    from experiments.callbacks import judge_sweep
    from tests.test_experiments import write_run

    d = tmp_path / "partial"
    write_run(d / "0", values={"mrr": [0.2, 0.4]}, job=0)
    (d / "1" / ".hydra").mkdir(parents=True)
    (d / "1" / ".hydra" / "overrides.yaml").write_text("- fusion.alpha=1.5\n")
    (d / "1" / "failure.json").write_text(json.dumps({"error_type": "RagError", "message": "fusion.alpha must be in [0, 1]"}))
    assert judge_sweep(d, "all") == 0, "partial failure: recorded, not fatal (the default)"
    assert judge_sweep(d, "any") == 1
    assert "ragrig: 1 of 2 jobs failed (jobs 1; report.fail_on=any)" in capsys.readouterr().err
    (d / "0" / "metrics.json").unlink()
    (d / "0" / "failure.json").write_text(json.dumps({"error_type": "RagError", "message": "x"}))
    assert judge_sweep(d, "never") == 0 and judge_sweep(d, "all") == 1


@pytest.mark.heavy
@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions")
def test_a_read_only_cache_serves_hits_and_refuses_builds_in_one_line(warm, tmp_path):
    """A shared cache mounted read-only serves what it holds; a run that must build a new artifact
    there stops with one line naming the cache. As root, permissions bind only without
    CAP_DAC_OVERRIDE, so the runs drop it."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: cannot make a directory read-only")
        prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner"]
    cache = tmp_path / "ro-cache"
    shutil.copytree(warm["cache"], cache)
    for p in [cache, *cache.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        hit = subprocess.run([*prefix, sys.executable, RUN, *tiny_overrides(warm), f"paths.cache={cache}",
                              "retriever=hybrid", f"hydra.run.dir={tmp_path / 'hit'}"],
                             cwd=PROJECT_ROOT, env=ENV, capture_output=True, text=True, timeout=400)
        assert hit.returncode == 0, hit.stderr[-3000:]
        assert (tmp_path / "hit" / "metrics.json").exists()
        miss = subprocess.run([*prefix, sys.executable, RUN, *tiny_overrides(warm), f"paths.cache={cache}",
                               "chunker.chunk_size=90", f"hydra.run.dir={tmp_path / 'miss'}"],
                              cwd=PROJECT_ROOT, env=ENV, capture_output=True, text=True, timeout=400)
        assert miss.returncode == 2, miss.stderr[-3000:]
        lines = error_lines(miss.stderr)
        assert len(lines) == 1 and lines[0].startswith(
            f"ragrig: error: artifact cache {cache}: cannot write the chunks artifact (Permission denied")
    finally:
        for p in [cache, *cache.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)


def test_a_corpus_path_with_spaces_and_a_bom(tiny_files, compose_cfg, tmp_path):
    """A path with spaces needs no quoting beyond the shell's; one with Hydra's special characters
    ( ) , = ' " [ ] needs the value quoted for Hydra too (README). A UTF-8 byte-order mark is accepted."""
    spaced = tmp_path / "plain docs" / "c d.jsonl"
    assert compose_cfg([*tiny_overrides(tiny_files), f"corpus.path={spaced}"]).corpus.path == str(spaced)
    folder = tmp_path / "my docs (v2)"
    folder.mkdir()
    corpus = folder / "c d.jsonl"
    corpus.write_bytes(b"\xef\xbb\xbf" + tiny_files["corpus"].read_bytes())
    base = [o for o in tiny_overrides(tiny_files) if not o.startswith("corpus.path=")]
    result = run(compose_cfg([*base, f'corpus.path="{corpus}"']), tmp_path / "out")
    assert result["counts"]["documents"] == len(TINY_DOCS)


@pytest.mark.heavy
def test_two_sweeps_and_an_ask_on_one_cold_cache_build_each_artifact_once_and_agree(warm, tmp_path):
    """Two multiruns started together, overlapping in every artifact they need, and a `rag.ask` on
    the same cache while they build: all succeed, the same configuration gives the same metrics
    in both sweeps, each artifact has one entry and no staging directory is left."""
    cache = tmp_path / "cold-cache"
    overrides = [*tiny_overrides({**warm, "cache": cache}), "retriever=hybrid"]
    sweeps = [start(["-m", *overrides, f"fusion.alpha={alphas}", f"hydra.sweep.dir={tmp_path / name}"])
              for name, alphas in (("a", "0.3,0.7"), ("b", "0.7,0.3"))]
    ask = subprocess.Popen([sys.executable, "-m", "rag.ask", "-q", "Why was fcntl64 added?", *overrides,
                            "fusion.alpha=0.3"], cwd=PROJECT_ROOT, env=ENV, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    for done in [finish(p) for p in sweeps] + [finish(ask)]:
        assert done.returncode == 0, done.stderr[-3000:]

    def metrics(job: Path) -> dict:
        return json.loads((job / "metrics.json").read_text())["metrics"]

    assert metrics(tmp_path / "a" / "0") == metrics(tmp_path / "b" / "1")  # alpha 0.3
    assert metrics(tmp_path / "a" / "1") == metrics(tmp_path / "b" / "0")  # alpha 0.7
    entries = sorted(m.parent.parent.name for m in cache.glob("*/*/manifest.json") if m.parent.parent.name != "eval_vectors")
    assert entries == ["bm25", "chunks", "corpus", "index", "vectors"], entries  # alpha shares them all
    assert list(cache.glob("eval_vectors/*/manifest.json"))  # what scoring encoded, per run's texts
    assert not list(cache.rglob("tmp-*"))


# ---- ragrig removes or replaces only what it wrote -----------------------------------------------

def _snapshot(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in d.rglob("*") if p.is_file()}


def test_a_folder_of_the_users_is_refused_before_anything_is_written(warm, tmp_path):
    """hydra.run.dir= a folder that never held a ragrig run, holding files named like a run's."""
    out = tmp_path / "my-analysis"
    out.mkdir()
    for name, text in {"metrics.json": '{"mine": 1}', "report.html": "<p>my report</p>", "run.trec": "q 0 d 1 1 me\n",
                       "run.log": "my notes\n"}.items():
        (out / name).write_text(text)
    before = _snapshot(out)
    done = run_py([f"hydra.run.dir={out}", *tiny_overrides(warm)])
    assert_one_line(done, f"ragrig: error: output directory {out} holds metrics.json, which no ragrig run wrote "
                          "there; ragrig replaces only its own results: give this run a new or empty hydra.run.dir")
    assert _snapshot(out) == before and {p.name for p in out.iterdir()} == set(before), "nothing touched, nothing added"


def test_a_run_directory_holding_a_file_its_marker_does_not_list_is_refused(warm, tmp_path):
    out = tmp_path / "run-plus-notes"
    shutil.copytree(warm["out"], out)
    (out / "notes.txt").write_text("what I learned from this run")
    before = _snapshot(out)
    done = run_py([f"hydra.run.dir={out}", *tiny_overrides(warm), "eval.k=2"])
    assert_one_line(done, f"ragrig: error: output directory {out} holds notes.txt, which no ragrig run wrote there")
    assert _snapshot(out) == before


def test_an_empty_folder_is_used(warm, tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    done = run_py([f"hydra.run.dir={out}", *tiny_overrides(warm), "eval.k=2"])
    assert done.returncode == 0, done.stderr[-3000:]
    marker = json.loads((out / RUN_MARKER).read_text())
    assert {"metrics.json", "run.log", ".hydra/overrides.yaml"} <= set(marker["files"])
    assert {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} <= {*marker["files"], RUN_MARKER, LOCK_FILE}


def test_a_run_refused_because_its_directory_is_in_use_writes_nothing_there(warm, tmp_path):
    """Not Hydra's record of the run (.hydra/), not the log: the running run's files stay its own."""
    out = tmp_path / "busy-run"
    shutil.copytree(warm["out"], out)
    before = _snapshot(out)
    with open(out / LOCK_FILE, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        done = run_py([f"hydra.run.dir={out}", *tiny_overrides(warm), "eval.k=3", "+version=v1"])
    assert_one_line(done, f"ragrig: error: output directory {out} is in use by another run")
    assert _snapshot(out) == before, [k for k in before if _snapshot(out).get(k) != before[k]]


def test_the_hydra_record_is_written_once_the_directory_is_claimed(warm):
    """ragrig writes .hydra/ itself (hydra.output_subdir is null); compare reads it as before."""
    from experiments.aggregate import load_run

    hydra = warm["out"] / ".hydra"
    assert sorted(p.name for p in hydra.iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    record = load_run(warm["out"])
    assert "retriever=hybrid" in record.overrides and record.choices.get("retriever") == "hybrid"
    assert record.config["retriever"]["_target_"]


def _terminal(done: subprocess.CompletedProcess) -> str:
    return done.stdout + done.stderr


def test_an_error_is_one_line_on_the_terminal_and_kept_in_the_log(warm, tmp_path):
    out = tmp_path / "failing"
    done = run_py([f"hydra.run.dir={out}", *tiny_overrides(warm), "eval.k=0"])
    assert done.returncode == 2
    assert _terminal(done).count("eval.k must be positive, got 0") == 1, _terminal(done)
    assert "eval.k must be positive, got 0" in (out / "run.log").read_text()


def test_a_failed_sweep_job_is_one_line_on_the_terminal_and_kept_in_its_log(warm, tmp_path):
    d = tmp_path / "sweep-fail"
    done = sweep(warm, d, "fusion.alpha=1.5")
    assert done.returncode == 1, done.stderr[-3000:]
    assert _terminal(done).count("fusion.alpha must be in [0, 1], got 1.5") == 1, _terminal(done)
    assert "ragrig: job 0 failed: RagError: fusion.alpha must be in [0, 1], got 1.5" in done.stderr
    assert "fusion.alpha must be in [0, 1], got 1.5" in (d / "0" / "run.log").read_text()


def test_a_sweep_summary_removes_only_the_files_the_earlier_summary_listed(tmp_path):
    from experiments.aggregate import load_records
    from experiments.report_files import build_report
    from rag.run.rundir import REPORT_MARKER, remove_report
    from tests.test_experiments import write_run

    d = tmp_path / "sweep"
    write_run(d / "0", values={"mrr": [0.2, 0.4]}, job=0)
    build_report(load_records([d]), d)
    listed = json.loads((d / REPORT_MARKER).read_text())["files"]
    assert "summary.md" in listed and any(f.startswith("charts/") for f in listed)
    (d / "charts" / "figure1_final.png").write_bytes(b"my figure")
    removed = remove_report(d)
    assert sorted(removed) == sorted(listed)
    assert [p.name for p in (d / "charts").iterdir()] == ["figure1_final.png"] and not (d / "summary.md").exists()


def test_a_sweep_summary_never_writes_over_a_file_it_did_not_write(tmp_path, capsys):
    from experiments.callbacks import write_sweep_summary
    from tests.test_experiments import write_run

    d = tmp_path / "sweep"
    write_run(d / "0", values={"mrr": [0.2, 0.4]}, job=0)
    (d / "summary.md").write_text("my own summary")
    assert write_sweep_summary(d) == []
    assert (d / "summary.md").read_text() == "my own summary" and not (d / "summary.csv").exists()
    assert f"ragrig: the sweep's summary was not written: {d / 'summary.md'} was not written by a ragrig report" \
        in capsys.readouterr().err


def test_a_released_directory_can_be_claimed_by_another_process(tmp_path):
    import subprocess
    import sys

    from rag.run import rundir

    rundir.claim(tmp_path / "run")
    probe = [sys.executable, "-c", "import sys; from rag.run import rundir; from rag.types import RagError\n"
             "try:\n    rundir.claim(sys.argv[1])\nexcept RagError:\n    sys.exit(3)", str(tmp_path / "run")]
    assert subprocess.run(probe, cwd=PROJECT_ROOT).returncode == 3, "held while claimed"
    rundir.release(tmp_path / "run")
    assert subprocess.run(probe, cwd=PROJECT_ROOT).returncode == 0


# ---- a sweep owns its directory, refuses what it did not write, and counts every job ---------------

def _user_folder(tmp_path: Path) -> Path:
    theirs = tmp_path / "my-figures"
    theirs.mkdir()
    for name in ("objective.png", "objective.svg", "figure1_final.png"):
        (theirs / name).write_bytes(b"the user's own " + name.encode())
    return theirs


@pytest.mark.parametrize("name, text", [("multirun.yaml", "my: own notes\n"), ("summary.md", "# my own summary\n")])
def test_a_sweep_into_a_folder_holding_the_users_file_is_refused_before_hydra_writes(warm, tmp_path, name, text):
    """Refused at the sweep's start, before Hydra writes its multirun.yaml (on_multirun_start runs
    first) and before any job: not after every job ran."""
    d = tmp_path / "users-folder"
    d.mkdir()
    (d / name).write_text(text)
    done = sweep(warm, d, "fusion.alpha=0.3,0.7")
    why = "ragrig sweep" if name == "multirun.yaml" else "ragrig report"
    assert_one_line(done, f"ragrig: error: {d / name} was not written by a {why}; ")
    assert "hydra.sweep.dir" in error_lines(done.stderr)[0]
    assert _snapshot(d) == {name: text.encode()} and [p.name for p in d.iterdir()] == [name], "nothing written"


def test_a_second_sweep_into_a_directory_in_use_gets_one_line(warm, tmp_path):
    """The sweep holding the directory is named by its pid while that pid runs its recorded command."""
    from rag.run.rundir import SWEEP_LOCK, lock_sweep, unlock_sweep

    d = tmp_path / "shared-sweep"
    lock_sweep(d)  # a sweep of this process holds it, as a running `python run.py -m` would
    try:
        done = sweep(warm, d, "fusion.alpha=0.3")
    finally:
        unlock_sweep(d)
    assert_one_line(done, f"ragrig: error: sweep directory {d} is in use by another sweep (pid {os.getpid()}: ")
    assert sorted(p.name for p in d.iterdir()) == [SWEEP_LOCK], "no job, no stamp, no multirun.yaml"


def test_a_stale_sweep_lock_of_a_dead_process_does_not_block(tmp_path):
    from rag.run.rundir import SWEEP_LOCK, lock_sweep, unlock_sweep

    d = tmp_path / "after-a-crash"
    d.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (d / SWEEP_LOCK).write_text(json.dumps({"pid": int(dead.stdout), "cmdline": ["python", "run.py", "-m"]}))
    lock_sweep(d)
    try:
        assert json.loads((d / SWEEP_LOCK).read_text())["pid"] == os.getpid(), "the lock now names its holder"
    finally:
        unlock_sweep(d)


def test_a_lock_holder_is_named_only_while_its_pid_runs_the_recorded_command(tmp_path):
    """A pid is reused: a lock file naming a live pid with another command line names nobody."""
    from rag.run.rundir import SWEEP_LOCK, lock_sweep
    from rag.types import RagError

    d = tmp_path / "held"
    d.mkdir()
    with open(d / SWEEP_LOCK, "w+") as held:  # another sweep's lock (flock binds open files, not processes)
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write(json.dumps({"pid": os.getpid(), "cmdline": ["python", "run.py", "-m", "not-this-process"]}))
        held.flush()
        with pytest.raises(RagError) as refused:
            lock_sweep(d)
    assert f"sweep directory {d} is in use by another sweep; " in str(refused.value) and "pid" not in str(refused.value)


@pytest.mark.parametrize("where", ["run", "sweep"])
def test_a_lock_file_that_is_a_link_is_refused_and_its_target_left_alone(tmp_path, where):
    """The lock file records its holder's pid: written through a link, it would overwrite the target."""
    from rag.run import rundir
    from rag.types import RagError

    target = tmp_path / "my-notes.txt"
    target.write_text("precious")
    d = tmp_path / where
    d.mkdir()
    (d / (LOCK_FILE if where == "run" else rundir.SWEEP_LOCK)).symlink_to(target)
    with pytest.raises(RagError, match="holds .ragrig.lock, which no ragrig run wrote" if where == "run" else "is a link"):
        rundir.claim(d) if where == "run" else rundir.lock_sweep(d)
    assert target.read_text() == "precious"


def test_a_listed_log_that_is_a_link_is_refused_before_it_is_truncated(tmp_path):
    """A run directory whose marker lists run.log, where run.log now links to a user's file."""
    from rag.run import rundir
    from rag.types import RagError

    out = tmp_path / "run"
    out.mkdir()
    (out / RUN_MARKER).write_text(json.dumps({"files": ["metrics.json", "run.log"]}))
    target = tmp_path / "journal.txt"
    target.write_text("my journal")
    (out / "run.log").symlink_to(target)
    with pytest.raises(RagError, match="holds run.log, which no ragrig run wrote there"):
        rundir.claim(out)
    assert target.read_text() == "my journal" and (out / "run.log").is_symlink()


def test_a_report_marker_never_removes_a_file_outside_its_directory(tmp_path):
    """A results folder received from someone else may list anything: absolute paths, '..', and
    paths through a link out of the folder are left alone."""
    from rag.run.rundir import REPORT_MARKER, remove_report

    outside = tmp_path / "home"
    outside.mkdir()
    victims = {n: outside / n for n in ("absolute.txt", "dotdot.txt", "linked.txt")}
    for p in victims.values():
        p.write_text("mine")
    d = tmp_path / "received" / "results"
    d.mkdir(parents=True)
    (d / "via").symlink_to(outside)
    (d / "summary.md").write_text("a report")
    listed = [str(victims["absolute.txt"]), "../../home/dotdot.txt", "via/linked.txt", "summary.md"]
    (d / REPORT_MARKER).write_text(json.dumps({"files": listed}))
    assert remove_report(d) == ["summary.md"]
    assert all(p.read_text() == "mine" for p in victims.values())


def test_a_charts_link_to_the_users_folder_is_refused_before_anything_is_removed(tmp_path, capsys):
    """An earlier report listed charts/objective.png; charts/ is now a link to the user's folder
    holding files of those names: neither the sweep's start nor the report removes or writes there."""
    from experiments.aggregate import load_records
    from experiments.callbacks import claim_sweep_dir
    from experiments.report_files import build_report
    from rag.run.rundir import remove_report, write_sweep_stamp
    from rag.types import RagError
    from tests.test_experiments import write_run

    d = tmp_path / "sweep"
    write_sweep_stamp(d)
    write_run(d / "0", values={"mrr": [0.2, 0.4]}, job=0)
    build_report(load_records([d]), d)
    theirs = _user_folder(tmp_path)
    shutil.rmtree(d / "charts")
    (d / "charts").symlink_to(theirs)
    before = _snapshot(theirs)
    with pytest.raises(SystemExit) as refused:
        claim_sweep_dir(d)
    assert refused.value.code == 2
    assert capsys.readouterr().err.startswith(f"ragrig: error: {d / 'charts'} is a link, which a ragrig report never writes")
    with pytest.raises(RagError, match="is a link"):
        build_report(load_records([d]), d)
    remove_report(d)
    assert _snapshot(theirs) == before and (d / "charts").is_symlink()


def test_a_report_file_that_is_a_link_is_never_written_through(tmp_path):
    from experiments.aggregate import load_records
    from experiments.report_files import build_report
    from rag.types import RagError
    from tests.test_experiments import write_run

    d = tmp_path / "sweep"
    write_run(d / "0", values={"mrr": [0.2, 0.4]}, job=0)
    build_report(load_records([d]), d)
    mine = tmp_path / "thesis-table.csv"
    mine.write_text("my table")
    (d / "summary.csv").unlink()
    (d / "summary.csv").symlink_to(mine)
    with pytest.raises(RagError, match="summary.csv is a link"):
        build_report(load_records([d]), d)
    assert mine.read_text() == "my table"


def test_an_interrupted_report_leaves_only_files_its_marker_claims(tmp_path, monkeypatch):
    """Ctrl-C while the charts are drawn (one chart written): the marker, written first, lists the
    tables and the staged chart, so the next report there replaces them instead of refusing."""
    import experiments.report_files as rf
    from experiments.aggregate import load_records
    from experiments.callbacks import write_sweep_summary
    from rag.run.rundir import REPORT_MARKER, foreign_report_file, remove_report
    from tests.test_experiments import write_run

    d = tmp_path / "sweep"
    write_run(d / "0", values={"mrr": [0.2, 0.4]}, job=0, overrides=["fusion.alpha=0.3"])
    write_run(d / "1", values={"mrr": [0.3, 0.5]}, job=1, overrides=["fusion.alpha=0.7"])
    real = rf.make_charts

    def interrupted(rep, out_dir, formats):
        real(rep, out_dir, formats)
        raise KeyboardInterrupt

    monkeypatch.setattr(rf, "make_charts", interrupted)
    with pytest.raises(KeyboardInterrupt):
        rf.build_report(load_records([d]), d)
    marker = json.loads((d / REPORT_MARKER).read_text())
    assert marker["state"] == "writing" and {"summary.csv", "comparison.csv"} <= set(marker["files"])
    staged = [p for p in (d / marker["staging"]).rglob("*") if p.is_file()]
    assert staged and foreign_report_file(d) is None
    monkeypatch.setattr(rf, "make_charts", real)
    assert write_sweep_summary(d), "the next summary there is written"
    assert json.loads((d / REPORT_MARKER).read_text())["state"] == "done" and not (d / marker["staging"]).exists()
    assert list((d / "charts").iterdir())
    remove_report(d)
    assert sorted(p.name for p in d.iterdir()) == ["0", "1"], "every file of the report was known as its own"


def test_a_job_refused_its_directory_is_a_failed_job(tmp_path, capsys):
    from experiments.aggregate import load_records
    from experiments.callbacks import judge_sweep
    from rag.run.rundir import record_refused, write_sweep_stamp
    from tests.test_experiments import write_run

    d = tmp_path / "sweep"
    write_sweep_stamp(d)
    (d / "0").mkdir()
    (d / "0" / "notes.txt").write_text("mine")
    record_refused(d, 0, d / "0", f"output directory {d / '0'} holds notes.txt, which no ragrig run wrote there",
                   ["fusion.alpha=0.3"])
    write_run(d / "1", values={"mrr": [0.2, 0.4]}, job=1, overrides=["fusion.alpha=0.7"])
    records = load_records([d])
    assert [(r.job_num, r.status) for r in records] == [(0, "failed"), (1, "ok")], "in job order"
    assert records[0].failure["error_type"] == "Refused" and "notes.txt" in records[0].failure["message"]
    assert records[0].overrides == ["fusion.alpha=0.3"]
    assert judge_sweep(d, "any") == 1 and judge_sweep(d, "all") == 0
    assert "ragrig: 1 of 2 jobs failed (jobs 0; report.fail_on=any)" in capsys.readouterr().err
    write_sweep_stamp(d)  # a new sweep here: the earlier sweep's refusal is no job of it
    assert not any(r.failure and r.failure.get("error_type") == "Refused" for r in load_records([d]))


@pytest.mark.heavy
def test_jobs_refused_their_directories_are_listed_counted_and_fail_the_sweep(warm, tmp_path):
    """Job 0's directory holds a user's file, job 1's is in use by another run, job 2 runs: three
    jobs, two failed, exit 1 under report.fail_on=any; nothing written into either directory."""
    d = tmp_path / "sweep-with-a-busy-job"
    (d / "0").mkdir(parents=True)
    (d / "0" / "notes.txt").write_text("mine")
    (d / "1").mkdir()
    with open(d / "1" / LOCK_FILE, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        done = sweep(warm, d, "fusion.alpha=0.3,0.5,0.7", "report.fail_on=any")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "sweep summary: 3 jobs (2 failed)" in done.stdout
    assert "ragrig: 2 of 3 jobs failed (jobs 0, 1; report.fail_on=any)" in done.stderr
    df = pd.read_csv(d / "summary.csv")
    assert df["job"].tolist() == [0, 1, 2] and df["status"].tolist() == ["failed", "failed", "ok"]
    assert "holds notes.txt" in df.iloc[0]["error"] and "is in use by another run" in df.iloc[1]["error"]
    assert sorted(p.name for p in (d / "0").iterdir()) == ["notes.txt"]
    assert sorted(p.name for p in (d / "1").iterdir()) == [LOCK_FILE]
