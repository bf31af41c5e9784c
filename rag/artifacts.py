"""The one owner of a run's cached data artifacts: corpus, chunks, vectors, index, bm25, answers.

Each kind has one method of `Artifacts` that names its key inputs, builds the payload on a miss,
loads it on a hit, notes (key, hit) in `record` (a report for metrics.json, never read back) and
returns what it made. Keys chain: chunks are keyed by the chunker settings and the sliced corpus's
content, vectors by the embedder and the chunks' key, an index by its settings and the vectors'
key, so changing fusion, k or the reranker reuses everything while a new chunking or embedder
builds anew (rag/cache.py has the rules; docs/architecture.md the table). Model artifacts (the
ONNX export, the LLM's conversion, the cross-encoder) are built by the components that hold the
models, through the same cache (`use_cache`).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from rag.bm25 import BM25Index
from rag.cache import ArtifactCache, atomic_write_text, make_key
from rag.chunk_store import ChunkStore, ChunkWriter, DocumentStore, document_row
from rag.corpus.slicing import check_unique_ids, content_fingerprint
from rag.embedder.sentence_transformer import RowSink, SentenceTransformerEmbedder
from rag.index import VectorIndex
from rag.llm import NoGenerator
from rag.llm.answer_cache import generate_resumable, prompt_inputs, usage_totals
from rag.timing import StageTimer
from rag.types import Chunk, Context, Document, QAItem, RagError

log = logging.getLogger(__name__)

DOCS_FILE = "docs.jsonl"  # the corpus's format before rag/chunk_store.py; still read
CHUNKS_FILE = "chunks.jsonl"  # the chunks' format before rag/chunk_store.py; still read
# Chunking records its progress every SHARD_DOCS documents (ChunkWriter.checkpoint): what a killed
# build resumes from. RAGRIG_TEST_CHUNK_SHARD: smaller shards, for the crash tests only.
SHARD_DOCS = int(os.environ.get("RAGRIG_TEST_CHUNK_SHARD", "10000"))
VECTORS_FILE = "vectors.npy"
ANSWERS_FILE = "answers.json"
# Encoding in blocks bounds the memory of one step, shows progress on large corpora, and is what an
# interrupted embedding resumes from (encode_to_npy). RAGRIG_TEST_ENCODE_BLOCK: smaller blocks, for
# the crash tests only (a few hundred chunks then span several blocks).
ENCODE_BLOCK = int(os.environ.get("RAGRIG_TEST_ENCODE_BLOCK", "8192"))


@dataclass
class ChunkSet:
    """The run's chunks by row: a `ChunkStore` read from the cache (rag/chunk_store.py), or a list
    of `Chunk` records (tests, callers that chunk for themselves, caches written before the store)."""

    key: str
    chunks: Sequence[Chunk]
    # chunker.contextualize (rag/chunker/contextualize.py): per chunk, a line indexed before its text
    prefixes: list[str] | None = None
    context: str = "none"

    def __post_init__(self) -> None:
        if isinstance(self.chunks, ChunkStore):
            self._source_names, self._codes = self.chunks.source_names, self.chunks.source_codes()
        else:
            self._source_names = sorted({c.source for c in self.chunks})
            code = {s: i for i, s in enumerate(self._source_names)}
            self._codes = np.fromiter((code[c.source] for c in self.chunks), np.uint16, len(self.chunks))
        self._positions: dict[tuple[str, int], int] | None = None
        self._rows_by_sources: dict[frozenset[str], np.ndarray] = {}

    @property
    def sources(self) -> np.ndarray:
        """Chunk row -> source tag (an object array), for metadata filters and routing."""
        return np.array(self._source_names, dtype=object)[self._codes]

    @property
    def texts(self) -> list[str]:
        """The chunks' own texts: what contexts, passages and metrics read."""
        return self._texts(0, len(self))

    def _texts(self, start: int, stop: int) -> list[str]:
        if isinstance(self.chunks, ChunkStore):
            return self.chunks.texts(start, stop)  # one read of the blob, not a row at a time
        return [c.text for c in self.chunks[start:stop]]

    @property
    def indexed_texts(self) -> list[str]:
        """What the pipeline's embedder and BM25 index: the texts, after their prefixes if any."""
        return [t for batch in self.indexed_batches() for t in batch]

    def indexed_batches(self, size: int = 50_000) -> Iterator[list[str]]:
        """`indexed_texts` in batches of `size` rows, read from the store as they are needed (what
        a build that must not hold every text at once consumes)."""
        for start in range(0, len(self), size):
            stop = min(len(self), start + size)
            texts = self._texts(start, stop)
            if self.prefixes is not None:
                texts = [f"{p}\n{t}" for p, t in zip(self.prefixes[start:stop], texts)]
            yield texts

    def id_batches(self, size: int = 50_000) -> Iterator[list[str]]:
        """The chunk ids (doc_id#position) in batches of `size` rows."""
        for start in range(0, len(self), size):
            if isinstance(self.chunks, ChunkStore):
                yield self.chunks.ids(start, start + size)
            else:
                yield [c.id for c in self.chunks[start : start + size]]

    def indexed_key(self) -> dict[str, str]:
        """What an index over `indexed_texts` is keyed by (the chunks' key alone without prefixes,
        so those keys are unchanged by the setting's existence)."""
        return {"chunks": self.key} if self.prefixes is None else {"chunks": self.key, "context": self.context}

    def contextualized(self, mode: str, prefixes: list[str] | None) -> ChunkSet:
        """The same chunks indexed with `prefixes` (a new set: the plain one is shared in memory
        by the jobs of a sweep)."""
        if prefixes is None:
            return self
        if len(prefixes) != len(self.chunks):
            raise ValueError(f"{len(prefixes)} prefixes for {len(self.chunks)} chunks")
        return ChunkSet(self.key, self.chunks, prefixes, mode)

    def row_of(self, doc_id: str, position: int) -> int | None:
        """Chunk row of a document's chunk at `position` (None past either end)."""
        if self._positions is None:
            self._positions = {(c.doc_id, c.position): i for i, c in enumerate(self.chunks)}
        return self._positions.get((doc_id, position))

    def neighbour(self, row: int, position: int) -> int | None:
        """Row of the chunk at `position` in the document of chunk `row` (None past either end).
        A document's chunks are written in order, one after another, so the row is found by
        arithmetic and checked, with no table of every chunk (rows_of at 10M chunks: ~2 GB)."""
        if isinstance(self.chunks, ChunkStore):
            store = self.chunks
            guess = row + position - int(store.cols["position"][row])
            if 0 <= guess < len(store) and int(store.cols["position"][guess]) == position \
                    and store.doc_id(guess) == store.doc_id(row):
                return guess
            return None
        return self.row_of(self.chunks[row].doc_id, position)

    def rows_of_sources(self, sources: frozenset[str]) -> np.ndarray:
        """Rows whose source is in `sources`; the same (read-only) array for the same filter, so
        that it is computed once per filter, not once per question (13 ms at 1M chunks), and
        the indexes can reuse what they derive from it."""
        rows = self._rows_by_sources.get(sources)
        if rows is None:
            codes = [i for i, s in enumerate(self._source_names) if s in sources]
            rows = np.flatnonzero(np.isin(self._codes, codes)).astype(np.int64)
            rows.flags.writeable = False
            self._rows_by_sources[sources] = rows
        return rows

    def __len__(self) -> int:
        return len(self.chunks)


