"""The OpenAI-compatible client (rag/llm/chat_api.py on rag/endpoint.py): retries with backoff on what is
worth retrying, Retry-After, one-line errors for a wrong URL, a refused connection, an unknown
model and a bad key, the key kept out of every message, bounded concurrency."""
from __future__ import annotations

import socket
import time

import pytest

from rag.endpoint import EndpointSettings
from rag.llm.chat_api import ChatEndpoint, EndpointError, map_concurrent
from rag.types import RagError
from tests.scripted_endpoint import ScriptedEndpoint, completion

MSG = [{"role": "user", "content": "hello"}]


def endpoint(base_url: str, model: str = "m", api_key_env: str | None = None, what: str = "llm",
             **settings) -> ChatEndpoint:
    return ChatEndpoint(base_url, model, api_key_env, settings=EndpointSettings(**{"backoff_s": 0.01, **settings}),
                        what=what)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_completion_carries_text_usage_and_model():
    with ScriptedEndpoint(lambda r, n: (200, {}, completion(" Paris. ", 25, 8, model="served"))) as srv:
        done = endpoint(srv.base_url).chat(MSG, {"temperature": 0.0, "max_tokens": 5})
    assert (done.text, done.prompt_tokens, done.completion_tokens, done.served_model) == (" Paris. ", 25, 8, "served")
    sent = srv.chat_requests[0]["json"]
    assert sent == {"model": "m", "messages": MSG, "temperature": 0.0, "max_tokens": 5}


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_transient_statuses_are_retried(status):
    script = lambda r, n: (status, {}, {"error": {"message": "busy"}}) if n < 2 else (200, {}, completion("ok"))
    with ScriptedEndpoint(script) as srv:
        done = endpoint(srv.base_url).chat(MSG, {})
    assert done.text == "ok" and done.attempts == 3 and len(srv.chat_requests) == 3


def test_retry_after_is_honoured():
    script = lambda r, n: (429, {"Retry-After": "0.6"}, {"error": "slow down"}) if n == 0 else (200, {}, completion("ok"))
    with ScriptedEndpoint(script) as srv:
        endpoint(srv.base_url, backoff_s=0.001).chat(MSG, {})
    gap = srv.chat_requests[1]["t"] - srv.chat_requests[0]["t"]
    assert gap >= 0.55


def test_backoff_grows_exponentially():
    with ScriptedEndpoint(lambda r, n: (503, {}, "down")) as srv:
        with pytest.raises(EndpointError) as e:
            endpoint(srv.base_url, backoff_s=0.1, max_retries=3).chat(MSG, {})
    t = [r["t"] for r in srv.chat_requests]
    gaps = [b - a for a, b in zip(t, t[1:])]
    assert len(t) == 4
    # jitter draws each pause from [0.5, 1] x 0.1 * 2^i
    assert all(0.05 * 2**i - 0.01 <= g <= 0.1 * 2**i + 0.2 for i, g in enumerate(gaps)), gaps
    msg = str(e.value)
    assert "\n" not in msg and "after 4 attempts" in msg and "HTTP 503" in msg and srv.base_url in msg
    assert e.value.transient and not e.value.fatal


def test_timeouts_are_retried_then_reported():
    with ScriptedEndpoint(delay_s=2.0) as srv:
        with pytest.raises(EndpointError, match=r"no complete response within 0.5 s \(llm.endpoint.timeout_s\)"):
            endpoint(srv.base_url, timeout_s=0.5, max_retries=1).chat(MSG, {})
        assert srv.await_requests(2) == 2


def test_a_refused_connection_is_one_line():
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(EndpointError) as e:
        endpoint(url).check()
    assert str(e.value) == f"llm: cannot connect to {url} (connection refused) - is the server running? (llm.base_url)"
    with pytest.raises(EndpointError, match=r"connection refused\) - is the server running\?") as e:
        endpoint(url, max_retries=2).chat(MSG, {})
    assert e.value.fatal


