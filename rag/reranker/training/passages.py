"""The passages a reranker is trained on: the training documents cut into chunks the way a run cuts
them (sliding windows by default), so that positives and negatives look like the candidates the
model scores later, optionally labelled with their document (`with_label`)."""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from rag.types import Document

_WORD = re.compile(r"[a-z0-9_]+")


def with_label(doc_id: str, text: str) -> str:
    """A passage as a labelled model sees it: its document's label (the same one v4 gives the LLM,
    e.g. "man page sleep(3)", "PyTorch torch.nn.Dropout") on a line before the text. The first-stage
    retrievers never see the label: it is information a reranker adds."""
    from rag.context import source_label

    return f"{source_label(doc_id)}\n{text}"


@dataclass(frozen=True)
class Passage:
    doc_id: str
    source: str
    text: str
    start: int
    end: int


class PassagePool:
    """Every passage of the training documents, with lookups by document and offset, and a BM25
    index over them for hard negatives and round-trip checks."""

    def __init__(self, docs: Sequence[Document], chunk_size: int, chunk_overlap: int, label: bool) -> None:
        from rag.chunker import SlidingWindowChunker

        chunker = SlidingWindowChunker(chunk_size, chunk_overlap)
        self.label = label
        self.passages: list[Passage] = []
        self.by_doc: dict[str, list[int]] = {}
        for d in docs:
            for c in chunker.split(d):
                self.by_doc.setdefault(d.id, []).append(len(self.passages))
                self.passages.append(Passage(d.id, d.source, c.text, c.start, c.end))
        self.sources = np.array([p.source for p in self.passages], dtype=object)

    def __len__(self) -> int:
        return len(self.passages)

    def text(self, row: int) -> str:
        """The passage as the model sees it (labelled or not)."""
        p = self.passages[row]
        return with_label(p.doc_id, p.text) if self.label else p.text

    def containing(self, doc_id: str, offset: int) -> int | None:
        """The passage of `doc_id` that holds the text from `offset` on best: the last one that
        starts at or before it (windows overlap), unless the offset falls in its final fifth."""
        best = None
        for row in self.by_doc.get(doc_id, ()):
            p = self.passages[row]
            if p.start <= offset < p.end:
                if best is None or (p.end - offset) >= 0.2 * (p.end - p.start):
                    best = row
        return best

    def best_match(self, doc_id: str, text: str) -> int | None:
        """The passage of `doc_id` sharing the most distinct words with `text` (an answer)."""
        words = set(_WORD.findall(text.lower()))
        rows = self.by_doc.get(doc_id, ())
        if not rows or not words:
            return None
        overlap = [len(words & set(_WORD.findall(self.passages[r].text.lower()))) for r in rows]
        return rows[int(np.argmax(overlap))]

    @cached_property
    def bm25(self) -> Any:
        from rag.retriever.bm25 import BM25Index

        return BM25Index(backend="bm25s").build([p.text for p in self.passages])
