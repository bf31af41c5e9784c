"""The ONNX Runtime backend of the sentence embedder (`embedder.backend: onnx`).

The model is exported once into the artifact cache (kind `onnx_model`, keyed by the model, its
files and the quantization), never next to the weights, and loaded from there; tokenization,
length-sorted batching, pooling and normalization are the sentence-transformers model's own,
traced into the graph or mirrored here. `quantize: int8` adds dynamic int8 quantization of the
matrix multiplications. sentence-transformers' own `backend="onnx"` needs `optimum`, whose
releases all pin transformers < 5, so the export here uses torch.onnx and onnxruntime directly.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, TypedDict, cast

import numpy as np

from rag.store.cache import ArtifactCache, make_key
from rag.store.models import model_fingerprint
from rag.embedder.onnx_runtime import export_module, session_options
from rag.types import RagError

log = logging.getLogger(__name__)

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
class Int8Settings(TypedDict):
    weight_type: str  # a QuantType member name
    per_channel: bool
    op_types: list[str]


INT8_SETTINGS: Int8Settings = {"weight_type": "QInt8", "per_channel": True, "op_types": ["MatMul"]}
_CHECK_TEXTS = [
    "a",
    "A longer sentence, so that the batch is padded and the attention mask is traced as a tensor.",
    "The quick brown fox jumps over the lazy dog. " * 80,  # past any max_seq_length: truncation
]


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


def export_onnx_model(model_name: str, path: str, quantize: str | None, cache: ArtifactCache) -> Path:
    """The folder of the exported model in the artifact cache, exported on first use (atomically,
    once across parallel jobs: see ArtifactCache). int8 is quantized from the float export."""
    _require_onnxruntime()
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


def embedding_dim(model: Any) -> int:
    """The vector size of a SentenceTransformer (either name of its getter) or an OnnxSentenceEncoder."""
    getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return int(getter())


def _export_float(path: str, tmp: Path) -> dict[str, Any]:
    """Traces the whole sentence-transformers module chain (transformer, pooling, dense,
    normalize) into one graph: token ids in, sentence embedding out."""
    from sentence_transformers import SentenceTransformer

    try:
        st = SentenceTransformer(path, device="cpu")
    except OSError as e:
        raise RagError(f"embedder model {path!r} could not be loaded: {str(e).splitlines()[0]}") from e
    st.eval()
    tokenizer = st.tokenizer
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in tokenizer.model_input_names]
    # a sentence-transformers Transformer module always has a max_seq_length; only the base API says Optional
    max_len = int(cast(int, st.max_seq_length))
    enc = tokenizer(_CHECK_TEXTS[:2], padding=True, truncation="longest_first", max_length=max_len, return_tensors="pt")
    export_module(st, enc, names, "sentence_embedding", tmp / ONNX_FILE, ONNX_OPSET)
    tokenizer.save_pretrained(str(tmp))
    meta = {
        "source": path,
        "inputs": names,
        "output": "sentence_embedding",
        "dim": embedding_dim(st),
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

    from rag.store.cache import MANIFEST

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
        self.session = self._open_session(model_dir, device)

    def _open_session(self, model_dir: Path, device: str) -> Any:
        """What runs the graph: an ONNX Runtime session (OpenVINOSentenceEncoder: OpenVINO)."""
        import onnxruntime as ort

        providers = ["CPUExecutionProvider"]
        if device.startswith("cuda") and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        elif device != "cpu":
            log.warning("embedder: backend=onnx runs on the CPU here (device %r is not available to onnxruntime)", device)
        return ort.InferenceSession(str(model_dir / ONNX_FILE), session_options(), providers=providers)

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
        texts = [sentences] if isinstance(sentences, str) else [str(t) for t in sentences]
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
