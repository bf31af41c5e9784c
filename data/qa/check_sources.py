#!/usr/bin/env python
"""Validate the hand-written QA sets in data/qa/: the dev sets and the held-out sets.

Files: libc.jsonl and pytorch.jsonl (dev, tuned on) and heldout_libc.jsonl and
heldout_pytorch.jsonl (held out: final verdicts only, see data/README.md).

Checks, for every file:
  * every line is a JSON object with exactly the keys
    id, question, answer, source, corpus (all non-empty strings);
  * ids look like "<corpus>-NNN" (dev) or "heldout-<corpus>-NNN" (held out), are unique across
    all four files, and corpus has the expected value;
  * no source document is used by more than MAX_PER_SOURCE questions of one file;
  * every source exists:
      - "man:<name>.<section>": /usr/share/man/man<section>/<name>.<section>[.gz]
        is a regular file (not a symlink) and not a ".so" redirect stub;
      - "torch:<qualified name>": resolves via importlib/getattr, is reached
        through one of the modules the PyTorch corpus walks (PUBLIC_TORCH_MODULES,
        using the first of them through which the object is public, a module's
        __all__ when it has one) and has a non-empty __doc__;
      - "torchdoc:<path>": a .rst/.md file under the PyTorch docs folder;
    and, unless --no-corpus, is the id of a document of the default corpus (loaded through the
    project's loaders and artifact cache, so the check sees exactly what a run retrieves from);
  * no held-out question repeats a dev question: none is identical or near-identical (after
    normalising case, punctuation and spacing, a difflib ratio or word-set Jaccard of at least
    NEAR_DUPLICATE) to any dev question.

Usage: python data/qa/check_sources.py [--man-root DIR] [--docs-dir DIR] [--no-corpus]
Prints a one-line summary; exits non-zero if any problem is found.
"""

from __future__ import annotations

import argparse
import difflib
import gzip
import importlib
import json
import os
import re
import sys
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@dataclass(frozen=True)
class QAFile:
    corpus: str        # libc | pytorch
    path: Path
    heldout: bool
    min_questions: int

    @property
    def id_re(self) -> re.Pattern[str]:
        return re.compile(rf"^{'heldout-' if self.heldout else ''}{self.corpus}-\d{{3,}}$")


FILES = [
    QAFile("libc", HERE / "libc.jsonl", False, 45),
    QAFile("pytorch", HERE / "pytorch.jsonl", False, 45),
    QAFile("libc", HERE / "heldout_libc.jsonl", True, 40),
    QAFile("pytorch", HERE / "heldout_pytorch.jsonl", True, 40),
]
SOURCE_PREFIX = {"libc": ("man:",), "pytorch": ("torch:", "torchdoc:")}
KEYS = {"id", "question", "answer", "source", "corpus"}
MAX_PER_SOURCE = 2
NEAR_DUPLICATE = 0.8
DOC_SUFFIXES = (".rst", ".md")

# This checkout's rag package, not an installed copy: the corpus defines what a source id is.
sys.path.insert(0, str(ROOT))
from rag.corpus.pytorch import DEFAULT_MODULES  # noqa: E402

# The modules the PyTorch corpus walks, in its order. Order matters: the corpus documents an
# object under the first of them through which it is public, so a source must use that name.
PUBLIC_TORCH_MODULES = list(DEFAULT_MODULES)

MAN_RE = re.compile(r"^man:([A-Za-z0-9_.+:-]+)\.(2|3|3type|3const|3head)$")


# ---------------------------------------------------------------- man pages

def man_page_problem(source: str, man_root: Path) -> str | None:
    m = MAN_RE.match(source)
    if not m:
        return "malformed man source (expected man:<name>.<2|3|3type|3const|3head>)"
    name, sec = m.groups()
    base = man_root / f"man{sec}" / f"{name}.{sec}"
    path = None
    for cand in (Path(str(base) + ".gz"), base):
        if os.path.lexists(cand):
            path = cand
            break
    if path is None:
        return f"man page file not found: {base}[.gz]"
    if path.is_symlink():
        return f"man page is a symlink: {path}"
    if not path.is_file():
        return f"man page is not a regular file: {path}"
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
            text = fh.read(4096)
    except OSError as exc:
        return f"cannot read man page {path}: {exc}"
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    if first.startswith(".so"):
        return f"man page is a .so redirect stub ({first.strip()}): {path}"
    if not text.strip():
        return f"man page is empty: {path}"
    return None


# ------------------------------------------------------------ torch objects

_module_cache: dict[str, object] = {}


def _load(modname: str):
    """Return a module, or torch.Tensor for the pseudo-module 'torch.Tensor'."""
    if modname not in _module_cache:
        if modname == "torch.Tensor":
            import torch
            _module_cache[modname] = torch.Tensor
        else:
            _module_cache[modname] = importlib.import_module(modname)
    return _module_cache[modname]


