"""BM25 lexical search with two interchangeable backends.

- `bm25s` (default): sparse precomputed scores, milliseconds a query at a million chunks.
- `rank_bm25`: the reference pure-Python implementation, kept to cross-check bm25s.

Both see the same tokens (`tokenize`) and the same scoring function, Lucene's BM25 (idf =
ln(1 + (N - df + 0.5) / (df + 0.5)), which never goes negative), so they rank alike; a test holds
them to it. rank_bm25's BM25Okapi uses Robertson's idf with an epsilon floor instead, so its idf
is overridden below.
"""
from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from rag.types import Hits, RagError

log = logging.getLogger(__name__)

_TOKEN = re.compile(r"[a-z0-9_]+")
BACKENDS = ("bm25s", "rank_bm25")


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


def _lucene_idf(n_docs: int, df: float) -> float:
    return math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))


def _rank_bm25_lucene(corpus_tokens: list[list[str]], k1: float, b: float) -> Any:
    from rank_bm25 import BM25Okapi

    class LuceneBM25Okapi(BM25Okapi):
        def _calc_idf(self, nd: dict[str, int]) -> None:
            self.idf = {word: _lucene_idf(self.corpus_size, freq) for word, freq in nd.items()}
            self.average_idf = sum(self.idf.values()) / max(1, len(self.idf))

    return LuceneBM25Okapi(corpus_tokens, k1=k1, b=b)


def top_k(scores: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the n highest positive scores, by score then row (ties at the cut go to the lowest
    rows, so results are deterministic), and their scores. Zero rows (chunks with none of the
    query's terms) are never hits.

    Written here rather than left to bm25s.retrieve, whose selection is `np.argpartition(scores,
    -k)` over every chunk. numpy's introselect is pathological on BM25 scores, which are mostly 0
    for rare terms and take few distinct values for common ones. Measured at 1M chunks, k=10:
    5 % nonzero, 208 ms (bm25s) vs 1.8 ms (argpartition among the nonzero rows); 98 % nonzero
    with ties, 13.5 ms (either argpartition) vs 3.5 ms (torch.topk, which finds the cut value;
    torch is already a dependency through sentence-transformers)."""
    positive = scores > 0
    if np.count_nonzero(positive) < max(n + 1, len(scores) // 4):
        rows = np.flatnonzero(positive)
        if len(rows) > n:
            rows = rows[_top_unordered(scores[rows], n)]
    else:
        rows = _top_unordered(scores, n)
    rows = rows[np.lexsort((rows, -scores[rows]))]
    return rows, scores[rows]


def _top_unordered(values: np.ndarray, n: int) -> np.ndarray:
    """Indices of the n largest values (ties at the cut: lowest indices first), unordered."""
    import torch

    cut = float(torch.topk(torch.from_numpy(np.ascontiguousarray(values)), n, sorted=False).values.min())
    above = np.flatnonzero(values > cut)
    return np.concatenate([above, np.flatnonzero(values == cut)[: n - len(above)]])


class BM25Index:
    def __init__(self, backend: str = "bm25s", k1: float = 1.5, b: float = 0.75, stopwords: bool = True, stem: bool = True,
                 mmap: bool = False):
        """`mmap`: a saved bm25s index is memory-mapped rather than read into memory (the score
        postings of a 10M-chunk corpus are GBs; the page cache holds what queries touch)."""
        if backend not in BACKENDS:
            raise RagError(f"retriever bm25 backend must be one of {BACKENDS}, got {backend!r}")
        if not k1 > 0 or not 0 <= b <= 1:
            raise RagError(f"bm25 parameters out of range: k1={k1} (> 0), b={b} (in [0, 1])")
        self.backend, self.k1, self.b = backend, float(k1), float(b)
        self.stopwords, self.stem = bool(stopwords), bool(stem)
        if not isinstance(mmap, bool):
            raise RagError(f"retriever mmap must be true or false, got {mmap!r}")
        self.mmap = mmap and backend == "bm25s"
        self.model: Any = None
        self.n_docs = 0
        self._mask_cache: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def params(self) -> dict[str, Any]:
        return {"backend": self.backend, "k1": self.k1, "b": self.b, "stopwords": self.stopwords,
                "stem": self.stem, "idf": "lucene"}

    @property
    def persistent(self) -> bool:
        """bm25s saves to .npy/.json files; rank_bm25 has no file format (it is rebuilt in memory)."""
        return self.backend == "bm25s"

    def _tok(self, texts: list[str]) -> list[list[str]]:
        return tokenize(texts, self.stopwords, self.stem)

    def build(self, texts: list[str]) -> "BM25Index":
        self.n_docs = len(texts)
        self._mask_cache = None
        if self.backend == "bm25s":
            import bm25s

            self.model = bm25s.BM25(k1=self.k1, b=self.b, method="lucene")
            self.model.index(token_ids(texts, self.stopwords, self.stem), show_progress=False)
        else:
            self.model = _rank_bm25_lucene(self._tok(texts), self.k1, self.b)
        return self

    def save(self, directory: Path) -> None:
        self.model.save(str(directory), show_progress=False)

    def load(self, directory: Path) -> "BM25Index":
        import bm25s

        self.model = bm25s.BM25.load(str(directory), mmap=self.mmap, allow_pickle=False)
        self._mask_cache = None
        self.n_docs = int(self.model.scores["num_docs"])
        return self

    def search(self, queries: list[str], n: int, allowed: np.ndarray | None = None) -> Hits:
        """Top-n chunk rows per query. Rows scoring 0 (no query term) are left out: they carry
        no lexical evidence, and rank-based fusion would otherwise credit them."""
        n = max(1, min(n, self.n_docs))
        mask = None if allowed is None else self._mask(allowed)
        q_tokens = self._tok(queries)
        ids = np.full((len(q_tokens), n), -1, np.int64)
        scores = np.full((len(q_tokens), n), -np.inf, np.float32)
        for qi, toks in enumerate(q_tokens):
            s = self._scores(toks, mask)
            if s is not None:
                rows, top = top_k(s, n)
                ids[qi, : len(rows)], scores[qi, : len(rows)] = rows, top
        return Hits(ids, scores)

    def _mask(self, allowed: np.ndarray) -> np.ndarray:
        # Same filter rows (ChunkSet.rows_of_sources returns one array per filter), same mask:
        # built once, not once per question (4 MB of writes a question at 1M chunks).
        cached = self._mask_cache
        if cached is not None and cached[0] is allowed:
            return cached[1]
        mask = np.zeros(self.n_docs, np.float32)
        mask[np.asarray(allowed, np.int64)] = 1.0
        self._mask_cache = (allowed, mask)
        return mask

    def _scores(self, toks: list[str], mask: np.ndarray | None) -> np.ndarray | None:
        """Every chunk's score for one query (0 where the mask excludes it); None when no query
        token is in the vocabulary (bm25s rejects such a query; it simply has no lexical hits).
        The top-n selection is top_k's for both backends, not bm25s.retrieve's: see top_k."""
        if self.backend == "bm25s":
            known = [t for t in toks if t in self.model.vocab_dict]
            return self.model.get_scores(known, weight_mask=mask) if known else None
        s = np.asarray(self.model.get_scores(toks), np.float32)
        return s if mask is None else s * mask
