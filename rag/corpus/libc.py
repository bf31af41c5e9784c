"""The Linux man-pages of sections 2 and 3 (libc and system calls), rendered to plain text.

Pages are gzipped roff under `<man_dir>/man2` and `man3`. Symlinks and `.so` redirect pages are
aliases of another page and are skipped, so every page is rendered once. Rendering runs
`man -l` then `col -bx`, one subprocess pair per page, in a thread pool (the work happens in the
subprocesses, so threads are enough).
"""
from __future__ import annotations

import concurrent.futures
import functools
import gzip
import logging
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag.corpus.base import Corpus, as_path, check_documents, listing_fingerprint
from rag.config.schema import Directory, PositiveInt, Text, checked
from rag.types import Document, RagError

log = logging.getLogger(__name__)

DEFAULT_SECTIONS = ("2", "3", "3type", "3const", "3head")
RENDER_TIMEOUT_S = 30

# "fcntl.2.gz" -> (fcntl, 2); "stat.3type.gz" -> (stat, 3type); "printf.h.3head.gz" -> (printf.h, 3head)
PAGE_RE = re.compile(r"^(?P<name>.+)\.(?P<section>[1-9][^.]*?)(?P<gz>\.gz)?$")
# how far down the NAME heading may be: after the header line and, on a few pages, a stray line
HEADER_MAX_LINES = 6

# Document ids: "man:{page}.{section}", e.g. "man:fcntl.2".
ID_PREFIX = "man:"
# Sections that say what a page is called and where it lives rather than what it does.
FRONT_MATTER_SECTIONS = frozenset({"NAME", "LIBRARY", "SYNOPSIS", "COLOPHON", "SEE ALSO"})


def page_id(name: str, section: str) -> str:
    return f"{ID_PREFIX}{name}.{section}"


def is_page_id(doc_id: str) -> bool:
    return doc_id.startswith(ID_PREFIX)


def page_of(doc_id: str) -> tuple[str, str] | None:
    """(name, section) of a page id: "man:printf.h.3head" -> ("printf.h", "3head")."""
    if not is_page_id(doc_id):
        return None
    name, _, section = doc_id[len(ID_PREFIX):].rpartition(".")
    return (name, section) if name else None


def parse_page_name(filename: str) -> tuple[str, str] | None:
    m = PAGE_RE.match(filename)
    return (m["name"], m["section"]) if m else None


def first_roff_line(source: str) -> str | None:
    """The first line that is not a comment or blank; it tells redirects and real pages apart."""
    for line in source.splitlines():
        s = line.strip()
        if not s or s in (".", "'") or s.startswith(('.\\"', "'\\\"", '.\\#', "\\\"")):
            continue
        return s
    return None


def _is_running_line(line: str) -> bool:
    """Header and footer lines start in column 0 and are laid out in columns; body lines are
    indented and section headings ("SEE ALSO") have no wide gaps."""
    return bool(line) and not line[0].isspace() and "   " in line


def normalize_rendered(text: str) -> str:
    """Drop the running header and footer, trailing spaces and runs of blank lines.

    The header ("fcntl(2)   System Calls Manual   fcntl(2)") is whatever precedes the NAME
    heading: long page names get it crammed together without gaps, and a few pages leak a stray
    line there, so it is matched by shape only on pages without a NAME section. The footer
    ("Linux man-pages 6.03   2023-02-05   fcntl(2)") is the last line.
    """
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    name_at = next((i for i, line in enumerate(lines[:HEADER_MAX_LINES]) if line == "NAME"), None)
    if name_at is not None:
        lines = lines[name_at:]
        has_header = True
    else:
        has_header = bool(lines) and _is_running_line(lines[0])
        lines = lines[1:] if has_header else lines
    if has_header:  # otherwise not laid out as a man page: keep everything
        while lines and not lines[-1]:
            lines.pop()
        if lines and _is_running_line(lines[-1]):
            lines.pop()
    text = "\n".join(lines).strip("\n")
    return re.sub(r"\n{4,}", "\n\n\n", text)


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of a rendered page: headings start in column 0, their text is indented."""
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line and not line[0].isspace():
            out.append((line.strip(), []))
        elif out:
            out[-1][1].append(line)
    return [(h, "\n".join(body).strip("\n")) for h, body in out]


def subsections(body: str) -> list[tuple[str, str]]:
    """(heading, text) of the subsections of a section body: man renders .SS headings indented
    3 spaces and their text 7."""
    out: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        m = re.match(r"^ {3}(\S.*)$", line)
        if m:
            out.append((m.group(1).strip(), []))
        elif out:
            out[-1][1].append(line)
    return [(h, "\n".join(b).strip("\n")) for h, b in out]


def body_text(text: str) -> str:
    """The page without its front matter (NAME, SYNOPSIS, SEE ALSO...): what it says, not what it
    is called."""
    return "\n\n".join(body for head, body in sections(text) if head not in FRONT_MATTER_SECTIONS)


def name_line(text: str) -> str | None:
    """The NAME section as one line, e.g. "fcntl - manipulate file descriptor"."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "NAME":
            body: list[str] = []
            for nxt in lines[i + 1 :]:
                if not nxt.strip():
                    if body:
                        break
                    continue
                if not nxt[:1].isspace():  # next section header
                    break
                body.append(nxt.strip())
            return " ".join(body) or None
    return None


@functools.lru_cache(maxsize=1)
def renderer_version() -> str:
    """Versions of man-db and groff: they change the rendered text, so they belong in the key."""
    out = []
    for cmd in (["man", "--version"], ["groff", "--version"]):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            out.append((r.stdout.splitlines() or [""])[0].strip())
        except (OSError, subprocess.SubprocessError):
            out.append("")
    return "; ".join(out)