def _public_attrs(container) -> dict[int, tuple[str, object]]:
    """Map id(obj) -> (attribute name, obj) for the public attributes of container.

    The object itself is kept in the value so that its id cannot be reused.
    """
    out: dict[int, tuple[str, object]] = {}
    exported = getattr(container, "__all__", None) if isinstance(container, type(sys)) else None
    # Like the corpus walk: a module's __all__ when it has one, else everything dir() lists.
    names = [str(n) for n in exported] if isinstance(exported, (list, tuple)) else dir(container)
    for attr in names:
        if attr.startswith("_"):
            continue
        try:
            val = getattr(container, attr)
        except Exception:
            continue
        out.setdefault(id(val), (attr, val))
    return out


_attr_index: dict[str, dict[int, tuple[str, object]]] = {}


def _first_public_home(obj) -> str | None:
    for modname in PUBLIC_TORCH_MODULES:
        if modname not in _attr_index:
            try:
                _attr_index[modname] = _public_attrs(_load(modname))
            except Exception:  # a module this torch build lacks: the corpus skips it as well
                _attr_index[modname] = {}
        if id(obj) in _attr_index[modname]:
            return modname
    return None


def torch_problem(source: str) -> str | None:
    qual = source[len("torch:"):]
    if not qual or qual.startswith(".") or qual.endswith(".") or ".." in qual:
        return "malformed torch source"
    # Longest public module that prefixes the name.
    home = None
    for modname in PUBLIC_TORCH_MODULES:
        if qual.startswith(modname + ".") and (home is None or len(modname) > len(home)):
            home = modname
    if home is None:
        return f"{qual} is not under one of the public modules"
    rest = qual[len(home) + 1:].split(".")
    if len(rest) > 2:
        return f"{qual}: expected <module>.<name> or <module>.<Class>.<method>"
    if any(part.startswith("_") for part in rest):
        return f"{qual}: private name"
    try:
        container = _load(home)
    except Exception as exc:  # pragma: no cover - import failure
        return f"cannot import {home}: {exc}"
    try:
        top = getattr(container, rest[0])
        obj = getattr(top, rest[1]) if len(rest) == 2 else top
    except AttributeError as exc:
        return f"{qual} does not resolve: {exc}"
    if isinstance(top, type(sys)):
        return f"{qual}: {home}.{rest[0]} is a module, not a public object of {home}"
    doc = getattr(obj, "__doc__", None)
    if not isinstance(doc, str) or not doc.strip():
        return f"{qual} has no docstring"
    first = _first_public_home(top)
    if first is not None and first != home:
        if PUBLIC_TORCH_MODULES.index(first) < PUBLIC_TORCH_MODULES.index(home):
            name = _attr_index[first][id(top)][0]
            return (f"{qual}: object is public earlier as {first}.{name}; "
                    "use that name")
    return None


# ------------------------------------------------------------ doc sources

def default_docs_dir() -> Path:
    """Where the default corpus reads the PyTorch reST docs from (paths.data in conf/config.yaml)."""
    return Path(os.environ.get("RAGRIG_DATA") or ROOT / "data") / "pytorch-docs"


def torchdoc_problem(source: str, docs_dir: Path) -> str | None:
    rel = source[len("torchdoc:"):]
    if not rel or rel.startswith("/") or ".." in rel.split("/"):
        return "malformed torchdoc source (expected torchdoc:<path relative to the docs folder>)"
    if not rel.endswith(DOC_SUFFIXES):
        return f"{rel}: not a {'/'.join(DOC_SUFFIXES)} file"
    if not (docs_dir / rel).is_file():
        return f"doc file not found: {docs_dir / rel}"
    return None


def source_problem(src: str, corpus: str, man_root: Path, docs_dir: Path) -> str | None:
    if not src.startswith(SOURCE_PREFIX[corpus]):
        return f"source should start with one of {SOURCE_PREFIX[corpus]}"
    if corpus == "libc":
        return man_page_problem(src, man_root)
    if src.startswith("torchdoc:"):
        return torchdoc_problem(src, docs_dir)
    return torch_problem(src)


# ------------------------------------------------------------------ corpus

def corpus_ids() -> set[str]:
    """Document ids of the default corpus (conf/corpus/mixed.yaml), through the artifact cache."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from rag.store.cache import ArtifactCache
    from rag.config.compose import register_resolvers
    from rag.corpus.loading import load_corpus

    register_resolvers()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config")
    docs, _ = load_corpus(instantiate(cfg.corpus, _convert_="all"), ArtifactCache(cfg.paths.cache))
    return {d.id for d in docs}


# -------------------------------------------------------------- duplicates

def normalize(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9_]+", " ", text.lower()).split())


def similarity(a: list[str], b: list[str]) -> float:
    """The larger of difflib's ratio over the word sequences and the Jaccard of the word sets."""
    sa, sb = set(a), set(b)
    jaccard = len(sa & sb) / len(sa | sb) if sa | sb else 1.0
    return max(difflib.SequenceMatcher(None, a, b, autojunk=False).ratio(), jaccard)


