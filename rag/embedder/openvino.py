"""The OpenVINO backend of the sentence embedder (`embedder.backend: openvino`).

It runs the graph the `onnx` backend exports (rag/embedder/onnx.py: same cache entry, same
tokenization, batching and pooling) on OpenVINO's CPU plugin, in fp32 or bf16
(rag/embedder/openvino_runtime.py). An fp32 encoder is checked once per process against ONNX
Runtime on the export's check texts: the export was checked against torch, so the two checks
together bound how far its vectors are from torch's (`check_min_cosine`), which is what lets the
evaluation reuse fp32's cached vectors for it (SentenceTransformerEmbedder.reference_id).
"""
from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import Any

from rag.embedder.onnx import _CHECK_TEXTS, ONNX_FILE, OnnxSentenceEncoder, _cosines, load_onnx_encoder
from rag.embedder.openvino_runtime import OpenVINOSession


def chained_cosine(a: float, b: float) -> float:
    """The least cosine between x and z when cos(x, y) >= a and cos(y, z) >= b: the angles add."""
    angle = math.acos(max(-1.0, min(1.0, a))) + math.acos(max(-1.0, min(1.0, b)))
    return math.cos(min(angle, math.pi))


class OpenVINOSentenceEncoder(OnnxSentenceEncoder):
    """OnnxSentenceEncoder on an OpenVINO compiled model of the same export."""

    def __init__(self, model_dir: str | os.PathLike[str], precision: str = "fp32"):
        self.precision = precision
        super().__init__(model_dir, "cpu")
        exported = self.check_min_cosine  # the export's own check against torch
        self.check_min_cosine = 0.0
        if precision == "fp32" and exported > 0.0:
            reference = load_onnx_encoder(str(model_dir), "cpu").encode(_CHECK_TEXTS, batch_size=2)
            mine = self.encode(_CHECK_TEXTS, batch_size=2)
            self.check_min_cosine = chained_cosine(exported, float(_cosines(reference, mine).min()))

    def _open_session(self, model_dir: Path, device: str) -> Any:
        return OpenVINOSession(model_dir / ONNX_FILE, self.precision, self.output_name)


@functools.lru_cache(maxsize=4)
def load_openvino_encoder(model_dir: str, precision: str) -> OpenVINOSentenceEncoder:
    """One compiled model per exported model and precision per process."""
    return OpenVINOSentenceEncoder(model_dir, precision)
