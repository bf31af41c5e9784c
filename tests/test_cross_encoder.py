"""Cross-encoder reranker: ordering and fusion (with a fake model), passage labels, and the cached
trained model (a tiny real training run). The training data itself: tests/test_reranker_training.py."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest

from rag.store.cache import ArtifactCache
from rag.reranker.cross_encoder import CrossEncoderReranker
from rag.reranker.pointwise import fuse_scores
from rag.reranker.training import artifact as A
from rag.types import Document, Hits, QAItem, RagError, make_chunk
from tests.test_reranker_training import QUESTIONS, mini_corpus

# ---- 1. ordering ------------------------------------------------------------------------------


class FakeCrossEncoder:
    """Scores a pair by how many query words the passage contains; records the calls."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, str]]] = []

    def predict(self, pairs, batch_size=32, show_progress_bar=None, activation_fn=None, convert_to_numpy=True, **kw):
        assert show_progress_bar is False
        self.calls.append(list(pairs))
        return np.array([sum(w in p.split() for w in q.split()) for q, p in pairs], np.float32)


def _chunks(texts: list[str]):
    doc = Document("d", " ".join(texts), "user")
    out, at = [], 0
    for i, t in enumerate(texts):
        out.append(make_chunk(Document("d", " ".join(texts), "user"), at, at + len(t), i))
        at += len(t) + 1
    assert [c.text for c in out] == texts and doc
    return out


def _reranker(cache_dir: Path | None = None, **kw) -> tuple[CrossEncoderReranker, FakeCrossEncoder]:
    r = CrossEncoderReranker(model="some/hub-model", **kw)
    fake = FakeCrossEncoder()
    r._model = fake  # injected: nothing is loaded
    r.use_cache(ArtifactCache(cache_dir or tempfile.mkdtemp(prefix="ragrig-ce-test-")))
    return r, fake


def test_rerank_orders_by_score_ties_by_retrieval_rank():
    chunks = _chunks(["alpha", "beta gamma", "gamma", "beta", "delta", "beta gamma delta"])
    r, fake = _reranker(top_n=4)
    hits = Hits(
        np.array([[0, 1, 2, 3, 5], [4, 3, -1, -1, -1]]),
        np.array([[5, 4, 3, 2, 1], [2, 1, -np.inf, -np.inf, -np.inf]], np.float32),
    )
    out = r.rerank(["beta gamma", "delta"], hits, chunks, k=3)
    # query 0 sees rows 0..3 (top_n=4): scores alpha 0, "beta gamma" 2, gamma 1, beta 1 -> 1, then
    # 2 and 3 tied at 1 in retrieval order; row 5 (score 2, but rank 5) is never scored
    assert out.ids[0].tolist() == [1, 2, 3]
    assert out.scores[0].tolist() == [2.0, 1.0, 1.0]
    # query 1 has two valid candidates: delta 1, beta 0; the empty slot stays empty
    assert out.ids[1].tolist() == [4, 3, -1]
    assert out.scores[1][2] == -np.inf
    # one predict call per question over its valid candidates, so that a question's scores do not
    # depend on which questions share the call (padding within a batch)
    assert [len(c) for c in fake.calls] == [4, 2]
    assert ("beta gamma", "beta gamma delta") not in fake.calls[0]


