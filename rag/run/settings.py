"""The run's settings, typed: the composed Hydra config is turned once, at start-up, into frozen
dataclasses (`load(cfg)`), checked there with one-line messages. Below this door no module reads
the raw config: the session and the stages get these settings, and each component is instantiated
from its own node (`Settings.nodes`, `_target_` + hydra.utils.instantiate).

Each settings class carries the rules of its own keys (`RULES`); the components' nodes (corpus,
chunker, embedder, index, retriever, fusion, reranker, llm, ...) are their constructors' arguments,
checked by the rules of the constructors' annotations (rag/config/schema.py's `check_components`).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar

from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf, open_dict

from eval.scoring import ScoreSettings
from experiments import metric_info as MI
from rag.chunker.contextualize import check_mode
from rag.run.latency import LatencySettings
from rag.config.schema import (CHART_FORMATS, Check, boolean, check_all, check_components, integer, label, number, path,
                        resolved, string, strings)
from rag.serving.secrets import check as check_secrets
from rag.serving.secrets import note_environment
from rag.types import RagError


@dataclass(frozen=True)
class Paths:
    """Absolute directories: a relative path means the directory the command was started in, also
    for a job a launcher runs elsewhere (Hydra carries that directory along)."""

    cache: str
    model_cache: str  # model artifacts (ONNX exports, conversions, the cross-encoder); default: cache
    seed: str | None  # read-only artifacts both caches restore from on a miss (rag/store/cache.py); None: none

    RULES: ClassVar[dict[str, Check]] = {"cache": path("a directory"), "model_cache": path("a directory"),
                                         "seed": path("a directory", nullable=True)}

    @classmethod
    def from_data(cls, d: dict[str, Any]) -> Paths:
        seed = d.get("seed")
        return cls(to_absolute_path(str(d["cache"])), to_absolute_path(str(d["model_cache"])),
                   to_absolute_path(str(seed)) if seed else None)


@dataclass(frozen=True)
class Slice:
    """A deterministic slice of the corpus and questions (None: everything)."""

    docs_per_source: int | None
    questions_per_corpus: int | None
    answer_questions_per_corpus: int | None  # questions per corpus tag that get answers
    seed: int
    # The settings a user set for this run (the command line, a sweep's parameter): a sample they
    # take is said in the terminal; the configuration's own (the shipped slice, make demo's answered
    # sample) only in run.log, metrics.json and the report.
    chosen: frozenset[str] = frozenset()

    RULES: ClassVar[dict[str, Check]] = {
        "docs_per_source": integer(1, nullable=True),
        "questions_per_corpus": integer(1, nullable=True),
        "answer_questions_per_corpus": integer(1, nullable=True),
        "seed": integer(),
    }


@dataclass(frozen=True)
class ContextSettings:
    """How retrieved chunks become the numbered contexts given to the LLM (rag.context)."""

    labels: bool = False
    expand_neighbors: int = 0
    budget_chars: int = 4000

    RULES: ClassVar[dict[str, Check]] = {"labels": boolean, "expand_neighbors": integer(0), "budget_chars": integer(1)}


def check_min_effect(key: str, value: Any) -> None:
    """report.min_effect: metric -> the smallest difference that matters (experiments.metric_info)."""
    if value is not None:
        MI.min_effects(value, key)


@dataclass(frozen=True)
class RunReport:
    """The `report` node as a run reads it: report.html beside metrics.json. A sweep's summary
    reads the whole node (experiments.report.ReportSettings)."""

    html: bool = True
    max_context_chars: int | None = None

    RULES: ClassVar[dict[str, Check]] = {
        "baseline": label,
        "formats": strings(choices=CHART_FORMATS),
        "charts": boolean,
        "fail_on": string(choices=("all", "any", "never")),
        "html": boolean,
        "max_context_chars": integer(1),
        "min_effect": check_min_effect,
    }


ROLES = ("contextualize", "embed", "rerank", "compress", "generate", "judge", "relevance")
PRICE_KEYS = ("input", "output", "request")


@dataclass(frozen=True)
class Price:
    """What one model role costs: per million input (prompt) tokens, per million output
    (completion) tokens, and per request (a hosted reranker bills searches). 0 for local models."""

    input: float = 0.0
    output: float = 0.0
    request: float = 0.0

    def cost(self, requests: int, input_tokens: int, output_tokens: int) -> float:
        return requests * self.request + (input_tokens * self.input + output_tokens * self.output) / 1e6


@dataclass(frozen=True)
class Pricing:
    """The `pricing` node: a price per model role (embed, rerank, generate, judge)."""

    currency: str = "USD"
    roles: tuple[tuple[str, Price], ...] = ()

    RULES: ClassVar[dict[str, Check]] = {"currency": string(), **{f"{role}.{key}": number(0) for role in ROLES
                                                                  for key in PRICE_KEYS}}

    @classmethod
    def from_data(cls, d: dict[str, Any] | None) -> Pricing:
        d = dict(d or {})
        currency = str(d.pop("currency", "USD"))
        roles = []
        for role, prices in d.items():
            if not isinstance(prices, dict) and role in ROLES:
                raise RagError(f"pricing.{role} must be a mapping such as {{input: 0.15, output: 0.6}}, got {prices!r}")
            if role not in ROLES:
                raise RagError(f"pricing.{role}: unknown model role; known: {', '.join(ROLES)}")
            unknown = sorted(set(prices or {}) - set(PRICE_KEYS))
            if unknown:
                raise RagError(f"pricing.{role}: unknown key(s) {unknown}; known: {', '.join(PRICE_KEYS)} "
                               "(per million input tokens, per million output tokens, per request)")
            roles.append((role, Price(**{k: float(v) for k, v in (prices or {}).items()})))
        return cls(currency, tuple(roles))

    def price(self, role: str) -> Price:
        return dict(self.roles).get(role, Price())


# eval.*: the scoring settings (eval.scoring.ScoreSettings) and the latency sample (rag.run.latency).
EVAL_RULES: dict[str, Check] = {
    "k": integer(1),
    "tau_recall": number(-1, 1, note="a cosine threshold"),
    "tau_h": number(-1, 1, note="a cosine threshold"),
    "metrics": strings(nonempty=True),
    "bootstrap.resamples": integer(1),
    "bootstrap.seed": integer(0),
}


@dataclass(frozen=True)
class Nodes:
    """Each component's own config node, instantiated by the session (rag.run.session.create)."""

    corpus: DictConfig
    qa: DictConfig
    chunker: DictConfig
    fusion: DictConfig
    retriever: DictConfig
    reranker: DictConfig
    llm: DictConfig
    compressor: DictConfig
    contextualizer: DictConfig | None  # None unless chunker.contextualize=llm
    eval_embedder: DictConfig
    judge: DictConfig | None  # None unless eval.judge.enabled
    relevance_judge: DictConfig | None = None  # None unless eval.relevance=llm


