"""Retrievers (config group conf/retriever/, fusion in conf/fusion/): `prepare(artifacts)`, then
`search(queries, n, filters) -> Hits` over chunk rows, on the interface of rag/retriever/base.py.
Dense search is dense.py over rag/index/; BM25 is lexical.py over the index in bm25.py (built by
bm25_build.py, pruned by maxscore.py); hybrid.py fuses both (fusion.py). Source filters are
source_filter.py's, routed ones routing.py's."""
from rag.retriever.base import Retriever
from rag.retriever.bm25 import BM25Index
from rag.retriever.dense import DenseRetriever
from rag.retriever.fusion import Fusion, RRFFusion, WeightedFusion
from rag.retriever.hybrid import HybridRetriever
from rag.retriever.lexical import BM25Retriever
from rag.retriever.routing import Router

__all__ = ["BM25Index", "BM25Retriever", "DenseRetriever", "Fusion", "HybridRetriever", "RRFFusion", "Retriever",
           "Router", "WeightedFusion"]
