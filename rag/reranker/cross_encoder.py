"""Cross-encoder reranking: score (query, chunk text) jointly and keep the best k.

`model` is a Hugging Face id, a local path, `package:<module>` (weights inside a pip package;
rag/store/models.py resolves all three), or `trained:`: the packaged MiniLM fine-tuned locally with the
`train` settings (rag/reranker/training/), built once and cached as the artifact
`<cache>/cross_encoder/<key>` in the artifact cache that `use_cache` gives.

Only the first `top_n` candidates of the first stage are scored, each question's in one batch of
its own, and the scores are recorded in the artifact cache under the model and its settings
(rag/reranker/pointwise.py, shared with the reranking server). `fuse` combines the
cross-encoder's order with the first stage's order (see `fuse_scores`); `label_passages` puts each
chunk's document label before its text, as the trained model saw its passages (null: as the model
was trained, read from its reranker.json; other models: no labels).

`backend` and `precision` (`auto`, the default, for both) say what computes the logits: torch fp32,
torch bf16 autocast, ONNX Runtime fp32, or OpenVINO fp32 or bf16 on the same export. Under `auto`
the fastest candidate whose order agrees with fp32's is measured once per machine, model and
library versions (rag/reranker/backend_choice.py), unless the scores of the first question's candidates are already recorded under fp32 (the demo's
seed, an earlier run): then fp32, so that nothing recorded is scored again.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import numpy as np

from rag.embedder import probe
from rag.embedder.backend_choice import (
    REFERENCE,
    Candidate,
    Choice,
    candidates_here,
    cpu_flags,
    machine_facts,
)
from rag.store.models import model_fingerprint, resolve_model
from rag.reranker import backend_choice
from rag.reranker.logits import predict_logits
from rag.reranker.pointwise import SCORES, PointwiseReranker
from rag.config.schema import Device, PositiveInt, checked, string
from rag.types import Chunk, Hits, QAItem, RagError

log = logging.getLogger(__name__)

TRAINED = "trained:"
# onnx: the forward pass on ONNX Runtime (rag/reranker/onnx.py), fp32; openvino: the same export on OpenVINO
BACKENDS = ("auto", "torch", "onnx", "openvino")
PRECISIONS = ("auto", "fp32", "bf16")
PROBE_KIND = "reranker_probe"  # one probe's measurements, in the artifact cache
PROBE_VERSION = 1  # bump when the probe measures differently


@functools.lru_cache(maxsize=4)
def load_cross_encoder(path: str, max_length: int, device: str) -> Any:
    """One loaded model per (path, max_length, device) per process."""
    from sentence_transformers import CrossEncoder

    try:
        return CrossEncoder(path, max_length=max_length, device=device)
    except OSError as e:
        raise RagError(f"reranker model {path!r} could not be loaded: {str(e).splitlines()[0]}") from None


GRAPH_BACKENDS = ("onnx", "openvino")  # the backends that run the exported graph


class CrossEncoderReranker(PointwiseReranker):
    probe_questions: int | None = None  # backend_choice.QUESTIONS; fewer make a coarser probe, for a benchmark's tiny run

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
        precision: Annotated[str, string(choices=PRECISIONS)] = "fp32",
        backend: Annotated[str, string(choices=BACKENDS)] = "torch",
    ):
        self.set_fuse(fuse)
        if backend == "onnx" and precision == "bf16":
            raise RagError("reranker.backend=onnx runs in fp32: set reranker.precision=fp32 (or backend=torch for bf16)")
        if backend == "openvino" and precision == "auto":
            raise RagError("reranker.backend=openvino runs one precision: set reranker.precision=fp32 or bf16 "
                           "(backend=auto measures them against torch fp32)")
        self.backend = backend
        self._onnx: Any = None  # the exported graph's scorer (backend=onnx or openvino), made when the model loads
        self.precision = precision
        self.label_passages = label_passages
        self.model_name = model.strip()
        self.top_n = int(top_n)
        self.batch_size = int(batch_size)
        self.max_length = int(max_length)
        self.device = device
        self.train = dict(train or {})
        self._model: Any = None
        self._path: str | None = None
        self._choice: Choice | None = None  # the backend computing the logits, settled when the model loads
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
        if self._path is not None:
            return self._path
        if self.model_name == TRAINED:
            from rag.reranker.training.artifact import build_trained_model, fitted_on

            self.artifact = build_trained_model(self.train, self.cache)
            self.fitted_on = fitted_on(self.artifact)
            log.info("cross-encoder %s: %s", "cached" if self.artifact.hit else "trained", self.artifact.path)
            self._path = str(self.artifact.path)
        else:
            self._path = resolve_model(self.model_name, "reranker").path
        if self.label_passages is None:
            from rag.reranker.training.artifact import reranker_info

            local = Path(self._path)
            self.label_passages = bool(local.is_dir() and reranker_info(local).get("label_passages", False))
        return self._path

    def identity_for(self, candidate: Candidate) -> dict[str, Any]:
        """What the recorded scores depend on besides the texts, computed by `candidate`: a trained
        model by its files' checksums, so that its recorded scores hold in every cache (and in the
        shipped seed); another local folder by names, sizes and mtimes."""
        path = self.model_path()
        files = self.artifact.content_digest() if self.artifact is not None else model_fingerprint(path)
        return {"model": self.artifact.key if self.artifact is not None else path, "files": files,
                "max_length": self.max_length, "precision": candidate.precision, "backend": candidate.backend}

    def allowed(self, flags: frozenset[str]) -> list[Candidate]:
        """The candidates of this machine that the settings allow, torch fp32 first."""
        return [c for c in candidates_here(flags)
                if self.backend in ("auto", c.backend) and self.precision in ("auto", c.precision)]

    @property
    def backend_note(self) -> dict[str, Any] | None:
        """Which backend computed the logits and why (metrics.json `backends`), once settled."""
        return self._choice.to_json() if self._choice is not None else None

    @property
    def model(self) -> Any:
        if self._model is None:
            path = self.model_path()
            from rag.reranker.training.fit import use_bf16

            model = load_cross_encoder(path, self.max_length, self.device)
            if self._choice is None:
                self._choice = self._choose(model, path)
            chosen = self._choice.candidate
            if chosen.backend in GRAPH_BACKENDS:
                self._onnx = self._onnx_scorer(model, path, chosen)
            self._model = model
            # torch autocast only where the CPU computes bf16 (use_bf16); OpenVINO runs what was asked
            self._bf16 = chosen.backend == "torch" and use_bf16(chosen.precision, self.device)
            precision = chosen.precision if chosen.backend == "openvino" else "bf16" if self._bf16 else "fp32"
            self._identity = self.identity_for(Candidate(chosen.backend, precision))
        return self._model

    def _onnx_scorer(self, model: Any, path: str, candidate: Candidate) -> Any:
        from rag.reranker.onnx import export_cross_encoder, load_scorer

        openvino = candidate.precision if candidate.backend == "openvino" else None
        return load_scorer(str(export_cross_encoder(model, path, self.max_length, self.cache)), openvino)

    # ---- the backend (`auto`) ------------------------------------------------------------------

    def _choose(self, model: Any, path: str) -> Choice:
        allowed = self.allowed(cpu_flags())
        if self.device != "cpu":
            pinned = Candidate(self.backend if self.backend != "auto" else "torch",
                               "bf16" if self.precision == "bf16" else "fp32")
            return Choice(pinned, f" (device {self.device}: backend=auto measures CPU backends only)")
        if self.backend != "auto" and self.precision != "auto":
            return Choice(Candidate(self.backend, self.precision),
                          f" (pinned: backend={self.backend}, precision={self.precision})")
        if not allowed:
            raise RagError(f"reranker: backend={self.backend} precision={self.precision} cannot run on this machine "
                           "(bf16 needs a CPU with native bf16, onnx needs onnxruntime, openvino needs openvino)")
        if len(allowed) == 1:
            return Choice(allowed[0], ": the only candidate the settings allow here")
        if REFERENCE not in allowed:  # precision=bf16 under backend=auto: nothing to hold against fp32
            return Choice(allowed[0], f" (precision={self.precision}: the first candidate the settings allow; "
                                      "backend=auto measures only against torch fp32)")
        try:
            passages, questions = probe.probe_texts()
        except (OSError, ValueError, KeyError) as e:
            log.warning("reranker: backend=auto cannot read its probe texts %s (%s); running torch fp32",
                        probe.probe_file(), e)
            return Choice(REFERENCE, f": no probe (its texts {probe.probe_file()} are unreadable)")
        pools = backend_choice.probe_pairs(passages, questions[:self.probe_questions or backend_choice.QUESTIONS], backend_choice.POOL)
        record = self._probe_record(model, path, pools)
        measured = [m for name, d in record["candidates"].items()
                    for m in [backend_choice.Measured.from_json(name, d)] if m.candidate in allowed]
        best = backend_choice.choose(measured)
        why = backend_choice.explain(best, measured, record["machine"].get("bf16"), record["date"])
        return Choice(best.candidate, why, {**{k: record[k] for k in ("date", "pairs", "seconds")},
                                            "candidates": {m.candidate.name: m.to_json() for m in measured}})

    def _probe_record(self, model: Any, path: str, pools: list[list[tuple[str, str]]]) -> dict[str, Any]:
        """Every candidate of this machine measured once per machine, model and library versions."""
        import torch

        flags = cpu_flags()
        candidates = candidates_here(flags)
        params = {"probe": PROBE_VERSION, **self.identity_for(REFERENCE), "batch_size": self.batch_size,
                  "candidates": [c.name for c in candidates], "pairs": sum(map(len, pools)),
                  "machine": machine_facts(flags, torch.get_num_threads())}
        params.pop("precision"), params.pop("backend")

        def run() -> list[backend_choice.Measured]:
            log.info("reranker: measuring %s for backend=auto on this machine (once per machine, model and library "
                     "versions; %d pairs)", ", ".join(c.name for c in candidates), params["pairs"])
            measured = backend_choice.measure(self.scorers(model, path, candidates), pools)
            ref = next(m for m in measured if m.candidate == REFERENCE)
            log.info("reranker: probe: %s", "; ".join(
                f"{m.candidate.name} {m.rate:.1f} pairs/s ({m.rate / ref.rate:.2f}x), top-{backend_choice.TOP} "
                f"overlap {m.overlap:.3f}, logits within {m.max_diff:.2g}" for m in measured))
            return measured

        return probe.recorded_probe(self.cache, PROBE_KIND, params, run, {"pairs": params["pairs"]})

    def scorers(self, model: Any, path: str, candidates: Sequence[Candidate]) -> dict[Candidate, backend_choice.Score]:
        """Each candidate's logits of pairs on `model`, as the reranker computes them once it runs
        that candidate; an ONNX export that fails is no candidate (a warning says why)."""
        out: dict[Candidate, backend_choice.Score] = {}
        for c in candidates:
            if c.backend in GRAPH_BACKENDS:
                try:
                    scorer = self._onnx_scorer(model, path, c)
                except RagError as e:
                    log.warning("reranker: %s is no candidate here: %s", c.name, e)
                    continue
                out[c] = functools.partial(self._onnx_logits, scorer, model)
            else:
                out[c] = functools.partial(predict_logits, model, batch_size=self.batch_size, bf16=c.precision == "bf16")
        return out

    def _onnx_logits(self, scorer: Any, model: Any, pairs: list[tuple[str, str]]) -> np.ndarray:
        if not pairs:
            return np.zeros(0, np.float32)
        return np.concatenate([scorer.logits(model, pairs[i:i + self.batch_size])
                               for i in range(0, len(pairs), self.batch_size)])

    def prefer_recorded(self, query: str, passages: list[str]) -> None:
        """Under `auto`, before the model loads: torch fp32 when its scores of these passages are
        already recorded (nothing is measured, nothing recorded is scored again)."""
        if self._choice is not None or self._model is not None or self.device != "cpu" or not passages:
            return
        if self.backend not in ("auto", "torch") or self.precision not in ("auto", "fp32"):
            return
        if self.backend != "auto" and self.precision != "auto":
            return
        if self.cache.get_record(SCORES, self.scores_key(query, passages, self.identity_for(REFERENCE))) is not None:
            self._choice = Choice(REFERENCE, ": its scores of these candidates were already recorded (nothing measured)")

    def rerank(self, queries: list[str], hits: Hits, chunks: Sequence[Chunk], k: int, reuse: bool = True) -> Hits:
        if reuse and hits.n_queries and self._model is None:
            self.model_path()  # settles label_passages
            head = [int(i) for i in hits.ids[0] if i >= 0][: self.top_n]
            self.prefer_recorded(queries[0], [self.passage(chunks[i]) for i in head])
        return super().rerank(queries, hits, chunks, k, reuse)

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
        """Loads the model (training `trained:` if needed); under `auto` the backend is settled at the
        first scoring, once `rerank` has looked for recorded fp32 scores."""
        if self._choice is None and "auto" in (self.backend, self.precision):
            load_cross_encoder(self.model_path(), self.max_length, self.device)
        else:
            self.model  # noqa: B018

    # ---- scoring -------------------------------------------------------------------------------

    def score(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        """Raw relevance logits of the pairs (predict_logits)."""
        if not pairs:
            return np.zeros(0, np.float32)
        model = self.model  # loads first: that settles bf16 and the ONNX session
        if self._onnx is not None:
            return self._onnx_logits(self._onnx, model, pairs)
        return predict_logits(model, pairs, self.batch_size, self._bf16)

    def score_passages(self, query: str, passages: list[str]) -> np.ndarray:
        return self.score([(query, p) for p in passages])

    def before_rerank(self) -> None:
        self.model  # noqa: B018 (settles label_passages, the backend and so the scores' key, before any is made)
