"""The run's chunks by row (`ChunkSet`): what retrieval, contexts and metrics read of them, from the
chunk store of the cache (rag/store/chunk_store.py) or from a list of `Chunk` records."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from rag.store.chunk_store import ChunkStore
from rag.types import Chunk


@dataclass
class ChunkSet:
    """The run's chunks by row: a `ChunkStore` read from the cache (rag/store/chunk_store.py), or a list
    of `Chunk` records (tests, callers that chunk for themselves, caches written before the store)."""

    key: str
    chunks: Sequence[Chunk]
    # chunker.contextualize (rag/chunker/contextualize.py): per chunk, a line indexed before its text
    prefixes: list[str] | None = None
    context: str = "none"

    def __post_init__(self) -> None:
        if isinstance(self.chunks, ChunkStore):
            self._source_names, self._codes = self.chunks.source_names, self.chunks.source_codes()
        else:
            self._source_names = sorted({c.source for c in self.chunks})
            code = {s: i for i, s in enumerate(self._source_names)}
            self._codes = np.fromiter((code[c.source] for c in self.chunks), np.uint16, len(self.chunks))
        self._positions: dict[tuple[str, int], int] | None = None
        self._rows_by_sources: dict[frozenset[str], np.ndarray] = {}

    @property
    def sources(self) -> np.ndarray:
        """Chunk row -> source tag (an object array), for metadata filters and routing."""
        return np.array(self._source_names, dtype=object)[self._codes]

    @property
    def texts(self) -> list[str]:
        """The chunks' own texts: what contexts, passages and metrics read."""
        return self._texts(0, len(self))

    def _texts(self, start: int, stop: int) -> list[str]:
        if isinstance(self.chunks, ChunkStore):
            return self.chunks.texts(start, stop)  # one read of the blob, not a row at a time
        return [c.text for c in self.chunks[start:stop]]

    @property
    def indexed_texts(self) -> list[str]:
        """What the pipeline's embedder and BM25 index: the texts, after their prefixes if any."""
        return [t for batch in self.indexed_batches() for t in batch]

    def indexed_batches(self, size: int = 50_000) -> Iterator[list[str]]:
        """`indexed_texts` in batches of `size` rows, read from the store as they are needed (what
        a build that must not hold every text at once consumes)."""
        for start in range(0, len(self), size):
            stop = min(len(self), start + size)
            texts = self._texts(start, stop)
            if self.prefixes is not None:
                texts = [f"{p}\n{t}" for p, t in zip(self.prefixes[start:stop], texts)]
            yield texts

    def id_batches(self, size: int = 50_000) -> Iterator[list[str]]:
        """The chunk ids (doc_id#position) in batches of `size` rows."""
        for start in range(0, len(self), size):
            if isinstance(self.chunks, ChunkStore):
                yield self.chunks.ids(start, start + size)
            else:
                yield [c.id for c in self.chunks[start : start + size]]

    def indexed_key(self) -> dict[str, str]:
        """What an index over `indexed_texts` is keyed by (the chunks' key alone without prefixes,
        so those keys are unchanged by the setting's existence)."""
        return {"chunks": self.key} if self.prefixes is None else {"chunks": self.key, "context": self.context}

    def contextualized(self, mode: str, prefixes: list[str] | None) -> ChunkSet:
        """The same chunks indexed with `prefixes` (a new set: the plain one is shared in memory
        by the jobs of a sweep)."""
        if prefixes is None:
            return self
        if len(prefixes) != len(self.chunks):
            raise ValueError(f"{len(prefixes)} prefixes for {len(self.chunks)} chunks")
        return ChunkSet(self.key, self.chunks, prefixes, mode)

    def row_of(self, doc_id: str, position: int) -> int | None:
        """Chunk row of a document's chunk at `position` (None past either end)."""
        if self._positions is None:
            self._positions = {(c.doc_id, c.position): i for i, c in enumerate(self.chunks)}
        return self._positions.get((doc_id, position))

    def neighbour(self, row: int, position: int) -> int | None:
        """Row of the chunk at `position` in the document of chunk `row` (None past either end).
        A document's chunks are written in order, one after another, so the row is found by
        arithmetic and checked, with no table of every chunk (rows_of at 10M chunks: ~2 GB)."""
        if isinstance(self.chunks, ChunkStore):
            store = self.chunks
            guess = row + position - int(store.cols["position"][row])
            if 0 <= guess < len(store) and int(store.cols["position"][guess]) == position \
                    and store.doc_id(guess) == store.doc_id(row):
                return guess
            return None
        return self.row_of(self.chunks[row].doc_id, position)

    def rows_of_sources(self, sources: frozenset[str]) -> np.ndarray:
        """Rows whose source is in `sources`; the same (read-only) array for the same filter, so
        that it is computed once per filter, not once per question (13 ms at 1M chunks), and
        the indexes can reuse what they derive from it."""
        rows = self._rows_by_sources.get(sources)
        if rows is None:
            codes = [i for i, s in enumerate(self._source_names) if s in sources]
            rows = np.flatnonzero(np.isin(self._codes, codes)).astype(np.int64)
            rows.flags.writeable = False
            self._rows_by_sources[sources] = rows
        return rows

    def __len__(self) -> int:
        return len(self.chunks)
