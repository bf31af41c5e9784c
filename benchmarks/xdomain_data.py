"""The cross-domain bed (data/xdomain/): three corpora cut from Debian documentation packages that
none of ragrig's fitted parts (v2's router, v3's cross-encoder, v4's per-group routes) has seen,
with questions written by hand.

    python -m benchmarks.xdomain_data build            # docs.jsonl and LICENSE from the installed packages
    python -m benchmarks.xdomain_data build --check    # the same, compared with the committed files
    python -m benchmarks.xdomain_data check            # every question against its document

`build` needs the packages (`apt-get install postgresql-doc-15 debian-handbook git-doc`); runs
and tests read only the committed files. A page's HTML becomes plain text through the standard
library's parser, with the navigation, tables of contents and page footers left out; a page is
one document, or is cut at its headings of level `cut` (each heading's anchor names the document,
`<page>/<anchor>`). The groups follow the documents' own structure (reference part, chapter or
folder). Exit status: 0 done, 1 a check failed, 2 bad input (one line naming it).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from rag.store.atomic import atomic_write_text
from rag.config.cli import HelpFormatter, run_cli
from rag.config.compose import PROJECT_ROOT
from rag.retriever.tokens import tokenize

ROOT = PROJECT_ROOT / "data" / "xdomain"
MIN_QUESTIONS = 40
# A cut piece shorter than this is a heading with a sentence or two (a chapter's lead-in): it
# holds no answer of its own, and as a document it would only add a near-empty target.
MIN_CHARS = 400
# Pages longer than this keep their opening, cut at a paragraph: the reference pages open with
# what a command does and its main options, and the bed stays small enough to run in minutes.
MAX_CHARS = 24_000
# Containers left out of a page's text: navigation bars, tables of contents, banners, footers.
SKIP_CLASSES = frozenset({"navheader", "navfooter", "docnav", "toc", "list-of-tables", "list-of-examples",
                          "list-of-figures", "indexterm"})
SKIP_IDS = frozenset({"banner", "title", "footer", "toc", "footnotes"})
SKIP_TAGS = frozenset({"head", "script", "style", "title"})
VOID = frozenset({"br", "hr", "img", "meta", "link", "input", "col", "area", "base", "wbr", "source"})
BLOCK = frozenset({"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "li", "tr", "pre", "dt", "dd", "table", "ul",
                   "ol", "dl", "blockquote", "br", "hr", "caption", "section"})
CELLS = frozenset({"td", "th"})  # a table's cells on one line, apart
HEADINGS = {f"h{i}": i for i in range(1, 7)}


class BedError(Exception):
    """Bad input to the builder or the checker: one line, exit status 2."""


@dataclass
class Piece:
    """A page's text from one heading (or the page's start) to the next heading at the cut level."""

    anchor: str | None
    chapter: str | None  # the anchor of the last level-1 heading before it
    parts: list[str] = field(default_factory=list)

    def text(self) -> str:
        lines = [line.rstrip() for line in "".join(self.parts).split("\n")]
        return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


class PageText(HTMLParser):
    """A page's text, cut into pieces at the headings of level <= `cut` (0: one piece). Text
    outside <pre> has its whitespace collapsed and its lines start at a block's edge; <pre> keeps
    its lines and their indentation (synopses, command sessions, diagrams)."""

    def __init__(self, cut: int = 0):
        super().__init__(convert_charrefs=True)
        self.cut = cut
        self.stack: list[tuple[str, bool]] = []
        self.skip = self.pre = 0
        self.heading: int | None = None  # the level of the cut heading being read
        self.chapter: str | None = None
        self.pieces = [Piece(None, None)]

    @property
    def out(self) -> list[str]:
        return self.pieces[-1].parts

    def _newline(self) -> None:
        if not self.skip:
            self.out.append("\n")

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag in VOID:
            if tag in BLOCK:
                self._newline()
            return
        classes = set((a.get("class") or "").split())
        skip = tag in SKIP_TAGS or bool(classes & SKIP_CLASSES) or a.get("id") in SKIP_IDS
        self.stack.append((tag, skip))
        self.skip += skip
        self.pre += tag == "pre"
        level = HEADINGS.get(tag)
        if level is not None and not self.skip and level <= self.cut:
            self.heading = level
            self.pieces.append(Piece(None, self.chapter))
        anchor = a.get("id") or a.get("name")
        if self.heading is not None and anchor and self.pieces[-1].anchor is None:
            self.pieces[-1].anchor = anchor
            if self.heading == 1:
                self.chapter = self.pieces[-1].chapter = anchor
        if tag in BLOCK:
            self._newline()
        elif tag in CELLS and not self.skip and self.out and not self.out[-1].endswith("\n"):
            self.out.append(" | ")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        for i in range(len(self.stack) - 1, -1, -1):  # closes what the page left open inside it
            if self.stack[i][0] == tag:
                for t, s in self.stack[i:]:
                    self.skip -= s
                    self.pre -= t == "pre"
                del self.stack[i:]
                break
        if tag in BLOCK:
            self._newline()
        if HEADINGS.get(tag) == self.heading:
            self.heading = None
            if self.pieces[-1].anchor is None and len(self.pieces) > 1:  # a note's title, not a section
                self.pieces[-2].parts.extend(self.pieces.pop().parts)

    def handle_data(self, data: str) -> None:
        if self.skip:
            return
        if self.pre:
            self.out.append(data)
            return
        text = re.sub(r"\s+", " ", data)
        if not self.out or self.out[-1].endswith("\n"):
            text = text.lstrip()
        if text:
            self.out.append(text)


def page_pieces(path: Path, cut: int) -> list[Piece]:
    parser = PageText(cut)
    parser.feed(path.read_text(encoding="utf-8"))
    parser.close()
    return [p for p in parser.pieces if p.text()]


def anchor_name(piece: Piece) -> str:
    """The piece's anchor, or for an anchor the stylesheet numbered (`id-1.9.16.6`, which moves
    whenever a section is added before it) a slug of its heading without the section number."""
    anchor = piece.anchor or ""
    if not re.fullmatch(r"id-[\d.]+", anchor):
        return anchor
    title = re.sub(r"^[\d.]+\s*", "", piece.text().split("\n", 1)[0])
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:48].rstrip("-")


def clip(text: str, limit: int = MAX_CHARS) -> str:
    """The text up to `limit` characters, ended at the last paragraph break before it."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    cut = head.rfind("\n\n")
    return head[:cut if cut > limit // 2 else limit].rstrip()


@dataclass(frozen=True)
class Source:
    """One corpus of the bed: which package, which pages, how they are cut and grouped."""

    name: str
    package: str
    version: str  # the version the committed docs.jsonl was built from
    html: Path  # the folder of the package's HTML pages
    copyright: Path
    pages: tuple[str, ...]  # paths under `html`, in the corpus's order
    group: Callable[[str, str | None], str | None]  # (page, chapter anchor) -> group; None leaves it out
    cut: Callable[[str], int] = lambda page: 0  # the heading level a page is cut at; 0 keeps it whole

    def documents(self) -> Iterator[dict[str, str]]:
        seen: set[str] = set()
        for page in self.pages:
            path = self.html / page
            if not path.is_file():
                raise BedError(f"{self.name}: {path} is not installed (apt-get install {self.package})")
            stem = page.rsplit(".", 1)[0]
            for piece in page_pieces(path, self.cut(page)):
                group = self.group(page, piece.chapter)
                text = clip(piece.text())
                if group is None or len(text) < MIN_CHARS:
                    continue
                doc_id = stem if piece.anchor in (None, stem) else f"{stem}/{anchor_name(piece)}"
                if doc_id in seen:
                    raise BedError(f"{self.name}: {page} gives the document id {doc_id!r} twice")
                seen.add(doc_id)
                yield {"id": doc_id, "text": text, "group": group}


# -- the three sources ------------------------------------------------------------------------

PG_SQL = (
    "select", "insert", "update", "delete", "merge", "copy", "values", "createtable", "createtableas", "altertable",
    "droptable", "truncate", "createindex", "dropindex", "reindex", "createview", "creatematerializedview",
    "refreshmaterializedview", "createsequence", "altersequence", "createschema", "createdatabase",
    "alterdatabase", "dropdatabase", "createrole", "alterrole", "droprole", "grant", "revoke",
    "alterdefaultprivileges", "reassign-owned", "drop-owned", "createpolicy", "createfunction", "createprocedure",
    "call", "do", "createtrigger", "createtype", "createdomain", "createextension",
    "createpublication", "createsubscription", "altersubscription", "createtablespace",
    "vacuum", "analyze", "cluster", "explain", "begin", "commit",
    "rollback", "savepoint", "rollback-to", "set-transaction", "set-constraints", "lock",
    "prepare", "execute", "prepare-transaction", "commit-prepared", "listen", "notify", "set", "show", "reset",
    "checkpoint", "comment", "declare", "fetch", "altersystem",
)
PG_ADMIN = (
    "creating-cluster", "server-start", "kernel-resources", "server-shutdown", "upgrading", "encryption-options",
    "ssl-tcp", "ssh-tunnels", "config-setting", "runtime-config-file-locations", "runtime-config-connection",
    "runtime-config-resource", "runtime-config-wal", "runtime-config-replication", "runtime-config-query",
    "runtime-config-logging", "runtime-config-statistics", "runtime-config-autovacuum", "runtime-config-client",
    "runtime-config-locks", "runtime-config-error-handling", "runtime-config-preset", "auth-pg-hba-conf",
    "auth-username-maps", "auth-trust", "auth-password", "auth-ident", "auth-peer", "auth-ldap", "auth-radius",
    "auth-cert", "auth-pam", "client-authentication-problems", "database-roles", "role-attributes",
    "role-membership", "role-removal", "predefined-roles", "manage-ag-overview", "manage-ag-createdb",
    "manage-ag-templatedbs", "manage-ag-config", "manage-ag-dropdb", "manage-ag-tablespaces", "locale",
    "collation", "multibyte", "routine-vacuuming", "routine-reindex", "logfile-maintenance", "backup-dump",
    "backup-file", "continuous-archiving", "different-replication-solutions", "warm-standby",
    "warm-standby-failover", "hot-standby", "monitoring-ps", "monitoring-stats", "monitoring-locks",
    "progress-reporting", "disk-usage", "disk-full", "wal-reliability", "checksums", "wal-intro",
    "wal-async-commit", "wal-configuration", "wal-internals", "logical-replication-publication",
    "logical-replication-subscription", "logical-replication-row-filter", "logical-replication-conflicts",
    "logical-replication-restrictions", "logical-replication-security", "logical-replication-config",
)


def _pg_group(page: str, chapter: str | None) -> str:
    return "sql-commands" if page.startswith("sql-") else "server-admin"


# Chapters of the Debian Administrator's Handbook (the chapter's page, then its sections' pages in
# the book's order), by what they are about: packages (chapters 5 and 6), the Unix services of one
# machine (chapter 9), the network's infrastructure (chapter 10).
HANDBOOK: dict[str, dict[str, tuple[str, ...]]] = {
    "packages": {
        "packaging-system": ("package-meta-information", "source-package-structure", "manipulating-packages-with-dpkg",
                             "coexistence-with-other-packaging-systems"),
        "apt": ("apt-get", "apt-cache", "apt-file", "apt-frontends", "package-authentication", "dist-upgrade",
                "regular-upgrades", "automatic-upgrades", "searching-packages"),
    },
    "services": {
        "unix-services": ("remote-login", "rights-management", "administration-interfaces", "syslog", "inetd",
                          "task-scheduling-cron-atd", "asynchronous-task-scheduling-anacron", "quotas", "backup",
                          "hotplug", "power-management"),
    },
    "network": {
        "network-infrastructure": ("x509-cert", "virtual-private-network", "quality-of-service", "dynamic-routing",
                                   "ipv6", "domain-name-servers", "dhcp", "network-diagnosis-tools"),
    },
}
HANDBOOK_GROUP = {f"{page}.html": group for group, chapters in HANDBOOK.items() for chapter, sections in chapters.items()
                  for page in (chapter, *(f"sect.{s}" for s in sections))}


def _handbook_group(page: str, chapter: str | None) -> str | None:
    return HANDBOOK_GROUP.get(page)


GIT_MANUAL = {  # user-manual.html's chapters (level-1 anchors) -> group
    "repositories-and-branches": "manual", "exploring-git-history": "manual", "Developing-With-git": "manual",
    "sharing-development": "manual", "cleaning-up-history": "manual", "advanced-branch-management": "manual",
    "git-concepts": "internals", "submodules": "internals", "low-level-operations": "internals",
    "hacking-git": "internals",
}
GIT_HOWTOS = (
    "coordinate-embargoed-releases", "keep-canonical-history-correct", "maintain-git", "new-command",
    "rebase-from-internal-branch", "rebuild-from-update-hook", "recover-corrupted-blob-object",
    "recover-corrupted-object-harder", "revert-a-faulty-merge", "revert-branch-rebase", "separating-topic-branches",
    "setup-git-server-over-http", "update-hook-example", "use-git-daemon", "using-merge-subtree",
    "using-signed-tag-in-pull-request",
)


def _git_group(page: str, chapter: str | None) -> str | None:
    if page.startswith("howto/"):
        return "howto"
    return GIT_MANUAL.get(chapter or "")


SOURCES = {
    s.name: s for s in (
        Source("postgresql", "postgresql-doc-15", "15.20-0+deb12u1", Path("/usr/share/doc/postgresql-doc-15/html"),
               Path("/usr/share/doc/postgresql-doc-15/copyright"),
               tuple(f"sql-{p}.html" for p in PG_SQL) + tuple(f"{p}.html" for p in PG_ADMIN), _pg_group),
        Source("handbook", "debian-handbook", "11.20220922", Path("/usr/share/doc/debian-handbook/html/en-US"),
               Path("/usr/share/doc/debian-handbook/copyright"), tuple(HANDBOOK_GROUP), _handbook_group,
               cut=lambda page: 3),
        Source("git", "git-doc", "1:2.39.5-0+deb12u3", Path("/usr/share/doc/git-doc"),
               Path("/usr/share/doc/git-doc/copyright"),
               ("user-manual.html", *(f"howto/{h}.html" for h in GIT_HOWTOS)), _git_group,
               cut=lambda page: 3 if page == "user-manual.html" else 0),
    )
}


# -- build and check --------------------------------------------------------------------------

def docs_jsonl(source: Source) -> str:
    return "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in source.documents())


def installed_version(package: str) -> str | None:
    try:
        done = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True,
                              check=False)
    except OSError:
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def build(names: list[str], root: Path, check: bool) -> int:
    """Writes (or with `check`, compares) each corpus's docs.jsonl and LICENSE. 1 when a
    compared file differs."""
    status = 0
    for name in names:
        source = SOURCES[name]
        version = installed_version(source.package)
        if version is None:
            raise BedError(f"{name}: the package {source.package} is not installed (apt-get install {source.package})")
        if version != source.version:
            print(f"{name}: {source.package} {version} is installed; the committed corpus was built from "
                  f"{source.version}, so its bytes may differ", file=sys.stderr)
        files = {"docs.jsonl": docs_jsonl(source), "LICENSE": source.copyright.read_text(encoding="utf-8")}
        n_docs = files["docs.jsonl"].count("\n")
        for fname, text in files.items():
            path = root / name / fname
            if check:
                same = path.is_file() and path.read_text(encoding="utf-8") == text
                status |= not same
                print(f"{path}: {'same' if same else 'DIFFERS from what the package gives'}")
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(path, text)
        if not check:
            print(f"{root / name / 'docs.jsonl'}: {n_docs} documents, {len(files['docs.jsonl'].encode()) / 1e6:.2f} MB")
    return status


