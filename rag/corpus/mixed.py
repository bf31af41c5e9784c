"""Several corpora searched as one; every document keeps its own source tag."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rag.corpus.base import Corpus, concatenate_parts
from rag.types import Document, RagError


def instantiate_parts(parts: Sequence[Any], owner: str) -> list[Any]:
    """The parts as objects. Hydra normally instantiates nested `_target_` configs itself, but
    not when the parent is built with `_recursive_: false` or by hand from a plain dict."""
    if isinstance(parts, (str, bytes, Mapping)) or not hasattr(parts, "__iter__"):
        raise RagError(f"{owner}: 'parts' must be a list, got {type(parts).__name__}")
    out = []
    for i, part in enumerate(parts):
        if isinstance(part, Mapping):  # includes OmegaConf DictConfig
            if "_target_" not in part:
                raise RagError(f"{owner}: part {i} is a mapping without '_target_'")
            from hydra.utils import instantiate

            part = instantiate(part)
        if not hasattr(part, "load"):
            raise RagError(f"{owner}: part {i} ({type(part).__name__}) has no load()")
        out.append(part)
    if not out:
        raise RagError(f"{owner}: 'parts' is empty")
    return out


def part_fingerprint(part: Any) -> Any:
    return part.fingerprint()


class MixedCorpus(Corpus):
    def __init__(self, parts: Sequence[Any]) -> None:
        super().__init__()
        self.parts = instantiate_parts(parts, "MixedCorpus")

    def fingerprint(self) -> dict[str, Any]:
        return {"class": type(self).__name__, "parts": [part_fingerprint(p) for p in self.parts]}

    def title(self) -> str:
        return " + ".join(p.title() for p in self.parts)

    def load(self) -> list[Document]:
        docs = concatenate_parts(self.parts, "MixedCorpus", "document")
        self.skipped = [s for part in self.parts for s in part.skipped]
        return docs
