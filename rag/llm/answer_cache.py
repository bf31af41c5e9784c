"""Answers cached one by one, for generators whose answers do not depend on each other
(`resumable = True`: `llm=openai`, where every question is its own request).

The run's answers stay one artifact (kind "answers", keyed by the generator and every exact
prompt input), and a rerun of the same run reads only that. Beneath it, each answer is recorded
the moment it arrives (kind "answer", keyed by the generator and that one question's prompt
inputs), so that a run stopped mid-way (the server died, the job was killed) resumes with the
missing answers only, and a run on an overlapping question set reuses what it can. In-process
generators batch prompts, and a batch's padding can change a greedy answer, so their answers are
cached whole only.
"""
from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from rag.store.cache import ArtifactCache, make_key
from rag.timing import StageTimer
from rag.types import Context, RagError

log = logging.getLogger(__name__)

RECORD_KIND = "answer"


def prompt_inputs(query: str, contexts: list[Context]) -> str:
    """Everything of one question that reaches the prompt, serialized (also the unit of the
    whole-run answers key in rag.run.artifacts.Artifacts.answers)."""
    return json.dumps([query, [(c.label, c.text) for c in contexts]], ensure_ascii=False)


def answer_keys(generator_id: dict[str, Any], queries: list[str], contexts: list[list[Context]]) -> list[str]:
    return [
        make_key(RECORD_KIND, generator_id, {"input": hashlib.sha256(prompt_inputs(q, c).encode()).hexdigest()})
        for q, c in zip(queries, contexts)
    ]


def generate_resumable(
    generator: Any, queries: list[str], contexts: list[list[Context]], cache: ArtifactCache, timer: StageTimer
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Per question a record (`answer`, `latency_ms`, `usage`, ...) from the cache or the
    generator, and counts: `requests` answered by the generator in this run, `resumed` taken
    from earlier runs. Every answer is recorded before the next is awaited; if the generator
    fails, the ones already recorded stay for the rerun. A reply that holds no answer (its record
    says why: `withheld`) is used by this run as the empty answer but never recorded, so that a
    rerun asks for it again."""
    keys = answer_keys(generator.id, queries, contexts)
    records: list[dict[str, Any] | None] = [cache.get_record(RECORD_KIND, k) for k in keys]
    missing = [i for i, r in enumerate(records) if r is None]
    resumed = len(queries) - len(missing)
    if resumed and missing:
        log.info("llm: %d of %d answers recorded by an earlier run; asking for the other %d",
                 resumed, len(queries), len(missing))
    sent = withheld = 0
    if missing:
        with timer.stage("load_models"):
            generator.warm_up()
        with timer.stage("generate"):
            try:
                for j, rec in generator.iter_generate([queries[i] for i in missing], [contexts[i] for i in missing]):
                    i = missing[j]
                    if rec.get("withheld"):
                        withheld += 1
                    else:
                        cache.put_record(RECORD_KIND, keys[i], rec)
                    records[i] = {**rec, "key": keys[i]}
                    sent += 1
            except RagError as e:
                kept = resumed + sent - withheld
                if not kept:
                    raise
                # the one line says what is not lost, so that the user reruns instead of starting over
                raise RagError(f"{e}; {kept} of {len(queries)} answers are recorded in the cache, and a rerun "
                              f"asks only for the other {len(queries) - kept}") from None
    out = []
    for i, r in enumerate(records):
        assert r is not None, "every missing answer was generated or the generator raised"
        out.append({k: v for k, v in r.items() if k != "key"} | {"from_earlier_run": i not in missing})
    return out, {"requests": sent, "resumed": resumed}


def usage_totals(details: list[dict[str, Any]]) -> dict[str, int]:
    """Summed token usage of the answers that report it (`usage` per answer)."""
    totals = {"prompt_tokens": 0, "completion_tokens": 0, "answers_with_usage": 0}
    for d in details:
        u = d.get("usage") or {}
        if u.get("prompt_tokens") is None and u.get("completion_tokens") is None:
            continue
        totals["answers_with_usage"] += 1
        totals["prompt_tokens"] += int(u.get("prompt_tokens") or 0)
        totals["completion_tokens"] += int(u.get("completion_tokens") or 0)
    totals["total_tokens"] = totals["prompt_tokens"] + totals["completion_tokens"]
    return totals
