"""Crash safety for real: a run killed with SIGKILL while embedding, and again while building the
index, leaves nothing a later run would trust; the rerun's results equal an uninterrupted run's,
and an embedding killed after some of its blocks resumes from them."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rag.config.compose import PROJECT_ROOT, data_dir
from tests.conftest import write_jsonl

pytestmark = pytest.mark.crash

N_DOCS = 40


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory) -> dict[str, Path]:
    """40 PubMedQA abstracts with their questions: a few hundred chunks, seconds of embedding."""
    tmp = tmp_path_factory.mktemp("crash")
    data = json.loads((data_dir() / "pubmedqa" / "ori_pqal.json").read_text())
    items = list(data.items())[:N_DOCS]
    corpus = write_jsonl(tmp / "corpus.jsonl", [
        {"id": f"pmid:{k}", "text": "\n\n".join(v["CONTEXTS"] + [v["LONG_ANSWER"]]), "source": "pubmed"} for k, v in items
    ])
    qa = write_jsonl(tmp / "qa.jsonl", [
        {"id": f"q{k}", "question": v["QUESTION"], "answer": v["LONG_ANSWER"], "source": f"pmid:{k}", "corpus": "pubmed"}
        for k, v in items
    ])
    return {"corpus": corpus, "qa": qa, "root": tmp}


def command(files: dict[str, Path], cache: Path, out: Path) -> list[str]:
    return [
        sys.executable, str(PROJECT_ROOT / "run.py"), "+version=v2",
        "corpus=jsonl", f"corpus.path={files['corpus']}", "qa=jsonl", f"qa.path={files['qa']}",
        "slice.docs_per_source=null", "slice.questions_per_corpus=null", "chunker.chunk_size=200",
        "chunker.chunk_overlap=20", f"paths.cache={cache}", f"hydra.run.dir={out}", "embedder.batch_size=8",
    ]


def kill_when(proc: subprocess.Popen, pattern: Path, timeout: float = 240.0, within: int = 1,
              until: Callable[[Path], bool] | None = None) -> None:
    """SIGKILL `proc` as soon as a path matching `pattern` appears (its last `within` parts are a
    glob under the rest), and `until` holds for it when given."""
    deadline = time.monotonic() + timeout
    base, glob = Path(*pattern.parts[:-within]), "/".join(pattern.parts[-within:])
    while time.monotonic() < deadline:
        found = list(base.glob(glob))
        if found and (until is None or _holds(until, found[0])):
            time.sleep(0.5)  # let it write part of the payload
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            return
        if proc.poll() is not None:
            pytest.fail(f"the run ended (rc={proc.returncode}) before reaching {pattern}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"{pattern} never appeared")


def _holds(until: Callable[[Path], bool], path: Path) -> bool:
    try:
        return until(path)
    except (OSError, ValueError):  # replaced while read
        return False


def results(out: Path) -> tuple[dict, list]:
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    rows = [json.loads(line) for line in (out / "per_question.jsonl").read_text().splitlines()]
    return metrics, [[c["chunk_id"] for c in r["retrieved"]] for r in rows]


def test_killed_runs_leave_nothing_wrong_behind(corpus_files):
    root = corpus_files["root"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    reference = subprocess.run(command(corpus_files, root / "cache-ref", root / "ref"), env=env, capture_output=True, text=True, timeout=600)
    assert reference.returncode == 0, reference.stderr[-2000:]

    cache, out = root / "cache", root / "out"
    # 1. killed while embedding
    proc = subprocess.Popen(command(corpus_files, cache, out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_when(proc, cache / "vectors" / "tmp-*")
    assert not [p for p in (cache / "vectors").iterdir() if not p.name.startswith(("tmp-", "."))], "no vectors published"
    assert not (out / "metrics.json").exists()

    # 2. killed while building the index (held open just before publishing)
    proc = subprocess.Popen(command(corpus_files, cache, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**env, "RAGRIG_TEST_PAUSE_BEFORE_PUBLISH": "index:60"})
    kill_when(proc, cache / "index" / "tmp-*")
    assert not [p for p in (cache / "index").iterdir() if not p.name.startswith(("tmp-", "."))], "no index published"

    # 3. the rerun completes, cleans the leftovers, and agrees with the uninterrupted run
    done = subprocess.run(command(corpus_files, cache, out), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert results(out) == results(root / "ref")
    for kind in ("vectors", "index"):
        assert not list((cache / kind).glob("tmp-*")), f"stale {kind} build directories were removed"


def test_an_embedding_killed_after_some_blocks_resumes_from_them(corpus_files):
    """Blocks of 32 chunks (RAGRIG_TEST_ENCODE_BLOCK) over a few hundred chunks: the run is killed
    once three blocks are recorded in the vectors' partial directory; the rerun encodes only the rest
    (its manifest counts the blocks it read), removes the partial directory, and retrieves exactly
    what an uninterrupted run does."""
    root = corpus_files["root"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAGRIG_TEST_ENCODE_BLOCK": "32"}
    reference = subprocess.run(command(corpus_files, root / "cache-ref-blocks", root / "ref-blocks"), env=env,
                               capture_output=True, text=True, timeout=600)
    assert reference.returncode == 0, reference.stderr[-2000:]
    cache, out = root / "cache-blocks", root / "out-blocks"
    proc = subprocess.Popen(command(corpus_files, cache, out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_when(proc, cache / "vectors" / ".partial-*" / "blocks.json", within=2, until=lambda f: len(
        json.loads(f.read_text() or "{}").get("done", [])) >= 3)
    record = json.loads(next((cache / "vectors").glob(".partial-*/blocks.json")).read_text())
    assert len(record["done"]) >= 3
    done = subprocess.run(command(corpus_files, cache, out), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = json.loads(next((cache / "vectors").glob("*/manifest.json")).read_text())
    assert manifest["resumed_blocks"] >= 3 and manifest["unique"] > 32 * manifest["resumed_blocks"]
    assert not list((cache / "vectors").glob(".partial-*")), "published: the finished parts are gone"
    assert results(out) == results(root / "ref-blocks")
