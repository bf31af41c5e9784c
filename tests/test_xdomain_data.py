"""The cross-domain bed (data/xdomain/, benchmarks/xdomain_data.py): the committed corpora and
questions are well-formed, the HTML extractor keeps a page's text and drops its navigation, the
checker names each defect, and the committed files are what the installed packages give."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from benchmarks import xdomain_data as X

NAMES = sorted(X.SOURCES)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("name", NAMES)
def test_every_corpus_of_the_bed_is_well_formed(name):
    folder = X.ROOT / name
    docs, questions = _rows(folder / "docs.jsonl"), _rows(folder / "questions.jsonl")
    doc_group = {d["id"]: d["group"] for d in docs}
    assert len(doc_group) == len(docs), "document ids are unique"
    assert 80 <= len(docs) <= 150 and (folder / "docs.jsonl").stat().st_size < 1_500_000
    assert 2 <= len(set(doc_group.values())) <= 3
    assert all(d["text"].strip() and set(d) == {"id", "text", "group"} for d in docs)
    assert len(questions) >= X.MIN_QUESTIONS
    assert len({q["id"] for q in questions}) == len(questions), "question ids are unique"
    assert all(q["doc_id"] in doc_group for q in questions)
    assert all(q["group"] == doc_group[q["doc_id"]] for q in questions)
    assert set(Counter(q["group"] for q in questions)) == set(doc_group.values()), "every group is asked about"
    assert (folder / "LICENSE").read_text(encoding="utf-8").strip()
    assert X.problems(name) == []  # and every answer's words are in its document, no question copies it


def test_the_bed_is_documented():
    readme = (X.ROOT / "README.md").read_text(encoding="utf-8")
    for source in X.SOURCES.values():
        assert source.package in readme and source.version in readme


PAGE = """<html><head><title>T</title><style>p {}</style></head><body>
<div class="navheader"><a href="prev.html">Prev</a> Up Next</div>
<div id="banner">Download the ebook</div>
<div class="toc"><dl><dt>Table of Contents</dt></dl></div>
<h1><a name="intro"></a>Chapter 1. Intro</h1>
<p>First   paragraph,
   over lines.</p>
<pre>$ git log
    indented line</pre>
