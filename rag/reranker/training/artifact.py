"""The trained reranker as a cached artifact `<cache>/cross_encoder/<key>/`: the saved model,
`train_metrics.json` (data statistics, held-out metrics before and after training, timings) and
`reranker.json` (what a reranker must know to use it: whether passages carry labels).

The key covers the base model, every setting that changes the weights, the builder version, the
training documents' content and, when used, the labelled questions (their train part's content and
the split) and the generated questions' artifact key."""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from rag.store.cache import ArtifactCache, make_key
from rag.store.chunk_store import DocumentStore
from rag.corpus.base import Corpus
from rag.corpus.loading import load_parts
from rag.corpus.slicing import check_unique_ids, content_fingerprint
from rag.run.fitted import corpus_record
from rag.store.models import resolve_model
from rag.reranker.training.dataset import build_dataset
from rag.reranker.training.evaluate import biencoder_reference, evaluate
from rag.reranker.training.fit import fit, load_base_model, set_threads, use_bf16
from rag.reranker.training.labelled import question_set, questions_fingerprint
from rag.reranker.training.settings import key_settings, train_settings
from rag.types import Document, QAItem, RagError

log = logging.getLogger(__name__)

KIND = "cross_encoder"
# Bump when building the data or training changes its output for the same settings.
TRAIN_VERSION = 4
METRICS_FILE = "train_metrics.json"
RERANKER_FILE = "reranker.json"
FITTED_ON = "fitted_on"  # the manifest's record of the corpora the model learnt from
GIVEN_DOCUMENTS = "the documents given as reranker.train.corpus"


def training_docs(corpus: Any, cache: ArtifactCache) -> list[Document]:
    """The training documents, in order: `training_parts`' documents one part after another."""
    return joined(training_parts(corpus, cache))


def joined(parts: Sequence[tuple[str, Sequence[Document]]]) -> list[Document]:
    docs = [d for _, part in parts for d in part]
    if len(parts) > 1:
        check_unique_ids([d.id for d in docs], "corpus")  # as load_corpus checks a mixed corpus
    return docs


def training_parts(corpus: Any, cache: ArtifactCache) -> list[tuple[str, Sequence[Document]]]:
    """(name, documents) of each corpus the training documents come from, in order (a mixed
    corpus's parts; one for any other): a corpus object (anything load_corpus takes), a `_target_`
    mapping (instantiated with Hydra) or a list of Documents."""
    if corpus is None:
        raise RagError("reranker.train.corpus is not set: the `trained:` model needs documents to train on")
    if isinstance(corpus, Mapping):
        if "_target_" not in corpus:
            raise RagError("reranker.train.corpus: a mapping needs a '_target_' (e.g. rag.corpus.MixedCorpus)")
        from hydra.utils import instantiate

        corpus = instantiate(dict(corpus), _convert_="all")
    if isinstance(corpus, (list, tuple, DocumentStore)) and all(isinstance(d, Document) for d in corpus):
        return [(GIVEN_DOCUMENTS, list(corpus))]
    if not isinstance(corpus, Corpus):
        raise RagError(f"reranker.train.corpus: expected a corpus, got {type(corpus).__name__}")
    # a training corpus is small; the trainer indexes and samples it as a list
    return [(part.title(), list(docs)) for part, docs in load_parts(corpus, cache)]


class TrainingInputs:
    """Everything a training run reads, loaded once: settings, documents, labelled questions."""

    def __init__(self, train: Mapping[str, Any] | None, cache: ArtifactCache) -> None:
        train = dict(train or {})
        self.settings = train_settings(train)
        self.cache = cache
        self.parts = training_parts(train.get("corpus"), cache)
        self.docs = joined(self.parts)
        self.questions: list[QAItem] = []
        self.split: dict[str, Any] | None = None
        if self.settings["queries"]["labelled"]:
            if train.get("labelled") is None:
                raise RagError("reranker.train.queries.labelled > 0 needs reranker.train.labelled (a question set)")
            qs = question_set(train["labelled"])
            self.questions, self.split = qs.load(), qs.split.id
        self.generator_config = train.get("generator")

    def fitted_on(self) -> list[dict[str, Any]]:
        """What the model learns from, corpus by corpus, by name and content fingerprint
        (rag.run.fitted.corpus_record): the record a run compares its own corpus with."""
        return [corpus_record(name, docs) for name, docs in self.parts]

    def key(self) -> tuple[str, dict[str, Any]]:
        params = {"base_model": self.settings["base_model"], "train": key_settings(self.settings),
                  "version": TRAIN_VERSION}
        inputs: dict[str, Any] = {"corpus": content_fingerprint(self.docs)}
        if self.questions:
            inputs["labelled"] = {"split": self.split, "questions": questions_fingerprint(self.questions)}
        if self.settings["queries"]["generated"]:
            from rag.reranker.training.generated import generation_key

            inputs["generated"] = generation_key(self.docs, self.settings, self.generator_config)
        return make_key(KIND, params, inputs), {**params, **inputs}


