"""BM25: both backends rank alike on the same tokens, filters apply, bm25s persists, and a streamed
build writes the index bm25s would have saved, resuming after a kill."""
import json
import random
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

import rag.retriever.bm25
import rag.retriever.bm25_build
import rag.retriever.maxscore
from rag.retriever.bm25 import BM25Index, top_k
from rag.retriever.bm25_build import write_bm25s_index
from rag.retriever.tokens import token_ids, tokenize
from rag.config.compose import PROJECT_ROOT
from rag.types import RagError

CORPUS = [
    "The fcntl system call manipulates file descriptors and record locks.",
    "mmap creates a new mapping in the virtual address space of the calling process.",
    "malloc allocates size bytes and returns a pointer to the allocated memory.",
    "A forward hook is called every time after forward has computed an output.",
    "The optimizer AdamW implements Adam with decoupled weight decay.",
    "Signals are delivered to a process; sigaction changes the action taken on a signal.",
    "pthread_create starts a new thread in the calling process.",
    "The DataLoader combines a dataset and a sampler and iterates over the dataset.",
    "Memory mappings created by mmap are unmapped with munmap.",
    "Record locks placed with fcntl are released when the file descriptor is closed.",
    "Weight decay in AdamW is applied directly to the weights rather than the gradient.",
    "A pointer returned by malloc must be released with free.",
]
QUERIES = ["fcntl record locks", "mmap memory mapping", "adamw weight decay", "malloc free pointer", "thread process"]


def test_tokenize_keeps_identifiers_whole_and_stems():
    toks = tokenize(["Setting O_NONBLOCK with register_forward_hook mappings"])[0]
    assert "o_nonblock" in toks and "register_forward_hook" in toks
    assert "map" in toks  # "mappings" stemmed
    assert "with" not in toks  # stopword


def test_backends_rank_alike():
    a = BM25Index("bm25s").build(CORPUS).search(QUERIES, 5)
    b = BM25Index("rank_bm25").build(CORPUS).search(QUERIES, 5)
    np.testing.assert_array_equal(a.ids, b.ids)
    # Same function up to the constant (k1 + 1) that Lucene drops: the score ratios agree.
    valid = a.ids >= 0
    ratio = b.scores[valid] / a.scores[valid]
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-4)


def test_expected_documents_rank_first():
    hits = BM25Index().build(CORPUS).search(QUERIES[:4], 2)
    assert set(hits.ids[0]) == {0, 9}  # both fcntl record-lock sentences
    assert set(hits.ids[1]) == {1, 8}  # both mmap sentences
    assert set(hits.ids[2]) == {4, 10}  # both AdamW sentences
    assert hits.ids[3, 0] == 11  # the one sentence with malloc, free and pointer


def test_documents_without_query_terms_are_not_returned():
    hits = BM25Index().build(CORPUS).search(["zebra giraffe", "fcntl"], 5)
    assert (hits.ids[0] == -1).all()
    assert set(hits.ids[1][hits.ids[1] >= 0]) == {0, 9}


@pytest.mark.parametrize("backend", ["bm25s", "rank_bm25"])
def test_filter_restricts_rows(backend):
    allowed = np.array([1, 2, 3])
    hits = BM25Index(backend).build(CORPUS).search(["mmap memory"], 5, allowed=allowed)
    got = set(hits.ids[0][hits.ids[0] >= 0].tolist())
    assert got and got <= {1, 2, 3}


def test_bm25s_save_and_load(tmp_path):
    idx = BM25Index("bm25s").build(CORPUS)
    idx.save(tmp_path)
    again = BM25Index("bm25s").load(tmp_path)
    np.testing.assert_array_equal(idx.search(QUERIES, 4).ids, again.search(QUERIES, 4).ids)
    assert not list(tmp_path.glob("*.pkl"))


def test_a_memory_mapped_index_scores_and_filters_as_the_loaded_one(tmp_path):
    BM25Index("bm25s").build(CORPUS).save(tmp_path)
    loaded, mapped = BM25Index("bm25s").load(tmp_path), BM25Index("bm25s", mmap=True).load(tmp_path)
    assert isinstance(mapped.model.scores["data"], np.memmap) and not isinstance(loaded.model.scores["data"], np.memmap)
    for allowed in (None, np.array([0, 2, 8, 9, 11])):
        a, b = loaded.search(QUERIES, 4, allowed), mapped.search(QUERIES, 4, allowed)
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.scores, b.scores)
    assert BM25Index("rank_bm25", mmap=True).mmap is False, "rank_bm25 has no files to map"
    with pytest.raises(RagError, match="retriever.mmap must be true or false, got 'yes'"):
        BM25Index("bm25s", mmap="yes")