@dataclass(frozen=True)
class EmbedderLimit:
    """What the token chunker checks its chunk size against: the pipeline embedder's window."""

    model: str
    max_seq_length: int | None


@dataclass(frozen=True)
class Settings:
    variant: str
    objective: str  # the metric a run returns (sweepers maximize it)
    max_doc_chars: int | None
    paths: Paths
    slice: Slice
    context: ContextSettings
    report: RunReport
    score: ScoreSettings
    latency: LatencySettings
    embedder: EmbedderLimit
    pricing: Pricing
    qa_split: dict[str, Any] | None  # which part of a split question set is scored (rag.qa)
    nodes: Nodes
    resolved: dict[str, Any]  # the whole configuration as plain data (metrics.json's `config`)
    dry_run: bool = False  # count what served roles would send, send nothing (rag.run.plan)
    contextualize: str = "none"  # chunker.contextualize (rag/chunker/contextualize.py)

    RULES: ClassVar[dict[str, Check]] = {"variant": string(), "objective": string(),
                                         "max_doc_chars": integer(1, nullable=True), "dry_run": boolean}


def prefixed(prefix: str, rules: dict[str, Check]) -> dict[str, Check]:
    return {f"{prefix}.{k}": c for k, c in rules.items()}


RULES: dict[str, Check] = {
    **Settings.RULES,
    **prefixed("paths", Paths.RULES),
    **prefixed("slice", Slice.RULES),
    **prefixed("context", ContextSettings.RULES),
    **prefixed("report", RunReport.RULES),
    **prefixed("eval", EVAL_RULES),
    **prefixed("pricing", Pricing.RULES),
}

# The components' nodes, in the order they are checked (an error names the first bad value).
COMPONENTS = ("corpus", "qa", "chunker", "compressor", "embedder", "eval.embedder", "index", "retriever", "fusion",
              "reranker", "llm")


def validate(cfg: DictConfig) -> dict[str, Any]:
    """Checks every known value of `cfg`; returns the resolved configuration. A secret-looking
    value anywhere (a key, a key where a variable's name belongs, a URL's password: rag.serving.secrets)
    is refused first, in a line that does not repeat it: the resolved config is what metrics.json
    and config_resolved.yaml record."""
    raw = OmegaConf.to_container(cfg, resolve=False)
    check_secrets(raw)  # before a missing value is reported
    data = resolved(cfg)
    check_secrets(data)  # and what interpolations (${oc.env:...}) resolved to
    note_environment(raw)  # those values are written back as their ${oc.env:...} (rag.serving.secrets.redacted_data)
    check_all(data, RULES)
    check_components(raw, data, [*COMPONENTS, *_built_if_chosen(data)])
    return data


