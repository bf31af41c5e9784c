"""Benchmark families of the harness (see docs/reference/bench.md).

Each is a plain function `bench_<name>(quick: bool, full: bool, **sizes) -> dict` returning its
raw numbers plus a `table` of rows {measure, value, unit, note}, an `environment` (with the load
average: the machine may be shared) and `wall_s`. quick: what fits in the 30-minute `make bench`
on 2 cores; full: adds the long cases (1M FAISS vectors with HNSW, v3/v4 with the LLM, 2000-text
encoding runs). `tiny=True` runs a seconds-long configuration for tests. A family that takes
`overrides` gets the command line's Hydra overrides; one that takes `work_dir` gets
<out>/<name> for its runs and caches.

    python -m benchmarks [--full] [--only NAME ...] [--out outputs/bench/families] [-- OVERRIDES]

A family's module is imported when it is first looked up, so that running one family needs only
that family's libraries (the generation family runs on a GPU machine that has no FAISS or Hydra).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

FAMILIES = {
    "bm25": "benchmarks.bm25:bench_bm25",
    "faiss": "benchmarks.faiss_indexes:bench_faiss",
    "encoding": "benchmarks.encoding:bench_encoding",
    "onnx": "benchmarks.onnx_backend:bench_onnx",
    "reranker_backends": "benchmarks.reranker_backends:bench_reranker_backends",
    "end_to_end": "benchmarks.end_to_end:bench_end_to_end",
    "scale": "benchmarks.scale:bench_scale",
    "medline": "benchmarks.medline:bench_medline",
    "ray_encoding": "benchmarks.ray_encoding:bench_ray_encoding",  # skips, with its reason, without ray
    "generation": "benchmarks.generation:bench_generation",
    "serving": "benchmarks.serving:bench_serving",  # skips, with its reason, without the serving extra
    "served_models": "benchmarks.served_models:bench_served_models",  # skips without Infinity (make infinity)
    "generation_speed": "benchmarks.generation_speed:bench_generation_speed",
    "openvino_generation": "benchmarks.openvino_generation:bench_openvino_generation",
    "retrieval_latency": "benchmarks.retrieval_latency:bench_retrieval_latency",
    "alpha_sweep": "benchmarks.sweeps:bench_alpha_sweep",
    "grid_sweep": "benchmarks.sweeps:bench_grid_sweep",
    "reranking": "benchmarks.reranking:bench_reranking",
    "demo": "benchmarks.demo:bench_demo",
    "xdomain": "benchmarks.xdomain:bench_xdomain",
    "own_data": "benchmarks.own_data:bench_own_data",
}
# Families a plain (quick) run leaves out, because the quick run must stay under 30 minutes on 2
# cores: ray_encoding needs an optional extra and starts a cluster; generation loads the LLM on
# every device it compares; serving starts servers and generates 36 answers five times. --full
# or --only runs them.
# retrieval_latency embeds the whole `mixed` corpus when its vectors are not cached (~7 min);
# reranking trains the cross-encoder when it is not cached (~4 min) and reranks 382 questions (~4 min).
# xdomain runs v1..v4 and three ablations on three corpora (21 runs, 80 min with an empty cache);
# own_data runs v1..v4 twice on one of them with an empty cache (about 10 min).
OPT_IN = {"ray_encoding", "generation", "serving", "served_models", "retrieval_latency", "reranking", "xdomain",
          "own_data"}
# The sweep costs, the demo's time and the cross-domain bed run only when named (--only), --full
# included: `make bench` runs them on their own (the first two into outputs/bench before the
# families, outputs/bench/families; xdomain after them, into outputs/bench/xdomain).
SWEEPS = {"alpha_sweep", "grid_sweep", "demo", "xdomain", "own_data"}


class _Registry(Mapping[str, Callable[..., dict[str, Any]]]):
    """name -> benchmark function, imported on first lookup."""

    def __getitem__(self, name: str) -> Callable[..., dict[str, Any]]:
        module, func = FAMILIES[name].split(":")
        return getattr(importlib.import_module(module), func)

    def __iter__(self) -> Iterator[str]:
        return iter(FAMILIES)

    def __len__(self) -> int:
        return len(FAMILIES)


REGISTRY = _Registry()


def describe(name: str) -> str:
    """First paragraph of a benchmark's docstring, without its final period."""
    doc = (REGISTRY[name].__doc__ or name).strip()
    return " ".join(doc.split("\n\n")[0].split()).rstrip(".")
