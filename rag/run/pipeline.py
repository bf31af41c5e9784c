"""One run: the same straight chain of stages for every configuration.

    open_session (check config, build components, corpus -> slice -> chunks -> vectors + index,
    BM25)  ->  rank (route, retrieve + fuse, rerank; latency sample)  ->  contexts  ->  answer
    ->  score (+ judge)  ->  write

A version preset (`+version=v2`) is only a set of config choices; nothing here asks which version
it is. Every cached artifact is built or loaded by rag.run.artifacts; the stage table is in
docs/explanation/architecture.md.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
from omegaconf import DictConfig

from eval.judge import Item, Judge
from eval.record import Generation, GivenContext, QuestionLatency, QuestionRecord
from eval.relevance import SOURCE, question_labels
from eval.scoring import JudgedLabels, add_judge_scores, score
from rag.run import latency
from rag.run import plan
from rag.run.artifacts import Answers
from rag.chunker.router import RoutedChunker
from rag.corpus.slicing import Kept, answer_subset
from rag.embedder.base import Embedder
from rag.llm.answer_cache import usage_totals
from rag.run.fitted import ablation_command, chunker_part, reranker_part, router_part, run_overrides, section
from rag.run.output import trec_files, write_report, write_results
from rag.run.provenance import add_passage_texts, run_provenance
from rag.run.query import retrieve_rerank_all, unfiltered_candidates
from rag.reranker.base import Reranker
from rag.run.result import Objective, RunResult
from rag.retriever.base import Retriever
from rag.retriever.routing import Route, lost_recall, routing_report
from rag.retriever.source_filter import SourceFilter
from rag.run.session import Session, open_session, sample_level
from rag.run.settings import Pricing, Settings, load
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
    routes: list[Route] | None = None  # per question, when the retriever routes
    lost: dict[str, int] | None = None  # the recall routing lost (rag.retriever.routing.lost_recall)


@dataclass
class PlacedAnswers:
    """The answer stage's output, placed among all the questions of the run (None / NaN outside
    the answer sample)."""

    answers: list[str | None] | None
    generate_ms: np.ndarray | None  # None when no answers, or when they came from the cache
    details: list[Any] | None  # token usage, finish reason, served model (llm=openai)
    artifact: Answers | None  # the answers artifact they came from (None: llm=none)


def run(config: Settings | DictConfig, output_dir: str | Path) -> dict[str, Any]:
    """Runs the pipeline described by `config` (typed settings, or a composed config that is
    turned into them first) and writes results into `output_dir`. Returns the metrics document
    (also written as metrics.json)."""
    settings = config if isinstance(config, Settings) else load(config)
    output_dir = Path(output_dir)
    session = open_session(settings)
    answer_rows = answer_subset(session.qa, settings.slice.answer_questions_per_corpus, settings.slice.seed)
    if settings.dry_run:
        return plan.dry_run(session, answer_rows, output_dir)
    ranked = rank(session)
    contexts = session.context_builder.build(ranked.hits, session.chunk_set)
    contexts, compression = compress(session, answer_rows, contexts)
    placed = generate_answers(session, answer_rows, contexts)
    if placed.artifact is not None:  # an answer sample matters only where answers are generated
        note_answer_sample(session, answer_rows)
        note_stopped_answers(placed.artifact)
    ranked.latency_method["generate"] = generate_latency_method(placed)
    judged, labels_from = judge_relevance(session, ranked.hits)
    with session.timer.stage("score"):
        records, aggregates = score(
            session.qa, ranked.hits, session.chunk_set.chunks, session.eval_embedder, session.score, placed.answers,
            eval_chunk_vectors(session), context_texts=[[c.text for c in ctx] for ctx in contexts],
            memory=session.cache.memory, store=session.cache, judged=judged,
        )
    judge_stats = None
    if session.judge is not None:
        judge_stats = run_judge(session, session.judge, records, aggregates, placed.answers, contexts)
    add_details(records, ranked, placed, contexts)
    add_passage_texts(records, session.docs)
    result = assemble(session, ranked, placed, aggregates, judge_stats, compression, labels_from,
                      fitted_section(session, output_dir)).to_json()
    lines = [r.to_json() for r in records]
    write_results(output_dir, result, lines,
                  trec_files(result["variant"], lines, session.qa, None if judged is None else judged.labels))
    write_report(settings.report, output_dir)
    return result


def rank(session: Session) -> Ranked:
    """Route (when the retriever routes), then every question retrieved and reranked one at a
    time, then a sample of them timed again (rag.run.latency)."""
    timer, retriever, qa = session.timer, session.retriever, session.qa
    queries = [q.question for q in qa]
    route_ms, routes, unfiltered = None, None, {}
    if retriever.routes:
        with timer.stage("route"):
            routes, route_ms = retriever.routes_of(queries)
        filters = [r.filter for r in routes]
        with timer.stage("route_check"):
            unfiltered = unfiltered_candidates(retriever, queries, filters, session.depth)
    else:
        filters = retriever.filters_for([q.corpus for q in qa])
    hits, retrieve_ms, rerank_ms = retrieve_rerank_all(retriever, session.reranker, queries, filters, session.depth,
                                                       session.chunk_set.chunks, session.score.k)
    timer.add("retrieve", retrieve_ms / 1000.0)
    timer.add("rerank", rerank_ms / 1000.0)
    with timer.stage("latency"):
        rows, ms, method = latency.measure(retriever, session.reranker, queries, filters, session.depth,
                                           session.chunk_set.chunks, session.score.k, session.latency)
    lost = None
    if routes is not None:
        with timer.stage("route_check"):
            lost = routing_loss(session, queries, filters, unfiltered)
    return Ranked(filters, route_ms, hits, rows, ms, method, routes, lost)


def routing_loss(session: Session, queries: list[str], filters: list[SourceFilter],
                 unfiltered: dict[int, Hits]) -> dict[str, int]:
    """The filtered questions whose answer's document the unfiltered search had among its
    candidates and the filtered one did not (and the other way round). The filtered candidates are
    the ones the run just searched, kept in memory."""
    chunks, retriever, depth = session.chunk_set.chunks, session.retriever, session.depth

    def docs(hits: Hits) -> set[str]:
        return {chunks[int(i)].doc_id for i in hits.ids[0] if i >= 0}

    rows = sorted(unfiltered)
    answers = [{r.doc for r in session.qa[q].labels if r.grade > 0} for q in rows]
    return lost_recall(answers, [docs(retriever.search_one(queries[q], depth, filters[q])) for q in rows],
                       [docs(unfiltered[q]) for q in rows])


def compress(session: Session, answer_rows: list[int],
             contexts: list[list[Context]]) -> tuple[list[list[Context]], dict[str, Any] | None]:
    """The answer sample's contexts as the compressor shortens them (rag/compressor; the
    others are read by no LLM), and what it removed (None: compressor=none)."""
    if session.compressor.name == "none" or not answer_rows:
        return contexts, None
    with session.timer.stage("load_models"):
        session.compressor.warm_up()
    with session.timer.stage("compress"):
        done = session.compressor.compress([session.qa[i].question for i in answer_rows],
                                           [contexts[i] for i in answer_rows])
    out = list(contexts)
    for j, i in enumerate(answer_rows):
        out[i] = done.contexts[j]
    stats = {**done.stats, "fallbacks": [session.qa[answer_rows[j]].id for j in done.stats["fallbacks"]]}
    return out, stats


def generate_answers(session: Session, answer_rows: list[int], contexts: list[list[Context]]) -> PlacedAnswers:
    """Answers for the answer sample (every question unless slice.answer_questions_per_corpus
    samples them), through the answers artifact, placed among all the questions."""
    n = len(session.qa)
    artifact = session.artifacts.answers(session.generator, [session.qa[i].question for i in answer_rows],
                                         [contexts[i] for i in answer_rows])
    if artifact is None:
        return PlacedAnswers(None, None, None, None)
    generate_ms = None
    if not artifact.hit:
        generate_ms = np.asarray(spread(list(artifact.latency_ms), answer_rows, n, np.nan), float)
    details = None if artifact.details is None else spread(artifact.details, answer_rows, n)
    return PlacedAnswers(spread(artifact.answers, answer_rows, n), generate_ms, details, artifact)


def generate_latency_method(placed: PlacedAnswers) -> str:
    """How the generate stage's latency was measured (metrics.json `latency_method`)."""
    if placed.artifact is None:
        return "no answers"
    if placed.generate_ms is None:
        return "answers from the cache: not timed in this run"
    return "every question: its share of its batch's wall time"