def _built_if_chosen(data: dict[str, Any]) -> list[str]:
    """The nodes built only when a setting asks for them (rag.run.session), checked only then. The
    judge checks its own settings (eval/judge.py); its endpoint's are checked here."""
    chosen = []
    if str((data.get("chunker") or {}).get("contextualize", "none")) == "llm":
        chosen.append("contextualizer")
    if ((data.get("eval") or {}).get("judge") or {}).get("enabled", False):
        chosen.append("eval.judge.endpoint")
    if relevance_source(data) == "llm":
        chosen.append("eval.relevance_judge")
    return chosen


RELEVANCE = ("labels", "llm")


def relevance_source(data: dict[str, Any]) -> str:
    """eval.relevance: labels (the question set's) or llm (graded by eval.relevance_judge)."""
    value = str((data.get("eval") or {}).get("relevance", "labels"))
    if value not in RELEVANCE:
        raise RagError(f"eval.relevance must be one of {', '.join(RELEVANCE)}, got {value!r}")
    return value


def load(cfg: DictConfig) -> Settings:
    """The typed settings of a composed config; a bad value is one RagError line naming it."""
    data = validate(cfg)
    ev = data["eval"]
    score = ScoreSettings(k=ev["k"], tau_recall=ev["tau_recall"], tau_h=ev["tau_h"], metrics=tuple(ev["metrics"]),
                          bootstrap_resamples=ev["bootstrap"]["resamples"], bootstrap_seed=ev["bootstrap"]["seed"])
    report = data.get("report") or {}
    judge = cfg.eval.get("judge")
    embedder = data.get("embedder") or {}
    contextualize = check_mode(str((data.get("chunker") or {}).get("contextualize", "none")))
    return Settings(
        variant=str(data.get("variant", "custom")),
        objective=data["objective"],
        max_doc_chars=data.get("max_doc_chars"),
        paths=Paths.from_data(data["paths"]),
        slice=Slice(**{k: data["slice"].get(k) for k in ("docs_per_source", "questions_per_corpus",
                                                          "answer_questions_per_corpus", "seed")},
                    chosen=chosen_slice_settings(command_line_overrides())),
        context=ContextSettings(**_known(data.get("context") or {}, ContextSettings, "context")),
        report=RunReport(html=report.get("html", True), max_context_chars=report.get("max_context_chars")),
        score=score,
        latency=LatencySettings.from_config(ev.get("latency")),
        embedder=EmbedderLimit(str(embedder.get("model", "")), embedder.get("max_seq_length")),
        pricing=Pricing.from_data(data.get("pricing")),
        qa_split=(data.get("qa") or {}).get("split"),
        nodes=Nodes(cfg.corpus, cfg.qa, chunker_node(cfg.chunker), cfg.fusion, cfg.retriever, cfg.reranker, cfg.llm,
                    cfg.compressor, cfg.get("contextualizer") if contextualize == "llm" else None, cfg.eval.embedder,
                    judge if judge is not None and judge.get("enabled", False) else None,
                    cfg.eval.get("relevance_judge") if relevance_source(data) == "llm" else None),
        resolved=data,
        dry_run=bool(data.get("dry_run")) or bool((data.get("llm") or {}).get("dry_run")),
        contextualize=contextualize,
    )


def command_line_overrides() -> list[str] | None:
    """This run's overrides as Hydra took them (the command line, a sweep job's parameters);
    None outside a Hydra run (the Python API, tests), where every sample counts as chosen."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return [str(o) for o in HydraConfig.get().overrides.task]


def chosen_slice_settings(overrides: list[str] | None) -> frozenset[str]:
    """The slice settings among `overrides` ("slice.questions_per_corpus=20", "slice=all"); None:
    all of them."""
    names = ("slice.docs_per_source", "slice.questions_per_corpus", "slice.answer_questions_per_corpus")
    if overrides is None:
        return frozenset(names)
    chosen: set[str] = set()
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key in ("slice", "slice.seed"):  # another slice altogether: all of its samples are the user's
            chosen.update(names)
        elif key in names:
            chosen.add(key)
    return frozenset(chosen)


def chunker_node(node: DictConfig) -> DictConfig:
    """The chunker's node without `contextualize`, which is the session's (it decides what is
    indexed, not how documents are cut), so the chunks and their key are the same either way."""
    if "contextualize" not in node:
        return node
    node = copy.deepcopy(node)  # keeps its parent: errors still name chunker.<key>
    with open_dict(node):
        del node["contextualize"]
    return node


def _known(node: dict[str, Any], cls: type, where: str) -> dict[str, Any]:
    from dataclasses import fields

    names = [f.name for f in fields(cls)]
    unknown = sorted(set(node) - set(names))
    if unknown:
        raise RagError(f"{where}: unknown key(s) {unknown}; known: {', '.join(names)}")
    return node


def to_plain(node: Any) -> Any:
    """A config node as plain Python (resolved); anything else as it is."""
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