def test_a_wrong_path_names_the_url_and_base_url():
    with ScriptedEndpoint() as srv:
        wrong = srv.base_url[: -len("/v1")]  # no /v1
        with pytest.raises(EndpointError) as e:
            endpoint(wrong).chat(MSG, {})
    msg = str(e.value)
    assert f"POST {wrong}/chat/completions -> HTTP 404" in msg and "llm.base_url (it usually ends in /v1)" in msg
    assert len(srv.chat_requests) == 1, "a 404 is not retried"


def test_an_unknown_model_from_the_model_list_or_the_servers_error():
    with ScriptedEndpoint(models=["qwen2.5:1.5b", "llama3.2"]) as srv:
        with pytest.raises(EndpointError, match=r"does not serve model 'gpt-x' \(llm.model\); it serves: qwen2.5:1.5b, llama3.2"):
            endpoint(srv.base_url, model="gpt-x").check()
        assert endpoint(srv.base_url, model="llama3.2").check() == ["qwen2.5:1.5b", "llama3.2"]
    vllm_404 = {"object": "error", "message": "The model `gpt-x` does not exist.", "type": "NotFoundError"}
    with ScriptedEndpoint(lambda r, n: (404, {}, vllm_404)) as srv:
        with pytest.raises(EndpointError, match=r"HTTP 404: The model `gpt-x` does not exist\..*llm.model=gpt-x"):
            endpoint(srv.base_url, model="gpt-x").chat(MSG, {})


def test_a_bad_key_names_the_variable_never_the_key(monkeypatch):
    secret = "sk-test-0123456789abcdef"
    monkeypatch.setenv("RAGRIG_TEST_KEY", secret)
    body = {"error": {"message": f"Incorrect API key provided: {secret}", "code": "invalid_api_key"}}
    with ScriptedEndpoint(lambda r, n: (401, {}, body)) as srv:
        ep = endpoint(srv.base_url, api_key_env="RAGRIG_TEST_KEY", what="eval.judge")
        with pytest.raises(EndpointError) as e:
            ep.chat(MSG, {})
    assert srv.chat_requests[0]["headers"]["Authorization"] == f"Bearer {secret}"
    msg = str(e.value)
    assert "rejected the API key (the key in $RAGRIG_TEST_KEY)" in msg and msg.startswith("eval.judge: ")
    assert secret not in msg and secret not in repr(ep) and e.value.fatal
    with ScriptedEndpoint(lambda r, n: (403, {}, "forbidden")) as srv:
        with pytest.raises(EndpointError, match="no key was sent: set llm.api_key_env"):
            endpoint(srv.base_url).chat(MSG, {})


def test_configuration_errors(monkeypatch):
    monkeypatch.delenv("RAGRIG_UNSET_KEY", raising=False)
    with pytest.raises(RagError, match="the environment variable RAGRIG_UNSET_KEY is not set"):
        ChatEndpoint("http://127.0.0.1:1/v1", "m", api_key_env="RAGRIG_UNSET_KEY")
    with pytest.raises(RagError, match="llm.base_url must be an http"):
        ChatEndpoint("127.0.0.1:8000/v1", "m")
    with pytest.raises(RagError, match="llm.model must name"):
        ChatEndpoint("http://127.0.0.1:8000/v1", "")


def test_concurrency_is_bounded_and_results_come_back_indexed():
    with ScriptedEndpoint(delay_s=0.1) as srv:
        ep = endpoint(srv.base_url)
        items = [[{"role": "user", "content": f"q{i}"}] for i in range(12)]
        got = dict(map_concurrent(lambda m, stop: ep.chat(m, {}, stop), items, concurrency=3))
    assert sorted(got) == list(range(12))
    assert all(got[i].text == f"answer: q{i}" for i in range(12))
    assert srv.max_in_flight == 3


