"""The LLM judge (eval/judge.py): strict JSON verdicts, every failed or unparseable judgement
counted as unmeasured beside the mean, agreement of repeats, judgements cached, and the
embedding metrics left as they are. Against a scripted endpoint; tests/test_server.py judges
with a real engine."""
from __future__ import annotations

import json
import re

import pytest

from eval.judge import RUBRICS, Item, Judge, Unparseable, agreement, fleiss_kappa, parse_verdict
from eval.record import QuestionRecord
from eval.scoring import ScoreSettings, add_judge_scores
from rag.store.cache import ArtifactCache
from rag.endpoint import EndpointSettings
from rag.run.pipeline import run
from rag.types import RagError
from tests.conftest import tiny_overrides
from tests.scripted_endpoint import ScriptedEndpoint, completion

FAITH = RUBRICS["faithfulness"].verdicts
ITEMS = [Item(f"q{i}?", f"answer {i}", f"truth {i}", [f"passage {i}"]) for i in range(4)]


@pytest.mark.parametrize("reply,verdict", [
    ('{"verdict": "supported", "reason": "all in [1]"}', "supported"),
    ('```json\n{"verdict": "Unsupported", "reason": "x"}\n```', "unsupported"),
    ('Here is my grading: {"verdict": "supported"} as asked.', "supported"),
    ('{"note": 1} then {"verdict": " SUPPORTED ", "reason": "r"}', "supported"),
])
def test_verdicts_are_read_from_the_json_object(reply, verdict):
    assert parse_verdict(reply, FAITH)[0] == verdict


@pytest.mark.parametrize("reply,cause", [
    ("The answer is supported by the context.", "no JSON object"),
    ('{"verdict": "mostly"}', "is not one of"),
    ('{"reason": "no verdict"}', "no JSON object"),
    ('{"verdict": "supported"', "no JSON object"),
    ("", "no JSON object"),
])
def test_anything_else_is_unparseable_never_guessed(reply, cause):
    with pytest.raises(Unparseable, match=cause):
        parse_verdict(reply, FAITH)


def test_correctness_accepts_partially_correct_spelled_loosely():
    assert parse_verdict('{"verdict": "partially correct"}', RUBRICS["correctness"].verdicts)[0] == "partially_correct"


def slot(*verdicts):
    scores = [None if v is None else FAITH[v] for v in verdicts]
    return {"verdicts": list(verdicts), "scores": scores, "reasons": [None] * len(verdicts),
            "errors": [None if v else "unparseable: x" for v in verdicts]}


def test_agreement_and_fleiss_kappa():
    slots = [slot("supported", "supported"), slot("unsupported", "unsupported"), slot("supported", "unsupported"),
             slot("supported", None)]
    assert agreement(slots) == (2 / 3, 3)
    # textbook: 2 raters, 3 complete subjects: P_bar = 2/3, p = (3/6, 3/6) -> P_e = 0.5, kappa = 1/3
    kappa, n = fleiss_kappa(slots, list(FAITH))
    assert n == 3 and kappa == pytest.approx(1 / 3)
    assert fleiss_kappa([slot("supported", "supported")] * 3, list(FAITH)) == (None, 3)  # chance agreement 1
    assert fleiss_kappa([slot("supported")] * 3, list(FAITH)) == (None, 3)


def test_unmeasured_is_counted_beside_the_mean():
    records = [QuestionRecord(f"q{i}", corpus=c) for i, c in enumerate("aab")]
    judged = {"metrics": ["faithfulness"], "repeats": 2,
              "per_question": [{"faithfulness": slot("supported", "supported")},
                               {"faithfulness": slot("unsupported", None)},
                               {"faithfulness": slot(None, None)}]}
    aggregates = {"overall": {}, "by_corpus": {}}
    names = add_judge_scores(records, aggregates, judged, ScoreSettings(bootstrap_resamples=50))
    assert names == ["judge_faithfulness"]
    assert [r.metric("judge_faithfulness") for r in records] == [1.0, 0.0, None]
    o = aggregates["overall"]["judge_faithfulness"]
    assert (o["mean"], o["n"], o["unmeasured"]) == (0.5, 2, 1)
    assert (o["judgements"], o["judgements_unmeasured"], o["unmeasured_causes"]["unparseable"]) == (6, 3, 3)
    assert (o["agreement"], o["agreement_n"]) == (1.0, 1)
    b = aggregates["by_corpus"]["b"]["judge_faithfulness"]
    assert b["mean"] is None and b["n"] == 0 and b["unmeasured"] == 1


def scripted_judge(replies):
    """Replies by rubric and question number found in the prompt."""
    def chat(req, n):
        user = req["messages"][-1]["content"]
        q = int(re.search(r"answer (\d)", user).group(1))
        metric = "faithfulness" if "Context passages" in user else "correctness"
        return replies(metric, q, req)
    return chat


def judge(srv, **kw):
    return Judge(srv.base_url, "judge-m", endpoint=EndpointSettings(backoff_s=0.01, max_retries=0), **kw)


