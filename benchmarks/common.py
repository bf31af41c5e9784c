"""Shared helpers of the benchmark families: environment, memory probes, subprocess cases,
synthetic data (Zipf text, structured vectors), real texts and pipeline runs.

Every figure a benchmark reports is a ratio against a baseline measured in the same run (the
machine is shared and noisy), with the absolute numbers next to it.
"""
from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from rag.config.compose import PROJECT_ROOT

RESULT_MARK = "@@BENCH_RESULT@@"
# Folders of the main artifact cache that a "cold" benchmark cache links to rather than rebuilds:
# data preparation (rendered corpora) and trained/exported models, not the pipeline's artifacts.
SHARED_KINDS = ("corpus", "cross_encoder", "onnx_model")


# -- environment ----------------------------------------------------------------------------

def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "loadavg_1_5_15": loadavg(),
    }
    try:
        with open("/proc/meminfo") as f:
            env["mem_total_gb"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    from importlib import metadata

    dists = {"numpy": "numpy", "faiss": "faiss-cpu", "torch": "torch", "bm25s": "bm25s", "rank_bm25": "rank-bm25",
             "sentence_transformers": "sentence-transformers", "transformers": "transformers",
             "onnxruntime": "onnxruntime", "openvino": "openvino"}
    for key, dist in dists.items():  # versions without importing (importing torch takes seconds)
        try:
            env[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            env[key] = None
    if "torch" in sys.modules:
        env["torch_threads"] = sys.modules["torch"].get_num_threads()
    return env


def cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run_mode(tiny: bool, full: bool) -> str:
    """"tiny" (a test's run: it wins over full), "full" or "quick": what a family sizes its run by."""
    if tiny:
        return "tiny"
    return "full" if full else "quick"


def start() -> dict[str, Any]:
    """What finish() needs: start time, CPU time and load average."""
    return {"t0": time.perf_counter(), "cpu0": cpu_seconds(), "load": loadavg()}


def finish(result: dict[str, Any], clock: dict[str, Any]) -> dict[str, Any]:
    """Adds what every benchmark result carries: wall time, CPU time (this process and its
    children; on an otherwise idle machine wall time is about cpu_s / cores-used), and the load
    average before and after (other processes on the machine stretch every wall time)."""
    result["wall_s"] = round(time.perf_counter() - clock["t0"], 2)
    result["cpu_s"] = round(cpu_seconds() - clock["cpu0"], 2)
    result["loadavg_start"] = clock["load"]
    result["loadavg_end"] = loadavg()
    result.setdefault("environment", environment())
    return result


def row(measure: str, value: Any, unit: str = "", note: str = "") -> dict[str, Any]:
    if isinstance(value, float):
        value = float(f"{value:.4g}") if abs(value) < 1e4 else round(value, 1)
    return {"measure": measure, "value": value, "unit": unit, "note": note}


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 4)


# -- memory ---------------------------------------------------------------------------------

def proc_mem() -> dict[str, int]:
    """VmRSS, VmHWM (peak RSS), RssAnon, RssFile of this process, in bytes (Linux)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                    out[key] = int(line.split()[1]) * 1024
    except OSError:
        import resource

        out["VmHWM"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def reset_peak() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0), so a later VmHWM is the peak of what
    follows. tracemalloc would miss numpy/C allocations; RSS sees them all."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakSampler:
    """Polls RssAnon and RssFile every `interval` s in a thread: VmHWM is their peak sum, and
    memory-mapped files written through (np.memmap) count in it as file-backed pages, which the
    kernel can write back and drop; the anonymous peak is the memory a run really needs."""

    def __init__(self, interval: float = 0.05):
        import threading

        self.interval = interval
        self.peak_anon = self.peak_file = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            m = proc_mem()
            self.peak_anon = max(self.peak_anon, m.get("RssAnon", 0))
            self.peak_file = max(self.peak_file, m.get("RssFile", 0))
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakSampler:  # noqa: PYI034 (typing.Self needs Python 3.11)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        m = proc_mem()
        self.peak_anon = max(self.peak_anon, m.get("RssAnon", 0))
        self.peak_file = max(self.peak_file, m.get("RssFile", 0))


def mb(nbytes: float) -> float:
    return round(nbytes / 2**20, 1)


# -- subprocess cases -----------------------------------------------------------------------

def run_case(module: str, func: str, kwargs: dict[str, Any], timeout: float = 3600,
             env: dict[str, str] | None = None) -> dict[str, Any]:
    """Runs `module.func(**kwargs)` in a fresh Python process (so its peak RSS is its own) and
    returns its JSON result with the process's `exit_code`; a failure is returned as {"error": ...}."""
    code = (
        "import json, sys\n"
        f"from {module} import {func} as f\n"
        "r = f(**json.loads(sys.argv[1]))\n"
        f"print({RESULT_MARK!r} + json.dumps(r, default=str), flush=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    t0 = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", code, json.dumps(kwargs)], check=False, capture_output=True,
                              text=True, timeout=timeout, env=env, cwd=str(PROJECT_ROOT))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            res = json.loads(line[len(RESULT_MARK):])
            res["process_wall_s"] = round(time.perf_counter() - t0, 2)
            # A process can crash after reporting (a library's threads at interpreter exit): its
            # result stands, and the exit code says how it ended.
            res["exit_code"] = done.returncode
            if done.returncode:
                res["stderr_tail"] = done.stderr.strip()[-3000:]
            return res
    return {"error": f"exit {done.returncode}: {done.stderr.strip()[-1500:]}"}


