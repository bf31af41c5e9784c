"""eval/record.py: a line of per_question.jsonl, typed. A real line read and written again is the
same bytes; the typed fields say what the line holds; lines of older runs and hand-made fixtures
read with what they lack as None.

Fixtures (tests/fixtures/per_question), each one line as a run wrote it on the tiny corpus: v1.jsonl
(retrieval only), v3.jsonl (a cross-encoder and local answers), served_and_judged.jsonl (+version=v2
with a router, llm=openai on a scripted server and the LLM judge)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval.record import QuestionLatency, QuestionRecord
from rag.store import strict_json
from rag.types import Relevance

FIX = Path(__file__).parent / "fixtures" / "per_question"


def line(name: str) -> str:
    return (FIX / name).read_text(encoding="utf-8").splitlines()[0]


def written(rec: QuestionRecord) -> str:
    """As rag.run.output writes a record into per_question.jsonl."""
    return strict_json.dumps(rec.to_json(), ensure_ascii=False)


@pytest.mark.parametrize("name", ["v1.jsonl", "v3.jsonl", "served_and_judged.jsonl"])
def test_a_real_line_reads_and_writes_back_byte_for_byte(name):
    text = line(name)
    rec = QuestionRecord.from_json(json.loads(text))
    assert written(rec) == text
    assert QuestionRecord.from_json(rec.to_json()) == rec


def test_the_typed_fields_hold_what_the_line_says():
    rec = QuestionRecord.from_json(json.loads(line("served_and_judged.jsonl")))
    assert (rec.id, rec.corpus, rec.source) == ("q1", "libc", "man:fcntl.2")
    assert rec.labels == [Relevance("man:fcntl.2", 1)]
    top = rec.retrieved[0]
    assert (top.rank, top.doc_id, top.grade, top.relevant_label) == (1, "man:fcntl.2", 1, True) and top.extra == {}
    assert rec.metrics["mrr"] == rec.metric("mrr") and "judge_faithfulness" not in rec.metrics
    assert rec.metric("judge_faithfulness") == 1.0 and rec.metric("judge_correctness") is None
    assert rec.judge["correctness"].verdicts["errors"][0].startswith("unparseable")
    assert rec.latency_ms is not None and rec.latency_ms.generate is not None and rec.routed == ["libc", "pytorch"]
    assert rec.generation is not None and rec.generation.served_model == "m-served"
    assert rec.generation.usage is not None and rec.generation.usage.completion_tokens == 10
    assert rec.contexts and rec.contexts[0].label is None


def test_a_retrieval_only_line_has_no_answer_and_writes_none():
    rec = QuestionRecord.from_json(json.loads(line("v1.jsonl")))
    assert rec.answer is None and rec.generation is None and rec.routed is None and rec.judge == {}
    doc = rec.to_json()
    assert not {"answer", "judge", "routed", "generation"} & set(doc)
    assert list(doc)[:7] == ["id", "question", "ground_truth", "source", "corpus", "labels", "retrieved"]


def test_a_record_only_scored_leaves_out_what_the_pipeline_adds():
    rec = QuestionRecord("q1", "why?", "because", None, None, metrics={"mrr": 1.0})
    assert list(rec.to_json()) == ["id", "question", "ground_truth", "source", "corpus", "labels", "retrieved", "mrr"]
    rec.latency_ms, rec.contexts = QuestionLatency(), []
    assert rec.to_json()["latency_ms"] == {} and rec.to_json()["contexts"] == []  # measured nothing, gave nothing


def test_older_and_hand_made_lines_read_with_what_they_lack_as_none():
    old = {"id": "q0", "corpus": "libc", "mrr": 0.5, "hit_at_k_id": None,
           "retrieved": [{"rank": 1, "chunk_id": "d#0", "doc_id": "d", "score": 0.9, "sim_to_truth": 0.8,
                          "relevant": True, "text": "t", "span": [0, 1]}],
           "latency_ms": {"retrieve": 3.0, "rerank": 1.0}, "note": "kept"}
    rec = QuestionRecord.from_json(old)
    assert rec.question is None and rec.ground_truth is None and rec.labels == [] and rec.contexts is None
    assert rec.metrics == {"mrr": 0.5, "hit_at_k_id": None} and rec.extra == {"note": "kept"}
    hit = rec.retrieved[0]
    assert hit.grade is None and hit.relevant_label is None and hit.extra == {"span": [0, 1]}
    assert rec.latency_ms == QuestionLatency(retrieve=3.0, rerank=1.0)
    assert rec.to_json()["retrieved"][0]["span"] == [0, 1]  # a key the code does not know survives


def test_a_generated_questions_provenance_round_trips_after_the_labels_and_a_written_one_has_none():
    prov = {"kind": "two_passage", "generator": {"class": "templates"}, "prompts": {}, "scores": {},
            "passages": [{"id": "d#0", "doc_id": "d", "start": 0, "end": 4, "text": "Tyre"}]}
    rec = QuestionRecord("gen-0001", "why?", "because", "d", "bikes", provenance=prov, metrics={"mrr": 1.0})
    doc = rec.to_json()
    assert list(doc)[5:8] == ["labels", "provenance", "retrieved"] and doc["provenance"] == prov
    back = QuestionRecord.from_json(json.loads(written(rec)))
    assert back == rec and back.provenance == prov and back.extra == {} and written(back) == written(rec)
    human = QuestionRecord.from_json(json.loads(line("v1.jsonl")))
    assert human.provenance is None and "provenance" not in human.to_json()


@pytest.mark.parametrize("doc, message", [
    ([1, 2], "a per-question record is a JSON object, not list"),
    ({"question": "why?"}, "a per-question record has an id"),
    ({"id": "q", "retrieved": [{"rank": 1, "text": "t"}]}, "a retrieved chunk has no chunk_id, doc_id, score"),
])
def test_what_is_no_record_is_a_value_error(doc, message):
    with pytest.raises(ValueError, match=message):
        QuestionRecord.from_json(doc)