@dataclass
class Answers:
    """Generated answers with each question's generation time and how they were obtained."""

    answers: list[str]
    latency_ms: np.ndarray
    key: str
    hit: bool  # from the cache: timed by the run that generated them, not by this one
    details: list[dict[str, Any]] | None  # per answer (llm=openai: token usage, finish reason, model)
    requests: int  # requests this run sent
    resumed: int  # answers taken from records of an earlier, interrupted run


class Artifacts:
    """Builds or loads the run's artifacts through `cache`, recording hits and stage times.
    `chunk_set` is set by `chunks()` (or given, by callers that made their own chunks)."""

    def __init__(self, cache: ArtifactCache, chunk_set: ChunkSet | None = None, timer: StageTimer | None = None):
        self.cache = cache
        self.chunk_set = chunk_set
        self.timer = timer or StageTimer()
        self.record: dict[str, dict] = {}  # artifact kind -> {key, hit}

    def _note(self, kind: str, key: str, hit: bool) -> None:
        # The first use is the one that says whether this run built the artifact; later reuses
        # within the same run (e.g. by the evaluation) are hits by construction.
        self.record.setdefault(kind, {"key": key, "hit": hit})

    # -- corpus and questions ----------------------------------------------------------------

    def inputs(self, corpus: Any, questions: Any) -> tuple[list[Document], list[str], list[QAItem]]:
        """(all documents, skipped inputs, all questions), parsed once per process per inputs'
        fingerprints (file listings, sizes and mtimes, computed anew by every job, so a changed
        file is read anew)."""
        memo_key = make_key("inputs", {"corpus": corpus.fingerprint(), "qa": questions.fingerprint()})
        found = self.cache.memory.get("inputs", memo_key)
        if found is not None:
            return found
        docs, skipped = load_corpus(corpus, self.cache)
        qa = questions.load()  # checked against the corpus in rag/preflight.py
        return self.cache.memory.put("inputs", memo_key, (docs, skipped, qa))

    # -- chunks --------------------------------------------------------------------------------

    def chunks(self, chunker: Any, chunker_cfg: dict[str, Any], docs: Iterable[Document],
               corpus_fp: str | None = None) -> ChunkSet:
        """The chunks of `docs`, keyed by the chunker's settings and the documents' content.

        `docs` may be a stream (a generator over a corpus too large to hold) when `corpus_fp`, the
        fingerprint of its content, is given; it is then read once, on a miss. The chunks are
        written to the store shard by shard (SHARD_DOCS documents), so a build killed part-way
        resumes from its last finished shard: the documents before it are skipped unchunked."""
        corpus_fp = corpus_fp or content_fingerprint(docs)
        key = make_key("chunks", chunker_cfg, {"corpus": corpus_fp})
        known = self.cache.memory.get("chunks", key)
        if known is not None and self.cache.lookup("chunks", key) is not None:
            self.chunk_set = known
            self._note("chunks", key, True)
            return known

        def build(tmp: Path) -> dict[str, Any]:
            writer = ChunkWriter(self.cache.partial("chunks", key))
            resumed = writer.docs_done
            if resumed:
                log.info("chunking resumes after document %d (%d chunks stored by an interrupted build)", resumed, writer.n)
            stream = tqdm(docs, desc="chunking", unit="doc", mininterval=2.0, leave=False)
            n_docs = writer.add_all(stream, chunker.split, SHARD_DOCS)
            if writer.n == 0:
                raise RagError("chunker produced no chunks: every document is empty")
            return {**writer.finish(n_docs, tmp), "resumed_docs": resumed}

        art = self.cache.get_or_build("chunks", key, build, inputs={"chunker": chunker_cfg, "corpus": corpus_fp})
        if art.file(CHUNKS_FILE).exists():  # written before the store (a cache from an earlier version)
            with open(art.file(CHUNKS_FILE), encoding="utf-8") as f:
                chunks: Sequence[Chunk] = [Chunk.from_json(json.loads(line)) for line in f]
        else:
            chunks = ChunkStore(art.path)
        self.chunk_set = self.cache.memory.put("chunks", key, ChunkSet(key, chunks))
        self._note("chunks", key, art.hit)
        return self.chunk_set

    # -- vectors, indexes ------------------------------------------------------------------------

    def _texts_key(self, indexed: bool) -> dict[str, str]:
        return self.chunk_set.indexed_key() if indexed else {"chunks": self.chunk_set.key}

    def vectors_key(self, embedder: SentenceTransformerEmbedder, indexed: bool = True) -> str:
        """`indexed`: of the texts the pipeline indexes (with chunker.contextualize's prefixes);
        else of the chunks' own texts (what the evaluation embedder encodes)."""
        return make_key("vectors", embedder.id, self._texts_key(indexed))

    def vectors(self, embedder: SentenceTransformerEmbedder, indexed: bool = True) -> np.ndarray:
        """float32 [n_chunks, dim], memory-mapped from the cache."""
        key = self.vectors_key(embedder, indexed)
        inputs = self._texts_key(indexed)

        def build(tmp: Path) -> dict:
            if hasattr(embedder, "write_vectors"):  # embedder=precomputed: vectors by chunk id, nothing encoded
                out = np.lib.format.open_memmap(tmp / VECTORS_FILE, mode="w+", dtype=np.float32,
                                                shape=(len(self.chunk_set), embedder.dim))
                stats = embedder.write_vectors(self.chunk_set.id_batches(ENCODE_BLOCK * 8), out)
                out.flush()
                del out
                return {**stats, "embedder": json.loads(json.dumps(embedder.id))}
            texts = self.chunk_set.indexed_texts if indexed else self.chunk_set.texts
            return encode_to_npy(embedder, texts, tmp / VECTORS_FILE, resume=self.cache.partial("vectors", key))

        with self.timer.stage("embed"):
            art = self.cache.get_or_build("vectors", key, build, inputs={**inputs, **embedder.id})
        self._note("vectors", key, art.hit)
        vecs = np.load(art.file(VECTORS_FILE), mmap_mode="r", allow_pickle=False)
        if vecs.shape[0] != len(self.chunk_set):
            raise RagError(f"cached vectors {art.path} hold {vecs.shape[0]} rows for {len(self.chunk_set)} chunks")
        return vecs

    def vector_index(self, embedder: SentenceTransformerEmbedder, index: VectorIndex) -> tuple[VectorIndex, str]:
        """`index` built over the embedder's vectors (or loaded), and its key."""
        vectors = self.vectors(embedder)
        key = make_key("index", index.params, {"vectors": self.vectors_key(embedder)})

        def build(tmp: Path) -> dict:
            index.build(vectors)
            index.save(tmp)
            return {"ntotal": index.ntotal, "dim": index.dim}

        with self.timer.stage("index"):
            art = self.cache.get_or_build("index", key, build, inputs=index.params)
            if art.hit:
                index.load(art.path)
                index.use_vectors(vectors)
        self._note("index", key, art.hit)
        return index, key

    def bm25(self, bm25: BM25Index) -> tuple[BM25Index, str]:
        """`bm25` built over the chunk texts (or loaded), and its key."""
        key = make_key("bm25", bm25.params, self.chunk_set.indexed_key())
        with self.timer.stage("bm25"):
            if not bm25.persistent:
                # rank_bm25 has no file format; it is rebuilt in memory (it is the slow reference).
                bm25.build(self.chunk_set.indexed_texts)
                self._note("bm25", key, False)
                return bm25, key

            def build(tmp: Path) -> dict:
                # Streamed from the chunk store in batches, in bounded memory, into the files
                # bm25s saves (the same arrays to the bit); resumable from the partial directory.
                bm25.build_stream(self.chunk_set.indexed_batches(), tmp, work=self.cache.partial("bm25", key))
                return dict(bm25.built)

            art = self.cache.get_or_build("bm25", key, build, inputs=bm25.params)
            if art.hit or bm25.mmap:  # mmap: the built arrays give way to the saved files, mapped
                bm25.load(art.path)
        self._note("bm25", key, art.hit)
        return bm25, key

    # -- answers ---------------------------------------------------------------------------------

    def answers(self, generator: Any, queries: list[str], contexts: list[list[Context]]) -> Answers | None:
        """Answers are keyed by the generator's settings and the exact prompts' inputs, so a sweep
        that changes nothing upstream of generation (e.g. eval thresholds) reuses them, and any
        change in the contexts generates anew. A resumable generator's answers are also recorded
        one by one as they arrive (rag.llm.answer_cache), so a run that fails mid-way resumes.
        None for llm=none."""
        if isinstance(generator, NoGenerator):
            return None
        key = answers_key(generator, queries, contexts)
        art = self.cache.get_or_build("answers", key, lambda tmp: self._generate(generator, queries, contexts, tmp),
                                      inputs={"generator": generator.id})
        self._note("answers", key, art.hit)
        data = json.loads(art.file(ANSWERS_FILE).read_text())
        return Answers(data["answers"], np.asarray(data["latency_ms"], float), key, art.hit, data.get("details"),
                       requests=0 if art.hit else int(art.manifest.get("requests", 0)),
                       resumed=len(queries) if art.hit else int(art.manifest.get("resumed", 0)))

    def _generate(self, generator: Any, queries: list[str], contexts: list[list[Context]], tmp: Path) -> dict[str, Any]:
        t0 = time.perf_counter()
        details, counts = None, {}
        if getattr(generator, "resumable", False):
            details, counts = generate_resumable(generator, queries, contexts, self.cache, self.timer)
            answers = [d.pop("answer") for d in details]
        else:
            with self.timer.stage("load_models"):
                generator.warm_up()
            t0 = time.perf_counter()
            with self.timer.stage("generate"):
                answers = generator.generate(queries, contexts)
        seconds = time.perf_counter() - t0
        if answers is None or len(answers) != len(queries):
            raise RagError(f"llm {type(generator).__name__} returned {0 if answers is None else len(answers)} "
                           f"answers for {len(queries)} questions")
        empty = sum(1 for a in answers if not a.strip())
        if empty:
            log.warning("llm returned %d empty answer(s); they are scored as empty strings", empty)
        if details is not None:  # requests: each its own wall time
            per_q = [d.pop("latency_ms") for d in details]
        else:  # batches: each question is charged its batch's share of the time
            per_q = getattr(generator, "last_latencies_ms", None) or [1000.0 * seconds / len(queries)] * len(queries)
        payload = {"answers": answers, "latency_ms": list(per_q), **({"details": details} if details is not None else {})}
        (tmp / ANSWERS_FILE).write_text(json.dumps(payload, ensure_ascii=False))
        usage = {"usage": usage_totals(details)} if details is not None else {}
        return {"n": len(answers), "empty": empty, "seconds": round(seconds, 3), **counts, **usage}


