"""Bad input, as a table: each case gets one clear line naming the culprit, and no results.

Every case runs the real pipeline on the tiny corpus with one thing broken, and checks the
`RagError` message and that the output directory holds no metrics.json / per_question.jsonl.
A case marked `early` is a config value the schema (rag/config/schema.py) rejects at start-up: it must
fail before the corpus is even read, so nothing at all is in the cache.

Errors of the command line itself (Hydra overrides, the other entry points, interrupts) are in
tests/test_cli_errors.py.
"""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from rag.config.compose import PROJECT_ROOT
from rag.index.faiss_index import FlatL2Index
from rag.run.pipeline import run
from rag.types import RagError
from tests.conftest import MODEL_CACHE, TINY_DOCS, TINY_QA, tiny_overrides, write_jsonl


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
    early: bool = False  # rejected before the corpus is read: the cache stays empty


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


def _corpus_bytes(tmp: Path, data: bytes, name: str = "c.jsonl") -> Path:
    (tmp / name).write_bytes(data)
    return tmp / name


def _tiny_corpus_bytes() -> bytes:
    return "".join(json.dumps(r) + "\n" for r in docs_rows()).encode()


def _lone_surrogate(tmp: Path) -> Path:
    lines = [json.dumps(r) for r in docs_rows()]
    lines[3] = '{"id": "half", "text": "a broken \\ud800 escape", "source": "libc"}'
    return write_lines(tmp / "c.jsonl", lines)


def _qa_tag(corpus: str) -> Callable[[Path], Path]:
    return lambda t: _qa_with(t, [{**qa_rows()[0], "corpus": corpus}] + qa_rows()[1:])


def _libc_upper(tmp: Path) -> Path:
    return write_jsonl(tmp / "c.jsonl", [{**r, "source": "LIBC" if r["source"] == "libc" else r["source"]} for r in docs_rows()])


def _cache_is_a_file(files: dict, tmp: Path) -> list[str]:
    (tmp / "cache-file").write_text("not a directory")
    return [f"paths.cache={tmp / 'cache-file'}"]


def _qa_field(**fields) -> Callable[[Path], Path]:
    """The tiny question set with fields of its first question replaced."""
    return lambda t: _qa_with(t, [{**qa_rows()[0], **fields}] + qa_rows()[1:])


def _a_directory(name: str) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        (tmp / name).mkdir()
        return tmp / name
    return make


def _json_array(tmp: Path) -> Path:
    (tmp / "c.json").write_text(json.dumps(docs_rows(), indent=2))
    return tmp / "c.json"


