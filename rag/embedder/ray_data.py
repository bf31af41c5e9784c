"""The bulk embedding stage on a Ray cluster (`embedder=minilm_ray`).

`RayEngine` is an engine of the `SentenceTransformerEmbedder` (its `engine` setting, a sub-node
with its own `_target_` in conf/embedder/minilm_ray.yaml): the embedder's `encode_blocks` runs as a
Ray Data job:
the texts, each with its row number, become a dataset; `map_batches` hands batches of
`ray_batch_size` texts to a pool of `num_workers` actors, each holding one copy of the model.

The actors write their vectors themselves into the rows of the .npy that the stage fills
(`rag.embedder.npy_writer.encode_to_npy` offers it as a `RowSink`: the unique-vectors file in the artifact
cache, in the `.partial-<key>` directory that a killed build resumes from), and only the row
numbers and a few statistics come back to the driver (`iter_batches`), which records the finished
blocks as before. The vectors never pass through the driver: 10M chunks of MiniLM are 15 GB that
would otherwise cross the object store and the network into one process, and N nodes would wait
on one writer. Batches finish in whatever order the actors finish; the row numbers travel with
them, so order does not matter.

The file is written with pwrite at its rows' byte offsets, then fsync'ed and closed before the
batch is reported (a block is recorded done only once its rows are on disk; on NFS, a close is
what makes writes visible to the other nodes). The artifact cache must therefore be on a
filesystem that every node mounts at the same path and that takes concurrent writes to disjoint
byte ranges (NFS, Lustre, GPFS, CephFS, a local disk for a one-machine cluster): a worker that
finds no file there, or another file, fails the stage with one line. Without a sink (a caller of
`encode_blocks` that wants the vectors themselves) the vectors come back to the driver.

Only the bulk stage goes to Ray. Questions at query time (`encode_queries`) are encoded by the
driver's own copy of the model: one question is milliseconds of work, a Ray round trip is not.

Where Ray runs:
- `address: null` starts a private Ray instance on this machine (127.0.0.1 only: no dashboard,
  no usage statistics) for the stage and stops it afterwards;
- `address: auto` joins the cluster that `ray start` runs on this machine; `host:port` joins a
  cluster's head node and `ray://host:port` goes through the Ray client; the driver disconnects
  afterwards and the cluster keeps running;
- when this process is already connected to Ray (a job run by `hydra/launcher=ragrig_ray`), the
  stage uses that connection, whatever `address` says, and leaves it open.

Ray (2.60, the version tested) turns on token authentication for the whole process when it
starts a local instance, and keeps it after shutdown: a process that ran a stage with
`address: null` can afterwards join only clusters that use tokens as well (RAY_AUTH_MODE=token).
A run is one process and one stage; this matters only to programs that run several pipelines in
one process.
"""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import os
import re
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from rag.store.cache import ArtifactCache
from rag.embedder.sentence_transformer import Engine, RowSink, SentenceTransformerEmbedder
from rag.config.schema import NonNegativeInt, Positive, PositiveInt, Text, checked
from rag.types import RagError

log = logging.getLogger(__name__)

INSTALL_HINT = 'pip install -e ".[distributed]"'


def require_ray() -> None:
    """One line instead of an ImportError from deep inside a run. find_spec does not import ray
    (seconds), so building the embedder stays cheap."""
    for module in ("ray", "pyarrow", "pandas"):
        try:
            missing = importlib.util.find_spec(module) is None
        except (ImportError, ValueError):
            missing = True
        if missing:
            raise RagError(f"embedder engine ray needs ray[data] (module {module!r} is missing): {INSTALL_HINT}")


def _import_ray() -> Any:
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as e:
        raise RagError(f"embedder engine ray needs ray[data] ({e}): {INSTALL_HINT}") from e
    return ray


