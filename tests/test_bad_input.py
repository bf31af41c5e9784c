"""Bad input, as a table: each case gets one clear line naming the culprit, and no results.

Every case runs the real pipeline on the tiny corpus with one thing broken, and checks the
`RagError` message and that the output directory holds no metrics.json / per_question.jsonl.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from rag.config import PROJECT_ROOT
from rag.index import FlatL2Index
from rag.pipeline import run
from rag.types import RagError
from tests.conftest import TINY_DOCS, TINY_QA, tiny_overrides, write_jsonl


def docs_rows() -> list[dict]:
    return [{"id": i, "text": t, "source": s} for i, s, t in TINY_DOCS]


def qa_rows() -> list[dict]:
    return [{"id": i, "question": q, "answer": a, "source": s, "corpus": c} for i, q, a, s, c in TINY_QA]


def write_lines(path: Path, lines: list[str | bytes]) -> Path:
    data = b"".join((ln if isinstance(ln, bytes) else ln.encode()) + b"\n" for ln in lines)
    path.write_bytes(data)
    return path


@dataclass
class Case:
    name: str
    # Given the tiny files and a scratch dir, returns extra overrides (and may write bad files).
    setup: Callable[[dict, Path], list[str]]
    expect: str  # a substring of the one-line error


def corpus_file(make: Callable[[Path], Path]) -> Callable[[dict, Path], list[str]]:
    return lambda files, tmp: [f"corpus.path={make(tmp)}"]


def qa_file(make: Callable[[Path], Path]) -> Callable[[dict, Path], list[str]]:
    return lambda files, tmp: [f"qa.path={make(tmp)}"]


def overrides(*ov: str) -> Callable[[dict, Path], list[str]]:
    return lambda files, tmp: list(ov)


def _invalid_json_line_3(tmp: Path) -> Path:
    lines = [json.dumps(r) for r in docs_rows()]
    lines[2] = '{"id": "broken", "text": "unterminated'
    return write_lines(tmp / "c.jsonl", lines)


def _non_utf8_line_2(tmp: Path) -> Path:
    lines: list[str | bytes] = [json.dumps(r) for r in docs_rows()]
    lines[1] = b'{"id": "latin1", "text": "caf\xe9 cr\xe8me", "source": "libc"}'
    return write_lines(tmp / "c.jsonl", lines)


def _with_doc(tmp: Path, **fields) -> Path:
    return write_jsonl(tmp / "c.jsonl", docs_rows() + [{"source": "libc", **fields}])


def _qa_with(tmp: Path, rows: list[dict]) -> Path:
    return write_jsonl(tmp / "q.jsonl", rows)


CASES = [
    # configuration values
    Case("chunk overlap >= size", overrides("chunker.chunk_size=100", "chunker.chunk_overlap=100"), "chunker.chunk_overlap (100) must be smaller than chunker.chunk_size (100)"),
    Case("zero chunk size", overrides("chunker.chunk_size=0"), "chunker.chunk_size"),
    Case("negative chunk size", overrides("chunker.chunk_size=-5"), "chunker.chunk_size"),
    Case("negative overlap", overrides("chunker.chunk_overlap=-1"), "chunker.chunk_overlap"),
    Case("k larger than the chunks", overrides("eval.k=500"), "eval.k (500) is larger than the number of chunks"),
    Case("k zero", overrides("eval.k=0"), "eval.k must be positive, got 0"),
    Case("alpha above 1", overrides("fusion=weighted", "fusion.alpha=1.5"), "fusion.alpha must be in [0, 1], got 1.5"),
    Case("alpha below 0", overrides("fusion=weighted", "fusion.alpha=-0.1"), "fusion.alpha must be in [0, 1], got -0.1"),
    Case("tau_recall above 1", overrides("eval.tau_recall=1.5"), "eval.tau_recall is a cosine threshold and must be in [-1, 1], got 1.5"),
    Case("tau_h below -1", overrides("eval.tau_h=-2"), "eval.tau_h is a cosine threshold and must be in [-1, 1], got -2"),
    Case("unknown metric", overrides("eval.metrics=[recall_at_k,ndcg]"), "eval.metrics: unknown metric(s) ['ndcg']"),
    Case("objective needs answers", overrides("objective=answer_gt"), "objective 'answer_gt' needs generated answers, but llm=none"),
    Case("objective not a metric", overrides("objective=ndcg"), "objective 'ndcg' is not among the reported metrics"),
    Case("missing embedder path", overrides("embedder.model=/no/such/model"), "embedder model '/no/such/model': path /no/such/model does not exist"),
    Case("missing embedder package", overrides("embedder.model=package:no_such_model_pkg"), "package 'no_such_model_pkg' is not installed"),
    Case("bad source filter mode", overrides("retriever.source_filter.mode=sometimes"), "retriever.source_filter.mode must be none, fixed"),
    Case("unknown bm25 backend", overrides("retriever=bm25", "retriever.backend=lucene"), "backend must be one of"),
    Case("zero HNSW M", overrides("index=hnsw", "index.M=0"), "index.M must be positive, got 0"),
    Case("rrf k negative", overrides("fusion=rrf", "fusion.k=-1"), "fusion.k must be >= 0, got -1"),
    Case("bad slice size", overrides("slice.docs_per_source=0"), "slice.docs_per_source must be positive or null, got 0"),
    # corpus files
    Case("missing corpus file", overrides("corpus.path=/no/such/corpus.jsonl"), "/no/such/corpus.jsonl: file not found"),
    Case("empty corpus file", corpus_file(lambda t: write_lines(t / "c.jsonl", [])), "c.jsonl: file is empty"),
    Case("invalid JSON on line 3", corpus_file(_invalid_json_line_3), "c.jsonl:3: invalid JSON"),
    Case("document with empty text", corpus_file(lambda t: _with_doc(t, id="blank", text="   ")), "document 'blank' has empty text"),
    Case("non-UTF-8 bytes on line 2", corpus_file(_non_utf8_line_2), "c.jsonl:2: invalid UTF-8 (byte 0xe9)"),
    Case("duplicate document ids", corpus_file(lambda t: _with_doc(t, id="man:fcntl.2", text="again")), "duplicate document id 'man:fcntl.2'"),
    Case("document without an id", corpus_file(lambda t: _with_doc(t, text="no id here")), "missing or empty field 'id'"),
    # question sets
    Case("question without answer", qa_file(lambda t: _qa_with(t, [{"id": "x", "question": "why?", "source": "man:fcntl.2"}])), "missing or empty field 'answer'"),
    Case("source that names no document", qa_file(lambda t: _qa_with(t, [{"id": "x", "question": "q?", "answer": "a", "source": "man:nothing.2"}])), "question 'x' names source 'man:nothing.2', which is not a document of the corpus"),
    Case("duplicate question ids", qa_file(lambda t: _qa_with(t, qa_rows() + [qa_rows()[0]])), "duplicate question id 'q1'"),
    Case("empty question set", qa_file(lambda t: write_lines(t / "q.jsonl", [])), "q.jsonl: file is empty"),
    Case("missing question file", overrides("qa.path=/no/such/questions.jsonl"), "/no/such/questions.jsonl: file not found"),
    Case("label naming no document", qa_file(lambda t: _qa_with(t, [{"id": "x", "question": "q?", "answer": "a", "relevant": [{"doc": "man:nothing.2"}]}])), "question 'x' labels document 'man:nothing.2', which is not a document of the corpus"),
    Case("label span past the text", qa_file(lambda t: _qa_with(t, [{"id": "x", "question": "q?", "relevant": [{"doc": "man:pipe.2", "span": [10, 99999]}]}])), "question 'x' labels span [10, 99999] of 'man:pipe.2', past the end of its text"),
    Case("label span reversed", qa_file(lambda t: _qa_with(t, [{"id": "x", "question": "q?", "relevant": [{"doc": "man:pipe.2", "span": [20, 10]}]}])), "q.jsonl:1: relevant[0]: 'span' must be [start, end] character offsets with 0 <= start < end, got [20, 10]"),
    Case("label grade not an integer", qa_file(lambda t: _qa_with(t, [{"id": "x", "question": "q?", "relevant": [{"doc": "man:pipe.2", "grade": "high"}]}])), "q.jsonl:1: relevant[0]: 'grade' must be a non-negative integer, got 'high'"),
    Case("objective needs labels", lambda f, t: [f"qa.path={_qa_with(t, [{'id': 'x', 'question': 'q?', 'answer': 'a'}])}", "objective=ndcg_at_k"], "objective 'ndcg_at_k' needs questions with a positive relevance label"),
    Case("objective needs answers (BEIR-like set)", lambda f, t: [f"qa.path={_qa_with(t, [{'id': 'x', 'question': 'q?', 'relevant': [{'doc': 'man:pipe.2'}]}])}"], "objective 'mrr' needs questions with a ground-truth answer"),
    Case("router with BM25 alone", overrides("retriever=bm25", "retriever.source_filter.mode=router"), "mode=router routes in the dense embedder's space"),
    Case("unknown router method", overrides("+version=v2", "retriever.source_filter.router.method=knn"), "router.method must be one of ['centroid', 'logistic'], got 'knn'"),
    Case("document over the size limit", overrides("max_doc_chars=100"), "characters, over max_doc_chars (100)"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_clear_line_and_leaves_no_results(case, tiny_files, compose_cfg, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    cfg = compose_cfg(tiny_overrides(tiny_files) + case.setup(tiny_files, scratch))
    out = tmp_path / "out"
    with pytest.raises(RagError) as err:
        run(cfg, out)
    message = str(err.value)
    assert case.expect in message
    assert "\n" not in message, "one line"
    assert not (out / "metrics.json").exists() and not (out / "per_question.jsonl").exists()


def test_at_least_thirty_cases():
    assert len(CASES) >= 30


def test_embedder_dimension_differs_from_an_index():
    index = FlatL2Index().build(np.eye(8, dtype=np.float32))
    with pytest.raises(RagError, match="query dimension 384 differs from the index dimension 8"):
        index.search(np.zeros((1, 384), np.float32), 3)


@pytest.mark.parametrize("extra,expect", [
    (["chunker=nope"], "Could not find 'chunker/nope'"),
    (["chunker.chunk_overlap=600"], "ragrig: error: chunker.chunk_overlap (600) must be smaller than chunker.chunk_size"),
])
def test_command_line_errors_have_no_traceback(extra, expect, tiny_files):
    args = [sys.executable, str(PROJECT_ROOT / "run.py"), f"hydra.run.dir={tiny_files['out']}"]
    done = subprocess.run(args + tiny_overrides(tiny_files) + extra, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert done.returncode != 0
    assert expect in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tiny_files["out"] / "metrics.json").exists()


def test_four_bit_llm_without_cuda_fails_at_start_up(tiny_files, compose_cfg, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = compose_cfg(tiny_overrides(tiny_files) + ["llm=qwen2_5_1_5b_4bit"])
    with pytest.raises(RagError, match="llm.quantization=4bit needs a CUDA GPU") as err:
        run(cfg, tmp_path / "out")
    assert "\n" not in str(err.value)
    assert not (tiny_files["cache"] / "vectors").exists(), "it failed before any expensive stage"