def answers_key(generator: Any, queries: list[str], contexts: list[list[Context]]) -> str:
    h = hashlib.sha256()
    for query, ctx in zip(queries, contexts):
        h.update(prompt_inputs(query, ctx).encode())
    return make_key("answers", generator.id, {"inputs": h.hexdigest()})


def load_corpus(corpus: Any, cache: ArtifactCache) -> tuple[Sequence[Document], list[str]]:
    """(documents, skipped inputs). Rendering man pages or walking torch's docstrings takes tens
    of seconds, so every corpus (each part of a mixed corpus on its own) is cached under the key
    of its `fingerprint()`. The documents are streamed from the reader into a store read by row
    (rag/chunk_store.py), never held whole: a corpus of millions of abstracts is returned as a
    `DocumentStore`. The store records its progress every SHARD_DOCS documents, so a read killed
    part-way goes on from there (the documents before it are parsed again, not stored again)."""
    parts = getattr(corpus, "parts", None)
    if parts:
        docs: list[Document] = []
        skipped: list[str] = []
        for part in parts:
            d, s = load_corpus(part, cache)
            docs.extend(d)
            skipped.extend(s)
        check_unique_ids([d.id for d in docs], "corpus")
        return docs, skipped

    fingerprint = corpus.fingerprint()
    key = make_key("corpus", fingerprint)

    def build(tmp: Path) -> dict[str, Any]:
        writer = ChunkWriter(cache.partial("corpus", key))
        resumed = writer.docs_done
        stored = writer.finish(writer.add_all(corpus.iter_documents(), document_row, SHARD_DOCS), tmp)
        return {"n_docs": stored["n_docs"], "resumed_docs": resumed, "skipped": list(getattr(corpus, "skipped", []) or [])}

    art = cache.get_or_build("corpus", key, build, inputs=fingerprint)
    if art.file(DOCS_FILE).exists():  # written before the store (a cache from an earlier version)
        with open(art.file(DOCS_FILE), encoding="utf-8") as f:
            loaded: Sequence[Document] = [Document.from_json(json.loads(line)) for line in f]
    else:
        loaded = DocumentStore(art.path)
    log.info("corpus %s: %d documents (%s)", type(corpus).__name__, len(loaded), "cached" if art.hit else "built")
    return loaded, list(art.manifest.get("skipped", []))