# -- timing ---------------------------------------------------------------------------------

def per_call_ms(fn: Callable[[Any], Any], items: list[Any], budget_s: float | None = None, min_calls: int = 5) -> list[float]:
    """Latency of fn(item) for each item, in ms (stops early past budget_s, after min_calls)."""
    out: list[float] = []
    start = time.perf_counter()
    for item in items:
        t0 = time.perf_counter()
        fn(item)
        out.append(1000.0 * (time.perf_counter() - t0))
        if budget_s is not None and len(out) >= min_calls and time.perf_counter() - start > budget_s:
            break
    return out


def median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 4) if xs else None


# -- synthetic text -------------------------------------------------------------------------

_LETTERS = np.array(list("bcdfghjklmnpqrstvwxz"))
_VOWELS = np.array(list("aeiou"))


@functools.lru_cache(maxsize=4)
def zipf_vocabulary(size: int, seed: int = 0) -> tuple[str, ...]:
    """`size` distinct pronounceable pseudo-words (consonant-vowel syllables ending in a
    consonant, 2-4 syllables), none an English stopword; Snowball stemming leaves almost all of
    them whole."""
    from rag.retriever.tokens import _stopwords

    rng = np.random.default_rng(seed)
    stop = _stopwords()
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < size:
        n = size - len(words) + 1000
        syl = rng.integers(2, 5, n)
        for k in syl:
            w = "".join(_LETTERS[rng.integers(0, 20)] + _VOWELS[rng.integers(0, 5)] for _ in range(k))
            w += _LETTERS[rng.integers(0, 20)]
            if w not in seen and w not in stop:
                seen.add(w)
                words.append(w)
                if len(words) == size:
                    break
    return tuple(words)


def zipf_cdf(vocab_size: int, s: float) -> np.ndarray:
    p = 1.0 / np.arange(1, vocab_size + 1, dtype=np.float64) ** s
    return np.cumsum(p / p.sum())


