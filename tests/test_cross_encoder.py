"""Cross-encoder reranker: ordering (with a fake model), the pair miner, and the cached trained
model (a tiny real training run)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from rag.cache import ArtifactCache
from rag.rerank import train as T
from rag.rerank.cross_encoder import CrossEncoderReranker
from rag.types import Document, Hits, RagError, make_chunk
from tests.conftest import TINY_QA

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


def _reranker(**kw) -> tuple[CrossEncoderReranker, FakeCrossEncoder]:
    r = CrossEncoderReranker(model="some/hub-model", **kw)
    fake = FakeCrossEncoder()
    r._model = fake  # injected: nothing is loaded
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
    # one batched predict call over the valid candidates of every row
    assert len(fake.calls) == 1 and len(fake.calls[0]) == 6
    assert ("beta gamma", "beta gamma delta") not in fake.calls[0]


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
    with pytest.raises(RagError, match="cache_dir"):
        CrossEncoderReranker(model="trained:", train={"corpus": []}).warm_up()


# ---- 2. the pair miner ------------------------------------------------------------------------

_WORDS = re.compile(r"[a-z]+")


def _man(name: str, desc: str, body: str, sub: tuple[str, str] | None = None) -> Document:
    indent = "\n".join("       " + line for line in body.splitlines())
    text = f"NAME\n       {name} - {desc}\n\nLIBRARY\n       Standard C library (libc, -lc)\n\nDESCRIPTION\n{indent}\n"
    if sub:
        text += f"\n   {sub[0]}\n" + "\n".join("       " + line for line in sub[1].splitlines()) + "\n"
    text += f"\nSEE ALSO\n       {name}(2)"
    return Document(f"man:{name}.2", text, "libc", {"page": name, "section": "2", "title": f"{name} - {desc}"})


def _torch(qualname: str, summary: str, body: str) -> Document:
    return Document(f"torch:{qualname}", f"{qualname}(input)\n\n{summary} {body}", "pytorch", {"object": qualname})


def _abstract(pmid: int, objective: str, methods: str, conclusion: str) -> Document:
    text = f"Background sentence about the topic area. {objective}\n\n{methods}\n\n{conclusion}"
    return Document(f"pmid:{pmid}", text, "pubmed", {"pmid": str(pmid)})


def mini_corpus() -> list[Document]:
    filler = "The call returns zero on success and minus one on error, setting errno to indicate the error. "
    return [
        _man("pipe", "create pipe", "pipe() creates a unidirectional data channel that can be used for interprocess "
             "communication between related processes.\n" + filler,
             ("Pipe capacity limits", "A pipe has a limited capacity in the kernel buffer and writes block when "
              "the pipe is full, unless the descriptor is nonblocking. " + filler)),
        _man("mmap", "map files or devices into memory", "mmap() creates a new mapping in the virtual address space "
             "of the calling process, backed by a file or anonymous memory.\n" + filler),
        _man("malloc", "allocate and free dynamic memory", "malloc() allocates size bytes and returns a pointer to "
             "the allocated heap memory, which is not initialized.\n" + filler),
        _man("fcntl", "manipulate file descriptor", "fcntl() performs one of the operations on the open file "
             "descriptor, such as duplicating it or setting record locks.\n" + filler),
        _man("socket", "create an endpoint for communication", "socket() creates an endpoint for network "
             "communication and returns a file descriptor that refers to that endpoint.\n" + filler),
        _torch("torch.nn.Module.register_forward_hook", "Register a forward hook on the module.",
               "The hook will be called every time after forward has computed an output, and it may replace "
               "the output by returning a new value. It returns a handle that removes the hook."),
        _torch("torch.optim.AdamW", "Implements the AdamW optimization algorithm.",
               "Weight decay is decoupled from the gradient update and applied directly to the parameters, "
               "which differs from L2 regularization in adaptive optimizers such as Adam."),
        _torch("torch.nn.functional.relu", "Applies the rectified linear unit function element-wise.",
               "Negative inputs become zero while positive inputs pass through unchanged, giving a sparse "
               "activation pattern that is cheap to compute on any device."),
        _torch("torch.linalg.svd", "Computes the singular value decomposition of a matrix.",
               "The decomposition factors the input into orthogonal matrices and a diagonal of singular values "
               "sorted in descending order, for batches of matrices as well."),
        _torch("torch.utils.data.DataLoader", "Combines a dataset and a sampler into an iterable.",
               "It supports automatic batching, multi-process data loading with worker processes, memory "
               "pinning and custom collate functions for map-style and iterable datasets."),
        _abstract(1, "The aim of this study was to assess ciclesonide nasal spray in seasonal allergic rhinitis.",
                  "Patients were randomized to ciclesonide or placebo for two weeks and rated nasal symptoms daily "
                  "in diaries reviewed by physicians at every visit.",
                  "Ciclesonide reduced physician-assessed nasal signs and symptoms more than placebo did, with a "
                  "similar rate of adverse events in both groups of patients."),
        _abstract(2, "We investigated mitochondrial dynamics during programmed cell death in lace plant leaves.",
                  "Leaves at several developmental stages were imaged with live-cell microscopy and treated with "
                  "cyclosporine A to inhibit the permeability transition pore.",
                  "Mitochondrial changes preceded cell death and cyclosporine A reduced the number of perforations "
                  "formed in the leaves, implicating the transition pore."),
        _abstract(3, "The objective was to determine whether statin therapy improves cardiovascular outcomes.",
                  "A cohort of adults with raised cholesterol was followed for five years and major cardiac events "
                  "were adjudicated by a blinded committee of cardiologists.",
                  "Patients receiving statins had fewer major cardiovascular events than those receiving placebo "
                  "over five years of follow up, without excess harm."),
        _abstract(4, "To evaluate closed reduction for nasal bone fractures and patient satisfaction.",
                  "Adults with isolated nasal fractures underwent closed reduction within two weeks and completed "
                  "a satisfaction questionnaire three months after treatment.",
                  "Closed reduction was sufficient for mild nasal fractures and early intervention raised the rate "
                  "of satisfied patients at follow up."),
    ]


def _words(text: str) -> set[str]:
    return set(_WORDS.findall(text.lower()))


def test_miner_pairs_positives_from_own_doc_negatives_from_others():
    docs = mini_corpus()
    mined = T.mine(docs, n_pairs=200, seed=0, hard_negatives=2, random_negatives=1, val_fraction=0.2, val_queries=10)
    groups = mined.train + mined.val
    assert {g.kind for g in groups} >= {"man_name", "docstring", "abstract"}
    by_id = {d.id: d for d in docs}
    norm = lambda s: " ".join(s.split())  # noqa: E731
    for g in groups:
        own = norm(by_id[g.doc_id].text)
        # every query is document text (never a question), and the positive has it cut out
        assert T.clean_markup(g.query) in norm(own) or g.query in own
        assert norm(g.query).lower() not in norm(g.positive).lower()
        assert len(g.positive) <= T.MAX_PASSAGE_CHARS
        assert _words(g.positive) <= _words(by_id[g.doc_id].text)
        assert 1 <= len(g.negatives) <= 3
        for n in g.negatives:  # passages of other documents, never of the query's own
            origin = {d.id for d in docs if _words(n) <= _words(d.text)}
            assert origin and g.doc_id not in origin
        assert g.pairs()[0] == (g.query, g.positive, 1.0)
        assert all(lab == 0.0 for _, _, lab in g.pairs()[1:])
    man = next(g for g in groups if g.doc_id == "man:fcntl.2" and g.kind == "man_name")
    assert man.query == "manipulate file descriptor" and "performs one of the operations" in man.positive
    doc = next(g for g in groups if g.doc_id == "torch:torch.optim.AdamW")
    assert doc.query == "Implements the AdamW optimization algorithm." and "Weight decay is decoupled" in doc.positive
    ab = next(g for g in groups if g.doc_id == "pmid:3")
    assert ab.query.startswith("The objective was to determine")
    # validation queries come from other documents than training queries
    assert not {g.doc_id for g in mined.train} & {g.doc_id for g in mined.val}


def test_miner_is_deterministic_and_never_uses_questions():
    docs = mini_corpus()
    a = T.mine(docs, n_pairs=120, seed=3)
    b = T.mine(list(docs), n_pairs=120, seed=3)
    assert a.train == b.train and a.val == b.val
    assert a.train_pairs() == b.train_pairs()
    queries = {T._norm(g.query) for g in a.train + a.val}
    eval_questions = {T._norm(q[1]) for q in TINY_QA}
    for f in (Path(__file__).resolve().parent.parent / "data" / "qa").glob("*.jsonl"):
        eval_questions |= {T._norm(json.loads(line)["question"]) for line in f.read_text().splitlines() if line.strip()}
    assert not queries & eval_questions


def test_miner_excludes_docs_that_share_the_query():
    base = "Pads the input tensor boundaries with zero."
    body = "For N-dimensional padding use the functional pad. Args: padding (int, tuple): the size of the padding "
    docs = [_torch(f"torch.nn.ZeroPad{i}d", base, body * 2 + f"in {i} dimensions only.") for i in (1, 2, 3)]
    docs += mini_corpus()
    mined = T.mine(docs, n_pairs=400, seed=0, val_fraction=0.01)
    pads = [g for g in mined.train if g.query == base]
    assert pads
    for g in pads:  # the other ZeroPad docs answer the same query: never negatives
        assert not any("dimensions only" in n for n in g.negatives)


def test_split_passages_sizes():
    text = "\n\n".join(("Sentence number %d is here. " % i) * 12 for i in range(6))
    parts = T.split_passages(text, 450)
    assert all(len(p) <= T.MAX_PASSAGE_CHARS for p in parts)
    assert all(len(p) >= 150 for p in parts)


def test_metrics():
    g = T.Group("q", "d", "s", "k", "pos", ("n1", "n2", "n3"))
    m = T.group_metrics([g, g], np.array([2.0, 1.0, 3.0, 0.0, 5.0, -1.0, -2.0, -3.0]))
    assert m["mrr"] == pytest.approx((0.5 + 1.0) / 2)
    assert m["auc"] == pytest.approx(11 / 12, abs=1e-4)  # positive 2 beats 5 of the 6 negatives, 5 beats all
    assert m["pairwise_accuracy"] == pytest.approx((2 / 3 + 1) / 2, abs=1e-4)
    assert T.roc_auc(np.array([1.0, 0.0]), np.array([1.0, 0.0])) == 1.0


# ---- 3. the trained model artifact ------------------------------------------------------------

TINY_TRAIN = {
    "pairs": 40, "epochs": 1, "max_length": 32, "batch_size": 8, "val_fraction": 0.25, "val_queries": 4, "seed": 0,
    "threads": 1,  # a tiny model: one thread is as fast, and never stalls on a busy machine
}


def _write_corpus(path: Path) -> Path:
    rows = [{"id": d.id, "text": d.text, "source": d.source, **d.meta} for d in mini_corpus()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_trained_model_is_cached_and_keyed_by_settings(tmp_path: Path, monkeypatch):
    from rag.corpus import JsonlCorpus

    corpus = {"_target_": "rag.corpus.JsonlCorpus", "path": str(_write_corpus(tmp_path / "corpus.jsonl"))}
    cache_dir = tmp_path / "cache"
    r1 = CrossEncoderReranker(model="trained:", train={**TINY_TRAIN, "corpus": corpus}, cache_dir=cache_dir,
                              max_length=64)
    r1.warm_up()
    art = r1.artifact
    assert not art.hit and art.path.parent == cache_dir / "cross_encoder"
    assert (art.path / "model.safetensors").is_file() and (art.path / T.METRICS_FILE).is_file()
    metrics = json.loads((art.path / T.METRICS_FILE).read_text())
    assert metrics["mining"]["train_pairs"] >= 36 and metrics["training"]["steps"] >= 5
    assert set(art.manifest["heldout_after"]) >= {"mrr", "auc", "accuracy"}

    # a second reranker with the same settings (here: the corpus as an object) loads it untrained
    def boom(*a, **k):
        raise AssertionError("trained again")

    monkeypatch.setattr(T, "train_cross_encoder", boom)
    r2 = CrossEncoderReranker(model="trained:", train={**TINY_TRAIN, "corpus": JsonlCorpus(corpus["path"])},
                              cache_dir=cache_dir, max_length=64)
    r2.warm_up()
    assert r2.artifact.hit and r2.artifact.key == art.key

    # it reranks: real scores from the saved model
    docs = mini_corpus()
    chunks = [make_chunk(d, 0, min(len(d.text), 300), 0) for d in docs]
    hits = Hits(np.array([[0, 5, 10, -1]]), np.array([[3, 2, 1, -np.inf]], np.float32))
    out = r2.rerank(["create pipe"], hits, chunks, k=3)
    assert sorted(out.ids[0].tolist()) == [0, 5, 10] and np.isfinite(out.scores[0]).all()

    # any training setting, the seed or the documents change the key
    docs_key, _ = T.artifact_key(TINY_TRAIN, docs)
    assert T.artifact_key({**TINY_TRAIN}, docs)[0] == docs_key
    assert T.artifact_key({**TINY_TRAIN, "lr": 1e-4}, docs)[0] != docs_key
    assert T.artifact_key({**TINY_TRAIN, "seed": 1}, docs)[0] != docs_key
    assert T.artifact_key({**TINY_TRAIN, "threads": 2}, docs)[0] == docs_key  # speed only
    assert T.artifact_key(TINY_TRAIN, docs[:-1])[0] != docs_key
    r3 = CrossEncoderReranker(model="trained:", train={**TINY_TRAIN, "epochs": 2, "corpus": corpus},
                              cache_dir=cache_dir)
    with pytest.raises(AssertionError, match="trained again"):
        r3.warm_up()


def test_trained_model_cache_is_used_across_processes_by_key(tmp_path: Path):
    """The artifact key does not depend on how the corpus is given."""
    docs = mini_corpus()
    path = _write_corpus(tmp_path / "c.jsonl")
    cache = ArtifactCache(tmp_path / "cache")
    from rag.corpus import JsonlCorpus

    loaded = T.training_docs(JsonlCorpus(path), cache)
    assert [d.id for d in loaded] == [d.id for d in docs]
    assert T.artifact_key(TINY_TRAIN, loaded)[0] == T.artifact_key(TINY_TRAIN, docs)[0]
    with pytest.raises(RagError, match="corpus"):
        T.training_docs(None, cache)


def test_default_config_builds_the_reranker(tmp_path: Path):
    """conf/reranker/cross_encoder.yaml composes and instantiates (train.corpus as an object)."""
    from hydra import compose, initialize_config_dir

    from rag.config import PROJECT_ROOT
    from rag.pipeline import build

    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["reranker=cross_encoder", f"paths.cache={tmp_path}"])
    r = build(cfg.reranker)
    assert isinstance(r, CrossEncoderReranker) and r.model_name == "trained:" and r.top_n == 20
    assert hasattr(r.train["corpus"], "parts")


@pytest.mark.slow
def test_real_corpus_mining_uses_no_evaluation_question(tmp_path: Path, compose_cfg):
    """On the real mixed corpus (cached under paths.cache): no mined query is, or contains, a
    question of the evaluation sets (PubMedQA questions, the dev sets in data/qa)."""
    from hydra.utils import instantiate

    cfg = compose_cfg(["reranker=cross_encoder"])
    try:
        train = instantiate(cfg.reranker.train, _convert_="all")
        docs = T.training_docs(train["corpus"], ArtifactCache(cfg.paths.cache))
        questions = instantiate(cfg.qa).load()
    except RagError as e:
        pytest.skip(f"real corpora not available: {e}")
    mined = T.mine_with(docs, train)
    asked = {T._norm(q.question) for q in questions}
    for g in mined.train + mined.val:
        q = T._norm(g.query)
        assert q not in asked
        assert not any(a in q for a in asked if len(a) > 20)
