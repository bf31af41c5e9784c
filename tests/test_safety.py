"""Safety: cache files are read with formats that cannot run code, and a run writes only into its
output directory and the cache directory."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rag.config.compose import PROJECT_ROOT
from tests.conftest import tiny_overrides

CODE_DIRS = ["rag", "eval", "experiments"]
UNSAFE = re.compile(r"pickle\.loads?\(|torch\.load\(|allow_pickle\s*=\s*True|joblib\.load\(|dill\.")


def test_no_code_executing_deserializers_in_the_code():
    offenders = []
    for d in CODE_DIRS:
        for p in (PROJECT_ROOT / d).rglob("*.py"):
            for n, line in enumerate(p.read_text().splitlines(), 1):
                if UNSAFE.search(line) and not line.lstrip().startswith("#"):
                    offenders.append(f"{p.relative_to(PROJECT_ROOT)}:{n}: {line.strip()}")
    assert not offenders, offenders


def _files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.mark.heavy
def test_a_run_writes_only_to_its_output_and_cache_dirs(tiny_files, tmp_path):
    work, home = tmp_path / "cwd", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    project_before = _files_under(PROJECT_ROOT / "conf") | _files_under(PROJECT_ROOT / "data")
    env = {**os.environ, "HOME": str(home), "HF_HUB_OFFLINE": "1"}
    for var in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "HF_HOME", "MPLCONFIGDIR"):
        env.pop(var, None)
    args = [sys.executable, str(PROJECT_ROOT / "run.py"), "+version=v2", f"hydra.run.dir={tiny_files['out']}"]
    done = subprocess.run(args + tiny_overrides(tiny_files), cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _files_under(work) == set()
    assert _files_under(home) == set()
    assert _files_under(PROJECT_ROOT / "conf") | _files_under(PROJECT_ROOT / "data") == project_before
    assert (tiny_files["out"] / "metrics.json").exists() and any(tiny_files["cache"].iterdir())


# ---- experiments.compare --out: only what compare wrote is replaced -----------------------------

def _compare(runs: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments.compare", str(runs), "--out", str(out), *extra],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)


def _files(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in d.rglob("*") if p.is_file()}


def _two_runs(root: Path) -> Path:
    from tests.test_experiments import write_run

    write_run(root / "a", variant="v1", values={"mrr": [0.1, 0.5, 0.9], "recall_at_k": [0, 1, 1]})
    write_run(root / "b", variant="v2", values={"mrr": [0.2, 0.6, 0.8], "recall_at_k": [1, 1, 1]})
    return root


def test_compare_refuses_an_out_folder_holding_the_users_files(tmp_path):
    runs, out = _two_runs(tmp_path / "runs"), tmp_path / "paper"
    (out / "charts").mkdir(parents=True)
    (out / "charts" / "figure1_final.png").write_bytes(b"the figure I spent a week on")
    (out / "summary.md").write_text("my summary")
    (out / "report.html").write_text("<p>mine</p>")
    before = _files(out)
    done = _compare(runs, out)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (f"compare: error: --out {out} holds report.html, which compare did not write; "
                                   "give an empty or new --out")  # (a folder's own files before its subfolders')
    assert _files(out) == before


def test_compare_replaces_its_own_earlier_report_but_refuses_once_a_user_file_is_added(tmp_path):
    runs, out = _two_runs(tmp_path / "runs"), tmp_path / "cmp"
    assert _compare(runs, out).returncode == 0
    assert _compare(runs, out, "--no-html").returncode == 0, "its own report: replaced"
    assert not (out / "report.html").exists()
    (out / "charts" / "annotated.png").write_bytes(b"mine")
    before = _files(out)
    done = _compare(runs, out)
    assert done.returncode == 2 and "holds charts/annotated.png, which compare did not write" in done.stderr
    assert _files(out) == before
