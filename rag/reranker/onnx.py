"""The cross-encoder's forward pass on ONNX Runtime (`reranker.backend: onnx`) or on OpenVINO
(`reranker.backend: openvino`, fp32 or bf16: the same export, rag/embedder/openvino_runtime.py).

The model's module chain (transformer and scoring head: token ids in, one logit per pair out) is
exported once with torch.onnx into the artifact cache (kind `onnx_cross_encoder`, keyed by the
model folder, the export and the library versions) and checked against torch on pairs of several
lengths before it is used. Tokenization stays sentence-transformers' own (`CrossEncoder.
preprocess`), so both backends see the same token ids; only the forward pass moves.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from rag.store.cache import ArtifactCache, make_key
from rag.store.models import model_fingerprint
from rag.embedder.onnx_runtime import export_module, session_options
from rag.embedder.openvino_runtime import OpenVINOSession
from rag.types import RagError

KIND = "onnx_cross_encoder"
ONNX_FILE = "model.onnx"
META = "ragrig_onnx.json"
OPSET = 17
EXPORT_VERSION = 1  # bump when the export below changes what it produces
# An export whose logits differ from torch's by more than this on the check pairs is not used.
MAX_ABS_DIFF = 1e-4
_CHECK_PAIRS = [
    ("a", "b"),
    ("What does fcntl do?", "fcntl - manipulate file descriptor. It performs one of the operations described below."),
    ("A long question " * 8, "The quick brown fox jumps over the lazy dog. " * 80),  # truncated at max_length
]


def export_params(path: str, max_length: int) -> dict[str, Any]:
    from importlib.metadata import version

    return {"model": model_fingerprint(path), "path": str(path), "max_length": int(max_length), "opset": OPSET,
            "export": EXPORT_VERSION, "transformers": version("transformers"),
            "sentence_transformers": version("sentence-transformers"), "onnxruntime": version("onnxruntime")}


def export_cross_encoder(model: Any, path: str, max_length: int, cache: ArtifactCache) -> Path:
    """The folder of `model`'s exported graph in the artifact cache, exported on first use."""
    try:
        import onnx  # noqa: F401  (the exporter's checks)
        import onnxruntime  # noqa: F401
    except ImportError as e:
        raise RagError(f"reranker.backend=onnx needs onnxruntime and onnx ({e}); pip install onnxruntime onnx") from e
    params = export_params(path, max_length)
    art = cache.get_or_build(KIND, make_key(KIND, params), lambda tmp: _export(model, tmp), inputs=params)
    return art.path


def _features(model: Any, pairs: list[tuple[str, str]]) -> dict[str, Any]:
    return model.preprocess([list(p) for p in pairs])


def _export(model: Any, tmp: Path) -> dict[str, Any]:
    model.eval()
    enc = _features(model, _CHECK_PAIRS[:2])
    names: list[str] = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in enc]
    export_module(model, enc, names, "scores", tmp / ONNX_FILE, OPSET)
    (tmp / META).write_text(json.dumps({"inputs": names, "output": "scores"}, indent=2))
    from rag.reranker.logits import predict_logits

    ref = predict_logits(model, _CHECK_PAIRS, batch_size=8)
    got = OnnxScorer(tmp).logits(model, _CHECK_PAIRS)
    diff = float(np.abs(ref - got).max())
    if diff > MAX_ABS_DIFF:
        raise RagError(f"ONNX export of the cross-encoder differs from torch by {diff:.2e} (> {MAX_ABS_DIFF}); "
                       "use reranker.backend=torch")
    return {"check_max_abs": diff}


class OnnxScorer:
    """One session on an exported cross-encoder: ONNX Runtime's, or with `openvino` (a precision,
    fp32 or bf16) OpenVINO's."""

    def __init__(self, model_dir: str | os.PathLike[str], openvino: str | None = None) -> None:
        model_dir = Path(model_dir)
        meta = json.loads((model_dir / META).read_text())
        self.input_names: list[str] = list(meta["inputs"])
        self.output_name: str = meta["output"]
        self.session: Any
        if openvino is not None:
            self.session = OpenVINOSession(model_dir / ONNX_FILE, openvino, self.output_name)
        else:
            import onnxruntime as ort

            self.session = ort.InferenceSession(str(model_dir / ONNX_FILE), session_options(),
                                                providers=["CPUExecutionProvider"])

    def logits(self, model: Any, pairs: list[tuple[str, str]]) -> np.ndarray:
        """The relevance logit of each pair, as one batch (tokenized by `model`, the CrossEncoder)."""
        if not pairs:
            return np.zeros(0, np.float32)
        enc = _features(model, pairs)
        feeds = {n: enc[n].numpy().astype(np.int64) for n in self.input_names}
        scores = np.asarray(self.session.run([self.output_name], feeds)[0], np.float32)
        return (scores[:, -1] if scores.ndim > 1 else scores).reshape(-1)


@functools.lru_cache(maxsize=8)
def load_scorer(model_dir: str, openvino: str | None = None) -> OnnxScorer:
    return OnnxScorer(model_dir, openvino)
