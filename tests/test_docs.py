"""The documentation: the commands its pages mark run as written (marker docs, make test-docs),
the README's verdict block is what a demo prints (marker demo, make check-demo, after make demo),
and the rules every page keeps (default suite)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from rag.config.compose import PROJECT_ROOT
from tests.docs_blocks import (
    Block,
    demo_verdict,
    marked_blocks,
    readme_verdict,
    run_block,
    verdict_mismatch,
)

README = PROJECT_ROOT / "README.md"
DOCS = PROJECT_ROOT / "docs"
FIXTURES = Path(__file__).parent / "fixtures"
PAGES = sorted([README, *DOCS.rglob("*.md")])


def rel(path: Path) -> str:
    return path.relative_to(PROJECT_ROOT).as_posix()


def page_blocks() -> dict[str, list[Block]]:
    found = {rel(p): marked_blocks(p.read_text(encoding="utf-8"), rel(p)) for p in PAGES}
    return {page: blocks for page, blocks in found.items() if blocks}


# -- the marked commands run ---------------------------------------------------------------------


@pytest.mark.docs
@pytest.mark.parametrize("page", sorted(page_blocks()))
def test_the_commands_a_page_marks_run_as_written(page):
    for block in page_blocks()[page]:
        done = run_block(block, PROJECT_ROOT)
        printed = done.stdout + done.stderr
        assert done.returncode == 0, f"{block} exited {done.returncode}:\n{printed[-4000:]}"
        if block.expect:
            assert block.expect in printed, f"{block}: {block.expect!r} not in what it printed:\n{printed[-4000:]}"


@pytest.mark.docs
def test_a_docstring_reference_that_does_not_resolve_fails_the_strict_build(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# API\n\n::: ragrig.no_such_function\n")
    config = (PROJECT_ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    config = re.sub(r"(?ms)^nav:.*", "", config).replace("docs_dir: docs", "docs_dir: docs")
    config = config.replace('paths: ["."]', f'paths: ["{PROJECT_ROOT}"]').replace('base_path: ["."]', f'base_path: ["{PROJECT_ROOT}"]')
    (tmp_path / "mkdocs.yml").write_text(config)
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(tmp_path / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "no_such_function" in done.stdout + done.stderr


def test_every_tutorial_and_the_extending_page_mark_commands_to_run():
    marked = page_blocks()
    pages = [rel(p) for p in sorted((DOCS / "tutorials").glob("*.md")) if p.name != "demo.md"] + ["docs/how-to/extending.md"]
    assert [p for p in pages if p not in marked] == []
    assert "README.md" in marked, "the README's own-data command is marked to run"


def test_a_marked_block_is_found_with_its_expectation_and_an_unmarked_one_is_not():
    text = ("Intro\n\n```bash\nnot run\n```\n\n<!-- docs-test: run; expect: 8 questions -->\n```bash\necho 8 questions\n```\n"
            "\n<!-- docs-test: run -->\n```python\nprint(1)\n```\n")
    blocks = marked_blocks(text, "page.md")
    assert [(b.line, b.lang, b.code, b.expect) for b in blocks] == [
        (8, "bash", "echo 8 questions\n", "8 questions"), (13, "python", "print(1)\n", None)]


def test_an_example_of_a_marked_block_in_a_four_backtick_fence_is_not_run():
    text = "````markdown\n<!-- docs-test: run -->\n```bash\nrm -rf /\n```\n````\n"
    assert marked_blocks(text, "page.md") == []


@pytest.mark.parametrize("text", ["<!-- docs-test: run -->\n\n```bash\necho\n```\n",
                                  "<!-- docs-test: run -->\n```yaml\na: 1\n```\n"])
def test_a_marker_that_would_run_nothing_is_an_error(text):
    with pytest.raises(ValueError, match="page.md"):
        marked_blocks(text, "page.md")


def test_a_failing_block_reports_its_exit_status(tmp_path):
    block = marked_blocks("<!-- docs-test: run -->\n```bash\necho partial; false\necho never\n```\n", "p.md")[0]
    done = run_block(block, tmp_path)
    assert done.returncode == 1 and done.stdout == "partial\n"


# -- the README's verdict against a demo's output ------------------------------------------------


def test_the_readme_verdict_is_the_start_of_a_saved_demo_output():
    shown = readme_verdict(README.read_text(encoding="utf-8"))
    assert 5 <= len(shown) <= 15
    assert verdict_mismatch(shown, demo_verdict((FIXTURES / "demo.log").read_text(encoding="utf-8"))) is None


def test_latency_figures_may_differ_and_move_line_breaks():
    printed = ["==== verdict ====", "v3 loses on retrieval latency ↓ by +512.7 ms [+496.1 ms,", "+535.1 ms]; v2 is fine."]
    shown = ["==== verdict ====", "v3 loses on retrieval latency ↓ by +1.62 s [+1.47 s, +1.74 s];", "v2 is fine."]
    assert verdict_mismatch(shown, printed) is None


def test_a_latency_difference_that_is_significant_in_one_run_only_is_no_mismatch():
    """Twelve timed questions on a loaded machine decide whether v2's few milliseconds are
    significant; the quality statements around them are still compared word for word."""
    head = "==== verdict ==== Against the baseline v1: v3 beats v1 on nDCG@5 by +0.095 [+0.054, +0.136]"
    with_v2 = [head + ", but loses on retrieval latency ↓ by +1.62 s [+1.47 s, +1.74 s]; v2 loses to v1 on "
               "retrieval latency ↓ by +14.5 ms [+13.3 ms, +15.7 ms]. Each is significant. Nothing else "
               "differs; differences from about: MAP@5 0.097."]
    without_v2 = [head + ", but loses on retrieval latency ↓ by +1.80 s [+1.50 s, +1.90 s]. Each is significant. "
                  "Nothing else differs; differences from about: MAP@5 0.097; retrieval latency ↓ 5.2 ms."]
    assert verdict_mismatch(with_v2, without_v2) is None
    assert verdict_mismatch(with_v2, [line.replace(" ms", "\u00a0ms").replace(" s ", "\u00a0s ")
                                      for line in without_v2]) is None, "a no-break space before the unit"
    quality_flip = [without_v2[0].replace("+0.095", "+0.090")]
    assert verdict_mismatch(with_v2, quality_flip) is not None


def test_a_latency_difference_below_the_smallest_that_matters_is_no_mismatch():
    """On a loaded machine the baseline's latency, and so the 10% that matters, grows: v2's few
    milliseconds may be named as too small to matter instead of as a loss."""
    head = "==== verdict ==== Against the baseline v1: v3 beats v1 on nDCG@5 by +0.095 [+0.054, +0.136]"
    as_loss = [head + "; v2 loses to v1 on retrieval latency ↓ by +14.5 ms [+13.3 ms, +15.7 ms]. Each is "
               "significant. Nothing else differs."]
    as_small = [head + ". Each is significant. Significant, but smaller than the smallest difference that "
                "matters (report.min_effect), so neither a win nor a loss: v2 on retrieval latency ↓ by "
                "+14.5\u00a0ms [+13.3\u00a0ms, +15.7\u00a0ms] (it takes 18.2\u00a0ms). Nothing else differs."]
    assert verdict_mismatch(as_loss, as_small) is None
    quality = [as_small[0].replace("v2 on retrieval latency ↓ by +14.5\u00a0ms [+13.3\u00a0ms, +15.7\u00a0ms] "
                                   "(it takes 18.2\u00a0ms)", "v2 on nDCG@5 by +0.005 [+0.002, +0.008] (it takes 0.010)")]
    assert verdict_mismatch(as_loss, quality) is not None


def test_a_changed_word_or_quality_figure_is_reported_where_it_differs():
    printed = ["==== verdict ====", "v3 beats v1 on nDCG@5 by +0.095 [+0.054, +0.136]"]
    found = verdict_mismatch(["==== verdict ====", "v3 beats v1 on nDCG@5 by +0.096 [+0.054, +0.136]"], printed)
    assert found is not None and "+0.096" in found and "+0.095" in found
    assert verdict_mismatch(printed + ["and more"], printed).startswith("the README's block goes on")


def test_a_demo_output_without_a_verdict_is_an_error():
    with pytest.raises(ValueError, match="no verdict"):
        demo_verdict("[HYDRA] Launching 4 jobs locally\nTraceback ...\n")


@pytest.mark.demo
def test_the_readme_verdict_is_the_start_of_the_last_demo_output():
    log = PROJECT_ROOT / "outputs" / "demo.log"
    assert log.is_file(), f"{log}: no demo output; run `make demo` first"
    mismatch = verdict_mismatch(readme_verdict(README.read_text(encoding="utf-8")),
                                demo_verdict(log.read_text(encoding="utf-8")))
    assert mismatch is None, f"README.md's verdict block is not what make demo printed ({log}): {mismatch}"


# -- rules every page keeps ----------------------------------------------------------------------


def test_the_readme_opens_with_exactly_the_two_setup_commands():
    text = README.read_text(encoding="utf-8")
    first = re.search(r"```[^\n]*\n(.*?)```", text, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first.strip().splitlines()]
    assert commands == ["make demo", "make test"]


def test_the_readme_is_at_most_12_kb_and_its_links_resolve():
    text = README.read_text(encoding="utf-8")
    assert len(text.encode("utf-8")) <= 12 * 1024
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert local and [t for t in local if not (PROJECT_ROOT / t).exists()] == []


def test_no_page_or_heading_speaks_of_issue_numbers():
    pattern = re.compile(r"\bissues?\b|(?<![\w&/#-])#\d+\b", re.I)
    found = [f"{rel(p)}:{i}: {line.strip()}" for p in PAGES
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert found == []


def test_the_configuration_reference_includes_every_config_file():
    page = (DOCS / "reference" / "config.md").read_text(encoding="utf-8")
    included = set(re.findall(r'--8<-- "([^"]+)"', page))
    assert [rel(f) for f in sorted((PROJECT_ROOT / "conf").rglob("*.yaml")) if rel(f) not in included] == []


def test_every_results_page_says_when_how_and_where_it_was_measured_and_is_listed():
    index = (DOCS / "results" / "index.md").read_text(encoding="utf-8")
    nav = (PROJECT_ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = sorted((DOCS / "results").glob("2*.md"))
    assert pages
    for page in pages:
        head = page.read_text(encoding="utf-8")[:2000]
        assert re.match(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md$", page.name), page.name
        assert all(f"**{what}:**" in head for what in ("Date", "Command", "Machine")), page.name
        assert f"]({page.name})" in index and f"results/{page.name}" in nav, page.name


# -- the site's layout ---------------------------------------------------------------------------

# The folder of each nav section; a page at the nav's top level lives in docs/ itself.
SECTION_FOLDERS = {"Tutorials": "tutorials", "How-to guides": "how-to", "Reference": "reference",
                   "Explanation": "explanation", "Results log": "results"}


def nav_entries() -> list[tuple[str | None, str | None, str]]:
    """(section, label, page) for every page of mkdocs.yml's nav; label None where the nav gives none."""
    import yaml

    def walk(items, section):
        for item in items:
            if isinstance(item, str):
                yield section, None, item
                continue
            (label, value), = item.items()
            if isinstance(value, list):
                yield from walk(value, label)
            else:
                yield section, label, value

    return list(walk(yaml.safe_load((PROJECT_ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"], None))


def title(page: str) -> str | None:
    found = re.search(r"^# (.+)$", (DOCS / page).read_text(encoding="utf-8"), re.M)
    return found.group(1).strip() if found else None


def test_every_nav_label_is_its_pages_title():
    entries = nav_entries()
    assert entries
    assert [(page, label, title(page)) for _, label, page in entries if label is not None and label != title(page)] == []


def test_every_page_lives_in_the_folder_of_its_nav_section():
    misplaced = [(section, page) for section, _, page in nav_entries()
                 if Path(page).parent.as_posix() != SECTION_FOLDERS.get(section, ".")]
    assert misplaced == []


def test_dated_figures_stand_only_on_results_pages():
    """Outside docs/results/ a date appears only in a link to a results page (code aside: an
    example path such as outputs/multirun/2025-01-31 is no measurement)."""
    date = re.compile(r"\b20\d\d-\d\d-\d\d\b")
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        if page.relative_to(DOCS).parts[0] == "results":
            continue
        text = re.sub(r"(?ms)^(```|~~~).*?^\1", "", page.read_text(encoding="utf-8"))
        text = re.sub(r"`[^`\n]*`", "", text)
        text = re.sub(r"\[[^\]]*\]\([^)]*results/[^)]*\)", "", text)
        found += [f"{rel(page)}: {line.strip()}" for line in text.splitlines() if date.search(line)]
    assert found == []


def test_the_site_is_built_for_reading_from_disk_without_fetching_anything():
    import yaml

    config = yaml.safe_load((PROJECT_ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["use_directory_urls"] is False, "over file:// a folder link shows a directory listing"
    assert "offline" in config["plugins"], "the search index inlined, so search works from disk"
    shims = config["extra"]["polyfills"]
    assert shims and all((DOCS / s).is_file() for s in shims), "the worker shim ships with the docs, no CDN"
    assert "navigation.footer" in config["theme"]["features"]


@pytest.mark.browser
def test_the_site_opened_from_disk_follows_a_nav_link_and_finds_a_page(tmp_path):
    """`make docs`, then site/index.html in a browser, as the README says: a link of the nav opens
    its page (not a directory listing), and the search answers, without a request off the disk."""
    from selenium.webdriver.support.ui import WebDriverWait

    from experiments.report_check import browser_available, external, make_driver, requests_made

    why = browser_available()
    if why:
        pytest.fail(f"the site test needs headless Chromium: {why}")
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=600, env={**__import__("os").environ,
                                                                             "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    driver = make_driver(tmp_path / "profile", 1400, 900)
    try:
        driver.get((site / "index.html").as_uri())
        driver.find_element("css selector", "nav.md-nav--primary a[href$='tutorials/own-data.html']").click()
        WebDriverWait(driver, 30).until(lambda d: d.current_url.endswith("tutorials/own-data.html"))
        assert driver.find_element("tag name", "h1").text == title("tutorials/own-data.md")
        footer = driver.find_element("css selector", "nav.md-footer__inner").text
        assert title("tutorials/demo.md") in footer and title("tutorials/sweep.md") in footer, footer

        search = driver.find_element("css selector", "input.md-search__input")
        search.click()  # over file:// the theme starts its search worker when search opens
        search.send_keys("cross-encoder")
        WebDriverWait(driver, 120).until(lambda d: d.find_elements("css selector", ".md-search-result__item"))
        hits = [a.get_attribute("href") for a in driver.find_elements("css selector", ".md-search-result__item a")]
        assert any("explanation/cross_encoder.html" in h for h in hits), hits
        assert [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
        assert external(requests_made(driver)) == []
    finally:
        driver.quit()
