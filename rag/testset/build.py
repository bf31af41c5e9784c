"""A question file for a corpus without questions: passages drawn across sources and documents,
questions written and answered for them, filtered, and the kept ones written for `qa=jsonl` with
each question's provenance, the summary beside them (`<out>.summary.json`).

The filters run in a fixed order, each counted: the passage checks (short, not prose; before
anything is asked), then per question: malformed (no question in the reply), copied, off topic and
lexical (the question's words against its passages), unsupported (the answer's), round trip,
duplicate (rag/testset/filters.py). An answer is asked for only when its question passed the
filters before it. `oversample` x n passages are asked about; of those kept, n are written, the
sources taking turns.
"""
from __future__ import annotations

import json
import logging
import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rag.store.cache import ArtifactCache
from rag.reranker.training.structure import LOOKED_FOR
from rag.serving.secrets import redacted_data
from rag.testset import filters as checks
from rag.testset.generate import ANSWER, QUESTION, Asker, Request, Usage, template_questions
from rag.testset.out import kept_sha, write_questions, write_summary
from rag.testset.passages import Passages, Slot, askable, draw, round_robin, spread, spread_counts
from rag.testset.prompts import TWO_PASSAGE, clean_answer, parse_question
from rag.testset.settings import Filters, TestsetSettings
from rag.types import Document, RagError

log = logging.getLogger(__name__)

# The question filters in the order they run: (reason a question is dropped, what those kept passed).
STAGES = (("malformed", "well-formed"), ("copied", "not copied"), ("off_topic", "on topic"),
          ("lexical", "not only the passage's words"), ("unsupported", "answer supported"),
          ("round_trip", "round trip"), ("duplicate", "not a duplicate"))


@dataclass
class Candidate:
    """A question in the making: its kind, its passages' rows, what was written, its scores and,
    once a filter drops it, why."""

    kind: str
    rows: tuple[int, ...]
    question: str | None = None
    answer: str | None = None
    prompts: dict[str, str] = field(default_factory=dict)
    scores: dict[str, Any] = field(default_factory=dict)
    dropped: str | None = None


@dataclass
class Inputs:
    """What the settings build before anything is drawn."""

    docs: Sequence[Document]
    chunker: Any  # cuts the documents into passages (testset.passages)
    llm: Any | None  # the generator, for testset.generator=llm
    embedder: Callable[[], Any]  # the evaluation embedder, built when the duplicate check needs it
    cache: ArtifactCache
    no_answer: str | None = None  # the generator's reply when its passages hold no answer


def _text(passages: Passages, rows: Sequence[int]) -> str:
    return "\n\n".join(passages[r].text for r in rows)


def check_question(c: Candidate, passages: Passages, f: Filters) -> None:
    text = _text(passages, c.rows)
    assert c.question is not None
    c.scores["copied_words"] = checks.copied_words(c.question, text)
    c.scores["word_overlap"] = round(checks.word_overlap(c.question, text), 4)
    if c.scores["copied_words"] > f.max_copied_words:
        c.dropped = "copied"
    elif c.scores["word_overlap"] < f.min_word_overlap:
        c.dropped = "off_topic"
    elif c.scores["word_overlap"] > f.max_word_overlap:
        c.dropped = "lexical"


def check_answer(c: Candidate, passages: Passages, f: Filters, no_answer: str | None) -> None:
    assert c.answer is not None
    c.scores["answer_support"] = round(checks.answer_support(c.answer, _text(passages, c.rows), no_answer), 4)
    if c.scores["answer_support"] < f.min_answer_support:
        c.dropped = "unsupported"


def _alive(cands: Sequence[Candidate]) -> list[Candidate]:
    return [c for c in cands if c.dropped is None]


def _requests(cands: Sequence[Candidate], passages: Passages, step: str) -> list[Request]:
    return [Request(step, c.kind, tuple(passages[r].text for r in c.rows), c.question or "") for c in cands]


