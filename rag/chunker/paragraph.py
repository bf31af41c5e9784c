"""Consecutive paragraphs (blank-line separated) packed up to a character budget."""
from __future__ import annotations

from rag.chunker.base import (
    BaseChunker,
    Span,
    fit_spans,
    pack_spans,
    paragraph_spans,
    sentence_spans,
    spans_to_chunks,
)
from rag.config.schema import PositiveInt, checked
from rag.types import Chunk, Document


class ParagraphChunker(BaseChunker):
    """Chunks of whole paragraphs, at most `chunk_size` characters. A paragraph longer than that
    gets chunks of its own, made of packed sentences (and character pieces of overlong ones), so
    that a chunk never mixes the tail of a long paragraph with its neighbours."""

    @checked("chunker")
    def __init__(self, chunk_size: PositiveInt = 1024):
        self.chunk_size = chunk_size

    def split(self, doc: Document) -> list[Chunk]:
        text, size = doc.text, self.chunk_size
        out: list[Span] = []
        run: list[Span] = []  # consecutive paragraphs that fit
        for start, end in paragraph_spans(text):
            if end - start <= size:
                run.append((start, end))
                continue
            out += pack_spans(run, size)
            run = []
            out += pack_spans(fit_spans(text, sentence_spans(text, start, end), size), size)
        out += pack_spans(run, size)
        return spans_to_chunks(doc, out)
