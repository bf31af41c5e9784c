"""One run: the same straight chain of stages for every configuration.

    open_session (check config, build components, corpus -> slice -> chunks -> vectors + index,
    BM25)  ->  rank (route, retrieve + fuse, rerank; latency sample)  ->  contexts  ->  answer
    ->  score (+ judge)  ->  write

A version preset (`+version=v2`) is only a set of config choices; nothing here asks which version
it is. Every cached artifact is built or loaded by rag.artifacts; the stage table is in
docs/architecture.md.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from eval.scoring import add_judge_scores, score
from rag import latency, plan
from rag.artifacts import Answers
from rag.corpus.slicing import Kept, answer_subset
from rag.llm.answer_cache import usage_totals
from rag.output import trec_files, write_report, write_results
from rag.query import retrieve_rerank_all
from rag.result import Objective, RunResult
from rag.retriever import SourceFilter
from rag.routing import routing_report
from rag.session import Session, open_session
from rag.settings import Pricing, Settings, load
from rag.types import Context, Hits

log = logging.getLogger(__name__)


@dataclass
class Ranked:
    """The rank stage's output: each question's filter, its top k, and the latency sample."""

    filters: list[SourceFilter]
    route_ms: np.ndarray | None  # per question, when the retriever routes
    hits: Hits
    latency_rows: np.ndarray  # the questions timed again after the main pass
    latency_ms: dict[str, np.ndarray]  # "retrieve" / "rerank" per timed question
    latency_method: dict[str, Any]


@dataclass
class Answered:
    """The answer stage's output, per question of the run (None / NaN outside the answered sample)."""

    answers: list[str | None] | None
    generate_ms: np.ndarray | None  # None when no answers, or when they came from the cache
    details: list[Any] | None  # token usage, finish reason, served model (llm=openai)
    made: Answers | None


def run(config: Settings | DictConfig, output_dir: str | Path) -> dict[str, Any]:
    """Runs the pipeline described by `config` (typed settings, or a composed config that is
    turned into them first) and writes results into `output_dir`. Returns the metrics document
    (also written as metrics.json)."""
    settings = config if isinstance(config, Settings) else load(config)
    output_dir = Path(output_dir)
    session = open_session(settings)
    answered = answer_subset(session.qa, settings.slice.answer_questions_per_corpus, settings.slice.seed)
    if settings.dry_run:
        return plan.dry_run(session, answered, output_dir)
    ranked = rank(session)
    contexts = session.context_builder.build(ranked.hits, session.chunk_set)
    contexts, compression = compress(session, answered, contexts)
    out = answer(session, answered, contexts)
    if out.made is not None:  # an answer sample matters only where answers are generated
        note_answered(session, answered)
    ranked.latency_method["generate"] = (
        "no answers" if out.made is None else "answers from the cache: not timed in this run"
        if out.generate_ms is None else "every question: its share of its batch's wall time")
    with session.timer.stage("score"):
        records, aggregates = score(
            session.qa, ranked.hits, session.chunk_set.chunks, session.eval_embedder, session.settings, out.answers,
            eval_chunk_vectors(session), context_texts=[[c.text for c in ctx] for ctx in contexts],
            memory=session.cache.memory, store=session.cache,
        )
    judge_stats = run_judge(session, records, aggregates, out.answers, contexts) if session.judge is not None else None
    add_details(records, ranked, out, contexts)
    result = assemble(session, ranked, out, aggregates, judge_stats, compression).to_json()
    write_results(output_dir, result, records, trec_files(result["variant"], records, session.qa))
    write_report(settings.report, output_dir)
    return result


def rank(session: Session) -> Ranked:
    """Route (when the retriever routes), then every question retrieved and reranked one at a
    time, then a sample of them timed again (rag.latency)."""
    timer, retriever, qa = session.timer, session.retriever, session.qa
    queries = [q.question for q in qa]
    route_ms = None
    if retriever.routes:
        with timer.stage("route"):
            filters, route_ms = retriever.route(queries)
    else:
        filters = retriever.filters_for([q.corpus for q in qa])
    hits, retrieve_ms, rerank_ms = retrieve_rerank_all(retriever, session.reranker, queries, filters, session.depth,
                                                       session.chunk_set.chunks, session.settings.k)
    timer.add("retrieve", retrieve_ms / 1000.0)
    timer.add("rerank", rerank_ms / 1000.0)
    with timer.stage("latency"):
        rows, ms, method = latency.measure(retriever, session.reranker, queries, filters, session.depth,
                                           session.chunk_set.chunks, session.settings.k, session.latency)
    return Ranked(filters, route_ms, hits, rows, ms, method)


