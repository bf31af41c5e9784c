"""Source filters: which source tags each question may search (`retriever.source_filter`), and the
check that a filter hides neither every document nor a question's answer."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from rag.config.schema import fields, groups, string, strings
from rag.types import Document, RagError

SourceFilter = frozenset[str] | None

# A retriever's `source_filter` node: settings of no component of their own, so their rules are here.
SourceFilterNode = Annotated[Any, fields(mode=string(nullable=True), groups=groups, sources=strings())]


def source_filters(mode: str | None, groups: Any, sources: Any, question_corpora: list[str | None]) -> list[SourceFilter]:
    """Per-question allowed source tags.

    - mode None/"none": no filtering.
    - "fixed": every question sees only `sources`.
    - "question" (alias "oracle"): a question tagged with corpus c sees the sources of the group
      that contains c (e.g. PubMed questions search PubMed, libc/PyTorch questions search the
      technical docs); an untagged question is not filtered. The tag is the question's own
      ground truth, which no deployed system has: this is the oracle ablation of "router".
    - "router": routed from the question text (`Retriever.route`; filtered only where the router
      is confident, rag/retriever/routing.py), not decided here.
    """
    if mode in (None, "none"):
        return [None] * len(question_corpora)
    if mode == "fixed":
        if not sources:
            raise RagError("retriever.source_filter.sources must list at least one source when mode=fixed")
        f = frozenset(sources)
        return [f] * len(question_corpora)
    if mode == "oracle":
        mode = "question"
    if mode == "question":
        group_of: dict[str, frozenset[str]] = {}
        for g in groups or []:
            for s in g:
                group_of[s] = frozenset(g)
        return [None if c is None else group_of.get(c, frozenset([c])) for c in question_corpora]
    raise RagError(f"retriever.source_filter.mode must be none, fixed, question (oracle) or router, got {mode!r}")


def check_source_filters(mode: str | None, groups: Any, askers: Sequence[tuple[str, str | None, str | None]],
                         filters: list[SourceFilter], docs: Sequence[Document]) -> None:
    """See Retriever.check_filters. Tags are compared exactly (case-sensitive), as filtering does."""
    source_of = {d.id: d.source for d in docs}
    source_set = set(source_of.values())
    sources = sorted(source_set)
    grouped = {s for g in groups or [] for s in g}
    where = f"retriever.source_filter (mode={mode})"
    seen: set[tuple[str | None, str | None]] = set()
    for (who, corpus, answer_doc), allowed in zip(askers, filters):
        if allowed is None or (corpus, answer_doc) in seen:
            continue
        seen.add((corpus, answer_doc))
        if not allowed & source_set:
            if mode == "question" and corpus not in grouped:
                raise RagError(
                    f"{where}: corpus tag {corpus!r} ({who}) is in no group of retriever.source_filter.groups "
                    f"{groups} and no document has that source; document sources: {sources} (tags are case-sensitive)"
                )
            if mode == "fixed":
                raise RagError(f"retriever.source_filter.sources {sorted(allowed)} matches no document's source; "
                               f"document sources: {sources} (tags are case-sensitive)")
            raise RagError(
                f"{where}: {who} may only search sources {sorted(allowed)}, but no document has any of them; "
                f"document sources: {sources} (tags are case-sensitive; groups: {groups})"
            )
        tag = source_of.get(answer_doc) if answer_doc is not None else None
        if mode == "question" and tag is not None and tag not in allowed:
            raise RagError(
                f"{where}: {who} has corpus tag {corpus!r}, but its answer's document {answer_doc!r} has source "
                f"{tag!r}, which its filter {sorted(allowed)} excludes (groups: {groups}; tags are case-sensitive)"
            )
