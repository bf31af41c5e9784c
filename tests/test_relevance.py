"""eval.relevance=llm: a judge LLM grades each (question, retrieved chunk) pair 0-3, each pair
once, and the label metrics are measured on the documents it found relevant."""
from __future__ import annotations

import json

import pytest

from eval.relevance import document_labels, parse_grade
from rag.run.pipeline import run
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


@pytest.mark.parametrize("reply, grade", [
    ("Grade: 2", 2), ("2.", 2), ("0.", 0), ("Grade: 3\n", 3), ("**Final score:** 3", 3),
    ("Grade: 2, since it answers the query", 2), ("M: 2, T: 1 ##final score: 1", 1),
])
def test_a_whole_number_0_to_3_is_a_grade_as_a_sentence_writes_it(reply, grade):
    assert parse_grade(reply) == grade


# A piece of a number is no grade: each of these leaves the pair unjudged, never graded 1 or 2.
NO_GRADE = ["-1", "2.5", "1e3", "1/3", "10", "final score: -1", "##final score: 2.5", "final score = 1e3",
            "Grade: 2/3", "3.0", "2nd", "+2", "\u22121", "50%", "score-1 overall", "2,5"]


@pytest.mark.parametrize("reply", NO_GRADE)
def test_only_a_whole_number_0_to_3_is_a_grade(reply):
    assert parse_grade(reply) is None


def test_a_judge_reply_that_held_no_answer_is_unjudged_and_asked_again(tmp_path):
    from rag.store.cache import ArtifactCache
    from rag.endpoint import EndpointSettings
    from rag.llm import OpenAIGenerator
    from rag.types import Chunk

    from eval.relevance import RECORD, RelevanceJudge

    refusing = {"on": True}

    def chat(request, n):
        if refusing["on"] and "malloc" in request["messages"][-1]["content"]:
            return 200, {}, {"choices": [{"index": 0, "finish_reason": "content_filter",
                                          "message": {"role": "assistant", "content": ""}}]}
        return 200, {}, completion("##final score: 3")

    chunks = [Chunk(f"{d}#0", d, TEXT[d], "libc", 0, len(TEXT[d]), 0) for d in ("man:fcntl.2", "man:malloc.3")]
    cache = ArtifactCache(tmp_path)
    with ScriptedEndpoint(chat=chat) as srv:
        llm = OpenAIGenerator(base_url=srv.base_url, model="judge", endpoint=EndpointSettings(backoff_s=0.01))
        judge = RelevanceJudge(llm)
        first = judge.grade(["Why was fcntl64 added?"], [chunks], cache)
        assert first.per_question == [[3, None]] and first.unjudged == 1
        assert cache.get_record(RECORD, judge.key("Why was fcntl64 added?", chunks[1].text)) is None, "not recorded"
        refusing["on"] = False
        again = judge.grade(["Why was fcntl64 added?"], [chunks], cache)
        assert again.per_question == [[3, 3]] and again.asked == 1 and len(srv.chat_requests) == 3


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
