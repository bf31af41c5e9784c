"""report.html without a browser: what the page embeds (every question, each run's contexts with
their matching span, labels, answers), that it can fetch nothing, that big runs are cut to size,
and that a single run writes its page without ever risking its results. tests/test_browser.py
opens the page in Chromium."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from experiments import html_report as H
from experiments import page_data
from experiments.aggregate import load_records
from experiments.report import ReportSettings
from experiments.report_files import build_report
from tests.test_experiments import write_run

TRUTH = "The fcntl64 call was added in Linux 2.4 to handle large file offsets in the flock structure."
CHUNK = ("fcntl - manipulate file descriptor. The original Linux fcntl() system call was not designed to handle "
         "large file offsets in the flock structure. Consequently, an fcntl64() system call was added in Linux 2.4. "
         "See also open(2) and lockf(3).")
SPAN = "The original Linux fcntl() system call was not designed to handle large file offsets in the flock structure."


def rich_run(path: Path, variant: str, ids: list[str], shift: float, seed: int) -> Path:
    """A run whose per-question records look like the pipeline's (eval/scoring.py): question,
    ground truth, source, ranked contexts with scores and texts, answer, LLM contexts, latency."""
    rng = np.random.default_rng(seed)
    mrr = np.clip(rng.uniform(0, 1, len(ids)) + shift, 0, 1)
    write_run(path, variant=variant, overrides=[f"+version={variant}"], ids=ids,
              values={"mrr": list(mrr), "hit_at_k_id": list((mrr > 0.5).astype(float))},
              question_latency=list(rng.uniform(5, 9, len(ids))))
    rows = [json.loads(x) for x in (path / "per_question.jsonl").read_text().splitlines()]
    for i, r in enumerate(rows):
        r.update(question=f"Why was fcntl64 added? ({r['id']})", ground_truth=TRUTH, source="man:fcntl.2",
                 corpus=["libc", "pubmed"][i % 2], answer=f"Because of large offsets </script><!-- {variant}")
        r["retrieved"] = [
            {"rank": 1, "chunk_id": "man:fcntl.2#0", "doc_id": "man:fcntl.2", "score": 0.9, "sim_to_truth": 0.81,
             "relevant": True, "text": CHUNK},
            {"rank": 2, "chunk_id": "pmid:77#3", "doc_id": "pmid:77", "score": 0.5, "sim_to_truth": 0.2,
             "relevant": False, "text": f"Unrelated abstract {i} about statins and cardiovascular outcomes.",
             "relevant_label": 0},
            {"rank": 3, "chunk_id": "torch:torch.nn.Module#1", "doc_id": "torch:torch.nn.Module", "score": 0.4,
             "sim_to_truth": 0.3, "relevant": False, "text": "Base class for all neural network modules.",
             "span": [0, 10]},
        ]
        r["contexts"] = [{"label": "man page fcntl(2)", "text": CHUNK}]
    (path / "per_question.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def embedded(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert m, "no embedded data"
    return json.loads(m.group(1))


@pytest.fixture
def two_runs(tmp_path) -> tuple[Path, list]:
    ids = [f"q{i}" for i in range(30)]
    rich_run(tmp_path / "runs" / "v1", "v1", ids, 0.0, 1)
    rich_run(tmp_path / "runs" / "v2", "v2", ids[5:], 0.2, 2)  # five questions fewer
    records = load_records([tmp_path / "runs"])
    rep = build_report(records, tmp_path / "out", ReportSettings(formats=("png",)))
    return rep.html, records


def test_inline_svg_prefixes_ids_and_refuses_external_references():
    svg = ('<?xml version="1.0"?>\n<!DOCTYPE svg PUBLIC "-//W3C//DTD SVG 1.1//EN" "x.dtd">\n'
           '<svg xmlns:xlink="http://www.w3.org/1999/xlink" width="10pt" height="5pt" viewBox="0 0 10 5">'
           '<metadata>rdf</metadata><defs><path id="g1"/></defs><use xlink:href="#g1"/>'
           '<g clip-path="url(#c1)"/></svg>')
    out = H.inline_svg(svg, "c0-")
    assert out.startswith("<svg") and "<?xml" not in out and "DOCTYPE" not in out and "metadata" not in out
    assert 'id="c0-g1"' in out and 'xlink:href="#c0-g1"' in out and "url(#c0-c1)" in out
    assert 'width="100%"' in out and 'height="5pt"' not in out
    with pytest.raises(ValueError):
        H.inline_svg('<svg><image xlink:href="https://example.com/x.png"/></svg>', "p")


def test_report_embeds_every_question_and_can_fetch_nothing(two_runs):
    page_path, records = two_runs
    page = page_path.read_text(encoding="utf-8")
    assert "default-src 'none'" in page  # the browser itself refuses any request
    assert not re.search(r'(?:src|href)\s*=\s*"(?:https?:)?//', page)  # nothing external to load
    assert "<script src" not in page and "<link" not in page and "@import" not in page
    data = embedded(page)
    assert data["runs"] == ["v1", "v2"] and data["baseline"] == "v1"
    qs = {q["id"]: q for q in data["questions"]}
    assert len(qs) == 30  # the union of both runs' questions
    assert qs["q0"]["runs"][1] is None and qs["q7"]["runs"][1] is not None  # q0..q4 are not in v2
    q = qs["q7"]
    assert q["ground_truth"] == TRUTH and q["source"] == "man page fcntl(2)" and q["corpus"] in ("libc", "pubmed")
    assert q["source_id"] == "man:fcntl.2"
    run = q["runs"][0]
    strings, labels = data["strings"], data["labels"]
    assert "</script>" in strings[run["answer"]]  # the answer survives, escaped inside the JSON
    ranked = run["retrieved"]  # a table by column: entry i of each list is the chunk ranked i + 1
    assert ranked["rank"] == [1, 2, 3] and ranked["relevant"] == [True, False, False]
    (start, end), _, third_span = ranked["span"]
    assert strings[ranked["text"][0]][start:end] == SPAN
    first, second, _ = (labels[i] for i in ranked["labels"])
    assert first == {"source document": True}  # no label field: the doc-id match
    assert second == {"relevant_label": 0}  # a label field the scorer added is shown as is
    assert third_span == [0, 10]  # a labelled span wins over the word-overlap one
    assert data["docs"]["pmid:77"] == "PubMed PMID 77" and data["docs"]["torch:torch.nn.Module"] == "PyTorch torch.nn.Module"
    assert len(strings) == len(set(strings))  # every string stored once
    assert [m["name"] for m in data["metrics"]] == ["mrr", "hit_at_k_id", "latency_ms"]
    lat = [m for m in data["metrics"] if m["name"] == "latency_ms"][0]
    assert lat["higher_is_better"] is False
    # the same statistics as the summary: verdict and differences come from the Report
    md = (page_path.parent / "summary.md").read_text()
    verdict = re.search(r'id="verdict-text">(.*?)</p>', page, re.S).group(1)
    assert verdict.replace("&#39;", "'") in md and "over 25 shared questions" in md
    assert 'id="chart-version_comparison"' in page and "<svg" in page  # rendered as SVG for the page
    assert not (page_path.parent / "charts" / "version_comparison.svg").exists()  # summary asked for PNG only
    assert "↓ lower is better" in page


def test_big_reports_are_cut_to_size(tmp_path, monkeypatch):
    ids = [f"q{i}" for i in range(40)]
    rich_run(tmp_path / "runs" / "v1", "v1", ids, 0.0, 1)
    path = tmp_path / "runs" / "v1" / "per_question.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    for i, r in enumerate(rows):
        for j, e in enumerate(r["retrieved"]):
            e["text"] = f"{i}-{j} " + "filler words here. " * 200 + CHUNK
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(page_data, "TEXT_BUDGET_CHARS", 40_000)
    rep = build_report(load_records([tmp_path / "runs"]), tmp_path / "out", ReportSettings(charts=False))
    data = embedded(rep.html.read_text(encoding="utf-8"))
    assert page_data.MIN_CONTEXT_CHARS <= data["context_limit"] < 1200
    ranked = data["questions"][0]["runs"][0]["retrieved"]
    text = data["strings"][ranked["text"][0]]
    assert len(text) <= data["context_limit"] + 2 and text.startswith("…")  # cut around the span, not the head
    start, end = ranked["span"][0]
    assert text[start:end] == SPAN
    assert f"cut to {data['context_limit']} characters" in rep.html.read_text(encoding="utf-8")


def test_single_run_writes_its_page_and_a_failure_costs_nothing(tmp_path, monkeypatch, caplog):
    run = rich_run(tmp_path / "run", "v2", [f"q{i}" for i in range(12)], 0.0, 3)
    page = H.write_run_report(run)
    assert page == run / "report.html"
    data = embedded(page.read_text(encoding="utf-8"))
    assert len(data["questions"]) == 12 and data["runs"] == ["v2"]
    assert not (run / "summary.md").exists()  # a run's directory gets the page only

    before = (run / "metrics.json").read_bytes()
    page.unlink()

    def broken(*a, **k):
        raise RuntimeError("template exploded")

    monkeypatch.setattr(H, "render_html", broken)
    assert H.write_run_report(run) is None  # logged, not raised
    assert "template exploded" in caplog.text
    assert (run / "metrics.json").read_bytes() == before and not (run / "report.html").exists()
    assert not list(run.glob(".report.html.tmp-*"))
