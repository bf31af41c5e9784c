"""What every chunker shares: the `Chunker` protocol, argument checks and span helpers.

Chunkers work on character spans `(start, end)` of `doc.text` and only turn them into `Chunk`s at
the very end (`spans_to_chunks`), so that `chunk.text == doc.text[chunk.start:chunk.end]` holds by
construction: whitespace is trimmed by moving the offsets, never by editing the text.
"""
from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from rag.config.schema import check_arguments
from rag.types import Chunk, Document, RagError, make_chunk

Span = tuple[int, int]


@runtime_checkable
class Chunker(Protocol):
    """What the runner asks of a chunker: a `chunk_size` and `split`. Subclass `BaseChunker`,
    which checks the constructor's arguments and gives `with_chunk_size`."""

    chunk_size: int

    def split(self, doc: Document) -> list[Chunk]:
        """Cuts one document into chunks. Required.

        The runner calls it once per document of the slice (the chunks are cached by the
        chunker's settings and the documents' content), before anything is embedded.

        Args:
            doc: The document: `doc.id`, `doc.text`, `doc.source` (its group tag) and metadata.

        Returns:
            The document's chunks in reading order, numbered 0..n-1, each with
            `chunk.text == doc.text[chunk.start:chunk.end]`: build them from character spans
            with `spans_to_chunks(doc, spans)`, which trims whitespace by moving the offsets and
            numbers them. A blank document gives no chunk.

        Example:
            One chunk per paragraph:

                class Paragraphs(BaseChunker):
                    def __init__(self, chunk_size: int = 1024):
                        self.chunk_size = chunk_size

                    def split(self, doc):
                        starts = [0] + [m.end() for m in re.finditer(r"\\n\\s*\\n", doc.text)]
                        ends = starts[1:] + [len(doc.text)]
                        return spans_to_chunks(doc, zip(starts, ends))
        """
        ...


class BaseChunker:
    """Each argument is checked by its annotation's rule (`@checked("chunker")` on `__init__`);
    `_validate` checks what spans two arguments (an overlap below the size), separately so that
    `with_chunk_size` can re-check a copy with a different size."""

    chunk_size: int

    def split(self, doc: Document) -> list[Chunk]:
        """Cuts one document into chunks. Required.

        The runner calls it once per document of the slice (the chunks are cached by the
        chunker's settings and the documents' content), before anything is embedded.

        Args:
            doc: The document: `doc.id`, `doc.text`, `doc.source` (its group tag) and metadata.

        Returns:
            The document's chunks in reading order, numbered 0..n-1, each with
            `chunk.text == doc.text[chunk.start:chunk.end]`: build them from character spans
            with `spans_to_chunks(doc, spans)`, which trims whitespace by moving the offsets and
            numbers them. A blank document gives no chunk.

        Example:
            One chunk per paragraph:

                class Paragraphs(BaseChunker):
                    def __init__(self, chunk_size: int = 1024):
                        self.chunk_size = chunk_size

                    def split(self, doc):
                        starts = [0] + [m.end() for m in re.finditer(r"\\n\\s*\\n", doc.text)]
                        ends = starts[1:] + [len(doc.text)]
                        return spans_to_chunks(doc, zip(starts, ends))
        """
        raise NotImplementedError

    def _validate(self) -> None:
        """The checks that span two arguments (none here)."""

    def with_chunk_size(self, chunk_size: int) -> "BaseChunker":
        check_arguments(type(self).__init__, "chunker", {"chunk_size": chunk_size})
        other = copy.copy(self)
        other.chunk_size = chunk_size
        other._validate()
        return other

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


# ---------------------------------------------------------------------------------------------
# argument checks that span two arguments (messages name the config field, as the CLI user wrote it)


def check_overlap(overlap: int, chunk_size: int, unit: str = "") -> None:
    if overlap >= chunk_size:
        raise RagError(
            f"chunker.chunk_overlap ({overlap}{unit}) must be smaller than chunker.chunk_size ({chunk_size})"
        )


def check_chunker(name: str, value: Any) -> Any:
    # str has a .split too, and a chunker's name instead of its config is an easy YAML slip
    if isinstance(value, (str, bytes)) or not callable(getattr(value, "split", None)):
        raise RagError(f"{name} must be a chunker (an object with .split(doc)), got {type(value).__name__}")
    return value


