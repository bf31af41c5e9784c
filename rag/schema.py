"""The configuration's schema: the checks for the type and range of a value, and the rules of the
components' nodes. rag/settings.py applies them with the run's own rules, once, at start-up,
before any file is read or model loaded.

`resolved(cfg)` reports a missing `???` value or an interpolation that cannot be resolved by its
key; `check_all` checks each known key that is present, so a rule
applies to whichever component the config groups chose (`fusion.k` exists only under
`fusion=rrf`). Every failure is one `RagError` line naming the key and the value, e.g.
`eval.k must be an integer, got 2.5`. Integers must be integers (not 2.5, not true, not "five");
numbers must be finite. Components keep their own constructor checks as a second line of
defence; the allowed *names* of modes and backends stay with the components that define them.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from rag.types import RagError

Check = Callable[[str, Any], None]

# matplotlib's raster and vector formats that the charts can be saved in
CHART_FORMATS = ("png", "svg", "pdf", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp")
_DEVICE = re.compile(r"^(cpu|cuda|mps|xpu|hip|npu|auto)(:\d+)?$")


def shown(value: Any) -> str:
    """A value as the user wrote it on the command line (true, null, 'five', 2.5, nan)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


# ---- checks ---------------------------------------------------------------------------------


def integer(lo: int | None = None, nullable: bool = False) -> Check:
    def check(key: str, v: Any) -> None:
        if v is None and nullable:
            return
        if isinstance(v, bool) or not isinstance(v, int):
            raise RagError(f"{key} must be an integer{' or null' if nullable else ''}, got {shown(v)}")
        if lo is not None and v < lo:
            what = "positive" if lo == 1 else f">= {lo}"
            raise RagError(f"{key} must be {what}{' or null' if nullable else ''}, got {v}")

    return check


def number(lo: float | None = None, hi: float | None = None, *, above: float | None = None,
           note: str = "", nullable: bool = False) -> Check:
    """A finite int or float; `lo`/`hi` inclusive bounds, `above` an exclusive lower bound."""

    def check(key: str, v: Any) -> None:
        if v is None and nullable:
            return
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RagError(f"{key} must be a number, got {shown(v)}")
        is_ = f" is {note} and" if note else ""
        if not math.isfinite(v):
            raise RagError(f"{key}{is_} must be a finite number, got {shown(v)}")
        if lo is not None and hi is not None and not lo <= v <= hi:
            raise RagError(f"{key}{is_} must be in [{lo:g}, {hi:g}], got {shown(v)}")
        if lo is not None and hi is None and v < lo:
            raise RagError(f"{key}{is_} must be >= {lo:g}, got {shown(v)}")
        if above is not None and v <= above:
            raise RagError(f"{key}{is_} must be > {above:g}, got {shown(v)}")

    return check


def boolean(key: str, v: Any) -> None:
    if not isinstance(v, bool):
        raise RagError(f"{key} must be true or false, got {shown(v)}")


def string(nonempty: bool = True, nullable: bool = False, choices: tuple[str, ...] | None = None) -> Check:
    def check(key: str, v: Any) -> None:
        if v is None and nullable:
            return
        if not isinstance(v, str):
            raise RagError(f"{key} must be a string{' or null' if nullable else ''}, got {shown(v)}")
        if nonempty and not v.strip():
            raise RagError(f"{key} must not be empty")
        if choices is not None and v not in choices:
            raise RagError(f"{key} must be one of {', '.join(choices)}, got {shown(v)}")

    return check


def path(what: str = "a file", nullable: bool = False) -> Check:
    def check(key: str, v: Any) -> None:
        if nullable and v is None:
            return
        if not isinstance(v, str) or not v.strip():
            raise RagError(f"{key} must name {what}, got {shown(v) if v != '' else 'an empty value'}")

    return check


def device(key: str, v: Any) -> None:
    if not isinstance(v, str) or not _DEVICE.match(v):
        raise RagError(f"{key} must be a device such as cpu, cuda, cuda:1 or mps, got {shown(v)}")


