"""Every metric against hand-computed values."""
import numpy as np
import pytest

from eval import metrics as M
from eval.stats import bootstrap_ci


def test_cosine_hand_computed():
    assert M.cosine(np.array([1.0, 0.0]), np.array([1.0, 1.0])) == pytest.approx(1 / np.sqrt(2))
    np.testing.assert_allclose(M.cosine(np.array([[3.0, 4.0], [1.0, 0.0]]), np.array([[3.0, 4.0], [0.0, 2.0]])), [1.0, 0.0])
    assert M.cosine(np.zeros(2), np.ones(2)) == 0.0


SIMS = np.array([
    [0.20, 0.80, 0.90],   # first relevant at rank 2, two relevant
    [0.10, 0.30, 0.74],   # nothing reaches 0.75
    [0.76, 0.10, -1.0],   # relevant at rank 1; third slot empty
])
VALID = np.array([[True, True, True], [True, True, True], [True, True, False]])


def test_relevance_uses_tau_inclusively_and_ignores_empty_slots():
    rel = M.relevant_by_similarity(np.array([[0.75, 0.9]]), np.array([[True, False]]), 0.75)
    assert rel.tolist() == [[True, False]]


def test_recall_mrr_precision_hand_computed():
    rel = M.relevant_by_similarity(SIMS, VALID, 0.75)
    assert M.recall_at_k(rel).tolist() == [1.0, 0.0, 1.0]
    assert M.reciprocal_rank(rel).tolist() == [0.5, 0.0, 1.0]
    np.testing.assert_allclose(M.precision_at_k(rel, 3), [2 / 3, 0.0, 1 / 3])


def test_id_based_relevance():
    rel = M.relevant_by_id([["a", "b", "a"], ["c", None, None], ["x"]], ["a", "b", None])
    assert rel.tolist() == [[True, False, True], [False, False, False], [False, False, False]]
    assert M.reciprocal_rank(rel).tolist() == [1.0, 0.0, 0.0]


def test_answer_metrics_hand_computed():
    e_truth = np.array([[1.0, 0.0], [0.0, 1.0]])
    e_answer = np.array([[1.0, 1.0], [1.0, 0.0]])
    e_context = np.array([[1.0, 1.0], [1.0, 0.1]])
    agt = M.answer_gt_similarity(e_answer, e_truth)
    grd = M.grounding(e_answer, e_context)
    np.testing.assert_allclose(agt, [1 / np.sqrt(2), 0.0])
    np.testing.assert_allclose(grd, [1.0, 1 / np.sqrt(1.01)])
    # answer 1 is off the truth but grounded in its context: not a hallucination
    assert M.hallucination(agt, grd, 0.5).tolist() == [0.0, 0.0]
    assert M.hallucination(agt, np.array([0.2, 0.4]), 0.5).tolist() == [0.0, 1.0]


def test_bootstrap_ci_covers_known_mean():
    rng = np.random.default_rng(3)
    v = rng.normal(loc=0.6, scale=0.1, size=400)
    lo, hi = bootstrap_ci(v, n_resamples=2000, seed=1)
    assert lo < 0.6 < hi
    assert hi - lo == pytest.approx(2 * 1.96 * 0.1 / np.sqrt(400), rel=0.2)


def test_bootstrap_ci_is_deterministic_and_handles_tiny_inputs():
    v = np.array([0.0, 1.0, 1.0, 0.0, 1.0])
    assert bootstrap_ci(v, 500, seed=7) == bootstrap_ci(v, 500, seed=7)
    assert bootstrap_ci(np.array([0.3]), 100) == (0.3, 0.3)
    lo, hi = bootstrap_ci(np.array([]), 100)
    assert np.isnan(lo) and np.isnan(hi)