def _written_by_llm(slots: Sequence[Slot], passages: Passages, asker: Asker, f: Filters,
                    no_answer: str | None) -> list[Candidate]:
    cands = [Candidate(s.kind, s.rows) for s in slots]
    asked = _requests(cands, passages, QUESTION)
    for c, r, reply in zip(cands, asked, asker.ask(asked)):
        c.prompts[QUESTION] = asker.prompt_digest(r)
        c.question = parse_question(reply)
        if c.question is None:
            c.dropped = "malformed"
        else:
            check_question(c, passages, f)
    alive = _alive(cands)
    asked = _requests(alive, passages, ANSWER)
    for c, r, reply in zip(alive, asked, asker.ask(asked)):
        c.prompts[ANSWER] = asker.prompt_digest(r)
        c.answer = clean_answer(reply)
        check_answer(c, passages, f, no_answer)
    return cands


def plan(slots: Sequence[Slot], passages: Passages, asker: Asker, f: Filters) -> dict[str, Any]:
    """The dry run: the requests not recorded yet and their prompt tokens. The question step's
    count is exact; an answer is asked only for a question that passes, so where a question is
    not recorded yet its answer is counted as one request (an upper bound) and its tokens without
    the question's own (`exact` false)."""
    cands = [Candidate(s.kind, s.rows) for s in slots]
    asked = _requests(cands, passages, QUESTION)
    questions = asker.count(asked)
    known: list[Candidate] = []
    unknown: list[Candidate] = []
    for c, reply in zip(cands, asker.recorded(asked)):
        if reply is None:
            unknown.append(c)
            continue
        c.question = parse_question(reply)
        if c.question is not None:
            check_question(c, passages, f)
            if c.dropped is None:
                known.append(c)
    answers = asker.count(_requests(known, passages, ANSWER) + _requests(unknown, passages, ANSWER))
    return {"question": _usage(questions), "answer": _usage(answers), "exact": not unknown,
            "requests": questions.requests + answers.requests,
            "prompt_tokens": questions.prompt_tokens + answers.prompt_tokens}


def _usage(u: Usage) -> dict[str, Any]:
    return {"requests": u.requests, "from_cache": u.from_cache, "prompt_tokens": u.prompt_tokens,
            "token_count": u.token_count or None}


def _written_by_templates(docs: Sequence[Document], passages: Passages, rows: Sequence[int], m: int,
                          seed: int, f: Filters) -> list[Candidate]:
    ok = set(rows)
    asked = template_questions(docs, passages)
    found = [t for t in asked if t.row in ok]
    if not asked:
        raise RagError(f"testset.generator=templates found nothing to ask about in the {len(docs)} documents: "
                       f"{LOOKED_FOR}; use testset.generator=llm")
    if not found:
        raise RagError(f"testset.generator=templates: the {len(asked)} questions its templates found are all on "
                       "passages too short or not prose enough to ask about (testset.filters.min_passage_chars, "
                       "testset.filters.min_prose_share)")
    keys = [(passages[t.row].source, passages[t.row].doc_id) for t in found]
    cands = []
    for i in spread(keys, random.Random(f"testset:{seed}"))[:m]:
        t = found[i]
        c = Candidate(t.kind, (t.row,), t.question, t.answer)
        check_question(c, passages, f)
        if c.dropped is None:
            check_answer(c, passages, f, None)
        cands.append(c)
    return cands


def _round_trip(cands: Sequence[Candidate], passages: Passages, k: int) -> None:
    alive = _alive(cands)
    ranks = checks.round_trip_ranks([c.question or "" for c in alive], [passages[c.rows[0]].doc_id for c in alive],
                                    [p.text for p in passages.items], [p.doc_id for p in passages.items], k)
    for c, rank in zip(alive, ranks):
        c.scores["round_trip_rank"] = rank
        if rank is None:
            c.dropped = "round_trip"


