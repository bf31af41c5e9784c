"""Question routing: a router fit on the corpus's chunks picks each question's source group from
its text; the oracle (the question's own corpus tag) stays available as an ablation."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rag.pipeline import run
from rag.retriever.lexical import BM25Retriever
from rag.retriever.routing import Router, routing_report
from rag.retriever.source_filter import source_filters
from rag.types import RagError
from tests.conftest import tiny_overrides

GROUPS = [["pubmed"], ["libc", "pytorch"]]


def clustered(rng: np.random.Generator, centre: list[float], n: int) -> np.ndarray:
    return np.asarray(centre) + 0.3 * rng.standard_normal((n, len(centre)))


@pytest.mark.parametrize("method", ["centroid", "logistic"])
def test_router_routes_to_the_nearest_group(method):
    rng = np.random.default_rng(0)
    vectors = np.vstack([clustered(rng, [1, 0, 0], 40), clustered(rng, [0, 1, 0], 30),
                         clustered(rng, [0, 1, 0.3], 30), clustered(rng, [0, 0, 1], 20)]).astype(np.float32)
    sources = ["pubmed"] * 40 + ["libc"] * 30 + ["pytorch"] * 30 + ["user"] * 20
    router = Router(GROUPS, method).fit(vectors, np.array(sources, dtype=object))
    # a source no configured group names is a group of its own, as with the oracle
    assert sorted(map(sorted, router.groups)) == [["libc", "pytorch"], ["pubmed"], ["user"]]
    routed = router.route(np.array([[0.9, 0.1, 0], [0.1, 1, 0.1], [0, 0.2, 1.1]], np.float32))
    assert routed == [frozenset({"pubmed"}), frozenset({"libc", "pytorch"}), frozenset({"user"})]


def test_router_with_one_group_routes_everything_there():
    router = Router(GROUPS).fit(np.eye(3, dtype=np.float32), np.array(["libc", "pytorch", "libc"], dtype=object))
    assert router.route(np.ones((2, 3), np.float32)) == [frozenset({"libc", "pytorch"})] * 2


def test_routing_report_counts_against_corpus_tags():
    tech, pub = frozenset({"libc", "pytorch"}), frozenset({"pubmed"})
    report = routing_report([tech, tech, pub, pub, tech], ["libc", "pytorch", "pubmed", "libc", None], GROUPS)
    assert report["accuracy"] == pytest.approx(3 / 4) and report["n"] == 4
    assert report["by_corpus"]["libc"] == {"accuracy": 0.5, "n": 2}


def test_bad_router_settings_fail_at_construction():
    with pytest.raises(RagError, match="router.method must be one of"):
        Router(GROUPS, "knn")
    with pytest.raises(RagError, match="mode=router routes in the dense embedder's space"):
        BM25Retriever(source_filter={"mode": "router", "groups": GROUPS})
    with pytest.raises(RagError, match="mode must be none, fixed, question \\(oracle\\) or router"):
        source_filters("routr", GROUPS, [], ["libc"])
    assert source_filters("oracle", GROUPS, [], ["libc"]) == source_filters("question", GROUPS, [], ["libc"])


def test_v2_routes_questions_and_reports_accuracy(tiny_files, compose_cfg):
    """On the tiny corpus every question is routed to its own group (accuracy 1.0), and retrieval
    stays inside the routed group; the oracle ablation reports no routing."""
    cfg = compose_cfg(tiny_overrides(tiny_files) + ["+version=v2"])
    result = run(cfg, tiny_files["out"] / "router")
    assert result["routing"]["method"] == "centroid"
    assert result["routing"]["accuracy"] == 1.0 and result["routing"]["n"] == 6
    rows = [json.loads(line) for line in (tiny_files["out"] / "router" / "per_question.jsonl").read_text().splitlines()]
    for r in rows:
        assert r["routed"] == (["pubmed"] if r["corpus"] == "pubmed" else ["libc", "pytorch"])
        assert r["latency_ms"]["route"] > 0
        prefixes = {"pubmed": {"pmid"}, "libc": {"man", "torch"}, "pytorch": {"man", "torch"}}[r["corpus"]]
        assert {c["doc_id"].split(":")[0] for c in r["retrieved"]} <= prefixes
    assert "route_ms_median" in result["latency"]

    oracle = run(compose_cfg(tiny_overrides(tiny_files) + ["+version=v2", "retriever.source_filter.mode=question"]),
                 tiny_files["out"] / "oracle")
    assert "routing" not in oracle
    # same groups chosen, so the same rankings
    assert oracle["metrics"]["mrr_id"] == result["metrics"]["mrr_id"]