def test_scores_are_recorded_in_the_cache_and_a_timed_search_scores_anew(tmp_path: Path):
    chunks = _chunks(["alpha", "beta gamma", "gamma", "beta"])
    hits = Hits(np.array([[0, 1, 2, 3]]), np.array([[4, 3, 2, 1]], np.float32))
    r, fake = _reranker(tmp_path, top_n=4)
    first = r.rerank(["beta gamma"], hits, chunks, k=3)
    assert len(fake.calls) == 1 and list((tmp_path / "rerank_scores").rglob("*.json"))
    # another reranker object on the same cache (a later run) reads the scores instead of scoring
    again, fake2 = _reranker(tmp_path, top_n=4)
    assert again.rerank(["beta gamma"], hits, chunks, k=3).ids.tolist() == first.ids.tolist()
    assert fake2.calls == []
    # a timed search (rag.run.latency) scores
    assert again.rerank(["beta gamma"], hits, chunks, k=3, reuse=False).ids.tolist() == first.ids.tolist()
    assert len(fake2.calls) == 1
    # other candidates, another query or another model: scored
    again.rerank(["beta"], hits, chunks, k=3)
    other, fake3 = _reranker(tmp_path, top_n=4)
    other._identity = {**other._identity, "model": "another/model"}
    other.rerank(["beta gamma"], hits, chunks, k=3)
    assert len(fake2.calls) == 2 and len(fake3.calls) == 1


def test_a_read_only_cache_only_stops_the_recording(tmp_path: Path, caplog):
    chunks = _chunks(["alpha", "beta"])
    hits = Hits(np.array([[0, 1]]), np.array([[2, 1]], np.float32))
    r, fake = _reranker(tmp_path / "ro", top_n=2)
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "rerank_scores").write_text("a file where a folder should be")
    assert r.rerank(["beta"], hits, chunks, k=2).ids.tolist() == [[1, 0]]
    assert r.rerank(["beta"], hits, chunks, k=2).ids.tolist() == [[1, 0]]
    assert len(fake.calls) == 2 and "not recorded" in caplog.text


def test_rerank_keeps_candidates_past_top_n_after_the_reranked_ones():
    chunks = _chunks(["x", "y", "q", "q q"])
    r, _ = _reranker(top_n=2)
    hits = Hits(np.array([[0, 1, 2, 3]]), np.array([[4, 3, 2, 1]], np.float32))
    out = r.rerank(["q"], hits, chunks, k=4)
    assert out.ids[0].tolist() == [0, 1, 2, 3]  # both reranked score 0 (tie: retrieval order), then the tail
    assert np.all(np.diff(out.scores[0]) <= 0)
    empty = r.rerank([], Hits.empty(0, 4), chunks, k=3)
    assert empty.ids.shape == (0, 3)


def test_constructor_and_path_errors(tmp_path: Path):
    with pytest.raises(RagError, match="top_n"):
        CrossEncoderReranker(model="x/y", top_n=0)
    with pytest.raises(RagError, match="unknown setting"):
        CrossEncoderReranker(model="trained:", train={"pairz": 3})
    r = CrossEncoderReranker(model=str(tmp_path / "missing-model"))
    with pytest.raises(RagError, match="does not exist") as e:
        r.warm_up()
    assert "\n" not in str(e.value)
    untrained = CrossEncoderReranker(model="trained:")
    cache = ArtifactCache(tmp_path / "cache")
    untrained.use_cache(cache)  # the session's cache, where the trained model is looked up or built
    assert untrained.cache is cache


# ---- 2. fusion with the first stage and passage labels ----------------------------------------


def test_fusion_keeps_the_first_stage_order_in_play():
    ce = np.array([0.0, 0.1, 5.0, 0.2], np.float32)  # candidates in first-stage order
    assert np.argsort(-fuse_scores(ce, "none", 0.5), kind="stable")[0] == 2
    # rrf over the two orders (CE: 2, 3, 1, 0; first stage: 0, 1, 2, 3), ranks from 1, k = 1
    rrf = fuse_scores(ce, "rrf", 0.5, k=1)
    expected = [0.5 / 2 + 0.5 / 5, 0.5 / 4 + 0.5 / 3, 0.5 / 2 + 0.5 / 4, 0.5 / 3 + 0.5 / 5]
    assert rrf == pytest.approx(expected)
    assert np.argsort(-rrf, kind="stable").tolist() == [2, 0, 1, 3]
    assert fuse_scores(ce, "rrf", 0.3, k=1).argmax() == 0  # more weight on the first stage
    assert fuse_scores(ce, "rrf", 1.0, k=60).argmax() == 2 and fuse_scores(ce, "rrf", 0.0, k=60).argmax() == 0
    # linear: a standardized logit against -ln(rank); weight 0 is the first stage, 1 the CE
    assert fuse_scores(ce, "linear", 0.0).argmax() == 0 and fuse_scores(ce, "linear", 1.0).argmax() == 2
    tied = np.zeros(3, np.float32)
    assert np.argsort(-fuse_scores(tied, "linear", 0.7), kind="stable").tolist() == [0, 1, 2]
    assert len(fuse_scores(np.zeros(0, np.float32), "rrf", 0.5)) == 0