def test_a_run_with_mmap_searches_the_mapped_files_it_just_built(tmp_path):
    from rag.run.artifacts import Artifacts
    from rag.store.chunk_set import ChunkSet
    from rag.store.cache import ArtifactCache
    from rag.types import Chunk

    chunks = [Chunk(f"d{i}#0", f"d{i}", t, "notes", 0, len(t), 0) for i, t in enumerate(CORPUS)]
    artifacts = Artifacts(ArtifactCache(tmp_path), ChunkSet("k", chunks))
    built, key = artifacts.bm25(BM25Index("bm25s", mmap=True))
    assert isinstance(built.model.scores["data"], np.memmap), "the built arrays gave way to the saved files"
    plain, same_key = Artifacts(ArtifactCache(tmp_path), ChunkSet("k", chunks)).bm25(BM25Index("bm25s"))
    assert same_key == key, "the same index: mmap is how it is read, not what it is"
    np.testing.assert_array_equal(built.search(QUERIES, 4).ids, plain.search(QUERIES, 4).ids)


def test_bad_backend_and_parameters():
    with pytest.raises(RagError, match="backend"):
        BM25Index("lucene")
    with pytest.raises(RagError, match=r"retriever\.b must be in \[0, 1\], got 1\.5"):
        BM25Index(b=1.5)


def test_index_built_from_token_ids_scores_like_one_built_from_token_strings():
    """build() hands bm25s integer ids (8 bytes a token, not a Python string each); the scores are
    those of bm25s's own string path."""
    import bm25s

    from_strings = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    from_strings.index(tokenize(CORPUS), show_progress=False)
    ours = BM25Index().build(CORPUS).model
    ids, vocab = token_ids(CORPUS)
    assert len(ids) == len(CORPUS) and all(isinstance(i, int) for doc in ids for i in doc)
    for q in tokenize(QUERIES):
        np.testing.assert_allclose(ours.get_scores(q), from_strings.get_scores(q), rtol=1e-6)


def test_a_repeated_filter_reuses_its_mask_and_a_new_one_does_not():
    index = BM25Index().build(CORPUS)
    libc, torch_rows = np.array([0, 1, 2, 5, 6, 8, 9, 11]), np.array([3, 4, 7, 10])
    a = index.search(["weight decay pointer"], 3, allowed=libc)
    mask = index._mask_cache[1]
    index.search(["weight decay pointer"], 3, allowed=libc)
    assert index._mask_cache[1] is mask
    b = index.search(["weight decay pointer"], 3, allowed=torch_rows)
    assert set(a.ids[a.ids >= 0].tolist()) <= set(libc.tolist())
    assert set(b.ids[b.ids >= 0].tolist()) <= set(torch_rows.tolist()) and 10 in b.ids


def test_top_k_takes_the_highest_positive_scores_by_score_then_row():
    scores = np.array([0.0, 2.0, 0.0, 5.0, 2.0, -1.0, 0.0, 3.0], np.float32)
    rows, top = top_k(scores, 3)
    assert rows.tolist() == [3, 7, 1] and top.tolist() == [5.0, 3.0, 2.0]  # tie 1 vs 4: lower row
    rows, _ = top_k(scores, 10)
    assert rows.tolist() == [3, 7, 1, 4]  # zero and negative rows are never hits
    assert len(top_k(np.zeros(5, np.float32), 3)[0]) == 0


@pytest.mark.parametrize("nonzero", [0.03, 0.98])
def test_top_k_agrees_with_a_full_sort_even_with_many_ties(nonzero):
    # rare terms: mostly zero scores; common terms: nearly every row scores, few distinct values
    rng = np.random.default_rng(0)
    values = np.round(rng.random(50_000) * 8) / 4 + 0.25
    scores = np.where(rng.random(50_000) < nonzero, values, 0).astype(np.float32)
    rows, top = top_k(scores, 10)
    expect = np.lexsort((np.arange(len(scores)), -scores))[:10]
    assert rows.tolist() == expect.tolist()
    np.testing.assert_array_equal(top, scores[expect])


