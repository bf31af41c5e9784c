"""Embeddings from any OpenAI-compatible `/embeddings` endpoint (vLLM, TEI, Ollama, llama.cpp's
server, Infinity, OpenAI): `embedder=openai`.

Texts go in batches of `batch_size`, `endpoint.concurrency` requests at a time, over the shared
transport (rag/endpoint.py: retries with backoff, Retry-After, timeouts, one-line errors, the key
only from `api_key_env`). The vectors are cached like any embedder's (rag.run.artifacts, kind `vectors`) under
`id`: the served model's name, `dimensions` and normalisation, never the URL or the key, so the
same model moved to another host keeps its vectors. The first batch settles the dimension; every
later batch, a query and the cached index must agree with it, and a batch that does not is an
error: nothing of a failed build is cached.

A reply is checked like a file before any vector is used: one row per text, each placed by its
`index` (a server may answer in any order, and an order it does not state cannot be verified, so
a row without one is refused, never taken in arrival order), every row a list of finite numbers of
one length, and none all zeros (a zero vector has no direction, so no cosine).

The evaluation embedder E stays local and fixed (eval.embedder): it defines the metrics.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from rag.embedder.base import Embedder, RowSink
from rag.embedder.npy_writer import shown_text, unusable_row
from rag.serving.concurrent import map_concurrent
from rag.endpoint import Endpoint, EndpointError, EndpointSettings
from rag.store.models import TokenCounter
from rag.serving.reply import BadReply, reported_tokens, shown
from rag.config.schema import PositiveInt, Text, checked

# the endpoint settings an embeddings request uses (no extra_body), and their defaults here
TAKES = ("concurrency", "timeout_s", "max_retries", "backoff_s", "max_backoff_s", "cache_namespace")
DEFAULT_ENDPOINT = EndpointSettings(timeout_s=60.0)


class OpenAIEmbedder(Embedder):
    """`encode(texts) -> float32 [n, dim]` through a served model; L2-normalized by default."""

    @checked("embedder")
    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: Text | None = None,  # "" as null: a server without keys
        batch_size: PositiveInt = 64,
        normalize: bool = True,
        dimensions: PositiveInt | None = None,
        query_prefix: Text = "",
        show_progress: bool = True,
        endpoint: EndpointSettings | None = None,
        tokenizer: Text | None = None,  # "" as null: the server counts the tokens
    ):
        settings = endpoint or DEFAULT_ENDPOINT
        self.endpoint: Endpoint = settings.transport("embedder", base_url, str(model), api_key_env, takes=TAKES)
        self.model_name = str(model)
        self.batch_size, self.concurrency = batch_size, settings.concurrency
        self.normalize = bool(normalize)
        self.dimensions = dimensions
        self.query_prefix = str(query_prefix)
        self.show_progress = bool(show_progress)
        self.cache_namespace = settings.cache_namespace
        # count tokens here instead of taking the server's usage
        self.counter = TokenCounter(tokenizer, "embedder.tokenizer") if tokenizer else None
        self._dim: int | None = None
        self._checked = False
        self._lock = threading.Lock()
        self.usage: dict[str, Any] = {"requests": 0, "prompt_tokens": 0, "texts": 0, "seconds": 0.0, "tokens_reported": True,
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
        known = self.dimensions or self._dim
        reply = self.endpoint.post("/embeddings", payload, lambda data: _vectors(data, len(texts), known), stop)
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
        raw = vecs
        if self.normalize:
            norms = np.linalg.norm(vecs, axis=1, keepdims=True)
            vecs = vecs / np.where(norms > 0, norms, 1.0)
        stored = np.ascontiguousarray(vecs, dtype=np.float32)
        found = unusable_row(stored)  # what is kept: values near 1e-200 pass the reply's checks, then become 0.0
        if found is not None:
            row, problem = found
            peak = float(np.abs(raw[row]).max())
            why = f" (its largest value, {peak:.3g}, is too small for float32)" if peak > 0 else ""
            raise self.endpoint.bad_reply("/embeddings", f"the vector of text {row} of the request "
                                          f"({shown_text(texts[row])}) {problem} once stored as float32{why}")
        return stored

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

    def encode_blocks(self, texts: list[str], block: int,
                      sink: RowSink | None = None) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """(rows, vectors) per batch as the batches come back (in any order); the sink is not used."""
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


def _vectors(data: Any, n: int, dim: int | None) -> tuple[np.ndarray, int | None] | None:
    """The reply's vectors in input order (placed by their `index`) and its prompt tokens; None
    when the body is no embeddings reply (retried); a BadReply when its rows do not give each of the
    `n` texts one usable vector (of `dim` values, when the dimension is known)."""
    rows = data.get("data") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        return None
    if len(rows) != n:
        raise BadReply(f"{_many(len(rows), 'vector')} for {_many(n, 'text')}")
    placed: list[Any] = [None] * n
    for pos, row in enumerate(rows):
        i = row.get("index") if isinstance(row, dict) else None
        if i is None:
            raise BadReply(f"data[{pos}] has no index, so its vector cannot be matched to its text")
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
            raise BadReply(f"index {shown(i)} (data[{pos}]) for {_many(n, 'text')}")
        if placed[i] is not None:
            raise BadReply(f"index {i} twice")
        placed[i] = row.get("embedding")
        if placed[i] is None:
            raise BadReply(f"row {i} has no embedding")
    return _checked_rows(placed, dim), reported_tokens(data, "prompt_tokens", "total_tokens")


def _checked_rows(rows: list[Any], dim: int | None) -> np.ndarray:
    """The rows as one float64 array; a BadReply naming the first row that is no list of finite
    numbers, has another length than the others (or than `dim`) or is all zeros."""
    for i, row in enumerate(rows):
        if not isinstance(row, list) or not row:
            raise BadReply(f"row {i} is {shown(row)}, not a list of numbers")
        j = next((j for j, x in enumerate(row) if type(x) not in (int, float)), -1)  # type(): true is an int
        if j >= 0:
            raise BadReply(f"row {i} holds {shown(row[j])} at position {j}, not a number")
    lengths = [len(row) for row in rows]
    if len(set(lengths)) > 1:
        expected = dim if dim is not None else lengths[0]
        i = next(i for i, k in enumerate(lengths) if k != expected)
        raise BadReply(f"row {i} has {lengths[i]} values, expected {expected}"
                       + ("" if dim is not None else " (as row 0)"))
    vecs = np.asarray(rows, dtype=np.float64)
    beyond = np.flatnonzero(~(np.abs(vecs) <= float(np.finfo(np.float32).max)).all(axis=1))
    if len(beyond):
        raise BadReply(f"row {int(beyond[0])} holds a value that is no finite float32")
    zero = np.flatnonzero(~vecs.any(axis=1))
    if len(zero):
        raise BadReply(f"row {int(zero[0])} is all zeros (a zero vector has no direction, so no cosine)")
    return vecs


def _many(k: int, noun: str) -> str:
    return f"{k} {noun}" if k == 1 else f"{k} {noun}s"
