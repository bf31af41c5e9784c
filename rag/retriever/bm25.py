"""BM25 lexical search with two interchangeable backends.

- `bm25s` (default): sparse precomputed scores, milliseconds a query at a million chunks.
- `rank_bm25`: the reference pure-Python implementation, kept to cross-check bm25s.

Both see the same tokens (`tokenize`) and the same scoring function, Lucene's BM25 (idf =
ln(1 + (N - df + 0.5) / (df + 0.5)), which never goes negative), so they rank alike; a test holds
them to it. rank_bm25's BM25Okapi uses Robertson's idf with an epsilon floor instead, so its idf
is overridden below.

The tokenizer and the idf are rag/retriever/tokens.py's; `build_stream` writes the bm25s index
from batches of texts in bounded memory (rag/retriever/bm25_build.py).
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from rag.retriever import maxscore
from rag.retriever.bm25_build import write_bm25s_index
from rag.retriever.maxscore import MaxImpacts
from rag.retriever.tokens import lucene_idf, token_ids, tokenize
from rag.config.schema import Fraction, Positive, checked
from rag.types import Hits, RagError

# A query whose posting lists hold fewer postings is scored exhaustively (milliseconds; the
# corpora of the shipped slices never reach it); past it, MaxScore pruning finds the same top n.
PRUNE_FROM_POSTINGS = 200_000
BACKENDS = ("bm25s", "rank_bm25")


def _rank_bm25_lucene(corpus_tokens: list[list[str]], k1: float, b: float) -> Any:
    from rank_bm25 import BM25Okapi

    class LuceneBM25Okapi(BM25Okapi):
        def _calc_idf(self, nd: dict[str, int]) -> None:
            self.idf = {word: lucene_idf(self.corpus_size, freq) for word, freq in nd.items()}
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
    @checked("retriever")
    def __init__(self, backend: str = "bm25s", k1: Positive = 1.5, b: Fraction = 0.75, stopwords: bool = True,
                 stem: bool = True, mmap: bool = False):
        """`mmap`: a saved bm25s index is memory-mapped rather than read into memory (the score
        postings of a 10M-chunk corpus are GBs; the page cache holds what queries touch)."""
        if backend not in BACKENDS:
            raise RagError(f"retriever bm25 backend must be one of {BACKENDS}, got {backend!r}")
        self.backend, self.k1, self.b = backend, float(k1), float(b)
        self.stopwords, self.stem = bool(stopwords), bool(stem)
        self.mmap = mmap and backend == "bm25s"
        self.model: Any = None
        self._impacts: MaxImpacts | None = None
        self.built: dict[str, int] = {}  # build_stream's counts (documents, and those resumed)
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

    def build(self, texts: list[str]) -> BM25Index:
        self.n_docs = len(texts)
        self._mask_cache = None
        self._impacts = None
        if self.backend == "bm25s":
            import bm25s

            self.model = bm25s.BM25(k1=self.k1, b=self.b, method="lucene")
            self.model.index(token_ids(texts, self.stopwords, self.stem), show_progress=False)
        else:
            self.model = _rank_bm25_lucene(self._tok(texts), self.k1, self.b)
        return self

    def build_stream(self, batches: Iterable[list[str]], directory: Path, work: Path | None = None) -> BM25Index:
        """The index over the texts of `batches` (in row order), written to `directory` in bounded
        memory by write_bm25s_index (see there for `work`, which makes the build resumable), then
        loaded from it (memory-mapped when self.mmap)."""
        if self.backend != "bm25s":
            raise RagError(f"a streamed bm25 build writes bm25s's files; backend {self.backend!r} has none")
        self.built = write_bm25s_index(batches, directory, k1=self.k1, b=self.b, stopwords=self.stopwords,
                                       stem=self.stem, work=work)
        return self.load(directory)

    def save(self, directory: Path) -> None:
        self.model.save(str(directory), show_progress=False)

    def load(self, directory: Path) -> BM25Index:
        import bm25s

        self.model = bm25s.BM25.load(str(directory), mmap=self.mmap, allow_pickle=False)
        self._mask_cache = None
        self._impacts = None
        impacts = Path(directory) / maxscore.IMPACTS_FILE  # written by the streamed build
        if impacts.is_file():
            self._impacts = MaxImpacts(self.model.scores["data"], self.model.scores["indptr"],
                                       np.load(impacts, allow_pickle=False))
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
            found = self._pruned(toks, n, mask)
            if found is not None:
                rows, top = top_k(found[1], n)
                rows = found[0][rows]
            else:
                s = self._scores(toks, mask)
                if s is None:
                    continue
                rows, top = top_k(s, n)
            ids[qi, : len(rows)], scores[qi, : len(rows)] = rows, top
        return Hits(ids, scores)

    def _pruned(self, toks: list[str], n: int, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray] | None:
        """A few rows holding the top n with their exact scores, from bm25s's postings without
        scoring all of them (rag/retriever/maxscore.py); None to score every posting: another backend,
        or a query whose lists are short enough that pruning would not pay."""
        if self.backend != "bm25s" or self.model is None:
            return None
        vocab, arrays = self.model.vocab_dict, self.model.scores
        terms = [vocab[t] for t in toks if t in vocab]
        indptr = arrays["indptr"]
        if len(set(terms)) < 2 or sum(int(indptr[t + 1] - indptr[t]) for t in terms) < PRUNE_FROM_POSTINGS:
            return None
        if self._impacts is None:
            self._impacts = MaxImpacts(arrays["data"], indptr)
        return maxscore.candidates(arrays["data"], arrays["indices"], indptr, terms, n, self._impacts, mask)

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
