"""The dry run (`dry_run=true`; `llm.dry_run=true` is the same switch): what each model role behind
a server would send in this run, given what the artifact cache already holds. Nothing is sent,
not even a `/models` check, and nothing is scored.

Stages that run in process (corpus, chunks, local vectors and indexes, BM25, a local reranker) run
as in any run: they send nothing, and they decide what the served stages would be asked. Each
served stage is counted instead of run:

- contextualize (chunker.contextualize=llm through llm=openai): a request per chunk whose context
  line is not recorded;
- embed (embedder=openai): the chunk batches when the chunk vectors are not cached; every
  question's query (one request each: questions are searched one at a time, as a served system
  searches); the warm-up query; the latency sample's searches (eval.latency: warm-up + sample x
  repeats, each encoded again: a timed search takes nothing from memory);
- rerank (reranker=http, or reranker=llm_listwise through llm=openai): one request per question
  (http) or per window (listwise) whose scores or window answers are not recorded, and the latency
  sample's, which rerank anew;
- compress (compressor=llm through llm=openai): one request per context of each answered
  question, at most;
- generate (llm=openai): the answers not in the cache, with their prompt tokens;
- judge (eval.judge): its verdicts, at most;
- relevance (eval.relevance=llm through llm=openai): a request per distinct (question, chunk)
  pair of the top k whose grade is not recorded.

Counts are exact up to the first served stage with something to send. What comes after it depends
on what that stage would answer (a served embedder's query vectors decide the candidates, a served
reranker's scores the contexts), so from there requests are upper bounds and tokens estimates, and
each role says which (`exact`). Tokens are counted with the role's tokenizer where one is set
(embedder.tokenizer, reranker.tokenizer, llm.tokenizer), else estimated as characters / 4.

Each role keeps the cacheable units it would fill (chunk vectors, one question's scores or window
answer, one answer) under their cache keys, so a sweep's plan (`combine`) counts a unit that
several of its jobs would build once: the first job builds it and the others read it.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from eval.judge import Judge
from eval.relevance import RECORD as RELEVANCE_RECORD
from eval.relevance import RelevanceJudge
from rag.run.artifacts import answers_key
from rag.store.atomic import atomic_write_text
from rag.chunker.contextualize import LLMContextualizer
from rag.compressor.llm import LLMCompressor
from rag.embedder import npy_writer
from rag.embedder.base import Embedder
from rag.run.latency import LatencySettings, sample_rows
from rag.llm.answer_cache import RECORD_KIND, answer_keys
from rag.llm.base import CHARS_PER_TOKEN, Generator
from rag.store.models import TokenCounter
from rag.reranker.base import Reranker
from rag.reranker.listwise import ListwiseReranker, read_order
from rag.reranker.pointwise import PointwiseReranker
from rag.run.role_plan import RolePlan, batches, chars_estimate, endpoint_of, prompt_method, prompt_tokens
from rag.serving.secrets import redacted_data
from rag.serving.served import served
from rag.run.session import Session
from rag.run.settings import ROLES
from rag.types import Chunk, Context, Hits

PLAN_FILE = "dry_run.json"


# ---- the run's plan ----------------------------------------------------------------------------


def dry_run(session: Session, answer_rows: list[int], output_dir: Path) -> dict[str, Any]:
    """The plan of one run (dry_run.json in `output_dir`), returned as {"dry_run": plan};
    `answer_rows`: the questions that get answers."""
    qa, chunks = session.qa, session.chunk_set.chunks
    queries = [q.question for q in qa]
    roles: dict[str, RolePlan] = {}
    timed = timed_searches(len(queries), session.latency)
    retriever, reranker, generator = session.retriever, session.reranker, session.generator
    contextualizer, compressor = session.parts.contextualizer, session.compressor
    dense = retriever.dense_part()
    first: Hits | None = None
    if contextualizer is not None and served(contextualizer):
        roles["contextualize"] = plan_contextualize(session, contextualizer)
    unindexed = "contextualize" in roles and pending(roles["contextualize"])  # the indexed texts wait on it
    if dense is not None and served(dense.embedder):
        roles["embed"] = plan_embed(session, dense.embedder, queries, timed)
        if unindexed:
            roles["embed"].exact = False
            roles["embed"].notes.append("at most: counted on the chunks without their context lines")
    elif unindexed:
        pass  # nothing can be searched before the context lines exist: what follows is bounded
    else:
        first = first_stage(session, queries)
    hits: Hits | None = None
    if served(reranker) and isinstance(reranker, (PointwiseReranker, ListwiseReranker)):
        roles["rerank"], hits = plan_rerank(session, reranker, queries, first, timed)
    elif first is not None:
        hits = rerank_each(reranker, queries, first, chunks, session.score.k)
    answered_queries = [queries[i] for i in answer_rows]
    if served(compressor) and isinstance(compressor, LLMCompressor):
        roles["compress"] = plan_compress(session, compressor, answered_queries, hits, answer_rows)
    if served(generator):
        roles["generate"] = plan_generate(session, generator, answered_queries, hits, first, answer_rows)
    if session.judge is not None:
        roles["judge"] = plan_judge(session.judge, len(answer_rows))
    if session.relevance_judge is not None and served(session.relevance_judge):
        roles["relevance"] = plan_relevance(session, session.relevance_judge, queries, hits)
    exact_until = next((r for r in ROLES if r in roles and pending(roles[r])), None)
    plan = {
        "questions": len(queries),
        "answered_questions": len(answer_rows),
        "roles": {r: roles[r].to_json(session.settings.pricing) for r in ROLES if r in roles},
        "currency": session.settings.pricing.currency,
        "bounded_after": exact_until,
    }
    output_dir.mkdir(parents=True, exist_ok=True)
    plan = redacted_data(plan)  # a base_url from ${oc.env:...} is written as that
    atomic_write_text(output_dir / PLAN_FILE, json.dumps(plan, indent=2))
    return {"dry_run": plan}


def rerank_each(reranker: Reranker, queries: list[str], first: Hits, chunks: Sequence[Chunk], k: int) -> Hits:
    """Each question's top k, reranked one question at a time as the run reranks."""
    out = Hits.empty(len(queries), k)
    for q, query in enumerate(queries):
        row = reranker.rerank([query], Hits(first.ids[q:q + 1].copy(), first.scores[q:q + 1].copy()), list(chunks), k)
        w = min(k, row.width)
        out.ids[q, :w], out.scores[q, :w] = row.ids[0, :w], row.scores[0, :w]
    return out


