"""A configured pipeline with its artifacts built or loaded: everything needed to answer questions.

`open_session(settings)` builds every component from its node (a bad value fails before anything
expensive), reads and slices the corpus and questions, runs the preflight checks, chunks, and
prepares the retriever and reranker (vectors, index, BM25 through rag.run.artifacts). The settings
come from rag.run.settings.load, the one place that reads the composed config. `rag.run.pipeline.run` evaluates
a question set with it; `rag.ask` answers typed questions with the same session.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from eval.judge import Judge
from eval.relevance import RelevanceJudge
from eval.scoring import ANSWER_METRICS, ScoreSettings
from rag.run import preflight
from rag.run.artifacts import Artifacts
from rag.store.cache import ArtifactCache
from rag.store.chunk_set import ChunkSet
from rag.chunker import Chunker, contextualize
from rag.chunker.contextualize import LLMContextualizer
from rag.chunker.token import TokenChunker
from rag.compressor.base import Compressor
from rag.context import ContextBuilder
from rag.corpus.base import Corpus
from rag.corpus.slicing import Kept, slice_documents, slice_questions
from rag.embedder.base import Embedder
from rag.run.latency import LatencySettings
from rag.llm import Generator, NoGenerator
from rag.store.models import use_cache
from rag.run.preflight import Asker
from rag.qa.base import NoQuestions, QuestionSet
from rag.reranker.base import Reranker
from rag.retriever.base import Retriever
from rag.serving.served import served
from rag.run.settings import Settings, to_plain
from rag.timing import StageTimer
from rag.types import Document, QAItem, RagError

log = logging.getLogger(__name__)


def create(node: Any, **kwargs: Any) -> Any:
    """`hydra.utils.instantiate`, unwrapping our own one-line errors from Hydra's wrapper so that
    a bad config value reads as itself rather than as an instantiation traceback."""
    try:
        return instantiate(node, _convert_="all", **kwargs)
    except InstantiationException as e:
        cause = e.__cause__
        while cause is not None and not isinstance(cause, RagError):
            cause = cause.__cause__
        if cause is not None:
            raise cause from None
        unknown = _unknown_setting(e, node)
        if unknown:
            raise RagError(unknown) from None
        raise


def _unknown_setting(e: InstantiationException, node: Any) -> str | None:
    """A key added to a component's node (`+chunker.chunk_sise=3`) that its class does not take:
    one line naming the key, the class and the settings it has, instead of Hydra's TypeError."""
    import inspect
    import re

    from hydra.utils import get_method

    cause = str(e.__cause__ or "")
    m = re.search(r"unexpected keyword argument '([^']+)'", cause)
    full = re.search(r"full_key: (\S+)", str(e))
    # A class without a constructor of its own (llm=none's NoGenerator) takes no settings at all,
    # and Python names none of the keys it was given: the node's own keys are those.
    takes_none = re.search(r"takes no (keyword )?arguments", cause) is not None
    if (m is None and not takes_none) or not isinstance(node, DictConfig):
        return None
    prefix = f"{full.group(1)}." if full else ""
    # The node Hydra failed in may be nested (retriever.embedder): find it under the one we built.
    parts = full.group(1).split(".") if full else []
    nested = (OmegaConf.select(node, ".".join(parts[i:])) for i in range(len(parts)))
    failed = next((n for n in nested if isinstance(n, DictConfig) and "_target_" in n), node)
    target = failed.get("_target_")
    given = [str(k) for k in failed if not str(k).startswith("_")]
    if not target or (m is None and not given):
        return None
    key = m.group(1) if m is not None else given[0]
    if m is None:
        return _no_settings_line(prefix, key, str(target), failed.get(key))
    try:
        params = [p for p in inspect.signature(get_method(target)).parameters if p not in ("self", "args", "kwargs")]
    except Exception:  # noqa: BLE001 - no signature to show: name the key alone
        params = []
    from rag.config.compose import endpoint_settings, near_names

    if "endpoint" in params and key in endpoint_settings():  # added by its name from before the endpoint node
        return f"{prefix}{key} is now {prefix}endpoint.{key}"
    known = f"; its settings: {', '.join(params)}" if params else ""
    return f"{prefix}{key} is not a setting of {target.rpartition('.')[2]}{near_names(key, params)}{known}"


def _no_settings_line(prefix: str, key: str, target: str, value: Any) -> str:
    """`+llm.max_tokens=32` with llm=none: the class takes no settings; the options of the group
    that have the key, when there are any (llm=openai has max_tokens)."""
    from rag.config.compose import options_with

    line = f"{prefix}{key} is not a setting of {target.rpartition('.')[2]}, which takes none"
    group = prefix.rstrip(".")
    having = options_with(group, key) if group and "." not in group else []
    if having:
        others = f" (and {', '.join(having[1:])})" if len(having) > 1 else ""
        line += f"; it is a setting of {group}={having[0]}{others}: add {group}={having[0]} before {group}.{key}={value}"
    return line