def encode_to_npy(embedder: SentenceTransformerEmbedder, texts: list[str], path: Path,
                  resume: Path | None = None) -> dict:
    """Encode texts into a float32 .npy written block by block (never whole in memory twice).
    Identical texts (boilerplate repeated across documents) are encoded once.

    The embedder yields (rows, vectors) pairs from `encode_blocks`, in any order, so an engine
    that encodes on several workers (rag.embedder.ray_data) writes the very same file. An embedder
    that `writes_rows` is handed the file itself (a RowSink): its workers write their vectors into
    it, on every node of a cluster when the cache is on a shared filesystem, and the pairs they
    yield are (rows, None): recorded as done here, never carried through this process.

    `resume`: a directory that outlives a failed or killed build (the cache's `partial` directory
    of this artifact). The unique texts' vectors are written into a file there, and blocks.json
    lists the blocks of ENCODE_BLOCK texts whose rows are all written and flushed; a later build
    reopens the file and encodes only the other blocks, so an hours-long embedding killed near its
    end loses at most the blocks in flight. The file is moved, not copied, into the artifact."""
    unique: dict[str, int] = {}
    inverse = np.fromiter((unique.setdefault(t, len(unique)) for t in texts), dtype=np.int64, count=len(texts))
    uniq_texts = list(unique)
    dim = embedder.dim
    # With no repeated text (the usual case) the unique vectors are the result: encode straight
    # into the output, not into a second file that is then copied (2x the writes and page cache).
    all_unique = len(uniq_texts) == len(texts)
    blocks = BlockLog(resume, len(uniq_texts), dim)
    if resume is not None:
        uniq_path = resume / "unique.npy"
    else:
        uniq_path = path if all_unique else path.with_name("unique.tmp.npy")
    out_u = blocks.open(uniq_path)
    todo = blocks.todo()  # rows still to encode: whole blocks, in order
    todo_texts = uniq_texts if len(todo) == len(uniq_texts) else [uniq_texts[i] for i in todo]
    if getattr(embedder, "writes_rows", False) and len(todo):
        out_u.flush()  # the header and the full size are in the file (open_memmap wrote them) before workers write
        pairs = embedder.encode_blocks(todo_texts, ENCODE_BLOCK,
                                       sink=RowSink(str(uniq_path.absolute()), int(out_u.offset), dim, todo))
    else:
        pairs = embedder.encode_blocks(todo_texts, ENCODE_BLOCK)
    written_elsewhere = False
    for rows, vecs in pairs:
        where = todo[rows]
        if vecs is None:
            written_elsewhere = True  # by the embedder's workers, into the file
        else:
            out_u[where] = vecs
        blocks.filled(where, out_u)
    out_u.flush()
    if written_elsewhere:
        # A fresh map: this one may hold pages of the file from before the workers wrote (a shared
        # filesystem revalidates what it cached when the file is opened again).
        del out_u
        out_u = np.lib.format.open_memmap(uniq_path, mode="r")
    if not all_unique:
        out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(len(texts), dim))
        for i in range(0, len(texts), ENCODE_BLOCK):
            out[i : i + ENCODE_BLOCK] = out_u[inverse[i : i + ENCODE_BLOCK]]
        out.flush()
        del out
        del out_u
        uniq_path.unlink()
    else:
        del out_u
        if uniq_path != path:
            os.replace(uniq_path, path)
    return {"n": len(texts), "unique": len(uniq_texts), "dim": dim, "embedder": json.loads(json.dumps(embedder.id)),
            "resumed_blocks": blocks.restored}