class _EncodeActor:
    """One Ray actor of the pool: loads the model once, exactly as a local run does (the plain
    embedder with the same settings: package: models, paths and the ONNX backend all work), then
    encodes the batches it is handed."""

    def __init__(self, settings: dict[str, Any], threads: int | None, cache_root: str | None,
                 sink: dict[str, Any] | None = None):
        import ray

        if threads:
            # A CPU actor reserves `threads` cores; torch would otherwise start one thread per
            # core of the node and the actors of one node would fight over them.
            import torch

            torch.set_num_threads(threads)
        self.embedder = SentenceTransformerEmbedder(**settings)
        if cache_root is not None:
            self.embedder.use_cache(ArtifactCache(cache_root))
        self.error: RagError | None = None
        try:
            self.embedder.model  # loaded once, before the first batch
        except RagError as e:
            # Raised with the first batch instead: Ray hands an error raised in a call back with
            # the exception itself, while an actor that dies in its constructor is reported by
            # Ray Data as "the actor died", its error at best as text.
            self.error = e
        ctx = ray.get_runtime_context()
        self.worker = f"{ctx.get_node_id()}:{os.getpid()}"
        self.sink = sink  # where the vectors go (RayEngine._sink_args); None: back to the driver

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.error is not None:
            raise self.error
        t0, c0 = time.time(), time.process_time()
        texts = [str(t) for t in batch["text"]]
        # The local stage's own batching (by token count, see encode_blocks), within this batch.
        vecs = np.empty((len(texts), self.embedder.dim), np.float32)
        for rows, part in self.embedder.encode_blocks(texts, len(texts)):
            vecs[rows] = part
        out = {"row": batch["row"]}
        if self.sink is not None:
            self._write(np.asarray(batch["file_row"], dtype=np.int64), vecs)
        else:
            out["vector"] = vecs
        n = len(texts)
        cpu = time.process_time() - c0  # every thread of this actor: its share of the cores, whatever the load
        # Per row, so that the columns survive any re-blocking: CPU time shared out, wall-clock span.
        return {**out, "worker": np.full(n, self.worker, dtype=object),
                "cpu_s": np.full(n, cpu / max(n, 1)), "t0": np.full(n, t0), "t1": np.full(n, time.time())}

    def _write(self, rows: np.ndarray, vecs: np.ndarray) -> None:
        """Each vector into its row of the sink's file; on disk, and the file closed, on return."""
        sink = self.sink
        assert sink is not None, "vectors go back to the driver when the actor has no sink"
        path, row_bytes = sink["path"], sink["dim"] * 4
        node = self.worker.split(":")[0]
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError as e:
            raise RagError(f"embedder engine ray: a worker on node {node} cannot open {path} ({e.strerror}); "
                           "the artifact cache must be on a filesystem every node mounts at the same path") from e
        try:
            st = os.fstat(fd)
            if (st.st_ino, st.st_size) != (sink["inode"], sink["size"]):
                raise RagError(f"embedder engine ray: a worker on node {node} finds another file at {path} than "
                               "the driver's; the artifact cache must be on a filesystem every node mounts at the "
                               "same path")
            if vecs.shape[1] != sink["dim"]:
                raise RagError(f"embedder engine ray: the workers' model gives {vecs.shape[1]}-dimensional vectors, "
                               f"the driver's {sink['dim']}")
            for row, vec in zip(rows.tolist(), vecs):
                if os.pwrite(fd, vec, sink["offset"] + row * row_bytes) != row_bytes:
                    raise OSError(f"short write into {path}")
            os.fsync(fd)  # on disk before the driver records the block as done
        finally:
            os.close(fd)


