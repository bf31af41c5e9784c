"""Corpus readers: document ids, texts and metadata on real data, and one-line errors on bad input."""
from __future__ import annotations

import gzip
import inspect
import json
import os
import shutil
import sys
import types
from pathlib import Path

import pytest

from rag.config.compose import data_dir
from rag.corpus import (
    BeirCorpus,
    JsonlCorpus,
    LibcManCorpus,
    MedlineCorpus,
    MixedCorpus,
    PubMedQACorpus,
    PyTorchCorpus,
)
from rag.corpus.libc import name_line, normalize_rendered, parse_page_name
from rag.corpus.pytorch import clean_rst
from rag.types import Document, RagError

ROOT = Path(__file__).resolve().parents[1]
DATA = data_dir()  # ships with the project: these tests never skip for want of it
PUBMEDQA = DATA / "pubmedqa" / "ori_pqal.json"
MEDLINE = DATA / "medline" / "pubmed-29768149.xml"
TORCH_DOCS = DATA / "pytorch-docs"
MAN = Path("/usr/share/man")

needs_man = pytest.mark.skipif(
    not (MAN / "man2" / "fcntl.2.gz").exists() or not shutil.which("man") or not shutil.which("col"),
    reason="needs man-db, col and the manpages-dev pages",
)


def one_line_error(excinfo: pytest.ExceptionInfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    return msg


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


# ---- PubMedQA ----------------------------------------------------------------------------------


def test_pubmedqa_one_document_per_abstract_ending_with_conclusion():
    raw = json.loads(PUBMEDQA.read_text(encoding="utf-8"))
    docs = PubMedQACorpus(path=str(PUBMEDQA)).load()
    assert len(docs) == 1000
    assert [d.id for d in docs] == [f"pmid:{k}" for k in raw]  # file order
    assert {d.source for d in docs} == {"pubmed"}
    doc = docs[0]
    rec = raw["21645374"]
    assert doc.id == "pmid:21645374"
    assert doc.text == "\n\n".join(rec["CONTEXTS"]) + "\n\n" + rec["LONG_ANSWER"]
    assert doc.text.endswith(rec["LONG_ANSWER"])
    assert doc.meta == {
        "pmid": "21645374",
        "year": "2011",
        "meshes": rec["MESHES"],
        "labels": ["BACKGROUND", "RESULTS"],
        "title": None,
    }
    assert all(d.text.endswith(raw[d.meta["pmid"]]["LONG_ANSWER"]) for d in docs)


def test_pubmedqa_fingerprint_names_the_file():
    fp = PubMedQACorpus(path=PUBMEDQA).fingerprint()
    json.dumps(fp)
    assert fp["class"] == "PubMedQACorpus"
    assert fp["inputs"]["path"] == str(PUBMEDQA.absolute())
    assert fp["inputs"]["size"] == PUBMEDQA.stat().st_size
    assert fp["inputs"]["mtime_ns"] == PUBMEDQA.stat().st_mtime_ns


def test_pubmedqa_errors(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(RagError, match="nope.json: file not found") as e:
        PubMedQACorpus(missing).load()
    one_line_error(e)
    with pytest.raises(RagError, match="nope.json: file not found"):
        PubMedQACorpus(missing).fingerprint()

    empty = tmp_path / "empty.json"
    empty.write_text("  \n")
    with pytest.raises(RagError, match="empty.json: file is empty"):
        PubMedQACorpus(empty).load()

    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "1": {\n    "QUESTION": oops\n  }\n}\n')
    with pytest.raises(RagError, match=r"bad.json:3: invalid JSON") as e:
        PubMedQACorpus(bad).load()
    one_line_error(e)

    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{\n"1": {\n"QUESTION": "caf\xe9?"}}\n')
    with pytest.raises(RagError, match=r"latin.json:3: invalid UTF-8"):
        PubMedQACorpus(latin).load()

    no_answer = tmp_path / "no_answer.json"
    no_answer.write_text(json.dumps({"7": {"QUESTION": "q?", "CONTEXTS": ["c"], "LONG_ANSWER": " "}}))
    with pytest.raises(RagError, match=r"no_answer.json: record 7: missing or empty field 'LONG_ANSWER'"):
        PubMedQACorpus(no_answer).load()


# ---- libc man pages ----------------------------------------------------------------------------


def gz(path: Path, text: str) -> Path:
    path.write_bytes(gzip.compress(text.encode()))
    return path


@pytest.fixture
def man_dir(tmp_path: Path) -> Path:
    """A few real pages plus every kind of page that must not become a document."""
    root = tmp_path / "man"
    (root / "man2").mkdir(parents=True)
    (root / "man3").mkdir()
    shutil.copy(MAN / "man2" / "fcntl.2.gz", root / "man2")
    shutil.copy(MAN / "man3" / "printf.3.gz", root / "man3")
    shutil.copy(MAN / "man3" / "stat.3type.gz", root / "man3")
    os.symlink("printf.3.gz", root / "man3" / "fprintf.3.gz")
    gz(root / "man3" / "vprintf.3.gz", '.\\" an alias of printf\n.so man3/printf.3\n')
    gz(root / "man3" / "notes.3.gz", "these are not roff\njust some notes\n")
    (root / "man3" / "garbage.3.gz").write_bytes(b"\x00\x01 definitely not gzip")
    gz(root / "man3" / "blank.3.gz", '.TH BLANK 3 2023-01-01 "Linux man-pages 6.03"\n')
    gz(
        root / "man3" / "XtFoo.3.gz",
        '.TH XtFoo 3 "libXt 1.2.1" "X Version 11"\n.SH NAME\nXtFoo \\- do foo\n.SH DESCRIPTION\nFoo.\n',
    )
    shutil.copy(MAN / "man2" / "fcntl.2.gz", root / "man3" / "fcntl.3perl.gz")  # section not wanted
    return root


@needs_man
def test_libc_renders_real_pages_and_skips_aliases_and_failures(man_dir):
    corpus = LibcManCorpus(man_dir=str(man_dir), workers=3)
    docs = corpus.load()
    by_id = {d.id: d for d in docs}
    assert [d.id for d in docs] == ["man:fcntl.2", "man:printf.3", "man:stat.3type"]
    assert {d.source for d in docs} == {"libc"}

    fcntl = by_id["man:fcntl.2"]
    assert fcntl.meta == {"page": "fcntl", "section": "2", "title": "fcntl - manipulate file descriptor"}
    assert "fcntl64" in fcntl.text
    assert fcntl.text.startswith("NAME\n")  # running header removed
    assert "Linux man-pages" not in fcntl.text.splitlines()[-1]  # footer removed
    assert "\n\n\n\n" not in fcntl.text
    printf = by_id["man:printf.3"]
    assert printf.meta["title"].startswith("printf, fprintf, dprintf, sprintf, snprintf,")
    assert printf.meta["title"].endswith(" - formatted output conversion")
    assert by_id["man:stat.3type"].meta["section"] == "3type"

    assert sorted(Path(p).name for p in corpus.skipped) == ["blank.3.gz", "garbage.3.gz", "notes.3.gz"]
    assert [Path(p).name for p in corpus.excluded] == ["XtFoo.3.gz"]


@needs_man
def test_libc_project_filter_can_be_turned_off(man_dir):
    docs = LibcManCorpus(man_dir=man_dir, sections=["3"], project=None, workers=2).load()
    assert [d.id for d in docs] == ["man:XtFoo.3", "man:printf.3"]
    assert docs[0].meta["title"] == "XtFoo - do foo"


@needs_man
def test_libc_fingerprint_follows_the_listing(man_dir):
    corpus = LibcManCorpus(man_dir=man_dir)
    fp = corpus.fingerprint()
    json.dumps(fp)
    assert fp["class"] == "LibcManCorpus"
    assert fp["settings"]["sections"] == ["2", "3", "3type", "3const", "3head"]
    assert fp == LibcManCorpus(man_dir=man_dir, workers=1).fingerprint()  # workers do not matter
    assert fp != LibcManCorpus(man_dir=man_dir, width=100).fingerprint()
    os.utime(man_dir / "man2" / "fcntl.2.gz", ns=(1, 1))
    assert corpus.fingerprint() != fp
    fp2 = corpus.fingerprint()
    os.symlink("fcntl.2.gz", man_dir / "man2" / "fcntl64.2.gz")
    assert corpus.fingerprint() != fp2


def test_libc_missing_man_dir(tmp_path):
    with pytest.raises(RagError, match="man directory not found"):
        LibcManCorpus(man_dir=tmp_path / "nope").fingerprint()


def test_libc_page_names_and_normalisation():
    assert parse_page_name("fcntl.2.gz") == ("fcntl", "2")
    assert parse_page_name("stat.3type.gz") == ("stat", "3type")
    assert parse_page_name("printf.h.3head.gz") == ("printf.h", "3head")
    assert parse_page_name("README") is None
    rendered = (
        "FOO(2)          System Calls Manual          FOO(2)\n\n"
        "NAME\n       foo - do\n       things\n\nSEE ALSO\n       bar(2)\n\n\n\n\n       baz(3)\n\n"
        "Linux man-pages 6.03      2023-02-05      FOO(2)\n"
    )
    text = normalize_rendered(rendered)
    assert text == "NAME\n       foo - do\n       things\n\nSEE ALSO\n       bar(2)\n\n\n       baz(3)"
    assert name_line(text) == "foo - do things"
    # without a footer the last body line stays, even though it ends in a page reference
    assert normalize_rendered("NAME\n       foo\n\nSEE ALSO\n       bar(2)\n").endswith("bar(2)")


# ---- PyTorch -----------------------------------------------------------------------------------


@pytest.fixture
def fake_module(monkeypatch):
    """A module with the awkward cases of a real API: aliases, shared docstrings, inherited
    methods, a property, an undocumented function and an attribute that raises."""
    mod = types.ModuleType("ragrig_fake_api")

    def f(x, step=1):
        """Add one."""
        return x + step

    def g(x):
        """Add one."""  # same text as f: a duplicate

    def undocumented(x):
        return x

    class Base:
        """A base."""

        def run(self):
            """Run it."""

        @property
        def size(self):
            """The size."""

        @staticmethod
        def make():
            """Make one."""

        def _private(self):
            """Hidden."""

    class Child(Base):
        """A child."""

    for name, obj in [("f", f), ("alias_of_f", f), ("g", g), ("undocumented", undocumented),
                      ("Base", Base), ("Child", Child)]:
        setattr(mod, name, obj)
    mod.__all__ = ["f", "alias_of_f", "g", "undocumented", "Base", "Child", "broken"]

    def __getattr__(name):
        raise RuntimeError(f"{name} needs a GPU")

    mod.__getattr__ = __getattr__
    monkeypatch.setitem(sys.modules, "ragrig_fake_api", mod)
    return mod


def test_pytorch_walk_dedupes_by_identity_and_text(fake_module):
    docs = PyTorchCorpus(modules=["ragrig_fake_api"]).load()
    assert [d.id for d in docs] == [
        "torch:ragrig_fake_api.f",
        "torch:ragrig_fake_api.Base",
        "torch:ragrig_fake_api.Base.make",
        "torch:ragrig_fake_api.Base.run",
        "torch:ragrig_fake_api.Base.size",
        "torch:ragrig_fake_api.Child",
    ]
    f, base, make, run, size, child = docs
    assert f.text == "ragrig_fake_api.f(x, step=1)\n\nAdd one."
    assert f.meta == {"object": "ragrig_fake_api.f", "kind": "function"}
    assert base.meta["kind"] == "class" and make.meta["kind"] == "staticmethod"
    assert run.meta["kind"] == "method" and run.text == "ragrig_fake_api.Base.run(self)\n\nRun it."
    assert size.meta["kind"] == "property" and size.text == "ragrig_fake_api.Base.size\n\nThe size."
    assert child.text.endswith("A child.")


def test_pytorch_class_walked_as_namespace_includes_inherited_members(fake_module):
    docs = PyTorchCorpus(modules=["ragrig_fake_api.Child"]).load()
    assert [d.id for d in docs] == [
        "torch:ragrig_fake_api.Child.make",
        "torch:ragrig_fake_api.Child.run",
        "torch:ragrig_fake_api.Child.size",
    ]


def test_pytorch_skips_modules_that_fail(fake_module, tmp_path, monkeypatch, caplog):
    (tmp_path / "ragrig_broken_mod.py").write_text("raise RuntimeError('not on this build')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    corpus = PyTorchCorpus(modules=["ragrig_broken_mod", "ragrig_no_such_module", "ragrig_fake_api"])
    docs = corpus.load()
    assert docs[0].id == "torch:ragrig_fake_api.f"
    assert "ragrig_broken_mod" in caplog.text and "ragrig_no_such_module" in caplog.text
    with pytest.raises(RagError, match="no documents"):
        PyTorchCorpus(modules=["ragrig_no_such_module"]).load()


def test_pytorch_nn_docstrings():
    import torch

    docs = PyTorchCorpus(modules=["torch.nn", "torch.nn.modules.linear"]).load()
    by_id = {d.id: d for d in docs}
    assert len(by_id) == len(docs)
    hook = by_id["torch:torch.nn.Module.register_forward_hook"]
    assert hook.source == "pytorch"
    assert hook.meta == {"object": "torch.nn.Module.register_forward_hook", "kind": "method"}
    assert hook.text.startswith("torch.nn.Module.register_forward_hook(self, hook")
    assert hook.text.endswith("\n\n" + inspect.cleandoc(torch.nn.Module.register_forward_hook.__doc__))
    assert by_id["torch:torch.nn.Linear"].meta["kind"] == "class"
    # inherited methods are documented once, under the class that defines them
    assert "torch:torch.nn.Linear.register_forward_hook" not in by_id
    # the second module re-exports Linear: the first occurrence wins
    assert not any(i.startswith("torch:torch.nn.modules.linear.") for i in by_id)
    bodies = [d.text.split("\n\n", 1)[1] for d in docs]
    assert len(set(bodies)) == len(bodies)


def test_pytorch_docs_dir():
    corpus = PyTorchCorpus(modules=[], docs_dir=str(TORCH_DOCS))
    docs = corpus.load()
    assert len(docs) == len(list(TORCH_DOCS.rglob("*.rst")))
    by_id = {d.id: d for d in docs}
    notes = by_id["torchdoc:notes/modules.rst"]
    assert notes.source == "pytorch" and notes.meta == {"path": "notes/modules.rst"}
    assert "forward hook" in notes.text.lower()
    assert all(".. toctree::" not in d.text and ":maxdepth:" not in d.text for d in docs)
    fp = corpus.fingerprint()
    json.dumps(fp)
    assert fp["inputs"]["docs"]["files"] == len(docs)
    assert "torch" not in fp["inputs"]  # docstrings not wanted, torch version irrelevant


def test_pytorch_fingerprint_names_torch_version():
    import torch

    fp = PyTorchCorpus(modules=["torch.nn"]).fingerprint()
    json.dumps(fp)
    assert fp["inputs"]["torch"]["version"] == torch.__version__
    assert fp["settings"]["modules"] == ["torch.nn"]
    assert fp != PyTorchCorpus(modules=["torch.optim"]).fingerprint()


def test_pytorch_docs_dir_errors(tmp_path):
    (tmp_path / "a.rst").write_bytes(b"Title\n=====\n\nna\xefve\n")
    with pytest.raises(RagError, match=r"a.rst:4: invalid UTF-8"):
        PyTorchCorpus(modules=[], docs_dir=tmp_path).load()
    with pytest.raises(RagError, match="docs directory not found"):
        PyTorchCorpus(modules=[], docs_dir=tmp_path / "nope").load()


def test_clean_rst_drops_directive_only_lines():
    src = "Title\n=====\n\n.. toctree::\n   :maxdepth: 2\n\n   notes/a\n\n.. currentmodule:: torch\n\n.. autofunction:: add\n"
    assert clean_rst(src) == "Title\n=====\n\n   notes/a\n\n.. autofunction:: add"


# ---- MEDLINE -----------------------------------------------------------------------------------


ARTICLE = """<PubmedArticle><MedlineCitation><PMID Version="1">{pmid}</PMID><Article>
<Journal><JournalIssue><PubDate><MedlineDate>1998 Dec-1999 Jan</MedlineDate></PubDate></JournalIssue>
<Title>J Test</Title></Journal><ArticleTitle>Title {pmid}</ArticleTitle>{abstract}</Article>
</MedlineCitation></PubmedArticle>"""


def medline_xml(*articles: str) -> str:
    return '<?xml version="1.0"?>\n<PubmedArticleSet>\n' + "\n".join(articles) + "\n</PubmedArticleSet>\n"


def test_medline_record():
    corpus = MedlineCorpus(paths=[str(MEDLINE)])
    docs = corpus.load()
    assert len(docs) == 1 and corpus.skipped == []
    doc = docs[0]
    assert doc.id == "pmid:29768149" and doc.source == "pubmed"
    title = "Inhaled Combined Budesonide-Formoterol as Needed in Mild Asthma."
    assert doc.meta["title"] == title
    assert doc.meta["year"] == "2018"
    assert doc.meta["journal"] == "The New England journal of medicine"
    assert "Asthma" in doc.meta["meshes"] and len(doc.meta["meshes"]) == 23
    parts = doc.text.split("\n\n")
    assert parts[0] == title
    assert [p.split(":", 1)[0] for p in parts[1:]] == ["BACKGROUND", "METHODS", "RESULTS", "CONCLUSIONS"]
    # text inside <sub> is kept and whitespace is normalised
    assert "fast-acting β 2-agonist may be" in parts[1]
    assert parts[-1].endswith("NCT02149199 .).")


def test_medline_gzip_and_fingerprint(tmp_path):
    gz_path = tmp_path / "pubmed.xml.gz"
    gz_path.write_bytes(gzip.compress(MEDLINE.read_bytes()))
    plain = MedlineCorpus(paths=[MEDLINE]).load()
    assert MedlineCorpus(paths=str(gz_path)).load() == plain
    fp = MedlineCorpus(paths=[gz_path]).fingerprint()
    assert fp["inputs"] == [{"path": str(gz_path), "size": gz_path.stat().st_size, "mtime_ns": gz_path.stat().st_mtime_ns}]


def test_medline_skips_articles_without_abstract(tmp_path):
    path = tmp_path / "set.xml"
    path.write_text(
        medline_xml(
            ARTICLE.format(pmid=1, abstract=""),
            ARTICLE.format(pmid=2, abstract="<Abstract><AbstractText>Plain <i>italic</i>\n  text.</AbstractText></Abstract>"),
        )
    )
    corpus = MedlineCorpus(paths=[path])
    docs = corpus.load()
    assert [d.id for d in docs] == ["pmid:2"]
    assert docs[0].text == "Title 2\n\nPlain italic text."
    assert docs[0].meta["year"] == "1998"
    assert corpus.skipped == ["pmid:1"]


def _baseline_files(folder, n_files: int, per_file: int) -> list:
    """A baseline as NCBI distributes it: numbered .xml.gz files of consecutive PMIDs."""
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for f in range(n_files):
        articles = [ARTICLE.format(pmid=f * per_file + i + 1, abstract=f"<Abstract><AbstractText>Finding {f}.{i}."
                                   "</AbstractText></Abstract>") for i in range(per_file)]
        path = folder / f"pubmed25n{f + 1:04d}.xml.gz"
        path.write_bytes(gzip.compress(medline_xml(*articles).encode()))
        files.append(path)
    return files


def test_medline_baseline_files_by_glob_in_sorted_order(tmp_path):
    files = _baseline_files(tmp_path / "baseline", n_files=3, per_file=4)
    (tmp_path / "baseline" / "README.txt").write_text("not matched")
    corpus = MedlineCorpus(paths=[str(tmp_path / "baseline" / "pubmed25n*.xml.gz")])
    assert corpus.paths == files
    docs = corpus.load()
    assert [d.id for d in docs] == [f"pmid:{i}" for i in range(1, 13)] and docs[5].text.endswith("Finding 1.1.")
    fp = corpus.fingerprint()
    assert [i["path"] for i in fp["inputs"]] == [str(f) for f in files]
    _baseline_files(tmp_path / "baseline", n_files=4, per_file=4)  # NCBI adds a file: another fingerprint
    assert corpus.fingerprint() != fp and len(corpus.load()) == 16
    # a file named twice (by a pattern and by name) is read once
    assert MedlineCorpus(paths=[files[0], str(tmp_path / "baseline" / "*.xml.gz")]).paths[0] == files[0]


def test_medline_glob_matching_nothing_and_truncated_gzip_are_one_line(tmp_path):
    with pytest.raises(RagError, match=r"^corpus.paths: .*/pubmed25n\*.xml.gz matches no file$") as e:
        MedlineCorpus(paths=[str(tmp_path / "pubmed25n*.xml.gz")]).load()
    one_line_error(e)
    files = _baseline_files(tmp_path, n_files=2, per_file=50)
    data = files[1].read_bytes()
    files[1].write_bytes(data[: len(data) // 2])  # a download cut short
    with pytest.raises(RagError, match=r"pubmed25n0002.xml.gz: cannot read: Compressed file ended") as e:
        MedlineCorpus(paths=[str(tmp_path / "*.xml.gz")]).load()
    one_line_error(e)


def test_medline_files_are_streamed_article_by_article(tmp_path):
    # The first file's articles come out before the second file is opened: a baseline of
    # millions of articles is never held whole (rag.corpus.loading stores the stream as it comes).
    files = _baseline_files(tmp_path, n_files=2, per_file=3)
    files[1].write_bytes(files[1].read_bytes()[:40])
    stream = MedlineCorpus(paths=[str(tmp_path / "*.xml.gz")]).iter_documents()
    assert [next(stream).id for _ in range(3)] == ["pmid:1", "pmid:2", "pmid:3"]
    with pytest.raises(RagError, match="pubmed25n0002.xml.gz: cannot read"):
        next(stream)


def test_medline_errors(tmp_path):
    with pytest.raises(RagError, match="nope.xml: file not found"):
        MedlineCorpus(paths=[tmp_path / "nope.xml"]).load()
    empty = tmp_path / "empty.xml"
    empty.write_text("")
    with pytest.raises(RagError, match="empty.xml: file is empty"):
        MedlineCorpus(paths=[empty]).load()
    broken = tmp_path / "broken.xml"
    broken.write_text("<PubmedArticleSet>\n<PubmedArticle>\n<oops</PubmedArticle>\n")
    with pytest.raises(RagError, match=r"broken.xml:3: invalid XML") as e:
        MedlineCorpus(paths=[broken]).load()
    one_line_error(e)
    dup = tmp_path / "dup.xml"
    article = ARTICLE.format(pmid=5, abstract="<Abstract><AbstractText>x</AbstractText></Abstract>")
    dup.write_text(medline_xml(article, article))
    with pytest.raises(RagError, match="duplicate article pmid:5"):
        MedlineCorpus(paths=[dup]).load()


# ---- JSONL -------------------------------------------------------------------------------------


def test_jsonl_corpus(tmp_path):
    path = write_jsonl(
        tmp_path / "c.jsonl",
        [
            {"id": "a", "text": "alpha", "source": "notes", "lang": "en", "meta": {"page": 3}},
            "",
            {"id": 7, "text": "seven"},
        ],
    )
    docs = JsonlCorpus(path=str(path)).load()
    assert docs == [
        Document("a", "alpha", "notes", {"lang": "en", "page": 3}),
        Document("7", "seven", "user", {}),
    ]
    custom = write_jsonl(tmp_path / "d.jsonl", [{"key": "k1", "body": "text", "kind": "x"}])
    doc = JsonlCorpus(custom, id_field="key", text_field="body", group_field="kind", default_group="z").load()[0]
    assert (doc.id, doc.text, doc.source) == ("k1", "text", "x")
    fp = JsonlCorpus(path).fingerprint()
    assert fp["inputs"]["path"] == str(path) and fp["settings"]["text_field"] == "text"


@pytest.mark.parametrize(
    "rows, pattern",
    [
        ([{"id": "a", "text": "x"}, '{"id": "b", "text": }'], r"c.jsonl:2: invalid JSON"),
        ([{"id": "a", "text": "x"}, {"id": "b", "text": "  "}], r"c.jsonl:2: document 'b' has empty text"),
        ([{"id": "a", "text": "x"}, {"id": "b", "text": None}], r"c.jsonl:2: document 'b' has empty text"),
        ([{"id": "a", "text": "x"}, {"text": "y"}], r"c.jsonl:2: no 'id' field \(fields: text\); set corpus.id_field"),
        ([{"id": "a", "text": "x"}, {"id": None, "text": "y"}], r"c.jsonl:2: missing or empty field 'id'"),
        ([{"id": "a", "text": "x"}, {"id": "b", "text": "y"}, {"id": "a", "text": "z"}],
         r"c.jsonl:3: duplicate document id 'a' \(first on line 1\)"),
        ([{"id": "a", "text": "x"}, "[1, 2]"], r"c.jsonl:2: expected a JSON object, got an array"),
        (["[1, 2]"], r"c.jsonl: this is one JSON array, not JSON lines"),
        ([{"id": "a", "text": "x", "meta": [1]}], r"c.jsonl:1: field 'meta' must be an object"),
        (["", "  "], r"c.jsonl: file is empty"),
    ],
)
def test_jsonl_corpus_errors(tmp_path, rows, pattern):
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    with pytest.raises(RagError, match=pattern) as e:
        JsonlCorpus(path).load()
    one_line_error(e)


def test_the_group_tag_is_group_and_source_is_still_read_as_its_old_name(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [
        {"id": "a", "text": "alpha", "group": "ops"},
        {"id": "b", "text": "beta", "source": "it"},  # a file written before `group`
        {"id": "c", "text": "gamma", "group": "ops", "source": "https://wiki/c"},  # both: source is metadata
        {"id": "d", "text": "delta"},
    ])
    docs = JsonlCorpus(path).load()
    assert [(d.id, d.source) for d in docs] == [("a", "ops"), ("b", "it"), ("c", "ops"), ("d", "user")]
    assert docs[2].meta == {"source": "https://wiki/c"} and docs[0].meta == docs[1].meta == {}
    renamed = JsonlCorpus(path, group_field="team").load()
    assert [d.source for d in renamed] == ["user"] * 4, "a renamed group field has no old name"
    assert renamed[0].meta == {"group": "ops"} and renamed[1].meta == {"source": "it"}


@pytest.mark.parametrize("row, expect", [
    ({"id": "c", "content": "The third document."},
     "c.jsonl:3: no 'text' field (fields: id, content); set corpus.text_field=content to read another field"),
    ({"id": "c", "body": "short", "abstract": "the longest text of the line", "group": "g"},
     "c.jsonl:3: no 'text' field (fields: id, body, abstract, group); set corpus.text_field=abstract to read"),
    ({"_id": "c", "text": "x"}, "c.jsonl:3: no 'id' field (fields: _id, text); set corpus.id_field=_id to read another field"),
    ({"id": "c", "count": 3}, "c.jsonl:3: no 'text' field (fields: id, count); set corpus.text_field=<field> to read"),
    ({}, "c.jsonl:3: no 'id' field (fields: none: the line is an empty object); set corpus.id_field=<field>"),
])
def test_a_missing_field_names_the_fields_there_and_the_setting_that_reads_another(tmp_path, row, expect):
    path = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "x"}, {"id": "b", "text": "y"}, row])
    with pytest.raises(RagError) as e:
        JsonlCorpus(path).load()
    assert expect in one_line_error(e)


def test_the_setting_the_error_names_reads_the_file(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"doc": "a", "content": "alpha"}, {"doc": "b", "content": "beta"}])
    docs = JsonlCorpus(path, id_field="doc", text_field="content").load()
    assert [(d.id, d.text, d.meta) for d in docs] == [("a", "alpha", {}), ("b", "beta", {})]