def test_fused_reranking_weighs_the_cross_encoder_against_the_first_stage():
    chunks = _chunks(["a", "b", "c", "d"])
    hits = Hits(np.array([[0, 1, 2, 3]]), np.array([[4, 3, 2, 1]], np.float32))
    fake_scores = lambda pairs, **kw: np.array([0.0, 0.1, 0.2, 9.0], np.float32)  # noqa: E731 (CE: d, c, b, a)
    r, fake = _reranker(top_n=4, fuse={"method": "rrf", "weight": 0.5, "k": 1})
    fake.predict = fake_scores
    # d: 0.5/2 + 0.5/5 = 0.35, a: 0.5/5 + 0.5/2 = 0.35 (tie: first-stage order), b and c: 0.5/4 + 0.5/3
    assert r.rerank(["q"], hits, chunks, k=4).ids[0].tolist() == [0, 3, 1, 2]
    r, fake = _reranker(top_n=4, fuse={"method": "rrf", "weight": 0.8, "k": 1})
    fake.predict = fake_scores
    assert r.rerank(["q"], hits, chunks, k=2).ids[0].tolist() == [3, 2]
    with pytest.raises(RagError, match="fuse.method"):
        CrossEncoderReranker(model="x/y", fuse={"method": "max"})
    with pytest.raises(RagError, match="unknown key"):
        CrossEncoderReranker(model="x/y", fuse={"methd": "rrf"})


def test_the_default_fusion_keeps_the_first_stage_order_unless_the_model_is_clearly_surer(tmp_path: Path):
    """v3's default fusion (conf/reranker/cross_encoder.yaml, chosen by leave-one-domain-out): on a
    domain it never saw the cross-encoder ranks no better than the first stage, so a candidate it
    prefers by a small margin stays where the first stage put it, while one it scores far above
    every other candidate still comes first."""
    from hydra import compose, initialize_config_dir

    from rag.config.compose import PROJECT_ROOT
    from rag.run.session import create

    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["reranker=cross_encoder", f"paths.cache={tmp_path}"])
    r = create(cfg.reranker)
    r._model = FakeCrossEncoder()  # injected: nothing is loaded or trained
    r.use_cache(ArtifactCache(tmp_path / "cache"))
    chunks = _chunks([f"c{i}" for i in range(20)])
    hits = Hits(np.arange(20)[None, :], np.linspace(1.0, 0.0, 20, dtype=np.float32)[None, :])

    def top(logits: dict[int, float], query: str) -> int:
        ce = np.zeros(20, np.float32)
        ce[list(logits)] = list(logits.values())
        r._model.predict = lambda pairs, **kw: ce
        return int(r.rerank([query], hits, chunks, k=5).ids[0, 0])

    # the model's best (second in the first stage) beats the first stage's top by 0.2 logits
    assert top({0: 1.0, 1: 1.2}, "unsure") == 0
    # the model puts the third candidate 10 logits above all the others
    assert top({2: 10.0}, "sure") == 2


def test_labelled_passages_name_their_document():
    doc = Document("man:pipe.2", "pipe() creates a pipe.", "libc")
    chunk = make_chunk(doc, 0, len(doc.text), 0)
    r, fake = _reranker(label_passages=True)
    r.rerank(["q"], Hits(np.array([[0]]), np.array([[1.0]], np.float32)), [chunk], k=1)
    assert fake.calls[0] == [("q", "man page pipe(2)\npipe() creates a pipe.")]
    r, fake = _reranker()  # a hub model: no labels unless asked for
    r.rerank(["q"], Hits(np.array([[0]]), np.array([[1.0]], np.float32)), [chunk], k=1)
    assert fake.calls[0] == [("q", "pipe() creates a pipe.")]


