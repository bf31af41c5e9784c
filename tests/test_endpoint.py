"""The shared transport (rag/endpoint.py) treats a server's answer as data to check: one total
deadline per request however slowly the reply comes, a cap on its size, a redirect loop as one
line, and JSON read strictly (no NaN or Infinity gets past the door). Against a real HTTP server
on 127.0.0.1 (tests/scripted_endpoint.py) for every role that talks to one.

Every role's `endpoint` node is one `EndpointSettings`: the shared defaults with the role's own
timeout, the same checks and one-line errors naming the role's key, and the old flat keys
(`llm.timeout_s`) answered with the key they are now."""
from __future__ import annotations

import re
import time

import pytest

import rag.endpoint
from rag.store.cache import ArtifactCache
from rag.embedder.openai import OpenAIEmbedder
from rag.endpoint import EndpointError, EndpointSettings
from rag.llm.chat_api import ChatEndpoint
from rag.serving.reply import BadReply, decode_reply
from rag.reranker.http import HTTPReranker
from rag.types import Chunk, Hits, RagError
from tests.conftest import tiny_overrides
from tests.scripted_endpoint import ScriptedEndpoint, Trickle, completion

MSG = [{"role": "user", "content": "hello"}]


def chat(base_url: str, **settings) -> ChatEndpoint:
    return ChatEndpoint(base_url, "m", settings=EndpointSettings(**{"backoff_s": 0.01, **settings}))


def timed(fn):
    t0 = time.monotonic()
    with pytest.raises(EndpointError) as e:
        fn()
    return str(e.value), time.monotonic() - t0


# ---- one deadline per request ------------------------------------------------------------------

def test_a_body_trickled_a_byte_at_a_time_ends_at_the_deadline_and_is_retried_like_a_timeout():
    slow = Trickle(completion("a complete answer that arrives far too slowly"), every_s=0.05)
    with ScriptedEndpoint(lambda r, n: (200, {}, slow)) as srv:
        msg, took = timed(lambda: chat(srv.base_url, timeout_s=1.0, max_retries=1).chat(MSG, {}))
        assert len(srv.chat_requests) == 2, "a request past its deadline is a timeout: retried"
    assert re.fullmatch(rf"llm: POST {srv.base_url}/chat/completions failed after 2 attempts over 2\.\d s: "
                        r"no complete response within 1 s \(llm.endpoint.timeout_s\) \(llm.model=m\)", msg), msg
    assert 2.0 <= took < 4.5, took


def test_headers_trickled_without_end_end_at_the_deadline():
    with ScriptedEndpoint(lambda r, n: (200, {}, Trickle(headers=True, every_s=0.02))) as srv:
        msg, took = timed(lambda: chat(srv.base_url, timeout_s=1.0, max_retries=0).chat(MSG, {}))
    assert msg.endswith("no complete response within 1 s (llm.endpoint.timeout_s) (llm.model=m)") and took < 3.0, (msg, took)


def test_a_reply_that_never_stops_coming_ends_at_the_deadline():
    endless = Trickle("x" * 1024, piece=1024, every_s=0.01, forever=True)
    with ScriptedEndpoint(lambda r, n: (200, {}, endless)) as srv:
        msg, took = timed(lambda: chat(srv.base_url, timeout_s=1.0, max_retries=0).chat(MSG, {}))
    assert "no complete response within 1 s (llm.endpoint.timeout_s)" in msg and took < 3.0, (msg, took)


def test_a_reply_larger_than_the_cap_is_refused_at_once(monkeypatch):
    monkeypatch.setattr(rag.endpoint, "MAX_BODY_BYTES", 2**20)
    flood = Trickle("x" * 65536, piece=65536, every_s=0.0, forever=True)
    with ScriptedEndpoint(lambda r, n: (200, {}, flood)) as srv:
        msg, took = timed(lambda: chat(srv.base_url, timeout_s=5.0, max_retries=2).chat(MSG, {}))
        assert len(srv.chat_requests) == 1, "not retried: the server answered, wrongly"
    assert msg == (f"llm: POST {srv.base_url}/chat/completions answered wrongly: a reply of more than 1 MiB "
                   "(llm.model=m); nothing of this reply is kept")
    assert took < 4.0