class BlockLog:
    """Which blocks of encode_to_npy's unique-vectors file are complete: blocks.json in its resume
    directory, rewritten atomically after each block's rows are flushed (None: no directory,
    nothing recorded, a fresh file every time)."""

    def __init__(self, directory: Path | None, n: int, dim: int):
        self.dir, self.n, self.dim = directory, n, dim
        self.count = np.zeros(-(-n // ENCODE_BLOCK), np.int64)  # rows filled per block
        self.done: set[int] = set()
        self.restored = 0

    def _rows(self, b: int) -> slice:
        return slice(b * ENCODE_BLOCK, min(self.n, (b + 1) * ENCODE_BLOCK))

    def _size(self, b: int) -> int:
        return self._rows(b).stop - self._rows(b).start

    def open(self, file: Path) -> np.ndarray:
        """The unique vectors' memory map: an interrupted build's file with its finished blocks when
        it matches (same rows, dimension and block size), else a new one."""
        shape = (self.n, self.dim)
        if self.dir is not None and file.is_file():
            try:
                done = self._read(self.dir, self.n, self.dim)
                out = np.lib.format.open_memmap(file, mode="r+")
                if done is not None and (out.shape, out.dtype) == (shape, np.float32):
                    self.done = done
                    for b in self.done:
                        self.count[b] = self._size(b)
                    self.restored = len(self.done)
                    if self.restored:
                        log.info("embedding resumes: %d of %d blocks were encoded by an earlier, interrupted build",
                                 self.restored, len(self.count))
                    return out
                del out
            except (OSError, ValueError, KeyError, TypeError):
                pass  # unreadable or another shape: encoded anew
        self._record()
        return np.lib.format.open_memmap(file, mode="w+", dtype=np.float32, shape=shape)

    @staticmethod
    def _read(directory: Path, n: int, dim: int | None) -> set[int] | None:
        """The finished blocks blocks.json records for `n` texts of `dim` values (any dimension
        when None), or None when it records another build; errors are the caller's."""
        record = json.loads((directory / "blocks.json").read_text())
        if (record["n"], record["block"]) != (n, ENCODE_BLOCK) or dim not in (None, record["dim"]):
            return None
        return {int(b) for b in record["done"] if 0 <= int(b) < -(-n // ENCODE_BLOCK)}

    @classmethod
    def recorded(cls, directory: Path | None, n: int) -> set[int]:
        """The blocks an interrupted build of `n` unique texts recorded in `directory` (what a
        rerun will not encode again; the dry run counts the rest). The dimension is not checked:
        it is known only once the model answers."""
        try:
            if (directory / "unique.npy").is_file():
                return cls._read(directory, n, None) or set()
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return set()

    def todo(self) -> np.ndarray:
        rows = [np.arange(self._rows(b).start, self._rows(b).stop) for b in range(len(self.count)) if b not in self.done]
        return np.concatenate(rows) if rows else np.zeros(0, np.int64)

    def filled(self, rows: np.ndarray, out: np.ndarray) -> None:
        if self.dir is None:
            return
        blocks, counts = np.unique(np.asarray(rows) // ENCODE_BLOCK, return_counts=True)
        finished = False
        for b, c in zip(blocks.tolist(), counts.tolist()):
            self.count[b] += c
            if self.count[b] == self._size(b):
                self.done.add(b)
                finished = True
        if finished:
            out.flush()  # the rows reach the file before the record says they did
            self._record()

    def _record(self) -> None:
        if self.dir is not None:
            atomic_write_text(self.dir / "blocks.json", json.dumps(
                {"n": self.n, "dim": self.dim, "block": ENCODE_BLOCK, "done": sorted(self.done)}))