def strings(nonempty: bool = False, choices: tuple[str, ...] | None = None, blank_items: bool = False) -> Check:
    def check(key: str, v: Any) -> None:
        if not isinstance(v, list) or not all(isinstance(s, str) and (s or blank_items) for s in v):
            what = "strings" if blank_items else "names"
            raise RagError(f"{key} must be a list of {what}, e.g. [a,b], got {shown(v)}")
        if nonempty and not v:
            raise RagError(f"{key} must list at least one name")
        bad = [s for s in v if choices is not None and s not in choices]
        if bad:
            raise RagError(f"{key}: unknown {bad}; choose from {list(choices or ())}")

    return check


def groups(key: str, v: Any) -> None:
    if not isinstance(v, list) or not all(isinstance(g, list) and g and all(isinstance(s, str) and s for s in g) for g in v):
        raise RagError(f"{key} must be a list of lists of source tags, e.g. [[pubmed],[libc,pytorch]], got {shown(v)}")


def label(key: str, v: Any) -> None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, (str, int))):
        raise RagError(f"{key} must be a run label, variant or job number, got {shown(v)}")


# ---- the schema -----------------------------------------------------------------------------

EMBEDDER: dict[str, Check] = {
    "model": string(),
    "batch_size": integer(1),
    "normalize": boolean,
    "device": device,
    "max_seq_length": integer(1, nullable=True),
    "query_prefix": string(nonempty=False),
    "show_progress": boolean,
    "engine.num_workers": integer(1),
    "engine.ray_batch_size": integer(1),
    "engine.num_cpus_per_worker": number(above=0),
    "engine.min_texts": integer(0),
    "engine.object_store_memory": integer(1, nullable=True),
    # a served embedder (embedder=openai)
    "base_url": string(), "concurrency": integer(1), "dimensions": integer(1, nullable=True),
    "timeout_s": number(above=0), "max_retries": integer(0), "backoff_s": number(above=0),
    "max_backoff_s": number(above=0),
}
CHUNKER: dict[str, Check] = {
    "chunk_size": integer(1),
    "chunk_overlap": integer(0),
    "breakpoint_percentile": number(0, 100),
    "min_chunk_size": integer(1),
    "tokenizer": string(),
}
BM25: dict[str, Check] = {"k1": number(above=0), "b": number(0, 1), "stopwords": boolean, "stem": boolean,
                          "backend": string()}
def threads(key: str, v: Any) -> None:
    """torch CPU threads: a count, null (leave torch's default) or auto (rag.llm decides)."""
    if v == "auto":
        return
    try:
        integer(1, nullable=True)(key, v)
    except RagError:
        raise RagError(f"{key} must be a positive integer, auto or null, got {shown(v)}") from None


LLM: dict[str, Check] = {
    "model": string(), "max_new_tokens": integer(1), "temperature": number(0), "seed": integer(),
    "batch_size": integer(1), "num_threads": threads, "device": device,
    "dtype": string(), "quantization": string(nullable=True), "max_sentences": integer(1),
    "min_similarity": number(-1, 1), "no_answer": string(), "system_prompt": string(nullable=True),
}

