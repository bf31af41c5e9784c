"""The one owner of a run's cached data artifacts: corpus, chunks, vectors, index, bm25, answers.

Each kind has one method of `Artifacts` that names its key inputs, builds the payload on a miss,
loads it on a hit, notes (key, hit) in `record` (a report for metrics.json, never read back) and
returns what it made. Keys chain: chunks are keyed by the chunker settings and the sliced corpus's
content, vectors by the embedder and the chunks' key, an index by its settings and the vectors'
key, so changing fusion, k or the reranker reuses everything while a new chunking or embedder
builds anew (rag/store/cache.py has the rules; docs/explanation/architecture.md the table). Model artifacts (the
ONNX export, the LLM's conversion, the cross-encoder) are built by the components that hold the
models, through the same cache (`use_cache`).
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from rag.store import chunk_store
from rag.store.cache import ArtifactCache, make_key
from rag.store.chunk_set import ChunkSet
from rag.store.chunk_store import ChunkStore, ChunkWriter
from rag.corpus.base import Corpus
from rag.corpus.loading import load_corpus
from rag.corpus.slicing import content_fingerprint
from rag.embedder import npy_writer
from rag.embedder.npy_writer import encode_to_npy
from rag.embedder.base import Embedder
from rag.index.base import VectorIndex
from rag.store.legacy_cache import old_chunks
from rag.llm import Generator, NoGenerator
from rag.llm.base import Stopped
from rag.llm.answer_cache import generate_resumable, prompt_inputs, usage_totals
from rag.qa.base import QuestionSet
from rag.retriever.bm25 import BM25Index
from rag.timing import StageTimer
from rag.types import Chunk, Context, Document, QAItem, RagError

log = logging.getLogger(__name__)

VECTORS_FILE = "vectors.npy"
ANSWERS_FILE = "answers.json"


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
    stopped: Stopped | None = None  # how many stopped at the token limit (None: the generator cannot say)
    withheld: int = 0  # replies that held no answer (a refusal, content null): scored as empty, never cached


class _Withheld(Exception):
    """Raised by the answers' build when a reply held no answer: the run uses what it has, but no
    artifact is published, so that a rerun asks again rather than scoring the empty answers."""

    def __init__(self, payload: dict[str, Any], stats: dict[str, Any]):
        super().__init__("answers not cached: a reply held no answer")
        self.payload, self.stats = payload, stats


class Artifacts:
    """Builds or loads the run's artifacts through `cache`, recording hits and stage times.
    `chunk_set` is set by `chunks()` (or given, by callers that made their own chunks)."""

    def __init__(self, cache: ArtifactCache, chunk_set: ChunkSet | None = None, timer: StageTimer | None = None):
        self.cache = cache
        self.chunk_set = chunk_set
        self.timer = timer or StageTimer()
        self.record: dict[str, dict] = {}  # artifact kind -> {key, hit}

    @property
    def chunked(self) -> ChunkSet:
        """The chunk set the vectors, indexes and BM25 are built over: `chunks()` must have run."""
        if self.chunk_set is None:
            raise RagError("no chunks yet: Artifacts.chunks() builds them before vectors, indexes or BM25")
        return self.chunk_set

    def _note(self, kind: str, key: str, hit: bool) -> None:
        # The first use is the one that says whether this run built the artifact; later reuses
        # within the same run (e.g. by the evaluation) are hits by construction.
        self.record.setdefault(kind, {"key": key, "hit": hit})

    # -- corpus and questions ----------------------------------------------------------------

    def inputs(self, corpus: Corpus, questions: QuestionSet) -> tuple[list[Document], list[str], list[QAItem]]:
        """(all documents, skipped inputs, all questions), parsed once per process per inputs'
        fingerprints (file listings, sizes and mtimes, computed anew by every job, so a changed
        file is read anew)."""
        memo_key = make_key("inputs", {"corpus": corpus.fingerprint(), "qa": questions.fingerprint()})
        found = self.cache.memory.get("inputs", memo_key)
        if found is not None:
            return found
        docs, skipped = load_corpus(corpus, self.cache)
        qa = questions.load()  # checked against the corpus in rag/run/preflight.py
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
            n_docs = writer.add_all(stream, chunker.split, chunk_store.SHARD_DOCS)
            if writer.n == 0:
                raise RagError("chunker produced no chunks: every document is empty")
            return {**writer.finish(n_docs, tmp), "resumed_docs": resumed}

        art = self.cache.get_or_build("chunks", key, build, inputs={"chunker": chunker_cfg, "corpus": corpus_fp})
        old = old_chunks(art)  # a cache written before the store
        chunks: Sequence[Chunk] = ChunkStore(art.path) if old is None else old
        self.chunk_set = self.cache.memory.put("chunks", key, ChunkSet(key, chunks))
        self._note("chunks", key, art.hit)
        return self.chunk_set

    # -- vectors, indexes ------------------------------------------------------------------------

    def _texts_key(self, indexed: bool) -> dict[str, str]:
        return self.chunked.indexed_key() if indexed else {"chunks": self.chunked.key}

    def vectors_key(self, embedder: Embedder, indexed: bool = True) -> str:
        """`indexed`: of the texts the pipeline indexes (with chunker.contextualize's prefixes);
        else of the chunks' own texts (what the evaluation embedder encodes). An embedder still
        choosing its backend (`backend: auto`) may first settle on one whose vectors of these texts
        are already made: reading beats encoding on any backend."""
        texts = self._texts_key(indexed)
        embedder.prefer_cached(lambda ident: self.cache.available("vectors", make_key("vectors", ident, texts)))
        return make_key("vectors", embedder.id, texts)

    def vectors(self, embedder: Embedder, indexed: bool = True) -> np.ndarray:
        """float32 [n_chunks, dim], memory-mapped from the cache."""
        key = self.vectors_key(embedder, indexed)
        inputs = self._texts_key(indexed)

        def build(tmp: Path) -> dict:
            if embedder.vectors_by_id:  # embedder=precomputed: nothing encoded
                out = np.lib.format.open_memmap(tmp / VECTORS_FILE, mode="w+", dtype=np.float32,
                                                shape=(len(self.chunked), embedder.dim))
                stats = embedder.write_vectors(self.chunked.id_batches(npy_writer.ENCODE_BLOCK * 8), out)
                out.flush()
                chunks = self.chunked.chunks
                for start in range(0, len(out), npy_writer.ENCODE_BLOCK):  # what is stored, as encoded vectors are
                    rows = np.arange(start, min(len(out), start + npy_writer.ENCODE_BLOCK))
                    npy_writer.refuse_unusable(embedder, out[rows], rows, lambda r: f"chunk {chunks[r].id!r}")
                del out
                return {**stats, "embedder": json.loads(json.dumps(embedder.id))}
            texts = self.chunked.indexed_texts if indexed else self.chunked.texts
            return encode_to_npy(embedder, texts, tmp / VECTORS_FILE, resume=self.cache.partial("vectors", key))

        with self.timer.stage("embed"):
            art = self.cache.get_or_build("vectors", key, build, inputs={**inputs, **embedder.id})
        self._note("vectors", key, art.hit)
        vecs = np.load(art.file(VECTORS_FILE), mmap_mode="r", allow_pickle=False)
        if vecs.shape[0] != len(self.chunked):
            raise RagError(f"cached vectors {art.path} hold {vecs.shape[0]} rows for {len(self.chunked)} chunks")
        return vecs

    def vector_index(self, embedder: Embedder, index: VectorIndex) -> tuple[VectorIndex, str]:
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
        key = make_key("bm25", bm25.params, self.chunked.indexed_key())
        with self.timer.stage("bm25"):
            if not bm25.persistent:
                # rank_bm25 has no file format; it is rebuilt in memory (it is the slow reference).
                bm25.build(self.chunked.indexed_texts)
                self._note("bm25", key, False)
                return bm25, key

            def build(tmp: Path) -> dict:
                # Streamed from the chunk store in batches, in bounded memory, into the files
                # bm25s saves (the same arrays to the bit); resumable from the partial directory.
                bm25.build_stream(self.chunked.indexed_batches(), tmp, work=self.cache.partial("bm25", key))
                return dict(bm25.built)

            art = self.cache.get_or_build("bm25", key, build, inputs=bm25.params)
            if art.hit or bm25.mmap:  # mmap: the built arrays give way to the saved files, mapped
                bm25.load(art.path)
        self._note("bm25", key, art.hit)
        return bm25, key

    # -- answers ---------------------------------------------------------------------------------

    def answers(self, generator: Generator, queries: list[str], contexts: list[list[Context]]) -> Answers | None:
        """Answers are keyed by the generator's settings and the exact prompts' inputs, so a sweep
        that changes nothing upstream of generation (e.g. eval thresholds) reuses them, and any
        change in the contexts generates anew. A resumable generator's answers are also recorded
        one by one as they arrive (rag.llm.answer_cache), so a run that fails mid-way resumes.
        None for llm=none."""
        if isinstance(generator, NoGenerator):
            return None
        key = answers_key(generator, queries, contexts)
        try:
            art = self.cache.get_or_build("answers", key, lambda tmp: self._generate(generator, queries, contexts, tmp),
                                          inputs={"generator": generator.id})
        except _Withheld as w:
            self._note("answers", key, False)
            data, stats = w.payload, w.stats
            hit = False
        else:
            self._note("answers", key, art.hit)
            data, stats, hit = json.loads(art.file(ANSWERS_FILE).read_text()), art.manifest, art.hit
            empty = sum(1 for a in data["answers"] if not str(a).strip())
            if hit and empty:  # said by every run that reads them, as by the run that generated them
                log.warning("llm: %d of %d answers read from the cache (%s) are empty; they are scored as empty "
                            "strings (remove that directory to generate them again)", empty, len(queries), art.path)
        return Answers(data["answers"], np.asarray(data["latency_ms"], float), key, hit, data.get("details"),
                       requests=0 if hit else int(stats.get("requests", 0)),
                       resumed=len(queries) if hit else int(stats.get("resumed", 0)),
                       stopped=stopped_answers(generator, len(data["answers"]), data.get("details"),
                                               stats.get("stopped")),
                       withheld=int(stats.get("withheld", 0)))

    def _generate(self, generator: Generator, queries: list[str], contexts: list[list[Context]],
                  tmp: Path) -> dict[str, Any]:
        t0 = time.perf_counter()
        details: list[dict[str, Any]] | None = None
        counts: dict[str, int] = {}
        answers: list[str] | None
        if generator.resumable:
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
        withheld = Counter(str(d["withheld"]) for d in details or [] if d.get("withheld"))
        kept = [a for i, a in enumerate(answers) if details is None or not details[i].get("withheld")]
        empty = sum(1 for a in kept if not a.strip())
        if empty:
            log.warning("llm returned %d empty answer(s); they are scored as empty strings", empty)
        if details is not None:  # requests: each its own wall time
            per_q = [d.pop("latency_ms") for d in details]
        else:  # batches: each question is charged its batch's share of the time
            per_q = generator.last_latencies_ms or [1000.0 * seconds / len(queries)] * len(queries)
        payload = {"answers": answers, "latency_ms": list(per_q), **({"details": details} if details is not None else {})}
        usage = {"usage": usage_totals(details)} if details is not None else {}
        last = generator.last_stopped
        stopped = {"stopped": sum(last)} if details is None and last is not None and len(last) == len(answers) else {}
        stats = {"n": len(answers), "empty": empty, "seconds": round(seconds, 3), **counts, **usage, **stopped}
        if withheld:
            why = ", ".join(f"{n} {reason}" for reason, n in sorted(withheld.items()))
            log.warning("llm: %d of %d replies held no answer (%s); they are scored as empty answers and not cached, "
                        "so a rerun asks for them again", sum(withheld.values()), len(answers), why)
            raise _Withheld(payload, {**stats, "withheld": sum(withheld.values())})
        (tmp / ANSWERS_FILE).write_text(json.dumps(payload, ensure_ascii=False))
        return stats


def stopped_answers(generator: Generator, n: int, details: list[dict[str, Any]] | None,
                    counted: Any) -> Stopped | None:
    """How many answers stopped at the generator's token limit: a served answer by its
    `finish_reason` ("length"), an in-process one as its generator counted it (`counted`, kept in
    the artifact's manifest); None where the generator has no limit or did not say."""
    limit = generator.token_limit
    if limit is None:
        return None
    if details is not None:
        stopped = sum(1 for d in details if d.get("finish_reason") == "length")
    elif isinstance(counted, int) and not isinstance(counted, bool):
        stopped = counted
    else:
        return None
    return Stopped(stopped, n, *limit)


def answers_key(generator: Generator, queries: list[str], contexts: list[list[Context]]) -> str:
    h = hashlib.sha256()
    for query, ctx in zip(queries, contexts):
        h.update(prompt_inputs(query, ctx).encode())
    return make_key("answers", generator.id, {"inputs": h.hexdigest()})
