"""report.html in a real browser: headless Chromium driven by selenium, its load time and every
network request it makes; and the large-report measurement.

    python -m experiments.report_check REPORT.html [--screenshot out.png]
    python -m experiments.report_check --synthetic 1000x4x20 [--out outputs/report_scale]

The second form writes a synthetic set of run directories (1,000 questions x 4 runs x 20 ranked
contexts of realistic length, see `synthetic_runs`), builds their report with
`python -m experiments.compare`'s code, and measures the file's size, the time to build it and its
load time in Chromium (navigation start to the `data-ready` flag the page's script sets once the
question table is rendered), several loads, median reported. Results go to
<out>/report_scale.json; docs/explanation/report.md holds the numbers measured here.

Needs Debian's chromium and chromium-driver and `pip install selenium` (the `browser` extra;
`make test-browser` installs them).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
CHROMEDRIVER = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
LOCAL_SCHEMES = ("file:", "data:", "about:", "blob:", "chrome:", "devtools:")


def find_binary(candidates: tuple[str, ...], name: str) -> str | None:
    for c in candidates:
        if Path(c).exists():
            return c
    return shutil.which(name)


def browser_available() -> str | None:
    """None when headless Chromium can be driven here, else why not."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium, or make test-browser)"
    if not find_binary(CHROMIUM, "chromium"):
        return "chromium is not installed (apt-get install chromium chromium-driver, or make test-browser)"
    if not find_binary(CHROMEDRIVER, "chromedriver"):
        return "chromedriver is not installed (apt-get install chromium-driver)"
    return None


def make_driver(profile_dir: Path, width: int = 1500, height: int = 1000) -> Any:
    """Headless Chromium with a fresh profile, its background traffic (updates, sync, Safe
    Browsing, QUIC probes) switched off so that any request in the log is the page's own, and
    the performance log on (every network request the page makes, via the DevTools protocol)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = find_binary(CHROMIUM, "chromium") or ""
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-default-apps", "--disable-extensions", "--disable-dev-shm-usage",
                 "--no-default-browser-check", "--metrics-recording-only", "--safebrowsing-disable-auto-update",
                 f"--user-data-dir={profile_dir}", f"--window-size={width},{height}", "--hide-scrollbars"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    service = Service(executable_path=find_binary(CHROMEDRIVER, "chromedriver"))
    return webdriver.Chrome(options=opts, service=service)


def requests_made(driver: Any) -> list[str]:
    """URLs of every request since the last call (Network.requestWillBeSent in the performance log)."""
    urls = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    return urls


def external(urls: list[str]) -> list[str]:
    return [u for u in urls if not u.startswith(LOCAL_SCHEMES)]


def load(driver: Any, path: Path, timeout: float = 60.0, fragment: str = "") -> float:
    """Opens the report (at `#fragment`, e.g. q=<id> to open a question) and waits for its ready
    flag; returns navigation start to ready, in ms."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(Path(path).resolve().as_uri() + (f"#{fragment}" if fragment else ""))
    WebDriverWait(driver, timeout).until(
        lambda d: d.execute_script("return document.documentElement.getAttribute('data-ready') === '1'"))
    return float(driver.execute_script("return window.reportReadyMs"))


# ---------------------------------------------------------------------------------------------
# the large report


WORDS = ("the of and to in a is that for it as with was on be by this are or from at an which we patients "
         "function returns file descriptor signal process memory tensor module gradient layer kernel thread "
         "lock buffer pointer value error cells expression treatment clinical study results significant "
         "increased reduced analysis protein receptor model training batch shape device").split()


def _text(rng: np.random.Generator, n_words: int) -> str:
    words = rng.choice(WORDS, n_words)
    out, sentence = [], []
    for i, w in enumerate(words):
        sentence.append(str(w))
        if len(sentence) > 8 and rng.random() < 0.12 or i == len(words) - 1:
            out.append(" ".join(sentence).capitalize() + ".")
            sentence = []
    return " ".join(out)


