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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hydra.errors import InstantiationException
from hydra.utils import instantiate, to_absolute_path
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from eval.scoring import ANSWER_METRICS, ScoreSettings, score
from rag.artifacts import Artifacts, ChunkSet
from rag.cache import ArtifactCache, atomic_write_text, make_key
from rag.context import ContextBuilder
from rag.documents import (
    answer_subset, check_questions, content_fingerprint, load_corpus, slice_documents, slice_questions,
)
from rag.generation import NoGenerator
from rag.timing import StageTimer
from rag.types import Chunk, Context, Document, Hits, QAItem, RagError

log = logging.getLogger(__name__)

CHUNKS_FILE = "chunks.jsonl"


def build_chunks(chunker: Any, chunker_cfg: dict[str, Any], docs: list[Document], cache: ArtifactCache) -> tuple[ChunkSet, bool]:
    corpus_fp = content_fingerprint(docs)
    key = make_key("chunks", chunker_cfg, {"corpus": corpus_fp})

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
    return ChunkSet(key, chunks), art.hit


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

    @property
    def depth(self) -> int:
        """Candidates retrieved per question: k, or more when the reranker wants to see more."""
        return max(self.settings.k, int(getattr(self.reranker, "top_n", 0) or 0))


def open_session(cfg: DictConfig) -> Session:
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
    check_objective(cfg.objective, settings, generator)

    with timer.stage("corpus"):
        all_docs, skipped = load_corpus(corpus, cache)
        all_qa = questions.load()
        check_questions(all_qa, all_docs)
        qa = slice_questions(all_qa, cfg.slice.questions_per_corpus, cfg.slice.seed)
        docs = slice_documents(all_docs, qa, cfg.slice.docs_per_source, cfg.slice.seed)
        check_document_sizes(docs, cfg.max_doc_chars)

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
                      retriever, reranker, generator, eval_embedder, context_builder)
    if session.depth > len(chunk_set):
        log.warning("retrieval depth %d exceeds the %d chunks; every chunk is a candidate", session.depth, len(chunk_set))
    return session


def check_objective(objective: str, settings: ScoreSettings, generator: Any) -> None:
    if objective not in settings.metrics:
        raise RagError(f"objective {objective!r} is not among the reported metrics {list(settings.metrics)}")
    if objective in ANSWER_METRICS and isinstance(generator, NoGenerator):
        raise RagError(f"objective {objective!r} needs generated answers, but llm=none")


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
    filters = retriever.filters_for([q.corpus for q in qa])

    with timer.stage("retrieve"):
        fused, retrieve_ms = retriever.search_timed(queries, session.depth, filters)
    with timer.stage("rerank"):
        hits, rerank_ms = rerank_timed(reranker, queries, fused, chunk_set.chunks, k)

    contexts = session.context_builder.build(hits, chunk_set)
    answered = answer_subset(qa, cfg.slice.get("answer_questions_per_corpus"), cfg.slice.seed)
    sub_answers, sub_ms, answers_hit = generate_cached(
        session.generator, [queries[i] for i in answered], [contexts[i] for i in answered], cache, timer
    )
    answers: list[str | None] | None = None
    generate_ms: np.ndarray | None = None
    if sub_answers is not None:
        answers, generate_ms = [None] * len(qa), np.full(len(qa), np.nan)
        for j, i in enumerate(answered):
            answers[i], generate_ms[i] = sub_answers[j], sub_ms[j]
    if answers_hit is not None:
        artifacts.record["answers"] = {"key": answers_hit[0], "hit": answers_hit[1]}

    with timer.stage("score"):
        # Reuse cached chunk vectors only if they were made by the evaluation embedder itself.
        chunk_vectors = None
        if cache.lookup("vectors", artifacts.vectors_key(eval_embedder)) is not None:
            chunk_vectors = artifacts.vectors(eval_embedder)
        records, aggregates = score(
            qa, hits, chunk_set.chunks, eval_embedder, settings, answers, chunk_vectors,
            context_texts=[[c.text for c in ctx] for ctx in contexts],
        )
    for q, rec in enumerate(records):
        rec["latency_ms"] = {"retrieve": round(float(retrieve_ms[q]), 3), "rerank": round(float(rerank_ms[q]), 3)}
        if generate_ms is not None and not np.isnan(generate_ms[q]):
            rec["latency_ms"]["generate"] = round(float(generate_ms[q]), 3)
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
        "latency": latency_summary(retrieve_ms, rerank_ms, generate_ms),
        "timings_s": timer.as_dict(),
        "artifacts": artifacts.record,
        "config": _container(cfg),
    }
    write_results(output_dir, result, records)
    return result


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