def _duplicates(cands: Sequence[Candidate], embedder: Any, max_cosine: float) -> None:
    import numpy as np

    alive = _alive(cands)
    if not alive:
        return
    vectors = np.asarray(embedder.encode([c.question or "" for c in alive]), dtype=np.float32)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    keep, highest = checks.duplicates(vectors, max_cosine)
    for c, ok, cos in zip(alive, keep, highest):
        c.scores["duplicate_cosine"] = cos
        if not ok:
            c.dropped = "duplicate"


def choose(cands: Sequence[Candidate], passages: Passages, n: int) -> list[Candidate]:
    """n of the kept questions, the sources taking turns (in the order they were drawn)."""
    by_source: dict[str, list[Candidate]] = {}
    for c in _alive(cands):
        by_source.setdefault(passages[c.rows[0]].source, []).append(c)
    return round_robin(list(by_source.values()))[:n]


def record(i: int, c: Candidate, passages: Passages, generator: dict[str, Any]) -> dict[str, Any]:
    """A qa=jsonl question line, with its provenance."""
    first = passages[c.rows[0]]
    return {"id": f"gen-{i:04d}", "question": c.question, "answer": c.answer, "doc_id": first.doc_id,
            "group": first.source,
            "provenance": {"kind": c.kind,
                           "passages": [{"id": passages.ids[r], "doc_id": passages[r].doc_id, "start": passages[r].start,
                                         "end": passages[r].end} for r in c.rows],
                           "generator": generator, "prompts": dict(c.prompts), "scores": dict(c.scores)}}


def filter_counts(n_prompted: int, cands: Sequence[Candidate]) -> list[dict[str, Any]]:
    """Per question filter, in order: how many it dropped, how many were left, and their share of
    the prompted passages."""
    dropped = Counter(c.dropped for c in cands)
    left = n_prompted
    rows = []
    for reason, kept in STAGES:
        left -= dropped.get(reason, 0)
        rows.append({"filter": reason, "kept": kept, "dropped": dropped.get(reason, 0), "left": left,
                     "share": round(left / n_prompted, 4) if n_prompted else 0.0})
    return rows


def skew(chosen: Sequence[Candidate], passages: Passages, docs: Sequence[Document]) -> dict[str, Any]:
    per_source = Counter(passages[c.rows[0]].source for c in chosen)
    per_doc = Counter(passages[c.rows[0]].doc_id for c in chosen)
    sources = sorted({d.source for d in docs})
    return {"per_source": {s: per_source.get(s, 0) for s in sources},
            "per_document": {**spread_counts(per_doc, [d.id for d in docs]), "documents": len(docs)},
            "per_kind": dict(sorted(Counter(c.kind for c in chosen).items()))}


