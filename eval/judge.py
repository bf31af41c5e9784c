"""LLM-judged answer metrics (`eval.judge`, off by default), asked of any OpenAI-compatible
endpoint, beside the embedding metrics and never instead of them.

- faithfulness: is every claim of the answer supported by the context passages the generator
  was given? verdict `supported` (1) or `unsupported` (0).
- correctness: does the answer agree with the ground truth? `correct` (1), `partially_correct`
  (0.5) or `incorrect` (0).

Each judgement is one request with a fixed rubric that asks for one JSON object,
`{"verdict": ..., "reason": ...}`. A reply is read only as that JSON (inside code fences or
prose is fine); a reply with no such object or a verdict outside the rubric's is *unparseable*,
never guessed from keywords. A judgement that is unparseable, or whose request failed, is
*unmeasured*: counted and reported beside the mean (which is over the measured ones only), never
dropped silently. A bad URL, key or model stops the run in one line instead: then nothing could
be measured.

`repeats = n` asks every question n times (with temperature > 0, seed + i for the i-th) and
reports agreement: the share of questions whose measured verdicts all agree, and Fleiss' kappa
over the questions with all n measured. With temperature 0 the repeats measure only the engine's
own nondeterminism.

Replies are cached one judgement at a time (kind "judgement", keyed by the judge's model,
parameters, rubric, the exact messages and the repeat number), the raw text, so that a rerun asks
nothing and a better parser re-reads old replies. Failed requests are not cached.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from rag.store.cache import ArtifactCache, make_key
from rag.endpoint import EndpointSettings
from rag.llm.chat_api import ChatEndpoint, EndpointError, map_concurrent
from rag.llm.prompt import chat_messages
from rag.types import RagError

log = logging.getLogger(__name__)

RECORD_KIND = "judgement"
SYSTEM = "You are a strict grader of answers produced by a retrieval-augmented system. Reply with one JSON object and nothing else."


@dataclass(frozen=True)
class Rubric:
    template: str
    verdicts: dict[str, float]  # verdict -> score

    def messages(self, **fields: str) -> list[dict[str, str]]:
        return chat_messages(SYSTEM, self.template.format(**fields))


RUBRICS = {
    "faithfulness": Rubric(
        "Context passages:\n{contexts}\n\n"
        "Answer to check:\n{answer}\n\n"
        "Decide whether every claim in the answer is supported by the context passages above. An answer "
        "that only says the passages do not contain the answer makes no claim and is supported.\n"
        'Reply with only this JSON object: {{"verdict": "supported" or "unsupported", "reason": "<one short sentence>"}}',
        {"supported": 1.0, "unsupported": 0.0},
    ),
    "correctness": Rubric(
        "Question: {question}\n\n"
        "Reference answer:\n{ground_truth}\n\n"
        "Answer to grade:\n{answer}\n\n"
        "Compare the answer with the reference answer. correct: it states the reference's key facts and "
        "contradicts none; partially_correct: some key facts are right and others missing or wrong; incorrect: "
        "it is wrong, contradicts the reference, or gives no answer.\n"
        'Reply with only this JSON object: {{"verdict": "correct" or "partially_correct" or "incorrect", '
        '"reason": "<one short sentence>"}}',
        {"correct": 1.0, "partially_correct": 0.5, "incorrect": 0.0},
    ),
}


class Unparseable(ValueError):
    pass


def parse_verdict(reply: str, verdicts: dict[str, float]) -> tuple[str, str]:
    """(verdict, reason) from the first JSON object in `reply` that has a `verdict`; raises
    Unparseable with the cause otherwise."""
    decoder = json.JSONDecoder()
    found: dict[str, Any] | None = None
    for m in re.finditer(r"\{", reply):
        try:
            obj, _ = decoder.raw_decode(reply, m.start())
        except ValueError:
            continue
        if isinstance(obj, dict) and "verdict" in obj:
            found = obj
            break
    if found is None:
        raise Unparseable("no JSON object with a verdict in the reply")
    verdict = re.sub(r"[\s\-]+", "_", str(found["verdict"]).strip().lower())
    if verdict not in verdicts:
        raise Unparseable(f"verdict {str(found['verdict'])[:40]!r} is not one of {sorted(verdicts)}")
    return verdict, " ".join(str(found.get("reason", "")).split())[:500]


@dataclass(frozen=True)
class Item:
    question: str
    answer: str
    ground_truth: str
    contexts: list[str]


class Judge:
    def __init__(
        self,
        base_url: str,
        model: str | None,
        api_key_env: str | None = None,
        metrics: list[str] | tuple[str, ...] = ("faithfulness", "correctness"),
        repeats: int = 1,
        temperature: float = 0.0,
        max_tokens: int = 128,
        seed: int | None = 0,
        endpoint: EndpointSettings | None = None,
    ):
        if not model:
            raise RagError("eval.judge.model must name the judge model the endpoint serves (eval.judge.enabled=true)")
        settings = endpoint or EndpointSettings()
        self.endpoint = settings.transport("eval.judge", base_url, str(model), api_key_env, kind=ChatEndpoint)
        unknown = [m for m in metrics if m not in RUBRICS]
        if unknown or not metrics:
            raise RagError(f"eval.judge.metrics: unknown or none {unknown or list(metrics)}; known: {sorted(RUBRICS)}")
        self.metrics = tuple(metrics)
        self.repeats = int(repeats)
        self.temperature = float(temperature)
        self.max_tokens = int(max_tokens)
        self.seed = None if seed is None else int(seed)
        self.concurrency = settings.concurrency
        self.extra_body = dict(settings.extra_body)
        self.cache_namespace = settings.cache_namespace
        if not 1 <= self.repeats <= 20:
            raise RagError(f"eval.judge.repeats must be between 1 and 20, got {repeats}")
        if self.max_tokens <= 0 or self.temperature < 0:
            raise RagError(f"eval.judge: max_tokens must be positive and temperature >= 0 "
                           f"(got {max_tokens}, {temperature})")
        if self.repeats > 1 and self.temperature == 0:
            log.warning("eval.judge.repeats=%d with temperature 0: agreement measures only the engine's nondeterminism",
                        self.repeats)

    def params(self, repeat: int) -> dict[str, Any]:
        out: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        if self.seed is not None and self.temperature > 0:
            out["seed"] = self.seed + repeat
        return {**out, **self.extra_body}

    @property
    def id(self) -> dict[str, Any]:
        return {"class": type(self).__name__, "model": self.endpoint.model, "system": SYSTEM,
                "max_tokens": self.max_tokens, "temperature": self.temperature, "extra_body": self.extra_body,
                **({"seed": self.seed} if self.temperature > 0 else {}),
                **({"cache_namespace": self.cache_namespace} if self.cache_namespace else {})}

    def describe(self) -> dict[str, Any]:
        """For metrics.json: what judged (no key, only the name of its variable)."""
        return {"base_url": self.endpoint.base_url, "model": self.endpoint.model,
                "api_key_env": self.endpoint.api_key_env, "metrics": list(self.metrics), "repeats": self.repeats,
                "temperature": self.temperature, "max_tokens": self.max_tokens}

    def tasks(self, items: list[Item]) -> list[tuple[int, str, int, list[dict[str, str]]]]:
        out: list[tuple[int, str, int, list[dict[str, str]]]] = []
        for q, it in enumerate(items):
            contexts = "\n\n".join(f"[{n}] {' '.join(t.split())}" for n, t in enumerate(it.contexts, 1)) or "(no passages)"
            fields = {"question": it.question.strip(), "answer": it.answer.strip() or "(empty answer)",
                      "ground_truth": it.ground_truth.strip(), "contexts": contexts}
            for metric in self.metrics:
                messages = RUBRICS[metric].messages(**fields)
                out.extend((q, metric, r, messages) for r in range(self.repeats))
        return out

    def _key(self, metric: str, repeat: int, messages: list[dict[str, str]]) -> str:
        digest = hashlib.sha256(json.dumps(messages, ensure_ascii=False).encode()).hexdigest()
        return make_key(RECORD_KIND, {**self.id, "metric": metric}, {"messages": digest, "repeat": str(repeat)})

    def judge(self, items: list[Item], cache: ArtifactCache | None) -> dict[str, Any]:
        """Per question and metric the repeats' verdicts, scores (None = unmeasured), reasons and
        errors; plus `stats`: requests sent, replies from the cache, token usage."""
        tasks = self.tasks(items)
        keys = [self._key(metric, r, msgs) for _, metric, r, msgs in tasks]
        replies: list[dict[str, Any] | None] = [cache.get_record(RECORD_KIND, k) if cache else None for k in keys]
        todo = [i for i, rep in enumerate(replies) if rep is None]
        failed: dict[int, str] = {}
        if todo:
            self.endpoint.check()

            def ask(i: int, stop: threading.Event) -> dict[str, Any]:
                _, _, r, msgs = tasks[i]
                done = self.endpoint.chat(msgs, self.params(r), stop)
                return {"reply": done.text, "usage": done.usage(), "latency_ms": round(done.latency_ms, 3)}

            def fatal(e: BaseException) -> bool:
                return not isinstance(e, EndpointError) or e.fatal

            with tqdm(total=len(todo), desc="judge", unit="request", mininterval=2.0, leave=False) as bar:
                for j, result in map_concurrent(ask, todo, self.concurrency, is_fatal=fatal):
                    bar.update(1)
                    i = todo[j]
                    if isinstance(result, EndpointError):
                        failed[i] = str(result)
                        continue
                    if cache is not None:
                        cache.put_record(RECORD_KIND, keys[i], result)
                    replies[i] = result
            if failed and all(r is None for r in replies):  # nothing to report but failures: a setup problem
                raise RagError(f"eval.judge: all {len(todo)} requests failed; the first: {next(iter(failed.values()))}")
        return self._collect(items, tasks, replies, failed, sent=len(todo) - len(failed), fresh=set(todo))

    def _collect(self, items: list[Item], tasks: list, replies: list, failed: dict[int, str], sent: int,
                 fresh: set[int] | frozenset[int] = frozenset()) -> dict[str, Any]:
        per_q: list[dict[str, Any]] = [
            {m: {"verdicts": [None] * self.repeats, "scores": [None] * self.repeats, "reasons": [None] * self.repeats,
                 "errors": [None] * self.repeats} for m in self.metrics} for _ in items]
        prompt_tokens = completion_tokens = 0
        sent_tokens = [0, 0]
        for i, (q, metric, r, _) in enumerate(tasks):
            slot = per_q[q][metric]
            rep = replies[i]
            if rep is None:
                slot["errors"][r] = f"request failed: {failed.get(i, 'no reply')}"
                continue
            usage = rep.get("usage") or {}
            prompt_tokens += int(usage.get("prompt_tokens") or 0)
            completion_tokens += int(usage.get("completion_tokens") or 0)
            if i in fresh:  # sent by this run (the cost of this run)
                sent_tokens[0] += int(usage.get("prompt_tokens") or 0)
                sent_tokens[1] += int(usage.get("completion_tokens") or 0)
            try:
                verdict, reason = parse_verdict(rep.get("reply") or "", RUBRICS[metric].verdicts)
            except Unparseable as e:
                slot["errors"][r] = f"unparseable: {e}"
                slot.setdefault("replies", [None] * self.repeats)[r] = (rep.get("reply") or "")[:300]
                continue
            slot["verdicts"][r], slot["reasons"][r] = verdict, reason
            slot["scores"][r] = RUBRICS[metric].verdicts[verdict]
        stats = {"requests_sent": sent, "requests_failed": len(failed), "from_cache": len(tasks) - sent - len(failed),
                 "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "sent_prompt_tokens": sent_tokens[0], "sent_completion_tokens": sent_tokens[1]}
        return {"metrics": list(self.metrics), "repeats": self.repeats, "per_question": per_q, "stats": stats}


def question_score(slot: dict[str, Any]) -> float | None:
    """A question's score: the mean of its measured repeats; None when none was measured."""
    scores = [s for s in slot["scores"] if s is not None]
    return sum(scores) / len(scores) if scores else None


