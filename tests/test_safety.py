"""Safety: cache files are read with formats that cannot run code, and a run writes only into its
output directory and the cache directory."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from rag.config import PROJECT_ROOT
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