def build(ts: TestsetSettings, inputs: Inputs, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Writes the question file and its summary (a dry run: the summary only) and returns the summary."""
    f = ts.filters
    passages = Passages(inputs.docs, inputs.chunker)
    rows, dropped = askable(passages, f.min_passage_chars, f.min_prose_share)
    m = min(math.ceil(ts.n * ts.oversample), len(rows))
    summary: dict[str, Any] = {
        "n": ts.n, "generator": ts.generator, "dry_run": ts.dry_run, "out": str(ts.out),
        "passages": {"documents": len(inputs.docs), "passages": len(passages), **dropped, "askable": len(rows)},
        "filters": asdict(f)}
    say(f"testset: {len(inputs.docs)} documents -> {len(passages)} passages ({dropped['short']} short, "
        f"{dropped['not_prose']} not prose, {len(rows)} to ask about)")
    if not rows:
        raise RagError("testset: no passage passes testset.filters.min_passage_chars and min_prose_share")
    asker = Asker(inputs.llm, inputs.cache) if ts.generator == "llm" else None
    if asker is not None:
        slots = draw(rows, passages, m, ts.kinds, ts.seed)
        summary["slots"] = dict(sorted(Counter(s.kind for s in slots).items()))
        if TWO_PASSAGE in dict(ts.kinds) and not summary["slots"].get(TWO_PASSAGE):
            log.warning("testset: no document has two passages to ask about: no two_passage question")
        if ts.dry_run:
            summary["requests"] = plan(slots, passages, asker, f)
            _say_plan(summary["requests"], say)
            _write_summary(ts, summary, say)
            return summary
        cands = _written_by_llm(slots, passages, asker, f, inputs.no_answer)
        summary["generator_id"] = asker.generator_id()
        summary["requests"] = {"requests": asker.usage.requests, "from_cache": asker.usage.from_cache,
                               "prompt_tokens": asker.usage.prompt_tokens, "token_count": asker.usage.token_count or None}
    else:
        if ts.dry_run:
            summary["requests"] = {"requests": 0, "prompt_tokens": 0, "exact": True}
            say("dry run: the templates send nothing")
            _write_summary(ts, summary, say)
            return summary
        cands = _written_by_templates(inputs.docs, passages, rows, m, ts.seed, f)
        summary["generator_id"] = {"class": "templates"}
    if f.round_trip_k > 0:
        _round_trip(cands, passages, f.round_trip_k)
    if _alive(cands):
        _duplicates(cands, inputs.embedder(), f.max_duplicate_cosine)
    chosen = choose(cands, passages, ts.n)
    summary["questions"] = filter_counts(len(cands), cands)
    summary.update(skew(chosen, passages, inputs.docs), written=len(chosen))
    _say_counts(summary, say)
    if not chosen:
        _write_summary(ts, summary, say)
        raise RagError(f"testset: no question passed the filters (counts in {ts.summary_path})")
    lines = [json.dumps(record(i, c, passages, summary["generator_id"]), ensure_ascii=False)
             for i, c in enumerate(chosen, 1)]
    written = write_questions(ts, "".join(line + "\n" for line in lines))
    _write_summary(ts, summary, say, written)
    say(f"wrote {len(chosen)} questions to {ts.out}")
    return summary


def _say_plan(r: dict[str, Any], say: Callable[[str], None]) -> None:
    how = r["question"]["token_count"] or r["answer"]["token_count"] or "none to count"
    say(f"dry run: {r['requests']} requests ({'exact' if r['exact'] else 'at most'}; "
        f"{r['question']['requests']} questions, {r['answer']['requests']} answers, "
        f"{r['question']['from_cache'] + r['answer']['from_cache']} recorded), {r['prompt_tokens']} prompt tokens "
        f"({how}); nothing sent")


def _say_counts(summary: dict[str, Any], say: Callable[[str], None]) -> None:
    rows = summary["questions"]
    total = rows[0]["left"] + rows[0]["dropped"] if rows else 0
    say(f"{total} questions asked for; kept after each filter:")
    for r in rows:
        say(f"  {r['kept']:<30} {r['left']:>5}  ({100 * r['share']:.0f}%; dropped {r['dropped']})")
    per_source = ", ".join(f"{s} {k}" for s, k in summary["per_source"].items())
    d = summary["per_document"]
    say(f"questions per source: {per_source}")
    say(f"questions per document: min {d['min']}, median {d['median']}, max {d['max']} over {d['documents']} documents")
    say("kinds: " + (", ".join(f"{k} {v}" for k, v in summary["per_kind"].items()) or "none"))
    req = summary.get("requests") or {}
    if req.get("requests") or req.get("from_cache"):
        say(f"requests: {req['requests']} sent, {req['from_cache']} from the cache; {req['prompt_tokens']} prompt "
            f"tokens ({req['token_count'] or 'none sent'})")


def _write_summary(ts: TestsetSettings, summary: dict[str, Any], say: Callable[[str], None],
                   written: str | None = None) -> None:
    """The summary, vouching for the question file just `written` (its sha256) or, where this run
    wrote none, for the one an earlier run left (rag/testset/out.py)."""
    write_summary(ts, redacted_data(summary), written or kept_sha(ts))
    say(f"summary: {ts.summary_path}")