# ---- 3. the trained model artifact ------------------------------------------------------------

TINY_TRAIN = {
    "queries": {"labelled": 2, "templates": 8, "mined": 4, "generated": 0}, "epochs": 1, "max_length": 32,
    "batch_size": 8, "val_fraction": 0.25, "val_queries": 4, "seed": 0, "chunk_size": 200, "chunk_overlap": 30,
    "label_passages": True,
    "threads": 1,  # a tiny model: one thread is as fast, and never stalls on a busy machine
}


def _write_corpus(path: Path) -> Path:
    rows = [{"id": d.id, "text": d.text, "source": d.source, **d.meta} for d in mini_corpus()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _write_questions(path: Path) -> Path:
    rows = [{"id": q.id, "question": q.question, "answer": q.answer, "source": q.source, "corpus": q.corpus}
            for q in QUESTIONS]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _labelled(path: Path, fraction: float = 0.1) -> dict:
    return {"_target_": "rag.qa.jsonl.JsonlQuestions", "path": str(path), "split": {"part": "train", "fraction": fraction}}


def test_trained_model_is_cached_and_keyed_by_settings(tmp_path: Path, monkeypatch):
    from rag.corpus import JsonlCorpus

    corpus = {"_target_": "rag.corpus.JsonlCorpus", "path": str(_write_corpus(tmp_path / "corpus.jsonl"))}
    labelled = _labelled(_write_questions(tmp_path / "q.jsonl"))
    cache_dir = tmp_path / "cache"
    r1 = CrossEncoderReranker(model="trained:", train={**TINY_TRAIN, "corpus": corpus, "labelled": labelled},
                              max_length=64)
    r1.use_cache(ArtifactCache(cache_dir))
    r1.warm_up()
    art = r1.artifact
    assert not art.hit and art.path.parent == cache_dir / "cross_encoder"
    assert (art.path / "model.safetensors").is_file() and (art.path / A.METRICS_FILE).is_file()
    metrics = json.loads((art.path / A.METRICS_FILE).read_text())
    assert metrics["data"]["train_queries"] >= 8 and metrics["training"]["steps"] >= 2
    assert metrics["labelled_split"] == {"fraction": 0.1, "seed": 0, "part": "train"}
    assert set(art.manifest["heldout_after"]) >= {"mrr", "auc", "accuracy"}
    assert r1.label_passages is True  # read from the model's reranker.json

    # a second reranker with the same settings (here: the corpus as an object) loads it untrained
    def boom(*a, **k):
        raise AssertionError("trained again")

    monkeypatch.setattr(A, "train_cross_encoder", boom)
    r2 = CrossEncoderReranker(model="trained:", train={**TINY_TRAIN, "corpus": JsonlCorpus(corpus["path"]),
                                                       "labelled": labelled}, max_length=64)
    r2.use_cache(ArtifactCache(cache_dir))
    r2.warm_up()
    assert r2.artifact.hit and r2.artifact.key == art.key

    # it reranks: real scores from the saved model
    docs = mini_corpus()
    chunks = [make_chunk(d, 0, min(len(d.text), 300), 0) for d in docs]
    hits = Hits(np.array([[0, 5, 10, -1]]), np.array([[3, 2, 1, -np.inf]], np.float32))
    out = r2.rerank(["create pipe"], hits, chunks, k=3)
    assert sorted(out.ids[0].tolist()) == [0, 5, 10] and np.isfinite(out.scores[0]).all()

    # any training setting, the seed, the documents, the labelled questions or their split change the key
    cache = ArtifactCache(cache_dir)
    base = {**TINY_TRAIN, "corpus": docs, "labelled": labelled}
    key = A.artifact_key(base, cache)
    assert A.artifact_key({**base}, cache) == key
    assert A.artifact_key({**base, "lr": 1e-4}, cache) != key
    assert A.artifact_key({**base, "seed": 1}, cache) != key
    assert A.artifact_key({**base, "threads": 2, "device": "cuda"}, cache) == key  # speed only
    assert A.artifact_key({**base, "corpus": docs[:-1]}, cache) != key
    assert A.artifact_key({**base, "labelled": _labelled(tmp_path / "q.jsonl", 0.5)}, cache) != key
    r3 = CrossEncoderReranker(model="trained:", train={**TINY_TRAIN, "epochs": 2, "corpus": corpus,
                                                       "labelled": labelled})
    r3.use_cache(cache)
    with pytest.raises(AssertionError, match="trained again"):
        r3.warm_up()


def test_layers_keeps_the_first_layers_of_the_base_model_and_the_saved_model_loads_so(tmp_path: Path):
    from transformers import AutoConfig

    from rag.reranker.training.settings import train_settings

    train = {**TINY_TRAIN, "queries": {"templates": 8}, "corpus": mini_corpus(), "layers": 1}
    r = CrossEncoderReranker(model="trained:", train=train, max_length=64)
    r.use_cache(ArtifactCache(tmp_path / "cache"))
    r.warm_up()
    assert AutoConfig.from_pretrained(r.artifact.path).num_hidden_layers == 1
    assert len(r.model.model.bert.encoder.layer) == 1
    assert A.artifact_key(train, r.cache) != A.artifact_key({**train, "layers": None}, r.cache)
    for bad in (0, -1, 2.5, "three"):
        with pytest.raises(RagError, match="layers"):
            train_settings({"layers": bad})
    with pytest.raises(RagError, match="between 1 and 6"):
        A.build_trained_model({**train, "layers": 7}, ArtifactCache(tmp_path / "other"))


def test_a_run_never_scores_a_question_the_reranker_was_trained_on(tmp_path: Path):
    from rag.qa.jsonl import JsonlQuestions

    path = _write_questions(tmp_path / "q.jsonl")
    r = CrossEncoderReranker(model="trained:", train={**TINY_TRAIN, "labelled": _labelled(path, 0.5)})
    split = {"fraction": 0.5, "seed": 0}
    train_part = JsonlQuestions(path, split={**split, "part": "train"}).load()
    test_part = JsonlQuestions(path, split={**split, "part": "test"}).load()
    assert train_part and test_part
    r.check_questions(test_part)  # fine: never trained on
    with pytest.raises(RagError, match=f"1 of the {len(test_part) + 1} questions .* train part of reranker.train.labelled"):
        r.check_questions(test_part + train_part[:1])
    renamed = [QAItem("other-id", train_part[0].question.upper(), "a", None, "c")]
    with pytest.raises(RagError, match="train part"):  # the same question under another id
        r.check_questions(renamed)
    # no labelled family, or another model: nothing to check
    CrossEncoderReranker(model="trained:", train={**TINY_TRAIN, "queries": {"templates": 8},
                                                 "labelled": _labelled(path, 0.5)}).check_questions(train_part)
    CrossEncoderReranker(model="some/hub-model").check_questions(train_part)


def test_training_documents_may_be_given_in_any_form(tmp_path: Path):
    """The artifact key does not depend on how the corpus is given."""
    docs = mini_corpus()
    path = _write_corpus(tmp_path / "c.jsonl")
    cache = ArtifactCache(tmp_path / "cache")
    from rag.corpus import JsonlCorpus

    loaded = A.training_docs(JsonlCorpus(path), cache)
    assert [d.id for d in loaded] == [d.id for d in docs]
    assert A.artifact_key({**TINY_TRAIN, "queries": {"templates": 8}, "corpus": loaded}, cache) == \
        A.artifact_key({**TINY_TRAIN, "queries": {"templates": 8}, "corpus": {"_target_": "rag.corpus.JsonlCorpus",
                                                                             "path": str(path)}}, cache)
    with pytest.raises(RagError, match="corpus"):
        A.training_docs(None, cache)
    with pytest.raises(RagError, match="labelled"):
        A.artifact_key({**TINY_TRAIN, "corpus": loaded}, cache)  # labelled queries but no question set


def test_default_config_builds_the_reranker(tmp_path: Path):
    """conf/reranker/cross_encoder.yaml composes and instantiates (train.corpus as an object, the
    labelled questions as the train part of PubMedQA)."""
    from hydra import compose, initialize_config_dir

    from rag.config.compose import PROJECT_ROOT
    from rag.run.session import create

    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["reranker=cross_encoder", f"paths.cache={tmp_path}"])
    r = create(cfg.reranker)
    assert isinstance(r, CrossEncoderReranker) and r.model_name == "trained:"
    assert r.precision == "auto" and r.backend == "auto" and r.fuse_method == "linear" and r.top_n == 20
    assert hasattr(r.train["corpus"], "parts")
    assert r.train["labelled"].split.part == "train"