# ---------------------------------------------------------------------------------------------
# spans -> chunks


def trim_span(text: str, start: int, end: int) -> Span | None:
    """Move start/end inwards past whitespace; None when nothing but whitespace is left."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None


def text_bounds(text: str) -> Span | None:
    """The span of `text` without its leading/trailing whitespace (None for blank text)."""
    return trim_span(text, 0, len(text))


def spans_to_chunks(doc: Document, spans: Iterable[Span]) -> list[Chunk]:
    """Trim each span, drop blank ones and ones lying inside the previous chunk (trimming can make
    an overlapping window collapse onto its predecessor), and number the rest 0..n-1."""
    chunks: list[Chunk] = []
    prev: Span | None = None
    for start, end in spans:
        span = trim_span(doc.text, start, end)
        if span is None:
            continue
        if prev is not None and prev[0] <= span[0] and span[1] <= prev[1]:
            continue
        chunks.append(make_chunk(doc, span[0], span[1], len(chunks)))
        prev = span
    return chunks


# ---------------------------------------------------------------------------------------------
# splitting and packing


def window_spans(start: int, end: int, size: int, overlap: int = 0) -> list[Span]:
    """Windows of `size` characters over [start, end) every `size - overlap` characters, stopping
    at the first one that reaches `end` (so the last window is never a suffix of the one before)."""
    out: list[Span] = []
    step = size - overlap
    while start < end:
        out.append((start, min(start + size, end)))
        if start + size >= end:
            break
        start += step
    return out


def hard_split(text: str, start: int, end: int, size: int) -> list[Span]:
    """Cut a span that is too long into trimmed pieces of at most `size` characters. A cut goes
    after the last whitespace of the window when that keeps at least half of it, so words are
    only broken when there is no space nearby (e.g. a URL or "x" * 5000)."""
    out: list[Span] = []
    span = trim_span(text, start, end)
    while span is not None:
        s, e = span
        if e - s <= size:
            out.append(span)
            break
        cut = s + size
        for k in range(s + size, s + size // 2, -1):
            if text[k - 1].isspace() or text[k].isspace():
                cut = k
                break
        piece = trim_span(text, s, cut)
        if piece is not None:
            out.append(piece)
        span = trim_span(text, cut, e)
    return out


def fit_spans(text: str, spans: Iterable[Span], size: int) -> list[Span]:
    """Trimmed spans, those longer than `size` replaced by their `hard_split` pieces."""
    out: list[Span] = []
    for s, e in spans:
        span = trim_span(text, s, e)
        if span is None:
            continue
        if span[1] - span[0] <= size:
            out.append(span)
        else:
            out.extend(hard_split(text, span[0], span[1], size))
    return out


def pack_spans(spans: list[Span], size: int, overlap: int = 0) -> list[Span]:
    """Greedily merge consecutive units (each at most `size` long) into spans of at most `size`
    characters, measured in the document (so the gaps between units count). The next span starts
    with up to `overlap` trailing units of the previous one, fewer when they would not leave room
    for at least one new unit: every span adds a unit, so packing always terminates."""
    out: list[Span] = []
    n = len(spans)
    first = 0
    while first < n:
        last = first  # inclusive
        while last + 1 < n and spans[last + 1][1] - spans[first][0] <= size:
            last += 1
        out.append((spans[first][0], spans[last][1]))
        if last + 1 >= n:
            break
        nxt = max(last + 1 - overlap, first + 1)
        while nxt <= last and spans[last + 1][1] - spans[nxt][0] > size:
            nxt += 1
        first = nxt
    return out


# ---------------------------------------------------------------------------------------------
# sentences and paragraphs
#
# A rule-based splitter rather than nltk's punkt: punkt needs its model downloaded at run time
# (`nltk.download("punkt")`), which is impossible on the offline machines this runs on, and a few
# regexes tuned for our sources (PubMed abstracts, man pages, API docs) do as well there.

# Lowercased words that take a period without ending a sentence (the word before the period, with
# inner periods kept: "e.g.", "et al." -> "al").
ABBREVIATIONS = frozenset(
    """
    e.g eg i.e ie al cf vs viz etc approx ca resp incl esp
    fig figs eq eqs ref refs tab sec secs ch chap vol vols no nos pp p ed eds suppl
    dr mr mrs ms prof st jr sr inc ltd co corp dept univ
    sp spp var subsp
    jan feb mar apr jun jul aug sep sept oct nov dec
    min max avg std approx
    """.split()
)

_TERMINATOR = re.compile(r"""(?:\.\.\.|…|[.!?])+["'”’)\]]*(?=\s|$)""")
_BLANK_LINE = re.compile(r"\n[ \t\r\f\v]*\n")
# A man-page section heading ("DESCRIPTION", "RETURN VALUE") stands alone on its line.
_HEADING_LINE = re.compile(r"^[ \t]*[A-Z][A-Z0-9 ,/&()_-]*[A-Z0-9)][ \t]*$", re.MULTILINE)
# A line that starts a list item or a command-line option ("-a, --all", "* item", "2) item").
_ITEM_LINE = re.compile(r"\n(?=[ \t]*(?:[-*•‣+][ \t]|--?[A-Za-z0-9]|\d{1,3}[.)][ \t]))")
_CALL = re.compile(r"[A-Za-z_][\w.]*\(")
_OPENERS = "\"'“‘([{"


