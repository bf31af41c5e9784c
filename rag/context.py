"""From reranked hits to the numbered context passages an LLM sees.

Two v4 features live here:
- metadata mapping: each passage carries a label naming its source (PMID, man page and section,
  PyTorch object), derived from the document id, so the model (and the reader) can cite it;
- context expansion: a retrieved chunk's neighbours in the same document (positions p-1, p+1, ...)
  join it, up to a character budget. Overlapping or touching pieces of one document merge into a
  single passage, rebuilt from the chunks' own offsets (chunk.text == doc.text[start:end]).
"""
from __future__ import annotations

from rag.store.chunk_set import ChunkSet
from rag.types import Chunk, Context, Hits, RagError

GAP = " … "


def source_label(doc_id: str) -> str:
    kind, _, rest = doc_id.partition(":")
    if not rest:
        return doc_id
    if kind == "pmid":
        return f"PubMed PMID {rest}"
    if kind == "man":
        name, _, section = rest.rpartition(".")
        return f"man page {name}({section})" if name else f"man page {rest}"
    if kind == "torch":
        return f"PyTorch {rest}"
    if kind == "torchdoc":
        return f"PyTorch docs {rest}"
    return doc_id


def merge_chunks(chunks: list[Chunk]) -> str:
    """Text of the union of same-document chunks, sorted by offset. Consecutive chunks are only
    apart by the whitespace their chunker trimmed, so they join with a space; a real gap (a
    chunk in between is missing) shows as an ellipsis."""
    ordered = sorted(chunks, key=lambda c: (c.start, c.end))
    text, end, pos = ordered[0].text, ordered[0].end, ordered[0].position
    for c in ordered[1:]:
        if c.end <= end:
            continue
        if c.start <= end:
            text += c.text[end - c.start :]
        else:
            text += (" " if c.position == pos + 1 else GAP) + c.text
        end, pos = c.end, c.position
    return text


class ContextBuilder:
    def __init__(self, labels: bool = False, expand_neighbors: int = 0, budget_chars: int = 4000):
        if int(expand_neighbors) < 0:
            raise RagError(f"context.expand_neighbors must be >= 0, got {expand_neighbors}")
        if int(budget_chars) <= 0:
            raise RagError(f"context.budget_chars must be positive, got {budget_chars}")
        self.labels, self.expand, self.budget = bool(labels), int(expand_neighbors), int(budget_chars)

    def build(self, hits: Hits, chunk_set: ChunkSet) -> list[list[Context]]:
        return [self._build_one([r for r, _ in hits.row(q)], chunk_set) for q in range(hits.n_queries)]

    def _build_one(self, rows: list[int], chunk_set: ChunkSet) -> list[Context]:
        chunks = chunk_set.chunks
        # Passages in rank order; a retrieved chunk whose document already has a passage joins it.
        groups: dict[str, list[int]] = {}
        for r in rows:
            groups.setdefault(chunks[r].doc_id, []).append(r)
        used = sum(len(chunks[r].text) for r in rows)
        if self.expand:
            retrieved = {doc_id: list(members) for doc_id, members in groups.items()}
            # Nearest neighbours first, best-ranked passages first, until the budget is spent.
            for distance in range(1, self.expand + 1):
                for doc_id, members in groups.items():
                    for r in retrieved[doc_id]:
                        for pos in (chunks[r].position - distance, chunks[r].position + distance):
                            n = chunk_set.neighbour(r, pos)
                            if n is None or n in members:
                                continue
                            added = max(0, len(chunks[n].text))
                            if used + added > self.budget:
                                continue
                            members.append(n)
                            used += added
        out = []
        for doc_id, members in groups.items():
            text = merge_chunks([chunks[r] for r in members])
            out.append(Context(text=text, label=source_label(doc_id) if self.labels else None, chunk_rows=tuple(members)))
        return out
