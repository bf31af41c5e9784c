"""A configured corpus read through the artifact cache into a document store (`load_corpus`)."""
from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rag.store import chunk_store
from rag.store.cache import ArtifactCache, make_key
from rag.store.chunk_store import ChunkWriter, DocumentStore, document_row
from rag.corpus.base import Corpus
from rag.corpus.slicing import check_unique_ids
from rag.store.legacy_cache import old_documents
from rag.types import Document

log = logging.getLogger(__name__)


def load_corpus(corpus: Corpus, cache: ArtifactCache) -> tuple[Sequence[Document], list[str]]:
    """(documents, skipped inputs). Rendering man pages or walking torch's docstrings takes tens
    of seconds, so every corpus (each part of a mixed corpus on its own) is cached under the key
    of its `fingerprint()`. The documents are streamed from the reader into a store read by row
    (rag/store/chunk_store.py), never held whole: a corpus of millions of abstracts is returned as a
    `DocumentStore`. The store records its progress every SHARD_DOCS documents, so a read killed
    part-way goes on from there (the documents before it are parsed again, not stored again)."""
    if corpus.parts:
        docs: list[Document] = []
        skipped: list[str] = []
        for part in corpus.parts:
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
        stored = writer.finish(writer.add_all(corpus.iter_documents(), document_row, chunk_store.SHARD_DOCS), tmp)
        return {"n_docs": stored["n_docs"], "resumed_docs": resumed, "skipped": list(corpus.skipped)}

    art = cache.get_or_build("corpus", key, build, inputs=fingerprint)
    old = old_documents(art)  # a cache written before the store
    loaded: Sequence[Document] = DocumentStore(art.path) if old is None else old
    log.info("corpus %s: %d documents (%s)", type(corpus).__name__, len(loaded), "cached" if art.hit else "built")
    return loaded, list(art.manifest.get("skipped", []))


def load_parts(corpus: Corpus, cache: ArtifactCache) -> list[tuple[Corpus, Sequence[Document]]]:
    """Each corpus that reads inputs of its own (a mixed corpus's parts, in order, or the corpus
    itself) with its documents as `load_corpus` reads them: what a fitted part records it learnt
    from, part by part (rag/run/fitted.py)."""
    if not corpus.parts:
        return [(corpus, load_corpus(corpus, cache)[0])]
    return [leaf for part in corpus.parts for leaf in load_parts(part, cache)]