def test_bm25s_search_matches_bm25s_own_retrieve():
    """BM25Index uses bm25s's scores with its own top-k selection: same documents, same scores."""
    index = BM25Index("bm25s").build(CORPUS)
    hits = index.search(QUERIES, 3)
    for qi, q in enumerate(QUERIES):
        toks = [t for t in tokenize([q])[0] if t in index.model.vocab_dict]
        res = index.model.retrieve([toks], k=3, show_progress=False, n_threads=0)
        positive = res.scores[0] > 0
        np.testing.assert_allclose(hits.scores[qi][: positive.sum()], res.scores[0][positive], rtol=1e-6)
        assert set(hits.ids[qi][hits.ids[qi] >= 0].tolist()) == set(res.documents[0][positive].tolist())


# --- Streamed build ---------------------------------------------------------------------------------

STREAM_QUERIES = QUERIES + ["lock lock fcntl", "café naïve", "zebra", "weight pointer process memory file"]


def varied_texts(n: int = 300, seed: int = 0) -> list[str]:
    """CORPUS's sentences and random mixtures of their words, with texts of no token at all (empty,
    stopwords only), terms repeated many times, unicode, and identifiers."""
    rng = random.Random(seed)
    words = " ".join(CORPUS).replace(".", "").replace(";", "").replace(",", "").split()
    words += ["O_NONBLOCK", "register_forward_hook", "café", "naïve", "Ünïcödé", "東京", "2024", "x86_64"]
    texts = list(CORPUS) + ["", "the and of a it is", "lock " * 50 + "fcntl", "café naïve 東京 Ünïcödé mmap"]
    while len(texts) < n:
        texts.append(" ".join(rng.choice(words) for _ in range(rng.randint(1, 40))))
    return texts


def batched(texts: list[str], size: int):
    return (texts[i : i + size] for i in range(0, len(texts), size))


def interrupted(batches, after: int):
    """The batches, failing when asked for the one after `after` (as a killed build stops)."""
    for i, texts in enumerate(batches):
        if i == after:
            raise KeyboardInterrupt("killed")
        yield texts


@pytest.fixture(scope="module")
def saved_by_bm25s(tmp_path_factory) -> Path:
    """varied_texts's index built in memory by bm25s and saved: what a streamed build must write."""
    path = tmp_path_factory.mktemp("bm25s")
    BM25Index().build(varied_texts()).save(path)
    return path


def assert_same_files(got: Path, expect: Path) -> None:
    for name in ("data", "indices", "indptr"):
        a, b = np.load(got / f"{name}.csc.index.npy"), np.load(expect / f"{name}.csc.index.npy")
        assert a.dtype == b.dtype, name
        np.testing.assert_array_equal(a, b, err_msg=name)
    for name in ("vocab.index.json", "params.index.json"):
        assert json.loads((got / name).read_text()) == json.loads((expect / name).read_text()), name
    extra = {"max_impact.ragrig.npy"}  # each term's largest score, for MaxScore pruning (bm25s ignores it)
    assert sorted(p.name for p in got.iterdir() if p.name not in extra) == sorted(p.name for p in expect.iterdir())


@pytest.fixture
def tokenized(monkeypatch) -> list[int]:
    """The number of texts tokenized by a streamed build, one entry a batch."""
    counts: list[int] = []
    real = rag.retriever.bm25_build.iter_tokens

    def counting(texts, *args):
        counts.append(len(texts))
        return real(texts, *args)

    monkeypatch.setattr(rag.retriever.bm25_build, "iter_tokens", counting)
    return counts


@pytest.mark.parametrize("batch", [1, 7, 1000])
def test_a_streamed_build_writes_the_files_bm25s_saves_with_the_same_arrays(tmp_path, saved_by_bm25s, batch):
    texts = varied_texts()
    built = write_bm25s_index(batched(texts, batch), tmp_path, k1=1.5, b=0.75, stopwords=True, stem=True)
    assert built == {"n_docs": len(texts), "resumed_docs": 0}
    assert_same_files(tmp_path, saved_by_bm25s)  # the same scores to the bit: same idf, tfc and float order


