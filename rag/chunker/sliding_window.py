"""Fixed windows of characters: the "basic" v1 chunker and the baseline the others are compared to."""
from __future__ import annotations

from rag.chunker.base import BaseChunker, check_overlap, spans_to_chunks, text_bounds, window_spans
from rag.config.schema import NonNegativeInt, PositiveInt, checked
from rag.types import Chunk, Document


class SlidingWindowChunker(BaseChunker):
    """Windows of `chunk_size` characters every `chunk_size - chunk_overlap` characters. Windows
    cut through words on purpose: this is the plain baseline, not a smart splitter."""

    @checked("chunker")
    def __init__(self, chunk_size: PositiveInt = 512, chunk_overlap: NonNegativeInt = 64):
        self.chunk_size = chunk_size
        self.chunk_overlap = chunk_overlap
        self._validate()

    def _validate(self) -> None:
        check_overlap(self.chunk_overlap, self.chunk_size)

    def split(self, doc: Document) -> list[Chunk]:
        bounds = text_bounds(doc.text)
        if bounds is None:
            return []
        return spans_to_chunks(doc, window_spans(*bounds, self.chunk_size, self.chunk_overlap))
