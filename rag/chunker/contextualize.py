"""Contextual chunking (`chunker.contextualize`): what a chunk is indexed with besides its own text.

A chunk cut from the middle of a document often never names what it is about ("The call fails
with EBADF when..."): the man page, the PyTorch object or the article it belongs to is in the
document's title, not in the chunk. `title` puts the document's label and title on a line before
each chunk's text for the pipeline's embedder and BM25 (the "contextual chunking" of the reference
design's RAG V3, without an LLM): "man page fcntl(2): fcntl - manipulate file descriptor",
"PyTorch torch.nn.Dropout", "PubMed PMID 21645374" (PubMedQA's records carry no titles). The chunk
itself is unchanged: the contexts the LLM reads, the reranker's passages and every metric use the
chunk's own text, so a run with and without contextualization differs only in what was searched.
"""
from __future__ import annotations

from rag.types import Chunk, Document, RagError

MODES = ("none", "title")


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


def prefixes(mode: str, docs: list[Document], chunks: list[Chunk]) -> list[str] | None:
    """Per chunk, the line indexed before its text (None: `none`, the chunk's text alone)."""
    if check_mode(mode) == "none":
        return None
    titles = {d.id: title_of(d) for d in docs}
    return [titles.get(c.doc_id, c.doc_id) for c in chunks]
