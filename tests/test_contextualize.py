"""Contextual chunking (rag/chunker/contextualize.py, `chunker.contextualize`): with `title`, the
pipeline's embedder and BM25 index each chunk after its document's label and title; the chunks,
their key, the contexts the LLM reads and every metric keep the chunk's own text."""
from __future__ import annotations

import json

import pytest

from rag.store.chunk_set import ChunkSet
from rag.retriever.bm25 import BM25Index
from rag.chunker.contextualize import prefixes, title_of
from rag.run.pipeline import run
from rag.types import Chunk, Document, RagError
from tests.conftest import tiny_overrides, write_jsonl


def doc(doc_id: str, text: str = "text", **meta) -> Document:
    return Document(doc_id, text, "src", meta)


def test_the_title_line_is_the_label_and_the_records_title():
    assert title_of(doc("man:fcntl.2", title="fcntl - manipulate  file\ndescriptor")) == (
        "man page fcntl(2): fcntl - manipulate file descriptor")
    assert title_of(doc("torch:torch.nn.Dropout", object="torch.nn.Dropout")) == "PyTorch torch.nn.Dropout"
    assert title_of(doc("pmid:21645374", title=None)) == "PubMed PMID 21645374", "PubMedQA records carry no title"
    assert title_of(doc("notes-7", title="Release notes")) == "notes-7: Release notes"


def test_prefixes_follow_the_chunks_and_none_leaves_the_texts_alone():
    docs = [doc("a", title="Alpha"), doc("b")]
    chunks = [Chunk("a#0", "a", "x", "src", 0, 1, 0), Chunk("b#0", "b", "y", "src", 0, 1, 0),
              Chunk("a#1", "a", "z", "src", 1, 2, 1)]
    assert prefixes("none", docs, chunks) is None
    assert prefixes("title", docs, chunks) == ["a: Alpha", "b", "a: Alpha"]
    plain = ChunkSet("k", chunks)
    titled = plain.contextualized("title", prefixes("title", docs, chunks))
    assert titled.indexed_texts == ["a: Alpha\nx", "b\ny", "a: Alpha\nz"] and titled.texts == ["x", "y", "z"]
    assert plain.indexed_texts == plain.texts and plain.indexed_key() == {"chunks": "k"}
    assert titled.indexed_key() == {"chunks": "k", "context": "title"}
    with pytest.raises(RagError, match="chunker.contextualize must be one of none, title, llm, got 'head'"):
        prefixes("head", docs, chunks)


def test_a_chunk_that_never_names_its_page_is_found_by_its_title():
    docs = [doc("man:fcntl.2", "The call fails with EBADF when it was closed.", title="fcntl - manipulate file descriptor"),
            doc("man:pipe.2", "pipe creates a unidirectional data channel.", title="pipe - create pipe")]
    chunks = [Chunk(f"{d.id}#0", d.id, d.text, "libc", 0, len(d.text), 0) for d in docs]
    titled = ChunkSet("k", chunks).contextualized("title", prefixes("title", docs, chunks))
    found = {}
    for name, texts in (("plain", [c.text for c in chunks]), ("title", titled.indexed_texts)):
        bm25 = BM25Index()
        bm25.build(texts)
        hits = bm25.search(["manipulate file descriptor fcntl"], 2)
        found[name] = [int(i) for i, s in zip(hits.ids[0], hits.scores[0]) if i >= 0 and s > 0]
    assert found["title"][0] == 0
    assert 0 not in found["plain"], "without its title the chunk shares no word with the query"


def test_a_run_indexes_the_titles_and_scores_the_chunks_own_text(tmp_path, compose_cfg, tiny_files):
    corpus = [json.loads(x) for x in tiny_files["corpus"].read_text().splitlines()]
    for d in corpus:
        d["title"] = f"Title of {d['id']}"
    write_jsonl(tiny_files["corpus"], corpus)
    base = tiny_overrides(tiny_files) + ["retriever=hybrid", "eval.latency.sample=0"]
    plain = run(compose_cfg(base), tmp_path / "plain")
    titled = run(compose_cfg(base + ["chunker.contextualize=title"]), tmp_path / "title")
    arts = {name: r["artifacts"] for name, r in (("plain", plain), ("title", titled))}
    assert arts["title"]["chunks"]["key"] == arts["plain"]["chunks"]["key"] and arts["title"]["chunks"]["hit"]
    for kind in ("vectors", "bm25"):
        assert arts["title"][kind]["key"] != arts["plain"][kind]["key"] and not arts["title"][kind]["hit"]
    rows = [json.loads(x) for x in (tmp_path / "title" / "per_question.jsonl").read_text().splitlines()]
    texts = [c["text"] for r in rows for c in r["contexts"]]
    assert texts and not any("Title of" in t for t in texts), "the contexts are the chunks' own text"
    assert titled["config"]["chunker"]["contextualize"] == "title"


def test_an_llm_writes_each_chunks_line_once_and_a_rerun_asks_nothing(tmp_path, compose_cfg, tiny_files):
    from tests.scripted_endpoint import ScriptedEndpoint, completion

    def situate(req, n):  # a context line naming the document's first words: what an LLM would add
        user = req["messages"][-1]["content"]
        opening = user.split("Document:\n", 1)[1].split()[:3]
        return 200, {}, completion("This passage is from the document about " + " ".join(opening) + ".")

    with ScriptedEndpoint(chat=situate) as srv:
        over = tiny_overrides(tiny_files) + [
            "chunker.contextualize=llm", "llm@contextualizer.llm=openai", f"contextualizer.llm.base_url={srv.base_url}",
            "contextualizer.llm.model=m", "eval.latency.sample=0"]
        plan = run(compose_cfg(over + ["dry_run=true"]), tmp_path / "dry")["dry_run"]
        assert srv.requests == [], "a dry run asks nothing"
        first = run(compose_cfg(over), tmp_path / "first")
        asked = len(srv.chat_requests)
        again = run(compose_cfg(over), tmp_path / "again")
        assert len(srv.chat_requests) == asked, "every line is recorded: the rerun asks nothing"
    n = first["counts"]["chunks"]
    assert asked == n == plan["roles"]["contextualize"]["requests"] and plan["bounded_after"] == "contextualize"
    assert first["artifacts"]["vectors"]["key"] == again["artifacts"]["vectors"]["key"]
    plain = run(compose_cfg(tiny_overrides(tiny_files) + ["eval.latency.sample=0"]), tmp_path / "plain")
    assert plain["artifacts"]["vectors"]["key"] != first["artifacts"]["vectors"]["key"]
    assert plain["artifacts"]["chunks"]["key"] == first["artifacts"]["chunks"]["key"]
    rows = [json.loads(x) for x in (tmp_path / "first" / "per_question.jsonl").read_text().splitlines()]
    assert not any("This passage is from" in c["text"] for r in rows for c in r["contexts"])


def test_the_contextualizers_settings_are_checked():
    from rag.chunker.contextualize import LLMContextualizer

    with pytest.raises(RagError, match="contextualizer.llm must be a generator config"):
        LLMContextualizer(llm="smollm2")
