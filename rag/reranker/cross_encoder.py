"""Cross-encoder reranking: score (query, chunk text) jointly and keep the best k.

`model` is a Hugging Face id, a local path, `package:<module>` (weights inside a pip package;
rag/models.py resolves all three), or `trained:`: the packaged MiniLM fine-tuned locally with the
`train` settings (rag/reranker/training/), built once and cached as the artifact
`<cache>/cross_encoder/<key>` in the artifact cache that `use_cache` gives.

Only the first `top_n` candidates of the first stage are scored, each question's in one batch of
its own (so its scores do not depend on which questions share a call). Those scores are recorded in
the artifact cache (kind `rerank_scores`, keyed by the model, its settings, the query and the
candidates' texts), so a run that reranks the same candidates again (a repeated demo, a sweep
over settings downstream of reranking) reads them instead of scoring; a timed search
(`reuse=False`, rag.latency) always scores. `fuse` combines the
cross-encoder's order with the first stage's order (see `fuse_scores`); `label_passages` puts each
chunk's document label before its text, as the trained model saw its passages (null: as the model
was trained, read from its reranker.json; other models: no labels).
"""
from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path
from typing import Any

import numpy as np

from rag.cache import make_key
from rag.models import UsesCache, model_fingerprint, resolve_model
from rag.reranker.base import Reranker
from rag.reranker.logits import predict_logits
from rag.types import Chunk, Hits, QAItem, RagError

log = logging.getLogger(__name__)

TRAINED = "trained:"
FUSE_METHODS = ("none", "rrf", "linear")
BACKENDS = ("torch", "onnx")  # onnx: the forward pass on ONNX Runtime (rag/reranker/onnx.py), fp32
SCORES = "rerank_scores"  # record kind: one question's logits for its candidates


def fuse_scores(ce: np.ndarray, method: str, weight: float, k: int = 60) -> np.ndarray:
    """Scores of the head candidates (given in first-stage order) to sort by.

    none:   the cross-encoder's logits.
    rrf:    weight / (k + cross-encoder rank) + (1 - weight) / (k + first-stage rank), ranks from 1:
            reciprocal rank fusion of the two orders.
    linear: weight * z + (1 - weight) * prior, with z the logits standardized within the question
            and prior = -ln(first-stage rank): a candidate the first stage ranked high needs a
            clearly better logit to be overtaken.
    """
    n = len(ce)
    if method == "none" or n == 0:
        return ce
    first = np.arange(1, n + 1, dtype=np.float64)
    if method == "rrf":
        ce_rank = np.empty(n)
        ce_rank[np.argsort(-ce, kind="stable")] = first
        return (weight / (k + ce_rank) + (1 - weight) / (k + first)).astype(np.float32)
    z = (ce - ce.mean()) / (ce.std() + 1e-6)
    return (weight * z - (1 - weight) * np.log(first)).astype(np.float32)


@functools.lru_cache(maxsize=4)
def load_cross_encoder(path: str, max_length: int, device: str) -> Any:
    """One loaded model per (path, max_length, device) per process."""
    from sentence_transformers import CrossEncoder

    try:
        return CrossEncoder(path, max_length=max_length, device=device)
    except OSError as e:
        raise RagError(f"reranker model {path!r} could not be loaded: {str(e).splitlines()[0]}") from None


