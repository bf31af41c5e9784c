"""The structure a document's text shows, whatever corpus it comes from: a man page, a docstring or
headed documentation. The question templates (templates.py) ask about what is found here; the
demo's own corpora are read by their ids instead (rag.corpus.libc, rag.corpus.pytorch), which also
know a page's section.

- A man page: a NAME section and at least one other man section (SYNOPSIS, DESCRIPTION, RETURN
  VALUE...), headings at column 0 over indented text, as man renders it.
- A docstring: an object named by a signature on its first line (`name(args)`) or by a dotted id,
  and an Args:/Returns:/Raises: section, a numpy-style Parameters or Returns heading underlined with
  dashes, or a `>>>` example.
- Headed documentation: Markdown `#` headings, reST headings underlined (and maybe overlined) with
  = - ~ and the like, or numbered headings ("1.2 Title"), each over some text of its own.

`LOOKED_FOR` names all three, for the one line a corpus with none of them gets.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from rag.corpus import libc

LOOKED_FOR = ("no man page (NAME and SYNOPSIS, DESCRIPTION or RETURN VALUE sections), no docstring "
              "(Args:, Returns:, a Parameters heading over ----, >>> examples) and no headed documentation "
              "(# headings, underlined reST headings, numbered 1.2 headings)")

MAN_SECTIONS = frozenset({
    "NAME", "SYNOPSIS", "LIBRARY", "DESCRIPTION", "OPTIONS", "RETURN VALUE", "EXIT STATUS", "ERRORS",
    "ENVIRONMENT", "FILES", "ATTRIBUTES", "VERSIONS", "STANDARDS", "HISTORY", "NOTES", "CAVEATS", "BUGS",
    "EXAMPLES", "AUTHORS", "SEE ALSO", "COLOPHON"})
_MAN_NAME = re.compile(r"^[\w.:+\[\]-]+")
_SIGNATURE = re.compile(r"^([A-Za-z_][\w.]*)\s*\(.*\)")
_DOTTED_ID = re.compile(r"^(?:\w+:)?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)$")
_DOC_SECTION = re.compile(r"^\s*(?:Args|Arguments|Parameters|Keyword Args|Returns|Yields|Raises):\s*$", re.M)
_NUMPY_SECTION = re.compile(r"^\s*(?:Parameters|Returns|Yields|Raises)\s*\n\s*-{3,}\s*$", re.M)
_EXAMPLE = re.compile(r"^\s*>>> ", re.M)
_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+])\1{2,}\s*$")
_MARKDOWN = re.compile(r"^#{1,6} \S")
_NUMBERED = re.compile(r"^(\d+(?:\.\d+)*)\.?\s+(\S.*)$")
MAX_HEADING_WORDS = 10


@dataclass(frozen=True)
class Docstring:
    name: str  # the object a question names
    header: str  # the signature line ("" when the object is named by the document's id)
    body: str  # the docstring itself
    offset: int  # where `body` starts in the document's text


def man_page(text: str) -> str | None:
    """The object of a text laid out as a man page, as a question names it ("sleep()" for a
    function, else the bare name); None when it is no man page."""
    sections = libc.sections(text)
    heads = [h for h, _ in sections]
    # NAME opens the page, after the running header ("SLEEP(3)  Linux Programmer's Manual  SLEEP(3)") if any
    if "NAME" not in heads[:2] or not (set(heads) & (MAN_SECTIONS - {"NAME"})):
        return None
    name_line = libc.name_line(text) or ""
    m = _MAN_NAME.match(name_line)
    if m is None:
        return None
    name = m.group(0).rstrip(",")
    # a function: declared in the SYNOPSIS, or written "sleep()" in the text (a command's page
    # writes "ls(1)", which says nothing)
    synopsis = dict(sections).get("SYNOPSIS", "")
    called = re.search(rf"(?<![\w.]){re.escape(name)}\s*\(", synopsis) or f"{name}()" in text
    return f"{name}()" if called else name


def docstring(text: str, doc_id: str) -> Docstring | None:
    """The text as a docstring, when it has a docstring's sections or examples and names its
    object (a signature on its first line, else a dotted id such as "numpy.sum")."""
    if not (_DOC_SECTION.search(text) or _NUMPY_SECTION.search(text) or _EXAMPLE.search(text)):
        return None
    first, sep, rest = text.partition("\n\n")
    sig = _SIGNATURE.match(first.strip()) if sep and "\n" not in first.strip() else None
    if sig is not None:
        return Docstring(sig.group(1), first, rest, len(first) + len(sep))
    dotted = _DOTTED_ID.match(doc_id)
    return Docstring(dotted.group(1), "", text, 0) if dotted else None


def heading_at(lines: list[str], i: int) -> str | None:
    """The heading that line i begins (its text), or None: a Markdown heading, a line underlined
    by the next one (reST), or a short numbered title line without closing punctuation. Headings
    start at column 0: an indented line (a man page's table rule, a code listing) is text."""
    line = lines[i].rstrip()
    if not line or line[0].isspace() or _RST_UNDERLINE.match(line):
        return None
    if _MARKDOWN.match(line):
        return line.lstrip("#").strip()
    if i + 1 < len(lines) and _RST_UNDERLINE.match(lines[i + 1]):
        return line
    m = _NUMBERED.match(line)
    title = m.group(2) if m else ""
    if m and len(title.split()) <= MAX_HEADING_WORDS and not line.endswith((".", ":", ",", ";")) \
            and any(c.isalpha() for c in title) and "(" not in title:  # "1. run(self, arg0)": an overload
        # "1.2 Title" anywhere; a single "3 Title" only on a line of its own (not an item of a list)
        alone = (i + 1 >= len(lines) or not lines[i + 1].strip()) and (i == 0 or not lines[i - 1].strip())
        if "." in m.group(1) or alone:
            return line
    return None


def headed_sections(text: str) -> list[tuple[str, int, str]]:
    """(heading, offset in `text` of the text under it, that text up to the next heading) of headed
    documentation; a heading with no text under it is left out."""
    lines = text.splitlines(keepends=True)
    bare = [line.rstrip("\n") for line in lines]
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    heads: list[tuple[int, str, int]] = []  # (line, heading, first line under it)
    fenced = False
    for i in range(len(bare)):
        if bare[i].lstrip().startswith("```"):
            fenced = not fenced  # a "# comment" in a fenced code block is no heading
        h = None if fenced else heading_at(bare, i)
        if h is not None:
            underlined = i + 1 < len(bare) and bool(_RST_UNDERLINE.match(bare[i + 1]))
            heads.append((i, h, i + 2 if underlined else i + 1))
    out = []
    for j, (i, head, first) in enumerate(heads):
        end = heads[j + 1][0] if j + 1 < len(heads) else len(bare)
        # an overline above the next heading is not this section's text
        if end > first and j + 1 < len(heads) and _RST_UNDERLINE.match(bare[end - 1]):
            end -= 1
        lead = next((k for k in range(first, end) if bare[k].strip()), None)
        if lead is not None:
            out.append((head, starts[lead], "\n".join(bare[lead:end]).rstrip("\n")))
    return out
