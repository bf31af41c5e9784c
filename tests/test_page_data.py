"""experiments/page_data.py: the data report.html embeds. The span of a chunk that matches the
ground truth, texts cut around it to fit the page, and the contract with the page's script: the
data has exactly the fields the TypedDicts name, and report.js reads each of them by that name."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from experiments import page_data as P
from experiments.aggregate import load_records
from experiments.report import ReportSettings
from experiments.report_files import build_report
from tests.test_report_html import CHUNK, SPAN, TRUTH, embedded, rich_run

JS = Path(P.__file__).parent / "templates" / "report.js"


def test_match_span_picks_the_sentence_that_shares_the_truths_words():
    s, e = P.match_span(CHUNK, P.content_words(TRUTH))
    assert CHUNK[s:e] == SPAN  # 8 of its 12 content words are the truth's; the next sentence shares 4 of 6
    assert P.match_span(CHUNK, P.content_words("statins reduce cardiovascular events")) is None
    run_on = " ".join(f"w{i}" for i in range(200)) + " large file offsets flock structure " + " ".join("x" * 3 for _ in range(50))
    s, e = P.match_span(run_on, P.content_words("large file offsets in the flock structure"))
    assert "large file offsets flock structure" in run_on[s:e] and len(run_on[s:e].split()) <= P.WINDOW_WORDS


def test_sources_are_named_as_the_context_labels_name_them():
    from rag.context import source_label

    for doc_id in ("pmid:123", "man:fcntl.2", "man:x", "torch:torch.nn.Module", "torchdoc:notes/amp", "other:1", "plain"):
        assert P.source_label(doc_id) == source_label(doc_id), doc_id


def test_cut_keeps_the_span_and_its_offsets():
    span = P.match_span(CHUNK, P.content_words(TRUTH))
    text, s, e = P.cut(CHUNK, span, 80)
    assert len(text) <= 82 and text.startswith("…")
    assert text[s:e] in CHUNK[span[0]:span[1]] and e - s > 20
    assert P.cut(CHUNK, span, 10_000) == (CHUNK, *span)
    assert P.cut("a" * 50, None, 20) == ("a" * 20 + "…", -1, -1)


def test_context_limit_fits_the_budget():
    lengths = [500] * 1000
    assert P.context_limit(lengths, 1200, budget=10**6) == 1200
    limit = P.context_limit(lengths, 1200, budget=300_000)
    assert sum(min(n, limit) for n in lengths) <= 300_000 < sum(min(n, limit + 1) for n in lengths)
    assert P.context_limit(lengths, 1200, budget=10) == P.MIN_CONTEXT_CHARS


@pytest.fixture
def page(tmp_path) -> dict[str, Any]:
    ids = [f"q{i}" for i in range(8)]
    rich_run(tmp_path / "runs" / "v1", "v1", ids, 0.0, 1)
    rich_run(tmp_path / "runs" / "v2", "v2", ids[2:], 0.2, 2)
    rep = build_report(load_records([tmp_path / "runs"]), tmp_path / "out", ReportSettings(charts=False))
    return embedded(rep.html.read_text(encoding="utf-8"))


def keys(typed: Any) -> set[str]:
    return set(typed.__required_keys__) | set(typed.__optional_keys__)


def test_the_page_data_has_the_contracts_fields_and_no_others(page):
    assert set(page) == keys(P.PageData)
    q = page["questions"][0]
    assert set(q) == set(P.QuestionData.__required_keys__) and q["runs"][1] is None  # q0 is not in v2
    assert not any("generated" in x for x in page["questions"]), "written by people: nothing marks them"
    run = page["questions"][3]["runs"][1]
    assert set(run) == keys(P.RunData) and len(run["metrics"]) == len(page["metrics"])
    ranked, given = run["retrieved"], run["contexts"]
    assert set(ranked) == keys(P.RetrievedData) and set(given) == keys(P.ContextData)
    assert {len(v) for v in ranked.values()} == {3} and {len(v) for v in given.values()} == {1}  # tables by column
    assert isinstance(ranked["relevant"][0], bool) and run["latency_ms"]


def test_a_generated_question_carries_how_it_was_made_and_its_passages(tmp_path):
    ids = [f"q{i}" for i in range(4)]
    run = rich_run(tmp_path / "runs" / "v1", "v1", ids, 0.0, 1)
    lines = [json.loads(x) for x in (run / "per_question.jsonl").read_text().splitlines()]
    lines[1]["provenance"] = {"kind": "factoid", "generator": {"class": "HFGenerator", "model": "org/SmolLM2-135M"},
                              "prompts": {}, "scores": {},
                              "passages": [{"id": "man:fcntl.2#0", "doc_id": "man:fcntl.2", "start": 0, "end": len(CHUNK),
                                            "text": CHUNK},
                                           {"id": "man:x#0", "doc_id": "man:x", "start": 5, "end": 9}]}
    (run / "per_question.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    rep = build_report(load_records([tmp_path / "runs"]), tmp_path / "out", ReportSettings(charts=False))
    page = embedded(rep.html.read_text(encoding="utf-8"))
    human, gen = page["questions"][0], page["questions"][1]
    assert "generated" not in human and set(gen) == keys(P.QuestionData)
    g = gen["generated"]
    assert set(g) == keys(P.GeneratedData) and (g["kind"], g["generator"]) == ("factoid", "SmolLM2-135M")
    first, second = g["passages"]
    assert set(first) == keys(P.PassageData) and page["strings"][first["doc_id"]] == "man:fcntl.2"
    s, e = first["span"]
    assert page["strings"][first["text"]][s:e] == SPAN  # the ground truth's sentence, highlighted
    assert second["text"] == -1 and second["span"] is None and (second["start"], second["end"]) == (5, 9)


@pytest.mark.parametrize("typed", [P.QuestionData, P.RunData, P.RetrievedData, P.ContextData, P.GeneratedData,
                                   P.PassageData])
def test_report_js_reads_every_field_by_its_name(typed):
    js = JS.read_text(encoding="utf-8")
    unread = [k for k in keys(typed) if not re.search(rf"\.{k}\b|\"{k}\"", js)]
    assert not unread, f"report.js reads no {unread} of {typed.__name__}"
