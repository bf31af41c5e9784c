"""Both fusions against hand-computed examples."""
import numpy as np
import pytest

from rag.retriever.fusion import RRFFusion, WeightedFusion
from rag.types import Hits, RagError

DENSE = Hits.from_rows([[(10, 0.9), (11, 0.8), (12, 0.5)]], 3)
LEXICAL = Hits.from_rows([[(12, 7.0), (13, 4.0), (10, 1.0)]], 3)


def test_rrf_hand_computed():
    fused = RRFFusion(k=60)([DENSE, LEXICAL], 4)
    expected = {
        10: 1 / 61 + 1 / 63,
        12: 1 / 63 + 1 / 61,
        11: 1 / 62,
        13: 1 / 62,
    }
    assert fused.ids[0].tolist() == [10, 12, 11, 13]  # equal scores break by chunk row
    for row, score in fused.row(0):
        assert score == pytest.approx(expected[row], rel=1e-6)


def test_rrf_k_zero_is_plain_reciprocal_rank():
    fused = RRFFusion(k=0)([DENSE], 3)
    np.testing.assert_allclose(fused.scores[0], [1.0, 1 / 2, 1 / 3], rtol=1e-6)


def test_weighted_hand_computed():
    # dense min-max: 10 -> 1, 11 -> 0.75, 12 -> 0 ; lexical: 12 -> 1, 13 -> 0.5, 10 -> 0
    fused = WeightedFusion(alpha=0.7)([DENSE, LEXICAL], 4)
    expected = {10: 0.7, 11: 0.525, 12: 0.3, 13: 0.15}
    assert fused.ids[0].tolist() == [10, 11, 12, 13]
    for row, score in fused.row(0):
        assert score == pytest.approx(expected[row], abs=1e-6)


@pytest.mark.parametrize("alpha,first", [(1.0, 10), (0.0, 12)])
def test_weighted_extremes_follow_one_retriever(alpha, first):
    assert WeightedFusion(alpha=alpha)([DENSE, LEXICAL], 4).ids[0, 0] == first


def test_weighted_handles_an_empty_list_and_a_single_candidate():
    empty = Hits.empty(1, 3)
    single = Hits.from_rows([[(5, 2.0)]], 3)
    fused = WeightedFusion(alpha=0.5)([empty, single], 3)
    assert fused.row(0) == [(5, 0.5)]


def test_fusion_truncates_to_n_and_pads():
    fused = RRFFusion()([DENSE, LEXICAL], 2)
    assert fused.width == 2
    padded = RRFFusion()([DENSE], 5)
    assert padded.ids[0, 3:].tolist() == [-1, -1]


def test_alpha_outside_unit_interval_is_rejected():
    with pytest.raises(RagError, match="fusion.alpha"):
        WeightedFusion(alpha=1.5)
