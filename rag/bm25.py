"""BM25 lexical search with two interchangeable backends.

- `bm25s` (default): sparse precomputed scores, milliseconds a query at a million chunks.
- `rank_bm25`: the reference pure-Python implementation, kept to cross-check bm25s.

Both see the same tokens (`tokenize`) and the same scoring function, Lucene's BM25 (idf =
ln(1 + (N - df + 0.5) / (df + 0.5)), which never goes negative), so they rank alike; a test holds
them to it. rank_bm25's BM25Okapi uses Robertson's idf with an epsilon floor instead, so its idf
is overridden below.

`write_bm25s_index` builds the bm25s index from batches of texts straight into bm25s's saved format,
in memory bounded by a batch plus the vocabulary (bm25s's own `index` holds every token and posting:
+2.1 GB a million chunks), and resumes after a kill.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from itertools import chain, islice
from pathlib import Path
from typing import Any

import numpy as np

from rag import bm25_maxscore as maxscore
from rag.bm25_maxscore import MaxImpacts
from rag.cache import atomic_write_text
from rag.types import Hits, RagError

log = logging.getLogger(__name__)

_TOKEN = re.compile(r"[a-z0-9_]+")
# A query whose posting lists hold fewer postings is scored exhaustively (milliseconds; the
# corpora of the shipped slices never reach it); past it, MaxScore pruning finds the same top n.
PRUNE_FROM_POSTINGS = 200_000
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
        scoring all of them (rag/bm25_maxscore.py); None to score every posting: another backend,
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


# --- Streamed build -------------------------------------------------------------------------------
# Pass 1 tokenizes batch by batch and appends each document's distinct term ids and their counts
# (doc-major postings) to files in a work directory. Pass 2 turns them term-major (bm25s's CSC
# layout: one column of (doc row, score) per term) by a counting sort: each term's slice of the
# output is known from its document frequency, and postings are scattered into memory-mapped output
# arrays chunk by chunk.

# Pass-1 files, append-only, int32: terms and tfs have a row per posting, doc_* a row per document.
_POSTING_FILES = ("terms.i32", "tfs.i32")
_DOC_FILES = ("doc_lengths.i32", "doc_terms.i32")
_VOCAB_FILE = "vocab.txt"  # the tokens in id order, one a line ([a-z0-9_]+: never a newline)
_PROGRESS = "progress.json"
_PROGRESS_FORMAT = 1
_CHUNK_POSTINGS = 1 << 22  # pass 2 reads this many postings at a time (~200 MB of temporaries)
_LOG_EVERY = 10  # batches


@dataclass(frozen=True)
class _Pass1:
    """How far pass 1 got: what progress.json records after each batch, once its rows are flushed."""
    batches: int = 0
    docs: int = 0
    postings: int = 0
    vocab: int = 0
    vocab_bytes: int = 0

    def file_sizes(self) -> dict[str, int]:
        sizes = {name: 4 * self.postings for name in _POSTING_FILES} | {name: 4 * self.docs for name in _DOC_FILES}
        return sizes | {_VOCAB_FILE: self.vocab_bytes}


def write_bm25s_index(batches: Iterable[list[str]], directory: Path, *, k1: float, b: float, stopwords: bool,
                      stem: bool, work: Path | None = None) -> dict[str, int]:
    """Write to `directory` the files bm25s.BM25.save writes for BM25(k1, b, method="lucene") indexed
    with BM25Index.build's token ids, the same arrays to the bit, from the texts of `batches` (lists
    of texts in row order). Returns the number of documents and of those an earlier, interrupted
    build had recorded (`n_docs`, `resumed_docs`).

    Memory: one batch, the vocabulary, and a few arrays of a number per document or per term.

    `work`: the directory for the intermediate files (about 8 bytes a posting), kept as it is on
    return, success or not; the caller deletes it. A build killed at any point and rerun with the
    same `work` and the same batches resumes after the last batch recorded in work/progress.json:
    those batches are read from `batches` but not tokenized again. An unreadable or inconsistent
    record starts pass 1 over. Without `work`, a temporary directory inside `directory` is used and
    removed."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if work is None:
        with tempfile.TemporaryDirectory(prefix=".bm25-work-", dir=directory) as tmp:
            return write_bm25s_index(batches, directory, k1=k1, b=b, stopwords=stopwords, stem=stem, work=Path(tmp))
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    done, vocab, resumed = _tokenize_batches(batches, work, stopwords, stem)
    pass1_s = time.monotonic() - started
    _write_postings(directory, work, done, k1, b)
    _write_vocab_and_params(directory, vocab, done.docs, k1, b)
    log.info("bm25 index: %d docs, %d terms, %d postings; pass 1 %.1f s, pass 2 %.1f s", done.docs, done.vocab,
             done.postings, pass1_s, time.monotonic() - started - pass1_s)
    return {"n_docs": done.docs, "resumed_docs": resumed}