class RayEngine(Engine):
    """Runs an embedder's bulk encoding (`encode_blocks`) on Ray actors.

    The engine is not part of the embedder's `id` (the cache key of the vectors: model,
    normalize, max_seq_length, and the backend when it is not torch): vectors built on Ray and
    vectors built locally are the same artifact -- one cache entry, the same float32 .npy -- so
    switching engines reuses the cache and nothing downstream changes.

    The embedder's `batch_size` is the model's own batch (texts per forward pass, as locally);
    `ray_batch_size` is how many texts one Ray batch hands to an actor. Inputs smaller than
    `min_texts` are encoded locally: starting actors and loading a model in each takes seconds
    (plus a cluster start for `address: null`), more than encoding a few hundred texts costs.
    The embedder's `device: auto` gives the actors one GPU each when the cluster has GPUs.
    """

    writes_rows = True  # encode_blocks takes a sink (RowSink): the actors write the vectors into its file

    @checked("embedder.engine")
    def __init__(
        self,
        address: Text | None = None,  # checked below, naming the forms it takes
        num_workers: PositiveInt = 2,
        ray_batch_size: PositiveInt = 256,
        num_cpus_per_worker: Positive = 1,
        object_store_memory: PositiveInt | None = None,
        min_texts: NonNegativeInt = 256,
    ):
        require_ray()
        if address is not None and not address.strip():
            raise RagError("embedder.engine.address must be null, 'auto', 'host:port' or 'ray://host:port', "
                           f"got {address!r}")
        self.address = address.strip() if address is not None else None
        self.num_workers = num_workers
        self.ray_batch_size = ray_batch_size
        self.num_cpus_per_worker = float(num_cpus_per_worker)
        self.object_store_memory = object_store_memory
        self.min_texts = min_texts
        self.last_run: dict[str, Any] = {}  # what the last encode_blocks did (engine, workers, timings)

    @staticmethod
    def _actor_args(embedder: SentenceTransformerEmbedder, on_gpu: bool, threads: int | None) -> dict[str, Any]:
        """What each actor builds: the plain embedder with the same settings (and artifact cache)."""
        # Ray gives a GPU actor its own device as cuda:0 (CUDA_VISIBLE_DEVICES).
        settings = embedder.settings(device="cuda" if on_gpu else "cpu", show_progress=False)
        cache_root = str(embedder.cache.root) if settings["backend"] == "onnx" else None
        return {"settings": settings, "threads": threads, "cache_root": cache_root}

    @staticmethod
    def _sink_args(sink: RowSink) -> dict[str, Any]:
        """What each actor needs to write into the sink's file, and to check that the file it opens
        is the driver's (its inode number and size: a shared filesystem shows the same to all nodes)."""
        st = os.stat(sink.path)
        return {"path": sink.path, "offset": int(sink.offset), "dim": int(sink.dim),
                "inode": st.st_ino, "size": st.st_size}

    @contextlib.contextmanager
    def _connection(self) -> Iterator[Any]:
        ray = _import_ray()
        if ray.is_initialized():
            yield ray
            return
        if self.address is None:
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            with loopback_ray():
                # "local": a new instance even when RAY_ADDRESS names a cluster (null means private).
                ray.init(address="local", num_cpus=math.ceil(self.num_workers * self.num_cpus_per_worker),
                         object_store_memory=self.object_store_memory, include_dashboard=False,
                         _node_ip_address="127.0.0.1", logging_level=logging.WARNING)
        else:
            loopback = loopback_ray() if _is_loopback(self.address) else contextlib.nullcontext()
            try:
                with loopback:
                    ray.init(address=self.address, logging_level=logging.WARNING)
            except (ConnectionError, ValueError, RuntimeError) as e:
                raise RagError(f"embedder.address={self.address}: cannot join the Ray cluster "
                               f"({(str(e).strip().splitlines() or [type(e).__name__])[0]})") from e
        try:
            yield ray
        finally:
            ray.shutdown()  # stops the instance started above, or disconnects from the cluster

    def encode_blocks(self, embedder: SentenceTransformerEmbedder, texts: list[str], block: int,
                      sink: RowSink | None = None) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """(rows, vectors) pairs, as the embedder's encode_blocks; with a `sink`, the actors write
        the vectors into its file and the pairs are (rows, None). Small inputs are encoded here,
        and their vectors come back whatever the sink."""
        if len(texts) < max(self.min_texts, 1):
            self.last_run = {"engine": "local", "texts": len(texts)}
            yield from embedder.local_blocks(texts, block)
            return
        t0 = time.perf_counter()
        with self._connection() as ray:
            connect_s = time.perf_counter() - t0
            yield from self._encode_on_ray(ray, embedder, texts, block, connect_s, sink)

    def _encode_on_ray(self, ray: Any, embedder: SentenceTransformerEmbedder, texts: list[str], block: int,
                       connect_s: float, sink: RowSink | None) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        gpus = ray.cluster_resources().get("GPU", 0)
        requested = str(embedder.requested_device)
        on_gpu = (requested == "auto" or requested.startswith("cuda")) and gpus > 0
        if requested.startswith("cuda") and not on_gpu:
            log.warning("embedder: device=%s but the Ray cluster has no GPU; the actors run on CPUs", requested)
        resources = {"num_gpus": 1} if on_gpu else {"num_cpus": self.num_cpus_per_worker}
        threads = None if on_gpu else max(1, int(self.num_cpus_per_worker))

        frames = self._frames(embedder, texts, block, None if sink is None else sink.rows)
        actor_args = self._actor_args(embedder, on_gpu, threads)
        if sink is not None:
            actor_args["sink"] = self._sink_args(sink)
        ctx = ray.data.DataContext.get_current()
        saved = (ctx.enable_progress_bars, ctx.print_on_execution_start, ctx.enable_auto_log_stats)
        ctx.enable_progress_bars = ctx.print_on_execution_start = bool(embedder.show_progress)
        ctx.enable_auto_log_stats = False
        workers: set[str] = set()
        done = 0
        actor_cpu = 0.0
        span = (float("inf"), float("-inf"))  # first batch started .. last batch finished, in the actors
        first_s = None
        t0 = time.perf_counter()
        try:
            ds = ray.data.from_pandas(frames).map_batches(
                _EncodeActor,
                fn_constructor_kwargs=actor_args,
                batch_size=self.ray_batch_size,
                batch_format="numpy",
                compute=ray.data.ActorPoolStrategy(size=self.num_workers),
                **resources,
            )
            for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
                rows = np.asarray(batch["row"], dtype=np.int64)
                vecs = None if sink is not None else np.ascontiguousarray(batch["vector"], dtype=np.float32)
                workers.update(str(w) for w in batch["worker"])
                actor_cpu += float(np.sum(batch["cpu_s"]))
                span = (min(span[0], float(np.min(batch["t0"]))), max(span[1], float(np.max(batch["t1"]))))
                done += len(rows)
                if first_s is None:
                    first_s = time.perf_counter() - t0
                yield rows, vecs
        except ray.exceptions.RayError as e:  # a failure inside an actor or the cluster, as one line
            cause = _rag_error_in(e)
            if cause is not None:
                raise RagError(str(cause)) from e
            first = (_plain(str(e)).strip().splitlines() or [type(e).__name__])[0]
            raise RagError(f"embedder engine ray failed: {type(e).__name__}: {first}") from e
        finally:
            ctx.enable_progress_bars, ctx.print_on_execution_start, ctx.enable_auto_log_stats = saved
        if done != len(texts):
            raise RagError(f"embedder engine ray returned {done} vectors for {len(texts)} texts")
        self.last_run = {
            "engine": "ray",
            "texts": len(texts),
            "num_workers": self.num_workers,
            "gpu": on_gpu,
            "threads_per_worker": threads,
            "workers": sorted(workers),
            "written_by_workers": done if sink is not None else 0,  # rows whose vectors never reached the driver
            "nodes": sorted({w.split(":")[0] for w in workers}),
            "connect_s": round(connect_s, 3),
            "first_vectors_s": round(first_s or 0.0, 3),  # actor start + model load + first batch
            "encode_s": round(time.perf_counter() - t0, 3),
            "actor_cpu_s": round(actor_cpu, 3),  # CPU time of the actors' encoding (model loads excluded)
            # Wall time from the first batch any actor started to the last one finished: the stage
            # without actor start and model load (node clocks: exact on one machine only).
            "encoding_span_s": round(span[1] - span[0], 3),
        }

    def _frames(self, embedder: SentenceTransformerEmbedder, texts: list[str], block: int,
                file_rows: np.ndarray | None = None) -> list[Any]:
        """The Ray batches, as pandas frames of (row, text), and each text's row of the sink's file
        (`file_rows[row]`) as `file_row` when there is one.

        They are cut from the texts sorted by token count within blocks, as the local stage forms
        its batches (local_blocks): an actor's batch then holds texts of similar length and pads as
        little as a local batch. Cut in input order, 128-text batches of PubMedQA chunks cost the
        actors 1.2-1.3x the local CPU time per chunk; sorted, the same (and the same vectors). One
        input block per Ray batch, so that every actor of the pool gets work from the start (a
        single block would go to a single actor)."""
        import pandas as pd

        step = self.ray_batch_size
        frames = []
        for start in range(0, len(texts), block):
            order = np.argsort(-embedder.token_counts(texts[start : start + block]), kind="stable") + start
            for a in range(0, len(order), step):
                rows = order[a : a + step].astype(np.int64)
                frame = pd.DataFrame({"row": rows, "text": [texts[i] for i in rows]})
                if file_rows is not None:
                    frame["file_row"] = np.asarray(file_rows, dtype=np.int64)[rows]
                frames.append(frame)
        return frames