QUESTION = "retriever.source_filter.mode=question"


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
    Case("document without an id", corpus_file(lambda t: _with_doc(t, text="no id here")),
         "c.jsonl:10: no 'id' field (fields: source, text); set corpus.id_field=<field> to read another field"),
    # a field under another name is missing, not empty, and the line names the setting that reads it
    Case("document with content instead of text", corpus_file(lambda t: _with_doc(t, id="late", content="Under another name.")),
         "c.jsonl:10: no 'text' field (fields: source, id, content); set corpus.text_field=content to read another field"),
    Case("question with query instead of question",
         qa_file(lambda t: _qa_with(t, qa_rows()[:2] + [{"id": "q3", "query": "Why?", "answer": "So.", "doc_id": "pmid:1"}])),
         "q.jsonl:3: no 'question' field (fields: id, query, answer, doc_id); set qa.question_field=query to read another field"),
    Case("question with response instead of answer",
         qa_file(lambda t: _qa_with(t, [{"id": "q1", "question": "Why?", "response": "Because."}])),
         "q.jsonl:1: no 'answer' field (fields: id, question, response); set qa.answer_field=response to read another "
         "field (or give graded 'relevant' labels)"),
    # question sets
    Case("question without answer", qa_file(lambda t: _qa_with(t, [{"id": "x", "question": "why?", "source": "man:fcntl.2"}])),
         "q.jsonl:1: no 'answer' field (fields: id, question, source); set qa.answer_field=<field> to read another field"),
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
    Case("router precision above 1", overrides("+version=v2", "retriever.source_filter.router.min_precision=1.5"), "router.min_precision must be a number from 0 (filter every question) to 1 (filter none), got 1.5"),
    Case("document over the size limit", overrides("max_doc_chars=100"), "characters, over max_doc_chars (100)"),
    # ---- the defects a probe of the inputs found, one case each ------------------------------
    Case("question tag in no filter group (#2)", lambda f, t: [f"qa.path={_qa_tag('other')(t)}", QUESTION],
         "corpus tag 'other' (question 'q1') is in no group of retriever.source_filter.groups [['pubmed'], ['libc', 'pytorch']]"),
    Case("document tag differs in case (#2)", lambda f, t: [f"corpus.path={_libc_upper(t)}", QUESTION],
         "question 'q1' has corpus tag 'libc', but its answer's document 'man:fcntl.2' has source 'LIBC'"),
    Case("eval.k a float (#4)", overrides("eval.k=2.5"), "eval.k must be an integer, got 2.5", early=True),
    Case("eval.k a boolean (#4)", overrides("eval.k=true"), "eval.k must be an integer, got true", early=True),
    Case("eval.k a word (#4)", overrides("eval.k=five"), "eval.k must be an integer, got 'five'", early=True),
    Case("cache path is a file (#5)", _cache_is_a_file, "cache-file is not a directory (set paths.cache or RAGRIG_CACHE", early=True),
    Case("lone surrogate in a text (#6)", corpus_file(_lone_surrogate), "c.jsonl:4: field 'text' contains a lone surrogate \\ud800"),
    Case("rrf k not a number (#9)", overrides("fusion=rrf", "fusion.k=nan"), "fusion.k must be an integer, got nan", early=True),
    Case("token chunks longer than the embedder keeps", overrides("chunker=token", "chunker.chunk_size=300", "chunker.chunk_overlap=16"),
         "chunker.chunk_size (300 tokens) is longer than the embedder keeps: it truncates at 256 tokens", early=True),
    Case("JSON array instead of JSON lines", corpus_file(_json_array), "c.json: this is one JSON array, not JSON lines"),
    Case("zero bootstrap resamples", overrides("eval.bootstrap.resamples=0"), "eval.bootstrap.resamples must be positive, got 0", early=True),
    # ---- cases found by probing the entry points --------------------------------
    Case("required path left unset", overrides("corpus.path=???"), "corpus.path is required and has no default", early=True),
    Case("alpha a word", overrides("fusion=weighted", "fusion.alpha=high"), "fusion.alpha must be a number, got 'high'", early=True),
    Case("candidates a word", overrides("retriever=hybrid", "retriever.candidates=lots"), "retriever.candidates must be an integer, got 'lots'", early=True),
    Case("unset environment variable", overrides("paths.cache=${oc.env:RAGRIG_TEST_UNSET_VARIABLE}"),
         "paths.cache: cannot resolve its value: Environment variable 'RAGRIG_TEST_UNSET_VARIABLE' not found", early=True),
    Case("metrics a string, not a list", overrides("eval.metrics=mrr"), "eval.metrics must be a list of names", early=True),
    Case("negative resamples", overrides("eval.bootstrap.resamples=-5"), "eval.bootstrap.resamples must be positive, got -5", early=True),
    Case("boolean a word", overrides("context.labels=maybe"), "context.labels must be true or false, got 'maybe'", early=True),
    Case("slice seed a word", overrides("slice.seed=abc"), "slice.seed must be an integer, got 'abc'", early=True),
    Case("negative size limit", overrides("max_doc_chars=-1"), "max_doc_chars must be positive or null, got -1", early=True),
    Case("unknown device", overrides("embedder.device=gpu"), "embedder.device must be a device such as cpu, cuda, cuda:1 or mps, got 'gpu'", early=True),
    Case("empty question path", overrides("qa.path="), "qa.path must name a file, got an empty value", early=True),
    Case("threshold NaN", overrides("eval.tau_h=nan"), "eval.tau_h is a cosine threshold and must be a finite number, got nan", early=True),
    Case("unknown chart format", overrides("report.formats=[png,jpgx]"), "report.formats: unknown ['jpgx']", early=True),
    Case("unknown fail_on", overrides("report.fail_on=sometimes"), "report.fail_on must be one of all, any, never, got 'sometimes'", early=True),
    Case("filter groups not nested", overrides(QUESTION, "retriever.source_filter.groups=[pubmed,libc]"),
         "retriever.source_filter.groups must be a list of lists of source tags", early=True),
    Case("fixed filter matches no source", overrides("retriever.source_filter.mode=fixed", "retriever.source_filter.sources=[PubMed]"),
         "retriever.source_filter.sources ['PubMed'] matches no document's source; document sources: ['libc', 'pubmed', 'pytorch']"),
    Case("zero max_seq_length", overrides("embedder.max_seq_length=0"), "embedder.max_seq_length must be positive or null, got 0", early=True),
    Case("ef_search a float", overrides("index=hnsw", "index.ef_search=2.5"), "index.ef_search must be an integer, got 2.5", early=True),
    Case("separators not a list", overrides("chunker=recursive", "chunker.separators=oops"),
         "chunker.separators must be a list of strings, e.g. [a,b], got 'oops'", early=True),
    Case("similarity out of range", overrides("llm=extractive", "llm.min_similarity=2"), "llm.min_similarity must be in [-1, 1], got 2", early=True),
    Case("missing tokenizer path", overrides("chunker=token", "chunker.tokenizer=/no/such/tokenizer"),
         "chunker.tokenizer '/no/such/tokenizer': path does not exist", early=True),
    Case("UTF-16 file", corpus_file(lambda t: _corpus_bytes(t, _tiny_corpus_bytes().decode().encode("utf-16"))),
         "c.jsonl: file is UTF-16 encoded (save it as UTF-8)"),
    Case("gzip-compressed file", corpus_file(lambda t: _corpus_bytes(t, gzip.compress(_tiny_corpus_bytes()), "c.jsonl.gz")),
         "c.jsonl.gz: file is gzip-compressed (gunzip it first)"),
    Case("NUL bytes in a line", corpus_file(lambda t: _corpus_bytes(t, _tiny_corpus_bytes() + b"\x00\x00\n")),
         "c.jsonl:10: NUL byte at column 1"),
    Case("lone surrogate in a question", qa_file(lambda t: write_lines(t / "q.jsonl", [json.dumps(r) for r in qa_rows()[:-1]] + [
        '{"id": "q9", "question": "why \\udfff?", "answer": "a", "corpus": "libc"}'])),
         "q.jsonl:6: field 'question' contains a lone surrogate \\udfff"),
    # ---- every text-valued field by one rule, one message shape ---------------
    Case("question a number (#25)", qa_file(_qa_field(question=42)), "q.jsonl:1: field 'question' must be a string, got a number (42)"),
    Case("answer an object (#25)", qa_file(_qa_field(answer={"text": "x"})), "q.jsonl:1: field 'answer' must be a string, got an object ({\"text\": \"x\"})"),
    Case("corpus tag a list (#25)", qa_file(_qa_field(corpus=["libc"])), "q.jsonl:1: field 'corpus' must be a string, got an array ([\"libc\"])"),
    Case("question source a boolean (#25)", qa_file(_qa_field(source=True)), "q.jsonl:1: field 'source' must be a string or an integer, got a boolean (true)"),
    Case("question id a fraction (#25)", qa_file(_qa_field(id=1.5)), "q.jsonl:1: field 'id' must be a string or an integer, got a number (1.5)"),
    Case("label document a list (#25)", qa_file(_qa_field(relevant=[{"doc": ["man:pipe.2"]}])),
         "q.jsonl:1: relevant[0]: field 'doc' must be a string or an integer, got an array ([\"man:pipe.2\"])"),
    Case("document text a number (#25)", corpus_file(lambda t: _with_doc(t, id="n", text=42)), "c.jsonl:10: field 'text' must be a string, got a number (42)"),
    Case("document source a number (#25)", corpus_file(lambda t: write_jsonl(t / "c.jsonl", [{**docs_rows()[0], "source": 7}] + docs_rows()[1:])),
         "c.jsonl:1: field 'source' must be a string, got a number (7)"),
    Case("document id null (#25)", corpus_file(lambda t: _with_doc(t, id=None, text="no id")), "c.jsonl:10: missing or empty field 'id'"),
    # ---- input shapes --------------------------------------------------------------
    Case("corpus path a directory (#25)", corpus_file(_a_directory("corpus-dir")), "corpus-dir: is a directory, expected a file"),
    Case("question path a directory (#25)", qa_file(_a_directory("qa-dir")), "qa-dir: is a directory, expected a file"),
    Case("a setting the component does not take (#25)", overrides("+chunker.chunk_sise=64"),
         "chunker.chunk_sise is not a setting of SlidingWindowChunker (did you mean chunk_size or chunk_overlap?)"),
    # ---- a grade is a small whole number, refused where it is read --------------------------
    Case("label grade past a 64-bit integer", qa_file(_qa_field(relevant=[{"doc": "man:pipe.2", "grade": 2**63}])),
         "q.jsonl:1: relevant[0]: 'grade' must be from 0 to 1000, got 9223372036854775808"),
    Case("label grade a score, not a grade", qa_file(_qa_field(relevant=[{"doc": "man:pipe.2", "grade": 1001}])),
         "q.jsonl:1: relevant[0]: 'grade' must be from 0 to 1000, got 1001"),
    # ---- a setting added to an option that takes none -----------------------------------------
    Case("a setting of llm=none", overrides("+llm.max_tokens=32"),
         "llm.max_tokens is not a setting of NoGenerator, which takes none; it is a setting of llm=openai: "
         "add llm=openai before llm.max_tokens=32", early=True),
    Case("a setting of reranker=none", overrides("reranker=none", "+reranker.top_n=5"),
         "reranker.top_n is not a setting of NoReranker, which takes none; it is a setting of reranker=cross_encoder", early=True),
    Case("a setting of compressor=none", overrides("+compressor.k=5"),
         "compressor.k is not a setting of NoCompressor, which takes none", early=True),
    Case("a sampling setting of llm=none", overrides("+llm.temperature=0.2"),
         "llm.temperature is not a setting of NoGenerator, which takes none; it is a setting of llm=openai (and openvino, "
         "smollm2): add llm=openai before llm.temperature=0.2", early=True),
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
    if case.early:
        cache = tiny_files["cache"]
        assert not cache.exists() or not any(cache.iterdir()), "rejected before any stage ran"


