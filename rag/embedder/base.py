"""The embedder interface (config group `embedder`).

An embedder turns texts into float32 [n, dim] vectors: `encode` for chunks and other passages,
`encode_queries` for questions (with the model's `query_prefix`), `encode_blocks` for the bulk
stage that fills a chunk set's vector file (rag.artifacts). `id` is everything that determines
the vectors (their cache key); `reference_id` the computation they reproduce, so that another
embedder with the same reference may reuse them (the evaluation's embedder).

What an embedder can do besides is said by attributes every embedder has, never by asking
whether a method exists:
- `writes_rows`: its `encode_blocks` takes the .npy itself (a `RowSink`) and its workers write
  the vectors into it (an engine on a Ray cluster);
- `vectors_by_id`: it encodes nothing; `write_vectors` copies vectors made elsewhere by chunk id
  (`embedder=precomputed`);
- `endpoint`: the server it calls (`embedder=openai`), with `counter` (the tokenizer that counts
  what is sent, when set) and `usage` (what it sent); None for an embedder in this process.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rag.cache import ArtifactCache

if TYPE_CHECKING:
    from rag.endpoint import Endpoint
    from rag.models import TokenCounter


@dataclass(frozen=True)
class RowSink:
    """The .npy that `encode_blocks` fills, offered to an embedder that `writes_rows`: float32 rows
    of `dim` values from byte `offset` (the header's length) on; text i of encode_blocks goes to
    row `rows[i]`. The file exists at its full size (rag.embedder.npy_writer.encode_to_npy creates it before
    the stage)."""

    path: str
    offset: int
    dim: int
    rows: np.ndarray


class Embedder:
    model_name: str = ""  # what the vectors' model is called in messages
    query_prefix: str = ""  # put before each question (e.g. bge's instruction)
    batch_size: int = 1  # texts per step: one forward pass, one request, one copied block
    vectors_by_id: bool = False
    endpoint: Endpoint | None = None
    counter: TokenCounter | None = None
    usage: dict[str, Any] | None = None

    @property
    def id(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def reference_id(self) -> dict[str, Any]:
        return self.id

    @property
    def dim(self) -> int:
        raise NotImplementedError

    @property
    def writes_rows(self) -> bool:
        return False

    def use_cache(self, cache: ArtifactCache) -> None:
        """Optional: the session's artifact cache, for an embedder that builds a model artifact."""

    def warm_up(self) -> None:
        """Optional: load the model (or check the server) outside the timed stages."""

    def encode(self, texts: list[str], show_progress: bool | None = None) -> np.ndarray:
        raise NotImplementedError

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        return self.encode([self.query_prefix + q for q in queries], show_progress=False)

    def encode_blocks(self, texts: list[str], block: int,
                      sink: RowSink | None = None) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """(rows, vectors) pairs covering every text, in any order; (rows, None) for rows written
        into `sink`, which only an embedder that `writes_rows` uses."""
        for start in range(0, len(texts), block):
            vecs = self.encode(texts[start:start + block], show_progress=False)
            yield np.arange(start, start + len(vecs)), vecs

    def write_vectors(self, id_batches: Iterable[list[str]], out: np.ndarray) -> dict[str, Any]:
        """Where `vectors_by_id`: fills `out` with the vectors of the chunk ids, batch by batch."""
        raise NotImplementedError
