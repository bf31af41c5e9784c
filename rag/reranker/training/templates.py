"""Question-shaped training queries built from a document's structure, with no model: a man page's
RETURN VALUE section answers "What does read() return?", a docstring's argument list answers
"What does the `dim` argument of torch.sum do?", a documentation section headed "Chain care"
answers "How does Chain care work?". The structure is recognised by the text in any corpus
(structure.py); the demo's own pages and docstrings by their ids.

The templates are written for this purpose, in the style of a user asking about an API (never
copied from an evaluation set). Each names the document's object, the way real questions about
an API usually do; the positive is the passage holding the section's text.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator

from rag.corpus import libc, pytorch
from rag.reranker.training.examples import Example
from rag.reranker.training.passages import PassagePool
from rag.reranker.training.structure import Docstring, docstring, headed_sections, man_page
from rag.reranker.training.text import clean_markup, sentences
from rag.types import Document

# man page section -> questions about the page's object {f}
MAN_SECTION_QUESTIONS = {
    "DESCRIPTION": ("What does {f} do?", "How does {f} work?", "What is {f} used for?"),
    "RETURN VALUE": ("What does {f} return?", "What is the return value of {f} on success and on error?",
                     "How do I know whether {f} succeeded?"),
    "ERRORS": ("What errors can {f} fail with?", "Why would {f} fail?"),
    "NOTES": ("What should I keep in mind when using {f}?", "Are there any caveats with {f}?"),
    "BUGS": ("Are there known bugs in {f}?",),
    "CAVEATS": ("What are the pitfalls of {f}?",),
    "VERSIONS": ("Since which Linux or glibc version is {f} available?",),
    "HISTORY": ("When was {f} introduced?",),
    "STANDARDS": ("Is {f} part of POSIX?", "Which standards specify {f}?"),
    "ATTRIBUTES": ("Is {f} thread-safe?",),
    "EXAMPLES": ("Is there an example program that uses {f}?", "How do I call {f} in a program?"),
}
ERRNO_QUESTIONS = ("When does {f} fail with {e}?", "What does {e} mean for {f}?", "Why does {f} return {e}?")
FLAG_QUESTIONS = ("What does the {c} flag of {f} do?", "What happens if I pass {c} to {f}?", "What is {c} for in {f}?")
DOC_SUMMARY_QUESTIONS = ("What does {f} do?", "What is {f} for?", "When should I use {f}?")
DOC_HOWTO_QUESTIONS = ("How do I {v} in PyTorch?", "How can I {v}?")
DOC_ARG_QUESTIONS = ("What does the {a} argument of {f} do?", "What does {a} mean in {f}?",
                     "How do I set {a} when calling {f}?")
DOC_NOTE_QUESTIONS = ("What should I watch out for when using {f}?", "Is there anything special about {f}?")
DOC_EXAMPLE_QUESTIONS = ("Can you show an example of using {f}?", "How is {f} used in code?")
PAGE_QUESTIONS = ("How does {h} work in PyTorch?", "What do the PyTorch docs say about {h}?", "What is {h} in PyTorch?")
# the same for any corpus: no library named
HOWTO_QUESTIONS = ("How do I {v}?", "How can I {v}?")
SECTION_QUESTIONS = ("What does the documentation say about {h}?", "How does {h} work?", "Where is {h} explained?")

_ERRNO = re.compile(r"^ {7}(E[A-Z0-9]{2,})\b", re.M)
_FLAG = re.compile(r"^ {7}([A-Z][A-Z0-9]*_[A-Z0-9_]+)\s*$", re.M)  # a constant on a line of its own
_ARG = re.compile(r"^\s{2,}(\w+)\s*(?:\([^)]*\))?\s*:\s+\S", re.M)  # "    dim (int): the dimension"
_NUMPY_ARG = re.compile(r"^ {0,8}(\w+) : \S", re.M)  # "x : array_like" under a numpy-style Parameters heading
_NUMBERING = re.compile(r"^\d+(?:\.\d+)*\.?\s+")
# headings that say where the reader is, not what the text is about
_NAVIGATION = frozenset({"contents", "table of contents", "index", "see also", "references", "next steps"})
# section words, and arguments nearly every function has (asking about them names nothing specific)
_NOT_ARGUMENTS = frozenset({"args", "arguments", "returns", "return", "example", "examples", "note", "shape",
                            "attributes", "input", "out", "other", "self", "kwargs", "warning", "default"})
_VERB = re.compile(r"^([A-Z][a-z]+)s\b")


def _pick(options: tuple[str, ...], *key: str) -> str:
    h = int(hashlib.sha256("\0".join(key).encode()).hexdigest()[:8], 16)
    return options[h % len(options)]


def man_object(doc: Document) -> str | None:
    """How a question names the page's object: "read()" for a function (sections 2 and 3), the
    bare name for types, constants and headers."""
    page = libc.page_of(doc.id)
    if page is None:
        return None
    name, section = page
    return f"{name}()" if section in ("2", "3") else name


def torch_object(doc_id: str) -> str:
    """"torch.nn.modules.linear.Linear" is asked about as nn.Linear; torch.x stays torch.x."""
    q = doc_id[len(pytorch.DOCSTRING_PREFIX):]
    return "nn." + q[len("torch.nn."):] if q.startswith("torch.nn.") and "functional" not in q else q


def howto(summary: str) -> str | None:
    """"Computes the sum of elements." -> "compute the sum of elements" (third person to bare verb)."""
    m = _VERB.match(summary)
    if not m:
        return None
    verb = m.group(1).lower()
    if verb.endswith("ie"):
        verb = verb[:-2] + "y"
    elif verb.endswith(("sse", "she", "che", "xe")):
        verb = verb[:-1]
    rest = summary[m.end():].strip().rstrip(".")
    return f"{verb} {rest}" if 2 <= len(rest.split()) <= 20 else None


def _at(doc: Document, fragment: str, start: int = 0) -> int | None:
    i = doc.text.find(fragment, start)
    return i if i >= 0 else None


def man_questions(doc: Document, f: str | None = None) -> Iterator[tuple[str, str, int]]:
    """(variant, question, offset of the answering text) of one man page; `f`: its object as a
    question names it (default: read off a libc page's id)."""
    f = f if f is not None else man_object(doc)
    if not f:
        return
    for head, body in libc.sections(doc.text):
        at = _at(doc, f"\n{head}\n")
        if at is None or not body.strip():
            continue
        at += len(head) + 2
        templates = MAN_SECTION_QUESTIONS.get(head)
        if templates:
            yield head.lower().replace(" ", "_"), _pick(templates, doc.id, head).format(f=f), at
        if head == "ERRORS":
            for e in dict.fromkeys(_ERRNO.findall(body)):
                pos = _at(doc, f"       {e}", at)
                if pos is not None:
                    yield "errno", _pick(ERRNO_QUESTIONS, doc.id, e).format(f=f, e=e), pos
        if head == "DESCRIPTION":
            for c in dict.fromkeys(_FLAG.findall(body)):
                pos = _at(doc, f"       {c}", at)
                if pos is not None:
                    yield "flag", _pick(FLAG_QUESTIONS, doc.id, c).format(f=f, c=c), pos


def docstring_questions(doc: Document, found: Docstring | None = None) -> Iterator[tuple[str, str, int]]:
    """(variant, question, offset of the answering text) of one docstring: a PyTorch docstring
    read by its id, or `found` in any document's text (rag.reranker.training.structure)."""
    args: tuple[re.Pattern[str], ...]
    if found is None:
        header, docstring, paras = pytorch.docstring_parts(doc.text)
        f, base, howto_questions, args = torch_object(doc.id), len(header) + 2, DOC_HOWTO_QUESTIONS, (_ARG,)
    else:
        docstring, base = found.body, found.offset
        paras = [p for p in re.split(r"\n\s*\n", docstring) if p.strip()]
        f, howto_questions, args = found.name, HOWTO_QUESTIONS, (_ARG, _NUMPY_ARG)
    top = 0 if found is None else found.offset  # a docstring found by its text is answered below its signature
    yield "summary", _pick(DOC_SUMMARY_QUESTIONS, doc.id).format(f=f), top
    first = next((p for p in paras if not re.match(r"^[\w.]+\s*\(.*\)", " ".join(p.split()))), "")
    sents = sentences(clean_markup(first)) if first else []
    verb = howto(sents[0]) if sents else None
    if verb:
        yield "howto", _pick(howto_questions, doc.id).format(v=verb), top
    matches = sorted((m for pattern in args for m in pattern.finditer(docstring)), key=lambda m: m.start())
    if found is not None:  # an argument both patterns find is asked about once
        named: dict[str, re.Match[str]] = {}
        for m in matches:
            named.setdefault(m.group(1), m)
        matches = list(named.values())
    for m in matches[:6]:
        arg = m.group(1)
        if arg.lower() in _NOT_ARGUMENTS:
            continue
        yield "argument", _pick(DOC_ARG_QUESTIONS, doc.id, arg).format(a=arg, f=f), base + m.start()
    for marker, variant, templates in ((".. note::", "note", DOC_NOTE_QUESTIONS),
                                       (".. warning::", "note", DOC_NOTE_QUESTIONS),
                                       (">>>", "example", DOC_EXAMPLE_QUESTIONS)):
        pos = docstring.find(marker)
        if pos >= 0:
            yield variant, _pick(templates, doc.id, marker).format(f=f), base + pos
            break


def page_questions(doc: Document) -> Iterator[tuple[str, str, int]]:
    pos = 0
    for head, body in pytorch.page_sections(doc.text):
        at = _at(doc, head, pos)
        if at is None:
            continue
        pos = at
        h = clean_markup(head)
        if len(h.split()) >= 2 and body.strip() and any(c.isalpha() for c in h):
            yield "page_section", _pick(PAGE_QUESTIONS, doc.id, head).format(h=h), at


def headed_questions(doc: Document) -> Iterator[tuple[str, str, int]]:
    """Questions on the sections of headed documentation, each answered by the section's text."""
    for head, at, _ in headed_sections(doc.text):
        h = _NUMBERING.sub("", clean_markup(head)).strip()
        if any(c.isalpha() for c in h) and h.lower() not in _NAVIGATION:
            yield "section", _pick(SECTION_QUESTIONS, doc.id, head).format(h=h), at


def structural_questions(doc: Document) -> list[tuple[str, str, int]]:
    """(template variant, question, offset of its answer) of one document. The demo's man pages,
    PyTorch docstrings and PyTorch pages are read by their ids (which also give a page's section);
    any other document by its text: a man page, a docstring or headed documentation
    (rag.reranker.training.structure), else none."""
    if libc.is_page_id(doc.id):
        return list(man_questions(doc))
    if pytorch.is_docstring_id(doc.id):
        return list(docstring_questions(doc))
    if pytorch.is_doc_page_id(doc.id):
        return list(page_questions(doc))
    f = man_page(doc.text)
    if f is not None:
        return list(man_questions(doc, f))
    found = docstring(doc.text, doc.id)
    if found is not None:
        return list(docstring_questions(doc, found))
    return list(headed_questions(doc))


def template_examples(doc: Document, pool: PassagePool) -> list[Example]:
    """Every template question of one document, each with the passage that holds its answer."""
    found = structural_questions(doc)
    out: list[Example] = []
    for variant, question, offset in found:
        row = pool.containing(doc.id, offset)
        if row is not None:
            out.append(Example(doc.id, doc.source, f"template:{variant}", question, pool.text(row)))
    return out
