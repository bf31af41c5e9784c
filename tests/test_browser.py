"""report.html in a real browser (headless Chromium via selenium; `make test-browser`).

A small real sweep (v1 and v2 with extractive answers, on the tiny corpus) writes its report;
Chromium opens it from disk and the tests read what a user sees: the verdict, one table row per
question, filtering, the win/lose filter, sorting, a question's drill-down, and that the page made
no network request. Screenshots land in each test's tmp directory."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.report_check import browser_available, external, load, make_driver, requests_made
from rag.config.compose import PROJECT_ROOT
from tests.conftest import TINY_DOCS, TINY_QA, tiny_overrides, write_jsonl

pytestmark = pytest.mark.browser

ENV_EXTRA = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    import os

    root = tmp_path_factory.mktemp("browser")
    files = {
        "corpus": write_jsonl(root / "corpus.jsonl", [{"id": i, "text": t, "source": s} for i, s, t in TINY_DOCS]),
        "qa": write_jsonl(root / "qa.jsonl", [{"id": i, "question": q, "answer": a, "source": s, "corpus": c}
                                              for i, q, a, s, c in TINY_QA]),
        "cache": root / "cache",
    }
    sweep_dir = root / "sweep"
    cmd = [sys.executable, str(PROJECT_ROOT / "run.py"), "-m", *tiny_overrides(files), "sweep=versions",
           "+version=v1,v2", "llm=extractive", f"hydra.sweep.dir={sweep_dir}"]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **ENV_EXTRA}, timeout=600,
                          cwd=PROJECT_ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"report:   {sweep_dir / 'report.html'}" in done.stdout  # the multirun's last words name the page
    return sweep_dir


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    why = browser_available()
    if why:
        pytest.fail(f"browser tests need headless Chromium: {why}")
    d = make_driver(tmp_path_factory.mktemp("chromium-profile"))
    yield d
    d.quit()


def per_question(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "per_question.jsonl").read_text().splitlines() if x.strip()]


def visible_rows(driver) -> list:
    return [r for r in driver.find_elements("css selector", "#qtable tbody tr") if r.is_displayed()]


def open_report(driver, path: Path) -> None:
    driver.get("about:blank")
    requests_made(driver)  # start the log afresh
    load(driver, path)


def test_report_opens_offline_with_verdict_and_every_question(sweep, driver, tmp_path):
    open_report(driver, sweep / "report.html")
    verdict = driver.find_element("id", "verdict-text").text
    md = (sweep / "summary.md").read_text()
    # the same words as the summary's verdict (WebDriver reads no-break spaces as spaces)
    assert verdict and verdict in md.replace("\n", " ").replace("\u00a0", " ")
    assert verdict.startswith("Against the baseline v1")
    assert len(visible_rows(driver)) == len(TINY_QA)
    assert driver.find_element("id", "count").text == f"showing {len(TINY_QA)} of {len(TINY_QA)} questions"
    # the summary's charts are inline SVG, and metric glossary and configuration are there
    assert driver.find_elements("css selector", "#charts figure svg")
    assert "hallucination rate" in driver.find_element("id", "metrics").text
    assert driver.find_elements("css selector", "table.config tr.differs")
    urls = requests_made(driver)
    assert urls and all(u.startswith("file:") for u in urls if not u.startswith(("data:", "about:")))
    assert external(urls) == [], external(urls)
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors
    driver.save_screenshot(str(tmp_path / "report_top.png"))


def test_filters_sorting_and_a_question_side_by_side(sweep, driver, tmp_path):
    open_report(driver, sweep / "report.html")
    from selenium.webdriver.support.ui import Select

    text = driver.find_element("id", "f-text")
    text.send_keys("fcntl64")
    assert [r.find_element("css selector", "td").text for r in visible_rows(driver)] == ["q1"]
    text.clear()
    text.send_keys(" ")  # an input event; blank matches everything
    assert len(visible_rows(driver)) == len(TINY_QA)

    Select(driver.find_element("id", "f-corpus")).select_by_value("pytorch")
    assert sorted(r.find_element("css selector", "td").text for r in visible_rows(driver)) == ["q3", "q4"]
    Select(driver.find_element("id", "f-corpus")).select_by_value("")

    # "questions where v2 loses against v1" on the first metric shown (the objective, MRR)
    base = {r["id"]: r["mrr"] for r in per_question(sweep / "0")}
    other = {r["id"]: r["mrr"] for r in per_question(sweep / "1")}
    for outcome, expected in (("lose", {q for q in base if other[q] < base[q]}),
                              ("win", {q for q in base if other[q] > base[q]}),
                              ("tie", {q for q in base if other[q] == base[q]})):
        Select(driver.find_element("id", "f-run")).select_by_visible_text("v2")
        Select(driver.find_element("id", "f-outcome")).select_by_value(outcome)
        shown = {r.find_element("css selector", "td").text for r in visible_rows(driver)}
        assert shown == expected, (outcome, shown, expected)
    Select(driver.find_element("id", "f-outcome")).select_by_value("")
    Select(driver.find_element("id", "f-run")).select_by_value("")

    # by fault class (experiments/faults.py) for v2, and the questions v2 fixes against v1
    from experiments.aggregate import load_run
    from experiments.faults import CLASSES, classify, transitions

    v1, v2 = load_run(sweep / "0"), load_run(sweep / "1")
    classes = {r["id"]: classify(r) for r in v2.per_question()}
    Select(driver.find_element("id", "f-run")).select_by_visible_text("v2")
    for i, c in enumerate(CLASSES):
        Select(driver.find_element("id", "f-class")).select_by_value(str(i))
        shown = {r.find_element("css selector", "td").text for r in visible_rows(driver)}
        assert shown == {q for q, k in classes.items() if k == c}, (c, shown)
    Select(driver.find_element("id", "f-class")).select_by_value("")
    Select(driver.find_element("id", "f-trans")).select_by_value("1")
    shown = {r.find_element("css selector", "td").text for r in visible_rows(driver)}
    assert shown == set(transitions(v1, v2)["ids"]["fixed"])
    Select(driver.find_element("id", "f-trans")).select_by_value("")
    Select(driver.find_element("id", "f-run")).select_by_value("")
    assert len(visible_rows(driver)) == len(TINY_QA)

    # sort by v2's MRR, descending on the second click
    header = [th for th in driver.find_elements("css selector", "#qtable thead th") if th.text.startswith("v2 ·")][0]
    header.click()
    header = [th for th in driver.find_elements("css selector", "#qtable thead th") if th.text.startswith("v2 ·")][0]
    header.click()
    col = [th.text for th in driver.find_elements("css selector", "#qtable thead th")].index(header.text)
    values = [float(r.find_elements("css selector", "td")[col].text) for r in visible_rows(driver)]
    assert values == sorted(values, reverse=True)

    # open q1: its text, ground truth, and both runs side by side with ranked, highlighted contexts
    row = [r for r in visible_rows(driver) if r.find_element("css selector", "td").text == "q1"][0]
    row.click()
    detail = driver.find_element("id", "detail")
    assert detail.is_displayed()
    body = driver.find_element("id", "d-body").text
    assert TINY_QA[0][1] in body and TINY_QA[0][2] in body
    assert "man page fcntl(2)" in body  # the source, shown as a man page
    runs = driver.find_elements("css selector", ".runs .run")
    assert [r.find_element("css selector", "h4").text.split()[0] for r in runs] == ["v1", "v2"]
    k = len(per_question(sweep / "0")[0]["retrieved"])
    for r in runs:
        assert len(r.find_elements("css selector", ":scope > .ctx")) == k
        # badges: relevance by similarity, and the label the scorer derived from the question's source
        assert "Answer" in r.text and "relevant (sim" in r.text and "relevant_label" in r.text
    assert driver.find_elements("css selector", ".runs mark")  # the span matching the ground truth
    assert driver.current_url.endswith("#q=q1")
    driver.save_screenshot(str(tmp_path / "report_question.png"))
    driver.find_element("id", "d-close").click()
    assert not detail.is_displayed()
    assert external(requests_made(driver)) == []


def test_single_run_report_opens(sweep, driver, tmp_path):
    page = sweep / "0" / "report.html"
    assert page.exists()  # written next to metrics.json by the run itself
    open_report(driver, page)
    assert len(visible_rows(driver)) == len(TINY_QA)
    assert driver.find_element("id", "verdict-text").text.startswith("One run (v1)")
    assert external(requests_made(driver)) == []
    driver.save_screenshot(str(tmp_path / "run_report.png"))
