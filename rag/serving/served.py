"""Whether a component runs behind a server.

Every component family that may (embedders, rerankers, generators, compressors, the
contextualizer) has an `endpoint`: the rag.endpoint transport it calls, its generator's, or None
in process. The dry run (rag.run.plan) counts what the served ones would send, and the session warms
up none of them in a dry run.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rag.endpoint import Endpoint


class Served(Protocol):
    @property
    def endpoint(self) -> Endpoint | None: ...


def served(part: Served | None) -> bool:
    """Whether a component calls a server, itself or through its generator."""
    return part is not None and part.endpoint is not None
