"""Latency is measured by the run that reports it: candidates may come from the cache's memory
tier, times never do (rag/run/latency.py, rag/run/query.py, rag/retriever/base.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rag.run import latency
from rag.store.cache import ArtifactCache, clear_memory
from rag.run.pipeline import run
from rag.run.query import retrieve_rerank
from rag.retriever.base import Retriever
from rag.types import Hits, RagError
from tests.conftest import tiny_overrides


class CountingRetriever(Retriever):
    """Searches nothing real; counts how often it is asked to search."""

    def __init__(self, cache: ArtifactCache) -> None:
        super().__init__()
        self.calls = 0
        self._artifacts = type("Prepared", (), {"cache": cache})()

    def _allowed(self, f):
        return None

    def _signature(self):
        return ("counting",)

    def _search(self, queries, n, allowed):
        self.calls += len(queries)
        return Hits(np.zeros((len(queries), n), np.int64), np.ones((len(queries), n), np.float32))


class NoRerank:
    def rerank(self, queries, hits, chunks, k, reuse=True):
        return hits


def test_kept_candidates_serve_later_searches_but_timed_searches_always_search(tmp_path):
    r = CountingRetriever(ArtifactCache(tmp_path))
    for _ in range(2):
        for q in ("a", "b"):
            r.search_one(q, 3)
    assert r.calls == 2  # the second pass came from the memory tier
    for q in ("a", "b"):
        hits, retrieve_ms, rerank_ms = retrieve_rerank(r, NoRerank(), q, None, 3, [], 3, reuse=False)
        assert retrieve_ms > 0 and rerank_ms >= 0 and hits.width == 3
    assert r.calls == 4  # timed: searched anew


def test_sample_is_spread_over_the_questions():
    assert list(latency.sample_rows(10, 4)) == [0, 3, 6, 9]
    assert list(latency.sample_rows(5, None)) == [0, 1, 2, 3, 4]
    assert list(latency.sample_rows(5, 50)) == [0, 1, 2, 3, 4]
    assert len(latency.sample_rows(5, 0)) == 0  # latency off


def test_measure_repeats_each_sampled_question_after_a_warmup(tmp_path):
    r = CountingRetriever(ArtifactCache(tmp_path))
    settings = latency.LatencySettings(sample=4, repeats=3, warmup=2)
    rows, ms, method = latency.measure(r, NoRerank(), [f"q{i}" for i in range(10)], [None] * 10, 5, [], 5, settings)
    assert r.calls == 2 + 4 * 3
    assert len(rows) == 4 and ms["retrieve"].shape == (4,) and ms["rerank"].shape == (4,)
    assert method["questions"] == 4 and method["repeats"] == 3 and method["warmup"] == 2


def test_bad_latency_settings_are_one_line():
    with pytest.raises(RagError, match="eval.latency.repeats"):
        latency.LatencySettings(repeats=0)
    with pytest.raises(RagError, match="unknown key"):
        latency.LatencySettings.from_config({"samples": 3})


def test_each_run_of_a_sweep_measures_its_own_latency(tiny_files, compose_cfg):
    """Two runs in one process that differ only in fusion: the second gets its candidates from the
    cache's memory tier, yet reports latencies it timed itself, and says how."""
    clear_memory()
    base = tiny_overrides(tiny_files) + ["retriever=hybrid", "fusion=weighted", "eval.latency.sample=4",
                                         "eval.latency.repeats=2"]
    docs = []
    for i, alpha in enumerate((0.3, 0.7)):
        run(compose_cfg(base + [f"fusion.alpha={alpha}"]), tiny_files["out"] / str(i))
        docs.append(json.loads((tiny_files["out"] / str(i) / "metrics.json").read_text()))
    for d in docs:
        m = d["latency_method"]
        assert m["questions"] == 4 and m["repeats"] == 2 and "memo bypassed" in m["measured"]
        assert d["latency"]["retrieve_ms_median"] > 0 and "retrieve_ms_p95" in d["latency"]
        assert d["timings_s"]["latency"] > 0
    rows = [json.loads(x) for x in (tiny_files["out"] / "1" / "per_question.jsonl").read_text().splitlines()]
    assert sum(bool(r["latency_ms"]) for r in rows) == 4  # only the sampled questions carry one
