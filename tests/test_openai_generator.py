"""`llm=openai` (rag/llm/openai.py) in the pipeline: the in-process generator's prompt sent as
chat messages, answers cached one by one so that a failed run resumes, token usage per question
and per run, the dry run, and the API key kept out of every output. Against a scripted HTTP
endpoint on 127.0.0.1; tests/test_server.py runs the same paths against a real engine."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rag.run.artifacts import Artifacts
from rag.store.cache import ArtifactCache
from rag.endpoint import EndpointSettings
from rag.llm import OpenAIGenerator
from rag.llm.answer_cache import RECORD_KIND, answer_keys
from rag.llm.hf import render_chat
from rag.run.output import format_table
from rag.run.pipeline import run
from rag.run.session import create
from rag.timing import StageTimer
from rag.types import Context, RagError
from tests.conftest import tiny_overrides
from tests.scripted_endpoint import ScriptedEndpoint, Trickle, completion, echo

QUESTIONS = [f"Question number {i}?" for i in range(6)]
CONTEXTS = [[Context(f"Passage {i} says {i}.", "src")] for i in range(6)]


def generator(base_url: str, endpoint: dict | None = None, **kw) -> OpenAIGenerator:
    settings = EndpointSettings(**{"backoff_s": 0.01, **(endpoint or {})})
    return OpenAIGenerator(base_url=base_url, model=kw.pop("model", "m"), endpoint=settings, **kw)


def test_config_uses_the_in_process_prompt(compose_cfg):
    served = compose_cfg(["llm=openai", "llm.model=some-model"]).llm
    local = compose_cfg(["llm=smollm2"]).llm
    assert served.prompt == local.prompt and served.system_prompt == local.system_prompt
    assert served.max_tokens == local.max_new_tokens and served.temperature == local.temperature
    gen = create(served)
    assert isinstance(gen, OpenAIGenerator) and gen.endpoint.model == "some-model"


def test_the_messages_are_what_the_in_process_generator_renders():
    class RecordingTokenizer:
        chat_template = "{{ messages }}"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            self.seen = messages
            return "rendered"

    gen = generator("http://127.0.0.1:1/v1")
    tok = RecordingTokenizer()
    render_chat(tok, gen.system_prompt, gen.prompt.build(QUESTIONS[0], CONTEXTS[0]))
    assert gen.messages(QUESTIONS[0], CONTEXTS[0]) == tok.seen
    assert [m["role"] for m in tok.seen] == ["system", "user"]


def test_cache_identity_is_model_parameters_and_prompt_not_url():
    a = generator("http://127.0.0.1:1/v1")
    assert a.id == generator("http://10.0.0.5:8000/v1").id
    assert a.id != generator("http://127.0.0.1:1/v1", model="other").id
    assert a.id != generator("http://127.0.0.1:1/v1", max_tokens=10).id
    assert a.id != generator("http://127.0.0.1:1/v1", endpoint={"cache_namespace": "q4"}).id
    assert a.id == generator("http://127.0.0.1:1/v1", seed=7).id, "greedy answers do not depend on the seed"
    assert "seed" not in a.params() and generator("http://x:1/v1", temperature=0.7, seed=7).params()["seed"] == 7
    with pytest.raises(RagError, match=r"^llm.endpoint.extra_body must not set \['messages'\]: the request sets them"):
        generator("http://x:1/v1", endpoint={"extra_body": {"messages": []}})


def test_a_failed_run_resumes_with_the_missing_answers_only(tmp_path):
    cache, timer = ArtifactCache(tmp_path), StageTimer()
    down_after = {"n": 2}

    def flaky(req, n):
        return (503, {}, "dying") if n >= down_after["n"] else echo(req, n)

    with ScriptedEndpoint(flaky) as srv:
        gen = generator(srv.base_url, endpoint={"concurrency": 1, "max_retries": 1})
        with pytest.raises(RagError, match=r"failed after 2 attempts.*HTTP 503.*; 2 of 6 answers are recorded in the "
                                           r"cache, and a rerun asks only for the other 4$"):
            Artifacts(cache, timer=timer).answers(gen, QUESTIONS, CONTEXTS)
        keys = answer_keys(gen.id, QUESTIONS, CONTEXTS)
        recorded = [cache.get_record(RECORD_KIND, k) for k in keys]
        assert sum(r is not None for r in recorded) == 2
        assert not (tmp_path / "answers").exists() or not any(
            p.name[0] != "." and not p.name.startswith("tmp-") for p in (tmp_path / "answers").iterdir())
        down_after["n"] = 10**9
        before = len(srv.chat_requests)
        made = Artifacts(cache, timer=timer).answers(gen, QUESTIONS, CONTEXTS)
        assert len(srv.chat_requests) - before == 4, "only the four missing answers are asked for"
    assert made.answers == [f"answer: {gen.prompt.build(q, c).splitlines()[-1][:60].strip()}" for q, c in zip(QUESTIONS, CONTEXTS)]
    assert (made.requests, made.resumed, made.hit) == (4, 2, False)
    assert [d["from_earlier_run"] for d in made.details].count(True) == 2
    assert len(made.latency_ms) == 6 and all(m > 0 for m in made.latency_ms)
    # the whole-run artifact now answers a rerun, with no server at all
    again = Artifacts(cache, timer=timer).answers(generator("http://127.0.0.1:9/v1", endpoint={"concurrency": 1}), QUESTIONS, CONTEXTS)
    assert again.answers == made.answers and again.hit and again.requests == 0


def run_cfg(compose_cfg, tiny_files, srv, *extra: str):
    return compose_cfg(tiny_overrides(tiny_files) + ["llm=openai", f"llm.base_url={srv.base_url}", "llm.model=m",
                                                     "llm.endpoint.backoff_s=0.01", *extra])


def test_usage_is_recorded_per_question_and_summed(tiny_files, compose_cfg):
    with ScriptedEndpoint(lambda r, n: (200, {}, completion(f"a{n}", 100 + n, 10, model="m-served"))) as srv:
        result = run(run_cfg(compose_cfg, tiny_files, srv), tiny_files["out"])
        rerun = run(run_cfg(compose_cfg, tiny_files, srv), tiny_files["out"] / "again")
        assert len(srv.chat_requests) == 6, "the rerun sends nothing"
    usage = result["usage"]["generate"]
    assert usage["requests_sent"] == 6 and usage["answers_from_cache"] == 0
    assert usage["prompt_tokens"] == sum(range(100, 106)) and usage["completion_tokens"] == 60
    rows = [json.loads(x) for x in (tiny_files["out"] / "per_question.jsonl").read_text().splitlines()]
    assert sorted(r["generation"]["usage"]["prompt_tokens"] for r in rows) == list(range(100, 106))
    assert all(r["generation"]["served_model"] == "m-served" and r["generation"]["finish_reason"] == "stop" for r in rows)
    assert rerun["usage"]["generate"]["requests_sent"] == 0 and rerun["usage"]["generate"]["prompt_tokens"] == usage["prompt_tokens"]


def test_dry_run_counts_and_sends_nothing(tiny_files, compose_cfg):
    with ScriptedEndpoint() as srv:
        result = run(run_cfg(compose_cfg, tiny_files, srv, "llm.dry_run=true"), tiny_files["out"])
        assert srv.requests == []
    plan = result["dry_run"]
    generate = plan["roles"]["generate"]
    assert generate["requests"] == 6 and generate["cached"] == 0 and generate["input_tokens"] > 6 * 50
    assert generate["exact"] and "estimated as characters / 4" in generate["tokens_method"]
    assert json.loads((tiny_files["out"] / "dry_run.json").read_text()) == plan
    assert not (tiny_files["out"] / "metrics.json").exists()
    assert format_table(result).startswith("dry run: 6 request(s) would be sent for 6 question(s)")


def test_the_api_key_never_reaches_outputs_logs_or_cache(tiny_files, compose_cfg, monkeypatch, caplog):
    secret = "sk-never-write-me-4242"
    monkeypatch.setenv("RAGRIG_TEST_API_KEY", secret)
    seen = []

    def check_key(req, n):
        seen.append(n)
        return echo(req, n)

    with ScriptedEndpoint(check_key) as srv:
        cfg = run_cfg(compose_cfg, tiny_files, srv, "llm.api_key_env=RAGRIG_TEST_API_KEY", "eval.judge.enabled=true",
                      f"eval.judge.base_url={srv.base_url}", "eval.judge.model=m", "eval.judge.api_key_env=RAGRIG_TEST_API_KEY")
        run(cfg, tiny_files["out"])
        assert {r["headers"]["Authorization"] for r in srv.chat_requests} == {f"Bearer {secret}"}
    assert seen
    for root in (tiny_files["out"], tiny_files["cache"]):
        for f in Path(root).rglob("*"):
            if f.is_file():
                assert secret.encode() not in f.read_bytes(), f
    assert secret not in caplog.text
    assert OmegaConf.select(cfg, "llm.api_key_env") == "RAGRIG_TEST_API_KEY"


def test_a_bad_key_stops_the_run_in_one_line(tiny_files, compose_cfg, monkeypatch):
    monkeypatch.setenv("RAGRIG_TEST_API_KEY", "sk-wrong")
    with ScriptedEndpoint(lambda r, n: (401, {}, {"error": {"message": "invalid key"}})) as srv:
        with pytest.raises(RagError) as e:
            run(run_cfg(compose_cfg, tiny_files, srv, "llm.api_key_env=RAGRIG_TEST_API_KEY"), tiny_files["out"])
    assert "\n" not in str(e.value) and "$RAGRIG_TEST_API_KEY" in str(e.value) and "sk-wrong" not in str(e.value)
    assert not (tiny_files["out"] / "metrics.json").exists()


# What an endpoint can do wrong, each run through the whole pipeline: one line naming the endpoint
# and what it did, and no results. (A refused key, a wrong path and an unknown model are above
# and in tests/test_chat_api.py.)
ENDPOINT_FAULTS = {
    "no server on the port": (None, 0.0, r"cannot connect to http://127\.0\.0\.1:9/v1 \(connection refused\) - is the server running\?"),
    "HTTP 500 on every request": (lambda r, n: (500, {}, {"error": {"message": "CUDA out of memory"}}), 0.0,
                                  r"failed after 3 attempts .*: HTTP 500: CUDA out of memory \(llm.model=m\)$"),
    "a body that is not JSON": (lambda r, n: (200, {}, "<html>502 Bad Gateway</html>"), 0.0,
                                r"an unreadable response body: <html>502 Bad Gateway</html>"),
    "JSON without choices": (lambda r, n: (200, {}, {"id": "x", "object": "chat.completion"}), 0.0,
                             r"an unreadable response body: \{\"id\": \"x\""),
    "no answer within the timeout": (echo, 2.0, r"no complete response within 0.5 s \(llm.endpoint.timeout_s\)"),
    "an answer trickled past the timeout": (lambda r, n: (200, {}, Trickle(completion("slow"), every_s=0.05, limit_s=6)),
                                            0.0, r"failed after 3 attempts .*: no complete response within 0.5 s"),
    "a redirect loop": (lambda r, n: (307, {"Location": "/v1/chat/completions"}, ""), 0.0,
                        (r"^llm: POST \S+/chat/completions was redirected more than 20 times, last to "
                         r"\S+/chat/completions \(a redirect loop\); check llm.base_url$")),
    "Infinity as a token count": (lambda r, n: (200, {}, ('{"choices": [{"message": {"content": "x"}}], '
                                                          '"usage": {"prompt_tokens": Infinity}}')), 0.0,
                                  r"answered wrongly: Infinity at usage.prompt_tokens, not a finite number"),
}


@pytest.mark.parametrize("fault", ENDPOINT_FAULTS, ids=list(ENDPOINT_FAULTS))
def test_a_failing_endpoint_is_one_line_and_leaves_no_results(fault, tiny_files, compose_cfg):
    chat, delay, expect = ENDPOINT_FAULTS[fault]
    with ScriptedEndpoint(chat or echo, delay_s=delay) as srv:
        url = "http://127.0.0.1:9/v1" if chat is None else srv.base_url
        cfg = compose_cfg(tiny_overrides(tiny_files) + ["llm=openai", f"llm.base_url={url}", "llm.model=m",
                                                        "llm.endpoint.backoff_s=0.01", "llm.endpoint.max_retries=2",
                                                        "llm.endpoint.timeout_s=0.5"])
        with pytest.raises(RagError) as e:
            run(cfg, tiny_files["out"])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("llm: ") and re.search(expect, msg), msg
    assert not (tiny_files["out"] / "metrics.json").exists() and not (tiny_files["out"] / "per_question.jsonl").exists()


# -- replies that are no answer, and answers cut off --------------------------------------------------

def reply(content, finish="stop", refusal=None, model="m"):
    """A chat completion as a server writes it, with its message and finish reason as given."""
    message = {"role": "assistant", "content": content, **({"refusal": refusal} if refusal is not None else {})}
    return 200, {}, {"id": "x", "object": "chat.completion", "model": model,
                     "choices": [{"index": 0, "finish_reason": finish, "message": message}],
                     "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


def question_no(request) -> int:
    return int(request["messages"][-1]["content"].split("Question number ")[1][0])


# Replies that came back fine but hold no answer: the model did not answer the prompt, so its ""
# is no empty answer to score on every later run.
WITHHELD = {
    "content null": lambda: reply(None),
    "refusal": lambda: reply(None, refusal="I can't help with that."),
    "refusal beside text": lambda: reply("Sorry.", refusal="I can't help with that."),
    "content_filter": lambda: reply("", finish="content_filter"),
    "content_filter, blank": lambda: reply("  \n", finish="content_filter"),
}


@pytest.mark.parametrize("case", WITHHELD, ids=list(WITHHELD))
def test_a_reply_that_holds_no_answer_is_not_cached_and_a_rerun_asks_again(case, tmp_path, caplog):
    cache, timer, broken = ArtifactCache(tmp_path), StageTimer(), {"on": True}

    def server(req, n):
        return WITHHELD[case]() if broken["on"] and question_no(req) in (1, 4) else echo(req, n)

    why = case.split(",")[0].replace("refusal beside text", "refusal")
    with ScriptedEndpoint(server) as srv:
        gen = generator(srv.base_url, endpoint={"concurrency": 1})
        with caplog.at_level("WARNING"):
            first = Artifacts(cache, timer=timer).answers(gen, QUESTIONS, CONTEXTS)
        assert [first.answers[i] for i in (1, 4)] == ["", ""] and all(first.answers[i] for i in (0, 2, 3, 5))
        assert (first.hit, first.requests, first.withheld) == (False, 6, 2)
        assert [d.get("withheld") for d in first.details] == [None, why, None, None, why, None]
        assert f"llm: 2 of 6 replies held no answer (2 {why}); they are scored as empty answers and not cached, so " \
               "a rerun asks for them again" in caplog.messages
        assert not any(p.is_dir() and not p.name.startswith((".", "tmp-")) for p in (tmp_path / "answers").iterdir())
        broken["on"] = False  # the server is fixed
        again = Artifacts(cache, timer=timer).answers(gen, QUESTIONS, CONTEXTS)
        assert len(srv.chat_requests) == 8, "only the two replies that held no answer are asked for again"
        assert all(again.answers) and (again.requests, again.resumed, again.withheld) == (2, 4, 0)
        assert Artifacts(cache, timer=timer).answers(gen, QUESTIONS, CONTEXTS).hit, "now the whole run is cached"


def test_text_a_content_filter_left_standing_is_an_answer(tmp_path):
    with ScriptedEndpoint(lambda r, n: reply("Partly answered", finish="content_filter")) as srv:
        made = Artifacts(ArtifactCache(tmp_path)).answers(generator(srv.base_url), QUESTIONS, CONTEXTS)
    assert made.answers == ["Partly answered"] * 6 and made.withheld == 0


def test_a_run_on_replies_without_content_scores_them_once_and_asks_again_when_the_server_is_fixed(
        tiny_files, compose_cfg, caplog):
    fixed = {"on": False}
    with ScriptedEndpoint(lambda r, n: echo(r, n) if fixed["on"] else reply(None)) as srv:
        with caplog.at_level("WARNING"):
            broken = run(run_cfg(compose_cfg, tiny_files, srv), tiny_files["out"] / "broken")
        assert "llm: 6 of 6 replies held no answer (6 content null); they are scored as empty answers and not " \
               "cached, so a rerun asks for them again" in caplog.messages
        fixed["on"] = True
        rerun = run(run_cfg(compose_cfg, tiny_files, srv), tiny_files["out"] / "fixed")
        assert len(srv.chat_requests) == 12, "the rerun asks for every answer again"
    assert broken["usage"]["generate"]["requests_sent"] == 6 and rerun["usage"]["generate"]["answers_from_cache"] == 0
    rows = [json.loads(x) for x in (tiny_files["out"] / "fixed" / "per_question.jsonl").read_text().splitlines()]
    assert all(r["answer"].startswith("answer: ") for r in rows)
    rows = [json.loads(x) for x in (tiny_files["out"] / "broken" / "per_question.jsonl").read_text().splitlines()]
    assert all(r["answer"] == "" and r["generation"]["withheld"] == "content null" for r in rows)


def test_empty_answers_read_from_the_cache_are_said_on_every_run(tmp_path, caplog):
    cache = ArtifactCache(tmp_path)
    with ScriptedEndpoint(lambda r, n: reply("")) as srv:  # the model's own empty answer: cached as such
        Artifacts(cache).answers(generator(srv.base_url), QUESTIONS, CONTEXTS)
    for _ in range(2):
        caplog.clear()
        with caplog.at_level("WARNING"):
            cached = Artifacts(cache).answers(generator("http://127.0.0.1:9/v1"), QUESTIONS, CONTEXTS)
        assert cached.hit and cached.answers == [""] * 6
        assert [m for m in caplog.messages if "empty" in m] == [
            f"llm: 6 of 6 answers read from the cache ({tmp_path / 'answers' / cached.key}) are empty; they are scored "
            "as empty strings (remove that directory to generate them again)"]


def test_answers_stopped_at_max_tokens_are_counted_in_the_terminal_metrics_and_report(tiny_files, compose_cfg, caplog):
    from rag.run.result import RunResult

    with ScriptedEndpoint(lambda r, n: reply("An answer cut off at", finish="length")) as srv:
        with caplog.at_level("WARNING"):
            result = run(run_cfg(compose_cfg, tiny_files, srv, "llm.max_tokens=64"), tiny_files["out"])
    line = "6 of 6 answers stopped at llm.max_tokens=64"
    assert f"llm: {line}; a longer limit lets them finish" in caplog.messages
    assert line in format_table(result).splitlines()
    written = json.loads((tiny_files["out"] / "metrics.json").read_text())
    assert written["stopped_answers"] == {"stopped": 6, "of": 6, "setting": "llm.max_tokens", "value": 64}
    assert RunResult.from_json(written).to_json() == written
    assert f"Cut off: {line}</p>" in (tiny_files["out"] / "report.html").read_text()
    caplog.clear()
    with caplog.at_level("WARNING"):  # from the cache: said again
        again = run(run_cfg(compose_cfg, tiny_files, srv, "llm.max_tokens=64"), tiny_files["out"] / "again")
    assert again["artifacts"]["answers"]["hit"] and again["stopped_answers"]["stopped"] == 6
    assert f"llm: {line}; a longer limit lets them finish" in caplog.messages


def test_answers_that_end_are_counted_as_none_stopped(tmp_path):
    with ScriptedEndpoint(lambda r, n: reply("x", finish="length" if question_no(r) % 2 else "stop")) as srv:
        made = Artifacts(ArtifactCache(tmp_path)).answers(generator(srv.base_url, max_tokens=7), QUESTIONS, CONTEXTS)
    assert made.stopped.line() == "3 of 6 answers stopped at llm.max_tokens=7"


# Replies whose text no file can hold or whose fields are no text: refused at once in one line,
# never a UnicodeEncodeError from the cache's checksum after the run paid for every other answer.
BAD_TEXT = {
    "a lone surrogate in the answer": (reply("half \ud800 an answer"),
                                       r"a lone surrogate \(\\ud800\) at choices\[0\]\.message\.content, not text"),
    "a lone low surrogate": (reply("\udc41"), r"a lone surrogate \(\\udc41\) at choices\[0\]\.message\.content"),
    "a lone surrogate in the served model's name": (reply("fine", model="m\udfff"),
                                                    r"a lone surrogate \(\\udfff\) at model, not text"),
    "a finish reason that is no text": (reply("fine", finish=3), r"choices\[0\]\.finish_reason is 3, not text"),
}


@pytest.mark.parametrize("case", BAD_TEXT, ids=list(BAD_TEXT))
def test_a_reply_with_text_no_file_can_hold_is_refused_in_one_line(case, tmp_path):
    body, expect = BAD_TEXT[case]
    with ScriptedEndpoint(lambda r, n: body) as srv:
        with pytest.raises(RagError) as e:
            Artifacts(ArtifactCache(tmp_path)).answers(generator(srv.base_url, endpoint={"max_retries": 2}),
                                                       QUESTIONS[:1], CONTEXTS[:1])
        assert len(srv.chat_requests) == 1, "not retried: the server answered, wrongly"
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"llm: POST {srv.base_url}/chat/completions answered wrongly: ")
    assert re.search(expect, msg) and msg.endswith("(llm.model=m); nothing of this reply is kept"), msg
    assert not (tmp_path / RECORD_KIND).exists()


def test_a_surrogate_pair_is_the_character_it_stands_for(tmp_path):
    with ScriptedEndpoint(lambda r, n: reply("smile \U0001f600")) as srv:
        made = Artifacts(ArtifactCache(tmp_path)).answers(generator(srv.base_url), QUESTIONS[:1], CONTEXTS[:1])
    assert made.answers == ["smile \U0001f600"]
