"""Relevance labels: chunk relevance derived from document ids and spans, and the IR measures
(trec_eval through pytrec_eval) against hand-computed values and against the project's own
by-source-id metrics."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import pytrec_eval

from eval import metrics as M
from eval.labels import chunk_grade, found_units, label_metrics, matches, trec_measures
from eval.trec import format_qrels, format_run
from rag.chunker import SentenceChunker, SlidingWindowChunker
from rag.config.compose import data_dir
from rag.corpus.pubmedqa import PubMedQACorpus
from rag.qa.pubmedqa import PubMedQAQuestions
from rag.types import Chunk, QAItem, Relevance


def chunk(doc: str, start: int, end: int, position: int) -> Chunk:
    return Chunk(id=f"{doc}#{position}", doc_id=doc, text="x" * (end - start), source="s", start=start, end=end,
                 position=position)


A0, A1, A2 = chunk("A", 0, 100, 0), chunk("A", 100, 200, 1), chunk("A", 200, 300, 2)
B0, B1 = chunk("B", 0, 100, 0), chunk("B", 100, 200, 1)
C0 = chunk("C", 0, 100, 0)
# A is relevant as a whole (grade 2); in B only the span [150, 160) is (grade 1).
LABELS = (Relevance("A", 2), Relevance("B", 1, (150, 160)))
ITEM = QAItem("q", "question?", None, corpus="x", relevant=LABELS)
RANKED = [C0, A1, A0, B0, B1]


def test_chunk_relevance_from_document_and_span():
    assert [chunk_grade(c, LABELS) for c in RANKED] == [0, 2, 2, 0, 1]
    # a span matches the chunks it shares at least one character with, boundaries exclusive
    span = Relevance("B", 1, (100, 101))
    assert matches(B1, span) and not matches(B0, span)
    assert not matches(chunk("B", 101, 150, 2), span)


def test_found_units_collapse_chunks_to_labels_and_documents():
    # C (not relevant), A (its second chunk adds nothing), B as a document (its first chunk misses
    # the span), then the span itself
    assert found_units(RANKED, LABELS) == ["C", "A", "B", "B@150-160"]


def test_ndcg_recall_map_hand_computed():
    values, grades = label_metrics([ITEM], [RANKED], k=5)
    dcg = 2 / math.log2(3) + 1 / math.log2(5)  # A at rank 2, the span at rank 4
    idcg = 2 / math.log2(2) + 1 / math.log2(3)
    assert values["ndcg_at_k"][0] == pytest.approx(dcg / idcg)
    assert values["recall_at_k_label"][0] == pytest.approx(1.0)
    assert values["map_at_k"][0] == pytest.approx((1 / 2 + 2 / 4) / 2)
    assert grades == [[0, 2, 2, 0, 1]]

    values, _ = label_metrics([ITEM], [RANKED[:3]], k=3)
    assert values["ndcg_at_k"][0] == pytest.approx((2 / math.log2(3)) / (2 + 1 / math.log2(3)))
    assert values["recall_at_k_label"][0] == pytest.approx(0.5)
    assert values["map_at_k"][0] == pytest.approx((1 / 2) / 2)  # divided by all relevant labels


def test_perfect_and_empty_rankings():
    values, _ = label_metrics([ITEM, ITEM], [[A0, B1, C0], []], k=3)
    assert values["ndcg_at_k"].tolist() == pytest.approx([1.0, 0.0])
    assert values["map_at_k"].tolist() == pytest.approx([1.0, 0.0])


def test_questions_without_positive_labels_are_not_scored():
    unlabelled = QAItem("u", "q?", "a")
    judged_only = QAItem("j", "q?", None, relevant=(Relevance("A", 0),))
    from_source = QAItem("s", "q?", "a", source="A")
    values, grades = label_metrics([unlabelled, judged_only, from_source], [[A0], [A0], [C0, A0]], k=2)
    assert np.isnan(values["ndcg_at_k"][:2]).all()
    assert values["ndcg_at_k"][2] == pytest.approx(1 / math.log2(3))
    assert grades == [None, [0], [0, 1]]


def test_span_relevance_survives_rechunking():
    """The same span label, two chunkers: each finds the chunks holding the conclusion, and a
    ranking that puts them first is perfect under both."""
    path = data_dir() / "pubmedqa" / "ori_pqal.json"
    doc = PubMedQACorpus(path).load()[0]
    item = PubMedQAQuestions(path).load()[0]
    (label,) = item.labels
    assert label.doc == doc.id and doc.text[label.span[0]:label.span[1]] == item.answer
    for chunker in (SlidingWindowChunker(chunk_size=256, chunk_overlap=32), SentenceChunker(chunk_size=200, chunk_overlap=0)):
        chunks = chunker.split(doc)
        grades = [chunk_grade(c, item.labels) for c in chunks]
        overlapping = [c.end > label.span[0] for c in chunks]  # the conclusion ends the document
        assert grades == [int(o) for o in overlapping] and 0 < sum(grades) < len(chunks)
        best_first = sorted(chunks, key=lambda c: -chunk_grade(c, item.labels))[:5]
        worst_first = sorted(chunks, key=lambda c: chunk_grade(c, item.labels))[:1]
        values, _ = label_metrics([item, item], [best_first, worst_first], k=5)
        assert values["ndcg_at_k"].tolist() == pytest.approx([1.0, 0.0])
        assert values["recall_at_k_label"].tolist() == pytest.approx([1.0, 0.0])


def test_pubmedqa_conclusion_spans_are_exact_for_every_record():
    path = data_dir() / "pubmedqa" / "ori_pqal.json"
    texts = {d.id: d.text for d in PubMedQACorpus(path).load()}
    items = PubMedQAQuestions(path).load()
    assert all(texts[i.source][i.labels[0].span[0]:i.labels[0].span[1]] == i.answer for i in items)
    assert all(i.labels == (Relevance(i.source),) for i in PubMedQAQuestions(path, label="abstract").load())


def test_mrr_and_hit_by_source_id_match_trec_eval():
    """The project's own by-source-id MRR and hit@k against trec_eval's recip_rank and success
    on the same chunk rankings (chunks of the source document relevant)."""
    rng = np.random.default_rng(7)
    docs = [f"d{i}" for i in range(6)]
    k = 5
    ranked = [[(docs[j], p) for j, p in zip(rng.integers(0, 6, k), range(k))] for _ in range(200)]
    sources = [docs[int(i)] for i in rng.integers(0, 6, len(ranked))]
    rel = M.relevant_by_id([[d for d, _ in r] for r in ranked], sources)
    qrels, run = {}, {}
    for q, (r, src) in enumerate(zip(ranked, sources)):
        ids = [f"{d}#{p}" for d, p in r]
        qrels[str(q)] = {f"{src}#{p}": 1 for p in range(k)}
        run[str(q)] = ids
    trec = trec_measures(qrels, run, ["recip_rank", f"success.{k}"])
    np.testing.assert_allclose(M.reciprocal_rank(rel), [trec[str(q)]["recip_rank"] for q in range(len(ranked))])
    np.testing.assert_allclose(M.recall_at_k(rel), [trec[str(q)][f"success.{k}"] for q in range(len(ranked))])
    assert 0 < M.reciprocal_rank(rel).mean() < 1


def test_trec_files_reproduce_document_level_label_metrics():
    """trec_eval on the written run.trec and qrels.trec gives the run's label metrics."""
    items = [QAItem(f"q{i}", "q?", None, relevant=(Relevance("A", 2), Relevance("C", 1))) for i in range(3)]
    rankings = [[C0, A1, A0, B0, B1], [B1, B0, A2], [A0, A1, A2]]
    values, _ = label_metrics(items, rankings, k=5)
    records = [{"id": it.id, "retrieved": [{"rank": j + 1, "doc_id": c.doc_id} for j, c in enumerate(r)]}
               for it, r in zip(items, rankings)]
    run_text, qrels_text = format_run(records, "v9"), format_qrels(items)
    assert run_text.splitlines()[:2] == ["q0 Q0 C 1 3 v9", "q0 Q0 A 2 2 v9"]
    run = pytrec_eval.parse_run(run_text.splitlines())
    qrels = pytrec_eval.parse_qrel(qrels_text.splitlines())
    trec = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.5", "recall.5", "map_cut.5"}).evaluate(run)
    for q, it in enumerate(items):
        assert values["ndcg_at_k"][q] == pytest.approx(trec[it.id]["ndcg_cut_5"])
        assert values["recall_at_k_label"][q] == pytest.approx(trec[it.id]["recall_5"])
        assert values["map_at_k"][q] == pytest.approx(trec[it.id]["map_cut_5"])


