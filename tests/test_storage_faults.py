"""A disk that fills up or turns read-only, under the artifact cache or under the run directory:
one line naming the directory and its setting, exit status 2, and no results that look like a
finished run. Real filesystems: each case mounts a small tmpfs (needs root, as on CI; skipped
elsewhere). A cache entry damaged after it was written (truncated, bit-flipped) is rebuilt: see
tests/test_cache.py."""
from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_cli_errors import assert_one_line
from tests.test_run_dirs import run_py, warm  # noqa: F401 - the module's warmed tiny cache

from tests.conftest import tiny_overrides


@pytest.fixture
def mount(tmp_path) -> Iterator:
    """mount(size, read_only=False) -> a fresh tmpfs directory of that size."""
    points: list[Path] = []

    def _mount(size: str, read_only: bool = False, prepare: str | None = None) -> Path:
        point = tmp_path / f"fs-{uuid.uuid4().hex[:6]}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'not root'})")
        points.append(point)
        if prepare:
            (point / prepare).mkdir()
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(point)], check=True)
        return point

    yield _mount
    for point in points:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def run_into(files: dict, out: Path, cache: Path) -> subprocess.CompletedProcess:
    return run_py([f"hydra.run.dir={out}", *tiny_overrides({**files, "cache": cache}), "retriever=hybrid",
                   "fusion.alpha=0.4"])


def no_results(out: Path) -> bool:
    return not (out / "metrics.json").exists() and not (out / "per_question.jsonl").exists()


def test_a_cache_that_fills_up_while_an_index_is_written_is_one_line(warm, mount, tmp_path):
    # 64 KB holds the corpus and chunks but not the index faiss writes (from C, as a RuntimeError)
    fs = mount("64k")
    out = tmp_path / "run"
    done = run_into(warm, out, fs / "cache")
    assert_one_line(done, f"artifact cache {fs / 'cache'}: cannot write the ")
    assert "No space left on device" in done.stderr and "paths.cache (or RAGRIG_CACHE)" in done.stderr
    assert no_results(out)
    assert not list((fs / "cache").rglob("tmp-*")), "the failed build's staging directory is removed"


def test_a_read_only_cache_is_one_line(warm, mount, tmp_path):
    fs = mount("1m", read_only=True, prepare="cache")
    out = tmp_path / "run"
    assert_one_line(run_into(warm, out, fs / "cache"), f"artifact cache {fs / 'cache'}: cannot write the corpus artifact "
                                                          "(Read-only file system")
    assert no_results(out)


@pytest.mark.parametrize("size", ["8k", "40k", "100k"])
def test_a_run_directory_that_fills_up_is_one_line_and_holds_no_results(size, warm, mount):
    """Wherever the disk runs out (Hydra's files, the run marker, the results): one line, no
    results. Where only report.html does not fit, the run succeeds and says the report is missing."""
    out = mount(size) / "run"
    done = run_into(warm, out, warm["cache"])
    if done.returncode == 0:
        assert (out / "metrics.json").exists() and not (out / "report.html").exists()
        assert "report.html for" in done.stdout + done.stderr and "No space left on device" in done.stdout + done.stderr
        assert "Traceback" not in done.stdout + done.stderr
        return
    assert_one_line(done, f"cannot write {out}")
    assert "No space left on device (the run's directory is hydra.run.dir" in done.stderr
    assert no_results(out)


def test_a_read_only_run_directory_is_one_line(warm, mount):
    fs = mount("1m", read_only=True)
    done = run_into(warm, fs / "run", warm["cache"])
    assert_one_line(done, f"cannot write {fs / 'run'}")
    assert "Read-only file system" in done.stderr
