"""Embeddings from any OpenAI-compatible `/embeddings` endpoint (vLLM, TEI, Ollama, llama.cpp's
server, Infinity, OpenAI): `embedder=openai`.

Texts go in batches of `batch_size`, `concurrency` requests at a time, over the shared transport
(rag/endpoint.py: retries with backoff, Retry-After, timeouts, one-line errors, the key only from
`api_key_env`). The vectors are cached like any embedder's (rag.artifacts, kind `vectors`) under
`id`: the served model's name, `dimensions` and normalisation, never the URL or the key, so the
same model moved to another host keeps its vectors. The first batch settles the dimension; every
later batch, a query and the cached index must agree with it, and a batch that does not is an
error: nothing of a failed build is cached.

The evaluation embedder E stays local and fixed (eval.embedder): it defines the metrics.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from rag.endpoint import Endpoint, EndpointError, map_concurrent
from rag.models import TokenCounter
from rag.types import RagError


class OpenAIEmbedder:
    """`encode(texts) -> float32 [n, dim]` through a served model; L2-normalized by default."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = None,
        batch_size: int = 64,
        concurrency: int = 4,
        normalize: bool = True,
        dimensions: int | None = None,
        query_prefix: str = "",
        show_progress: bool = True,
        timeout_s: float = 60.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        cache_namespace: str | None = None,
        tokenizer: str | None = None,
    ):
        for name, value in (("batch_size", batch_size), ("concurrency", concurrency)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise RagError(f"embedder.{name} must be a positive integer, got {value!r}")
        if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions <= 0):
            raise RagError(f"embedder.dimensions must be a positive integer or null, got {dimensions!r}")
        self.endpoint = Endpoint(base_url, str(model), api_key_env, timeout_s, max_retries, backoff_s, max_backoff_s,
                                 what="embedder", connections=concurrency)
        self.model_name = str(model)
        self.batch_size, self.concurrency = batch_size, concurrency
        self.normalize = bool(normalize)
        self.dimensions = dimensions
        self.query_prefix = str(query_prefix)
        self.show_progress = bool(show_progress)
        self.cache_namespace = cache_namespace
        # count tokens here instead of taking the server's usage
        self.counter = TokenCounter(tokenizer, "embedder.tokenizer") if tokenizer else None
        self._dim: int | None = None
        self._checked = False
        self._lock = threading.Lock()
        self.usage = {"requests": 0, "prompt_tokens": 0, "texts": 0, "seconds": 0.0, "tokens_reported": True,
                      "tokens_counted_by": "tokenizer" if tokenizer else "server"}

    def __repr__(self) -> str:
        return f"OpenAIEmbedder({self.endpoint!r})"

    @property
    def id(self) -> dict[str, Any]:
        """What determines the vectors: the served model, its output size and the normalisation."""
        ident = {"engine": "openai", "model": self.model_name, "dimensions": self.dimensions,
                 "normalize": self.normalize}
        if self.cache_namespace:
            ident["namespace"] = str(self.cache_namespace)
        return ident

    reference_id = id  # no local computation reproduces a served model's vectors

    @property
    def dim(self) -> int:
        if self._dim is None:
            self.encode(["dimension probe"], show_progress=False)
        assert self._dim is not None
        return self._dim

    def warm_up(self) -> None:
        self.dim  # noqa: B018 (checks the server and settles the dimension)

    # ---- requests ------------------------------------------------------------------------------

    def _check_server(self) -> None:
        if not self._checked:
            self.endpoint.check()
            self._checked = True

    def _request(self, texts: list[str], stop: threading.Event) -> np.ndarray:
        payload: dict[str, Any] = {"model": self.model_name, "input": texts, "encoding_format": "float"}
        if self.dimensions is not None:
            payload["dimensions"] = self.dimensions
        reply = self.endpoint.post("/embeddings", payload, lambda data: _vectors(data, len(texts)), stop)
        vecs, tokens = reply.value
        if self.counter is not None:
            tokens = self.counter(texts)
        with self._lock:
            u = self.usage
            u["requests"] += 1
            u["texts"] += len(texts)
            u["seconds"] += reply.latency_ms / 1000.0
            if tokens is None:
                u["tokens_reported"] = False
            else:
                u["prompt_tokens"] += tokens
            self._settle_dim(vecs.shape[1])
        if self.normalize:
            norms = np.linalg.norm(vecs, axis=1, keepdims=True)
            vecs = vecs / np.where(norms > 0, norms, 1.0)
        return np.ascontiguousarray(vecs, dtype=np.float32)

    def _settle_dim(self, dim: int) -> None:
        if self.dimensions is not None and dim != self.dimensions:
            raise EndpointError(f"embedder: {self.endpoint.url('/embeddings')} returned {dim}-d vectors for model "
                                f"{self.model_name!r}, but embedder.dimensions={self.dimensions}")
        if self._dim is None:
            self._dim = dim
        elif dim != self._dim:
            raise EndpointError(f"embedder: {self.endpoint.url('/embeddings')} returned {dim}-d vectors for model "
                                f"{self.model_name!r} after {self._dim}-d ones in the same run; is another model "
                                "answering behind this URL? (embedder.model)")

    def _batches(self, texts: list[str]) -> list[list[str]]:
        return [texts[i:i + self.batch_size] for i in range(0, len(texts), self.batch_size)]

    # ---- the embedder interface ----------------------------------------------------------------

    def encode(self, texts: list[str], show_progress: bool | None = None) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        out: list[np.ndarray | None] = [None] * len(self._batches(texts))
        for i, vecs in self._run(texts, show_progress):
            out[i] = vecs
        return np.concatenate(out)  # type: ignore[arg-type]

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        return self.encode([self.query_prefix + q for q in queries], show_progress=False)

    def encode_blocks(self, texts: list[str], block: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(rows, vectors) per batch as the batches come back (in any order)."""
        for i, vecs in self._run(list(texts), None):
            start = i * self.batch_size
            yield np.arange(start, start + len(vecs)), vecs

    def _run(self, texts: list[str], show_progress: bool | None) -> Iterator[tuple[int, np.ndarray]]:
        from tqdm.auto import tqdm

        self._check_server()
        batches = self._batches(texts)
        shown = (self.show_progress if show_progress is None else show_progress) and len(batches) > 1
        t0 = time.perf_counter()
        with tqdm(total=len(texts), desc="embedding (server)", unit="chunk", mininterval=2.0, leave=False,
                  disable=not shown) as bar:
            for i, vecs in map_concurrent(self._request, batches, self.concurrency):
                bar.update(len(vecs))
                yield i, vecs
        self.usage.setdefault("wall_s", 0.0)
        self.usage["wall_s"] += time.perf_counter() - t0


def _vectors(data: Any, n: int) -> tuple[np.ndarray, int | None] | None:
    """The reply's vectors in input order and its prompt tokens; None when the body is not an
    embeddings reply for these `n` texts (retried like a server error)."""
    try:
        rows = sorted(data["data"], key=lambda r: int(r.get("index", 0)))
        if len(rows) != n or [int(r.get("index", i)) for i, r in enumerate(rows)] != list(range(n)):
            return None
        vecs = np.asarray([r["embedding"] for r in rows], dtype=np.float64)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if vecs.ndim != 2 or vecs.shape[1] == 0 or not np.isfinite(vecs).all():
        return None
    usage = data.get("usage") or {}
    tokens = usage.get("prompt_tokens", usage.get("total_tokens"))
    return vecs, int(tokens) if isinstance(tokens, (int, float)) and not isinstance(tokens, bool) else None
