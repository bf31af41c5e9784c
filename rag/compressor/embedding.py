"""`compressor=embedding`: each context keeps the sentences whose cosine similarity to the question
reaches `threshold` (0.76 by default, a fixed value, not tuned), in the order they stand;
a context left with none is dropped. One encode call for every sentence of every question."""
from __future__ import annotations

from typing import Any

import numpy as np

from rag.chunker import sentence_spans
from rag.compressor.base import Compressor
from rag.embedder.base import Embedder
from rag.store.models import use_cache
from rag.config.schema import Cosine, checked
from rag.types import Context


class EmbeddingCompressor(Compressor):
    name = "embedding"

    @checked("compressor")
    def __init__(self, embedder: Embedder, threshold: Cosine = 0.76):
        self.embedder, self.threshold = embedder, float(threshold)

    def use_cache(self, cache: Any) -> None:
        use_cache(self.embedder, cache)  # the embedder's ONNX export

    @property
    def id(self) -> dict[str, Any]:
        return {"compressor": self.name, "embedder": self.embedder.id,
                "threshold": self.threshold}

    def warm_up(self) -> None:
        self.embedder.encode(["warm-up"], show_progress=False)

    def select(self, queries: list[str], contexts: list[list[Context]]) -> list[list[Context]]:
        sentences = [[[c.text[a:b] for a, b in sentence_spans(c.text)] for c in ctx] for ctx in contexts]
        flat = [s for per_q in sentences for per_c in per_q for s in per_c]
        if not flat:
            return [[] for _ in contexts]
        vecs = self.embedder.encode(flat, show_progress=False)
        q_vecs = self.embedder.encode_queries(list(queries))
        vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
        q_vecs = q_vecs / np.maximum(np.linalg.norm(q_vecs, axis=1, keepdims=True), 1e-12)
        out: list[list[Context]] = []
        row = 0
        for q, (ctx, per_q) in enumerate(zip(contexts, sentences)):
            kept_q: list[Context] = []
            for c, per_c in zip(ctx, per_q):
                sims = vecs[row:row + len(per_c)] @ q_vecs[q]
                row += len(per_c)
                kept = [s for s, sim in zip(per_c, sims) if sim >= self.threshold]
                if kept:
                    kept_q.append(Context(" ".join(kept), c.label))
            out.append(kept_q)
        return out