def test_jsonl_corpus_file_errors(tmp_path):
    with pytest.raises(RagError, match="c.jsonl: file not found"):
        JsonlCorpus(tmp_path / "c.jsonl").load()
    (tmp_path / "c.jsonl").write_bytes(b'{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}\n{"id": "c", "text": "\xff"}\n')
    with pytest.raises(RagError, match=r"c.jsonl:3: invalid UTF-8"):
        JsonlCorpus(tmp_path / "c.jsonl").load()
    (tmp_path / "e.jsonl").write_bytes(b"")
    with pytest.raises(RagError, match=r"e.jsonl: file is empty"):
        JsonlCorpus(tmp_path / "e.jsonl").load()


# ---- mixed -------------------------------------------------------------------------------------


class _Skipping:
    def __init__(self, docs, skipped):
        self.docs, self.skipped = docs, skipped

    def load(self):
        return list(self.docs)

    def fingerprint(self):
        return {"class": "_Skipping", "n": len(self.docs)}


def test_mixed_corpus_concatenates_and_aggregates(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"id": "a1", "text": "x", "source": "libc"}])
    b = write_jsonl(tmp_path / "b.jsonl", [{"id": "b1", "text": "y", "source": "pytorch"}, {"id": "b2", "text": "z"}])
    extra = _Skipping([Document("c1", "w", "pubmed")], ["pmid:9"])
    mixed = MixedCorpus(parts=[JsonlCorpus(a), JsonlCorpus(b), extra])
    docs = mixed.load()
    assert [(d.id, d.source) for d in docs] == [("a1", "libc"), ("b1", "pytorch"), ("b2", "user"), ("c1", "pubmed")]
    assert mixed.skipped == ["pmid:9"]
    fp = mixed.fingerprint()
    assert [p["class"] for p in fp["parts"]] == ["JsonlCorpus", "JsonlCorpus", "_Skipping"]

    with pytest.raises(RagError, match="duplicate document id 'a1'") as e:
        MixedCorpus(parts=[JsonlCorpus(a), JsonlCorpus(b), JsonlCorpus(a)]).load()
    one_line_error(e)
    with pytest.raises(RagError, match="'parts' is empty"):
        MixedCorpus(parts=[])