def zipf_texts(n_docs: int, vocab_size: int = 50_000, s: float = 1.1, mean_len: int = 60, seed: int = 0,
               block: int = 20_000) -> Iterator[str]:
    """Synthetic chunks: token counts ~ Poisson(mean_len) (at least 5), tokens drawn from a Zipf(s)
    law over a pseudo-word vocabulary. Generated block by block (bounded memory)."""
    vocab = np.array(zipf_vocabulary(vocab_size, seed=1234), dtype=object)
    cdf = zipf_cdf(vocab_size, s)
    rng = np.random.default_rng(seed)
    for start in range(0, n_docs, block):
        m = min(block, n_docs - start)
        lengths = np.maximum(rng.poisson(mean_len, m), 5)
        ids = np.searchsorted(cdf, rng.random(int(lengths.sum())), side="right").clip(max=vocab_size - 1)
        words = vocab[ids]
        ends = np.cumsum(lengths)
        begins = ends - lengths
        for a, b in zip(begins.tolist(), ends.tolist()):
            yield " ".join(words[a:b])


def zipf_queries(n: int, vocab_size: int = 50_000, s: float = 1.1, seed: int = 99, min_terms: int = 3,
                 max_terms: int = 6) -> list[str]:
    """Queries of 3-6 terms drawn from the same Zipf law as the corpus."""
    vocab = zipf_vocabulary(vocab_size, seed=1234)
    cdf = zipf_cdf(vocab_size, s)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(min_terms, max_terms + 1))
        ids = np.searchsorted(cdf, rng.random(k), side="right").clip(max=vocab_size - 1)
        out.append(" ".join(vocab[i] for i in ids))
    return out


def write_lines(path: Path, lines: Iterator[str]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line)
            f.write("\n")
            n += 1
    return n