def test_a_fatal_error_stops_the_queue_and_keeps_what_arrived():
    script = lambda r, n: (401, {}, "no") if n == 2 else (200, {}, completion("ok"))
    with ScriptedEndpoint(script, delay_s=0.05) as srv:
        ep = endpoint(srv.base_url)
        got = []
        with pytest.raises(EndpointError, match="HTTP 401"):
            for i, done in map_concurrent(lambda m, stop: ep.chat(m, {}, stop), [MSG] * 20, concurrency=1):
                got.append(i)
    assert got == [0, 1] and len(srv.chat_requests) == 3, "nothing is sent after the fatal error"


def test_a_fatal_error_ends_other_workers_retries():
    """Worker A keeps getting 503s and backs off; worker B's 401 must end A's retries early."""
    def script(r, n):
        return (401, {}, "no") if r["messages"][0]["content"] == "b" else (503, {}, "busy")

    with ScriptedEndpoint(script) as srv:
        ep = endpoint(srv.base_url, backoff_s=2.0, max_retries=5)
        t0 = time.monotonic()
        with pytest.raises(EndpointError, match="HTTP 401"):
            list(map_concurrent(lambda m, stop: ep.chat(m, {}, stop),
                                [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]], 2))
    assert time.monotonic() - t0 < 2.0


def test_connections_are_kept_alive_and_reused():
    with ScriptedEndpoint() as srv:
        ep = endpoint(srv.base_url)
        for _ in range(3):
            ep.chat(MSG, {})
    assert len({r["peer"] for r in srv.chat_requests}) == 1, "three requests in a row share one connection"


def test_a_connection_the_server_closed_is_replaced_without_costing_an_attempt():
    with ScriptedEndpoint(hang_up=True) as srv:
        ep = endpoint(srv.base_url, max_retries=0)
        done = [ep.chat(MSG, {}) for _ in range(3)]
    assert [d.attempts for d in done] == [1, 1, 1] and len(srv.chat_requests) == 3


def reply_with(choice_message=None, usage=None):
    body = completion("ok")
    if choice_message is not None:
        body["choices"][0]["message"] = choice_message
    if usage is not None:
        body["usage"] = usage
    return body


@pytest.mark.parametrize("body, what", [
    (reply_with({"role": "assistant", "content": 42}), "choices[0].message.content is 42, not text"),
    (reply_with(usage={"prompt_tokens": True, "completion_tokens": 1}), "usage.prompt_tokens is true, not a count of tokens"),
    (reply_with(usage={"prompt_tokens": "many", "completion_tokens": 1}),
     'usage.prompt_tokens is "many", not a count of tokens'),
    (reply_with(usage={"prompt_tokens": 3, "completion_tokens": 1.5}), "usage.completion_tokens is 1.5, not a count of tokens"),
    (reply_with(usage=[3, 1]), "usage is [3, 1], not an object"),
])
def test_a_completion_whose_text_or_counts_are_not_what_they_claim_is_refused(body, what):
    """The counts become costs and the text an answer: a reply that gets them wrong is refused
    at once, not half used."""
    with ScriptedEndpoint(lambda r, n: (200, {}, body)) as srv:
        with pytest.raises(EndpointError) as e:
            endpoint(srv.base_url, max_retries=2).chat(MSG, {})
        assert len(srv.chat_requests) == 1
    assert str(e.value) == (f"llm: POST {srv.base_url}/chat/completions answered wrongly: {what} (llm.model=m); "
                            "nothing of this reply is kept")


def test_a_completion_without_counts_or_text_is_read_as_none_and_empty():
    body = reply_with({"role": "assistant", "content": None}, usage={"prompt_tokens": None, "completion_tokens": 2.0})
    with ScriptedEndpoint(lambda r, n: (200, {}, body)) as srv:
        done = endpoint(srv.base_url).chat(MSG, {})
    assert (done.text, done.prompt_tokens, done.completion_tokens) == ("", None, 2)
