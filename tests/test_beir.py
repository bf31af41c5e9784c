"""BEIR-layout datasets in, TREC run files out, on a small BEIR-layout dataset built from the
PubMedQA data that ships with the project."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytrec_eval

from rag.config.compose import data_dir
from rag.corpus import BeirCorpus
from rag.run.pipeline import run
from rag.corpus.beir import BeirQuestions
from rag.types import RagError, Relevance

N_DOCS, N_QUERIES = 30, 10


def make_beir(root: Path, n_docs: int = N_DOCS, n_queries: int = N_QUERIES) -> Path:
    """corpus.jsonl (abstract = text, first sentence of the question = title for half of them),
    queries.jsonl (the questions, plus one without judgements), qrels/test.tsv (each query's
    abstract grade 2, the next abstract grade 1, one judged non-relevant grade 0)."""
    raw = json.loads((data_dir() / "pubmedqa" / "ori_pqal.json").read_text(encoding="utf-8"))
    pmids = list(raw)[:n_docs]
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "corpus.jsonl", "w", encoding="utf-8") as f:
        for i, p in enumerate(pmids):
            title = f"Study {p}" if i % 2 else ""
            f.write(json.dumps({"_id": p, "title": title, "text": " ".join(raw[p]["CONTEXTS"]), "metadata": {"year": raw[p].get("YEAR")}}) + "\n")
    with open(root / "queries.jsonl", "w", encoding="utf-8") as f:
        for p in pmids[: n_queries + 1]:
            f.write(json.dumps({"_id": f"q{p}", "text": raw[p]["QUESTION"]}) + "\n")
    (root / "qrels").mkdir(exist_ok=True)
    lines = ["query-id\tcorpus-id\tscore"]
    for i, p in enumerate(pmids[:n_queries]):
        lines += [f"q{p}\t{p}\t2", f"q{p}\t{pmids[i + 1]}\t1", f"q{p}\t{pmids[-1]}\t0"]
    (root / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def test_beir_corpus_and_questions(tmp_path):
    root = make_beir(tmp_path / "beir")
    docs = BeirCorpus(root).load()
    assert len(docs) == N_DOCS and {d.source for d in docs} == {"beir"}
    assert docs[1].text.startswith("Study ") and "\n\n" in docs[1].text and docs[0].meta["title"] is None
    assert docs[0].meta["year"]
    items = BeirQuestions(root, split="test").load()
    assert len(items) == N_QUERIES, "the query without judgements is left out"
    first = items[0]
    assert first.answer is None and first.source is None and first.corpus == "beir"
    pmids = [d.id for d in docs]
    assert first.relevant == (Relevance(pmids[0], 2), Relevance(pmids[1], 1), Relevance(pmids[-1], 0))
    (root / "qrels" / "dev.tsv").write_text((root / "qrels" / "test.tsv").read_text())
    assert BeirQuestions(root).fingerprint() != BeirQuestions(root, split="dev").fingerprint()
    with pytest.raises(RagError, match=r"qrels/train.tsv: file not found"):
        BeirQuestions(root, split="train").load()


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (lambda r: (r / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\t2\n"), r"test.tsv:2: expected 3 fields"),
        (lambda r: (r / "qrels" / "test.tsv").write_text("qX\t1\tyes\n"), r"test.tsv:1: score must be an integer"),
        (lambda r: (r / "qrels" / "test.tsv").write_text("qX\t1\t1\n"), r"test.tsv: query id 'qX' is not in queries.jsonl"),
        (lambda r: (r / "qrels" / "test.tsv").unlink(), r"test.tsv: file not found"),
        (lambda r: (r / "queries.jsonl").write_text('{"_id": "a"}\n'), r"queries.jsonl:1: missing or empty field 'text'"),
    ],
)
def test_beir_question_errors(tmp_path, edit, pattern):
    root = make_beir(tmp_path / "beir")
    edit(root)
    with pytest.raises(RagError, match=pattern):
        BeirQuestions(root).load()


def test_beir_corpus_errors(tmp_path):
    root = make_beir(tmp_path / "beir")
    with open(root / "corpus.jsonl", "a") as f:
        f.write(json.dumps({"_id": "empty", "title": "", "text": " "}) + "\n")
    corpus = BeirCorpus(root)
    assert len(corpus.load()) == N_DOCS and "'empty' has no title and no text" in corpus.skipped[0]
    with open(root / "corpus.jsonl", "a") as f:
        f.write(json.dumps({"_id": "empty", "text": "again"}) + "\n")
    with pytest.raises(RagError, match=r"corpus.jsonl:32: duplicate document id 'empty'"):
        BeirCorpus(root).load()


@pytest.mark.heavy
def test_beir_end_to_end_writes_a_trec_run_that_trec_eval_scores_alike(tmp_path, compose_cfg):
    root = make_beir(tmp_path / "beir")
    out = tmp_path / "out"
    cfg = compose_cfg([
        "corpus=beir", f"corpus.path={root}", "qa=beir", "slice.docs_per_source=null",
        "slice.questions_per_corpus=null", f"paths.cache={tmp_path / 'cache'}", "+version=v1",
        "chunker.chunk_size=100000", "chunker.chunk_overlap=0", "eval.k=10", "eval.bootstrap.resamples=50",
        "objective=ndcg_at_k",
    ])
    result = run(cfg, out)
    metrics = result["metrics"]
    assert {"ndcg_at_k", "recall_at_k_label", "map_at_k"} <= set(metrics)
    assert not {"recall_at_k", "mrr", "precision_at_k", "hit_at_k_id", "mrr_id"} & set(metrics), \
        "no answers and no source: those metrics are not computed"
    assert metrics["ndcg_at_k"]["n"] == N_QUERIES and 0.3 < metrics["ndcg_at_k"]["mean"] <= 1.0
    rows = [json.loads(line) for line in (out / "per_question.jsonl").read_text().splitlines()]
    assert rows[0]["recall_at_k"] is None and rows[0]["retrieved"][0]["sim_to_truth"] is None
    assert {r["grade"] for row in rows for r in row["retrieved"]} == {0, 1, 2}
    run_lines = (out / "run.trec").read_text().splitlines()
    assert len(run_lines) == N_QUERIES * 10 and run_lines[0].split()[1::2] == ["Q0", "1", "v1"]
    trec_run = pytrec_eval.parse_run(run_lines)
    qrels: dict[str, dict[str, int]] = {}
    for line in (root / "qrels" / "test.tsv").read_text().splitlines()[1:]:
        qid, doc, grade = line.split("\t")
        qrels.setdefault(qid, {})[doc] = int(grade)
    per_q = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.10", "map_cut.10"}).evaluate(trec_run)
    by_id = {r["id"]: r for r in rows}
    for qid, v in per_q.items():
        assert by_id[qid]["ndcg_at_k"] == pytest.approx(v["ndcg_cut_10"])
        assert by_id[qid]["recall_at_k_label"] == pytest.approx(v["recall_10"])
        assert by_id[qid]["map_at_k"] == pytest.approx(v["map_cut_10"])
    assert (out / "qrels.trec").read_text().count("\n") == 3 * N_QUERIES
