"""The pictures of the docs (experiments/docs_images.py): every one drawn by code from a committed
sweep or a dated record of a results page, and the rule by which a committed picture differs
from what the code draws. The full comparison is `make check-docs-images`, which CI runs."""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from experiments import docs_images as DI
from rag.config.compose import PROJECT_ROOT
from rag.types import RagError

DOCS = PROJECT_ROOT / "docs"
IMAGE_SUFFIXES = {".png", ".svg", ".jpg", ".jpeg", ".gif", ".webp"}


def test_every_picture_of_the_docs_is_drawn_by_code_or_is_a_results_pages_record():
    drawn = {p.path for p in DI.PICTURES}
    results = "".join(p.read_text(encoding="utf-8") for p in (DOCS / "results").glob("*.md"))
    stray = []
    for image in sorted(p for p in DOCS.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES):
        rel = image.relative_to(PROJECT_ROOT).as_posix()
        if rel in drawn:
            continue
        # docs/results/img/...: a record of the day of the results page that shows it
        if image.is_relative_to(DOCS / "results" / "img") and f"({image.relative_to(DOCS / 'results').as_posix()})" in results:
            continue
        stray.append(rel)
    assert stray == []


def test_every_picture_drawn_by_code_is_shown_by_a_page():
    text = "".join(p.read_text(encoding="utf-8") for p in DOCS.rglob("*.md"))
    assert [p.path for p in DI.PICTURES if f"img/{p.file.name})" not in text] == []


def test_every_source_is_a_finished_sweep_recorded_without_the_machines_paths():
    from experiments.aggregate import load_records

    for source in sorted({p.source for p in DI.PICTURES}):
        folder = DI.SOURCES / source
        records = load_records([folder])
        assert records and all(r.status == "ok" for r in records), source
        assert all(r.sweep_dir.resolve() == folder.resolve() for r in records), "each run a job of the sweep"
        for f in folder.rglob("*"):
            if f.is_file():
                assert str(PROJECT_ROOT) not in f.read_text(encoding="utf-8"), f


def _png(path, pixels: np.ndarray) -> None:
    Image.fromarray(pixels.astype(np.uint8), "RGBA").save(path)


def _chart() -> np.ndarray:
    rng = np.random.default_rng(0)
    img = np.full((200, 300, 4), 255, dtype=np.int16)
    img[50:150, 40:80, :3] = 60  # a bar
    img[..., :3] -= rng.integers(0, 3, (200, 300, 3))  # anti-aliasing noise
    return img


def test_a_chart_differs_by_a_changed_bar_not_by_anti_aliasing(tmp_path):
    committed, drawn = tmp_path / "committed.png", tmp_path / "drawn.png"
    _png(committed, _chart())
    noise = _chart()
    noise[::7, ::5, :3] -= DI.LEVELS // 2  # another FreeType: edges a few levels apart
    _png(drawn, noise)
    assert DI.chart_difference(committed, drawn) is None

    taller = _chart()
    taller[30:50, 40:80, :3] = 60  # the bar 20 pixels taller: 800 of 60,000 pixels
    _png(drawn, taller)
    assert DI.chart_difference(committed, drawn) == \
        "1.33% of its pixels differ from what the code draws (at most 0.1% may)"

    _png(drawn, _chart()[:, :280])
    assert DI.chart_difference(committed, drawn) == "300x200 pixels, the code draws 280x200"


def test_a_screenshot_is_compared_by_the_page_it_shows(tmp_path):
    page = '<p>generated 2026-11-28 06:01:02 from <code>{dir}/sweep</code></p><p id="verdict">v3 beats v1</p>'
    one = DI.page_digest(page.format(dir=tmp_path / "a"), tmp_path / "a")
    again = DI.page_digest(page.replace("06:01:02", "07:15:00").format(dir=tmp_path / "b"), tmp_path / "b")
    assert one == again, "another build time and folder is the same page"
    assert DI.page_digest(page.replace("beats", "loses to").format(dir=tmp_path / "a"), tmp_path / "a") != one

    shot = tmp_path / "shot.png"
    info = PngImagePlugin.PngInfo()
    info.add_text(DI.DIGEST_KEY, one)
    Image.new("RGB", (10, 10)).save(shot, pnginfo=info)
    assert DI.screenshot_digest(shot) == one
    Image.new("RGB", (10, 10)).save(shot)
    assert DI.screenshot_digest(shot) is None


def test_recording_a_committed_sweep_again_gives_the_same_files(tmp_path):
    source = DI.SOURCES / "chunk_alpha"
    copy = DI.record("chunk_alpha", source, tmp_path, charts_only=True)
    assert copy == tmp_path / "chunk_alpha"
    files = sorted(p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file())
    changed = [f for f in files if (source / f).read_bytes() != (copy / f).read_bytes()]
    assert changed == ["multirun.yaml"], "only the note of how the sweep ran, not given here"


def test_an_unfinished_sweep_is_not_recorded(tmp_path):
    sweep = tmp_path / "sweep"
    shutil.copytree(DI.SOURCES / "chunk_alpha", sweep)
    (sweep / "0" / "metrics.json").write_text("{", encoding="utf-8")  # a job killed while writing
    with pytest.raises(RagError, match=re.escape(f"{sweep}: not a finished sweep")):
        DI.record("chunk_alpha", sweep, tmp_path / "out")
    assert not (tmp_path / "out" / "chunk_alpha").exists()


@pytest.mark.docs
def test_a_changed_chart_fails_the_check_and_the_committed_ones_pass(tmp_path):
    """`make check-docs-images` on the real sources: what CI runs, with one chart made stale."""
    assert DI.check(tmp_path / "now") == []
    stale = tmp_path / "stale.png"
    pixels = DI._pixels(PROJECT_ROOT / "docs/img/sweep_heatmap.png")
    pixels[: pixels.shape[0] // 3, :, :3] = 255 - pixels[: pixels.shape[0] // 3, :, :3]
    _png(stale, pixels)
    pictures = (DI.Picture(str(stale), "chunk_alpha", chart="grid_heatmap"),)
    assert DI.check(tmp_path / "again", pictures) == [
        f"{stale}: {DI.chart_difference(stale, PROJECT_ROOT / 'docs/img/sweep_heatmap.png')}"]
