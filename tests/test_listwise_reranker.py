"""`reranker=llm_listwise` (rag/reranker/listwise.py): RankGPT's sliding window through a generator;
the permutation read robustly, an unparsed or partial answer counted with its question kept in the
first-stage order, each window's answer recorded. The LLM here is `llm=openai`'s real client
against a scripted server that ranks the passages of the prompt it receives by word overlap with
the query; tests/test_server.py ranks with a real model."""
from __future__ import annotations

import re

import pytest

from rag.store.cache import ArtifactCache
from rag.run.pipeline import run
from rag.reranker.listwise import ListwiseReranker, read_order
from rag.types import Chunk, Hits, RagError
from tests.conftest import tiny_overrides
from tests.scripted_endpoint import ScriptedEndpoint, completion

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"]
# chunk i shares i words with the query "alpha beta gamma delta epsilon zeta": the best is the last
CHUNKS = [Chunk(f"c{i}", f"d{i}", " ".join(WORDS[:i] + ["filler"] * (6 - i)), "src", 0, 10, 0) for i in range(7)]
QUERY = "alpha beta gamma delta epsilon zeta"


def ranking_server(mode: str = "ok"):
    def chat(req, n):
        user = req["messages"][-1]["content"]
        query = set(re.search(r"Search query: (.*)", user).group(1).split())
        passages = re.findall(r"^\[(\d+)\] (.*)$", user, flags=re.M)
        order = sorted(passages, key=lambda p: -len(query & set(p[1].split())))
        ids = [f"[{i}]" for i, _ in order]
        text = {"ok": " > ".join(ids), "partial": " > ".join(ids[:2]),
                "unparsed": "I cannot rank these passages."}[mode]
        return 200, {}, completion(text, prompt_tokens=100, completion_tokens=12)
    return chat


def reranker(base_url: str, tmp_path, **kw) -> ListwiseReranker:
    from hydra import compose, initialize_config_dir

    from rag.config.compose import PROJECT_ROOT
    from rag.run.session import create

    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        node = compose(config_name="config", overrides=["reranker=llm_listwise", "llm@reranker.llm=openai",
                                                         f"reranker.llm.base_url={base_url}", "reranker.llm.model=m",
                                                         "reranker.llm.endpoint.backoff_s=0.01",
                                                         *[f"reranker.{k}={v}" for k, v in kw.items()]]).reranker
    r = create(node)
    r.use_cache(ArtifactCache(tmp_path / "cache"))
    return r


def first_stage() -> Hits:
    return Hits.from_rows([[(i, 1.0 - 0.1 * i) for i in range(7)]], 7)


@pytest.mark.parametrize("answer, n, order, status", [
    ("[3] > [1] > [2]", 3, [2, 0, 1], "ok"),
    ("3, 1, 2", 3, [2, 0, 1], "ok"),
    ("[2] > [2] > [9] > [1] > [3] and more", 3, [1, 0, 2], "ok"),  # repeats and out-of-range skipped
    ("[2] > [1]", 3, [1, 0], "partial"),
    ("None of them.", 3, [], "unparsed"),
    ("", 3, [], "unparsed"),
])
def test_the_permutation_is_read_robustly(answer, n, order, status):
    assert read_order(answer, n) == (order, status)


def test_sliding_windows_bring_the_best_passages_to_the_top(tmp_path):
    with ScriptedEndpoint(ranking_server()) as srv:
        rr = reranker(srv.base_url, tmp_path, top_n=7, window=4, step=2)
        got = rr.rerank([QUERY], first_stage(), CHUNKS, k=5)
        again = rr.rerank([QUERY], first_stage(), CHUNKS, k=5)
        n_sent = len(srv.chat_requests)
        rr.rerank([QUERY], first_stage(), CHUNKS, k=5, reuse=False)
    assert got.ids[0].tolist()[:2] == [6, 5], "one bottom-up pass carries the best window - step to the top"
    assert sorted(got.ids[0].tolist()) == sorted(set(got.ids[0].tolist()))
    assert n_sent == 3, "windows [3,7), [1,5), [0,4)"
    assert again.ids.tolist() == got.ids.tolist() and len(srv.chat_requests) == 6, "cached; a timed call asks again"
    sent = srv.chat_requests[0]["json"]["messages"]
    assert sent[0]["role"] == "system" and "RankGPT" in sent[0]["content"]
    assert rr.usage["requests"] == 6 and rr.usage["windows_from_cache"] == 3 and rr.usage["prompt_tokens"] == 600


@pytest.mark.parametrize("mode", ["partial", "unparsed"])
def test_a_failed_permutation_keeps_the_first_stage_order_and_is_counted(tmp_path, mode):
    with ScriptedEndpoint(ranking_server(mode)) as srv:
        rr = reranker(srv.base_url, tmp_path, top_n=7, window=4, step=2)
        got = rr.rerank([QUERY, QUERY], Hits.from_rows([[(i, 0.0) for i in range(7)]] * 2, 7), CHUNKS, k=5)
    assert got.ids.tolist() == [[0, 1, 2, 3, 4]] * 2
    assert rr.usage["questions"] == 2 and rr.usage[f"{mode}_questions"] == 2


def test_settings_are_checked_when_the_config_is_built(tmp_path):
    with pytest.raises(RagError, match=r"reranker.step \(6\) must not exceed reranker.window \(4\)"):
        reranker("http://127.0.0.1:1/v1", tmp_path, window=4, step=6)
    with pytest.raises(RagError, match="reranker.window must be positive, got 0"):
        reranker("http://127.0.0.1:1/v1", tmp_path, window=0)
    with pytest.raises(RagError, match="reranker.llm must be a generator config"):
        ListwiseReranker(llm=object())


def test_a_run_reranks_listwise_through_a_served_llm(tiny_files, compose_cfg):
    with ScriptedEndpoint(ranking_server()) as srv:
        over = [*tiny_overrides(tiny_files), "reranker=llm_listwise", "llm@reranker.llm=openai",
                f"reranker.llm.base_url={srv.base_url}", "reranker.llm.model=m", "reranker.top_n=6",
                "reranker.window=4", "reranker.step=2", "eval.metrics=[mrr,hit_at_k_id]"]
        result = run(compose_cfg(over), tiny_files["out"] / "listwise")
    usage = result["usage"]["rerank"]
    assert usage["requests_sent"] == len(srv.chat_requests) > 0 and usage["unparsed_questions"] == 0
    assert usage["questions"] == result["counts"]["questions"] and usage["completion_tokens"] > 0
