"""The worked example's own test: what a component's test in tests/ looks like."""
from __future__ import annotations

import pytest
from word_overlap import WordOverlapReranker

from rag.types import Chunk, Hits, RagError


def chunk(i: int, text: str) -> Chunk:
    return Chunk(id=f"d{i}#0", doc_id=f"d{i}", text=text, source="toy", start=0, end=len(text), position=0)


CHUNKS = [chunk(0, "Bread needs salt."), chunk(1, "Check the tyre pressure weekly."), chunk(2, "Tyre levers.")]


def test_the_chunk_sharing_most_question_words_comes_first():
    hits = Hits.from_rows([[(0, 0.9), (2, 0.8), (1, 0.7)]], 3)
    top = WordOverlapReranker().rerank(["How often should I check tyre pressure?"], hits, CHUNKS, k=2)
    assert top.row(0) == [(1, 3.0), (2, 1.0)]


def test_ties_keep_the_first_stage_order():
    hits = Hits.from_rows([[(2, 0.9), (0, 0.8)]], 2)
    assert [r for r, _ in WordOverlapReranker().rerank(["unrelated words"], hits, CHUNKS, k=2).row(0)] == [2, 0]


def test_a_non_positive_top_n_is_one_line():
    with pytest.raises(RagError, match="reranker.top_n must be positive, got 0"):
        WordOverlapReranker(top_n=0)
