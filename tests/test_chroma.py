"""`index=chroma` (rag/index/chroma.py): Chroma's embedded client over the run's own vectors, stored in
the artifact cache, searched and filtered like the FAISS indexes. Needs the chroma extra
(make test-chroma); without it these tests are skipped and tests/test_index.py checks the
one-line error."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

chromadb = pytest.importorskip("chromadb")

from rag.index.chroma import MANIFEST, ChromaIndex  # noqa: E402
from rag.index.faiss_index import FlatIPIndex  # noqa: E402
from rag.run.pipeline import run  # noqa: E402
from rag.types import RagError  # noqa: E402
from tests.conftest import tiny_overrides  # noqa: E402


def unit_vectors(n: int, d: int = 48, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_chroma_finds_what_exact_search_finds():
    x, q = unit_vectors(3000), unit_vectors(50, seed=1)
    approx = ChromaIndex().build(x).search(q, 10).ids
    exact = FlatIPIndex().build(x).search(q, 10).ids
    recall = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(approx, exact)])
    assert recall >= 0.95, recall


def test_a_filter_returns_only_allowed_rows_and_pads_the_rest():
    x = unit_vectors(500)
    allowed = np.array([3, 40, 41, 499])
    hits = ChromaIndex(space="l2").build(x).search(x[40:41], 6, allowed)
    assert sorted(int(i) for i in hits.ids[0] if i >= 0) == [3, 40, 41, 499] and hits.ids[0, 0] == 40
    assert list(hits.ids[0, 4:]) == [-1, -1] and np.isneginf(hits.scores[0, 4:]).all()


def test_a_saved_index_opens_where_it_was_moved_and_refuses_another_version(tmp_path):
    x = unit_vectors(300)
    built = ChromaIndex().build(x)
    before = built.search(x[:5], 5).ids
    built.save(tmp_path / "entry")
    (tmp_path / "entry").rename(tmp_path / "published")
    assert (ChromaIndex().load(tmp_path / "published").search(x[:5], 5).ids == before).all()
    other = tmp_path / "other"
    shutil.copytree(tmp_path / "published", other)
    info = json.loads((other / MANIFEST).read_text())
    (other / MANIFEST).write_text(json.dumps({**info, "chromadb": "0.4.0"}))
    with pytest.raises(RagError, match=r"was written by chromadb 0.4.0, this is .*; remove that directory"):
        ChromaIndex().load(other)


def test_bad_settings_are_one_line():
    with pytest.raises(RagError, match="index.space must be one of cosine, l2, got 'ip'"):
        ChromaIndex(space="ip")
    with pytest.raises(RagError, match="index.M must be positive, got 0"):
        ChromaIndex(M=0)


def test_a_run_on_chroma_ranks_as_exact_search_and_reuses_its_cache_entry(tiny_files, compose_cfg):
    base = tiny_overrides(tiny_files) + ["eval.latency.sample=0"]
    exact = run(compose_cfg(base + ["index=flat_ip"]), tiny_files["out"] / "exact")
    first = run(compose_cfg(base + ["index=chroma"]), tiny_files["out"] / "chroma")
    again = run(compose_cfg(base + ["index=chroma"]), tiny_files["out"] / "again")
    assert not first["artifacts"]["index"]["hit"] and again["artifacts"]["index"]["hit"]
    assert first["artifacts"]["vectors"]["key"] == exact["artifacts"]["vectors"]["key"], "Chroma embeds nothing"
    tops = [[json.loads(x)["retrieved"] for x in (tiny_files["out"] / d / "per_question.jsonl").read_text().splitlines()]
            for d in ("exact", "chroma", "again")]
    ids = [[[r["chunk_id"] for r in q] for q in t] for t in tops]
    assert ids[0] == ids[1] == ids[2]
    assert first["config"]["index"]["_target_"] == "rag.index.chroma.ChromaIndex"