# The components' nodes; the run's own keys (paths, slice, context, eval, report) are checked
# beside their typed settings in rag/settings.py.
COMPONENT_RULES: dict[str, Check] = {
    "corpus.path": path(),
    "corpus.paths.*": path(),
    "corpus.parts.*.path": path(),
    "corpus.workers": integer(1),
    "corpus.width": integer(1),
    "corpus.id_field": string(), "corpus.text_field": string(), "corpus.group_field": string(),
    "corpus.default_group": string(),
    "qa.path": path(),
    "qa.id_field": string(), "qa.question_field": string(), "qa.answer_field": string(),
    "qa.parts.*.path": path(),
    **{f"chunker.{k}": c for k, c in CHUNKER.items()},
    **{f"chunker.routes.*.{k}": c for k, c in CHUNKER.items()},
    **{f"chunker.default.{k}": c for k, c in CHUNKER.items()},
    "chunker.separators": strings(blank_items=True),
    "compressor.threshold": number(-1, 1, note="a cosine threshold"),
    "chunker.routes.*.separators": strings(blank_items=True),
    "chunker.default.separators": strings(blank_items=True),
    **{f"embedder.{k}": c for k, c in EMBEDDER.items()},
    **{f"eval.embedder.{k}": c for k, c in EMBEDDER.items()},
    "index.M": integer(1), "index.ef_construction": integer(1), "index.ef_search": integer(1),
    "index.nlist": integer(1), "index.nprobe": integer(1), "index.metric": string(choices=("l2", "ip")),
    "retriever.candidates": integer(1),
    **{f"retriever.{k}": c for k, c in BM25.items()},
    **{f"retriever.lexical.{k}": c for k, c in BM25.items()},
    "retriever.source_filter.mode": string(nullable=True),
    "retriever.source_filter.groups": groups,
    "retriever.source_filter.sources": strings(),
    "fusion.k": integer(0),
    "fusion.alpha": number(0, 1),
    "reranker.model": string(), "reranker.top_n": integer(1), "reranker.lambda_mult": number(0, 1), "reranker.batch_size": integer(1),
    "reranker.max_length": integer(1), "reranker.device": device, "reranker.num_threads": integer(1, nullable=True),
    "reranker.backend": string(choices=("torch", "onnx")),
    "reranker.base_url": string(), "reranker.timeout_s": number(above=0), "reranker.max_retries": integer(0),
    "reranker.window": integer(1), "reranker.step": integer(1), "reranker.passage_chars": integer(1),
    **{f"llm.{k}": c for k, c in LLM.items()},
    **{f"reranker.llm.{k}": c for k, c in LLM.items()},  # the listwise reranker's generator
}


def _values(node: Any, parts: list[str], prefix: str) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every value matching `parts` (`*` matches any key or list index)."""
    if not parts:
        yield prefix, node
        return
    head, rest = parts[0], parts[1:]
    if isinstance(node, dict):
        items = node.items() if head == "*" else ([(head, node[head])] if head in node else [])
    elif isinstance(node, list) and head == "*":
        items = enumerate(node)
    else:
        items = []
    for k, child in items:
        yield from _values(child, rest, f"{prefix}.{k}" if prefix else str(k))


def resolved(cfg: DictConfig) -> dict[str, Any]:
    """The configuration as plain data, with `???` values and broken interpolations reported by
    their key in one line."""
    try:
        missing = sorted(OmegaConf.missing_keys(cfg))
        if missing:
            raise RagError(f"{missing[0]} is required and has no default: add {missing[0]}=... to the command line")
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # type: ignore[return-value]
    except MissingMandatoryValue as e:
        raise RagError(f"{e.full_key} is required and has no default: add {e.full_key}=... to the command line") from None
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "config"
        msg = str(e).strip().splitlines()[0]
        msg = re.sub(r"^\w+ raised while resolving interpolation: ", "", msg).strip('"')
        raise RagError(f"{key}: cannot resolve its value: {msg}") from None


def check_all(data: dict[str, Any], rules: dict[str, Check]) -> None:
    """Applies each rule to every value its dotted pattern matches in the resolved `data`."""
    # chunk_size may be null only for the per-source router (each route then keeps its own size)
    router = str((data.get("chunker") or {}).get("_target_", "")).endswith("RoutedChunker")
    rules = {**rules, "chunker.chunk_size": integer(1, nullable=router)}
    for pattern, check in rules.items():
        for key, value in _values(data, pattern.split("."), ""):
            check(key, value)
    _check_overlaps(data)


def _check_overlaps(data: dict[str, Any]) -> None:
    nodes = [*_values(data, ["chunker"], ""), *_values(data, ["chunker", "routes", "*"], ""),
             *_values(data, ["chunker", "default"], "")]
    for prefix, node in nodes:
        if not isinstance(node, dict):
            continue
        size, overlap = node.get("chunk_size"), node.get("chunk_overlap")
        if isinstance(size, int) and isinstance(overlap, int) and overlap >= size:
            raise RagError(f"{prefix}.chunk_overlap ({overlap}) must be smaller than {prefix}.chunk_size ({size})")