@dataclass
class Components:
    """Everything the settings build before any data is read."""

    score: ScoreSettings
    corpus: Corpus
    questions: QuestionSet
    chunker: Chunker
    retriever: Retriever
    reranker: Reranker
    generator: Generator
    compressor: Compressor
    contextualizer: LLMContextualizer | None  # chunker.contextualize=llm's, else None
    eval_embedder: Embedder
    context_builder: ContextBuilder
    latency: LatencySettings
    judge: Judge | None  # when eval.judge.enabled
    relevance_judge: RelevanceJudge | None = None  # when eval.relevance=llm


@dataclass
class Session:
    """A configured pipeline with its artifacts built or loaded. `run` evaluates a question set
    with it; `rag.ask` answers typed questions."""

    settings: Settings
    cache: ArtifactCache
    timer: StageTimer
    parts: Components
    qa: list[QAItem]
    docs: list[Document]
    n_docs_total: int
    skipped: list[str]
    chunk_set: ChunkSet
    artifacts: Artifacts
    # What the slice kept of each input ("documents", "questions"; the run adds "answered
    # questions"): metrics.json's `slice`.
    kept: dict[str, Kept] = field(default_factory=dict)
    # The whole corpus before the slice, in order: what the fitted parts' records compare with (rag.run.fitted).
    all_docs: Sequence[Document] = ()

    # The components, under the names the stages use.
    @property
    def score(self) -> ScoreSettings:
        """How the run is scored (eval.k, the metrics, ...)."""
        return self.parts.score

    @property
    def retriever(self) -> Retriever:
        return self.parts.retriever

    @property
    def reranker(self) -> Reranker:
        return self.parts.reranker

    @property
    def generator(self) -> Generator:
        return self.parts.generator

    @property
    def compressor(self) -> Compressor:
        return self.parts.compressor

    @property
    def eval_embedder(self) -> Embedder:
        return self.parts.eval_embedder

    @property
    def context_builder(self) -> ContextBuilder:
        return self.parts.context_builder

    @property
    def latency(self) -> LatencySettings:
        return self.parts.latency

    @property
    def judge(self) -> Judge | None:
        return self.parts.judge

    @property
    def relevance_judge(self) -> RelevanceJudge | None:
        return self.parts.relevance_judge

    @property
    def depth(self) -> int:
        """Candidates retrieved per question: k, or more when the reranker wants to see more."""
        return max(self.score.k, self.reranker.top_n)


def open_session(settings: Settings, askers: Sequence[Asker] = (), scored: bool = True) -> Session:
    """`askers`: more (who, corpus tag, answer document) whose source filters are checked with the
    questions', before any model loads (rag.ask's --corpus). `scored`: the session evaluates its
    question set (a run), which qa=none cannot give; rag.ask answers typed questions without one."""
    timer = StageTimer()
    cache = ArtifactCache(settings.paths.cache, seed=settings.paths.seed)
    parts = create_components(settings, model_cache(settings))
    if scored and isinstance(parts.questions, NoQuestions):
        raise RagError(NoQuestions.HINT)
    artifacts = Artifacts(cache, timer=timer)

    with timer.stage("corpus"):
        all_docs, skipped, all_qa = artifacts.inputs(parts.corpus, parts.questions)
        qa, docs, kept = apply_slice(settings, all_qa, all_docs, scored)
        if all_qa or scored:
            preflight.run(settings.objective, all_qa, all_docs, qa, docs, settings.max_doc_chars, parts.retriever,
                          parts.reranker, askers)
        else:  # typed questions only (rag.ask on qa=none): the checks that need no question set
            preflight.document_sizes(docs, settings.max_doc_chars)
            parts.retriever.check_filters(list(askers), docs)

    with timer.stage("chunk"):
        chunk_set = artifacts.chunks(parts.chunker, to_plain(settings.nodes.chunker), docs)
    # A dry run asks a served contextualizer nothing: rag.run.plan counts the chunks it would ask about.
    ctx = parts.contextualizer
    unasked = bool(settings.dry_run and ctx is not None and served(ctx) and ctx.missing(docs, chunk_set.chunks, cache))
    if settings.contextualize != "none" and not unasked:
        with timer.stage("contextualize"):
            lines = contextualize.prefixes(settings.contextualize, docs, chunk_set.chunks, parts.contextualizer, cache)
        tag = parts.contextualizer.tag if parts.contextualizer is not None else settings.contextualize
        chunk_set = artifacts.chunk_set = chunk_set.contextualized(tag, lines)
    log.info("%d documents -> %d chunks; %d questions", len(docs), len(chunk_set), len(qa))
    if parts.score.k > len(chunk_set):
        raise RagError(f"eval.k ({parts.score.k}) is larger than the number of chunks ({len(chunk_set)})")

    # A dry run (rag.run.plan) sends nothing: a served embedder's vectors are counted, not built, and
    # no served part is warmed up (that would ask the server).
    dense = parts.retriever.dense_part()
    searchable = not (settings.dry_run and (unasked or (dense is not None and served(dense.embedder))))
    if searchable:
        parts.retriever.prepare(artifacts)
    parts.reranker.prepare(artifacts)
    with timer.stage("load_models"):
        if searchable:
            parts.retriever.warm_up()
        if not (settings.dry_run and served(parts.reranker)):
            parts.reranker.warm_up()
    session = Session(settings, cache, timer, parts, qa, docs, len(all_docs), skipped, chunk_set, artifacts, kept,
                      all_docs)
    if session.depth > len(chunk_set):
        log.warning("retrieval depth %d exceeds the %d chunks; every chunk is a candidate", session.depth, len(chunk_set))
    return session


