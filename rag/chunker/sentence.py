"""Consecutive sentences packed up to a character budget."""
from __future__ import annotations

from rag.chunker.base import BaseChunker, check_overlap, fit_spans, pack_spans, sentence_spans, spans_to_chunks
from rag.config.schema import NonNegativeInt, PositiveInt, checked
from rag.types import Chunk, Document


class SentenceChunker(BaseChunker):
    """Chunks of whole sentences, at most `chunk_size` characters; the last `chunk_overlap`
    sentences of a chunk are repeated at the start of the next one (fewer when they would leave no
    room for a new sentence). A sentence longer than `chunk_size` is cut into pieces that are
    packed like sentences. See `base.sentence_spans` for the splitting rules."""

    @checked("chunker")
    def __init__(self, chunk_size: PositiveInt = 512, chunk_overlap: NonNegativeInt = 1):
        self.chunk_size = chunk_size
        self.chunk_overlap = chunk_overlap
        self._validate()

    def _validate(self) -> None:
        # counted in sentences, but still bounded by chunk_size: more sentences than characters
        # can never fit, so such a value is a config mistake (most likely a character count)
        check_overlap(self.chunk_overlap, self.chunk_size, unit=" sentences")

    def split(self, doc: Document) -> list[Chunk]:
        units = fit_spans(doc.text, sentence_spans(doc.text), self.chunk_size)
        return spans_to_chunks(doc, pack_spans(units, self.chunk_size, self.chunk_overlap))
