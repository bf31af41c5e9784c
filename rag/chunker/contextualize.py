"""Contextual chunking (`chunker.contextualize`): what a chunk is indexed with besides its own text.

A chunk cut from the middle of a document often never names what it is about ("The call fails
with EBADF when..."): the man page, the PyTorch object or the article it belongs to is in the
document's title, not in the chunk. Contextualization puts a line before each chunk's text for
the pipeline's embedder and BM25 (the "contextual chunking" of the reference design's RAG V3):

- `title`: the document's label and title, "man page fcntl(2): fcntl - manipulate file
  descriptor", "PyTorch torch.nn.Dropout", "PubMed PMID 21645374" (PubMedQA's records carry no
  titles);
- `llm`: one or two sentences an LLM writes from the document's opening and the chunk
  (`LLMContextualizer`, conf/contextualizer/llm.yaml; any generator, `llm=openai` included), each
  recorded in the artifact cache (kind `chunk_context`, keyed by the generator, its prompt and the
  text it read), so only new chunks are ever asked about.

The chunk itself is unchanged: the contexts the LLM reads, the reranker's passages and every
metric use the chunk's own text, so a run with and without contextualization differs only in what
was searched.
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import Any

from rag.store.cache import ArtifactCache, make_key
from rag.llm.base import Generator, generate_each
from rag.config.schema import PositiveInt, checked
from rag.types import Chunk, Context, Document, RagError

log = logging.getLogger(__name__)

MODES = ("none", "title", "llm")
CONTEXTS = "chunk_context"  # record kind: the LLM's context line for one chunk


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise RagError(f"chunker.contextualize must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def title_of(doc: Document) -> str:
    """The document's label (rag.context.source_label) and, when its record has one, its title."""
    from rag.context import source_label

    label = source_label(doc.id)
    title = doc.meta.get("title") if isinstance(doc.meta, dict) else None
    title = " ".join(str(title).split()) if title else ""
    return f"{label}: {title}" if title and title != label else label


def prefixes(mode: str, docs: Sequence[Document], chunks: Sequence[Chunk],
             contextualizer: LLMContextualizer | None = None, cache: ArtifactCache | None = None) -> list[str] | None:
    """Per chunk, the line indexed before its text (None: `none`, the chunk's text alone)."""
    if check_mode(mode) == "none":
        return None
    if mode == "llm":
        if contextualizer is None or cache is None:
            raise ValueError("chunker.contextualize=llm needs the contextualizer and the artifact cache")
        return contextualizer.lines(docs, chunks, cache)
    titles = {d.id: title_of(d) for d in docs}
    return [titles.get(c.doc_id, c.doc_id) for c in chunks]


class LLMContextualizer:
    """`chunker.contextualize=llm`: a generator reads the document's first `document_chars`
    characters (as its one context passage) and the chunk (as its question) and writes the line
    indexed before the chunk, cut to `max_chars`. Served generators get every missing chunk at once
    (their requests run concurrently, each answer on its own); in-process ones one chunk at a time,
    because a batch's padding can change a greedy answer and each line is recorded on its own."""

    @checked("contextualizer")
    def __init__(self, llm: Generator, document_chars: PositiveInt = 2000, max_chars: PositiveInt = 300):
        if not isinstance(llm, Generator):
            raise RagError("contextualizer.llm must be a generator config (an llm/ option, e.g. smollm2 or openai)")
        self.llm, self.document_chars, self.max_chars = llm, document_chars, max_chars
        self.endpoint = llm.endpoint  # served through its generator
        self.stats = {"chunks": 0, "generated": 0, "from_cache": 0, "empty": 0}

    def use_cache(self, cache: Any) -> None:
        from rag.store.models import use_cache

        use_cache(self.llm, cache)  # the generator's own model artifacts (the GGUF conversion)

    @property
    def id(self) -> dict[str, Any]:
        return {"llm": self.llm.id, "document_chars": self.document_chars, "max_chars": self.max_chars}

    @property
    def tag(self) -> str:
        """What the indexed texts are keyed by (ChunkSet.context): the mode and this identity."""
        return "llm:" + make_key("context", self.id)[:16]

    def request(self, doc: Document, chunk: Chunk) -> tuple[str, list[Context]]:
        """The generator's (question, contexts) for one chunk."""
        return chunk.text, [Context(doc.text[: self.document_chars])]

    def key(self, doc: Document, chunk: Chunk) -> str:
        opening = hashlib.sha256(doc.text[: self.document_chars].encode("utf-8", "surrogatepass")).hexdigest()
        return make_key(CONTEXTS, self.id, {"document": opening, "chunk": chunk.text})

    def missing(self, docs: Sequence[Document], chunks: Sequence[Chunk], cache: ArtifactCache) -> list[int]:
        """Rows of the chunks whose line is not recorded yet."""
        by_id = {d.id: d for d in docs}
        return [i for i, c in enumerate(chunks) if cache.get_record(CONTEXTS, self.key(by_id[c.doc_id], c)) is None]

    def lines(self, docs: Sequence[Document], chunks: Sequence[Chunk], cache: ArtifactCache) -> list[str]:
        by_id = {d.id: d for d in docs}
        keys = [self.key(by_id[c.doc_id], c) for c in chunks]
        found: dict[int, str] = {}
        for i, k in enumerate(keys):
            rec = cache.get_record(CONTEXTS, k)
            if rec is not None:
                found[i] = rec["line"]
        todo = [i for i in range(len(keys)) if i not in found]
        self.stats.update(chunks=len(chunks), from_cache=len(chunks) - len(todo))
        if todo:
            log.info("contextualize: asking the LLM about %d of %d chunks", len(todo), len(chunks))

            def record(j: int, reply: str) -> None:
                i = todo[j]
                found[i] = " ".join(reply.split())[: self.max_chars]
                cache.put_record(CONTEXTS, keys[i], {"line": found[i]})
                self.stats["generated"] += 1

            generate_each(self.llm, [self.request(by_id[chunks[i].doc_id], chunks[i]) for i in todo], record)
        out = [found.get(i, "") for i in range(len(keys))]  # a reply that held no answer: no line, and not recorded
        self.stats["empty"] = sum(1 for line in out if not line)
        return out
