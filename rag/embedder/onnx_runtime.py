"""What the two ONNX Runtime backends (rag/embedder/onnx.py, rag/reranker/onnx.py) share:
onnxruntime's telemetry off, session options that follow OMP_NUM_THREADS, and tracing a
sentence-transformers module chain into one graph."""
from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Importing onnxruntime (1.32) writes a device id and a usage database under ~/.cache/Microsoft;
# a run writes only to its output and cache directories (tests/test_safety.py), so that is off
# unless the user sets the variable themselves.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")


def session_options() -> Any:
    """ORT session options; a sweep that limits threads per job (OMP_NUM_THREADS) limits these too."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        opts.intra_op_num_threads = int(threads)
    return opts


def export_module(module: Any, example: Mapping[str, Any], names: list[str], output: str, path: Path,
                  opset: int) -> None:
    """Traces `module` (a sentence-transformers module chain called with a feature dict) into one
    graph at `path`: the `names` inputs in, its `output` feature out, batch and sequence dynamic.
    `example` (the traced batch) must be padded: a batch without padding lets transformers drop
    the mask, and the trace would keep that shortcut for every batch."""
    import torch

    assert bool((example["attention_mask"] == 0).any()), "the tracing batch must contain padding"

    class Graph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = module

        def forward(self, *inputs: Any) -> Any:
            return self.module(dict(zip(names, inputs)))[output]

    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(Graph().eval(), tuple(example[n] for n in names), str(path), input_names=names,
                          output_names=[output], dynamic_axes={**axes, output: {0: "batch"}},
                          opset_version=opset, dynamo=False)
