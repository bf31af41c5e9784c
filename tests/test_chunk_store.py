"""The chunks artifact on disk (rag/store/chunk_store.py): what is written is read back row by row, a
build killed part-way resumes from its last finished shard, and a chunk set over the store
answers every question a list of chunks answers."""
import json

import numpy as np
import pytest

from rag.store import chunk_store
from rag.run.artifacts import Artifacts
from rag.store.chunk_set import ChunkSet
from rag.corpus.loading import load_corpus
from rag.store.cache import ArtifactCache
from rag.store.chunk_store import ChunkStore, ChunkWriter, DocumentStore
from rag.chunker.sliding_window import SlidingWindowChunker
from rag.context import ContextBuilder
from rag.corpus.jsonl import JsonlCorpus
from rag.types import Chunk, Document, Hits, make_chunk

DOCS = [Document(f"d{i}", ("Grüße, naïve café — " * (i % 4 + 1)) + f"document {i} " + "word " * (i % 50),
                 ("pubmed", "libc", "pytorch")[i % 3]) for i in range(120)]
CFG = {"_target_": "sliding_window", "chunk_size": 40, "chunk_overlap": 10}


def chunker():
    return SlidingWindowChunker(chunk_size=40, chunk_overlap=10)


def all_chunks(docs=DOCS):
    return [c for d in docs for c in chunker().split(d)]


def test_every_chunk_reads_back_as_written(tmp_path):
    chunks = all_chunks() + [Chunk("x#0", "x", "with meta", "libc", 0, 9, 0, {"title": "T"})]
    writer = ChunkWriter(tmp_path / "w")
    for c in chunks:
        writer.add(c)
    (tmp_path / "out").mkdir()
    assert writer.finish(len(DOCS) + 1, tmp_path / "out") == {"n_chunks": len(chunks), "n_docs": len(DOCS) + 1}
    store = ChunkStore(tmp_path / "out")
    assert len(store) == len(chunks)
    assert list(store) == chunks
    assert store[-1].meta == {"title": "T"} and store[3] == chunks[3]
    assert store.texts(5, 17) == [c.text for c in chunks[5:17]]
    assert store.ids(0, 4) == [c.id for c in chunks[:4]]
    with pytest.raises(IndexError):
        store[len(chunks)]


def test_a_writer_reopened_after_a_kill_keeps_the_recorded_shards_only(tmp_path):
    chunks = all_chunks()
    w = ChunkWriter(tmp_path)
    for c in chunks[:30]:
        w.add(c)
    w.checkpoint(docs_done=7)
    for c in chunks[30:40]:  # rows never recorded: a kill came before the next checkpoint
        w.add(c)
    w._append("text.bin", b"half a shard")
    again = ChunkWriter(tmp_path)
    assert (again.docs_done, again.n) == (7, 30)
    for c in chunks[30:]:
        again.add(c)
    (tmp_path / "out").mkdir()
    again.finish(len(DOCS), tmp_path / "out")
    assert list(ChunkStore(tmp_path / "out")) == chunks


def test_an_unreadable_progress_record_starts_over(tmp_path):
    w = ChunkWriter(tmp_path)
    for c in all_chunks()[:10]:
        w.add(c)
    w.checkpoint(3)
    (tmp_path / "progress.json").write_text("{not json")
    assert (ChunkWriter(tmp_path).docs_done, ChunkWriter(tmp_path).n) == (0, 0)
    assert (tmp_path / "text.bin").stat().st_size == 0


def test_a_chunking_killed_part_way_resumes_from_its_last_shard(tmp_path, monkeypatch):
    monkeypatch.setattr(chunk_store, "SHARD_DOCS", 25)
    fed = []

    def stream(stop_after=None):
        for i, d in enumerate(DOCS):
            if i == stop_after:
                raise KeyboardInterrupt  # stands in for SIGKILL: the process ends mid-stream
            fed.append(d.id)
            yield d

    cache = ArtifactCache(tmp_path / "cache")
    with pytest.raises(KeyboardInterrupt):
        Artifacts(cache).chunks(chunker(), CFG, stream(stop_after=90), corpus_fp="fp")
    split = []
    monkeypatch.setattr(SlidingWindowChunker, "split", lambda self, doc, _s=SlidingWindowChunker.split: split.append(doc.id) or _s(self, doc))
    arts = Artifacts(cache)
    chunk_set = arts.chunks(chunker(), CFG, stream(), corpus_fp="fp")
    assert split == [d.id for d in DOCS[75:]]  # three shards of 25 were stored before the kill
    assert list(chunk_set.chunks) == all_chunks()
    manifest = cache.lookup("chunks", chunk_set.key).manifest
    assert manifest["resumed_docs"] == 75 and manifest["n_chunks"] == len(all_chunks())
    assert not any(p.name.startswith(".partial") for p in (tmp_path / "cache" / "chunks").iterdir())