def test_the_table_keeps_its_cases():
    # 33 from the first round, 11 for the defects a probe found and at least 15 found by probing
    # since, 12 for the text-field rule and input shapes (plus the command-line cases in
    # tests/test_cli_errors.py and the faults in tests/test_endpoint_faults.py and
    # tests/test_storage_faults.py)
    assert len(CASES) >= 33 + 11 + 15 + 12


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
    assert done.returncode == 2
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


# ---- shapes and sizes that are valid input must simply work ----------------------------

def _metrics(out: Path) -> dict:
    return {m: v["mean"] for m, v in json.loads((out / "metrics.json").read_text())["metrics"].items()}


def test_crlf_line_endings_and_trailing_blank_lines_read_like_plain_json_lines(tiny_files, compose_cfg, tmp_path):
    crlf = tmp_path / "crlf"
    crlf.mkdir()
    for name in ("corpus", "qa"):
        data = tiny_files[name].read_bytes().replace(b"\n", b"\r\n") + b"\r\n\r\n   \n\n"
        (crlf / tiny_files[name].name).write_bytes(data)
    plain = run(compose_cfg(tiny_overrides(tiny_files)), tmp_path / "plain")
    files = {**tiny_files, "corpus": crlf / tiny_files["corpus"].name, "qa": crlf / tiny_files["qa"].name}
    windows = run(compose_cfg(tiny_overrides(files)), tmp_path / "windows")
    assert windows["counts"] == plain["counts"]
    assert _metrics(tmp_path / "windows") == _metrics(tmp_path / "plain")


