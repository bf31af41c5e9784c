"""The cross-encoder's backend chosen by measurement (`reranker.backend: auto`,
rag/reranker/backend_choice.py): fp32 unless a candidate that keeps fp32's top 5 is faster by the
margin, the probe measured once per machine and model, and fp32 taken without measuring when its
scores are already recorded (the demo's seed)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rag.store.cache import ArtifactCache
from rag.embedder.backend_choice import ONNX_FP32, REFERENCE, TORCH_BF16
from rag.reranker import backend_choice
from rag.reranker.backend_choice import MIN_OVERLAP, Measured, choose, explain, measure, probe_pairs
from rag.embedder.probe import PROBE_FILE
from rag.reranker.cross_encoder import PROBE_KIND, CrossEncoderReranker
from rag.types import Chunk, Hits, RagError


def test_fp32_stays_unless_an_order_keeping_candidate_is_clearly_faster():
    fp32 = Measured(REFERENCE, 40.0, 1.0, 0.0)
    bf16_unfaithful = Measured(TORCH_BF16, 75.0, 0.93, 0.05)
    onnx_slightly = Measured(ONNX_FP32, 41.0, 1.0, 6e-6)
    onnx_faster = Measured(ONNX_FP32, 50.0, 1.0, 6e-6)
    assert choose([fp32, bf16_unfaithful, onnx_slightly]) == fp32, "bf16 loses the order; onnx is within the margin"
    assert choose([fp32, bf16_unfaithful, onnx_faster]) == onnx_faster
    assert choose([fp32, Measured(TORCH_BF16, 75.0, MIN_OVERLAP, 0.01), onnx_faster]).candidate == TORCH_BF16
    with pytest.raises(ValueError, match="without torch fp32"):
        choose([onnx_faster])
    said = explain(fp32, [fp32, bf16_unfaithful, onnx_slightly], "avx512_bf16", "2026-11-28")
    assert said == (": no eligible candidate was 5% faster (torch bf16 1.88x but top-5 overlap 0.93 (needs 0.98); "
                    "onnx fp32 1.02x), probe 2026-11-28")
    assert explain(onnx_faster, [fp32, onnx_faster], None, "2026-11-28") == (
        ", 1.25x torch fp32 (top-5 overlap 1.00, logits within 6e-06), probe 2026-11-28")
    assert Measured.from_json("torch bf16", bf16_unfaithful.to_json()) == bf16_unfaithful


def test_the_probe_scores_every_pool_with_every_candidate_and_counts_the_top_5_it_keeps():
    passages = [f"passage {i}" for i in range(30)]
    pools = probe_pairs(passages, ["q0", "q1", "q2"], pool=10)
    assert [len(p) for p in pools] == [10, 10, 10]
    assert pools[1][0] == ("q1", "passage 2"), "each pool starts at its question's own abstract's passages"
    assert probe_pairs(passages[:5], ["q9"], pool=10) == [[("q9", f"passage {i}") for i in range(5)]]

    def exact(pairs):
        return np.array([-float(p.split()[1]) for _, p in pairs])

    def swaps_4_and_5(pairs):  # the 5th and 6th of each pool trade places
        s = exact(pairs)
        if len(s) > 5:
            s[4], s[5] = s[5], s[4]
        return s

    got = {m.candidate: m for m in measure({REFERENCE: exact, ONNX_FP32: exact, TORCH_BF16: swaps_4_and_5}, pools,
                                           rounds=2, speed_questions=1)}
    assert got[REFERENCE].overlap == got[ONNX_FP32].overlap == 1.0 and got[ONNX_FP32].max_diff == 0.0
    assert got[TORCH_BF16].overlap == pytest.approx(0.8) and got[TORCH_BF16].max_diff == 1.0
    assert all(m.rate > 0 for m in got.values())
    with pytest.raises(ValueError, match="torch fp32"):
        measure({ONNX_FP32: exact}, pools)


@pytest.fixture(scope="module")
def shipped_model(tmp_path_factory) -> Path:
    from rag.reranker.training.shipped import restore, shipped_manifest

    m = shipped_manifest()
    out = tmp_path_factory.mktemp("shipped") / "model"
    out.mkdir()
    assert restore(m["key"], m["base_model"], out)
    return out


def _chunks(n: int) -> list[Chunk]:
    texts = [f"The file descriptor {i} is duplicated by dup() into the lowest free slot." for i in range(n)]
    return [Chunk(f"d{i}#0", f"d{i}", t, "libc", 0, len(t), 0) for i, t in enumerate(texts)]


def test_auto_measures_once_per_machine_and_model_and_says_what_it_chose(shipped_model, tmp_path, monkeypatch):
    monkeypatch.setattr(backend_choice, "QUESTIONS", 2)
    monkeypatch.setattr(backend_choice, "POOL", 6)
    cache = ArtifactCache(tmp_path / "cache")
    r = CrossEncoderReranker(model=str(shipped_model), max_length=160, label_passages=False, backend="auto",
                             precision="auto")
    r.use_cache(cache)
    r.warm_up()
    assert r.backend_note is None, "warm_up loads the model but leaves the choice to the first scoring"
    hits = Hits.from_rows([[(i, 1.0 - i / 10) for i in range(6)]], 6)
    r.rerank(["How do I duplicate a file descriptor?"], hits, _chunks(6), k=3)
    note = r.backend_note
    assert note is not None and note["line"].startswith(f"{note['backend']} {note['precision']}")
    assert set(note["probe"]["candidates"]) >= {"torch fp32"} and note["probe"]["pairs"] == 12
    (probe_dir,) = [p for p in (tmp_path / "cache" / PROBE_KIND).iterdir() if p.is_dir()]
    recorded = json.loads((probe_dir / PROBE_FILE).read_text())
    assert recorded["candidates"] == note["probe"]["candidates"]

    again = CrossEncoderReranker(model=str(shipped_model), max_length=160, label_passages=False, backend="auto",
                                 precision="auto")
    again.use_cache(cache)
    monkeypatch.setattr(backend_choice, "measure", lambda *a, **k: pytest.fail("measured twice"))
    again.rerank(["What does fcntl do?"], hits, _chunks(6), k=3)
    assert again.backend_note == note, "the second reranker reads the recorded probe"


def test_auto_takes_fp32_without_measuring_when_its_scores_are_recorded(shipped_model, tmp_path, monkeypatch):
    cache = ArtifactCache(tmp_path / "cache")
    hits = Hits.from_rows([[(i, 1.0 - i / 10) for i in range(6)]], 6)
    query = ["How do I duplicate a file descriptor?"]
    pinned = CrossEncoderReranker(model=str(shipped_model), max_length=160, label_passages=False, backend="torch",
                                  precision="fp32")
    pinned.use_cache(cache)
    want = pinned.rerank(query, hits, _chunks(6), k=3)
    assert pinned.backend_note["line"] == "torch fp32 (pinned: backend=torch, precision=fp32)"

    monkeypatch.setattr(backend_choice, "measure", lambda *a, **k: pytest.fail("measured though fp32's scores were there"))
    auto = CrossEncoderReranker(model=str(shipped_model), max_length=160, label_passages=False, backend="auto",
                                precision="auto")
    auto.use_cache(cache)
    got = auto.rerank(query, hits, _chunks(6), k=3)
    assert auto.backend_note["line"] == "torch fp32: its scores of these candidates were already recorded (nothing measured)"
    assert np.array_equal(got.ids, want.ids)
    assert auto._identity == pinned._identity, "the same recorded scores"


def test_settings_that_leave_out_fp32_run_their_first_candidate_without_a_probe(shipped_model, tmp_path, monkeypatch):
    """precision=bf16 under backend=auto: the probe has no torch fp32 to hold a candidate against, so
    the first bf16 candidate (torch autocast, where the CPU computes bf16) runs, as a pin would."""
    from rag.embedder.backend_choice import cpu_flags, native_bf16

    if native_bf16(cpu_flags()) is None:
        pytest.skip("this CPU computes no bf16 natively")
    monkeypatch.setattr(backend_choice, "measure", lambda *a, **k: pytest.fail("measured without fp32"))
    r = CrossEncoderReranker(model=str(shipped_model), max_length=160, label_passages=False, backend="auto",
                             precision="bf16")
    r.use_cache(ArtifactCache(tmp_path / "cache"))
    r.rerank(["How do I duplicate a file descriptor?"], Hits.from_rows([[(i, 1.0) for i in range(4)]], 4), _chunks(4), k=2)
    assert r.backend_note["line"].startswith(f"{TORCH_BF16.name} (precision=bf16: the first candidate")


def test_openvino_takes_a_precision_of_its_own(shipped_model):
    with pytest.raises(RagError, match="reranker.backend=openvino runs one precision"):
        CrossEncoderReranker(model=str(shipped_model), backend="openvino", precision="auto")
