"""Benchmark families of the harness (see docs/bench.md).

Each is a plain function `bench_<name>(quick: bool, full: bool, **sizes) -> dict` returning its
raw numbers plus a `table` of rows {measure, value, unit, note} (the format of
experiments/bench.py), an `environment` (with the load average: the machine may be shared) and
`wall_s`. quick: what fits in the 30-minute `make bench` on 2 cores; full: adds the long cases
(1M FAISS vectors with HNSW, v3/v4 with the LLM, 2000-text encoding runs). `tiny=True` runs a
seconds-long configuration for tests.

    python -m experiments.benchmarks [--full] [--only NAME ...] [--out outputs/bench/families]
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from experiments.benchmarks.bm25 import bench_bm25
from experiments.benchmarks.encoding import bench_encoding
from experiments.benchmarks.end_to_end import bench_end_to_end
from experiments.benchmarks.faiss_indexes import bench_faiss
from experiments.benchmarks.onnx_backend import bench_onnx
from experiments.benchmarks.ray_encoding import bench_ray_encoding
from experiments.benchmarks.scale import bench_scale

REGISTRY: dict[str, Callable[..., dict[str, Any]]] = {
    "bm25": bench_bm25,
    "faiss": bench_faiss,
    "encoding": bench_encoding,
    "onnx": bench_onnx,
    "end_to_end": bench_end_to_end,
    "scale": bench_scale,
    "ray_encoding": bench_ray_encoding,  # skips, with its reason, where ray is not installed
}
# Families a plain (quick) run leaves out: they need an optional extra and start a cluster, and
# the quick run must stay under 30 minutes on 2 cores. --full or --only runs them.
OPT_IN = {"ray_encoding"}


def describe(name: str) -> str:
    """First paragraph of a benchmark's docstring, without its final period (experiments/bench.py
    adds one)."""
    doc = (REGISTRY[name].__doc__ or name).strip()
    return " ".join(doc.split("\n\n")[0].split()).rstrip(".")
