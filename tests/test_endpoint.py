"""The shared transport (rag/endpoint.py) treats a server's answer as data to check: one total
deadline per request however slowly the reply comes, a cap on its size, a redirect loop as one
line, and JSON read strictly (no NaN or Infinity gets past the door). Against a real HTTP server
on 127.0.0.1 (tests/scripted_endpoint.py) for every role that talks to one."""
from __future__ import annotations

import re
import time

import pytest

import rag.endpoint
from rag.cache import ArtifactCache
from rag.embedder.openai import OpenAIEmbedder
from rag.endpoint import EndpointError
from rag.llm.chat_api import ChatEndpoint
from rag.reply import BadReply, decode_reply
from rag.reranker.http import HTTPReranker
from rag.types import Chunk, Hits
from tests.conftest import tiny_overrides
from tests.scripted_endpoint import ScriptedEndpoint, Trickle, completion

MSG = [{"role": "user", "content": "hello"}]


def chat(base_url: str, **kw) -> ChatEndpoint:
    return ChatEndpoint(base_url, "m", backoff_s=0.01, **kw)


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
                        r"no complete response within 1 s \(llm.timeout_s\) \(llm.model=m\)", msg), msg
    assert 2.0 <= took < 4.5, took


def test_headers_trickled_without_end_end_at_the_deadline():
    with ScriptedEndpoint(lambda r, n: (200, {}, Trickle(headers=True, every_s=0.02))) as srv:
        msg, took = timed(lambda: chat(srv.base_url, timeout_s=1.0, max_retries=0).chat(MSG, {}))
    assert msg.endswith("no complete response within 1 s (llm.timeout_s) (llm.model=m)") and took < 3.0, (msg, took)


def test_a_reply_that_never_stops_coming_ends_at_the_deadline():
    endless = Trickle("x" * 1024, piece=1024, every_s=0.01, forever=True)
    with ScriptedEndpoint(lambda r, n: (200, {}, endless)) as srv:
        msg, took = timed(lambda: chat(srv.base_url, timeout_s=1.0, max_retries=0).chat(MSG, {}))
    assert "no complete response within 1 s (llm.timeout_s)" in msg and took < 3.0, (msg, took)


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
    OpenAIEmbedder(url, "m", backoff_s=0.01, show_progress=False).encode(["a"])


def _ask_reranker(url, tmp_path):
    rr = HTTPReranker(url, "m", backoff_s=0.01)
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

