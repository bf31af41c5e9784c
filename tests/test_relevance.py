"""eval.relevance=llm: a judge LLM grades each (question, retrieved chunk) pair 0-3, each pair
once, and the label metrics are measured on the documents it found relevant."""
from __future__ import annotations

import json

import pytest

from eval.relevance import document_labels, parse_grade
from rag.pipeline import run
from rag.types import RagError, Relevance
from tests.conftest import TINY_DOCS, TINY_QA, tiny_overrides
from tests.scripted_endpoint import ScriptedEndpoint, completion

SOURCE_OF = {q: s for q, _, _, s, _ in TINY_QA}
QUESTION_ID = {question: q for q, question, _, _, _ in TINY_QA}
TEXT = {d: t for d, _, t in TINY_DOCS}


@pytest.mark.parametrize("reply, grade", [
    ("##final score: 2", 2), ("Final Score: 3.", 3), ("0", 0), ("I would say 1", 1),
    ("The passage is dedicated to the query.", None), ("score 12 of 3", None), ("", None), (None, None),
])
def test_a_grade_is_read_from_the_reply_or_the_pair_stays_unjudged(reply, grade):
    assert parse_grade(reply) == grade


def test_a_document_takes_its_best_chunks_grade_and_below_the_cut_counts_as_judged_not_relevant():
    judged = [("a", 1), ("a", 3), ("b", 1), ("c", None), ("d", 2)]
    assert document_labels(judged, relevant_from=2) == (Relevance("a", 3), Relevance("b", 0), Relevance("d", 2))
    assert document_labels([("c", None)], relevant_from=2) == (), "nothing judged: the question is unlabelled"


def grader(unparseable: str = ""):
    """A judge that grades 3 a passage cut from the question's source document and 0 any other;
    for the question `unparseable` it replies without a grade."""

    def chat(request, n):
        user = request["messages"][-1]["content"]
        query = user.rsplit("Query: ", 1)[1].split("\n", 1)[0]
        passage = user.rsplit("Passage: ", 1)[1].rsplit("\n\nReply with", 1)[0].strip()
        qid = QUESTION_ID[query]
        if qid == unparseable:
            return 200, {}, completion("The passage is dedicated to the query.")
        return 200, {}, completion(f"##final score: {3 if passage in TEXT[SOURCE_OF[qid]] else 0}")

    return chat


def judged(srv: ScriptedEndpoint, files, *extra: str) -> list[str]:
    return tiny_overrides(files) + ["eval.latency.sample=0", "eval.relevance=llm", "llm@eval.relevance_judge.llm=openai",
                                    f"eval.relevance_judge.llm.base_url={srv.base_url}",
                                    "eval.relevance_judge.llm.model=judge", *extra]


def test_each_pair_is_asked_once_and_the_labels_are_the_documents_the_judge_found(tmp_path, compose_cfg, tiny_files):
    with ScriptedEndpoint(chat=grader(unparseable="q2")) as srv:
        plan = run(compose_cfg(judged(srv, tiny_files, "dry_run=true")), tmp_path / "dry")["dry_run"]["roles"]
        assert srv.requests == [], "a dry run sends nothing"
        result = run(compose_cfg(judged(srv, tiny_files)), tmp_path / "llm")
        rows = [json.loads(line) for line in (tmp_path / "llm" / "per_question.jsonl").read_text().splitlines()]
        pairs = {(r["id"], h["text"]) for r in rows for h in r["retrieved"]}
        assert len(srv.chat_requests) == len(pairs) == plan["relevance"]["requests"], \
            "one request per distinct (question, chunk) pair, as the dry run counted"
        assert plan["relevance"]["exact"] and plan["relevance"]["items_are"] == "pairs"
        assert plan["relevance"]["input_tokens"] == sum(
            round(sum(len(m["content"]) for m in r["json"]["messages"]) / 4) for r in srv.chat_requests)
        again = run(compose_cfg(judged(srv, tiny_files)), tmp_path / "again")
        assert len(srv.chat_requests) == len(pairs), "a rerun asks nothing"
        replan = run(compose_cfg(judged(srv, tiny_files, "dry_run=true")), tmp_path / "dry2")["dry_run"]["roles"]
        assert replan["relevance"]["requests"] == 0 and replan["relevance"]["cached"] == len(pairs)
    labels = result["provenance"]["labels"]
    assert labels["source"] == "llm" and labels["judge"] == "judge" and labels["pairs"] == len(pairs)
    assert labels["unjudged"] == sum(1 for r in rows if r["id"] == "q2" for _ in r["retrieved"]) > 0
    human = run(compose_cfg(tiny_overrides(tiny_files) + ["eval.latency.sample=0"]), tmp_path / "human")
    for r in rows:
        grades = [h["judge_grade"] for h in r["retrieved"]]
        if r["id"] == "q2":
            assert grades == [None] * len(grades) and r["labels"] == [] and r["ndcg_at_k"] is None, \
                "unjudged pairs are neither relevant nor not: the question is left out, never counted as 0"
        else:
            found = SOURCE_OF[r["id"]] in {h["doc_id"] for h in r["retrieved"]}
            assert r["labels"] == [{"doc": h["doc_id"], "grade": 3 if h["doc_id"] == SOURCE_OF[r["id"]] else 0}
                                   for h in sorted({h["doc_id"]: h for h in r["retrieved"]}.values(),
                                                   key=lambda h: h["doc_id"])]
            assert (r["ndcg_at_k"] is not None) == found
    # this judge agrees with the source labels wherever it judged, so the label metrics agree too
    # where the source document was retrieved (the human labels also count it when it was not)
    by_id = {json.loads(line)["id"]: json.loads(line) for line in (tmp_path / "human" / "per_question.jsonl").read_text().splitlines()}
    for r in rows:
        if r["ndcg_at_k"] is not None:
            assert r["ndcg_at_k"] == pytest.approx(by_id[r["id"]]["ndcg_at_k"])
    assert human["provenance"]["labels"] == {"source": "qa"}
    assert again["metrics"] == result["metrics"]
    qrels = (tmp_path / "llm" / "qrels.trec").read_text().splitlines()
    assert {line.split()[0] for line in qrels} == {r["id"] for r in rows if r["labels"]}, "qrels: the judge's labels"


def test_a_bad_relevance_setting_is_one_line(compose_cfg, tiny_files):
    with pytest.raises(RagError, match="eval.relevance must be one of labels, llm"):
        run(compose_cfg(tiny_overrides(tiny_files) + ["eval.relevance=human"]), "/nonexistent")
    with pytest.raises(RagError, match="relevant_from"):
        run(compose_cfg(tiny_overrides(tiny_files) + ["eval.relevance=llm", "eval.relevance_judge.relevant_from=4"]),
            "/nonexistent")