# An answer is supported when this share of its content words occur in its document.
SUPPORT = 0.8
# A question that repeats this many consecutive words of its document copies the passage.
COPIED_RUN = 6


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9_]+", text.lower())


def content_words(text: str) -> dict[str, str]:
    """The text's terms as BM25 sees them (stopwords out, Snowball stems), but one- and two-letter
    ones: stem -> the word as written (its first occurrence)."""
    stems, written = tokenize([text])[0], tokenize([text], stem=False)[0]
    out: dict[str, str] = {}
    for stem, word in zip(stems, written):
        if len(stem) > 2:
            out.setdefault(stem, word)
    return out


def read_jsonl(path: Path) -> list[dict[str, object]]:
    if not path.is_file():
        raise BedError(f"{path}: no such file")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            row = json.loads(line)
        except ValueError as e:
            raise BedError(f"{path}:{n}: not JSON ({e})") from None
        if not isinstance(row, dict):
            raise BedError(f"{path}:{n}: not a JSON object")
        rows.append(row)
    return rows


def problems(name: str, root: Path = ROOT) -> list[str]:
    """What is wrong with one corpus's questions, one line each: a field missing or of the wrong
    type, an id used twice, a doc_id that no document has, a group that is not its document's,
    an answer whose words its document does not hold, a question that copies its document, too
    few questions."""
    docs = {str(d.get("id")): d for d in read_jsonl(root / name / "docs.jsonl")}
    path = root / name / "questions.jsonl"
    questions = read_jsonl(path)
    out: list[str] = []
    seen: set[str] = set()
    for n, q in enumerate(questions, 1):
        where = f"{path}:{n}"
        bad = [k for k in ("id", "question", "answer", "doc_id", "group") if not isinstance(q.get(k), str) or not q[k]]
        if bad:
            out.append(f"{where}: {', '.join(bad)} missing or not a non-empty string")
            continue
        qid, doc_id = str(q["id"]), str(q["doc_id"])
        if qid in seen:
            out.append(f"{where}: id {qid!r} used twice")
        seen.add(qid)
        doc = docs.get(doc_id)
        if doc is None:
            out.append(f"{where}: doc_id {doc_id!r} is no document of {name}/docs.jsonl")
            continue
        if q["group"] != doc.get("group"):
            out.append(f"{where}: group {q['group']!r}, but {doc_id} is in {doc.get('group')!r}")
        text = str(doc.get("text", ""))
        have = content_words(text)
        need = content_words(str(q["answer"]))
        missing = sorted(word for stem, word in need.items() if stem not in have)
        if need and len(missing) > (1 - SUPPORT) * len(need):
            out.append(f"{where}: {doc_id} does not hold the answer's words {missing}")
        doc_words = " ".join(words(text))
        qw = words(str(q["question"]))
        runs = {" ".join(qw[i:i + COPIED_RUN]) for i in range(len(qw) - COPIED_RUN + 1)}
        copied = sorted(r for r in runs if f" {r} " in f" {doc_words} ")
        if copied:
            out.append(f"{where}: the question copies its document: {copied[0]!r}")
    if len(questions) < MIN_QUESTIONS:
        out.append(f"{path}: {len(questions)} questions, fewer than {MIN_QUESTIONS}")
    return out