def closest_pairs(heldout: list[dict], dev: list[dict]) -> list[tuple[float, dict, dict]]:
    """For each held-out question, its most similar dev question (after `normalize`), most
    similar first."""
    dev_words = [(normalize(d["question"]).split(), d) for d in dev]
    out = []
    for h in heldout:
        words = normalize(h["question"]).split()
        score, d = max(((similarity(words, dw), d) for dw, d in dev_words), key=lambda t: t[0])
        out.append((score, h, d))
    return sorted(out, key=lambda t: -t[0])


# ------------------------------------------------------------------- driver

def read_file(qf: QAFile, problems: list[str]) -> list[dict]:
    """The well-formed records of one file; format problems are appended to `problems`."""
    if not qf.path.exists():
        problems.append(f"{qf.path}: missing")
        return []
    records = []
    with open(qf.path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            where = f"{qf.path.name}:{lineno}"
            if not line.strip():
                problems.append(f"{where}: blank line")
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.append(f"{where}: invalid JSON ({exc})")
                continue
            if not isinstance(rec, dict):
                problems.append(f"{where}: not a JSON object")
                continue
            keys = set(rec)
            if keys != KEYS:
                missing, extra = KEYS - keys, keys - KEYS
                problems.append(f"{where}: keys mismatch missing={sorted(missing)} extra={sorted(extra)}")
            bad = [k for k in KEYS if not isinstance(rec.get(k), str) or not rec.get(k, "").strip()]
            if bad:
                problems.append(f"{where}: empty or non-string fields {sorted(bad)}")
                continue
            records.append({**rec, "where": where})
    return records


def check_file(qf: QAFile, records: list[dict], seen_ids: dict[str, str], man_root: Path,
               docs_dir: Path, known: set[str] | None, problems: list[str]) -> None:
    per_source: Counter[str] = Counter()
    for rec in records:
        where, rid, src = rec["where"], rec["id"], rec["source"]
        if rec["corpus"] != qf.corpus:
            problems.append(f"{where}: corpus {rec['corpus']!r}, expected {qf.corpus!r}")
        if not qf.id_re.match(rid):
            problems.append(f"{where}: id {rid!r} should look like {'heldout-' if qf.heldout else ''}{qf.corpus}-NNN")
        if rid in seen_ids:
            problems.append(f"{where}: duplicate id {rid!r} (first at {seen_ids[rid]})")
        seen_ids.setdefault(rid, where)
        per_source[src] += 1
        err = source_problem(src, qf.corpus, man_root, docs_dir)
        if err:
            problems.append(f"{where}: {src}: {err}")
        elif known is not None and src not in known:
            problems.append(f"{where}: {src}: not a document id of the default corpus")
    for src, n in per_source.items():
        if n > MAX_PER_SOURCE:
            problems.append(f"{qf.path.name}: {src} used by {n} questions (max {MAX_PER_SOURCE})")
    if len(records) < qf.min_questions:
        problems.append(f"{qf.path.name}: only {len(records)} questions (need at least {qf.min_questions})")


def check_heldout_vs_dev(heldout: list[dict], dev: list[dict], problems: list[str]) -> float:
    """Flags held-out questions that repeat a dev question; returns the highest similarity seen."""
    pairs = closest_pairs(heldout, dev)
    for score, h, d in pairs:
        if score >= NEAR_DUPLICATE:
            problems.append(f"{h['where']}: question {'repeats' if score == 1.0 else 'nearly repeats'} "
                            f"dev {d['id']} (similarity {score:.2f}): {h['question']!r}")
    return pairs[0][0] if pairs else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--man-root", default="/usr/share/man", type=Path)
    ap.add_argument("--docs-dir", default=None, type=Path,
                    help="PyTorch docs folder for torchdoc: sources (default: $RAGRIG_DATA or data/, /pytorch-docs)")
    ap.add_argument("--no-corpus", action="store_true",
                    help="skip loading the corpus; check sources against files and the torch package only")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    problems: list[str] = []
    known = None if args.no_corpus else corpus_ids()
    docs_dir = args.docs_dir or default_docs_dir()
    seen_ids: dict[str, str] = {}
    records = {qf.path.name: read_file(qf, problems) for qf in FILES}
    for qf in FILES:
        check_file(qf, records[qf.path.name], seen_ids, args.man_root, docs_dir, known, problems)
    dev = [r for qf in FILES if not qf.heldout for r in records[qf.path.name]]
    heldout = [r for qf in FILES if qf.heldout for r in records[qf.path.name]]
    closest = check_heldout_vs_dev(heldout, dev, problems)
    for p in problems:
        print(f"PROBLEM: {p}", file=sys.stderr)
    status = "OK" if not problems else "FAIL"
    counts = " ".join(f"{qf.path.stem}={len(records[qf.path.name])}" for qf in FILES)
    where = "files and torch only (--no-corpus)" if known is None else f"the default corpus ({len(known)} documents)"
    print(f"{status}: {counts} questions checked; sources checked against {where}; "
          f"closest held-out/dev question pair {closest:.2f} (limit {NEAR_DUPLICATE}); {len(problems)} problem(s)")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