@dataclass
class _Result:
    path: Path
    doc: Document | None = None
    status: str = "ok"  # ok | redirect | excluded | failed
    reason: str = ""


class LibcManCorpus(Corpus):
    """Man pages as documents `man:{name}.{section}` with source "libc".

    `project` keeps only pages whose `.TH` line names it: other -dev packages (libXt, libtasn1,
    libtirpc...) install their own pages into the same man3 directory, and a libc corpus should
    not change with what else happens to be installed. Set it to None to keep every page.
    Hyphenation and justification are turned off when rendering so that words stay whole and
    spacing stays single, which is what tokenizers and BM25 want.
    """

    @checked("corpus")
    def __init__(
        self,
        man_dir: Directory = "/usr/share/man",
        sections: list[str] | tuple[str, ...] = DEFAULT_SECTIONS,
        width: PositiveInt = 80,
        workers: PositiveInt = 4,
        project: Text | None = "Linux man-pages",  # null or "": every page, whatever its project
    ) -> None:
        super().__init__()
        self.man_dir = as_path(man_dir)
        self.sections = [str(s) for s in sections]
        self.width = int(width)
        self.workers = int(workers)
        self.project = project
        self.excluded: list[str] = []  # real pages of other projects, left out by `project`
        self.render_seconds: float | None = None

    def settings(self) -> dict[str, Any]:
        return {
            "man_dir": str(self.man_dir),
            "sections": self.sections,
            "width": self.width,
            "project": self.project,
            "renderer": renderer_version(),
        }

    def inputs(self) -> Any:
        return listing_fingerprint(self._candidates(), root=self.man_dir)

    def title(self) -> str:
        return "libc"

    def _candidates(self) -> list[Path]:
        """All files (links included) of the wanted sections, in a stable order."""
        if not self.man_dir.is_dir():
            raise RagError(f"{self.man_dir}: man directory not found")
        wanted = set(self.sections)
        out = []
        for subdir in sorted({f"man{s[0]}" for s in wanted}):
            d = self.man_dir / subdir
            if not d.is_dir():
                continue
            for entry in sorted(os.listdir(d)):
                parsed = parse_page_name(entry)
                if parsed and parsed[1] in wanted:
                    out.append(d / entry)
        return out

    def load(self) -> list[Document]:
        for tool in ("man", "col"):
            if shutil.which(tool) is None:
                raise RagError(f"LibcManCorpus: '{tool}' not found on PATH (install man-db and bsdextrautils)")
        self.skipped, self.excluded = [], []
        pages = [p for p in self._candidates() if not p.is_symlink()]
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(self.workers) as pool:
            results = list(pool.map(self._render, pages))
        self.render_seconds = time.perf_counter() - t0
        docs = []
        for r in results:
            if r.status == "ok" and r.doc is not None:
                docs.append(r.doc)
            elif r.status == "failed":
                log.warning("skipping man page %s: %s", r.path, r.reason)
                self.skipped.append(str(r.path))
            elif r.status == "excluded":
                self.excluded.append(str(r.path))
        log.info(
            "rendered %d man pages in %.1fs (%d skipped, %d of other projects)",
            len(docs), self.render_seconds, len(self.skipped), len(self.excluded),
        )
        return check_documents(docs, str(self.man_dir))

    def _render(self, path: Path) -> _Result:
        name, section = parse_page_name(path.name)  # type: ignore[misc]
        try:
            if path.suffix == ".gz":
                with gzip.open(path) as f:
                    raw = f.read()
            else:
                raw = path.read_bytes()
        except (OSError, EOFError) as e:
            return _Result(path, status="failed", reason=f"cannot read: {e}")
        source = raw.decode("utf-8", errors="replace")
        first = first_roff_line(source)
        if first is None:
            return _Result(path, status="failed", reason="no roff content")
        if first.startswith(".so "):
            return _Result(path, status="redirect")
        # .TH is the man(7) title line, .Dt its mdoc(7) counterpart (used by e.g. libxcrypt)
        th = next((line for line in source.splitlines() if line.startswith((".TH", ".Dt"))), None)
        if th is None:
            return _Result(path, status="failed", reason="no .TH/.Dt title line, not a man page")
        if self.project and self.project not in th:
            return _Result(path, status="excluded")

        env = {k: v for k, v in os.environ.items() if k not in ("MAN_KEEP_FORMATTING", "MANPAGER", "PAGER")}
        env.update(MANWIDTH=str(self.width), LC_ALL="C.UTF-8")
        try:
            man = subprocess.run(
                ["man", "--nh", "--nj", "-l", str(path)],
                capture_output=True, env=env, timeout=RENDER_TIMEOUT_S,
            )
            col = subprocess.run(
                ["col", "-bx"], input=man.stdout, capture_output=True, env=env, timeout=RENDER_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            return _Result(path, status="failed", reason=f"rendering took over {RENDER_TIMEOUT_S}s")
        except OSError as e:
            return _Result(path, status="failed", reason=f"cannot run renderer: {e}")
        text = normalize_rendered(col.stdout.decode("utf-8", errors="replace"))
        if not text.strip():
            # man's stderr carries the reason; its warnings alone are not a failure
            err = " ".join(man.stderr.decode("utf-8", errors="replace").split())[:200]
            return _Result(path, status="failed", reason=f"rendered empty (man exit {man.returncode}) {err}".strip())
        doc = Document(
            id=page_id(name, section),
            text=text,
            source="libc",
            meta={"page": name, "section": section, "title": name_line(text)},
        )
        return _Result(path, doc=doc)
