"""Reranking by a server: `reranker=http`, the `/rerank` request shared by Cohere, Jina, vLLM,
Infinity and TEI (`query` and the candidates' texts -> `results[{index, relevance_score}]`).

Each question's first `top_n` candidates go in one request of their own, over the shared
transport (rag/endpoint.py); the scores are recorded per question like the cross-encoder's
(rag/reranker/pointwise.py: cache, fusion with the first stage, ties in retrieval order), keyed by
the served model's name (never the URL or the key). A reply whose indexes are missing, repeated or
out of range, or whose scores are not finite numbers (JSON's `true` is no score, though Python
counts it an int), is an error naming the endpoint, the model and the document, and nothing of it
is recorded.
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from rag.endpoint import Endpoint, EndpointSettings
from rag.store.models import TokenCounter
from rag.serving.reply import BadReply, reported_tokens, shown
from rag.reranker.pointwise import PointwiseReranker
from rag.config.schema import PositiveInt, Text, checked
from rag.types import RagError

FLOAT32_MAX = float(np.finfo(np.float32).max)  # scores are kept as float32: a larger one would become inf
# the endpoint settings a /rerank request uses (one request at a time, no extra_body), and their defaults here
TAKES = ("timeout_s", "max_retries", "backoff_s", "max_backoff_s", "cache_namespace")
DEFAULT_ENDPOINT = EndpointSettings(timeout_s=60.0)


class HTTPReranker(PointwiseReranker):
    @checked("reranker")
    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: Text | None = None,  # "" as null: a server without keys
        top_n: PositiveInt = 20,
        fuse: dict[str, Any] | None = None,
        documents_field: str = "documents",
        endpoint: EndpointSettings | None = None,
        label_passages: bool = False,
        tokenizer: Text | None = None,  # "" as null: the server counts the tokens
    ):
        if documents_field not in ("documents", "texts"):
            raise RagError(f"reranker.documents_field must be documents (Cohere, Jina, vLLM, Infinity) or texts (TEI), "
                           f"got {documents_field!r}")
        settings = endpoint or DEFAULT_ENDPOINT
        self.endpoint: Endpoint = settings.transport("reranker", base_url, str(model), api_key_env, takes=TAKES)
        self.model_name = str(model)
        self.top_n = top_n
        self.documents_field = documents_field
        self.set_fuse(fuse)
        self.label_passages = bool(label_passages)
        self._identity = {"engine": "http", "model": self.model_name}
        if settings.cache_namespace:
            self._identity["namespace"] = str(settings.cache_namespace)
        # count tokens here instead of taking the server's usage
        self.counter = TokenCounter(tokenizer, "reranker.tokenizer") if tokenizer else None
        self._lock = threading.Lock()
        self.usage: dict[str, Any] = {"requests": 0, "documents": 0, "tokens": 0, "seconds": 0.0, "tokens_reported": True,
                      "tokens_counted_by": "tokenizer" if tokenizer else "server"}

    def __repr__(self) -> str:
        return f"HTTPReranker({self.endpoint!r})"

    def warm_up(self) -> None:
        self.endpoint.check()

    def score_passages(self, query: str, passages: list[str]) -> np.ndarray:
        n = len(passages)
        payload = {"model": self.model_name, "query": query, self.documents_field: passages, "top_n": n,
                   "return_documents": False}
        reply = self.endpoint.post("/rerank", payload, lambda data: self._scores(data, n))
        scores, tokens = reply.value
        if self.counter is not None:
            tokens = self.counter(passages, pairs_with=query)
        with self._lock:
            u = self.usage
            u["requests"] += 1
            u["documents"] += n
            u["seconds"] += reply.latency_ms / 1000.0
            if tokens is None:
                u["tokens_reported"] = False
            else:
                u["tokens"] += tokens
        return scores

    def _scores(self, data: Any, n: int) -> tuple[np.ndarray, int | None] | None:
        """The scores in the candidates' order; None for a body that is no rerank reply (retried),
        a BadReply for one whose rows do not give each candidate exactly one finite score."""
        rows = data.get("results", data.get("data")) if isinstance(data, dict) else data  # TEI: a bare list
        if not isinstance(rows, list):
            return None
        scores = np.full(n, np.nan, np.float32)
        for pos, row in enumerate(rows):
            i, score = _scored(row, pos, n)
            if not np.isnan(scores[i]):
                raise BadReply(f"index {i} twice")
            scores[i] = score
        missing = np.flatnonzero(np.isnan(scores))
        if len(missing):
            raise BadReply(f"no score for {len(missing)} of {n} documents (e.g. index {int(missing[0])})")
        # Jina, vLLM; Cohere bills search units
        return scores, reported_tokens(data, "total_tokens", "prompt_tokens")


def _scored(row: Any, pos: int, n: int) -> tuple[int, float]:
    """(index, score) of one row of a rerank reply."""
    if not isinstance(row, dict):
        raise BadReply(f"results[{pos}] is {shown(row)}, not an object")
    i = row.get("index")
    if i is None:
        raise BadReply(f"results[{pos}] has no index")
    if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
        raise BadReply(f"index {shown(i)} for {n} documents")
    field = "relevance_score" if "relevance_score" in row else "score"
    if field not in row:
        raise BadReply(f"results[{pos}] (document {i}) has no relevance_score")
    score = row[field]
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        raise BadReply(f"score of document {i} is {shown(score)}, not a number")
    if not abs(score) <= FLOAT32_MAX:
        raise BadReply(f"score of document {i} is {shown(score)}, beyond a float32 score's range")
    return i, float(score)