@pytest.mark.parametrize("index", [
    ["index=ivf", "index.nlist=4096", "index.nprobe=8"],  # more cells than vectors: as many as the data supports
    ["index=hnsw", "index.M=512"],                        # more neighbours per node than nodes
])
def test_index_settings_larger_than_the_data_still_search_every_chunk(index, tiny_files, compose_cfg, tmp_path):
    exact = run(compose_cfg(tiny_overrides(tiny_files)), tmp_path / "exact")
    approx = run(compose_cfg(tiny_overrides(tiny_files) + index), tmp_path / "approx")
    assert approx["counts"]["chunks"] == exact["counts"]["chunks"] < 4096
    # With so few vectors every approximate index degenerates to an exhaustive search.
    assert _metrics(tmp_path / "approx")["recall_at_k"] == _metrics(tmp_path / "exact")["recall_at_k"]


def test_five_thousand_one_line_documents(tiny_files, compose_cfg, tmp_path):
    rows = docs_rows() + [{"id": f"line-{i}", "text": f"note {i}: a one-line document about item {i % 97}.",
                           "source": "libc"} for i in range(5000)]
    corpus = write_jsonl(tmp_path / "many.jsonl", rows)
    result = run(compose_cfg(tiny_overrides({**tiny_files, "corpus": corpus})), tmp_path / "out")
    assert result["counts"]["documents"] == len(rows)
    assert result["counts"]["chunks"] >= len(rows)
    assert (tmp_path / "out" / "per_question.jsonl").exists()


