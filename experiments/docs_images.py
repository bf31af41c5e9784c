"""The pictures in docs/img/, drawn by the project's own code from committed sweeps, so that a
picture cannot show what the code no longer draws.

    python -m experiments.docs_images                    # draw them all again (make docs-images)
    python -m experiments.docs_images --check            # exit 1 when one differs (make check-docs-images; CI)
    python -m experiments.docs_images --record demo SWEEP_DIR   # a finished sweep's results become the source
    python -m experiments.docs_images --record chunk_alpha SWEEP_DIR --charts-only

Each picture has one source, a sweep's result files committed under docs/img/sources/<name>/
(per job: metrics.json, per_question.jsonl, the overrides and Hydra's job number and choices;
`--record` copies them from a finished sweep). From it the report is built again exactly as a
sweep's end builds it (experiments.report_files.build_report) into a temporary directory; a
chart picture is that report's chart, a screenshot is its report.html in headless Chromium
(experiments.report_check; Debian's chromium and chromium-driver, and selenium).

What "differs" means, the rule `--check` applies (docs/contributing.md, "Pictures"):

- a chart: the committed PNG and the one drawn now, pixel by pixel: a different size, or more
  than 0.1% of the pixels apart by more than 16 of 255 in a channel. Another FreeType build moves
  anti-aliased edges by a level or two; a changed label, bar or colour moves thousands of pixels.
- a screenshot: the PNG carries, in a text chunk, the SHA-256 of the report.html it shows (with
  the generation time and the directories it was built in blanked). The check builds report.html
  again and compares digests, so it needs no browser, and a new Chromium or font, which changes
  pixels but not what the project draws, does not fail it.

Pictures under docs/results/img/ are not drawn here: they are dated records of a measurement,
each made by the command its results page names.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from rag.config.compose import PROJECT_ROOT
from rag.types import RagError

SOURCES = PROJECT_ROOT / "docs" / "img" / "sources"
# The text chunk of a screenshot that names what it shows.
DIGEST_KEY = "ragrig:report-sha256"
# A chart differs when more than this share of its pixels is more than LEVELS apart in a channel.
PIXEL_SHARE = 0.001
LEVELS = 16
# A run's files that the report reads (experiments.aggregate.load_run); the rest of a run
# directory (run.log, TREC files, its own report.html) is not needed to draw the pictures.
RUN_FILES = ("metrics.json", "per_question.jsonl")
WINDOW = (1400, 900)  # the screenshots' browser window, in CSS pixels


@dataclass(frozen=True)
class Picture:
    """One picture of docs/img/: `chart` names the report's chart file (charts/<chart>.png), or
    None for a screenshot of report.html (opened at `fragment`, e.g. q=<id> for one question)."""

    path: str  # relative to the repository
    source: str  # a folder of docs/img/sources/
    chart: str | None = None
    fragment: str = ""

    @property
    def file(self) -> Path:
        return PROJECT_ROOT / self.path


# The question opened in report_question.png: v1 ranks its source document second, v2..v4 first
# (a "ranking" fix in the report's terms), and v4 alone retrieves a chunk close to the answer.
QUESTION = "libc-013"

PICTURES = (
    Picture("docs/img/demo_versions.png", "demo", chart="version_comparison"),
    Picture("docs/img/sweep_heatmap.png", "chunk_alpha", chart="grid_heatmap"),
    Picture("docs/img/report.png", "demo"),
    Picture("docs/img/report_question.png", "demo", fragment=f"q={QUESTION}"),
)

# ---------------------------------------------------------------------------------------------
# the reports


def build(source: str, out: Path, sources: Path = SOURCES) -> Path:
    """The report of the committed sweep <sources>/<source>, built into `out` as a sweep's end
    builds it; returns `out`. Raises RagError when the source is missing or holds an unfinished run."""
    from experiments.aggregate import load_records
    from experiments.report import ReportSettings
    from experiments.report_files import build_report

    src = Path(sources) / source
    if not src.is_dir():
        raise RagError(f"{src}: no such committed sweep (python -m experiments.docs_images --record {source} SWEEP_DIR)")
    records = load_records([src])
    failed = [r for r in records if r.status != "ok"]
    if not records or failed:
        why = failed[0].failure if failed else "no runs"
        raise RagError(f"{src}: a committed sweep must hold finished runs only ({why})")
    # the settings a sweep's end reads (experiments.callbacks.write_sweep_summary), as recorded
    s = records[0].config.get("report") or {}
    settings = ReportSettings(
        baseline=None if s.get("baseline") in (None, "") else str(s["baseline"]),
        formats=("png",), resamples=s.get("resamples"), seed=s.get("seed"), title=f"Sweep summary: {source}",
        min_effect=dict(s.get("min_effect") or {}))
    if s.get("max_context_chars"):
        settings.max_context_chars = int(s["max_context_chars"])
    build_report(records, out, settings, source=f"Sweep directory: `docs/img/sources/{source}`")
    return out


def page_digest(html: str, *dirs: Path) -> str:
    """SHA-256 of a report.html with what changes from one build to the next blanked: the time
    it was generated and the directories it was read from and written to."""
    html = re.sub(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}", "<time>", html)
    for d in sorted({str(Path(d).resolve()) for d in dirs} | {str(d) for d in dirs}, key=len, reverse=True):
        html = html.replace(d, "<dir>")
    return hashlib.sha256(html.encode("utf-8")).hexdigest()


def _report_digest(out: Path) -> str:
    return page_digest((out / "report.html").read_text(encoding="utf-8"), out, SOURCES, PROJECT_ROOT)


# ---------------------------------------------------------------------------------------------
# comparing


def _pixels(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGBA"), dtype=np.int16)


def chart_difference(committed: Path, drawn: Path) -> str | None:
    """None when the two PNGs show the same chart by the rule above, else how they differ."""
    a, b = _pixels(committed), _pixels(drawn)
    if a.shape != b.shape:
        return f"{a.shape[1]}x{a.shape[0]} pixels, the code draws {b.shape[1]}x{b.shape[0]}"
    apart = (np.abs(a - b) > LEVELS).any(axis=2).mean()
    if apart > PIXEL_SHARE:
        return f"{apart:.2%} of its pixels differ from what the code draws (at most {PIXEL_SHARE:.1%} may)"
    return None


def screenshot_digest(path: Path) -> str | None:
    """The digest of the report.html a screenshot shows, or None when it carries none."""
    from PIL import Image

    with Image.open(path) as im:
        return getattr(im, "text", {}).get(DIGEST_KEY)


def check(work: Path, pictures: tuple[Picture, ...] = PICTURES, sources: Path = SOURCES) -> list[str]:
    """One line per picture that differs from what the code draws now from its source."""
    problems: list[str] = []
    built: dict[str, Path] = {}
    for pic in pictures:
        if pic.source not in built:
            built[pic.source] = build(pic.source, work / pic.source, sources)
        out = built[pic.source]
        if not pic.file.is_file():
            problems.append(f"{pic.path}: missing")
            continue
        if pic.chart:
            drawn = out / "charts" / f"{pic.chart}.png"
            if not drawn.is_file():
                problems.append(f"{pic.path}: the report of its sweep ({pic.source}) no longer draws {pic.chart}")
                continue
            why = chart_difference(pic.file, drawn)
        else:
            shown, now = screenshot_digest(pic.file), _report_digest(out)
            why = None if shown == now else (
                "it carries no digest of the page it shows" if shown is None else
                f"it shows a report.html (sha256 {shown[:12]}) other than the one the code builds now ({now[:12]})")
        if why:
            problems.append(f"{pic.path}: {why}")
    return problems


# ---------------------------------------------------------------------------------------------
# drawing


def draw(work: Path) -> list[Path]:
    """Every picture drawn again from its source; returns the files written."""
    built = {s: build(s, work / s) for s in dict.fromkeys(p.source for p in PICTURES)}
    written = []
    for pic in PICTURES:
        if pic.chart:
            shutil.copyfile(built[pic.source] / "charts" / f"{pic.chart}.png", pic.file)
            written.append(pic.file)
    shots = [p for p in PICTURES if not p.chart]
    if shots:
        written += _screenshots(shots, built, work)
    return written


def _screenshots(shots: list[Picture], built: dict[str, Path], work: Path) -> list[Path]:
    from PIL import Image, PngImagePlugin

    from experiments.report_check import browser_available, load, make_driver

    why = browser_available()
    if why:
        raise RagError(f"the screenshots need headless Chromium: {why}")
    driver = make_driver(work / "chromium-profile", *WINDOW)
    written = []
    try:
        for pic in shots:
            out = built[pic.source]
            driver.get("about:blank")  # the same page at another #fragment would not load again
            load(driver, out / "report.html", fragment=pic.fragment)
            if pic.fragment:  # the question's drill-down at the top of the window
                driver.execute_script("document.getElementById('detail').scrollIntoView()")
            raw = work / f"{pic.file.stem}.raw.png"
            driver.save_screenshot(str(raw))
            info = PngImagePlugin.PngInfo()
            info.add_text(DIGEST_KEY, _report_digest(out))
            with Image.open(raw) as im:
                im.convert("RGB").save(pic.file, pnginfo=info, optimize=True)
            written.append(pic.file)
    finally:
        driver.quit()
    return written


# ---------------------------------------------------------------------------------------------
# recording a source


def record(name: str, sweep_dir: Path, sources: Path = SOURCES, charts_only: bool = False, note: str = "") -> Path:
    """Copies a finished sweep's result files into <sources>/<name>/ (replacing it): per job its
    RUN_FILES, overrides and the part of Hydra's record the report reads, with the repository's
    own path written as `.`, so that the source says nothing of the machine. `charts_only`: the
    texts of the retrieved chunks and contexts are left empty (a fifth of the size; the charts
    read none of them), for a source no screenshot shows. `note` (how, when and where the sweep
    ran) heads the sweep's multirun.yaml. Raises RagError when a job of the sweep did not finish."""
    from experiments.aggregate import find_run_dirs, load_run

    sweep_dir = Path(sweep_dir)
    runs = [load_run(p) for p in find_run_dirs([sweep_dir])]
    if not runs or any(r.status != "ok" for r in runs):
        raise RagError(f"{sweep_dir}: not a finished sweep (every job needs its metrics.json)")
    dest = Path(sources) / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=dest.parent))
    try:
        for run in runs:
            job = staging / run.path.name
            (job / ".hydra").mkdir(parents=True)
            for f in RUN_FILES:
                text = (run.path / f).read_text(encoding="utf-8").replace(str(PROJECT_ROOT), ".")
                if charts_only and f == "per_question.jsonl":
                    text = "".join(json.dumps(_without_texts(json.loads(line)), ensure_ascii=False) + "\n"
                                   for line in text.splitlines() if line.strip())
                (job / f).write_text(text, encoding="utf-8")
            hydra: dict[str, Any] = {"mode": "MULTIRUN", "job": {"num": run.job_num},
                                     "runtime": {"choices": run.choices}}
            (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(run.overrides), encoding="utf-8")
            (job / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": hydra}), encoding="utf-8")
        lines = [*note.splitlines(), "The sweep's jobs are the numbered folders beside this file."]
        (staging / "multirun.yaml").write_text("".join(f"# {line}\n" for line in lines), encoding="utf-8")
        shutil.rmtree(dest, ignore_errors=True)
        staging.rename(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest


def _without_texts(row: dict[str, Any]) -> dict[str, Any]:
    for key in ("retrieved", "contexts"):
        for item in row.get(key) or []:
            if isinstance(item, dict) and "text" in item:
                item["text"] = ""
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.docs_images", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare, draw nothing: exit 1 when a picture differs")
    ap.add_argument("--record", nargs=2, metavar=("NAME", "SWEEP_DIR"),
                    help="copy a finished sweep's result files into docs/img/sources/NAME")
    ap.add_argument("--note", default="", help="with --record: how, when and where the sweep ran")
    ap.add_argument("--charts-only", action="store_true",
                    help="with --record: leave the chunks' and contexts' texts out (no screenshot shows the source)")
    args = ap.parse_args(argv)
    try:
        if args.record:
            print(f"recorded: {record(args.record[0], Path(args.record[1]), charts_only=args.charts_only, note=args.note)}")
            return 0
        with tempfile.TemporaryDirectory(prefix="ragrig-docs-images-") as tmp:
            if args.check:
                problems = check(Path(tmp))
                for line in problems:
                    print(line, file=sys.stderr)
                if problems:
                    print("the pictures in docs/img/ differ from what the code draws: run `make docs-images` "
                          "and commit them", file=sys.stderr)
                    return 1
                print(f"docs/img: {len(PICTURES)} pictures are what the code draws")
                return 0
            for path in draw(Path(tmp)):
                print(f"drew: {path.relative_to(PROJECT_ROOT)}")
        return 0
    except RagError as e:
        print(f"docs_images: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    from rag.config.cli import run_cli  # a reader that goes away (| head -1) costs no traceback

    run_cli(main)
