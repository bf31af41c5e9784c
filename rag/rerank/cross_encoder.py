"""Cross-encoder reranking: score (query, chunk text) jointly and keep the best k.

`model` is a Hugging Face id, a local path, `package:<module>` (weights inside a pip package,
see rag/embedding.py), or `trained:`: the packaged MiniLM fine-tuned locally on pairs mined from
`train["corpus"]` with the `train` settings (rag/rerank/train.py), built once and cached as the
artifact `<cache_dir>/cross_encoder/<key>`.

`train["corpus"]` may be a corpus object (what Hydra makes of conf/reranker/cross_encoder.yaml),
a mapping with a `_target_` (instantiated here), or a list of Documents.
"""
from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from rag.cache import ArtifactCache
from rag.embedding import resolve_model_path
from rag.rerank.base import Reranker
from rag.types import Chunk, Hits, RagError

log = logging.getLogger(__name__)

TRAINED = "trained:"


def _looks_local(path: str) -> bool:
    if path.startswith((".", "/", "~")):
        return True
    parts = path.split("/")
    is_hub_id = len(parts) == 2 and all(parts)
    return os.sep in path and not is_hub_id


@functools.lru_cache(maxsize=4)
def load_cross_encoder(path: str, max_length: int, device: str) -> Any:
    """One loaded model per (path, max_length, device) per process."""
    from sentence_transformers import CrossEncoder

    try:
        return CrossEncoder(path, max_length=max_length, device=device)
    except OSError as e:
        raise RagError(f"reranker model {path!r} could not be loaded: {str(e).splitlines()[0]}") from None


class CrossEncoderReranker(Reranker):
    def __init__(
        self,
        model: str,
        top_n: int = 20,
        batch_size: int = 32,
        max_length: int = 256,
        device: str = "cpu",
        train: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ):
        if not isinstance(model, str) or not model.strip():
            raise RagError(f"reranker.model must be a model id, path, package:<module> or {TRAINED!r}, got {model!r}")
        for name, value in (("top_n", top_n), ("batch_size", batch_size), ("max_length", max_length)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise RagError(f"reranker.{name} must be a positive integer, got {value!r}")
        self.model_name = model.strip()
        self.top_n = int(top_n)
        self.batch_size = int(batch_size)
        self.max_length = int(max_length)
        self.device = device
        self.train = dict(train or {})
        self.cache_dir = cache_dir
        self._cache: ArtifactCache | None = ArtifactCache(cache_dir) if cache_dir is not None else None
        self._model: Any = None
        self.artifact: Any = None  # the cross_encoder artifact, for `trained:`
        if self.model_name == TRAINED:
            from rag.rerank.train import train_settings

            train_settings(self.train)  # a bad setting fails when the config is built, not later

    # ---- loading -------------------------------------------------------------------------------

    def prepare(self, artifacts: Any) -> None:
        if self._cache is None and getattr(artifacts, "cache", None) is not None:
            self._cache = artifacts.cache

    def model_path(self) -> str:
        """The folder or hub id to load; trains the `trained:` model when it is not cached."""
        if self.model_name == TRAINED:
            if self._cache is None:
                raise RagError("reranker.cache_dir is not set: the 'trained:' cross-encoder is cached as an artifact")
            from rag.rerank.train import build_trained_model

            self.artifact = build_trained_model(self.train, self._cache)
            log.info("cross-encoder %s: %s", "cached" if self.artifact.hit else "trained", self.artifact.path)
            return str(self.artifact.path)
        try:
            path = resolve_model_path(self.model_name)
        except RagError as e:  # its message speaks of the embedder
            raise RagError(str(e).replace("embedder model", "reranker model", 1)) from None
        if _looks_local(path) and not Path(path).expanduser().exists():
            raise RagError(f"reranker model {self.model_name!r}: path {path} does not exist")
        return str(Path(path).expanduser()) if _looks_local(path) else path

    @property
    def model(self) -> Any:
        if self._model is None:
            self._model = load_cross_encoder(self.model_path(), self.max_length, self.device)
        return self._model

    def warm_up(self) -> None:
        self.model  # noqa: B018 (loads, and trains `trained:` if needed)

    # ---- scoring -------------------------------------------------------------------------------

    def score(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        """Raw relevance logits (no sigmoid: it would saturate and tie the best candidates)."""
        if not pairs:
            return np.zeros(0, np.float32)
        import torch

        scores = self.model.predict(
            pairs,
            batch_size=self.batch_size,
            show_progress_bar=False,
            activation_fn=torch.nn.Identity(),
            convert_to_numpy=True,
        )
        scores = np.asarray(scores, np.float32)
        if scores.ndim > 1:  # a multi-label model: its last logit is taken as "relevant"
            scores = scores[:, -1]
        return scores.reshape(-1)

    def rerank(self, queries: list[str], hits: Hits, chunks: list[Chunk], k: int) -> Hits:
        """The valid candidates among the first top_n of each row, rescored and sorted (ties keep
        the retrieval order); candidates past top_n follow in retrieval order with lower scores."""
        if len(queries) != hits.n_queries:
            raise RagError(f"reranker: {len(queries)} queries but {hits.n_queries} rows of candidates")
        k = int(k)
        if k <= 0:
            return Hits.empty(hits.n_queries, 0)
        heads: list[list[int]] = []
        tails: list[list[int]] = []
        pairs: list[tuple[str, str]] = []
        for q in range(hits.n_queries):
            valid = [int(i) for i in hits.ids[q] if i >= 0]
            heads.append(valid[: self.top_n])
            tails.append(valid[self.top_n :])
            pairs.extend((queries[q], chunks[i].text) for i in heads[-1])
        scores = self.score(pairs)
        rows: list[list[tuple[int, float]]] = []
        at = 0
        for head, tail in zip(heads, tails):
            s = scores[at : at + len(head)]
            at += len(head)
            order = np.argsort(-s, kind="stable")  # stable: ties keep the retrieval order
            row = [(head[j], float(s[j])) for j in order[:k]]
            if len(row) < k and tail:
                floor = (float(s.min()) if len(s) else 0.0) - 1.0
                row += [(i, floor - j) for j, i in enumerate(tail[: k - len(row)])]
            rows.append(row)
        return Hits.from_rows(rows, k)
