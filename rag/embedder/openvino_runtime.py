"""An exported ONNX graph run by OpenVINO's CPU plugin instead of ONNX Runtime: what the
embedders' and the cross-encoder's `openvino` backends share (rag/embedder/openvino.py,
rag/reranker/onnx.py).

OpenVINO reads the same model.onnx the `onnx` backend exports, so there is no second export.
`precision` is OpenVINO's inference precision: `fp32` computes in float32 (the `onnx` backend's
vectors to float rounding), `bf16` runs the matrix multiplications in bfloat16, which the CPU
plugin maps onto AMX tiles where the CPU has them and onto AVX512-BF16 otherwise. Only CPUs that
compute bf16 natively are offered it (rag/embedder/backend_choice.py): elsewhere OpenVINO would
emulate it, slower than fp32.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from rag.types import RagError

HINTS = {"fp32": "f32", "bf16": "bf16"}  # our precision names -> OpenVINO's INFERENCE_PRECISION_HINT


def import_openvino() -> ModuleType:
    """`import openvino` without its usage telemetry. Importing openvino (2026.4) starts the model
    converter's telemetry, which counts uses in ~/intel/stats, writes a client id there and sends
    events out; a run writes only to its output and cache folders (tests/test_safety.py). The
    converter falls back to its own no-op stub when openvino_telemetry cannot be imported, so the
    import is refused to it, once, before openvino is first imported in this process."""
    if "openvino" not in sys.modules and "openvino_telemetry" not in sys.modules:
        # None in sys.modules: "this module cannot be imported" (the import system's own convention)
        sys.modules["openvino_telemetry"] = None  # type: ignore[assignment]
    try:
        import openvino
    except ImportError as e:
        raise RagError(f"backend=openvino needs the openvino package ({e}); pip install openvino") from e
    return openvino


class OpenVINOSession:
    """The one call of an ONNX Runtime InferenceSession that the encoders make, `run(outputs,
    feeds)`, on an OpenVINO compiled model. Synchronous, one request: PERFORMANCE_HINT LATENCY puts
    every inference thread on it, as ONNX Runtime's session does."""

    def __init__(self, onnx_file: Path, precision: str, output: str) -> None:
        if precision not in HINTS:
            raise RagError(f"OpenVINO precision must be one of {sorted(HINTS)}, got {precision!r}")
        ov = import_openvino()
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": HINTS[precision], "PERFORMANCE_HINT": "LATENCY"}
        # a sweep that limits threads per job (OMP_NUM_THREADS) limits these too, as for ONNX Runtime
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        core = ov.Core()
        try:
            self.compiled = core.compile_model(core.read_model(str(onnx_file)), "CPU", config)
        except RuntimeError as e:  # what OpenVINO raises for a graph or a precision its CPU plugin refuses
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise RagError(f"OpenVINO cannot compile {onnx_file} in {precision}: {first}") from None
        self.request = self.compiled.create_infer_request()
        self.output = self.compiled.output(output)
        self.precision = precision

    def run(self, outputs: list[str], feeds: Mapping[str, Any]) -> list[Any]:
        result = self.request.infer(dict(feeds))
        return [result[self.output].copy()]  # the request's buffer is reused by the next call