def test_a_prompt_reply_is_not_cut_short_by_the_deadline():
    """The deadline bounds a slow reply, not a fast one: a kept-alive connection serves many."""
    with ScriptedEndpoint(lambda r, n: (200, {}, completion(f"answer {n}"))) as srv:
        ep = chat(srv.base_url, timeout_s=1.0, max_retries=0)
        answers = [ep.chat(MSG, {}).text for _ in range(5)]
    assert answers == [f"answer {n}" for n in range(5)]


# ---- redirect loops: every role, one line ----------------------------------------------------------

CHUNKS = [Chunk(f"c{i}", f"d{i}", f"text {i}", "src", 0, 6, 0) for i in range(3)]


def _ask_llm(url, tmp_path):
    chat(url).chat(MSG, {})


def _ask_embedder(url, tmp_path):
    OpenAIEmbedder(url, "m", show_progress=False, endpoint=EndpointSettings(backoff_s=0.01)).encode(["a"])


def _ask_reranker(url, tmp_path):
    rr = HTTPReranker(url, "m", endpoint=EndpointSettings(backoff_s=0.01))
    rr.use_cache(ArtifactCache(tmp_path / "cache"))
    rr.rerank(["q"], Hits.from_rows([[(i, 1.0) for i in range(3)]], 3), CHUNKS, k=3)


@pytest.mark.parametrize("what, path, ask", [("llm", "/chat/completions", _ask_llm),
                                             ("embedder", "/embeddings", _ask_embedder),
                                             ("reranker", "/rerank", _ask_reranker)])
def test_a_redirect_loop_is_one_line_for_every_role(what, path, ask, tmp_path):
    loop = lambda r, n: (307, {"Location": "/v1" + path}, "")  # 307 keeps the POST and its body
    with ScriptedEndpoint(loop, embed=loop, rerank=loop) as srv:
        with pytest.raises(EndpointError) as e:
            ask(srv.base_url, tmp_path)
        sent = len(srv.posted(path))
    assert str(e.value) == (f"{what}: POST {srv.base_url}{path} was redirected more than 20 times, last to "
                            f"{srv.base_url}{path} (a redirect loop); check {what}.base_url")
    assert e.value.fatal and sent == 21, "not retried: every request would loop the same way"


def test_a_run_behind_a_redirect_loop_exits_2_with_one_line(tiny_files):
    from tests.test_cli_errors import PROJECT_ROOT, assert_one_line, command

    loop = lambda r, n: (308, {"Location": "/v1/rerank"}, "")
    with ScriptedEndpoint(rerank=loop) as srv:
        done = command([str(PROJECT_ROOT / "run.py"), f"hydra.run.dir={tiny_files['out']}", *tiny_overrides(tiny_files),
                        "reranker=http", f"reranker.base_url={srv.base_url}", "reranker.model=rr"])
    assert_one_line(done, f"reranker: POST {srv.base_url}/rerank was redirected more than 20 times")
    assert not (tiny_files["out"] / "metrics.json").exists()


# ---- JSON read strictly --------------------------------------------------------------------------

@pytest.mark.parametrize("text, line", [
    ('{"results": [{"index": 0, "relevance_score": Infinity}]}', "Infinity at results[0].relevance_score"),
    ('{"results": [{"index": 0, "relevance_score": -Infinity}]}', "-Infinity at results[0].relevance_score"),
    ('{"data": [{"index": 0, "embedding": [0.5, NaN]}]}', "NaN at data[0].embedding[1]"),
    ('{"data": [{"index": 0, "embedding": [0.5, 1e999]}]}', "1e999 at data[0].embedding[1]"),
    ('{"usage": {"prompt_tokens": 1' + "0" * 400 + "}}", "1" + "0" * 39 + " at usage.prompt_tokens"),
    ("[NaN]", "NaN at [0]"),
    ("NaN", "NaN at the top"),
])
def test_numbers_json_does_not_have_are_refused_where_they_stand(text, line):
    with pytest.raises(BadReply) as e:
        decode_reply(text)
    assert str(e.value) == f"{line}, not a finite number"


