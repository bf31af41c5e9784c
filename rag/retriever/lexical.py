"""`retriever=bm25`: BM25 over the chunk texts (the index in rag/retriever/bm25.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rag.retriever.base import Retriever
from rag.retriever.bm25 import BM25Index
from rag.retriever.source_filter import SourceFilterNode
from rag.config.schema import Fraction, Positive, checked
from rag.types import Hits, RagError

if TYPE_CHECKING:
    from rag.run.artifacts import Artifacts


class BM25Retriever(Retriever):
    @checked("retriever")
    def __init__(
        self,
        backend: str = "bm25s",
        k1: Positive = 1.5,
        b: Fraction = 0.75,
        stopwords: bool = True,
        stem: bool = True,
        source_filter: SourceFilterNode = None,
        mmap: bool = False,
    ):
        super().__init__(source_filter)
        if self.routes:
            raise RagError("retriever.source_filter.mode=router routes in the dense embedder's space: "
                           "use retriever=dense or retriever=hybrid")
        self.bm25 = BM25Index(backend=backend, k1=k1, b=b, stopwords=stopwords, stem=stem, mmap=mmap)
        self._key: str | None = None

    def _prepare(self, artifacts: Artifacts) -> None:
        self._key = artifacts.bm25(self.bm25)[1]

    def warm_up(self) -> None:
        self.bm25.search(["warm-up"], 1)

    def _signature(self) -> tuple | None:
        return ("bm25", self._key)

    def _search(self, queries: list[str], n: int, allowed: np.ndarray | None) -> Hits:
        return self.bm25.search(queries, n, allowed)