def test_v3_reranks_with_the_trained_cross_encoder_and_v4_inherits_it():
    """Issue 17: v3 is v2 plus the cross-encoder (the seed's design), trained here on first use."""
    from hydra import compose, initialize_config_dir

    from rag.config.compose import PROJECT_ROOT

    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        for version in ("v3", "v4"):
            cfg = compose("config", overrides=[f"+version={version}"])
            assert cfg.reranker._target_ == "rag.reranker.cross_encoder.CrossEncoderReranker"
            assert cfg.reranker.model == "trained:"
        assert compose("config", overrides=["+version=v2"]).reranker._target_ == "rag.reranker.NoReranker"


def test_the_onnx_backend_scores_as_torch_does(tmp_path: Path):
    """reranker.backend=onnx: the shipped model exported into the cache, its logits within 1e-4 of
    torch's on real passages of several lengths, so the same order."""
    from rag.embedder.backend_choice import openvino_available
    from rag.reranker.cross_encoder import load_cross_encoder
    from rag.reranker.logits import predict_logits
    from rag.reranker.training.shipped import restore, shipped_manifest

    m = shipped_manifest()
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    assert restore(m["key"], m["base_model"], model_dir)
    texts = ["fcntl - manipulate file descriptor", "dup() allocates a new file descriptor that refers to the same open "
             "file description as the descriptor oldfd. " * 6, "torch.cat concatenates tensors along a dimension.",
             "Asthma patients used budesonide-formoterol as needed. " * 12]
    queries = ["How do I duplicate a file descriptor?", "What does torch.cat do?"]
    torch_model = load_cross_encoder(str(model_dir), 160, "cpu")
    graph_backends = ["onnx"] + (["openvino"] if openvino_available() else [])  # openvino: fp32 on the same export
    for backend in graph_backends:
        r = CrossEncoderReranker(model=str(model_dir), max_length=160, backend=backend, precision="fp32",
                                 label_passages=False)
        r.use_cache(ArtifactCache(tmp_path / "cache"))
        for q in queries:
            pairs = [(q, t) for t in texts]
            got, want = r.score(pairs), predict_logits(torch_model, pairs, 32)
            assert np.abs(got - want).max() < 1e-4, backend
            assert np.array_equal(np.argsort(-got), np.argsort(-want)), backend
        assert r.backend_note["backend"] == backend
    exports = [d for d in (tmp_path / "cache" / "onnx_cross_encoder").iterdir() if not d.name.startswith(".")]
    assert len(exports) == 1, "one export, in the artifact cache"
    with pytest.raises(RagError, match="reranker.backend=onnx runs in fp32"):
        CrossEncoderReranker(model=str(model_dir), backend="onnx", precision="bf16")
    with pytest.raises(RagError, match=r"reranker.backend must be one of auto, torch, onnx, openvino, got 'tensorrt'"):
        CrossEncoderReranker(model=str(model_dir), backend="tensorrt")