def agreement(slots: list[dict[str, Any]]) -> tuple[float | None, int]:
    """Share of questions whose measured verdicts (two or more) are all the same, and how many
    questions had two or more."""
    eligible = [[v for v in s["verdicts"] if v is not None] for s in slots]
    eligible = [v for v in eligible if len(v) >= 2]
    if not eligible:
        return None, 0
    return sum(len(set(v)) == 1 for v in eligible) / len(eligible), len(eligible)


def fleiss_kappa(slots: list[dict[str, Any]], categories: list[str]) -> tuple[float | None, int]:
    """Fleiss' kappa of the repeats as raters, over questions with every repeat measured (kappa
    needs the same number of ratings per question); None with fewer than two repeats or two
    questions, or when every verdict is the same category (chance agreement is then 1)."""
    rows = [s["verdicts"] for s in slots if s["verdicts"] and all(v is not None for v in s["verdicts"])]
    n = len(rows[0]) if rows else 0
    if n < 2 or len(rows) < 2:
        return None, len(rows)
    counts = [[row.count(c) for c in categories] for row in rows]
    p_i = [(sum(x * x for x in c) - n) / (n * (n - 1)) for c in counts]
    p_j = [sum(c[j] for c in counts) / (len(rows) * n) for j in range(len(categories))]
    p_bar, p_e = sum(p_i) / len(rows), sum(p * p for p in p_j)
    if p_e >= 1.0:
        return None, len(rows)
    return (p_bar - p_e) / (1 - p_e), len(rows)
