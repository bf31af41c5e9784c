"""One run: the same stages in the same order for every configuration.

corpus -> slice -> chunks -> (vectors + index, BM25) -> retrieve (+ fuse) -> rerank -> generate
-> score -> write. A version preset (`+version=v2`) is only a set of config choices; nothing here
asks which version it is.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hydra.errors import InstantiationException
from hydra.utils import instantiate, to_absolute_path
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from eval.labels import LABEL_METRICS
from eval.scoring import ANSWER_METRICS, SIMILARITY_METRICS, ScoreSettings, add_judge_scores, score
from eval.trec import format_qrels, format_run
from rag import latency
from rag.artifacts import Artifacts, ChunkSet
from rag.cache import ArtifactCache, atomic_write_text, make_key
from rag.chunker.token import TokenChunker
from rag.context import ContextBuilder
from rag.documents import (
    answer_subset, check_questions, content_fingerprint, load_corpus, slice_documents, slice_questions,
)
from rag.llm import NoGenerator
from rag.llm.answer_cache import dry_run_plan, format_plan, generate_resumable, prompt_inputs, usage_totals
from rag.routing import routing_report
from rag.schema import validate
from rag.timing import StageTimer
from rag.types import Chunk, Context, Document, Hits, QAItem, RagError

log = logging.getLogger(__name__)

CHUNKS_FILE = "chunks.jsonl"


# Parsed inputs and chunk sets, kept per process: the jobs of a sweep that Hydra's basic launcher
# (or a benchmark) runs in one process read the same corpus, questions and chunks, and parsing
# them was most of a warm job's fixed cost. Keys are the inputs' fingerprints (file listings,
# sizes and mtimes, computed again by every job, so a changed file is read anew) and the chunk
# artifact's key; a few entries, least recently used first out.
_MEMO_ENTRIES = 4
_inputs_memo: OrderedDict[str, tuple[list[Document], list[str], list[QAItem]]] = OrderedDict()
_chunks_memo: OrderedDict[str, ChunkSet] = OrderedDict()


def _remember(memo: OrderedDict, key: str, value: Any) -> Any:
    memo[key] = value
    memo.move_to_end(key)
    while len(memo) > _MEMO_ENTRIES:
        memo.popitem(last=False)
    return value


def clear_memos() -> None:
    """Forget the per-process inputs and chunk sets (a benchmark's 'fresh process')."""
    _inputs_memo.clear()
    _chunks_memo.clear()


def load_inputs(corpus: Any, questions: Any, cache: ArtifactCache) -> tuple[list[Document], list[str], list[QAItem]]:
    """(all documents, skipped inputs, all questions), parsed once per process per fingerprint."""
    key = make_key("inputs", {"corpus": corpus.fingerprint(), "qa": questions.fingerprint(), "cache": str(cache.root)})
    if key in _inputs_memo:
        _inputs_memo.move_to_end(key)
        return _inputs_memo[key]
    docs, skipped = load_corpus(corpus, cache)
    qa = questions.load()
    check_questions(qa, docs)
    return _remember(_inputs_memo, key, (docs, skipped, qa))


def build_chunks(chunker: Any, chunker_cfg: dict[str, Any], docs: list[Document], cache: ArtifactCache) -> tuple[ChunkSet, bool]:
    corpus_fp = content_fingerprint(docs)
    key = make_key("chunks", chunker_cfg, {"corpus": corpus_fp})
    memo_key = f"{cache.root}\0{key}"
    if memo_key in _chunks_memo and cache.lookup("chunks", key) is not None:
        _chunks_memo.move_to_end(memo_key)
        return _chunks_memo[memo_key], True

    def build(tmp: Path) -> dict[str, Any]:
        n = 0
        with open(tmp / CHUNKS_FILE, "w", encoding="utf-8") as f:
            for doc in tqdm(docs, desc="chunking", unit="doc", mininterval=2.0, leave=False):
                for c in chunker.split(doc):
                    f.write(json.dumps(c.to_json(), ensure_ascii=False) + "\n")
                    n += 1
        if n == 0:
            raise RagError("chunker produced no chunks: every document is empty")
        return {"n_chunks": n}

    art = cache.get_or_build("chunks", key, build, inputs={"chunker": chunker_cfg, "corpus": corpus_fp})
    with open(art.file(CHUNKS_FILE), encoding="utf-8") as f:
        chunks = [Chunk.from_json(json.loads(line)) for line in f]
    return _remember(_chunks_memo, memo_key, ChunkSet(key, chunks)), art.hit


def build(node: Any) -> Any:
    """`hydra.utils.instantiate`, unwrapping our own one-line errors from Hydra's wrapper so that
    a bad config value reads as itself rather than as an instantiation traceback."""
    try:
        return instantiate(node, _convert_="all")
    except InstantiationException as e:
        cause = e.__cause__
        while cause is not None and not isinstance(cause, RagError):
            cause = cause.__cause__
        if cause is not None:
            raise cause from None
        raise


def _container(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


@dataclass
class Session:
    """A configured pipeline with its artifacts built or loaded: everything needed to answer
    questions. `run` evaluates a question set with it; `rag.ask` answers typed questions."""

    cfg: DictConfig
    cache: ArtifactCache
    timer: StageTimer
    settings: ScoreSettings
    qa: list[QAItem]
    docs: list[Document]
    n_docs_total: int
    skipped: list[str]
    chunk_set: ChunkSet
    artifacts: Artifacts
    retriever: Any
    reranker: Any
    generator: Any
    eval_embedder: Any
    context_builder: ContextBuilder
    latency: latency.LatencySettings
    judge: Any = None  # eval.judge.Judge when eval.judge.enabled

    @property
    def depth(self) -> int:
        """Candidates retrieved per question: k, or more when the reranker wants to see more."""
        return max(self.settings.k, int(getattr(self.reranker, "top_n", 0) or 0))


def open_session(cfg: DictConfig, askers: list[tuple[str, str | None, str | None]] = ()) -> Session:
    """`askers`: more (who, corpus tag, answer document) whose source filters are checked with the
    questions', before any model loads (rag.ask's --corpus)."""
    # Every value's type and range first: a bad one is one line naming it, before anything loads.
    validate(cfg)
    timer = StageTimer()
    # A relative cache path means the directory the command was started in, also for a job that
    # a launcher runs in another directory or on another node (Hydra carries that directory along).
    cache = ArtifactCache(to_absolute_path(str(cfg.paths.cache)))

    # Build every component first: a bad config value fails here, before any expensive stage.
    settings = ScoreSettings(
        k=cfg.eval.k,
        tau_recall=cfg.eval.tau_recall,
        tau_h=cfg.eval.tau_h,
        metrics=tuple(cfg.eval.metrics),
        bootstrap_resamples=cfg.eval.bootstrap.resamples,
        bootstrap_seed=cfg.eval.bootstrap.seed,
    )
    corpus = build(cfg.corpus)
    questions = build(cfg.qa)
    chunker = build(cfg.chunker)
    build(cfg.fusion)  # validated even when the retriever does not fuse, so a bad sweep value fails fast
    retriever = build(cfg.retriever)
    reranker = build(cfg.reranker)
    generator = build(cfg.llm)
    eval_embedder = build(cfg.eval.embedder)
    context_builder = ContextBuilder(**_container(cfg.context))
    latency_settings = latency.LatencySettings.from_config(_container(cfg.eval.get("latency")))
    check_objective(cfg.objective, settings, generator)
    judge = build_judge(cfg.eval.get("judge"), generator)
    if isinstance(chunker, TokenChunker):
        chunker.check_fits(str(cfg.embedder.model), cfg.embedder.get("max_seq_length"))

    with timer.stage("corpus"):
        all_docs, skipped, all_qa = load_inputs(corpus, questions, cache)
        qa = slice_questions(all_qa, cfg.slice.questions_per_corpus, cfg.slice.seed)
        check_objective_applies(cfg.objective, qa)
        docs = slice_documents(all_docs, qa, cfg.slice.docs_per_source, cfg.slice.seed)
        check_document_sizes(docs, cfg.max_doc_chars)
        retriever.check_filters([(f"question {q.id!r}", q.corpus, q.source) for q in qa] + list(askers), docs)

    with timer.stage("chunk"):
        chunk_set, chunks_hit = build_chunks(chunker, _container(cfg.chunker), docs, cache)
    log.info("%d documents -> %d chunks; %d questions", len(docs), len(chunk_set), len(qa))

    if settings.k > len(chunk_set):
        raise RagError(f"eval.k ({settings.k}) is larger than the number of chunks ({len(chunk_set)})")
    artifacts = Artifacts(cache, chunk_set, timer)
    artifacts.record["chunks"] = {"key": chunk_set.key, "hit": chunks_hit}
    retriever.prepare(artifacts)
    reranker.prepare(artifacts)
    with timer.stage("load_models"):
        retriever.warm_up()
        reranker.warm_up()
    session = Session(cfg, cache, timer, settings, qa, docs, len(all_docs), skipped, chunk_set, artifacts,
                      retriever, reranker, generator, eval_embedder, context_builder, latency_settings, judge)
    if session.depth > len(chunk_set):
        log.warning("retrieval depth %d exceeds the %d chunks; every chunk is a candidate", session.depth, len(chunk_set))
    return session


def build_judge(node: Any, generator: Any) -> Any:
    """The LLM judge of `eval.judge` (eval/judge.py), or None when it is not enabled."""
    if node is None or not node.get("enabled", False):
        return None
    if isinstance(generator, NoGenerator):
        raise RagError("eval.judge.enabled=true judges answers, but llm=none generates none")
    return build({k: v for k, v in _container(node).items() if k != "enabled"})


def check_objective(objective: str, settings: ScoreSettings, generator: Any) -> None:
    if objective not in settings.metrics:
        raise RagError(f"objective {objective!r} is not among the reported metrics {list(settings.metrics)}")
    if objective in ANSWER_METRICS and isinstance(generator, NoGenerator):
        raise RagError(f"objective {objective!r} needs generated answers, but llm=none")


def check_objective_applies(objective: str, qa: list[QAItem]) -> None:
    """A question set without answers (BEIR), sources or labels cannot score the metrics that
    need them; an objective among those would come back empty after all the work."""
    needs = {m: ("a ground-truth answer", lambda q: q.answer is not None) for m in SIMILARITY_METRICS + ANSWER_METRICS}
    needs.update({m: ("a source document", lambda q: q.source is not None) for m in ("hit_at_k_id", "mrr_id")})
    needs.update({m: ("a positive relevance label", lambda q: any(r.grade > 0 for r in q.labels)) for m in LABEL_METRICS})
    if objective in needs and not any(needs[objective][1](q) for q in qa):
        raise RagError(f"objective {objective!r} needs questions with {needs[objective][0]}, and no question has one; "
                       "choose another objective (e.g. objective=ndcg_at_k)")


def run(cfg: DictConfig, output_dir: str | Path) -> dict[str, Any]:
    """Runs the pipeline described by `cfg` and writes results into `output_dir`.
    Returns the metrics document (also written as metrics.json)."""
    output_dir = Path(output_dir)
    session = open_session(cfg)
    timer, settings, qa, chunk_set = session.timer, session.settings, session.qa, session.chunk_set
    retriever, reranker, artifacts, cache = session.retriever, session.reranker, session.artifacts, session.cache
    eval_embedder = session.eval_embedder
    k = settings.k
    queries = [q.question for q in qa]
    route_ms = None
    if retriever.routes:
        with timer.stage("route"):
            filters, route_ms = retriever.route(queries)
    else:
        filters = retriever.filters_for([q.corpus for q in qa])

    with timer.stage("retrieve"):
        fused = retriever.search_each(queries, session.depth, filters)
    with timer.stage("rerank"):
        hits, _ = rerank_timed(reranker, queries, fused, chunk_set.chunks, k)
    with timer.stage("latency"):
        lat_rows, lat_ms, lat_method = latency.measure(retriever, reranker, queries, filters, session.depth,
                                                       chunk_set.chunks, k, session.latency)

    contexts = session.context_builder.build(hits, chunk_set)
    answered = answer_subset(qa, cfg.slice.get("answer_questions_per_corpus"), cfg.slice.seed)
    if getattr(session.generator, "dry_run", False):
        return dry_run(session, [queries[i] for i in answered], [contexts[i] for i in answered], output_dir)
    sub_answers, sub_ms, gen_info = generate_cached(
        session.generator, [queries[i] for i in answered], [contexts[i] for i in answered], cache, timer
    )
    # Per question of the run: None (NaN) for the questions outside the answered sample.
    answers: list[str | None] | None = None
    generate_ms: np.ndarray | None = None
    details: list[Any] | None = None
    if sub_answers is not None:
        answers = spread(sub_answers, answered, len(qa))
        generate_ms = np.asarray(spread(list(sub_ms), answered, len(qa), np.nan), float)
    if gen_info is not None:
        artifacts.record["answers"] = {"key": gen_info["key"], "hit": gen_info["hit"]}
        if gen_info["hit"]:  # timed by the run that generated them, not by this one
            generate_ms = None
        if gen_info.get("details") is not None:
            details = spread(gen_info["details"], answered, len(qa))
    lat_method["generate"] = ("no answers" if gen_info is None else "answers from the cache: not timed in this run"
                              if generate_ms is None else "every question: its share of its batch's wall time")

    with timer.stage("score"):
        chunk_vectors = eval_chunk_vectors(session)
        records, aggregates = score(
            qa, hits, chunk_set.chunks, eval_embedder, settings, answers, chunk_vectors,
            context_texts=[[c.text for c in ctx] for ctx in contexts],
        )
    judge_stats = run_judge(session, records, aggregates, answers, contexts) if session.judge is not None else None
    sampled = {int(q): j for j, q in enumerate(lat_rows)}
    for q, rec in enumerate(records):
        rec["latency_ms"] = ({s: round(float(lat_ms[s][sampled[q]]), 3) for s in ("retrieve", "rerank")}
                             if q in sampled else {})
        if generate_ms is not None and not np.isnan(generate_ms[q]):
            rec["latency_ms"]["generate"] = round(float(generate_ms[q]), 3)
        if route_ms is not None:
            rec["latency_ms"]["route"] = round(float(route_ms[q]), 3)
            rec["routed"] = sorted(filters[q])
        if details is not None and details[q] is not None:  # token usage, finish reason, served model (llm=openai)
            rec["generation"] = {**details[q], **({"from_earlier_run": True} if gen_info["hit"] else {})}
        rec["contexts"] = [{"label": c.label, "text": c.text} for c in contexts[q]]

    objective_name = cfg.objective
    overall = aggregates["overall"]
    result = {
        "variant": cfg.get("variant", "custom"),
        "objective": {"name": objective_name, "value": overall[objective_name]["mean"]},
        "metrics": overall,
        "by_corpus": aggregates["by_corpus"],
        "counts": {
            "documents": len(session.docs),
            "documents_in_full_corpus": session.n_docs_total,
            "chunks": len(chunk_set),
            "questions": len(qa),
            "answered_questions": 0 if answers is None else len(answered),
            "skipped_inputs": len(session.skipped),
        },
        # which part of a split question set was scored (rag/qa.py QuestionSplit)
        "qa_split": _container(cfg.qa.get("split")),
        "latency": latency_summary(lat_rows, lat_ms, generate_ms, route_ms),
        "latency_method": lat_method,
        **usage_section(gen_info, judge_stats),
        "timings_s": timer.as_dict(),
        "artifacts": artifacts.record,
        "config": _container(cfg),
    }
    if route_ms is not None:
        result["routing"] = {"method": retriever.router.method,
                             **routing_report(filters, [q.corpus for q in qa], retriever.source_filter.get("groups"))}
    write_results(output_dir, result, records, trec_files(result["variant"], records, qa))
    write_report(cfg, output_dir)
    return result


def trec_files(tag: str, records: list[dict[str, Any]], qa: list[QAItem]) -> dict[str, str]:
    """run.trec and qrels.trec (eval.trec), or none when an id cannot be written in that format."""
    try:
        return {"run.trec": format_run(records, tag), "qrels.trec": format_qrels(qa)}
    except RagError as e:
        log.warning("no TREC run file: %s", e)
        return {}


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
    if cache.lookup("vectors", artifacts.vectors_key(ev)) is not None:
        return artifacts.vectors(ev)
    emb = pipeline_embedder(session.retriever)
    same = emb is not None and getattr(emb, "reference_id", None) == getattr(ev, "reference_id", False)
    if same and cache.lookup("vectors", artifacts.vectors_key(emb)) is not None:
        return artifacts.vectors(emb)
    return None


def write_report(cfg: DictConfig, output_dir: Path) -> None:
    """report.html next to metrics.json: after the results, so a report problem (logged by
    write_run_report, never raised) cannot cost them. `report.html=false` turns it off."""
    node = cfg.get("report")
    if node is not None and not node.get("html", True):
        return
    try:
        from experiments.html_report import write_run_report
    except Exception as e:  # noqa: BLE001 - e.g. jinja2 missing: the results stand without the page
        log.warning("report.html skipped (%s: %s)", type(e).__name__, e)
        return
    limit = node.get("max_context_chars") if node is not None else None
    path = write_run_report(output_dir, **({"max_context_chars": int(limit)} if limit else {}))
    if path is not None:
        log.info("report: %s", path)


def check_document_sizes(docs: list[Document], max_chars: int | None) -> None:
    """A single giant document (a 50 MB log pasted as one record) would silently dominate time
    and the index; it is far more often a mistake than a wish, so it stops the run up front."""
    if max_chars is None:
        return
    for d in docs:
        if len(d.text) > max_chars:
            raise RagError(
                f"document {d.id!r} is {len(d.text):,} characters, over max_doc_chars ({max_chars:,}); "
                "split it or raise max_doc_chars"
            )


def rerank_timed(reranker: Any, queries: list[str], fused: Hits, chunks: list[Chunk], k: int) -> tuple[Hits, np.ndarray]:
    """Reranks one question at a time, as a served system would, timing each."""
    out = Hits.empty(len(queries), k)
    ms = np.zeros(len(queries))
    for q, query in enumerate(queries):
        row = Hits(fused.ids[q : q + 1], fused.scores[q : q + 1])
        t0 = time.perf_counter()
        best = reranker.rerank([query], row, chunks, k)
        ms[q] = 1000.0 * (time.perf_counter() - t0)
        w = min(k, best.width)
        out.ids[q, :w], out.scores[q, :w] = best.ids[0, :w], best.scores[0, :w]
    return out, ms


def answers_key(generator: Any, queries: list[str], contexts: list[list[Context]]) -> str:
    h = hashlib.sha256()
    for query, ctx in zip(queries, contexts):
        h.update(prompt_inputs(query, ctx).encode())
    return make_key("answers", generator.id, {"inputs": h.hexdigest()})


def generate_cached(
    generator: Any, queries: list[str], contexts: list[list[Context]], cache: ArtifactCache, timer: StageTimer
) -> tuple[list[str] | None, np.ndarray | None, dict[str, Any] | None]:
    """Answers are cached under the generator's settings and the exact prompts' inputs, so a
    sweep that changes nothing upstream of generation (e.g. eval thresholds) reuses them, and any
    change in the contexts generates anew. A resumable generator's answers are also recorded one
    by one as they arrive (rag.llm.answer_cache), so a run that fails mid-way resumes.
    Returns (answers, per-question ms, info: key, hit, requests sent, per-answer details)."""
    if isinstance(generator, NoGenerator):
        return None, None, None
    key = answers_key(generator, queries, contexts)

    def build(tmp: Path) -> dict[str, Any]:
        t0 = time.perf_counter()
        details, counts = None, {}
        if getattr(generator, "resumable", False):
            details, counts = generate_resumable(generator, queries, contexts, cache, timer)
            answers = [d.pop("answer") for d in details]
        else:
            with timer.stage("load_models"):
                generator.warm_up()
            t0 = time.perf_counter()
            with timer.stage("generate"):
                answers = generator.generate(queries, contexts)
        seconds = time.perf_counter() - t0
        if answers is None or len(answers) != len(queries):
            raise RagError(f"llm {type(generator).__name__} returned {0 if answers is None else len(answers)} answers for {len(queries)} questions")
        empty = sum(1 for a in answers if not a.strip())
        if empty:
            log.warning("llm returned %d empty answer(s); they are scored as empty strings", empty)
        # Generation runs in batches: each question is charged its batch's share of the time.
        if details is not None:  # requests: each its own wall time
            per_q = [d.pop("latency_ms") for d in details]
        else:
            per_q = getattr(generator, "last_latencies_ms", None) or [1000.0 * seconds / len(queries)] * len(queries)
        payload = {"answers": answers, "latency_ms": list(per_q), **({"details": details} if details is not None else {})}
        (tmp / "answers.json").write_text(json.dumps(payload, ensure_ascii=False))
        usage = {"usage": usage_totals(details)} if details is not None else {}
        return {"n": len(answers), "empty": empty, "seconds": round(seconds, 3), **counts, **usage}

    art = cache.get_or_build("answers", key, build, inputs={"generator": generator.id})
    data = json.loads(art.file("answers.json").read_text())
    info = {"key": key, "hit": art.hit, "details": data.get("details"),
            "requests": 0 if art.hit else int(art.manifest.get("requests", 0)),
            "resumed": len(queries) if art.hit else int(art.manifest.get("resumed", 0))}
    return data["answers"], np.asarray(data["latency_ms"], float), info


def usage_section(gen_info: dict[str, Any] | None, judge_stats: dict[str, Any] | None) -> dict[str, Any]:
    """metrics.json's `usage`: requests this run sent, answers taken from the cache, and the
    tokens the answers cost when they were generated (llm=openai; and the judge's)."""
    out: dict[str, Any] = {}
    if gen_info is not None and gen_info.get("details") is not None:
        out["generate"] = {"requests_sent": gen_info["requests"], "answers_from_cache": gen_info["resumed"],
                           **usage_totals(gen_info["details"])}
    if judge_stats is not None:
        out["judge"] = judge_stats
    return {"usage": out} if out else {}


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


def dry_run(session: Session, queries: list[str], contexts: list[list[Context]], output_dir: Path) -> dict[str, Any]:
    """`llm.dry_run=true`: what generating would send (requests, prompt tokens), written to
    dry_run.json; no request is sent and no metrics are written."""
    generator = session.generator
    plan = dry_run_plan(generator, queries, contexts, session.cache, answers_key(generator, queries, contexts))
    if session.judge is not None:
        plan["judge"] = {**session.judge.describe(),
                         "requests_at_most": len(queries) * len(session.judge.metrics) * session.judge.repeats}
    output_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(output_dir / "dry_run.json", json.dumps(plan, indent=2))
    return {"dry_run": plan}


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


def write_results(
    output_dir: Path, result: dict[str, Any], records: list[dict[str, Any]], extra: dict[str, str] | None = None
) -> None:
    """Results are written whole or not at all: each file to a temporary name and renamed,
    metrics.json last (its presence marks a finished run), and if anything fails or is interrupted
    (Ctrl-C) on the way, the files already written by this call are removed again. `extra`: more
    files (name -> text), written first."""
    output_dir.mkdir(parents=True, exist_ok=True)
    files = {
        **(extra or {}),
        "per_question.jsonl": "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
        "config_resolved.yaml": OmegaConf.to_yaml(OmegaConf.create(result["config"])),
        "metrics.json": json.dumps(result, indent=2, default=_json_default),
    }
    written: list[Path] = []
    try:
        for name, text in files.items():
            atomic_write_text(output_dir / name, text)
            written.append(output_dir / name)
    except BaseException:
        for p in written:
            p.unlink(missing_ok=True)
        raise


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    return str(o)


def judged_note(o: dict[str, Any]) -> str:
    """Beside a judge metric: how many questions went unmeasured, and the repeats' agreement."""
    if "unmeasured" not in o:
        return ""
    note = f"  unmeasured {o['unmeasured']}/{o['n'] + o['unmeasured']} questions, {o['judgements_unmeasured']}/{o['judgements']} judgements"
    if o.get("agreement") is not None:
        note += f"; agreement {o['agreement']:.2f} (n={o['agreement_n']})"
    return note


def format_table(result: dict[str, Any]) -> str:
    """A short plain-text table of the run's metrics (overall and per question corpus)."""
    if "dry_run" in result:
        return format_plan(result["dry_run"])
    metrics = list(result["metrics"])
    corpora = list(result["by_corpus"])
    header = f"{'metric':<18}{'all':>22}" + "".join(f"{c:>12}" for c in corpora)
    lines = [f"variant {result['variant']}: {result['counts']['questions']} questions, "
             f"{result['counts']['documents']} documents, {result['counts']['chunks']} chunks", header]
    for m in metrics:
        o = result["metrics"][m]
        cell = "unmeasured" if o["mean"] is None else f"{o['mean']:.3f} [{o['ci95'][0]:.3f},{o['ci95'][1]:.3f}]"
        per = "".join(
            f"{result['by_corpus'][c][m]['mean']:>12.3f}" if result["by_corpus"][c].get(m, {}).get("mean") is not None
            else f"{'-':>12}" for c in corpora
        )
        lines.append(f"{m:<18}{cell:>22}{per}" + judged_note(o))
    t = result["timings_s"]
    lines.append("stage seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in t.items()))
    return "\n".join(lines)
