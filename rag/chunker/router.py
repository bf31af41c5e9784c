"""Per-source chunking: PubMed abstracts, man pages and API docs want different splitters."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rag.chunker.base import BaseChunker, check_chunker
from rag.config.schema import PositiveInt, checked
from rag.types import Chunk, Document, RagError


class RoutedChunker(BaseChunker):
    """`routes[doc.source]` chunks the document, `default` when its source has no route.

    `chunk_size` is optional here: when set it replaces the size of every routed chunker (each
    re-validated), so that a `chunker.chunk_size=...` sweep works with routing too. Routed
    chunkers must then offer `with_chunk_size` (all chunkers of this package do)."""

    @checked("chunker")
    def __init__(self, routes: Mapping[str, Any], default: Any, chunk_size: PositiveInt | None = None):
        self.routes = routes
        self.default = default
        self.chunk_size = chunk_size  # type: ignore[assignment]
        self._validate()

    def _validate(self) -> None:
        if not isinstance(self.routes, Mapping) and not hasattr(self.routes, "items"):
            raise RagError(f"chunker.routes must be a mapping of source -> chunker, got {type(self.routes).__name__}")
        # a DictConfig from Hydra becomes a plain dict of the instantiated chunkers
        routes = {str(k): check_chunker(f"chunker.routes.{k}", v) for k, v in self.routes.items()}
        default = check_chunker("chunker.default", self.default)
        if self.chunk_size is not None:
            routes = {k: _resized(f"chunker.routes.{k}", v, self.chunk_size) for k, v in routes.items()}
            default = _resized("chunker.default", default, self.chunk_size)
        self.routes, self.default = routes, default

    def use_cache(self, cache: Any) -> None:
        """The session's model cache, for the routed chunkers that hold a model."""
        from rag.store.models import use_cache

        for chunker in [*self.routes.values(), self.default]:
            use_cache(chunker, cache)

    def chunker_for(self, source: str) -> Any:
        return self.routes.get(source, self.default)

    def split(self, doc: Document) -> list[Chunk]:
        return self.chunker_for(doc.source).split(doc)


def _resized(name: str, chunker: Any, chunk_size: int) -> BaseChunker:
    if not isinstance(chunker, BaseChunker):
        raise RagError(f"{name} ({type(chunker).__name__}) cannot take chunker.chunk_size")
    return chunker.with_chunk_size(chunk_size)