def pending(role: RolePlan) -> bool:
    return role.totals()[0] > 0


def timed_searches(n_questions: int, latency: LatencySettings) -> list[int]:
    """The questions the latency sample searches (again), in order, warm-up included."""
    rows = [int(i) for i in sample_rows(n_questions, latency.sample)]
    return rows[: latency.warmup] + rows * int(latency.repeats) if rows else []


def first_stage(session: Session, queries: list[str]) -> Hits:
    """Each question's candidates, searched one at a time as the run searches (in process)."""
    retriever, qa = session.retriever, session.qa
    filters = retriever.route(queries)[0] if retriever.routes else retriever.filters_for([q.corpus for q in qa])
    out = Hits.empty(len(queries), session.depth)
    for q, (query, f) in enumerate(zip(queries, filters)):
        row = retriever.search_one(query, session.depth, f)
        out.ids[q], out.scores[q] = row.ids[0], row.scores[0]
    return out


def count_tokens(counter: TokenCounter | None, texts: list[str], pairs_with: str | None = None) -> int:
    if counter is not None:
        return counter(texts, pairs_with=pairs_with) if pairs_with is not None else counter(texts)
    return chars_estimate(texts) + (chars_estimate([pairs_with]) * len(texts) if pairs_with is not None else 0)


def tokens_method(counter: TokenCounter | None, setting: str) -> str:
    if counter is not None:
        return f"counted with {setting}={counter.ref}"
    return f"estimated as characters / {CHARS_PER_TOKEN} (set {setting} to count exactly)"


def plan_contextualize(session: Session, ctx: LLMContextualizer) -> RolePlan:
    """chunker.contextualize=llm through a served model: one request per chunk whose line is not
    recorded, its prompt counted as the generator counts it."""
    llm, chunks = ctx.llm, session.chunk_set.chunks
    plan = RolePlan("contextualize", *endpoint_of(llm), items_are="chunks")
    by_id = {d.id: d for d in session.docs}
    todo = ctx.missing(session.docs, chunks, session.cache)
    plan.cached = len(chunks) - len(todo)
    out = llm.max_tokens
    if todo:
        asked = [ctx.request(by_id[chunks[i].doc_id], chunks[i]) for i in todo]
        counts, plan.tokens_method = llm.count_prompt_tokens([q for q, _ in asked], [c for _, c in asked])
        for i, n in zip(todo, counts):
            plan.add(1, 1, int(n), out, key=ctx.key(by_id[chunks[i].doc_id], chunks[i]))
        plan.notes.append("the indexed texts depend on these answers: the roles after it are bounded")
    return plan


