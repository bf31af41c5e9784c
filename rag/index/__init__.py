"""Vector indexes (config group conf/index/): `build(vectors)`, `search(queries, n, allowed) -> Hits`,
`save`/`load`, on the interface of rag/index/base.py. FAISS's types are in faiss_index.py, Chroma's
collection in chroma.py; vector_rows.py reads the cache's memory-mapped vectors without mapping them."""
from rag.index.base import VectorIndex
from rag.index.chroma import ChromaIndex
from rag.index.faiss_index import (FlatIPIndex, FlatL2Index, HNSWIndex, HNSWSQ8Index, IVFIndex, IVFPQIndex,
                                   IVFSQ8Index)

__all__ = ["ChromaIndex", "FlatIPIndex", "FlatL2Index", "HNSWIndex", "HNSWSQ8Index", "IVFIndex", "IVFPQIndex",
           "IVFSQ8Index", "VectorIndex"]