def _tokenize_batches(batches: Iterable[list[str]], work: Path, stopwords: bool,
                      stem: bool) -> tuple[_Pass1, dict[str, int], int]:
    """Pass 1: the postings of every batch appended to the work files, batches already recorded
    skipped. Returns what was done, the vocabulary (token -> id, ids in order of first use) and the
    number of documents an earlier build had recorded."""
    tokenizer = {"stopwords": stopwords, "stem": stem}
    done, vocab = _resume(work, tokenizer)
    resumed = done.docs
    remaining = _skip_done(batches, done)
    started = time.monotonic()
    with ExitStack() as stack:
        files = {name: stack.enter_context(open(work / name, "ab")) for name in done.file_sizes()}
        for texts in remaining:
            n_vocab = len(vocab)
            arrays = _batch_postings(texts, vocab, stopwords, stem)
            for name, array in zip(_POSTING_FILES + _DOC_FILES, arrays):
                files[name].write(array)
            new_tokens = list(islice(reversed(vocab), len(vocab) - n_vocab))[::-1]  # dicts keep insertion order
            vocab_bytes = "".join(token + "\n" for token in new_tokens).encode()
            files[_VOCAB_FILE].write(vocab_bytes)
            for f in files.values():
                f.flush()  # on to the kernel before the record says so: a killed process loses none of it
            done = replace(done, batches=done.batches + 1, docs=done.docs + len(texts),
                           postings=done.postings + len(arrays[0]), vocab=len(vocab),
                           vocab_bytes=done.vocab_bytes + len(vocab_bytes))
            _record(work, done, tokenizer)
            if done.batches % _LOG_EVERY == 0:
                log.info("bm25 pass 1: %d batches, %d docs, %.0f s", done.batches, done.docs,
                         time.monotonic() - started)
    return done, vocab, resumed


