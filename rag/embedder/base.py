"""The embedder interface (config group `embedder`).

An embedder turns texts into float32 [n, dim] vectors: `encode` for chunks and other passages,
`encode_queries` for questions (with the model's `query_prefix`), `encode_blocks` for the bulk
stage that fills a chunk set's vector file (rag.run.artifacts). `id` is everything that determines
the vectors (their cache key); `reference_id` the computation they reproduce, so that another
embedder with the same reference may reuse them (the evaluation's embedder).

What an embedder can do besides is said by attributes every embedder has, never by asking
whether a method exists:
- `writes_rows`: its `encode_blocks` takes the .npy itself (a `RowSink`) and its workers write
  the vectors into it (an engine on a Ray cluster);
- `vectors_by_id`: it encodes nothing; `write_vectors` copies vectors made elsewhere by chunk id
  (`embedder=precomputed`);
- `endpoint`: the server it calls (`embedder=openai`), with `counter` (the tokenizer that counts
  what is sent, when set) and `usage` (what it sent); None for an embedder in this process;
- `backend_note`: which backend computes its vectors and why (metrics.json `backends`), for an
  embedder that has a choice of backends (rag/embedder/backend_choice.py); None otherwise.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rag.store.cache import ArtifactCache

if TYPE_CHECKING:
    from rag.endpoint import Endpoint
    from rag.store.models import TokenCounter


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
        """Everything that determines the vectors. Required.

        The runner keys the cached chunk vectors by it (with the chunks' key): two embedders
        with equal ids must give the same vectors, and a change that moves them must change it.

        Returns:
            A JSON-able mapping, e.g. `{"model": "all-MiniLM-L6-v2", "normalize": True,
            "max_seq_length": 256}`.
        """
        raise NotImplementedError

    @property
    def reference_id(self) -> dict[str, Any]:
        return self.id

    @property
    def dim(self) -> int:
        """The length of each vector. Required.

        Returns:
            The number of float32 values per vector (384 for all-MiniLM-L6-v2); the index is built
            for it before anything is encoded.
        """
        raise NotImplementedError

    @property
    def writes_rows(self) -> bool:
        return False

    @property
    def backend_note(self) -> dict[str, Any] | None:
        return None

    def prefer_cached(self, available: Callable[[dict[str, Any]], bool]) -> None:
        """Optional: called before the vectors' key is taken, with whether the vectors of an id are
        already made (in the cache or its seed): an embedder whose backend is still to be chosen
        by measurement may settle on one whose vectors are there (`backend: auto`)."""

    def use_cache(self, cache: ArtifactCache) -> None:
        """Optional: the session's artifact cache, for an embedder that builds a model artifact."""

    def warm_up(self) -> None:
        """Optional: load the model (or check the server) outside the timed stages."""

    def encode(self, texts: list[str], show_progress: bool | None = None) -> np.ndarray:
        """Embeds passages: chunks, and the texts the evaluation compares. Required.

        The runner calls it after `use_cache` and `warm_up`, with at most a block of texts at a
        time for the chunk vectors (`encode_blocks`) and with any number elsewhere; questions go
        through `encode_queries`, which adds `query_prefix` and calls this.

        Args:
            texts: The texts, in order (an empty text still gets its row).
            show_progress: Whether to draw a progress bar (None: the embedder's own setting).

        Returns:
            A float32 array of shape `[len(texts), dim]`, row i the vector of `texts[i]`; rows of
            unit length where the embedder normalises (cosine = inner product).

        Example:
            A (useless) embedder of text lengths:

                class Lengths(Embedder):
                    id = {"class": "Lengths"}
                    dim = 1

                    def encode(self, texts, show_progress=None):
                        return np.array([[len(t)] for t in texts], np.float32)
        """
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
        """Copies vectors made elsewhere into `out` by chunk id. Required where `vectors_by_id`.

        The runner calls it instead of `encode_blocks` for an embedder that `vectors_by_id`
        (`embedder=precomputed`), to fill the chunk set's vector file.

        Args:
            id_batches: The chunk ids, batch after batch, in the rows' order.
            out: The float32 `[n_chunks, dim]` array to fill (the cache's memory-mapped file).

        Returns:
            What it did, for metrics.json: at least `{"n": chunks, "dim": dim}`.
        """
        raise NotImplementedError