def test_failed_and_unparseable_judgements_are_unmeasured_and_cached(tmp_path):
    def replies(metric, q, req):
        if q == 0:
            return 200, {}, completion('{"verdict": "supported", "reason": "ok"}' if metric == "faithfulness"
                                       else '{"verdict": "correct"}')
        if q == 1:
            return 200, {}, completion("I think it is fine.")
        if q == 2:
            return 500, {}, {"error": "model crashed"}
        return 400, {}, {"error": {"message": "prompt too long"}}

    cache = ArtifactCache(tmp_path)
    with ScriptedEndpoint(scripted_judge(replies)) as srv:
        out = judge(srv).judge(ITEMS, cache)
        assert out["stats"]["requests_sent"] == 4 and out["stats"]["requests_failed"] == 4
        again = judge(srv).judge(ITEMS, cache)
        assert len(srv.chat_requests) == 8 + 4, "replies are cached; failed requests are asked again"
    pq = out["per_question"]
    assert pq[0]["faithfulness"]["verdicts"] == ["supported"] and pq[0]["correctness"]["scores"] == [1.0]
    assert pq[1]["faithfulness"]["errors"][0].startswith("unparseable: no JSON object")
    assert pq[1]["faithfulness"]["replies"] == ["I think it is fine."]
    assert "model crashed" in pq[2]["faithfulness"]["errors"][0] and "prompt too long" in pq[3]["correctness"]["errors"][0]
    assert again["stats"]["from_cache"] == 4 and again["per_question"][0] == pq[0]


def test_repeats_are_separate_seeded_requests():
    seeds = []

    def replies(metric, q, req):
        seeds.append(req.get("seed"))
        return 200, {}, completion('{"verdict": "supported"}')

    with ScriptedEndpoint(scripted_judge(replies)) as srv:
        out = judge(srv, repeats=3, temperature=0.7, seed=10, metrics=["faithfulness"]).judge(ITEMS[:2], None)
    assert sorted(seeds) == [10, 10, 11, 11, 12, 12]
    assert out["per_question"][0]["faithfulness"]["verdicts"] == ["supported"] * 3


def test_a_judge_that_cannot_work_stops_in_one_line():
    with ScriptedEndpoint(lambda r, n: (401, {}, "bad key")) as srv:
        with pytest.raises(RagError, match=r"^eval.judge: POST .* HTTP 401"):
            judge(srv).judge(ITEMS, None)
    with ScriptedEndpoint(lambda r, n: (400, {}, {"detail": "Server is pinned to 'x'; requested 'judge-m'"})) as srv:
        with pytest.raises(RagError, match=r"all 8 requests failed; the first: .*pinned to 'x'"):
            judge(srv).judge(ITEMS, None)
    with pytest.raises(RagError, match="eval.judge.metrics"):
        Judge("http://127.0.0.1:1/v1", "m", metrics=["politeness"])
    with pytest.raises(RagError, match="eval.judge.model"):
        Judge("http://127.0.0.1:1/v1", None)


def test_judge_is_off_by_default_and_needs_answers(tiny_files, compose_cfg):
    cfg = compose_cfg(tiny_overrides(tiny_files))
    assert cfg.eval.judge.enabled is False
    with pytest.raises(RagError, match="llm=none generates none"):
        run(compose_cfg(tiny_overrides(tiny_files) + ["eval.judge.enabled=true", "eval.judge.model=m"]), tiny_files["out"])


def test_judge_metrics_sit_beside_the_embedding_metrics(tiny_files, compose_cfg):
    def replies(metric, q, req):
        return 200, {}, completion('{"verdict": "unsupported", "reason": "r"}' if metric == "faithfulness" else "no json")

    base = tiny_overrides(tiny_files) + ["llm=extractive"]
    plain = run(compose_cfg(base), tiny_files["out"] / "plain")
    with ScriptedEndpoint(lambda r, n: (200, {}, completion('{"verdict": "unsupported"}'
                                                            if "Context passages" in r["messages"][-1]["content"]
                                                            else "no json"))) as srv:
        judged = run(compose_cfg(base + ["eval.judge.enabled=true", f"eval.judge.base_url={srv.base_url}",
                                         "eval.judge.model=judge-m"]), tiny_files["out"] / "judged")
    for m, v in plain["metrics"].items():
        assert judged["metrics"][m] == v, m
    f, c = judged["metrics"]["judge_faithfulness"], judged["metrics"]["judge_correctness"]
    assert (f["mean"], f["n"], f["unmeasured"]) == (0.0, 6, 0)
    assert (c["mean"], c["n"], c["unmeasured"], c["judgements_unmeasured"]) == (None, 0, 6, 6)
    assert judged["usage"]["judge"]["requests_sent"] == 12 and judged["usage"]["judge"]["model"] == "judge-m"
    rows = [json.loads(x) for x in (tiny_files["out"] / "judged" / "per_question.jsonl").read_text().splitlines()]
    assert all(r["judge_correctness"] is None and r["judge"]["correctness"]["errors"][0].startswith("unparseable")
               for r in rows)


def test_a_reply_with_counts_that_are_no_counts_is_an_unmeasured_judgement_not_a_crash():
    """Token counts become the judge's cost: a reply claiming "many" tokens is refused like a
    failed request (the judgement unmeasured, the reason kept), never read as a number."""
    def replies(metric, q, req):
        body = completion('{"verdict": "supported"}' if metric == "faithfulness" else '{"verdict": "correct"}')
        if q == 1:
            body["usage"]["prompt_tokens"] = "many"
        return 200, {}, body

    with ScriptedEndpoint(scripted_judge(replies)) as srv:
        out = judge(srv).judge(ITEMS, None)
    bad = out["per_question"][1]["faithfulness"]
    assert bad["scores"] == [None] and bad["errors"][0] == (
        f'request failed: eval.judge: POST {srv.base_url}/chat/completions answered wrongly: usage.prompt_tokens is '
        '"many", not a count of tokens (eval.judge.model=judge-m); nothing of this reply is kept')
    assert out["per_question"][0]["faithfulness"]["scores"] == [1.0]
    assert out["stats"]["requests_failed"] == 2 and out["stats"]["prompt_tokens"] == 6 * 10