def _period_ends_sentence(text: str, dot: int, match_end: int, nxt: int) -> bool:
    """`text[dot]` is a lone '.' followed by whitespace: decide from the word before it and the
    character after the whitespace whether it ends a sentence."""
    word_start = dot
    while word_start > 0 and not text[word_start - 1].isspace():
        word_start -= 1
    word = text[word_start:dot].lstrip(_OPENERS).lower()
    if word in ABBREVIATIONS:
        return False
    # "U.S.", "a.m." and single letters (initials, "E. coli") are abbreviations too
    if (len(word) == 1 and word.isalpha()) or re.fullmatch(r"(?:[a-z]\.)+[a-z]", word):
        return False
    if nxt >= len(text):
        return True
    c = text[nxt]
    if c.isupper() or c.isdigit() or c in _OPENERS:
        return True
    # Man pages start sentences with lowercase identifiers ("printf() writes ..."): take a function
    # call, or any word after a period that ends a line, as the start of a new sentence.
    return "\n" in text[match_end:nxt] or _CALL.match(text, nxt) is not None


def _sentence_cuts(text: str) -> list[int]:
    cuts: set[int] = set()
    for m in _BLANK_LINE.finditer(text):
        cuts.add(m.start())
    for m in _HEADING_LINE.finditer(text):
        cuts.update((m.start(), m.end()))
    for m in _ITEM_LINE.finditer(text):
        cuts.add(m.start())
    for m in _TERMINATOR.finditer(text):
        nxt = m.end()
        while nxt < len(text) and text[nxt].isspace():
            nxt += 1
        marks = text[m.start():m.end()].rstrip("\"'”’)]")
        if marks == "." and not _period_ends_sentence(text, m.start(), m.end(), nxt):
            continue
        cuts.add(m.end())
    return sorted(cuts)


def sentence_spans(text: str, start: int = 0, end: int | None = None) -> list[Span]:
    """Trimmed, non-empty sentence spans of `text[start:end]` (offsets into `text`)."""
    end = len(text) if end is None else end
    sub = text[start:end]
    spans: list[Span] = []
    prev = 0
    for cut in [*_sentence_cuts(sub), len(sub)]:
        span = trim_span(sub, prev, cut)
        if span is not None:
            spans.append((start + span[0], start + span[1]))
        prev = cut
    return spans


def paragraph_spans(text: str, start: int = 0, end: int | None = None) -> list[Span]:
    """Trimmed, non-empty spans of `text[start:end]` separated by blank lines."""
    end = len(text) if end is None else end
    spans: list[Span] = []
    prev = start
    for m in _BLANK_LINE.finditer(text, start, end):
        span = trim_span(text, prev, m.start())
        if span is not None:
            spans.append(span)
        prev = m.end()
    span = trim_span(text, prev, end)
    if span is not None:
        spans.append(span)
    return spans
