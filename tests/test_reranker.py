"""Reranker orderings on constructed cases (no model needed)."""
import numpy as np
import pytest

from rag.reranker import NoReranker
from rag.reranker.diversity import DiversityReranker
from rag.reranker.mmr import MMRReranker, mmr_order
from rag.types import Document, Hits, RagError, make_chunk

DOCS = [Document(f"d{i}", "x" * 40, "s") for i in range(3)]
# rows 0-2: doc d0, rows 3-4: doc d1, row 5: doc d2
CHUNKS = [make_chunk(DOCS[0], i * 10, i * 10 + 8, i) for i in range(3)] + \
         [make_chunk(DOCS[1], i * 10, i * 10 + 8, i) for i in range(2)] + [make_chunk(DOCS[2], 0, 8, 0)]
FUSED = Hits.from_rows([[(0, 0.9), (1, 0.8), (2, 0.7), (3, 0.6), (4, 0.5), (5, 0.4)]], 6)


def test_none_keeps_the_top_k():
    assert NoReranker().rerank(["q"], FUSED, CHUNKS, 3).ids.tolist() == [[0, 1, 2]]


def test_diversity_round_robins_over_documents():
    out = DiversityReranker(top_n=6).rerank(["q"], FUSED, CHUNKS, 5)
    assert out.ids.tolist() == [[0, 3, 5, 1, 4]]
    assert np.all(np.diff(out.scores[0]) < 0)


def test_diversity_sees_only_top_n():
    out = DiversityReranker(top_n=3).rerank(["q"], FUSED, CHUNKS, 3)
    assert out.ids.tolist() == [[0, 1, 2]]


def test_fewer_candidates_than_k_leaves_empty_slots():
    short = Hits.from_rows([[(3, 1.0)]], 6)
    out = DiversityReranker(top_n=6).rerank(["q"], short, CHUNKS, 3)
    assert out.ids.tolist() == [[3, -1, -1]]


def test_mmr_trades_relevance_for_novelty():
    # candidates 0 and 1 are near-duplicates and the most relevant; 2 is less relevant but new
    vecs = np.array([[1.0, 0.0, 0.0], [0.995, 0.0998, 0.0], [0.0, 0.0, 1.0]])
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    query = np.array([0.8, 0.0, 0.6])  # relevance 0.8, 0.796, 0.6
    relevance, pairwise = vecs @ query, vecs @ vecs.T
    assert [r for r, _ in mmr_order(relevance, pairwise, 1.0, 3, [10, 11, 12])] == [10, 11, 12]
    assert [r for r, _ in mmr_order(relevance, pairwise, 0.5, 3, [10, 11, 12])] == [10, 12, 11]


class FakeEmbedder:
    """Maps each text to a fixed vector, so MMR can be tested end to end without a model."""

    def __init__(self, table):
        self.table = table

    def encode(self, texts, show_progress=False):
        return np.array([self.table[t] for t in texts], np.float32)

    def encode_queries(self, queries):
        return self.encode(queries)


def test_mmr_reranker_without_cached_vectors_encodes_candidates():
    docs = [Document(f"e{i}", t, "s") for i, t in enumerate(["alpha", "alpha2", "beta"])]
    chunks = [make_chunk(d, 0, len(d.text), 0) for d in docs]
    # relevance: alpha 0.8, alpha2 0.856, beta 0.6; alpha and alpha2 are near-duplicates
    emb = FakeEmbedder({"q": [0.8, 0.6], "alpha": [1, 0], "alpha2": [0.995, 0.0998], "beta": [0, 1]})
    hits = Hits.from_rows([[(0, 3.0), (1, 2.0), (2, 1.0)]], 3)
    assert MMRReranker(emb, lambda_mult=0.5, top_n=3).rerank(["q"], hits, chunks, 2).ids.tolist() == [[1, 2]]


def test_bad_settings():
    with pytest.raises(RagError, match="lambda_mult"):
        MMRReranker(None, lambda_mult=2)
    with pytest.raises(RagError, match="top_n"):
        DiversityReranker(top_n=0)