def check(names: list[str], root: Path) -> int:
    status = 0
    for name in names:
        found = problems(name, root)
        for line in found:
            print(line)
        n = len(read_jsonl(root / name / "questions.jsonl"))
        print(f"{name}: {n} questions, {'ok' if not found else f'{len(found)} problem(s)'}")
        status |= bool(found)
    return status


def main(argv: list[str] | None = None) -> int:
    lines = (__doc__ or "").strip().splitlines()
    ap = argparse.ArgumentParser(prog="python -m benchmarks.xdomain_data", description=lines[0],
                                 formatter_class=HelpFormatter, epilog="\n".join(lines[2:]))
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="regenerate docs.jsonl and LICENSE from the installed packages")
    b.add_argument("--name", action="append", choices=sorted(SOURCES), help="only this corpus (repeatable)")
    b.add_argument("--check", action="store_true", help="compare with the committed files instead of writing")
    b.add_argument("--root", type=Path, default=ROOT)
    c = sub.add_parser("check", help="check every question against its document")
    c.add_argument("--name", action="append", choices=sorted(SOURCES), help="only this corpus (repeatable)")
    c.add_argument("--root", type=Path, default=ROOT)
    args = ap.parse_args(argv)
    try:
        if args.command == "build":
            return build(args.name or list(SOURCES), args.root, args.check)
        return check(args.name or list(SOURCES), args.root)
    except BedError as e:
        print(f"benchmarks.xdomain_data: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    run_cli(main)