def add_details(records: list[QuestionRecord], ranked: Ranked, placed: PlacedAnswers, contexts: list[list[Context]]) -> None:
    """Per question: its latencies, routed group, generation details and the contexts it was given."""
    sampled = {int(q): j for j, q in enumerate(ranked.latency_rows)}
    whole_hit = placed.artifact is not None and placed.artifact.hit  # every answer from an earlier run's artifact
    for q, rec in enumerate(records):
        lat = rec.latency_ms = QuestionLatency()
        if q in sampled:
            lat.retrieve = round(float(ranked.latency_ms["retrieve"][sampled[q]]), 3)
            lat.rerank = round(float(ranked.latency_ms["rerank"][sampled[q]]), 3)
        if placed.generate_ms is not None and not np.isnan(placed.generate_ms[q]):
            lat.generate = round(float(placed.generate_ms[q]), 3)
        if ranked.route_ms is not None:
            lat.route = round(float(ranked.route_ms[q]), 3)
        if ranked.routes is not None:
            route = ranked.routes[q]
            rec.routed, rec.route_margin, rec.route_filtered = sorted(route.group), route.margin, route.filtered
        if placed.details is not None and placed.details[q] is not None:
            rec.generation = Generation.from_json({**placed.details[q], **({"from_earlier_run": True} if whole_hit else {})})
        rec.contexts = [GivenContext(c.label, c.text) for c in contexts[q]]