@pytest.mark.parametrize("convert", ["none", "all"])
def test_mixed_corpus_from_hydra_config(tmp_path, convert):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    a = write_jsonl(tmp_path / "a.jsonl", [{"id": "a1", "text": "x"}])
    b = write_jsonl(tmp_path / "b.jsonl", [{"id": "b1", "text": "y"}])
    cfg = OmegaConf.create(
        {
            "_target_": "rag.corpus.MixedCorpus",
            "parts": [{"_target_": "rag.corpus.JsonlCorpus", "path": str(p)} for p in (a, b)],
        }
    )
    assert [d.id for d in instantiate(cfg, _convert_=convert).load()] == ["a1", "b1"]
    # built without recursion, the parts are instantiated by MixedCorpus itself
    assert [d.id for d in instantiate(cfg, _recursive_=False).load()] == ["a1", "b1"]


def test_pytorch_signatures_carry_no_memory_address():
    """A default value's repr holds an address that differs in every process; the corpus text
    (and so chunks, vectors and scores) must be the same in every build."""
    from rag.corpus.pytorch import _signature

    def f(x, fn=lambda: None, g=print):
        return x

    sig = _signature(f)
    assert " at 0x" not in sig and "<function test_pytorch_signatures_carry_no_memory_address.<locals>.<lambda>>" in sig