def train_cross_encoder(inputs: TrainingInputs, out_dir: Path, progress: Callable[[str], None] | None = None,
                        reference: bool = False) -> dict[str, Any]:
    """Build the data, train, evaluate before/after on held-out documents, save into `out_dir`.
    `reference` also ranks them with the base model as a bi-encoder (about 15 s on 2 cores)."""
    s = inputs.settings
    say = progress or (lambda m: log.info("%s", m))
    set_threads(s["threads"])
    t_start = time.perf_counter()
    generated: list[Any] = []
    if s["queries"]["generated"]:
        from rag.reranker.training.generated import generated_examples

        generated = generated_examples(inputs.docs, s, inputs.generator_config, inputs.cache, say)
    data = build_dataset(inputs.docs, s, inputs.questions, generated)
    say(f"built {data.stats['train_pairs']} training pairs ({data.stats['train_by_kind']}), "
        f"{data.stats['val_queries']} validation queries in {data.stats['build_seconds']}s")
    model = load_base_model(s["base_model"], s["max_length"], s["seed"], s["device"], s["layers"])
    bf16 = use_bf16(s["precision"], s["device"])
    before = evaluate(model, data.val, bf16=bf16) if data.val else {}
    say(f"held-out before training: {before}")
    # a run that trains on first use shows a bar: its log lines go to the log file, not the terminal
    stats = fit(model, data.train, s, say, bar=progress is None)
    after = evaluate(model, data.val, bf16=bf16) if data.val else {}
    say(f"held-out after training: {after}")
    base_path = resolve_model(s["base_model"], "reranker base").path
    ref = biencoder_reference(base_path, data.val, s["device"]) if reference and data.val else None
    if ref:
        say(f"held-out, base model as a bi-encoder (reference): {ref}")
    model.save_pretrained(str(out_dir), safe_serialization=True)
    metrics = {
        "settings": s,
        "labelled_split": inputs.split,
        "labelled_questions": len(inputs.questions),
        "data": data.stats,
        "training": stats,
        "heldout_before": before,
        "heldout_after": after,
        "heldout_biencoder_reference": ref,
        "examples": [asdict(g) for g in data.train[:3]],
        "total_seconds": round(time.perf_counter() - t_start, 1),
    }
    (Path(out_dir) / METRICS_FILE).write_text(json.dumps(metrics, indent=2, ensure_ascii=False))
    (Path(out_dir) / RERANKER_FILE).write_text(json.dumps({"label_passages": s["label_passages"]}))
    return metrics


def artifact_key(train: Mapping[str, Any] | None, cache: ArtifactCache) -> str:
    return TrainingInputs(train, cache).key()[0]


def build_trained_model(train: Mapping[str, Any] | None, cache: ArtifactCache,
                        progress: Callable[[str], None] | None = None, reference: bool = False,
                        shipped: bool = True) -> Any:
    """The `cross_encoder` artifact for these training settings, built when missing: from the
    model that ships with the repository when it was trained under the same key (`shipped`;
    rag.reranker.training.shipped), else trained here. Returns rag.store.cache.Artifact (path = the
    saved model folder)."""
    inputs = TrainingInputs(train, cache)
    key, key_inputs = inputs.key()

    def build(tmp: Path) -> dict[str, Any]:
        if shipped and not reference:
            from rag.reranker.training.shipped import SHIPPED_DIR, restore

            if restore(key, inputs.settings["base_model"], tmp):
                log.info("cross-encoder %s: the model trained with this recipe ships in %s; not training", key, SHIPPED_DIR)
                m = json.loads((tmp / METRICS_FILE).read_text(encoding="utf-8"))
                return {"source": "shipped", "train_pairs": m["data"]["train_pairs"],
                        "train_seconds": m["training"]["train_seconds"], "total_seconds": m["total_seconds"],
                        "heldout_before": m["heldout_before"], "heldout_after": m["heldout_after"],
                        FITTED_ON: fitted_on}
        log.info("training the cross-encoder reranker %s (one-time, cached) on %d documents", key, len(inputs.docs))
        m = train_cross_encoder(inputs, tmp, progress, reference)
        return {"source": "trained", "train_pairs": m["data"]["train_pairs"], "train_seconds": m["training"]["train_seconds"],
                "total_seconds": m["total_seconds"], "heldout_before": m["heldout_before"],
                "heldout_after": m["heldout_after"], FITTED_ON: fitted_on}

    # In the manifest, not a file of the model folder: the folder's checksums name the model whose
    # scores the cache and the seed record, and a record of its corpora changes no score.
    fitted_on = inputs.fitted_on()
    art = cache.get_or_build(KIND, key, build, inputs=key_inputs)
    if FITTED_ON not in art.manifest:  # built before the record was kept: the same inputs say it
        art = replace(art, manifest={**art.manifest, FITTED_ON: fitted_on})
    return art


def fitted_on(artifact: Any) -> list[dict[str, Any]]:
    """The corpora a `cross_encoder` artifact learnt from (build_trained_model's record)."""
    return list(artifact.manifest.get(FITTED_ON) or [])


def reranker_info(model_dir: str | Path) -> dict[str, Any]:
    """What the trained model's reranker must do (reranker.json; {} for other models)."""
    f = Path(model_dir) / RERANKER_FILE
    return json.loads(f.read_text()) if f.is_file() else {}


def dataset_for(train: Mapping[str, Any] | None, cache: ArtifactCache) -> Any:
    """The training data these settings build (no training): for inspection."""
    inputs = TrainingInputs(train, cache)
    generated: Sequence[Any] = []
    if inputs.settings["queries"]["generated"]:
        from rag.reranker.training.generated import generated_examples

        generated = generated_examples(inputs.docs, inputs.settings, inputs.generator_config, inputs.cache)
    return build_dataset(inputs.docs, inputs.settings, inputs.questions, generated)