class CrossEncoderReranker(UsesCache, Reranker):
    def __init__(
        self,
        model: str,
        top_n: int = 20,
        batch_size: int = 32,
        max_length: int = 256,
        device: str = "cpu",
        train: dict[str, Any] | None = None,
        fuse: dict[str, Any] | None = None,
        label_passages: bool | None = None,
        precision: str = "fp32",
        backend: str = "torch",
    ):
        if not isinstance(model, str) or not model.strip():
            raise RagError(f"reranker.model must be a model id, path, package:<module> or {TRAINED!r}, got {model!r}")
        for name, value in (("top_n", top_n), ("batch_size", batch_size), ("max_length", max_length)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise RagError(f"reranker.{name} must be a positive integer, got {value!r}")
        fuse = dict(fuse or {})
        unknown = sorted(set(fuse) - {"method", "weight", "k"})
        if unknown:
            raise RagError(f"reranker.fuse: unknown key(s) {unknown}; known: method, weight, k")
        self.fuse_method = str(fuse.get("method", "none"))
        if self.fuse_method not in FUSE_METHODS:
            raise RagError(f"reranker.fuse.method must be one of {list(FUSE_METHODS)}, got {self.fuse_method!r}")
        try:
            self.fuse_weight, self.fuse_k = float(fuse.get("weight", 0.5)), int(fuse.get("k", 60))
        except (TypeError, ValueError):
            raise RagError(f"reranker.fuse: weight must be a number and k an integer, got {fuse}") from None
        if not 0 <= self.fuse_weight <= 1 or self.fuse_k < 0:
            raise RagError(f"reranker.fuse: weight must be in [0, 1] and k >= 0, got {fuse}")
        if precision not in ("fp32", "bf16"):
            raise RagError(f"reranker.precision must be fp32 or bf16, got {precision!r}")
        if backend not in BACKENDS:
            raise RagError(f"reranker.backend must be one of {list(BACKENDS)}, got {backend!r}")
        if backend == "onnx" and precision != "fp32":
            raise RagError("reranker.backend=onnx runs in fp32: set reranker.precision=fp32 (or backend=torch for bf16)")
        self.backend = backend
        self._onnx: Any = None  # the ONNX Runtime scorer (backend=onnx), made when the model loads
        self.precision = precision
        self.label_passages = label_passages
        self.model_name = model.strip()
        self.top_n = int(top_n)
        self.batch_size = int(batch_size)
        self.max_length = int(max_length)
        self.device = device
        self.train = dict(train or {})
        self._model: Any = None
        self.artifact: Any = None  # the cross_encoder artifact, for `trained:`
        # what the recorded scores depend on besides the texts (made exact when the model loads)
        self._identity: dict[str, Any] = {"model": self.model_name, "max_length": self.max_length, "precision": precision,
                                          "backend": backend}
        self._recording = True  # false once the cache refused a record (read-only)
        self._bf16 = False  # bf16 autocast in effect: settled when the model loads (rag.reranker.training.fit.use_bf16)
        if self.model_name == TRAINED:
            from rag.reranker.training.settings import train_settings

            train_settings(self.train)  # a bad setting fails when the config is built, not later

    # ---- loading -------------------------------------------------------------------------------

    def model_path(self) -> str:
        """The folder or hub id to load; trains the `trained:` model when it is not cached."""
        if self.model_name == TRAINED:
            from rag.reranker.training.artifact import build_trained_model

            self.artifact = build_trained_model(self.train, self.cache)
            log.info("cross-encoder %s: %s", "cached" if self.artifact.hit else "trained", self.artifact.path)
            return str(self.artifact.path)
        return resolve_model(self.model_name, "reranker").path

    @property
    def model(self) -> Any:
        if self._model is None:
            path = self.model_path()
            if self.label_passages is None:
                from rag.reranker.training.artifact import reranker_info

                local = Path(path)
                self.label_passages = bool(local.is_dir() and reranker_info(local).get("label_passages", False))
            from rag.reranker.training.fit import use_bf16

            model = load_cross_encoder(path, self.max_length, self.device)
            if self.backend == "onnx":
                from rag.reranker.onnx import export_cross_encoder, load_scorer

                self._onnx = load_scorer(str(export_cross_encoder(model, path, self.max_length, self.cache)))
            self._model = model
            self._bf16 = use_bf16(self.precision, self.device)
            self._identity = {"model": self.artifact.key if self.artifact is not None else path,
                              "files": model_fingerprint(path), "max_length": self.max_length,
                              "precision": "bf16" if self._bf16 else "fp32", "backend": self.backend}
        return self._model

    def passage(self, chunk: Chunk) -> str:
        if self.label_passages:
            from rag.reranker.training.passages import with_label

            return with_label(chunk.doc_id, chunk.text)
        return chunk.text

    def check_questions(self, questions: list[QAItem]) -> None:
        """A `trained:` model learnt from the train part of `train.labelled`: a run must not score
        any of those questions (same id, or the same question text)."""
        labelled = self.train.get("labelled")
        if self.model_name != TRAINED or labelled is None or not self.train.get("queries", {}).get("labelled"):
            return
        from rag.reranker.training.labelled import training_questions
        from rag.reranker.training.text import norm

        trained = training_questions(labelled)
        ids, texts = {q.id for q in trained}, {norm(q.question) for q in trained}
        seen = [q.id for q in questions if q.id in ids or norm(q.question) in texts]
        if seen:
            raise RagError(
                f"{len(seen)} of the {len(questions)} questions to score (e.g. {seen[0]!r}) are in the train part of "
                "reranker.train.labelled, which trains the cross-encoder; score questions it never saw "
                "(qa.split.part=test, qa=heldout, the default slice) or rerank otherwise (reranker=mmr)")

    def warm_up(self) -> None:
        self.model  # noqa: B018 (loads, and trains `trained:` if needed)

    # ---- scoring -------------------------------------------------------------------------------

    def score(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        """Raw relevance logits of the pairs (predict_logits)."""
        if not pairs:
            return np.zeros(0, np.float32)
        model = self.model  # loads first: that settles bf16 and the ONNX session
        if self._onnx is not None:
            return np.concatenate([self._onnx.logits(model, pairs[i:i + self.batch_size])
                                   for i in range(0, len(pairs), self.batch_size)])
        return predict_logits(model, pairs, self.batch_size, self._bf16)

    def scores_key(self, query: str, passages: list[str]) -> str:
        h = hashlib.sha256()
        for p in passages:
            h.update(p.encode("utf-8", "surrogatepass") + b"\0")
        return make_key(SCORES, self._identity, {"query": query, "passages": h.hexdigest()})

    def question_scores(self, query: str, passages: list[str], reuse: bool) -> np.ndarray:
        """One question's logits: recorded ones when `reuse` and present, else scored (and recorded)."""
        key = self.scores_key(query, passages)
        if reuse:
            rec = self.cache.get_record(SCORES, key)
            if rec is not None and len(rec.get("scores", ())) == len(passages):
                return np.asarray(rec["scores"], np.float32)
        scores = self.score([(query, p) for p in passages])
        if reuse and self._recording:
            try:
                self.cache.put_record(SCORES, key, {"scores": [float(x) for x in scores]})
            except OSError as e:
                self._recording = False
                log.warning("reranker: scores are not recorded in the cache (%s); every run scores anew", e)
        return scores

    def rerank(self, queries: list[str], hits: Hits, chunks: list[Chunk], k: int, reuse: bool = True) -> Hits:
        """The valid candidates among the first top_n of each row, rescored and sorted (ties keep
        the retrieval order); candidates past top_n follow in retrieval order with lower scores."""
        if len(queries) != hits.n_queries:
            raise RagError(f"reranker: {len(queries)} queries but {hits.n_queries} rows of candidates")
        k = int(k)
        if k <= 0:
            return Hits.empty(hits.n_queries, 0)
        self.model  # noqa: B018 (settles label_passages before the passages are made)
        rows: list[list[tuple[int, float]]] = []
        for q in range(hits.n_queries):
            valid = [int(i) for i in hits.ids[q] if i >= 0]
            head, tail = valid[: self.top_n], valid[self.top_n :]
            logits = self.question_scores(queries[q], [self.passage(chunks[i]) for i in head], reuse)
            s = fuse_scores(logits, self.fuse_method, self.fuse_weight, self.fuse_k)
            order = np.argsort(-s, kind="stable")  # stable: ties keep the retrieval order
            row = [(head[j], float(s[j])) for j in order[:k]]
            if len(row) < k and tail:
                floor = (float(s.min()) if len(s) else 0.0) - 1.0
                row += [(i, floor - j) for j, i in enumerate(tail[: k - len(row)])]
            rows.append(row)
        return Hits.from_rows(rows, k)
