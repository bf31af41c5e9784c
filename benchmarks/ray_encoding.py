"""Ray encoding: the embedding stage on Ray Data (`embedder=minilm_ray`, rag.embedder.ray_data) with one
and with two actors, against the local stage, on a Ray cluster started here.

- cluster: a head node and a worker node, both on 127.0.0.1, started by the benchmark (its start
  is reported, never counted in a throughput). The head gets no CPUs, so every actor runs on the
  worker node, which gets the machine's 2 cores: 1 actor x 2 CPUs (2 torch threads) or 2 actors
  x 1 CPU (1 thread each) -- the same cores, split two ways. The driver connects once; each Ray
  run then starts its actors (each imports torch and loads the model) and encodes.
- local: `rag.embedder.npy_writer.encode_to_npy` with the `SentenceTransformerEmbedder` of
  conf/embedder/minilm.yaml, model already loaded, torch's default threads (one per core).
- Ray: the same `encode_to_npy` with the embedder's Ray engine (same model settings, `ray_batch_size`
  texts per actor call), so both sides include writing the .npy. Reported per Ray run: the whole
  stage (what a run pays), and the encoding alone, from the first batch an actor starts to the
  last one it finishes (the rate a long corpus approaches; the rest is actor start and model
  load).
- runs in mirrored order (local, 1, 2, 2, 1, local) so that drifting load hits every side; the
  vectors of every Ray run are compared with the local ones.

Texts: the first chunks of the PubMedQA abstracts cut by the default chunker (512 characters).
Wall times stretch when other processes share the cores; CPU time less so: each run also records
its CPU seconds (this process's, plus for Ray the actors' own encoding time, measured inside them,
model loads excluded). The family's overall `cpu_s` covers this process only.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import finish, pubmedqa_chunks, ratio, row, run_mode, scratch_dir, start
from benchmarks.encoding import loaded_embedder, make_embedder, texts_facts, texts_note

CORES = 2  # the worker node's CPUs: what the local side uses too (torch's default on this machine)
# Node processes: small object stores (texts and vectors of a 2000-chunk run are ~5 MB).
NODE: dict[str, Any] = {"object_store_memory": 100 * 2**20, "include_dashboard": False, "node_ip_address": "127.0.0.1"}


def _skipped(reason: str, clock: dict[str, Any]) -> dict[str, Any]:
    return finish({"skipped": reason, "table": [row("Ray encoding", "skipped", "", reason)]}, clock)


def start_cluster() -> tuple[Any, float]:
    """A head (no CPUs: it only coordinates) and one worker node with CORES CPUs, on 127.0.0.1."""
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    t0 = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "num_cpus": 0})
    try:
        cluster.add_node(**NODE, num_cpus=CORES)
        cluster.wait_for_nodes()
    except BaseException:
        cluster.shutdown()
        raise
    return cluster, time.perf_counter() - t0


def ray_runs(sides: dict[str, Any], order: list[str],
             texts: list[str]) -> tuple[list[dict[str, Any]], dict[str, list[np.ndarray]], float, float]:
    """Each side of `order` encodes `texts` (encode_to_npy) on a cluster started here: (the runs,
    each side's vectors, cluster start seconds, driver connect seconds)."""
    import ray

    from rag.embedder.npy_writer import encode_to_npy
    from rag.embedder.ray_data import loopback_ray

    runs: list[dict[str, Any]] = []
    vectors: dict[str, list[np.ndarray]] = {s: [] for s in sides}
    cluster, cluster_start_s = start_cluster()
    try:
        t0 = time.perf_counter()
        with loopback_ray():
            ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
        connect_s = time.perf_counter() - t0
        with scratch_dir("ray-encoding") as tmp:
            for i, side in enumerate(order):
                emb = sides[side]
                path = Path(tmp) / f"{i}-{side}.npy"
                c0 = time.process_time()
                t0 = time.perf_counter()
                encode_to_npy(emb, texts, path)
                wall = time.perf_counter() - t0
                cpu = time.process_time() - c0
                run: dict[str, Any] = {"side": side, "s": round(wall, 3), "chunks_per_s": round(len(texts) / wall, 2),
                                       "driver_cpu_s": round(cpu, 3), "cpu_s": round(cpu, 3)}
                if side != "local":
                    info = dict(emb.last_run)
                    assert info.get("engine") == "ray", info  # never the small-input local path
                    steady = len(texts) / max(info["encoding_span_s"], 1e-9)
                    run.update(first_vectors_s=info["first_vectors_s"], encoding_span_s=info["encoding_span_s"],
                               startup_s=round(wall - info["encoding_span_s"], 3), steady_chunks_per_s=round(steady, 2),
                               actors=len(info["workers"]), threads_per_actor=info["threads_per_worker"],
                               actor_cpu_s=info["actor_cpu_s"], cpu_s=round(cpu + info["actor_cpu_s"], 3))
                runs.append(run)
                vectors[side].append(np.load(path))
                path.unlink()
    finally:
        ray.shutdown()
        cluster.shutdown()
    return runs, vectors, cluster_start_s, connect_s


def bench_ray_encoding(quick: bool = True, full: bool = False, tiny: bool = False, n_texts: int | None = None,
                       ray_batch_size: int | None = None) -> dict[str, Any]:
    """Embedding stage on Ray Data (`embedder=minilm_ray`, 1 actor x 2 threads and 2 actors x 1
    thread, on a local head + worker cluster) vs the local stage, on 1000 PubMedQA chunks (2000
    with full); cluster start-up and actor start reported separately."""
    clock = start()
    for module in ("ray", "pyarrow"):
        if importlib.util.find_spec(module) is None:
            return _skipped(f"{module} is not installed (pip install -e \".[distributed]\")", clock)

    n_texts = n_texts or {"tiny": 48, "quick": 1000, "full": 2000}[run_mode(tiny, full)]
    ray_batch_size = ray_batch_size or (16 if tiny else 128)
    texts = pubmedqa_chunks(n_texts)
    local, load_s = loaded_embedder(texts)

    def ray_embedder(workers: int) -> Any:
        engine = {"_target_": "rag.embedder.ray_data.RayEngine", "num_workers": workers,
                  "num_cpus_per_worker": CORES // workers, "ray_batch_size": ray_batch_size, "min_texts": 0}
        return make_embedder("minilm_ray", device="cpu", engine=engine)

    sides = {"local": local, "ray1": ray_embedder(1), "ray2": ray_embedder(2)}
    order = ["local", "ray1", "ray2"] if tiny else ["local", "ray1", "ray2", "ray2", "ray1", "local"]
    runs, vectors, cluster_start_s, connect_s = ray_runs(sides, order, texts)

    reference = vectors["local"][0]
    max_abs = {s: float(max(np.abs(v - reference).max() for v in vs)) for s, vs in vectors.items()}

    def total(side: str, key: str = "s") -> float:
        return sum(r[key] for r in runs if r["side"] == side)

    def med(side: str, key: str) -> float:
        return round(statistics.median(r[key] for r in runs if r["side"] == side), 3)

    n = len(texts)
    per_side = {s: round(n * sum(r["side"] == s for r in runs) / total(s), 2) for s in sides}
    result: dict[str, Any] = {
        **texts_facts(texts, local.batch_size),
        "ray_batch_size": ray_batch_size,
        "cores": CORES,
        "layouts": {"ray1": "1 actor x 2 CPUs, 2 torch threads", "ray2": "2 actors x 1 CPU, 1 torch thread each",
                    "local": "this process, torch default threads"},
        "cluster_start_s": round(cluster_start_s, 3),
        "connect_s": round(connect_s, 3),
        "local_model_load_s": round(load_s, 3),
        "local_chunks_per_s": per_side["local"],
        "ray1_chunks_per_s": per_side["ray1"],
        "ray2_chunks_per_s": per_side["ray2"],
        "ray1_vs_local": ratio(per_side["ray1"], per_side["local"]),
        "ray2_vs_local": ratio(per_side["ray2"], per_side["local"]),
        "ray1_first_vectors_s": med("ray1", "first_vectors_s"),
        "ray2_first_vectors_s": med("ray2", "first_vectors_s"),
        "ray1_startup_s": med("ray1", "startup_s"),
        "ray2_startup_s": med("ray2", "startup_s"),
        "ray1_steady_chunks_per_s": med("ray1", "steady_chunks_per_s"),
        "ray2_steady_chunks_per_s": med("ray2", "steady_chunks_per_s"),
        "max_abs_diff_vs_local": max(max_abs["ray1"], max_abs["ray2"]),
        "max_abs_diff_local_repeat": max_abs["local"],
        "runs": runs,
    }
    cpu_per_1k = {s: round(1000 * total(s, "cpu_s") / (n * sum(r["side"] == s for r in runs)), 3) for s in sides}
    result["cpu_s_per_1000_chunks"] = cpu_per_1k
    result["ray1_vs_local_cpu"] = ratio(cpu_per_1k["local"], cpu_per_1k["ray1"])
    result["ray2_vs_local_cpu"] = ratio(cpu_per_1k["local"], cpu_per_1k["ray2"])
    result["ray1_steady_vs_local"] = ratio(result["ray1_steady_chunks_per_s"], per_side["local"])
    result["ray2_steady_vs_local"] = ratio(result["ray2_steady_chunks_per_s"], per_side["local"])
    result["table"] = ray_table(result)
    return finish(result, clock)


def ray_table(result: dict[str, Any]) -> list[dict[str, Any]]:
    repeats = sum(r["side"] == "ray1" for r in result["runs"])
    cpu_per_1k = result["cpu_s_per_1000_chunks"]
    note_runs = f"{repeats} runs each, mirrored order" if repeats > 1 else "1 run each"
    return [
        row("local embedding stage (encode_to_npy, SentenceTransformerEmbedder)", result["local_chunks_per_s"], "chunks/s",
            texts_note(result) + "; model loaded"),
        row("Ray, 1 actor x 2 threads: whole stage", result["ray1_chunks_per_s"], "chunks/s",
            f"{note_runs}; includes actor start + model load (~{result['ray1_startup_s']} s)"),
        row("Ray, 2 actors x 1 thread: whole stage", result["ray2_chunks_per_s"], "chunks/s",
            f"includes actor start + model load (~{result['ray2_startup_s']} s)"),
        row("**Ray 1 actor / local (whole stage)**", result["ray1_vs_local"], "x", ""),
        row("**Ray 2 actors / local (whole stage)**", result["ray2_vs_local"], "x", ""),
        row("Ray, 1 actor: encoding only (first batch start to last batch end)", result["ray1_steady_chunks_per_s"],
            "chunks/s", f"{result['ray1_steady_vs_local']}x local; the rate a long corpus approaches"),
        row("Ray, 2 actors: encoding only", result["ray2_steady_chunks_per_s"], "chunks/s",
            f"{result['ray2_steady_vs_local']}x local"),
        row("CPU seconds per 1000 chunks: local / Ray 1 actor / Ray 2 actors",
            f"{cpu_per_1k['local']} / {cpu_per_1k['ray1']} / {cpu_per_1k['ray2']}", "s",
            f"Ray: actors' encoding + driver; efficiency vs local {result['ray1_vs_local_cpu']}x / "
            f"{result['ray2_vs_local_cpu']}x (less sensitive to other load than wall time)"),
        row("cluster start (head + worker on 127.0.0.1; excluded above)", result["cluster_start_s"], "s",
            f"driver connect {result['connect_s']} s, also excluded"),
        row("max |Ray - local| vector difference", result["max_abs_diff_vs_local"], "",
            f"local vs its own repeat: {result['max_abs_diff_local_repeat']}"),
    ]