@contextlib.contextmanager
def loopback_ray() -> Iterator[None]:
    """Keeps a Ray instance started (or joined) from this process on 127.0.0.1.

    Ray replaces 127.0.0.1 -- as the node address of a new instance, or as the host of a cluster
    address -- by this machine's network address, so that other machines can reach the node; a
    new instance then listens on every interface, and a cluster bound to 127.0.0.1 cannot be
    joined at all. Ray keeps loopback where it considers multi-node clusters unsupported
    (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0), a switch it reads once at import: it is set on the
    imported module for the duration of ray.init (the nodes it starts get 127.0.0.1 explicitly).
    """
    try:
        import ray._private.ray_constants as constants
    except ImportError:  # pragma: no cover - another Ray layout: Ray's own address rules apply
        yield
        return
    saved = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = saved


def _is_loopback(address: str) -> bool:
    """True for host:port addresses on 127.0.0.1/localhost (not for auto or ray://: the Ray
    client connects to exactly the address given)."""
    if "://" in address or ":" not in address:
        return False
    host = address.rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1")


def _rag_error_in(e: BaseException) -> RagError | None:
    """The RagError an actor raised, through Ray's wrappers: RayTaskError keeps it as `.cause`;
    an actor whose constructor raised dies, and ActorDiedError carries the error only as text."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [e]
    while stack:
        x = stack.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        cause = getattr(x, "cause", None)
        if isinstance(cause, RagError):  # the original, not Ray's copy that also names the actor
            return cause
        if isinstance(x, RagError):
            return x
        stack += [cause if isinstance(cause, BaseException) else None, x.__cause__, x.__context__]
    found = re.findall(r"^(?:rag\.types\.)?RagError: (.+)$", _plain(str(e)), flags=re.MULTILINE)
    return RagError(found[-1].strip()) if found else None


def _plain(text: str) -> str:
    """Without the terminal colour codes Ray puts into its error messages."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)