def test_a_chunk_set_over_the_store_answers_as_one_over_a_list(tmp_path):
    stored = Artifacts(ArtifactCache(tmp_path)).chunks(chunker(), CFG, DOCS)
    listed = ChunkSet("k", all_chunks())
    assert isinstance(stored.chunks, ChunkStore)
    assert stored.texts == listed.texts and stored.indexed_texts == listed.indexed_texts
    assert [t for b in stored.indexed_batches(7) for t in b] == listed.texts
    assert [i for b in stored.id_batches(7) for i in b] == [c.id for c in listed.chunks]
    assert list(stored.sources) == list(listed.sources)
    for filt in (frozenset({"libc"}), frozenset({"pubmed", "pytorch"}), frozenset({"none"})):
        np.testing.assert_array_equal(stored.rows_of_sources(filt), listed.rows_of_sources(filt))
    for row in range(0, len(listed), 7):
        for pos in range(-1, 4):
            assert stored.neighbour(row, pos) == listed.neighbour(row, pos)
    hits = Hits.from_rows([[(5, 1.0), (40, 0.5), (41, 0.4)]], 3)
    builder = ContextBuilder(expand_neighbors=2, labels=True)
    assert builder.build(hits, stored) == builder.build(hits, listed)


def test_a_cache_written_before_the_store_is_still_read(tmp_path):
    cache = ArtifactCache(tmp_path)
    chunk_set = Artifacts(cache).chunks(chunker(), CFG, DOCS)
    art = cache.lookup("chunks", chunk_set.key)

    def old_format(tmp):
        with open(tmp / "chunks.jsonl", "w") as f:
            f.writelines(json.dumps(c.to_json()) + "\n" for c in all_chunks())

    cache2 = ArtifactCache(tmp_path / "old")
    cache2.get_or_build("chunks", chunk_set.key, old_format)
    again = Artifacts(cache2).chunks(chunker(), CFG, DOCS)
    assert art is not None and isinstance(again.chunks, list) and again.chunks == all_chunks()


def test_a_chunk_id_that_is_not_doc_id_and_position_is_refused(tmp_path):
    doc = Document("d", "text", "libc")
    with pytest.raises(ValueError, match="not doc_id#position"):
        ChunkWriter(tmp_path).add(Chunk("other", "d", "text", "libc", 0, 4, 0))
    ChunkWriter(tmp_path).add(make_chunk(doc, 0, 4, 0))


def test_a_corpus_is_streamed_into_a_document_store_and_read_back_whole(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"id": d.id, "text": d.text, "source": d.source, "year": i, "tags": ["a", "b"]})
                            + "\n" for i, d in enumerate(DOCS)))
    corpus = JsonlCorpus(path)
    docs, skipped = load_corpus(corpus, ArtifactCache(tmp_path / "cache"))
    assert isinstance(docs, DocumentStore) and skipped == []
    assert list(docs) == corpus.load()  # ids, texts, sources and metadata
    assert docs[7].meta == {"year": 7, "tags": ["a", "b"]}


def test_a_corpus_read_killed_part_way_goes_on_from_its_last_shard(tmp_path, monkeypatch):
    monkeypatch.setattr(chunk_store, "SHARD_DOCS", 20)

    class Flaky(JsonlCorpus):
        fail_at: int | None = 50

        def iter_documents(self):
            for i, d in enumerate(super().iter_documents()):
                if i == self.fail_at:
                    raise KeyboardInterrupt
                yield d

    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"id": d.id, "text": d.text, "source": d.source}) + "\n" for d in DOCS))
    cache = ArtifactCache(tmp_path / "cache")
    with pytest.raises(KeyboardInterrupt):
        load_corpus(Flaky(path), cache)
    corpus = Flaky(path)
    corpus.fail_at = None
    docs, _ = load_corpus(corpus, cache)
    assert list(docs) == JsonlCorpus(path).load()
    (manifest,) = (tmp_path / "cache" / "corpus").glob("*/manifest.json")
    assert json.loads(manifest.read_text())["n_docs"] == len(DOCS)
    assert json.loads(manifest.read_text())["resumed_docs"] == 40