def test_pytorch_docstrings_carry_no_memory_address():
    """pybind11 writes a default's repr, address and all, into the docstring of an overload."""
    import torch.distributed as dist

    from rag.corpus.pytorch import _doc

    class Bound:
        """allreduce(self, opts: Options = <Options object at 0x7f1ba8ad8cb0>) -> Work"""

    assert _doc(Bound) == "allreduce(self, opts: Options = <Options object>) -> Work"
    if dist.is_available():
        assert " at 0x" not in _doc(dist.ProcessGroup.allreduce)


# ---- one rule for every text-valued field of every format ----------------------------

def _beir(tmp: Path, corpus: list[dict], queries: list[dict] | None = None) -> Path:
    (tmp / "qrels").mkdir(parents=True, exist_ok=True)
    (tmp / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (tmp / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries or [{"_id": "q", "text": "why?"}]))
    (tmp / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq\td\t1\n")
    return tmp


def _pubmedqa(tmp: Path, **fields) -> Path:
    rec = {"QUESTION": "Does it?", "CONTEXTS": ["A context."], "LONG_ANSWER": "It does.", **fields}
    (tmp / "pqa.json").write_text(json.dumps({"7": rec}))
    return tmp / "pqa.json"


def _load_beir_queries(root: Path) -> None:
    from rag.corpus.beir import BeirQuestions

    BeirQuestions(root).load()


TEXT_FIELD_CASES = [
    ("BEIR title a number", lambda t: BeirCorpus(_beir(t, [{"_id": "d", "title": 3, "text": "x"}])).load(),
     "corpus.jsonl:1: field 'title' must be a string, got a number (3)"),
    ("BEIR text a list", lambda t: BeirCorpus(_beir(t, [{"_id": "d", "text": ["x"]}])).load(),
     "corpus.jsonl:1: field 'text' must be a string, got an array ([\"x\"])"),
    ("BEIR id an object", lambda t: BeirCorpus(_beir(t, [{"_id": {"n": 1}, "text": "x"}])).load(),
     "corpus.jsonl:1: field '_id' must be a string or an integer, got an object ({\"n\": 1})"),
    ("BEIR query a number", lambda t: _load_beir_queries(_beir(t, [{"_id": "d", "text": "x"}], [{"_id": "q", "text": 5}])),
     "queries.jsonl:1: field 'text' must be a string, got a number (5)"),
    ("PubMedQA question a number", lambda t: PubMedQACorpus(_pubmedqa(t, QUESTION=42)).load(),
     "pqa.json: record 7: field 'QUESTION' must be a string, got a number (42)"),
    ("PubMedQA context null", lambda t: PubMedQACorpus(_pubmedqa(t, CONTEXTS=["a", None])).load(),
     "pqa.json: record 7: missing or empty field 'CONTEXTS[1]'"),
    ("PubMedQA answer blank", lambda t: PubMedQACorpus(_pubmedqa(t, LONG_ANSWER="  ")).load(),
     "pqa.json: record 7: missing or empty field 'LONG_ANSWER'"),
    ("MEDLINE article without a PMID", lambda t: MedlineCorpus(paths=[_medline_file(t, ARTICLE.format(
        pmid=" ", abstract="<Abstract><AbstractText>x</AbstractText></Abstract>"))]).load(),
     "m.xml: article 1: missing or empty field 'PMID'"),
]


def _medline_file(tmp: Path, *articles: str) -> Path:
    (tmp / "m.xml").write_text(medline_xml(*articles))
    return tmp / "m.xml"


@pytest.mark.parametrize("load,expect", [c[1:] for c in TEXT_FIELD_CASES], ids=[c[0] for c in TEXT_FIELD_CASES])
def test_every_text_field_of_every_format_is_checked_by_one_rule(load, expect, tmp_path):
    with pytest.raises(RagError) as e:
        load(tmp_path)
    assert expect in str(e.value)
    one_line_error(e)


def test_numeric_ids_are_accepted_as_their_decimal_text(tmp_path):
    docs = BeirCorpus(_beir(tmp_path, [{"_id": 17, "text": "x"}])).load()
    assert [d.id for d in docs] == ["17"]