def _batch_postings(texts: list[str], vocab: dict[str, int], stopwords: bool,
                    stem: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A batch's postings, doc-major (each document's distinct term ids, ascending, and their
    counts), and per document its length in tokens and its number of distinct terms. New tokens
    join `vocab` in order of first use, as in token_ids."""
    ids = [[vocab.setdefault(t, len(vocab)) for t in toks] for toks in iter_tokens(texts, stopwords, stem)]
    doc_lengths = np.fromiter(map(len, ids), np.int32, count=len(ids))
    flat = np.fromiter(chain.from_iterable(ids), np.int64, count=int(doc_lengths.sum()))
    width = max(len(vocab), 1)
    rows = np.repeat(np.arange(len(ids), dtype=np.int64), doc_lengths)
    keys, tfs = np.unique(rows * width + flat, return_counts=True)
    docs, terms = np.divmod(keys, width)
    doc_terms = np.bincount(docs, minlength=len(ids))
    return terms.astype(np.int32), tfs.astype(np.int32), doc_lengths, doc_terms.astype(np.int32)


def _resume(work: Path, tokenizer: dict[str, bool]) -> tuple[_Pass1, dict[str, int]]:
    """Where pass 1 stands in `work`: the recorded progress with every file cut back to its recorded
    length (a killed batch may have written part of its rows), or a fresh start."""
    if (work / _PROGRESS).exists():
        try:
            done, vocab = _recorded(work, tokenizer)
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("bm25 build: %s is unreadable or does not match the files (%s); pass 1 starts over",
                        work / _PROGRESS, e)
        else:
            for name, size in done.file_sizes().items():
                os.truncate(work / name, size)
            log.info("bm25 pass 1 resumes after %d batches (%d docs)", done.batches, done.docs)
            return done, vocab
    (work / _PROGRESS).unlink(missing_ok=True)
    for name in _Pass1().file_sizes():
        open(work / name, "wb").close()
    return _Pass1(), {}


def _recorded(work: Path, tokenizer: dict[str, bool]) -> tuple[_Pass1, dict[str, int]]:
    """The record and the vocabulary it covers; ValueError (or OSError, KeyError, TypeError) when the
    record is damaged or does not match the files."""
    record = json.loads((work / _PROGRESS).read_text())
    if record["format"] != _PROGRESS_FORMAT or record["tokenizer"] != tokenizer:
        raise ValueError("written by another format or tokenizer")
    done = _Pass1(**{f.name: int(record[f.name]) for f in fields(_Pass1)})
    if min(asdict(done).values()) < 0:
        raise ValueError("negative counts")
    for name, size in done.file_sizes().items():
        if (work / name).stat().st_size < size:
            raise ValueError(f"{name} is shorter than recorded")
    with open(work / _VOCAB_FILE, "rb") as f:
        tokens = f.read(done.vocab_bytes).decode().split("\n")[:-1]
    doc_terms = np.fromfile(work / _DOC_FILES[1], np.int32, count=done.docs)
    if len(tokens) != done.vocab or int(doc_terms.sum(dtype=np.int64)) != done.postings:
        raise ValueError("the vocabulary or the postings do not add up to the record")
    return done, {token: i for i, token in enumerate(tokens)}


def _record(work: Path, done: _Pass1, tokenizer: dict[str, bool]) -> None:
    """progress.json replaced whole, so a kill leaves the old record or the new."""
    atomic_write_text(work / _PROGRESS, json.dumps({"format": _PROGRESS_FORMAT, "tokenizer": tokenizer, **asdict(done)}))


def _skip_done(batches: Iterable[list[str]], done: _Pass1) -> Iterator[list[str]]:
    """The batches after those pass 1 recorded, which are read past (not tokenized); RagError when
    they do not hold the recorded number of texts (not the batches the work directory was built from)."""
    remaining = iter(batches)
    sizes = [len(texts) for texts in islice(remaining, done.batches)]
    if len(sizes) != done.batches or sum(sizes) != done.docs:
        raise RagError(f"the bm25 work directory records {done.batches} batches of {done.docs} texts in all, but "
                       f"the batches given start with {len(sizes)} of {sum(sizes)}: delete it or pass the same batches")
    return remaining


def _write_postings(directory: Path, work: Path, done: _Pass1, k1: float, b: float) -> None:
    """Pass 2: bm25s's CSC arrays (data: float32 scores, indices: int32 doc rows, both term-major and
    by row within a term; indptr: int64 offset of each term's postings) from the doc-major files."""
    doc_lengths = np.fromfile(work / _DOC_FILES[0], np.int32, count=done.docs)
    doc_terms = np.fromfile(work / _DOC_FILES[1], np.int32, count=done.docs)
    df = _document_frequencies(work / _POSTING_FILES[0], done.postings, done.vocab)
    indptr = np.zeros(done.vocab + 1, np.int64)
    np.cumsum(df, out=indptr[1:])
    idf = _idf_per_term(done.docs, df)
    # bm25s's avg_doc_len, the float64 mean of integer lengths, is exact: an exact sum, one division.
    avgdl = np.float64(doc_lengths.sum(dtype=np.int64)) / max(done.docs, 1)
    cursor = indptr[:-1].copy()  # each term's next free slot in the output
    impacts = np.zeros(done.vocab, np.float32)  # each term's largest score, for MaxScore pruning
    data = np.lib.format.open_memmap(directory / "data.csc.index.npy", "w+", np.float32, (done.postings,))
    indices = np.lib.format.open_memmap(directory / "indices.csc.index.npy", "w+", np.int32, (done.postings,))
    with open(work / _POSTING_FILES[0], "rb") as terms_file, open(work / _POSTING_FILES[1], "rb") as tfs_file:
        for d0, d1, count in _doc_chunks(doc_terms, _CHUNK_POSTINGS):
            terms = np.fromfile(terms_file, np.int32, count=count)
            tfs = np.fromfile(tfs_file, np.int32, count=count)
            doc_postings = doc_terms[d0:d1]
            scores = _lucene_scores(tfs, np.repeat(doc_lengths[d0:d1], doc_postings), idf[terms], avgdl, k1, b)
            # A stable sort keeps each term's postings in row order, the order of bm25s's columns.
            order = np.argsort(terms, kind="stable")
            slots = _claim_slots(terms[order], cursor)
            data[slots] = scores[order]
            indices[slots] = np.repeat(np.arange(d0, d1, dtype=np.int32), doc_postings)[order]
            np.maximum.at(impacts, terms, scores)
    data.flush()
    indices.flush()
    del data, indices
    np.save(directory / "indptr.csc.index.npy", indptr)
    np.save(directory / maxscore.IMPACTS_FILE, impacts)


