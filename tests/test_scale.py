"""A million chunks through the streaming build (make test-scale; about 15 minutes and a few GB,
so not in the default run): documents streamed into the chunk store, precomputed vectors,
BM25 and IVF-PQ built with bounded memory; a build killed with SIGKILL resumes from its finished
shards and ends with the very bytes of an uninterrupted one."""
import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.scale import bench_scale

pytestmark = pytest.mark.scale

N = 1_000_000
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def million():
    return bench_scale(sizes=[N])["sizes"][str(N)]


def test_a_million_chunks_build_and_answer_within_bounded_memory(million):
    assert "error" not in million, million.get("error")
    assert million["chunk_set_is_store"]  # texts are read by row, never held as a list
    # The chunk texts (0.4 GB), the vectors (1.5 GB) and BM25's postings are files; what a run
    # holds is a batch, the vocabulary and the IVF-PQ codes. A build holding every chunk as a
    # record and every vector in memory peaked at 4.7 GB here.
    assert million["build_peak_rss_mb"] < 2500, million["phases"]
    assert million["peak_anon_mb"] < 2000, million["phases"]


def test_a_million_chunks_are_searched_as_the_targets_ask(million):
    t = million["targets"]
    assert t["recall_at_10"]["met"], t  # IVF-PQ re-scored from the mapped vectors
    assert t["hybrid_p50_ms"]["met"], t
    assert million["warm"]["fetch_ms_p50"] < 5  # ten rows of the store, from the page cache


def _build(workdir: Path, stages: list[str]) -> subprocess.Popen:
    code = f"from benchmarks.scale import build; build({N}, {str(workdir)!r}, tuple({stages!r}))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _kill_when(proc: subprocess.Popen, progress: str, field: str, at_least: int, timeout: float = 900) -> int:
    """SIGKILL `proc` once a progress record matching `progress` says `field` >= at_least."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the build ended before it was killed: {proc.stderr.read()[-2000:]}"
        for rec in glob.glob(progress):
            try:
                done = int(json.loads(Path(rec).read_text()).get(field, 0))
            except (OSError, ValueError):
                continue
            if done >= at_least:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return done
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"no progress record {progress} reached {field} >= {at_least}")


def _digests(workdir: Path, kind: str) -> dict[str, str]:
    (manifest,) = (workdir / "cache" / kind).glob("*/manifest.json")
    return {name: meta["sha256"] for name, meta in json.loads(manifest.read_text())["files"].items()}


def test_a_streaming_build_killed_twice_resumes_to_the_same_bytes(tmp_path):
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    stages = ["chunks", "bm25"]
    # First kill: chunking, a third of the way through its documents.
    chunks_done = _kill_when(_build(killed, stages), str(killed / "cache/chunks/.partial-*/progress.json"), "docs", N // 3)
    assert not list((killed / "cache" / "chunks").glob("*/manifest.json"))  # nothing half-written is published
    # Second kill: the rerun resumes chunking, then BM25's first pass is killed part-way.
    bm25_done = _kill_when(_build(killed, stages), str(killed / "cache/bm25/.partial-*/progress.json"), "docs", N // 3)
    (chunks_manifest,) = (killed / "cache" / "chunks").glob("*/manifest.json")
    assert json.loads(chunks_manifest.read_text())["resumed_docs"] >= chunks_done > 0
    # The third run finishes; an uninterrupted build in another cache gives the same files.
    for workdir in (killed, whole):
        proc = _build(workdir, stages)
        assert proc.wait(timeout=1800) == 0, proc.stderr.read()[-3000:]
    (bm25_manifest,) = (killed / "cache" / "bm25").glob("*/manifest.json")
    assert json.loads(bm25_manifest.read_text())["resumed_docs"] >= bm25_done > 0
    assert _digests(killed, "chunks") == _digests(whole, "chunks")
    assert _digests(killed, "bm25") == _digests(whole, "bm25")
    assert not list((killed / "cache").glob("*/.partial-*"))