def assemble(session: Session, ranked: Ranked, placed: PlacedAnswers, aggregates: dict[str, Any],
             judge_stats: dict[str, Any] | None, compression: dict[str, Any] | None = None,
             labels: dict[str, Any] | None = None, fitted: dict[str, Any] | None = None) -> RunResult:
    """The run's result (metrics.json). `labels`: where the relevance labels came from (metrics.json
    `provenance.labels`; None: the question file's). `fitted`: the parts fitted on other corpora
    (fitted_section)."""
    settings, overall, router = session.settings, aggregates["overall"], session.retriever.router
    routing = None
    if ranked.route_ms is not None and router is not None:
        routing = {"method": router.method,
                   **routing_report(ranked.routes or [], [q.corpus for q in session.qa],
                                    session.retriever.source_filter.get("groups"), router.calibration,
                                    ranked.lost, session.depth)}
    return RunResult(
        variant=settings.variant,
        objective=Objective(settings.objective, overall[settings.objective]["mean"]),
        metrics=overall,
        by_corpus=aggregates["by_corpus"],
        counts={
            "documents": len(session.docs),
            "documents_in_full_corpus": session.n_docs_total,
            "chunks": len(session.chunk_set),
            "questions": len(session.qa),
            "answered_questions": 0 if placed.answers is None else sum(a is not None for a in placed.answers),
            "skipped_inputs": len(session.skipped),
        },
        qa_split=settings.qa_split,
        latency=latency_summary(ranked.latency_rows, ranked.latency_ms, placed.generate_ms, ranked.route_ms),
        latency_method=ranked.latency_method,
        usage=usage_section(placed.artifact, judge_stats, served_usage(session), settings.pricing),
        timings_s=session.timer.as_dict(),
        artifacts=session.artifacts.record,
        config=settings.resolved,
        routing=routing,
        compression=compression,
        slice={what: k.to_json() for what, k in session.kept.items()},
        provenance=run_provenance(session.qa, labels),
        fitted=fitted,
        stopped_answers=None if placed.artifact is None or placed.artifact.stopped is None
        else placed.artifact.stopped.to_json(),
        backends=backends_section(session),
    )