def compress(session: Session, answered: list[int],
             contexts: list[list[Context]]) -> tuple[list[list[Context]], dict[str, Any] | None]:
    """The answered questions' contexts as the compressor shortens them (rag/compressor; the
    others are read by no LLM), and what it removed (None: compressor=none)."""
    if session.compressor.name == "none" or not answered:
        return contexts, None
    with session.timer.stage("load_models"):
        session.compressor.warm_up()
    with session.timer.stage("compress"):
        done = session.compressor.compress([session.qa[i].question for i in answered], [contexts[i] for i in answered])
    out = list(contexts)
    for j, i in enumerate(answered):
        out[i] = done.contexts[j]
    stats = {**done.stats, "fallbacks": [session.qa[answered[j]].id for j in done.stats["fallbacks"]]}
    return out, stats


def answer(session: Session, answered: list[int], contexts: list[list[Context]]) -> Answered:
    """Answers for the answered sample (every question unless slice.answer_questions_per_corpus
    samples them), through the answers artifact, placed among all the questions."""
    n = len(session.qa)
    made = session.artifacts.answers(session.generator, [session.qa[i].question for i in answered],
                                     [contexts[i] for i in answered])
    if made is None:
        return Answered(None, None, None, None)
    generate_ms = None if made.hit else np.asarray(spread(list(made.latency_ms), answered, n, np.nan), float)
    details = None if made.details is None else spread(made.details, answered, n)
    return Answered(spread(made.answers, answered, n), generate_ms, details, made)


def add_details(records: list[dict[str, Any]], ranked: Ranked, out: Answered, contexts: list[list[Context]]) -> None:
    """Per question: its latencies, routed group, generation details and the contexts it was given."""
    sampled = {int(q): j for j, q in enumerate(ranked.latency_rows)}
    for q, rec in enumerate(records):
        rec["latency_ms"] = ({s: round(float(ranked.latency_ms[s][sampled[q]]), 3) for s in ("retrieve", "rerank")}
                             if q in sampled else {})
        if out.generate_ms is not None and not np.isnan(out.generate_ms[q]):
            rec["latency_ms"]["generate"] = round(float(out.generate_ms[q]), 3)
        if ranked.route_ms is not None:
            rec["latency_ms"]["route"] = round(float(ranked.route_ms[q]), 3)
            rec["routed"] = sorted(ranked.filters[q])
        if out.details is not None and out.details[q] is not None:
            rec["generation"] = {**out.details[q], **({"from_earlier_run": True} if out.made.hit else {})}
        rec["contexts"] = [{"label": c.label, "text": c.text} for c in contexts[q]]


def assemble(session: Session, ranked: Ranked, out: Answered, aggregates: dict[str, Any],
             judge_stats: dict[str, Any] | None, compression: dict[str, Any] | None = None) -> RunResult:
    """The run's result (metrics.json)."""
    config, overall, retriever = session.config, aggregates["overall"], session.retriever
    routing = None
    if ranked.route_ms is not None:
        routing = {"method": retriever.router.method,
                   **routing_report(ranked.filters, [q.corpus for q in session.qa], retriever.source_filter.get("groups"))}
    return RunResult(
        variant=config.variant,
        objective=Objective(config.objective, overall[config.objective]["mean"]),
        metrics=overall,
        by_corpus=aggregates["by_corpus"],
        counts={
            "documents": len(session.docs),
            "documents_in_full_corpus": session.n_docs_total,
            "chunks": len(session.chunk_set),
            "questions": len(session.qa),
            "answered_questions": 0 if out.answers is None else sum(a is not None for a in out.answers),
            "skipped_inputs": len(session.skipped),
        },
        qa_split=config.qa_split,
        latency=latency_summary(ranked.latency_rows, ranked.latency_ms, out.generate_ms, ranked.route_ms),
        latency_method=ranked.latency_method,
        usage=usage_section(out.made, judge_stats, served_parts(session), config.pricing),
        timings_s=session.timer.as_dict(),
        artifacts=session.artifacts.record,
        config=config.resolved,
        routing=routing,
        compression=compression,
        slice={what: k.to_json() for what, k in session.kept.items()},
    )


def note_answered(session: Session, answered: list[int]) -> None:
    """The answered sample beside the slice's other samples (metrics.json `slice`), and said in
    one line when it leaves questions unanswered."""
    kept = Kept("answered questions", len(answered), len(session.qa), "slice.answer_questions_per_corpus",
                session.config.slice.answer_questions_per_corpus)
    session.kept["answered_questions"] = kept
    if kept.sampled:
        log.warning(kept.line())


def run_judge(session: Session, records: list[dict[str, Any]], aggregates: dict[str, Any],
              answers: list[str | None] | None, contexts: list[list[Context]]) -> dict[str, Any]:
    """eval.judge's metrics beside the others (eval/judge.py, eval.scoring.add_judge_scores), over
    the answered questions (all of them, unless slice.answer_questions_per_corpus samples them)."""
    from eval.judge import Item

    answered = [i for i, a in enumerate(answers or []) if a is not None]
    items = [Item(session.qa[i].question, answers[i], session.qa[i].answer, [c.text for c in contexts[i]])
             for i in answered]
    with session.timer.stage("judge"):
        judged = session.judge.judge(items, session.cache)
    add_judge_scores([records[i] for i in answered], aggregates, judged, session.settings)
    return {**session.judge.describe(), **judged["stats"]}


