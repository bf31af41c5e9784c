"""BM25: both backends rank alike on the same tokens, filters apply, bm25s persists."""
import numpy as np
import pytest

from rag.bm25 import BM25Index, token_ids, tokenize, top_k
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
    with pytest.raises(RagError, match="retriever mmap must be true or false, got 'yes'"):
        BM25Index("bm25s", mmap="yes")


def test_a_run_with_mmap_searches_the_mapped_files_it_just_built(tmp_path):
    from rag.artifacts import Artifacts, ChunkSet
    from rag.cache import ArtifactCache
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
    with pytest.raises(RagError, match="b="):
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