@pytest.mark.parametrize("mmap", [False, True])
@pytest.mark.parametrize("batch", [1, 7, 1000])
def test_a_streamed_index_searches_like_one_built_in_memory(tmp_path, batch, mmap):
    texts = varied_texts()
    expect = BM25Index().build(texts).search(STREAM_QUERIES, 10)
    streamed = BM25Index(mmap=mmap).build_stream(batched(texts, batch), tmp_path)
    assert isinstance(streamed.model.scores["data"], np.memmap) == mmap and streamed.n_docs == len(texts)
    got = streamed.search(STREAM_QUERIES, 10)
    np.testing.assert_array_equal(got.ids, expect.ids)
    np.testing.assert_allclose(got.scores, expect.scores, rtol=1e-6)
    assert (got.ids[STREAM_QUERIES.index("zebra")] == -1).all()


def test_an_interrupted_build_resumes_after_its_last_recorded_batch(tmp_path, saved_by_bm25s, tokenized):
    texts, work = varied_texts(), tmp_path / "work"
    with pytest.raises(KeyboardInterrupt):
        write_bm25s_index(interrupted(batched(texts, 7), after=5), tmp_path / "out", k1=1.5, b=0.75,
                          stopwords=True, stem=True, work=work)
    assert json.loads((work / "progress.json").read_text())["docs"] == 35
    # A kill in the middle of the next batch leaves rows past the record.
    for name in ("terms.i32", "tfs.i32", "doc_lengths.i32", "vocab.txt"):
        with open(work / name, "ab") as f:
            f.write(b"half a batch")
    tokenized.clear()
    built = write_bm25s_index(batched(texts, 7), tmp_path / "out", k1=1.5, b=0.75, stopwords=True, stem=True, work=work)
    assert built == {"n_docs": len(texts), "resumed_docs": 35}
    assert sum(tokenized) == len(texts) - 35, "the recorded batches are not tokenized again"
    assert_same_files(tmp_path / "out", saved_by_bm25s)
    assert (work / "progress.json").exists(), "the work directory is the caller's to delete"


def test_a_build_killed_by_sigkill_resumes_from_what_it_flushed(tmp_path, saved_by_bm25s, tokenized):
    """A real SIGKILL: nothing buffered in the process survives, only what was flushed."""
    work = tmp_path / "work"
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from rag.retriever.bm25_build import write_bm25s_index\n"
        "from tests.test_bm25 import batched, varied_texts\n"
        "def batches():\n"
        "    for i, texts in enumerate(batched(varied_texts(), 7)):\n"
        "        if i == 9:\n"
        "            os.kill(os.getpid(), signal.SIGKILL)\n"
        "        yield texts\n"
        "write_bm25s_index(batches(), Path(sys.argv[1]), k1=1.5, b=0.75, stopwords=True, stem=True,"
        " work=Path(sys.argv[2]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "out"), str(work)], cwd=PROJECT_ROOT, check=False)
    assert proc.returncode == -9
    texts = varied_texts()
    write_bm25s_index(batched(texts, 7), tmp_path / "out", k1=1.5, b=0.75, stopwords=True, stem=True, work=work)
    assert sum(tokenized) == len(texts) - 63
    assert_same_files(tmp_path / "out", saved_by_bm25s)


@pytest.mark.parametrize("damage", ["garbage", "more than the files hold", "another tokenizer"])
def test_a_damaged_progress_record_starts_pass_1_over(tmp_path, saved_by_bm25s, tokenized, damage):
    texts, work = varied_texts(), tmp_path / "work"
    with pytest.raises(KeyboardInterrupt):
        write_bm25s_index(interrupted(batched(texts, 7), after=5), tmp_path / "out", k1=1.5, b=0.75,
                          stopwords=True, stem=True, work=work)
    record = json.loads((work / "progress.json").read_text())
    if damage == "garbage":
        (work / "progress.json").write_text('{"batches": 5, "docs"')
    else:
        record |= {"postings": record["postings"] + 1} if damage.startswith("more") else {"tokenizer": {}}
        (work / "progress.json").write_text(json.dumps(record))
    tokenized.clear()
    write_bm25s_index(batched(texts, 7), tmp_path / "out", k1=1.5, b=0.75, stopwords=True, stem=True, work=work)
    assert sum(tokenized) == len(texts), "started over"
    assert_same_files(tmp_path / "out", saved_by_bm25s)