def _document_frequencies(terms_path: Path, n_postings: int, n_vocab: int) -> np.ndarray:
    """Documents per term: a doc-major posting is one (document, distinct term) pair."""
    df = np.zeros(n_vocab, np.int64)
    with open(terms_path, "rb") as f:
        for start in range(0, n_postings, _CHUNK_POSTINGS):
            df += np.bincount(np.fromfile(f, np.int32, count=min(_CHUNK_POSTINGS, n_postings - start)),
                              minlength=n_vocab)
    return df


def _idf_per_term(n_docs: int, df: np.ndarray) -> np.ndarray:
    """bm25s's float32 idf: math.log of Python floats rounded to float32 (np.log may differ from
    math.log in the last bit, which can move the float32 rounding), once per distinct df."""
    values, inverse = np.unique(df, return_inverse=True)
    return np.array([_lucene_idf(n_docs, int(v)) for v in values], np.float64).astype(np.float32)[inverse]


def _lucene_scores(tfs: np.ndarray, lengths: np.ndarray, idf: np.ndarray, avgdl: np.float64, k1: float,
                   b: float) -> np.ndarray:
    """Per posting, bm25s's lucene score with its operations and dtypes (scoring._score_tfc_robertson
    then idf * tfc): float64 from a float32 tf and float32 idf, stored as float32."""
    tf = tfs.astype(np.float32).astype(np.float64)
    tfc = tf / (k1 * ((1 - b) + b * lengths / avgdl) + tf)
    return (idf * tfc).astype(np.float32)


def _doc_chunks(doc_terms: np.ndarray, budget: int) -> Iterator[tuple[int, int, int]]:
    """Consecutive document ranges [d0, d1) of about `budget` postings (one document at least), and
    their posting counts."""
    ends = np.cumsum(doc_terms, dtype=np.int64)
    d0 = 0
    while d0 < len(ends):
        base = int(ends[d0 - 1]) if d0 else 0
        d1 = max(int(np.searchsorted(ends, base + budget, side="right")), d0 + 1)
        yield d0, d1, int(ends[d1 - 1]) - base
        d0 = d1


def _claim_slots(sorted_terms: np.ndarray, cursor: np.ndarray) -> np.ndarray:
    """Output positions for postings sorted by term: each term's next free slots in order; its
    cursor moves past them."""
    n = len(sorted_terms)
    starts = np.flatnonzero(np.diff(sorted_terms, prepend=-1))
    counts = np.diff(starts, append=n)
    firsts = sorted_terms[starts]
    slots = np.repeat(cursor[firsts] - starts, counts) + np.arange(n)
    cursor[firsts] += counts
    return slots


def _write_vocab_and_params(directory: Path, vocab: dict[str, int], n_docs: int, k1: float, b: float) -> None:
    """vocab.index.json and params.index.json as bm25s.BM25.save writes them for BM25Index.build's
    index; params last, so that a directory without it was not finished."""
    import bm25s

    vocab.setdefault("", len(vocab))  # bm25s.BM25.index adds the empty token after the others
    with open(directory / "vocab.index.json", "w", encoding="utf-8") as f:
        f.write(json.dumps(vocab, ensure_ascii=False, separators=(",", ":")))
    params = {"k1": k1, "b": b, "delta": 0.5, "method": "lucene", "idf_method": "lucene", "dtype": "float32",
              "int_dtype": "int32", "num_docs": n_docs, "version": bm25s.__version__, "backend": "numpy"}
    with open(directory / "params.index.json", "w") as f:
        json.dump(params, f, indent=4)