def fitted_section(session: Session, output_dir: str | Path) -> dict[str, Any] | None:
    """metrics.json `fitted` (rag.run.fitted): the run's fitted parts, each against the run's corpus,
    when some part was fitted on another corpus; None otherwise."""
    config = session.settings.resolved
    tags = {str(t) for t in np.unique(session.chunk_set.sources)}
    parts: dict[str, dict[str, Any]] = {}
    if session.reranker.fitted_on:
        parts["reranker"] = reranker_part(session.reranker.fitted_on, session.all_docs)
    source_filter = (config.get("retriever") or {}).get("source_filter") or {}
    if source_filter.get("mode") == "router":
        vectors = session.artifacts.record.get("vectors") or {}
        parts["router"] = router_part(source_filter.get("groups"), tags, vectors.get("key"))
    if isinstance(session.parts.chunker, RoutedChunker):
        parts["chunker"] = chunker_part(session.parts.chunker.routes, tags)
    flagged = [name for name, p in parts.items() if not p["this_corpus"]]
    command = ablation_command(session.settings.variant, flagged, run_overrides(output_dir), config)
    return section(session.parts.corpus.title(), session.n_docs_total, parts, command)


def note_stopped_answers(answers: Answers) -> None:
    """Answers cut off at the token limit, said in one line by every run that scores them (also
    from the cache): they score as worse answers, and the remedy is a setting."""
    if answers.stopped is not None and answers.stopped.stopped:
        log.warning("llm: %s; a longer limit lets them finish", answers.stopped.line())


def note_answer_sample(session: Session, answer_rows: list[int]) -> None:
    """The answer sample beside the slice's other samples (metrics.json `slice`), and said in
    one line when it leaves questions unanswered."""
    kept = Kept("answered questions", len(answer_rows), len(session.qa), "slice.answer_questions_per_corpus",
                session.settings.slice.answer_questions_per_corpus)
    session.kept["answered_questions"] = kept
    if kept.sampled:
        log.log(sample_level(session.settings, kept), kept.line())


def judge_relevance(session: Session, hits: Hits) -> tuple[JudgedLabels | None, dict[str, Any]]:
    """eval.relevance=llm: the judge's grade of every question's top-k chunks and the labels they
    make (eval/relevance.py), with what metrics.json's provenance says of them; (None, the
    question set's) otherwise."""
    judge = session.relevance_judge
    if judge is None:
        return None, {"source": "qa"}
    chunks = session.chunk_set.chunks
    ranked = [[chunks[int(r)] for r in row if r >= 0] for row in hits.top(session.score.k).ids]
    with session.timer.stage("relevance"):
        graded = judge.grade([q.question for q in session.qa], ranked, session.cache)
    labels = question_labels(ranked, graded.per_question, judge.relevant_from)
    if graded.unjudged:
        log.warning("eval.relevance=llm: %d of %d (question, chunk) pairs got no grade from the judge (unjudged)",
                    graded.unjudged, graded.pairs)
    return JudgedLabels(labels, graded.per_question), {
        "source": SOURCE, **judge.describe(), "pairs": graded.pairs, "asked": graded.asked,
        "unjudged": graded.unjudged, "pooled_runs": 1}


def run_judge(session: Session, judge: Judge, records: list[QuestionRecord], aggregates: dict[str, Any],
              answers: list[str | None] | None, contexts: list[list[Context]]) -> dict[str, Any]:
    """eval.judge's metrics beside the others (eval/judge.py, eval.scoring.add_judge_scores), over
    the answered questions (all of them, unless slice.answer_questions_per_corpus samples them)."""
    rows: list[int] = []
    items: list[Item] = []
    for i, answer in enumerate(answers or []):
        if answer is not None:
            q = session.qa[i]
            # a question without a reference answer (BEIR's) fails in the judge, which reads it
            rows.append(i)
            items.append(Item(q.question, answer, cast(str, q.answer), [c.text for c in contexts[i]]))
    with session.timer.stage("judge"):
        judged = judge.judge(items, session.cache)
    add_judge_scores([records[i] for i in rows], aggregates, judged, session.score)
    return {**judge.describe(), **judged["stats"]}


