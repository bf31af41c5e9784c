"""Cross-encoder reranking: score (query, chunk text) jointly and keep the best k.

`model` is a Hugging Face id, a local path, `package:<module>` (weights inside a pip package;
rag/models.py resolves all three), or `trained:`: the packaged MiniLM fine-tuned locally with the
`train` settings (rag/reranker/training/), built once and cached as the artifact
`<cache>/cross_encoder/<key>` in the artifact cache that `use_cache` gives.

Only the first `top_n` candidates of the first stage are scored, each question's in one batch of
its own, and the scores are recorded in the artifact cache under the model and its settings
(rag/reranker/pointwise.py, shared with the reranking server). `fuse` combines the
cross-encoder's order with the first stage's order (see `fuse_scores`); `label_passages` puts each
chunk's document label before its text, as the trained model saw its passages (null: as the model
was trained, read from its reranker.json; other models: no labels).
"""
from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Annotated, Any

import numpy as np

from rag.models import model_fingerprint, resolve_model
from rag.reranker.logits import predict_logits
from rag.reranker.pointwise import PointwiseReranker
from rag.schema import Device, PositiveInt, checked, string
from rag.types import QAItem, RagError

log = logging.getLogger(__name__)

TRAINED = "trained:"
BACKENDS = ("torch", "onnx")  # onnx: the forward pass on ONNX Runtime (rag/reranker/onnx.py), fp32


@functools.lru_cache(maxsize=4)
def load_cross_encoder(path: str, max_length: int, device: str) -> Any:
    """One loaded model per (path, max_length, device) per process."""
    from sentence_transformers import CrossEncoder

    try:
        return CrossEncoder(path, max_length=max_length, device=device)
    except OSError as e:
        raise RagError(f"reranker model {path!r} could not be loaded: {str(e).splitlines()[0]}") from None


class CrossEncoderReranker(PointwiseReranker):
    @checked("reranker")
    def __init__(
        self,
        model: str,
        top_n: PositiveInt = 20,
        batch_size: PositiveInt = 32,
        max_length: PositiveInt = 256,
        device: Device = "cpu",
        train: dict[str, Any] | None = None,
        fuse: dict[str, Any] | None = None,
        label_passages: bool | None = None,
        precision: str = "fp32",
        backend: Annotated[str, string(choices=BACKENDS)] = "torch",
    ):
        self.set_fuse(fuse)
        if precision not in ("fp32", "bf16"):
            raise RagError(f"reranker.precision must be fp32 or bf16, got {precision!r}")
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
        self._bf16 = False  # bf16 autocast in effect: settled when the model loads (rag.reranker.training.fit.use_bf16)
        if self.model_name == TRAINED:
            from rag.reranker.training.settings import train_settings

            train_settings(self.train)  # a bad setting fails when the config is built, not later

    # ---- loading -------------------------------------------------------------------------------

    def model_path(self) -> str:
        """The folder or hub id to load; trains the `trained:` model when it is not cached."""
        if self.model_name == TRAINED:
            from rag.reranker.training.artifact import build_trained_model, fitted_on

            self.artifact = build_trained_model(self.train, self.cache)
            self.fitted_on = fitted_on(self.artifact)
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
            # a trained model by its files' checksums, so that its recorded scores hold in every
            # cache (and in the shipped seed); another local folder by names, sizes and mtimes
            files = self.artifact.content_digest() if self.artifact is not None else model_fingerprint(path)
            self._identity = {"model": self.artifact.key if self.artifact is not None else path,
                              "files": files, "max_length": self.max_length,
                              "precision": "bf16" if self._bf16 else "fp32", "backend": self.backend}
        return self._model

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

    def score_passages(self, query: str, passages: list[str]) -> np.ndarray:
        return self.score([(query, p) for p in passages])

    def before_rerank(self) -> None:
        self.model  # noqa: B018 (settles label_passages before the passages are made)