def test_standard_json_reads_as_json_and_no_json_is_a_value_error():
    assert decode_reply('{"a": [1, 2.5, -0.0, true, null, "NaN"]}') == {"a": [1, 2.5, -0.0, True, None, "NaN"]}
    for text in ("<html>502</html>", "[" * 100_000):
        with pytest.raises(ValueError):
            decode_reply(text)


def test_a_non_standard_number_in_a_completion_is_refused_at_once():
    body = ('{"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}], '
            '"usage": {"prompt_tokens": NaN, "completion_tokens": 1}}')
    with ScriptedEndpoint(lambda r, n: (200, {}, body)) as srv:
        with pytest.raises(EndpointError) as e:
            chat(srv.base_url, max_retries=3).chat(MSG, {})
        assert len(srv.chat_requests) == 1
    assert str(e.value) == (f"llm: POST {srv.base_url}/chat/completions answered wrongly: NaN at usage.prompt_tokens, "
                            "not a finite number (llm.model=m); nothing of this reply is kept")
    assert not e.value.transient and not e.value.fatal


# ---- the endpoint settings: one node and one set of checks for every role -------------------------

URL = "http://127.0.0.1:1/v1"
ROLES = {  # the role's node, what selects it, and the request timeout it sets over the shared default
    "llm": (["llm=openai", "llm.model=m"], 120),
    "embedder": (["embedder=openai", "embedder.model=m"], 60),
    "reranker": (["reranker=http", "reranker.model=m"], 60),
    "eval.judge": (["eval.judge.model=m"], 120),
}


def built(what: str, cfg):
    """The role as a run builds it from its composed node."""
    from rag.run.session import build_judge, create

    return build_judge(cfg.eval.judge, None) if what == "eval.judge" else create(cfg[what])


def from_python(what: str, **kw):
    from eval.judge import Judge
    from rag.llm import OpenAIGenerator

    make = {"llm": OpenAIGenerator, "embedder": OpenAIEmbedder, "reranker": HTTPReranker, "eval.judge": Judge}[what]
    return make(URL, "m", **kw)


@pytest.mark.parametrize("what", list(ROLES))
def test_every_role_composes_the_shared_endpoint_node_with_its_own_timeout(what, compose_cfg):
    overrides, timeout_s = ROLES[what]
    role = built(what, compose_cfg(overrides))
    assert role.endpoint.settings == EndpointSettings(timeout_s=timeout_s)
    assert (role.endpoint.what, role.endpoint.connections) == (what, 1 if what == "reranker" else 4)
    assert from_python(what).endpoint.settings == role.endpoint.settings, "a role built in Python has the same defaults"


@pytest.mark.parametrize("what", list(ROLES))
def test_a_bad_endpoint_value_is_one_line_naming_the_roles_key(what, compose_cfg):
    overrides, _ = ROLES[what]
    with pytest.raises(RagError) as e:
        built(what, compose_cfg([*overrides, f"{what}.endpoint.timeout_s=0"]))
    assert str(e.value) == f"{what}.endpoint.timeout_s must be positive, got 0"


@pytest.mark.parametrize("setting, value, line", [
    ("timeout_s", -1.5, "must be positive, got -1.5"),
    ("timeout_s", True, "must be a number, got true"),
    ("backoff_s", "fast", "must be a number, got 'fast'"),
    ("max_backoff_s", float("inf"), "must be a finite number, got inf"),
    ("max_retries", -1, "must be >= 0, got -1"),
    ("max_retries", 1.5, "must be an integer, got 1.5"),
    ("concurrency", 0, "must be between 1 and 256, got 0"),
    ("concurrency", 257, "must be between 1 and 256, got 257"),
    ("concurrency", 2.0, "must be an integer, got 2"),
    ("extra_body", [1], "must be a mapping of request fields, e.g. {top_k: 1}, got [1]"),
    ("extra_body", {"messages": [], "top_k": 1}, "must not set ['messages']: the request sets them itself"),
    ("extra_body", {"stream": True}, "must not set ['stream']: the request sets them itself"),
])
def test_each_check_is_one_line(setting, value, line):
    with pytest.raises(RagError) as e:
        from_python("eval.judge", endpoint=EndpointSettings(**{setting: value}))
    assert str(e.value) == f"eval.judge.endpoint.{setting} {line}"


