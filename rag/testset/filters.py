"""The checks a generated question must pass, each a number a user can read and a threshold in
`testset.filters` (the passage checks, length and prose share, are in rag/testset/passages.py).

- copied words: the longest run of words the question shares verbatim with its passage(s)
  (lowercased word tokens); above `max_copied_words` the question copies the text.
- word overlap: the share of the question's content words (words but BM25's stopwords and the
  function words below, stemmed as BM25 stems them) found in its passage(s). Below `min_word_overlap` the question is not about the passage
  (a small model writes "What is the answer to this question?"); above `max_word_overlap` it is
  made of the passage's own words only (off at 1.0: set it lower to keep questions that a lexical
  search cannot answer by word matching alone).
- answer support: the share of the answer's content words found in its passage(s); below
  `min_answer_support` the answer says things the passage does not (the generator's no-answer
  reply counts 0).
- round trip (`round_trip_k` > 0): BM25 over every passage of the documents must rank a passage of
  the question's document in its top k. It keeps the questions a first stage finds: a set filtered
  this way is biased toward easy, lexical questions, and scores retrievers that match words (BM25
  itself most) higher than they deserve.
- duplicates: a question whose eval.embedder cosine to an earlier kept question is at least
  `max_duplicate_cosine` is dropped.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from rag.retriever.tokens import tokenize

_WORD = re.compile(r"[a-z0-9_]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


# Function words of questions and answers, besides BM25's stopwords (rag/retriever/tokens.py: 33
# words, no question word): content words are what is left, stemmed as BM25 stems them.
FUNCTION_WORDS = frozenset("""
    what which who whom whose when where why how do does did done doing can could should would may might
    must shall i me my mine we us our you your he him his she her its them theirs one ones about from have
    has had having been being were am so than too very any some all each both other others own same only
    just also here there up down out over under again further once more most much many few what's
    s t don doesn didn isn aren wasn weren can't won't i'm it's get gets got use used using
""".split())


def content_words(text: str) -> set[str]:
    kept = " ".join(w for w in words(text) if w not in FUNCTION_WORDS)
    return set(tokenize([kept])[0])


def copied_words(question: str, passage: str) -> int:
    """The longest run of consecutive words of the question found in the passage, in words."""
    q, p = words(question), words(passage)
    best = 0
    run = [0] * (len(p) + 1)
    for a in q:
        prev = 0
        for j, b in enumerate(p, 1):
            cur = run[j]
            run[j] = prev + 1 if a == b else 0
            best = max(best, run[j])
            prev = cur
    return best


def word_overlap(question: str, passage: str) -> float:
    """The share of the question's content words found in the passage (0 for a question with none)."""
    q = content_words(question)
    return len(q & content_words(passage)) / len(q) if q else 0.0


def answer_support(answer: str, passage: str, no_answer: str | None = None) -> float:
    """The share of the answer's content words found in the passage; 0 for the no-answer reply or
    an answer with no content word."""
    if no_answer and " ".join(answer.split()).strip().lower() == " ".join(no_answer.split()).strip().lower():
        return 0.0
    a = content_words(answer)
    return len(a & content_words(passage)) / len(a) if a else 0.0


def round_trip_ranks(questions: Sequence[str], doc_ids: Sequence[str], texts: Sequence[str],
                     text_docs: Sequence[str], k: int) -> list[int | None]:
    """Per question, the rank (1-based) of the first passage of its document in BM25's top k over
    `texts` (the passages of documents `text_docs`), or None when none is there."""
    from rag.retriever.bm25 import BM25Index

    if not questions:
        return []
    hits = BM25Index(backend="bm25s").build(list(texts)).search(list(questions), k)
    ranks: list[int | None] = []
    for i, doc in enumerate(doc_ids):
        found = [rank for rank, row in enumerate(hits.ids[i], 1) if row >= 0 and text_docs[int(row)] == doc]
        ranks.append(found[0] if found else None)
    return ranks


def duplicates(vectors: np.ndarray, max_cosine: float) -> tuple[list[bool], list[float]]:
    """Per question (in order), whether it is kept and its highest cosine to an earlier kept one
    (normalized vectors). A question is dropped at `max_cosine` or above."""
    kept: list[int] = []
    keep: list[bool] = []
    highest: list[float] = []
    for i in range(len(vectors)):
        cos = float(np.max(vectors[kept] @ vectors[i])) if kept else 0.0
        highest.append(round(cos, 4))
        keep.append(cos < max_cosine)
        if keep[-1]:
            kept.append(i)
    return keep, highest
