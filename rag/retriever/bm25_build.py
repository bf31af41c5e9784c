"""The bm25s index written from batches of texts straight into bm25s's saved format, in memory
bounded by a batch plus the vocabulary (bm25s's own `index` holds every token and posting: +2.1 GB a
million chunks), resumable after a kill. BM25Index.build_stream (rag/retriever/bm25.py) loads what
it writes."""
from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass, fields, replace
from itertools import chain, islice
from pathlib import Path

import numpy as np

from rag.store.atomic import atomic_write_text
from rag.retriever.maxscore import IMPACTS_FILE
from rag.retriever.tokens import iter_tokens, lucene_idf
from rag.types import RagError

log = logging.getLogger(__name__)

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
                files[name].write(array.data)
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
    np.save(directory / IMPACTS_FILE, impacts)


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
    return np.array([lucene_idf(n_docs, int(v)) for v in values], np.float64).astype(np.float32)[inverse]


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