def test_resuming_with_other_batches_is_refused(tmp_path):
    texts, work = varied_texts(), tmp_path / "work"
    with pytest.raises(KeyboardInterrupt):
        write_bm25s_index(interrupted(batched(texts, 7), after=5), tmp_path / "out", k1=1.5, b=0.75,
                          stopwords=True, stem=True, work=work)
    with pytest.raises(RagError, match="5 batches of 35 texts in all, but the batches given start with 5 of 50"):
        write_bm25s_index(batched(texts, 10), tmp_path / "out", k1=1.5, b=0.75, stopwords=True, stem=True, work=work)


def test_a_corpus_without_a_token_streams_to_an_index_without_hits(tmp_path):
    index = BM25Index().build_stream(batched(["", "the and of", "a it is"], 2), tmp_path)
    assert index.n_docs == 3 and index.model.scores["data"].shape == (0,)
    assert (index.search(["the fcntl"], 2).ids == -1).all()


def test_a_streamed_build_needs_the_bm25s_backend(tmp_path):
    with pytest.raises(RagError, match="streamed bm25 build writes bm25s's files"):
        BM25Index("rank_bm25").build_stream(batched(CORPUS, 5), tmp_path)


# ---- MaxScore pruning (rag/retriever/maxscore.py) ----------------------------------------------------

@pytest.fixture(scope="module")
def zipf_index():
    from benchmarks.common import zipf_queries, zipf_texts

    texts = list(zipf_texts(20_000, vocab_size=5_000))
    queries = zipf_queries(60, vocab_size=5_000) + [f"{q} {q.split()[0]}" for q in zipf_queries(10, vocab_size=5_000, seed=3)]
    return BM25Index().build(texts), queries


def exhaustive(index, queries, n, allowed=None, monkeypatch=None):
    monkeypatch.setattr(rag.retriever.bm25, "PRUNE_FROM_POSTINGS", 10**12)
    try:
        return index.search(queries, n, allowed)
    finally:
        monkeypatch.setattr(rag.retriever.bm25, "PRUNE_FROM_POSTINGS", 0)


@pytest.mark.parametrize("n", [1, 10, 100])
@pytest.mark.parametrize("filtered", [False, True])
def test_pruned_search_returns_the_exhaustive_top_n_to_the_bit(zipf_index, monkeypatch, n, filtered):
    index, queries = zipf_index
    allowed = np.arange(0, index.n_docs, 3) if filtered else None
    used = []
    real = rag.retriever.maxscore.candidates
    monkeypatch.setattr(rag.retriever.maxscore, "candidates", lambda *a, **k: used.append(real(*a, **k)) or used[-1])
    want = exhaustive(index, queries, n, allowed, monkeypatch)
    got = index.search(queries, n, allowed)
    np.testing.assert_array_equal(got.ids, want.ids)
    np.testing.assert_array_equal(got.scores, want.scores)  # same float32 sums, same order
    assert sum(u is not None for u in used) > len(queries) // 2, "most queries were pruned, not scored whole"


def test_small_queries_are_scored_whole(zipf_index, monkeypatch):
    index, queries = zipf_index
    monkeypatch.setattr(rag.retriever.bm25, "PRUNE_FROM_POSTINGS", 10**12)
    monkeypatch.setattr(rag.retriever.maxscore, "candidates", lambda *a, **k: pytest.fail("pruned below the threshold"))
    index.search(queries[:5], 10)


def test_the_streamed_build_saves_each_terms_largest_score(tmp_path):
    from rag.retriever.maxscore import IMPACTS_FILE

    write_bm25s_index(batched(varied_texts(), 7), tmp_path, k1=1.5, b=0.75, stopwords=True, stem=True)
    data, indptr = np.load(tmp_path / "data.csc.index.npy"), np.load(tmp_path / "indptr.csc.index.npy")
    want = [data[a:b].max() if b > a else 0.0 for a, b in pairwise(indptr)]
    np.testing.assert_array_equal(np.load(tmp_path / IMPACTS_FILE), np.asarray(want, np.float32))
    index = BM25Index(mmap=True).load(tmp_path)
    assert index._impacts is not None and index._impacts.saved is not None
