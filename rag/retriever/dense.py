"""`retriever=dense`: the question's vector from the embedder, searched in a vector index over the
chunk vectors (rag/index/)."""
from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np

from rag.embedder.base import Embedder
from rag.index.base import VectorIndex
from rag.retriever.base import Retriever
from rag.retriever.source_filter import SourceFilterNode
from rag.config.schema import checked
from rag.types import Hits, RagError

if TYPE_CHECKING:
    from rag.run.artifacts import Artifacts


class DenseRetriever(Retriever):
    @checked("retriever")
    def __init__(self, embedder: Embedder, index: VectorIndex, source_filter: SourceFilterNode = None):
        super().__init__(source_filter)
        self.embedder, self.index = embedder, index
        self._index_key: str | None = None
        self.routed_vectors: dict[str, np.ndarray] = {}  # query -> vector the router just encoded

    def _prepare(self, artifacts: Artifacts) -> None:
        self._index_key = artifacts.vector_index(self.embedder, self.index)[1]

    def dense_part(self) -> "DenseRetriever | None":
        return self

    def warm_up(self) -> None:
        dim = self.embedder.encode_queries(["warm-up"]).shape[1]
        if dim != self.index.dim:
            # a served model renamed or swapped behind the same name since its vectors were cached
            raise RagError(f"embedder {self.embedder.model_name!r}: query vectors are {dim}-d but the "
                           f"indexed chunk vectors are {self.index.dim}-d; the model behind embedder.model has changed "
                           "(clear its vectors from the cache, or name the model it now is)")

    def _signature(self) -> tuple | None:
        # ef_search / nprobe are query-time knobs outside the index key, so they join here.
        knobs = tuple(sorted(vars(self.index).items(), key=lambda kv: kv[0]))
        knobs = tuple((k, v) for k, v in knobs if isinstance(v, (int, float, str)))
        return ("dense", self._index_key, self.embedder.query_prefix, knobs)

    def _search(self, queries: list[str], n: int, allowed: np.ndarray | None) -> Hits:
        vecs = [self.routed_vectors.pop(q, None) for q in queries]
        if any(v is None for v in vecs):
            return self.index.search(self.embedder.encode_queries(queries), n, allowed)
        return self.index.search(np.stack(cast(list[np.ndarray], vecs)), n, allowed)