def pipeline_embedder(retriever: Any) -> Any:
    """The dense embedder a retriever searches with (None for BM25 alone)."""
    for r in (retriever, getattr(retriever, "dense", None)):
        if r is not None and getattr(r, "embedder", None) is not None:
            return r.embedder
    return None


def eval_chunk_vectors(session: Session) -> np.ndarray | None:
    """Cached chunk vectors the evaluation may use instead of encoding chunks: those made by the
    evaluation embedder itself, or the pipeline's when they are the same vectors (same reference
    computation within 1e-6 cosine, e.g. the fp32 ONNX export of the evaluation model)."""
    cache, artifacts, ev = session.cache, session.artifacts, session.eval_embedder
    if cache.lookup("vectors", artifacts.vectors_key(ev, indexed=False)) is not None:
        return artifacts.vectors(ev, indexed=False)
    emb = pipeline_embedder(session.retriever)
    same = emb is not None and getattr(emb, "reference_id", None) == getattr(ev, "reference_id", False)
    if same and cache.lookup("vectors", artifacts.vectors_key(emb, indexed=False)) is not None:
        return artifacts.vectors(emb, indexed=False)
    return None


def served_parts(session: Session) -> dict[str, Any]:
    """The components that called a server in this run, by role: embed (embedder=openai), rerank
    (reranker=http); generate and judge are counted by their own stages."""
    dense = session.retriever._dense_part()
    parts = {"embed": dense.embedder if dense is not None else None, "rerank": session.reranker}
    return {role: p for role, p in parts.items() if isinstance(getattr(p, "usage", None), dict)}


def usage_section(made: Answers | None, judge_stats: dict[str, Any] | None,
                  served: dict[str, Any] | None = None, pricing: Pricing | None = None) -> dict[str, Any] | None:
    """metrics.json's `usage` (None: no key): per model role that ran behind a server, the
    requests this run sent and their tokens (embed, rerank: what the server reported; generate:
    answers taken from the cache and the tokens the answers cost when they were generated; judge),
    and `cost`: what this run's own requests cost at `pricing` (answers and judgements from the
    cache cost nothing again)."""
    out: dict[str, Any] = {}
    for role, part in (served or {}).items():
        u = part.usage
        out[role] = {"requests_sent": u["requests"], **{k: (round(v, 3) if isinstance(v, float) else v)
                                                        for k, v in u.items() if k != "requests"}}
        tokens_in = u.get("prompt_tokens", u.get("tokens", 0))
        out[role]["cost"] = priced(pricing, role, u["requests"], tokens_in, u.get("completion_tokens", 0))
    if made is not None and made.details is not None:
        out["generate"] = {"requests_sent": made.requests, "answers_from_cache": made.resumed,
                           **usage_totals(made.details)}
        fresh = usage_totals([d for d in made.details if not d.get("from_earlier_run")]) if not made.hit else {}
        out["generate"]["cost"] = priced(pricing, "generate", made.requests, fresh.get("prompt_tokens", 0),
                                         fresh.get("completion_tokens", 0))
    if judge_stats is not None:
        out["judge"] = {**judge_stats, "cost": priced(pricing, "judge", judge_stats.get("requests_sent", 0),
                                                      judge_stats.get("sent_prompt_tokens", 0),
                                                      judge_stats.get("sent_completion_tokens", 0))}
    if out and pricing is not None:
        out["currency"] = pricing.currency
    return out or None


def priced(pricing: Pricing | None, role: str, requests: int, tokens_in: int, tokens_out: int) -> float:
    if pricing is None:
        return 0.0
    return round(pricing.price(role).cost(int(requests or 0), int(tokens_in or 0), int(tokens_out or 0)), 6)


def spread(values: list[Any], rows: list[int], n: int, fill: Any = None) -> list[Any]:
    """A length-n list with values[j] at rows[j] and `fill` elsewhere (a sample's results placed
    among all the questions)."""
    out = [fill] * n
    for j, i in enumerate(rows):
        out[i] = values[j]
    return out


def latency_summary(rows: np.ndarray, measured: dict[str, np.ndarray], generate_ms: np.ndarray | None,
                    route_ms: np.ndarray | None = None) -> dict[str, float]:
    """Median and 95th percentile per question and stage, in milliseconds: retrieve and rerank
    over the sampled questions, route and generate over every question they timed (generate: the
    answered ones), total over the sampled ones (answered ones, when answers cover a sample)."""
    stages = dict(measured)
    whole = {"route": route_ms, "generate": generate_ms}
    for name, ms in whole.items():
        if ms is not None:
            stages[name] = ms[rows]
    out = latency.summary(stages)
    for name, ms in whole.items():
        if ms is not None:
            out.update({k: v for k, v in latency.summary({name: ms}).items() if k.startswith(name)})
    return out
