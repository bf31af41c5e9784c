"""eval/scoring.py's MemoizedEncoder: the evaluation embedder's vectors are encoded once per text
in a process (memory tier) and once per run's texts across processes (the artifact cache), with
the same numbers either way."""
from __future__ import annotations

import numpy as np

from eval.scoring import MemoizedEncoder
from rag.store.cache import ArtifactCache, MemoryTier


class CountingEmbedder:
    id = {"model": "counting", "dim": 4}

    def __init__(self):
        self.calls: list[list[str]] = []

    def encode(self, texts, show_progress=False):
        self.calls.append(list(texts))
        return np.array([[len(t), t.count("a"), 1.0, 0.5] for t in texts], np.float32)


def test_a_new_process_reuses_the_stored_vectors_and_never_calls_the_model(tmp_path):
    store = ArtifactCache(tmp_path)
    first = CountingEmbedder()
    texts = ["alpha", "beta", "alpha", "gamma"]
    a = MemoizedEncoder(first, MemoryTier(), store)(texts)
    assert first.calls == [["alpha", "beta", "gamma"]]  # each text once
    again = CountingEmbedder()  # a new process: an empty memory tier, the same cache
    b = MemoizedEncoder(again, MemoryTier(), store)(texts)
    assert again.calls == [] and np.array_equal(a, b) and b.dtype == np.float32
    other = MemoizedEncoder(again, MemoryTier(), store)(["delta"])  # other texts: encoded
    assert again.calls == [["delta"]] and other.shape == (1, 4)


def test_without_a_store_the_vectors_are_the_same(tmp_path):
    texts = ["one", "two"]
    stored = MemoizedEncoder(CountingEmbedder(), MemoryTier(), ArtifactCache(tmp_path))(texts)
    plain = MemoizedEncoder(CountingEmbedder(), MemoryTier())(texts)
    assert np.array_equal(stored, plain)