def plan_embed(session: Session, embedder: Embedder, queries: list[str], timed: list[int]) -> RolePlan:
    plan = RolePlan("embed", *endpoint_of(embedder), items_are="texts",
                    tokens_method=tokens_method(embedder.counter, "embedder.tokenizer"))
    artifacts, counter = session.artifacts, embedder.counter
    key = artifacts.vectors_key(embedder)
    if session.cache.available("vectors", key):
        plan.cached += 1
    else:
        # as rag.embedder.npy_writer.encode_to_npy sends them: a dimension probe, then each distinct text
        # once, but for the blocks an interrupted run recorded
        unique = list(dict.fromkeys(session.chunk_set.indexed_texts))
        done = npy_writer.BlockLog.recorded(session.cache.pending("vectors", key), len(unique))
        texts = [t for i, t in enumerate(unique) if i // npy_writer.ENCODE_BLOCK not in done] + ["dimension probe"]
        # the probe is a request of its own
        plan.add(1 + batches(len(texts) - 1, embedder.batch_size), len(texts), count_tokens(counter, texts), key=key)
        if done:
            plan.notes.append(f"{len(unique) - len(texts) + 1} chunk texts were encoded by an interrupted run "
                              f"({len(done)} blocks) and are not asked again")
    asked = [embedder.query_prefix + q for q in queries]
    probe = [embedder.query_prefix + "warm-up"]
    again = [asked[i] for i in timed]
    for texts in (asked, probe, again):
        plan.add(len(texts), len(texts), count_tokens(counter, texts))
    plan.notes.append(f"queries: {len(asked)} (one request each), 1 warm-up, {len(again)} timed searches "
                      "(eval.latency; eval.latency.sample=0 sends none)")
    router, chunk_set = session.retriever.router, session.chunk_set
    if router is not None:  # mode=router: the filter's threshold is calibrated on pseudo-queries (rag/retriever/routing.py)
        spans = [embedder.query_prefix + t for t in router.pseudo_queries_of(
            chunk_set.sources, lambda rows: [chunk_set.chunks[int(i)].text for i in rows])[1]]
        if spans:
            plan.add(batches(len(spans), embedder.batch_size), len(spans), count_tokens(counter, spans))
            plan.notes.append(f"the router's calibration: {len(spans)} pseudo-queries "
                              "(retriever.source_filter.router.pseudo_queries per group; min_precision=0 sends none)")
    return plan


def plan_rerank(session: Session, reranker: PointwiseReranker | ListwiseReranker, queries: list[str],
                first: Hits | None, timed: list[int]) -> tuple[RolePlan, Hits | None]:
    """The rerank role's plan, and the reranked top k when every question's scores are recorded
    (read from the cache, nothing sent); None when some would be asked for."""
    chunks, k = session.chunk_set.chunks, session.score.k
    counter = reranker.counter
    listwise = reranker if isinstance(reranker, ListwiseReranker) else None
    plan = RolePlan("rerank", *endpoint_of(reranker), items_are="windows" if listwise else "documents",
                    tokens_method=prompt_method(listwise.llm) if listwise else tokens_method(counter, "reranker.tokenizer"))
    if first is None:
        bound_rerank(session, reranker, plan, len(queries) + len(timed))
        return plan, None
    heads = [[int(i) for i in first.ids[q] if i >= 0][: reranker.top_n] for q in range(len(queries))]
    for q, query in enumerate(queries):
        if isinstance(reranker, ListwiseReranker):
            windows_to_ask(reranker, plan, query, heads[q], chunks, key_units=True)
        elif heads[q]:
            passages = [reranker.passage(chunks[i]) for i in heads[q]]
            if reranker.recorded_scores(query, passages) is not None:
                plan.cached += 1
            else:
                plan.add(1, len(passages), count_tokens(counter, passages, query),
                         key=reranker.scores_key(query, passages))
    main_pass_pending = pending(plan)
    for q in timed:  # timed searches rerank anew
        if isinstance(reranker, ListwiseReranker):
            windows_to_ask(reranker, plan, queries[q], heads[q], chunks, key_units=False)
        elif heads[q]:
            passages = [reranker.passage(chunks[i]) for i in heads[q]]
            plan.add(1, len(passages), count_tokens(counter, passages, queries[q]))
    plan.notes.append(f"{len(timed)} timed searches rerank again (eval.latency; eval.latency.sample=0 sends none)")
    if isinstance(reranker, ListwiseReranker) and main_pass_pending:
        plan.exact = False
        plan.notes.append("at most: a window answer that cannot be read ends its question's windows")
    if main_pass_pending:
        return plan, None
    return plan, rerank_each(reranker, queries, first, chunks, k)  # every score is recorded: read, not asked


def windows_to_ask(reranker: ListwiseReranker, plan: RolePlan, query: str, head: list[int], chunks: Sequence[Chunk],
                   key_units: bool) -> None:
    """A listwise question's windows, bottom to top, following recorded answers; from the first
    window not recorded on, every remaining window is counted (its passages as they stand, since
    the order an answer would give is unknown)."""
    ranked, asking = list(head), not key_units
    llm = reranker.llm
    for start, end in reranker.window_spans(len(ranked)):
        rows = ranked[start:end]
        passages = [reranker.passage(chunks[r]) for r in rows]
        if not asking:
            recorded = reranker.recorded_answer(query, passages)
            if recorded is not None:
                got, status = read_order(recorded, len(passages))
                plan.cached += 1
                if status != "ok":
                    return
                ranked[start:end] = [rows[i] for i in got]
            else:
                asking = True
        if asking:
            plan.add(1, 1, prompt_tokens(llm, query, passages), llm.max_tokens,
                     key=reranker._key(query, passages) if key_units else None)


def mean_chunk_chars(session: Session) -> float:
    texts = session.chunk_set.texts
    return float(np.mean([len(t) for t in texts])) if texts else 0.0


def bound_rerank(session: Session, reranker: PointwiseReranker | ListwiseReranker, plan: RolePlan, searches: int) -> None:
    """No candidates are known (a served embedder's queries decide them): every search reranks,
    each over top_n chunks of the corpus's mean length."""
    n_docs = min(reranker.top_n, len(session.chunk_set))
    mean = mean_chunk_chars(session)
    plan.exact = False
    if isinstance(reranker, ListwiseReranker):
        windows = len(reranker.window_spans(n_docs))
        per_window = min(reranker.window, n_docs) * min(mean, reranker.passage_chars) / CHARS_PER_TOKEN
        empty = prompt_tokens(reranker.llm, "", [])
        out = reranker.llm.max_tokens
        plan.add(searches * windows, searches * windows, int(searches * windows * (empty + per_window)),
                 searches * windows * out)
    else:
        plan.add(searches, searches * n_docs, int(searches * n_docs * mean / CHARS_PER_TOKEN))
    plan.tokens_method = (f"estimated: the candidates depend on the served embedder's answers; each search "
                          f"counted over {n_docs} passages of the corpus's mean length, characters / {CHARS_PER_TOKEN}")
    plan.notes.append(f"at most: {searches} searches (questions and timed searches), candidates not known")


def plan_generate(session: Session, generator: Generator, queries: list[str], hits: Hits | None, first: Hits | None,
                  answer_rows: list[int]) -> RolePlan:
    plan = RolePlan("generate", *endpoint_of(generator), items_are="answers")
    max_tokens = generator.max_tokens
    if hits is not None:  # the contexts are the run's own: answers in the cache are known
        contexts = session.context_builder.build(hits, session.chunk_set)
        contexts = [contexts[i] for i in answer_rows]
        counts, plan.tokens_method = generator.count_prompt_tokens(queries, contexts)
        if session.cache.available("answers", answers_key(generator, queries, contexts)):
            plan.cached = len(queries)
            return plan
        keys = answer_keys(generator.id, queries, contexts)
        for i, key in enumerate(keys):
            if generator.resumable and session.cache.get_record(RECORD_KIND, key) is not None:
                plan.cached += 1
            else:
                plan.add(1, 1, counts[i], max_tokens, key=key)
        return plan
    plan.exact = False
    if first is not None:  # contexts from the first stage's top k: the reranker's order is not known
        contexts = session.context_builder.build(first.top(session.score.k), session.chunk_set)
        counts, method = generator.count_prompt_tokens(queries, [contexts[i] for i in answer_rows])
        plan.tokens_method = f"estimated on the first stage's top k (the served reranker's order is not known); {method}"
    else:
        bare, method = generator.count_prompt_tokens(queries, [[] for _ in queries])
        extra = session.score.k * mean_chunk_chars(session) / CHARS_PER_TOKEN
        counts = [int(b + extra) for b in bare]
        plan.tokens_method = (f"estimated: the contexts depend on the served embedder's answers; each prompt "
                              f"{method.split(' (')[0]}, plus k chunks of the corpus's mean length / {CHARS_PER_TOKEN}")
    for c in counts:
        plan.add(1, 1, int(c), max_tokens)
    plan.notes.append("at most: answers already cached for the contexts the run will build are not sent")
    return plan


def plan_compress(session: Session, compressor: LLMCompressor, queries: list[str], hits: Hits | None,
                  answer_rows: list[int]) -> RolePlan:
    """compressor=llm through a served model: one request per context of each answered question,
    at most (excerpts already recorded are not sent); tokens counted on the contexts when they are
    known, else estimated from k chunks of the corpus's mean length."""
    llm = compressor.llm
    plan = RolePlan("compress", *endpoint_of(llm), items_are="contexts", exact=False)
    out = llm.max_tokens
    if hits is not None:
        contexts = session.context_builder.build(hits, session.chunk_set)
        for q, i in zip(queries, answer_rows):
            for c in contexts[i]:
                plan.add(1, 1, prompt_tokens(llm, q, [c]), out)
        plan.tokens_method = prompt_method(llm)
    else:
        k, mean = session.score.k, mean_chunk_chars(session)
        for q in queries:
            plan.add(k, k, int(k * (prompt_tokens(llm, q, []) + mean / CHARS_PER_TOKEN)), k * out)
        plan.tokens_method = f"estimated: k contexts of the corpus's mean length, characters / {CHARS_PER_TOKEN}"
    plan.notes.append("at most: excerpts already recorded for these contexts are not sent")
    return plan


def plan_judge(judge: Judge, answered: int) -> RolePlan:
    d = judge.describe()
    plan = RolePlan("judge", d["base_url"], d["model"], items_are="verdicts", exact=False,
                    tokens_method="not counted (the judge's prompts hold the answers, not generated in a dry run)")
    n = answered * len(judge.metrics) * judge.repeats
    plan.add(n, n, 0, 0)
    plan.notes.append(f"at most: {answered} answers x {list(judge.metrics)} x {judge.repeats} repeat(s); "
                      "verdicts already cached are not sent")
    return plan


def plan_relevance(session: Session, judge: RelevanceJudge, queries: list[str], hits: Hits | None) -> RolePlan:
    """eval.relevance=llm: a request per distinct (question, chunk) pair of the top k not yet
    recorded, keyed as the grade is recorded, so that a sweep's plan counts a shared pair once."""
    plan = RolePlan("relevance", *endpoint_of(judge), items_are="pairs", tokens_method=prompt_method(judge.llm))
    k = session.score.k
    if hits is None:  # the top k depend on a served embedder's or reranker's answers
        plan.exact = False
        bare, _ = judge.llm.count_prompt_tokens(queries, [[] for _ in queries])
        extra = int(mean_chunk_chars(session) / CHARS_PER_TOKEN)
        for b in bare:
            plan.add(k, k, k * (b + extra), k * judge.llm.max_tokens)
        plan.notes.append(f"at most: {k} chunks per question, estimated at the corpus's mean chunk length; "
                          "pairs already graded are not sent")
        return plan
    chunks, seen = session.chunk_set.chunks, set()
    for query, row in zip(queries, hits.top(k).ids):
        for r in row[row >= 0]:
            text = chunks[int(r)].text
            key = judge.key(query, text)
            if key in seen:
                continue
            seen.add(key)
            if session.cache.get_record(RELEVANCE_RECORD, key) is not None:
                plan.cached += 1
            else:
                plan.add(1, 1, prompt_tokens(judge.llm, query, [Context(text)]), judge.llm.max_tokens, key=key)
    return plan


# ---- a sweep's plan ----------------------------------------------------------------------------


def combine(plans: list[dict[str, Any]]) -> dict[str, Any]:
    """The plans of a sweep's jobs as one: each role's requests and tokens over the jobs, a cache
    unit that several jobs would fill counted once (the first job builds it, the rest read it)."""
    out: dict[str, Any] = {"jobs": len(plans), "roles": {}, "currency": next((p.get("currency") for p in plans), "USD")}
    for role in ROLES:
        mine = [p["roles"][role] for p in plans if role in p.get("roles", {})]
        if not mine:
            continue
        units: dict[str, list[int]] = {}
        other = [0, 0, 0, 0]
        for r in mine:
            units.update(r["units"])
            other = [a + b for a, b in zip(other, r["other"])]
        requests, items, tokens_in, tokens_out = [sum(col) for col in zip(other, *units.values())]
        price = mine[0]["price"]
        cost = (requests * price["request"] + tokens_in * price["input"] / 1e6 + tokens_out * price["output"] / 1e6)
        out["roles"][role] = {
            "jobs": len(mine), "requests": requests, "items": items, "items_are": mine[0]["items_are"],
            "input_tokens": tokens_in, "output_tokens_at_most": tokens_out, "exact": all(r["exact"] for r in mine),
            "shared_units": sum(len(r["units"]) for r in mine) - len(units), "cost": round(cost, 6),
            "endpoints": sorted({f"{r['base_url']} ({r['model']})" for r in mine}),
        }
    return out


# ---- printing ----------------------------------------------------------------------------------


def format_plan(plan: dict[str, Any]) -> str:
    """The lines a dry run prints (one run's plan, or a sweep's from `combine`)."""
    roles = plan.get("roles", {})
    total = sum(r["requests"] for r in roles.values())
    if "jobs" in plan:
        lines = [f"dry run (sweep of {plan['jobs']} job(s)): {total} request(s) would be sent; nothing was sent"]
    else:
        lines = [f"dry run: {total} request(s) would be sent for {plan['questions']} question(s) "
                 f"({plan['answered_questions']} answered); nothing was sent"]
    if not roles:
        lines.append("  no model role is served in this configuration: every model runs in process")
    for role, r in roles.items():
        at_most = "" if r["exact"] else "at most "
        where = r.get("endpoints") or [f"{r['base_url']} ({r['model']})"]
        cached = f", {r['cached']} cached" if r.get("cached") else ""
        shared = f", {r['shared_units']} shared between jobs counted once" if r.get("shared_units") else ""
        out = f", output at most {r['output_tokens_at_most']}" if r["output_tokens_at_most"] else ""
        cost = f", cost {r['cost']:.4f} {plan.get('currency', 'USD')}" if r["cost"] else ""
        counted = not str(r.get("tokens_method", "")).startswith("not counted")
        tokens = f"input tokens {r['input_tokens']}" if counted else "tokens not counted"
        lines.append(f"  {role:<8} {at_most}{r['requests']} request(s), {r['items']} {r['items_are']}{cached}{shared}; "
                     f"{tokens}{out}{cost}  [{', '.join(where)}]")
        if r.get("tokens_method") and counted:
            lines.append(f"           tokens {r['tokens_method']}")
        for note in r.get("notes", ()):
            lines.append(f"           {note}")
    if plan.get("bounded_after"):
        lines.append(f"  counts are exact through {plan['bounded_after']}; the roles after it depend on its answers "
                     "(upper bounds, estimated tokens)")
    return "\n".join(lines)


def write_sweep_plan(sweep_dir: Path) -> dict[str, Any] | None:
    """Combines the dry_run.json of every job under `sweep_dir` into the sweep's own (None: no
    job wrote one)."""
    from rag.run.rundir import belongs_to_sweep, read_sweep_stamp

    stamp = read_sweep_stamp(sweep_dir)
    plans = [json.loads(p.read_text()) for p in sorted(sweep_dir.glob(f"*/{PLAN_FILE}"))
             if stamp is None or belongs_to_sweep(p.parent, stamp)]  # not a job of an earlier sweep here
    if not plans:
        return None
    combined = combine(plans)
    atomic_write_text(sweep_dir / PLAN_FILE, json.dumps(combined, indent=2))
    return combined
