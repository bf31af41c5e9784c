"""`retriever=hybrid`: the dense and the BM25 retriever's candidates, fused into one ranking
(rag/retriever/fusion.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rag.retriever.base import Retriever, SourceFilter
from rag.retriever.dense import DenseRetriever
from rag.retriever.fusion import Fusion
from rag.retriever.lexical import BM25Retriever
from rag.retriever.source_filter import SourceFilterNode
from rag.config.schema import PositiveInt, checked
from rag.types import Hits

if TYPE_CHECKING:
    from rag.run.artifacts import Artifacts


class HybridRetriever(Retriever):
    """Dense and lexical candidates (`candidates` each), fused into one ranking."""

    @checked("retriever")
    def __init__(
        self,
        dense: DenseRetriever,
        lexical: BM25Retriever,
        fusion: Fusion,
        candidates: PositiveInt = 100,
        source_filter: SourceFilterNode = None,
    ):
        super().__init__(source_filter)
        self.dense, self.lexical, self.fusion, self.candidates = dense, lexical, fusion, candidates

    def _prepare(self, artifacts: Artifacts) -> None:
        self.dense.prepare(artifacts)
        self.lexical.prepare(artifacts)

    def dense_part(self) -> "DenseRetriever | None":
        return self.dense

    def warm_up(self) -> None:
        self.dense.warm_up()
        self.lexical.warm_up()

    def _search(self, queries: list[str], n: int, allowed: np.ndarray | None) -> Hits:
        width = max(n, self.candidates)
        lists = [r._search(queries, width, allowed) for r in (self.dense, self.lexical)]
        return self.fusion(lists, n)

    def _search_one(self, query: str, n: int, f: SourceFilter, reuse: bool) -> Hits:
        width = max(n, self.candidates)
        lists = [r._search_one(query, width, f, reuse) for r in (self.dense, self.lexical)]
        return self.fusion(lists, n)