def test_a_20_mb_document_within_max_doc_chars_is_read_and_chunked_whole(tmp_path):
    from rag.chunker.sliding_window import SlidingWindowChunker
    from rag.corpus.jsonl import JsonlCorpus

    sentence = "The file descriptor is duplicated and both refer to the same open file description. "
    text = sentence * (20_000_000 // len(sentence))
    path = write_jsonl(tmp_path / "big.jsonl", docs_rows() + [{"id": "big", "text": text, "source": "libc"}])
    docs = JsonlCorpus(path).load()
    big = next(d for d in docs if d.id == "big")
    assert len(big.text) == len(text) >= 19_900_000
    chunks = SlidingWindowChunker(chunk_size=1000, chunk_overlap=100).split(big)
    assert text.startswith(chunks[0].text) and text.rstrip().endswith(chunks[-1].text.strip()), "first to last character"
    assert len(chunks) >= len(text) // 1000


# ---- your own files: the group tag's name, the question set a run needs, the option a path needs ----

def test_group_and_doc_id_read_as_the_old_source_and_corpus(tiny_files, compose_cfg, tmp_path):
    new = {"corpus": write_jsonl(tmp_path / "docs.jsonl", [{"id": i, "text": t, "group": s} for i, s, t in TINY_DOCS]),
           "qa": write_jsonl(tmp_path / "questions.jsonl", [{"id": i, "question": q, "answer": a, "doc_id": s, "group": c}
                                                            for i, q, a, s, c in TINY_QA]),
           "cache": tiny_files["cache"]}
    old = run(compose_cfg(tiny_overrides(tiny_files)), tmp_path / "old")
    renamed = run(compose_cfg(tiny_overrides(new)), tmp_path / "new")
    assert _metrics(tmp_path / "new") == _metrics(tmp_path / "old")
    assert set(renamed["by_corpus"]) == set(old["by_corpus"]) == {"libc", "pytorch", "pubmed"}


def test_a_run_on_your_own_corpus_without_questions_says_which_to_add(tiny_files, compose_cfg, tmp_path):
    cfg = compose_cfg([f"paths.model_cache={MODEL_CACHE}", "corpus=jsonl", f"corpus.path={tiny_files['corpus']}",
                       f"paths.cache={tiny_files['cache']}"])
    with pytest.raises(RagError) as err:
        run(cfg, tmp_path / "out")
    assert str(err.value) == ("qa=none: a run scores a question set; add qa=jsonl qa.path=my_questions.jsonl "
                              "(python -m rag.ask needs none)")
    assert not tiny_files["cache"].exists(), "said before the corpus is read"


@pytest.mark.parametrize("entry", [["run.py", "hydra.run.dir=OUT"], ["-m", "rag.ask", "Why was fcntl64 added?"]])
@pytest.mark.parametrize("extra,expect", [
    (["corpus.path=docs.jsonl"],
     "corpus.path is a setting of corpus=jsonl (and beir, pubmedqa); add corpus=jsonl before corpus.path=docs.jsonl"),
    (["qa.path=questions.jsonl"],
     "qa.path is a setting of qa=jsonl (and beir, pubmedqa); add qa=jsonl before qa.path=questions.jsonl"),
])
def test_a_path_given_without_its_option_names_the_option(entry, extra, expect, tmp_path):
    args = [a.replace("OUT", str(tmp_path / "out")) for a in entry]
    done = subprocess.run([sys.executable, *args, *extra], capture_output=True, text=True, cwd=PROJECT_ROOT,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().endswith(f"error: {expect}"), done.stderr[-2000:]
    assert "+corpus.path" not in done.stderr and "+qa.path" not in done.stderr and "Traceback" not in done.stderr