def synthetic_runs(root: Path, questions: int = 1000, runs: int = 4, contexts: int = 20,
                   chunk_words: int = 85, pool: int = 40, seed: int = 0) -> list[Path]:
    """Run directories shaped like the pipeline's: per question `contexts` ranked chunks of about
    chunk_words words (~500 characters, chunk_size 512) drawn from a pool of `pool` chunks per
    question (so runs overlap as real variants do), an answer, and every metric."""
    from eval.stats import bootstrap_ci
    from rag.run.result import Objective, RunResult

    rng = np.random.default_rng(seed)
    corpora = ["pubmed", "libc", "pytorch"]
    qs = []
    for i in range(questions):
        corpus = corpora[i % 3]
        chunks = [(f"doc{i}-{j // 4}#{j}", _text(rng, chunk_words + int(rng.integers(-20, 20)))) for j in range(pool)]
        qs.append({"id": f"{corpus}-{i:04d}", "question": _text(rng, 14).rstrip(".") + "?",
                   "ground_truth": _text(rng, 35), "source": f"doc{i}-0", "corpus": corpus, "pool": chunks})
    dirs = []
    names = ["recall_at_k", "mrr", "precision_at_k", "hit_at_k_id", "mrr_id", "answer_gt", "grounding", "hallucination"]
    for r in range(runs):
        d = root / f"v{r + 1}"
        d.mkdir(parents=True, exist_ok=True)
        recs = []
        for q in qs:
            order = rng.permutation(len(q["pool"]))[:contexts] if contexts <= len(q["pool"]) else \
                rng.integers(0, len(q["pool"]), contexts)
            retrieved = [{"rank": k + 1, "chunk_id": q["pool"][j][0], "doc_id": q["pool"][j][0].split("#")[0],
                          "score": float(1 / (k + 1)), "sim_to_truth": float(rng.uniform(0.2, 0.95)),
                          "relevant": bool(rng.random() < 0.3), "text": q["pool"][j][1]} for k, j in enumerate(order)]
            m = {n: float(rng.random()) for n in names}
            m["hallucination"] = float(rng.random() < 0.2)
            recs.append({"id": q["id"], "question": q["question"], "ground_truth": q["ground_truth"],
                         "source": q["source"], "corpus": q["corpus"], "retrieved": retrieved,
                         "answer": _text(rng, 30), **m,
                         "latency_ms": {"retrieve": float(rng.uniform(5, 15)), "rerank": 0.0},
                         "contexts": [{"label": "", "text": e["text"]} for e in retrieved[:5]]})
        metrics: dict[str, dict[str, Any]] = {}
        for n in names:
            v = np.array([x[n] for x in recs])
            lo, hi = bootstrap_ci(v, 200, seed=0)
            metrics[n] = {"mean": float(v.mean()), "ci95": [lo, hi], "n": len(v)}
        doc = RunResult(variant=f"v{r + 1}", objective=Objective("mrr", metrics["mrr"]["mean"]), metrics=metrics,
                        by_corpus={}, counts={"questions": questions}, latency={}, timings_s={}, artifacts={},
                        config={"variant": f"v{r + 1}", "objective": "mrr", "eval": {"k": contexts}}).to_json()
        (d / "per_question.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
        (d / "metrics.json").write_text(json.dumps(doc))
        dirs.append(d)
    return dirs


# Times (ms) of what a user does next: filter by text, sort a column, open a question.
INTERACTION_JS = """
const t = () => performance.now(), out = {};
let s = t(); const f = document.getElementById('f-text'); f.value = 'e'; f.dispatchEvent(new Event('input'));
out.filter_ms = t() - s; f.value = ''; f.dispatchEvent(new Event('input'));
s = t(); document.querySelectorAll('#qtable thead th')[3].click(); out.sort_ms = t() - s;
s = t(); document.querySelector('#qtable tbody tr').click(); out.open_question_ms = t() - s;
return out;
"""


def measure(path: Path, loads: int = 5) -> dict[str, Any]:
    """Size, load times (median of `loads`, each in a fresh page) and external requests."""
    with tempfile.TemporaryDirectory(prefix="ragrig-chromium-") as profile:
        driver = make_driver(Path(profile))
        try:
            times, ext = [], []
            for _ in range(loads):
                driver.get("about:blank")
                requests_made(driver)
                times.append(load(driver, path))
                ext += external(requests_made(driver))
            rows = driver.execute_script("return document.querySelectorAll('#qtable tbody tr').length")
            interaction = driver.execute_script(INTERACTION_JS)
            version = driver.capabilities.get("browserVersion", "")
        finally:
            driver.quit()
    return {"bytes": Path(path).stat().st_size, "load_ms": times, "load_ms_median": statistics.median(times),
            "rows": rows, **interaction, "external_requests": ext, "chromium": version,
            "loadavg_1min": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}


def scale(out: Path, questions: int, runs: int, contexts: int) -> dict[str, Any]:
    from experiments.aggregate import load_records
    from experiments.report import ReportSettings
    from experiments.report_files import build_report

    out = Path(out)
    shutil.rmtree(out, ignore_errors=True)
    synthetic_runs(out / "runs", questions, runs, contexts)
    t0 = time.perf_counter()
    rep = build_report(load_records([out / "runs"]), out / "report", ReportSettings(title="Scale check", formats=("svg",)))
    build_s = time.perf_counter() - t0
    if rep.html is None:
        raise RuntimeError(f"{out / 'report'}: report.html was not written (the log says why)")
    res = {"questions": questions, "runs": runs, "contexts": contexts, "build_s": round(build_s, 2),
           "report": str(rep.html), **measure(rep.html)}
    (out / "report_scale.json").write_text(json.dumps(res, indent=2))
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.report_check", description=__doc__.splitlines()[0])
    ap.add_argument("report", nargs="?", type=Path, help="a report.html to open and measure")
    ap.add_argument("--screenshot", type=Path, help="save a screenshot of the opened report")
    ap.add_argument("--question", help="with --screenshot: open this question id first")
    ap.add_argument("--size", default="1500x1000", help="with --screenshot: window size WIDTHxHEIGHT")
    ap.add_argument("--synthetic", help="QUESTIONSxRUNSxCONTEXTS, e.g. 1000x4x20: build and measure a synthetic report")
    ap.add_argument("--out", type=Path, default=Path("outputs/report_scale"))
    args = ap.parse_args(argv)
    why = browser_available()
    if why:
        print(f"report_check: {why}", file=sys.stderr)
        return 2
    if args.synthetic:
        q, r, c = (int(x) for x in args.synthetic.lower().split("x"))
        print(json.dumps(scale(args.out, q, r, c), indent=2))
        return 0
    if not args.report or not args.report.exists():
        print("report_check: give a report.html or --synthetic", file=sys.stderr)
        return 2
    res = measure(args.report)
    if args.screenshot:
        w, h = (int(x) for x in args.size.lower().split("x"))
        with tempfile.TemporaryDirectory(prefix="ragrig-chromium-") as profile:
            driver = make_driver(Path(profile), w, h)
            try:
                load(driver, args.report, fragment=f"q={args.question}" if args.question else "")
                driver.save_screenshot(str(args.screenshot))
            finally:
                driver.quit()
    print(json.dumps(res, indent=2))
    return 0 if not res["external_requests"] else 1


if __name__ == "__main__":
    from rag.config.cli import run_cli

    run_cli(main)