<h2 class="title"><a id="setup"></a>Setting up</h2>
<p>Run <code>initdb</code> first.</p><table><tr><td>a</td><td>b</td></tr></table>
<h3 class="title">Note</h3><p>A note inside the setup section.</p>
<h2><a id="usage"></a>Usage</h2><p>Use it.</p>
<div class="navfooter">Prev | Home | Next</div>
<div id="footer">Last updated 2025</div></body></html>"""


def _page(tmp_path: Path, cut: int) -> list[X.Piece]:
    path = tmp_path / "page.html"
    path.write_text(PAGE, encoding="utf-8")
    return X.page_pieces(path, cut)


def test_a_page_is_its_text_without_navigation_and_with_preformatted_lines_kept(tmp_path):
    (whole,) = _page(tmp_path, 0)
    text = whole.text()
    assert text.startswith("Chapter 1. Intro\n\nFirst paragraph, over lines.")
    assert "$ git log\n    indented line" in text
    assert "a | b" in text  # table cells on one line, apart
    for left_out in ("Prev", "Download the ebook", "Table of Contents", "Last updated", "p {}"):
        assert left_out not in text


def test_a_page_is_cut_at_its_anchored_headings(tmp_path):
    pieces = _page(tmp_path, 2)
    assert [(p.anchor, p.chapter) for p in pieces] == [("intro", "intro"), ("setup", "intro"), ("usage", "intro")]
    setup = pieces[1].text()
    assert setup.startswith("Setting up") and "Note\n\nA note inside the setup section." in setup
    assert pieces[2].text() == "Usage\n\nUse it."


def test_a_numbered_anchor_becomes_its_headings_slug():
    piece = X.Piece("id-1.9.16.6", None, ["6.1.1. Syntax of the sources.list File\n\ntext"])
    assert X.anchor_name(piece) == "syntax-of-the-sources-list-file"
    assert X.anchor_name(X.Piece("sect.apt-get", None, ["x"])) == "sect.apt-get"


def test_a_long_page_keeps_its_opening_up_to_a_paragraph():
    text = "\n\n".join(["word " * 40] * 20)
    clipped = X.clip(text, 1000)
    assert len(clipped) <= 1000 and text.startswith(clipped) and not clipped.endswith(" ")
    assert X.clip("short", 1000) == "short"


def _bed(root: Path, questions: list[dict]) -> None:
    (root / "toy").mkdir(parents=True)
    docs = [{"id": "d1", "text": "The vacuum command reclaims storage held by dead rows.", "group": "a"},
            {"id": "d2", "text": "Checkpoints write every dirty buffer to disk.", "group": "b"}]
    (root / "toy" / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (root / "toy" / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions), encoding="utf-8")


def test_the_checker_names_each_defect_by_line(tmp_path):
    good = {"id": "q1", "question": "How is space of deleted rows given back?", "answer": "Vacuum reclaims storage.",
            "doc_id": "d1", "group": "a"}
    _bed(tmp_path, [
        good,
        {**good, "id": "q1"},
        {**good, "id": "q3", "doc_id": "d9"},
        {**good, "id": "q4", "group": "b"},
        {**good, "id": "q5", "answer": "Autovacuum launches workers every minute."},
        {**good, "id": "q6", "question": "Which command reclaims storage held by dead rows?"},
        {**good, "id": "q7", "answer": ""},
    ])
    found = X.problems("toy", tmp_path)
    path = tmp_path / "toy" / "questions.jsonl"
    assert found == [
        f"{path}:2: id 'q1' used twice",
        f"{path}:3: doc_id 'd9' is no document of toy/docs.jsonl",
        f"{path}:4: group 'b', but d1 is in 'a'",
        f"{path}:5: d1 does not hold the answer's words ['autovacuum', 'every', 'launches', 'minute', 'workers']",
        f"{path}:6: the question copies its document: 'command reclaims storage held by dead'",
        f"{path}:7: answer missing or not a non-empty string",
        f"{path}: 7 questions, fewer than {X.MIN_QUESTIONS}",
    ]


def test_check_exits_1_on_a_defect_and_2_on_a_file_it_cannot_read(tmp_path, capsys):
    _bed(tmp_path, [{"id": "q1", "question": "What?", "answer": "Checkpoints.", "doc_id": "d2", "group": "a"}])
    assert X.check(["toy"], tmp_path) == 1
    assert "toy: 1 questions, 2 problem(s)" in capsys.readouterr().out
    assert X.main(["check", "--root", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("benchmarks.xdomain_data: error: ") and err.endswith("docs.jsonl: no such file")
    assert len(err.splitlines()) == 1


def test_build_without_the_package_says_which_to_install(tmp_path, monkeypatch, capsys):
    toy = X.Source("toy", "ragrig-no-such-package", "1", tmp_path, tmp_path / "copyright", ("a.html",),
                   lambda page, chapter: "g")
    monkeypatch.setitem(X.SOURCES, "toy", toy)
    assert X.main(["build", "--name", "toy", "--root", str(tmp_path)]) == 2
    assert capsys.readouterr().err == ("benchmarks.xdomain_data: error: toy: the package ragrig-no-such-package "
                                       "is not installed (apt-get install ragrig-no-such-package)\n")
    assert not (tmp_path / "toy").exists()


def _installed(source: X.Source) -> bool:
    return X.installed_version(source.package) == source.version


@pytest.mark.skipif(not all(_installed(s) for s in X.SOURCES.values()),
                    reason="needs postgresql-doc-15, debian-handbook and git-doc at the committed versions")
def test_the_committed_corpora_are_what_the_packages_give(capsys):
    assert X.build(NAMES, X.ROOT, check=True) == 0
    assert "DIFFERS" not in capsys.readouterr().out