def test_a_role_refuses_the_settings_it_does_not_use():
    with pytest.raises(RagError) as e:
        HTTPReranker(URL, "m", endpoint=EndpointSettings(concurrency=8))
    assert str(e.value) == ("reranker.endpoint.concurrency is not a setting of reranker "
                            "(it takes timeout_s, max_retries, backoff_s, max_backoff_s, cache_namespace)")
    with pytest.raises(RagError, match=r"^embedder.endpoint.extra_body is not a setting of embedder \(it takes concurrency, "):
        OpenAIEmbedder(URL, "m", endpoint=EndpointSettings(extra_body={"top_k": 1}))


def test_the_cache_namespace_goes_into_the_keys_as_written():
    gen = from_python("llm", endpoint=EndpointSettings(cache_namespace=7))
    assert gen.id["cache_namespace"] == 7 and "cache_namespace" not in from_python("llm").id
    assert from_python("reranker", endpoint=EndpointSettings(cache_namespace="q4"))._identity["namespace"] == "q4"


@pytest.mark.parametrize("overrides, line", [
    (["llm=openai", "llm.timeout_s=30"], "llm.timeout_s is now llm.endpoint.timeout_s: use llm.endpoint.timeout_s=30"),
    (["embedder=openai", "embedder.concurrency=8"],
     "embedder.concurrency is now embedder.endpoint.concurrency: use embedder.endpoint.concurrency=8"),
    (["reranker=http", "reranker.max_retries=2"],
     "reranker.max_retries is now reranker.endpoint.max_retries: use reranker.endpoint.max_retries=2"),
    (["eval.judge.cache_namespace=q4"],
     "eval.judge.cache_namespace is now eval.judge.endpoint.cache_namespace: use eval.judge.endpoint.cache_namespace=q4"),
    (["llm=openai", "llm.extra_body.top_k=1"], "llm.extra_body is now llm.endpoint.extra_body: use +llm.endpoint.extra_body.top_k=1"),
    (["reranker=llm_listwise", "llm@reranker.llm=openai", "reranker.llm.backoff_s=0.01"],
     "reranker.llm.backoff_s is now reranker.llm.endpoint.backoff_s: use reranker.llm.endpoint.backoff_s=0.01"),
    (["llm.timeout_s=30"], ("llm.timeout_s is now llm.endpoint.timeout_s, a setting of llm=openai; "
                            "add llm=openai before llm.endpoint.timeout_s=30")),
])
def test_an_endpoint_setting_by_its_old_name_is_answered_with_its_new_key(overrides, line, compose_cfg):
    from hydra.errors import ConfigCompositionException

    from rag.config.compose import config_error_line

    with pytest.raises(ConfigCompositionException) as e:
        compose_cfg(overrides)
    assert config_error_line(e.value) == line


def test_an_old_name_added_with_a_plus_is_answered_with_its_new_key(compose_cfg):
    with pytest.raises(RagError) as e:
        built("llm", compose_cfg(["llm=openai", "llm.model=m", "+llm.timeout_s=30"]))
    assert str(e.value) == "llm.timeout_s is now llm.endpoint.timeout_s"


def test_a_run_with_an_old_name_exits_2_with_one_line(tiny_files):
    from tests.test_cli_errors import PROJECT_ROOT, assert_one_line, command

    done = command([str(PROJECT_ROOT / "run.py"), f"hydra.run.dir={tiny_files['out']}", *tiny_overrides(tiny_files),
                    "llm=openai", "llm.model=m", "llm.timeout_s=30"])
    assert_one_line(done, "ragrig: error: llm.timeout_s is now llm.endpoint.timeout_s: use llm.endpoint.timeout_s=30")
