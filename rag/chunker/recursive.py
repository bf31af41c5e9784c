"""LangChain-style recursive splitting, on character offsets.

Written here instead of using `langchain-text-splitters`' RecursiveCharacterTextSplitter because
that one returns strings (re-joined and stripped, so a chunk can only be located in the document by
searching for it, which is ambiguous for repeated text) and pulls in langchain-core; we need every
chunk to be exactly `doc.text[start:end]` and want no heavy dependency for forty lines of logic.
"""
from __future__ import annotations

from collections.abc import Sequence

from rag.chunker.base import BaseChunker, Span, check_overlap, spans_to_chunks, text_bounds, trim_span, window_spans
from rag.config.schema import NonNegativeInt, PositiveInt, Separators, checked
from rag.types import Chunk, Document

DEFAULT_SEPARATORS = ("\n\n", "\n", ". ", " ", "")


class RecursiveChunker(BaseChunker):
    """Split with the first separator that occurs in the text; pieces longer than `chunk_size` are
    split again with the following separators (the empty separator, and running out of separators,
    mean fixed character windows); consecutive pieces are merged up to `chunk_size` characters, each
    chunk starting with the trailing pieces of the previous one that fit in `chunk_overlap`
    characters. A separator stays with the piece before it, so ". " keeps a sentence's period."""

    @checked("chunker")
    def __init__(
        self,
        chunk_size: PositiveInt = 512,
        chunk_overlap: NonNegativeInt = 64,
        separators: Separators = DEFAULT_SEPARATORS,
    ):
        self.chunk_size = chunk_size
        self.chunk_overlap = chunk_overlap
        self.separators = tuple(separators)
        self._validate()

    def _validate(self) -> None:
        check_overlap(self.chunk_overlap, self.chunk_size)

    def split(self, doc: Document) -> list[Chunk]:
        bounds = text_bounds(doc.text)
        if bounds is None:
            return []
        return spans_to_chunks(doc, self._split(doc.text, *bounds, self.separators))

    def _split(self, text: str, start: int, end: int, separators: Sequence[str]) -> list[Span]:
        for i, sep in enumerate(separators):
            if sep and text.find(sep, start, end) != -1:
                rest = separators[i + 1:]
                break
            if not sep:
                return window_spans(start, end, self.chunk_size, self.chunk_overlap)
        else:
            return window_spans(start, end, self.chunk_size, self.chunk_overlap)

        out: list[Span] = []
        small: list[Span] = []
        for s, e in _pieces(text, start, end, sep):
            if e - s <= self.chunk_size:
                small.append((s, e))
                continue
            out += self._merge(small)
            small = []
            out += self._split(text, s, e, rest)
        out += self._merge(small)
        return out

    def _merge(self, pieces: list[Span]) -> list[Span]:
        size, overlap = self.chunk_size, self.chunk_overlap
        out: list[Span] = []
        cur: list[Span] = []
        for piece in pieces:
            if cur and piece[1] - cur[0][0] > size:
                out.append((cur[0][0], cur[-1][1]))
                # keep a tail of at most `overlap` characters that leaves room for the new piece
                while cur and (cur[-1][1] - cur[0][0] > overlap or piece[1] - cur[0][0] > size):
                    cur.pop(0)
            cur.append(piece)
        if cur:
            out.append((cur[0][0], cur[-1][1]))
        return out


def _pieces(text: str, start: int, end: int, sep: str) -> list[Span]:
    out: list[Span] = []
    pos = start
    while (k := text.find(sep, pos, end)) != -1:
        span = trim_span(text, pos, k + len(sep))
        if span is not None:
            out.append(span)
        pos = k + len(sep)
    span = trim_span(text, pos, end)
    if span is not None:
        out.append(span)
    return out
