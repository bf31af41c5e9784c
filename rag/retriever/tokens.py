"""What BM25 sees of a text, and what a term weighs: the tokenizer of the index (rag/retriever/bm25.py)
and of its streamed build (bm25_build.py), and Lucene's idf, which both score with."""
from __future__ import annotations

import math
import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

_TOKEN = re.compile(r"[a-z0-9_]+")


@lru_cache(maxsize=1)
def _stopwords() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)


@lru_cache(maxsize=2)
def _stemmer(language: str) -> Any:
    import Stemmer  # PyStemmer: the Snowball stemmers, in C

    return Stemmer.Stemmer(language)


def iter_tokens(texts: list[str], stopwords: bool = True, stem: bool = True) -> Iterator[list[str]]:
    """Lowercase word tokens per text (identifiers such as O_NONBLOCK or register_forward_hook stay
    whole), English stopwords removed, Snowball-stemmed."""
    stop = _stopwords() if stopwords else frozenset()
    stemmer = _stemmer("english") if stem else None
    for text in texts:
        toks = [t for t in _TOKEN.findall(text.lower()) if t not in stop]
        yield stemmer.stemWords(toks) if stemmer else toks


def tokenize(texts: list[str], stopwords: bool = True, stem: bool = True) -> list[list[str]]:
    return list(iter_tokens(texts, stopwords, stem))


def token_ids(texts: list[str], stopwords: bool = True, stem: bool = True) -> tuple[list[list[int]], dict[str, int]]:
    """The corpus as token ids plus the vocabulary, one text at a time. Holding every token of a
    large corpus as a Python string costs ~60 bytes a token (3.2 GB transient at 1M chunks, for an
    index that keeps 0.9 GB); an id list entry points at the vocabulary's own int, 8 bytes. It
    also spares bm25s its own pass that maps strings to ids."""
    vocab: dict[str, int] = {}
    ids = [[vocab.setdefault(t, len(vocab)) for t in toks] for toks in iter_tokens(texts, stopwords, stem)]
    return ids, vocab


def lucene_idf(n_docs: int, df: float) -> float:
    return math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))