def generate_cached(
    generator: Any, queries: list[str], contexts: list[list[Context]], cache: ArtifactCache, timer: StageTimer
) -> tuple[list[str] | None, np.ndarray | None, tuple[str, bool] | None]:
    """Answers are cached under the generator's settings and the exact prompts' inputs, so a
    sweep that changes nothing upstream of generation (e.g. eval thresholds) reuses them, and any
    change in the contexts generates anew. Returns (answers, per-question ms, (key, hit))."""
    if isinstance(generator, NoGenerator):
        return None, None, None
    h = hashlib.sha256()
    for query, ctx in zip(queries, contexts):
        h.update(json.dumps([query, [(c.label, c.text) for c in ctx]], ensure_ascii=False).encode())
    key = make_key("answers", generator.id, {"inputs": h.hexdigest()})

    def build(tmp: Path) -> dict[str, Any]:
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
        per_q = getattr(generator, "last_latencies_ms", None) or [1000.0 * seconds / len(queries)] * len(queries)
        (tmp / "answers.json").write_text(json.dumps({"answers": answers, "latency_ms": list(per_q)}, ensure_ascii=False))
        return {"n": len(answers), "empty": empty, "seconds": round(seconds, 3)}

    art = cache.get_or_build("answers", key, build, inputs={"generator": generator.id})
    data = json.loads(art.file("answers.json").read_text())
    return data["answers"], np.asarray(data["latency_ms"], float), (key, art.hit)


def latency_summary(retrieve_ms: np.ndarray, rerank_ms: np.ndarray, generate_ms: np.ndarray | None) -> dict[str, float]:
    """Median and 95th percentile per question and stage, in milliseconds. With answers for a
    subset of the questions (NaN elsewhere), generate and total cover the answered questions."""
    out: dict[str, float] = {}
    stages = {"retrieve": retrieve_ms, "rerank": rerank_ms, "generate": generate_ms}
    total = retrieve_ms + rerank_ms + (generate_ms if generate_ms is not None else 0.0)
    for name, ms in {**stages, "total": total}.items():
        if ms is None:
            continue
        ms = ms[~np.isnan(ms)]
        if len(ms) == 0:
            continue
        out[f"{name}_ms_median"] = round(float(np.median(ms)), 3)
        out[f"{name}_ms_p95"] = round(float(np.percentile(ms, 95)), 3)
    return out


def write_results(output_dir: Path, result: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """Results are written whole or not at all (temporary file, then rename); metrics.json goes
    last, so its presence marks a finished run."""
    output_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        output_dir / "per_question.jsonl",
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
    )
    atomic_write_text(output_dir / "config_resolved.yaml", OmegaConf.to_yaml(OmegaConf.create(result["config"])))
    atomic_write_text(output_dir / "metrics.json", json.dumps(result, indent=2, default=_json_default))


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    return str(o)


def format_table(result: dict[str, Any]) -> str:
    """A short plain-text table of the run's metrics (overall and per question corpus)."""
    metrics = list(result["metrics"])
    corpora = list(result["by_corpus"])
    header = f"{'metric':<16}{'all':>22}" + "".join(f"{c:>12}" for c in corpora)
    lines = [f"variant {result['variant']}: {result['counts']['questions']} questions, "
             f"{result['counts']['documents']} documents, {result['counts']['chunks']} chunks", header]
    for m in metrics:
        o = result["metrics"][m]
        cell = f"{o['mean']:.3f} [{o['ci95'][0]:.3f},{o['ci95'][1]:.3f}]"
        per = "".join(
            f"{result['by_corpus'][c][m]['mean']:>12.3f}" if m in result["by_corpus"][c] else f"{'-':>12}" for c in corpora
        )
        lines.append(f"{m:<16}{cell:>22}{per}")
    t = result["timings_s"]
    lines.append("stage seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in t.items()))
    return "\n".join(lines)