def read_lines(path: str | Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


# -- synthetic vectors ----------------------------------------------------------------------

def structured_vectors(n: int, dim: int = 384, rank: int = 48, clusters: int = 2000, noise: float = 0.35,
                       seed: int = 0, basis_seed: int = 7, block: int = 100_000) -> np.ndarray:
    """float32 [n, dim], unit norm, shaped like sentence embeddings rather than uniform noise:
    points of a `rank`-dimensional space (cluster centres plus spread), mapped into `dim`
    dimensions by a fixed random basis, plus isotropic noise. On uniform random vectors every
    neighbour is nearly equidistant and approximate search looks broken; here the top-10 is
    well separated, as with real embeddings. `basis_seed` fixes the space (queries and corpus
    must share it); `seed` draws the points."""
    brng = np.random.default_rng(basis_seed)
    basis = (brng.standard_normal((rank, dim)) / np.sqrt(rank)).astype(np.float32)
    centres = brng.standard_normal((clusters, rank)).astype(np.float32)
    rng = np.random.default_rng(seed)
    out = np.empty((n, dim), np.float32)
    for a in range(0, n, block):
        m = min(block, n - a)
        z = centres[rng.integers(0, clusters, m)] + 0.6 * rng.standard_normal((m, rank), dtype=np.float32)
        x = z @ basis
        x += (noise * np.sqrt(rank / dim)) * rng.standard_normal((m, dim), dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        out[a : a + m] = x
    return out


# -- real texts -----------------------------------------------------------------------------

def pubmedqa_path() -> Path:
    from rag.config.compose import data_dir

    return data_dir() / "pubmedqa" / "ori_pqal.json"


def pubmedqa_questions(n: int) -> list[str]:
    data = json.loads(pubmedqa_path().read_text())
    return [rec["QUESTION"] for rec in list(data.values())[:n]]


def pubmedqa_chunks(n: int) -> list[str]:
    """The first n chunks of the PubMedQA abstracts, cut by the harness's default chunker
    (conf/chunker/sliding_window.yaml: 512 characters, 64 overlap)."""
    from omegaconf import DictConfig, OmegaConf

    from rag.corpus import PubMedQACorpus
    from rag.run.session import create
    from rag.run.settings import chunker_node

    docs = PubMedQACorpus(pubmedqa_path()).load()
    node = OmegaConf.load(PROJECT_ROOT / "conf" / "chunker" / "sliding_window.yaml")
    assert isinstance(node, DictConfig), "a chunker config is a mapping"
    chunker = create(chunker_node(node))
    out: list[str] = []
    for d in docs:
        out.extend(c.text for c in chunker.split(d))
        if len(out) >= n:
            break
    return out[:n]


# -- pipeline runs --------------------------------------------------------------------------

def main_cache() -> Path:
    return Path(compose([]).paths.cache)


def compose(overrides: list[str]) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from rag.config.compose import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


def cold_cache(root: Path, share_from: Path | None = None) -> Path:
    """An empty artifact cache whose data-preparation and model folders (SHARED_KINDS) link to
    `share_from`, so a cold run rebuilds chunks, vectors, indexes and BM25, not corpora."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    if share_from is not None:
        for kind in SHARED_KINDS:
            (Path(share_from) / kind).mkdir(parents=True, exist_ok=True)
            os.symlink(Path(share_from).resolve() / kind, root / kind)
    return root


def run_python(argv: list[str], timeout: float | None = None,
               env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """`python <argv>` in a fresh process from the project root, as a user runs it (offline, quiet
    tokenizers): the finished process and its wall seconds, imports and model loading included.
    subprocess.TimeoutExpired past `timeout`."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, *argv], check=False, capture_output=True,
                          text=True, timeout=timeout, env=full_env, cwd=str(PROJECT_ROOT))
    return done, time.perf_counter() - t0


def run_py(args: list[str], timeout: float | None = None,
           env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """`python run.py <args>` (run_python)."""
    return run_python([str(PROJECT_ROOT / "run.py"), *args], timeout, env)


def run_pipeline_subprocess(overrides: list[str], out_dir: Path, timeout: float = 3600) -> dict[str, Any]:
    """`python run.py <overrides>` in a fresh process, as a user runs it; returns its metrics.json
    plus the process wall time (model loading and imports included)."""
    out_dir = Path(out_dir)
    try:
        done, wall = run_py([*overrides, f"hydra.run.dir={out_dir}", "embedder.show_progress=false"], timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s", "overrides": overrides}
    metrics = out_dir / "metrics.json"
    if done.returncode != 0 or not metrics.exists():
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-1500:]}", "overrides": overrides}
    res = json.loads(metrics.read_text())
    res["process_wall_s"] = round(wall, 2)
    return res


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix=f"ragrig-bench-{prefix}-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run_pipeline_inprocess(overrides: list[str], out_dir: Path) -> dict[str, Any]:
    """rag.run.pipeline.run in this process (models already loaded stay loaded): for tiny test runs."""
    from rag.run.pipeline import run

    cfg = compose([*overrides, "embedder.show_progress=false"])
    t0 = time.perf_counter()
    try:
        res = run(cfg, out_dir)
    except Exception as e:  # noqa: BLE001 - reported, not raised
        return {"error": f"{type(e).__name__}: {e}", "overrides": overrides}
    res["process_wall_s"] = round(time.perf_counter() - t0, 2)
    return res


def tiny_dataset(root: Path, n_docs: int = 12, n_questions: int = 4) -> list[str]:
    """A few PubMedQA abstracts and questions as JSONL files, and the overrides that point a run
    at them (for tests of the benchmark code, not for figures)."""
    root.mkdir(parents=True, exist_ok=True)
    data = json.loads(pubmedqa_path().read_text())
    items = list(data.items())[:n_docs]
    with open(root / "corpus.jsonl", "w") as f:
        for pmid, rec in items:
            text = "\n\n".join(rec["CONTEXTS"]) + "\n\n" + rec["LONG_ANSWER"]
            f.write(json.dumps({"id": f"pmid:{pmid}", "text": text, "source": "pubmed"}) + "\n")
    with open(root / "qa.jsonl", "w") as f:
        for pmid, rec in items[:n_questions]:
            f.write(json.dumps({"id": f"q{pmid}", "question": rec["QUESTION"], "answer": rec["LONG_ANSWER"],
                                "source": f"pmid:{pmid}", "corpus": "pubmed"}) + "\n")
    return ["corpus=jsonl", f"corpus.path={root / 'corpus.jsonl'}", "qa=jsonl", f"qa.path={root / 'qa.jsonl'}",
            "slice.docs_per_source=null", "slice.questions_per_corpus=null", "eval.bootstrap.resamples=100"]
