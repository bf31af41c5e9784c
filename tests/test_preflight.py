"""rag/run/preflight.py: the data checks, each one line, all run in one step after the inputs load
and before anything is chunked or any model loads. The whole-pipeline messages are in the
bad-input table (tests/test_bad_input.py); here, each check on its own and the order they run in."""
from __future__ import annotations

import inspect

import pytest

from rag.run import preflight
from rag.types import Document, QAItem, RagError, Relevance

DOCS = [Document("d1", "x" * 100, "libc"), Document("d2", "y" * 10, "torch")]


def q(qid: str, **kw) -> QAItem:
    return QAItem(qid, "a question?", kw.pop("answer", "an answer"), kw.pop("source", "d1"), **kw)


def test_questions_must_name_documents_of_the_corpus_and_spans_inside_them():
    preflight.questions_match_corpus([q("a", relevant=(Relevance("d2", 1, (0, 10)),))], DOCS)
    cases = [
        ([], "qa: the question set is empty"),
        ([q("a"), q("a")], "qa: duplicate id(s) ['a']"),
        ([q("a", source="d9")], "names source 'd9', which is not a document of the corpus"),
        ([q("a", relevant=(Relevance("d9"),))], "labels document 'd9', which is not a document of the corpus"),
        ([q("a", relevant=(Relevance("d2", 1, (5, 11)),))], "labels span [5, 11] of 'd2', past the end of its text (10 characters)"),
    ]
    for qa, expect in cases:
        with pytest.raises(RagError) as e:
            preflight.questions_match_corpus(qa, DOCS)
        assert expect in str(e.value) and "\n" not in str(e.value)


def test_the_objective_must_be_scorable_and_documents_within_the_size_limit():
    with pytest.raises(RagError, match="objective 'ndcg_at_k' needs questions with a positive relevance label"):
        preflight.objective_applies("ndcg_at_k", [q("a", source=None)])
    preflight.objective_applies("mrr", [q("a")])
    with pytest.raises(RagError, match="document 'd1' is 100 characters, over max_doc_chars \\(50\\)"):
        preflight.document_sizes(DOCS, 50)
    preflight.document_sizes(DOCS, None)


def test_run_checks_in_the_listed_order_and_asks_the_components(monkeypatch):
    calls = []

    class Part:
        def check_filters(self, askers, docs):
            calls.append(("filters", [a[0] for a in askers]))

        def check_questions(self, qa):
            calls.append(("training", [x.id for x in qa]))

    preflight.run("mrr", [q("a"), q("b")], DOCS, [q("a")], DOCS[:1], None, Part(), Part(), [("--corpus libc", "libc", None)])
    assert calls == [("filters", ["question 'a'", "--corpus libc"]), ("training", ["a"])]
    # the docstring's list is the order of the calls
    body = inspect.getsource(preflight.run).split('"""')[2]
    order = [name for name in ("questions_match_corpus", "objective_applies", "document_sizes", "check_filters",
                               "check_questions") if name in body]
    assert sorted(order, key=body.index) == order