def backends_section(session: Session) -> dict[str, Any] | None:
    """metrics.json `backends`: which backend computed each local embedder role's vectors and the
    cross-encoder's logits, and why (`backend: auto` measures them: rag/embedder/backend_choice.py,
    rag/reranker/backend_choice.py), each also said in the log;
    None when no role has a choice of backend."""
    roles = {"embedder": pipeline_embedder(session.retriever), "eval.embedder": session.eval_embedder,
             "reranker": session.reranker}
    out = {}
    for role, part in roles.items():
        note = getattr(part, "backend_note", None) if part is not None else None
        if note is not None:
            log.info("%s: %s", role, note["line"])
            out[role] = note
    return out or None


def pipeline_embedder(retriever: Retriever) -> Embedder | None:
    """The dense embedder a retriever searches with (None for BM25 alone)."""
    dense = retriever.dense_part()
    return dense.embedder if dense is not None else None


def eval_chunk_vectors(session: Session) -> np.ndarray | None:
    """Cached chunk vectors the evaluation may use instead of encoding chunks: those made by the
    evaluation embedder itself, or the pipeline's when they are the same vectors (same reference
    computation within 1e-6 cosine, e.g. the fp32 ONNX export of the evaluation model)."""
    cache, artifacts, ev = session.cache, session.artifacts, session.eval_embedder
    if cache.lookup("vectors", artifacts.vectors_key(ev, indexed=False)) is not None:
        return artifacts.vectors(ev, indexed=False)
    emb = pipeline_embedder(session.retriever)
    if emb is None or emb.reference_id != ev.reference_id:
        return None
    if cache.lookup("vectors", artifacts.vectors_key(emb, indexed=False)) is not None:
        return artifacts.vectors(emb, indexed=False)
    return None


def served_usage(session: Session) -> dict[str, dict[str, Any]]:
    """What the components that count their requests sent in this run, by role: embed
    (embedder=openai), rerank (reranker=http, llm_listwise); generate and judge are counted by
    their own stages."""
    parts: dict[str, Embedder | Reranker | None] = {"embed": pipeline_embedder(session.retriever),
                                                    "rerank": session.reranker}
    return {role: p.usage for role, p in parts.items() if p is not None and p.usage is not None}


def usage_section(artifact: Answers | None, judge_stats: dict[str, Any] | None,
                  served: dict[str, dict[str, Any]] | None = None, pricing: Pricing | None = None) -> dict[str, Any] | None:
    """metrics.json's `usage` (None: no key): per model role that ran behind a server, the
    requests this run sent and their tokens (embed, rerank: what the server reported; generate:
    answers taken from the cache and the tokens the answers cost when they were generated; judge),
    and `cost`: what this run's own requests cost at `pricing` (answers and judgements from the
    cache cost nothing again)."""
    out: dict[str, Any] = {}
    for role, u in (served or {}).items():
        out[role] = {"requests_sent": u["requests"], **{k: (round(v, 3) if isinstance(v, float) else v)
                                                        for k, v in u.items() if k != "requests"}}
        tokens_in = u.get("prompt_tokens", u.get("tokens", 0))
        out[role]["cost"] = priced(pricing, role, u["requests"], tokens_in, u.get("completion_tokens", 0))
    if artifact is not None and artifact.details is not None:
        out["generate"] = {"requests_sent": artifact.requests, "answers_from_cache": artifact.resumed,
                           **usage_totals(artifact.details)}
        fresh = usage_totals([d for d in artifact.details if not d.get("from_earlier_run")]) if not artifact.hit else {}
        out["generate"]["cost"] = priced(pricing, "generate", artifact.requests, fresh.get("prompt_tokens", 0),
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