def test_labels_round_trip_through_json():
    item = QAItem("q", "q?", "a", source="A", relevant=LABELS)
    assert item.to_json()["relevant"] == [{"doc": "A", "grade": 2}, {"doc": "B", "grade": 1, "span": [150, 160]}]
    assert json.dumps(item.to_json())
    assert QAItem("q", "q?", "a", source="A").labels == (Relevance("A", 1),)



# ---- a grade is bounded where labels are read -----------------------------------------------------

def test_the_largest_grade_allowed_still_scores_and_one_past_a_64_bit_integer_would_not():
    from rag.types import MAX_GRADE

    assert trec_measures({"q": {"d": MAX_GRADE, "e": 1}}, {"q": ["d", "e"]}, ["ndcg_cut.5"]) == {"q": {"ndcg_cut.5": 1.0}}
    with pytest.raises(SystemError):  # what trec_eval did with such a grade, after the whole run
        trec_measures({"q": {"d": 2**63}}, {"q": ["d"]}, ["ndcg_cut.5"])


@pytest.mark.parametrize("grade", [2**63, 2**31, 1001])
def test_a_question_files_grade_past_the_bound_is_one_line_naming_file_and_line(grade, tmp_path):
    from rag.qa.jsonl import JsonlQuestions
    from rag.types import RagError

    path = tmp_path / "q.jsonl"
    rows = [{"id": "a", "question": "q?", "relevant": [{"doc": "d", "grade": 3}]},
            {"id": "b", "question": "q?", "relevant": [{"doc": "d", "grade": 1}, {"doc": "e", "grade": grade}]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(RagError) as e:
        JsonlQuestions(path).items()
    assert str(e.value) == (f"{path}:2: relevant[1]: 'grade' must be from 0 to 1000, got {grade} "
                            "(a grade is a small whole number, e.g. 0-3)")


def test_a_beir_qrels_score_past_the_bound_names_its_line(tmp_path):
    from rag.corpus.beir import read_qrels
    from rag.types import RagError

    path = tmp_path / "test.tsv"
    path.write_text("query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\td2\t18446744073709551616\n")
    with pytest.raises(RagError, match=r"test.tsv:3: score must be from 0 to 1000, got 18446744073709551616"):
        read_qrels(path)
    path.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1000\n")
    assert read_qrels(path) == {"q1": {"d1": 1000}}


def test_the_gates_qrels_keep_trecs_negative_grades_and_bound_both_ends(tmp_path):
    from experiments.gate import read_qrels
    from rag.types import RagError

    path = tmp_path / "qrels.txt"
    path.write_text("q1 0 d1 2\n\nq1 0 d2 -1\n")
    assert read_qrels(path) == {"q1": {"d1": 2, "d2": -1}}
    for grade, line in (("9223372036854775808", "q1 0 d3"), ("-9223372036854775809", "q2 0 d1")):
        path.write_text(f"q1 0 d1 2\n\n{line} {grade}\n")
        with pytest.raises(RagError, match=rf"qrels.txt:3: the grade must be from -1000 to 1000, got {grade}"):
            read_qrels(path)
