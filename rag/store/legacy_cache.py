"""Corpus and chunk artifacts in the format before rag/store/chunk_store.py: one JSON object a line,
docs.jsonl (a Document each) and chunks.jsonl (a Chunk each). The format is no part of an
artifact's key, so a cache written by those versions still hits; its entries are read here, whole
into memory as they always were, rather than built again. Nothing writes this format any more."""
from __future__ import annotations

import json

from rag.store.cache import Artifact
from rag.types import Chunk, Document

DOCS_FILE = "docs.jsonl"
CHUNKS_FILE = "chunks.jsonl"


def old_documents(art: Artifact) -> list[Document] | None:
    """The documents of a corpus artifact in the old format; None for one in the store's."""
    if not art.file(DOCS_FILE).exists():
        return None
    with open(art.file(DOCS_FILE), encoding="utf-8") as f:
        return [Document.from_json(json.loads(line)) for line in f]


def old_chunks(art: Artifact) -> list[Chunk] | None:
    """The chunks of a chunks artifact in the old format; None for one in the store's."""
    if not art.file(CHUNKS_FILE).exists():
        return None
    with open(art.file(CHUNKS_FILE), encoding="utf-8") as f:
        return [Chunk.from_json(json.loads(line)) for line in f]