def apply_slice(settings: Settings, all_qa: list[QAItem], all_docs: list[Document],
                scored: bool = True) -> tuple[list[QAItem], list[Document], dict[str, Kept]]:
    """The questions and documents the slice keeps, and what it kept of each; a sample that
    leaves anything out says so (terminal and run.log) in one line. Typed questions (not
    `scored`) are told only about the documents: the question set is not theirs."""
    cut = settings.slice
    qa = slice_questions(all_qa, cut.questions_per_corpus, cut.seed)
    docs = slice_documents(all_docs, qa, cut.docs_per_source, cut.seed)
    kept = {"questions": Kept("questions", len(qa), len(all_qa), "slice.questions_per_corpus", cut.questions_per_corpus),
            "documents": Kept("documents", len(docs), len(all_docs), "slice.docs_per_source", cut.docs_per_source)}
    if not scored:
        del kept["questions"]
    for k in kept.values():
        if k.sampled:
            log.log(sample_level(settings, k), k.line())
    return qa, docs, kept


def sample_level(settings: Settings, kept: Kept) -> int:
    """WARNING for a sample the user asked for (they may not expect to lose questions), INFO for
    the configuration's own: make demo's documented slice is no warning to a newcomer."""
    return logging.WARNING if kept.setting in settings.slice.chosen else logging.INFO


def model_cache(settings: Settings) -> ArtifactCache:
    """Where components build their model artifacts: `paths.model_cache` (by default the artifact
    cache itself)."""
    return ArtifactCache(settings.paths.model_cache, setting="paths.model_cache", seed=settings.paths.seed)


def create_components(settings: Settings, models: ArtifactCache) -> Components:
    """Every component, each from its own node, checked against each other; components that build
    or load a model artifact (the ONNX export, the LLM's conversion, the cross-encoder) get the
    session's model cache (`paths.model_cache`, by default the artifact cache itself)."""
    nodes = settings.nodes
    corpus, questions, chunker = create(nodes.corpus), create(nodes.qa), create(nodes.chunker)
    create(nodes.fusion)  # validated even when the retriever does not fuse, so a bad sweep value fails fast
    retriever, reranker, generator = create(nodes.retriever), create(nodes.reranker), create(nodes.llm)
    compressor = create(nodes.compressor)
    eval_embedder = create(nodes.eval_embedder)
    context_builder = ContextBuilder(settings.context.labels, settings.context.expand_neighbors,
                                     settings.context.budget_chars)
    check_objective(settings.objective, settings.score, generator)
    judge = build_judge(nodes.judge, generator)
    if isinstance(chunker, TokenChunker):
        chunker.check_fits(settings.embedder.model, settings.embedder.max_seq_length)
    if isinstance(generator, NoGenerator) and compressor.name != "none":
        raise RagError(f"compressor={compressor.name} shortens the contexts an LLM reads, but llm=none generates nothing")
    contextualizer = create(nodes.contextualizer) if nodes.contextualizer is not None else None
    parts = Components(settings.score, corpus, questions, chunker, retriever, reranker, generator, compressor,
                       contextualizer, eval_embedder, context_builder, settings.latency, judge,
                       create(nodes.relevance_judge) if nodes.relevance_judge is not None else None)
    for part in (parts.chunker, parts.retriever, parts.reranker, parts.generator, parts.compressor,
                 parts.contextualizer, parts.eval_embedder, parts.relevance_judge):
        use_cache(part, models)
    return parts


def build_judge(node: Any, generator: Generator) -> Judge | None:
    """The LLM judge of `eval.judge` (eval/judge.py), or None when it is not enabled."""
    if node is None:
        return None
    if isinstance(generator, NoGenerator):
        raise RagError("eval.judge.enabled=true judges answers, but llm=none generates none")
    return create({k: v for k, v in to_plain(node).items() if k != "enabled"})


def check_objective(objective: str, settings: ScoreSettings, generator: Generator) -> None:
    if objective not in settings.metrics:
        raise RagError(f"objective {objective!r} is not among the reported metrics {list(settings.metrics)}")
    if objective in ANSWER_METRICS and isinstance(generator, NoGenerator):
        raise RagError(f"objective {objective!r} needs generated answers, but llm=none")
