"""Pseudo-queries mined from document text (the first recipe, kept to reproduce it; see
docs/explanation/cross_encoder.md). Every query is a piece of its own document, cut out of the positive:
- man_name:        a man page's NAME description -> the start of its DESCRIPTION
- man_subsection:  an indented subsection heading unique in the corpus -> that subsection
- docstring:       a docstring's summary sentence -> the signature line plus the rest
- rst_section:     a heading of a documentation page unique in the corpus -> the text under it
- abstract:        an abstract's objective (or first) sentence -> its conclusion, and a group of
                   result sentences
- sentence:        inverse cloze: one prose sentence of one passage of each document (chosen by a
                   hash of the id) -> that passage without the sentence
"""
from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable, Sequence

from rag.corpus import libc, pytorch
from rag.reranker.training.examples import Example
from rag.reranker.training.passages import PassagePool
from rag.reranker.training.text import (
    MAX_PASSAGE_CHARS,
    clean_markup,
    contains_query,
    cut_words,
    first_passage,
    is_prose,
    ok_query,
    remove_query,
    sentences,
)
from rag.types import Document

KINDS = ("man_name", "man_subsection", "docstring", "rst_section", "abstract", "sentence")

_SIGNATURE_PARA = re.compile(r"^[\w.]+\s*\(.*\)\s*(->.*)?$", re.S)
_OBJECTIVE = re.compile(
    r"\b(aims?|objectives?|purpose|goal)\b|\bwe (sought|investigated|evaluated|examined|assessed|"
    r"studied|compared|asked|hypothesi[sz]ed|tested|determined|aimed)\b|\b(to|was to) (determine|assess|"
    r"evaluate|investigate|examine|compare|analy[sz]e|identify|explore|test|describe|clarify)\b",
    re.I,
)

Add = Callable[..., None]


def unique_headings(docs: Sequence[Document]) -> Counter:
    """How often each man subsection heading and documentation page heading occurs: only headings
    that occur once name one place."""
    headings: Counter = Counter()
    for d in docs:
        if libc.is_page_id(d.id):
            for _, body in libc.sections(d.text):
                headings.update(sub for sub, _ in libc.subsections(body))
        elif pytorch.is_doc_page_id(d.id):
            headings.update(head for head, _ in pytorch.page_sections(d.text))
    return headings


def _man(doc: Document, target: int, headings: Counter, add: Add) -> None:
    title = doc.meta.get("title") or ""
    desc = title.split(" - ", 1)[1] if " - " in title else ""
    description = dict(libc.sections(doc.text)).get("DESCRIPTION", "")
    if desc and description:
        add("man_name", desc, first_passage(description, target))
    for head, body in libc.sections(doc.text):
        if head in libc.FRONT_MATTER_SECTIONS:
            continue
        for sub, text in libc.subsections(body):
            if headings[sub] == 1 and len(sub.split()) >= 2 and text.strip():
                add("man_subsection", sub, first_passage(text, target))


def _docstring(doc: Document, target: int, add: Add) -> None:
    header, _, paras = pytorch.docstring_parts(doc.text)
    rest = list(paras)
    while rest and _SIGNATURE_PARA.match(" ".join(rest[0].split())):
        rest.pop(0)  # C functions repeat their signature as the first docstring line
    if rest and not rest[0].lstrip().startswith(("..", ">>>", ":")):
        sents = sentences(rest[0])
        if sents:
            body = "\n\n".join([" ".join(sents[1:])] + rest[1:]).strip()
            if len(body) >= 80:
                add("docstring", clean_markup(sents[0]), first_passage(f"{header}\n\n{body}", target), sents[0])


def _abstract(doc: Document, target: int, add: Add) -> None:
    paras = [p for p in re.split(r"\n\s*\n", doc.text) if p.strip()]
    if len(paras) >= 2:
        first = sentences(paras[0])
        query = next((s for s in first if _OBJECTIVE.search(s)), first[0] if first else "")
        # the conclusion (last paragraph), then a group of result sentences
        add("abstract", query, cut_words(" ".join(paras[-1].split()), MAX_PASSAGE_CHARS))
        middle = " ".join(paras[1:-1]) if len(paras) >= 3 else " ".join(first[1:])
        if middle:
            add("abstract", query, first_passage(middle, target))


def _inverse_cloze(doc: Document, pool: PassagePool, add: Add) -> None:
    passages = [pool.passages[r].text for r in pool.by_doc.get(doc.id, ()) if len(sentences(pool.passages[r].text)) >= 3]
    h = int(hashlib.sha256(f"sentence:{doc.id}".encode()).hexdigest()[:12], 16)
    if passages:
        passage = passages[h % len(passages)]
        prose = [x for x in sentences(passage) if 6 <= len(x.split()) <= 30 and is_prose(x)]
        if prose:
            sent = prose[(h // 1009) % len(prose)]
            add("sentence", clean_markup(sent), passage, sent)


def mined_examples(doc: Document, pool: PassagePool, target: int, kinds: set[str], headings: Counter) -> list[Example]:
    """The pseudo-query examples of one document, in document order."""
    from rag.reranker.training.passages import with_label

    out: list[Example] = []

    def add(kind: str, query: str, passage: str, *remove: str) -> None:
        query = " ".join(query.split())
        passage = remove_query(passage, query, *remove)
        if kind in kinds and ok_query(query) and len(passage) >= 120 and not contains_query(passage, query):
            shown = with_label(doc.id, passage) if pool.label else passage
            out.append(Example(doc.id, doc.source, f"mined:{kind}", query, shown))

    if libc.is_page_id(doc.id):
        _man(doc, target, headings, add)
    elif pytorch.is_docstring_id(doc.id):
        _docstring(doc, target, add)
    elif pytorch.is_doc_page_id(doc.id):
        for head, text in pytorch.page_sections(doc.text):
            if headings[head] == 1 and text.strip():
                add("rst_section", clean_markup(head), first_passage(text, target))
    else:  # abstracts, and any other prose
        _abstract(doc, target, add)
    if "sentence" in kinds:
        _inverse_cloze(doc, pool, add)
    return out
