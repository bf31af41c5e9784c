"""The data the defaults need ships inside the repository; nothing reaches outside it."""
from __future__ import annotations

import re
import subprocess

from rag.config.compose import PROJECT_ROOT, data_dir

OUTSIDE = re.compile(r"\.\./shared|parent\s*/\s*[\"']shared[\"']|RAGRIG_SHARED_DATA|shared_data")


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_no_code_or_config_refers_outside_the_repository():
    checked = [f for f in tracked_files()
               if f.split("/")[0] in {"conf", "rag", "eval", "experiments", "tests", ".ci"} or f in {"Makefile", "run.py"}]
    assert checked, "git ls-files found nothing to check"
    offenders = []
    for f in checked:
        if f == "tests/test_data.py":
            continue
        text = (PROJECT_ROOT / f).read_text(encoding="utf-8", errors="replace")
        offenders += [f"{f}:{i}" for i, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)]
    assert not offenders, f"references to data outside the repository: {offenders}"


def test_default_data_is_in_the_repository_with_licences():
    root = data_dir()
    assert root == PROJECT_ROOT / "data"
    for folder, payload in [("pubmedqa", "ori_pqal.json"), ("medline", "pubmed-29768149.xml"), ("pytorch-docs", "index.rst")]:
        assert (root / folder / payload).is_file()
        assert (root / folder / "LICENSE").is_file()
        assert folder in (root / "README.md").read_text()


def test_default_config_resolves_inside_the_repository(compose_cfg):
    cfg = compose_cfg([])
    for part in list(cfg.corpus.parts) + list(cfg.qa.parts):
        for key in ("path", "docs_dir"):
            if part.get(key):
                assert str(part[key]).startswith(str(PROJECT_ROOT)), part[key]
