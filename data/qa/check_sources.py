#!/usr/bin/env python
"""Validate the hand-written development QA sets in data/qa/.

Checks, for libc.jsonl and pytorch.jsonl:
  * every line is a JSON object with exactly the keys
    id, question, answer, source, corpus (all non-empty strings);
  * ids are unique, look like "<corpus>-NNN" and corpus has the expected value;
  * no source document is used by more than MAX_PER_SOURCE questions;
  * every source exists:
      - "man:<name>.<section>": /usr/share/man/man<section>/<name>.<section>[.gz]
        is a regular file (not a symlink) and not a ".so" redirect stub;
      - "torch:<qualified name>": resolves via importlib/getattr, is reached
        through one of the public modules listed in PUBLIC_TORCH_MODULES (using
        the first of them through which the object is public) and has a
        non-empty __doc__.

Usage: python data/qa/check_sources.py [--man-root DIR]
Prints a one-line summary; exits non-zero if any problem is found.
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import json
import os
import re
import sys
import warnings
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = {"libc": HERE / "libc.jsonl", "pytorch": HERE / "pytorch.jsonl"}
SOURCE_PREFIX = {"libc": "man:", "pytorch": "torch:"}
KEYS = {"id", "question", "answer", "source", "corpus"}
MAX_PER_SOURCE = 2
MIN_QUESTIONS = 45

# Order matters: a torch object must be named under the first module of this
# list through which it is public.
PUBLIC_TORCH_MODULES = [
    "torch",
    "torch.Tensor",
    "torch.nn",
    "torch.nn.functional",
    "torch.nn.init",
    "torch.nn.utils",
    "torch.optim",
    "torch.optim.lr_scheduler",
    "torch.utils.data",
    "torch.autograd",
    "torch.linalg",
    "torch.fft",
    "torch.special",
    "torch.distributions",
    "torch.cuda",
    "torch.amp",
    "torch.jit",
    "torch.hub",
    "torch.random",
    "torch.sparse",
    "torch.profiler",
    "torch.utils.checkpoint",
]

MAN_RE = re.compile(r"^man:([A-Za-z0-9_.+:-]+)\.([23])$")
ID_RE = re.compile(r"^(libc|pytorch)-(\d{3,})$")


# ---------------------------------------------------------------- man pages

def man_page_problem(source: str, man_root: Path) -> str | None:
    m = MAN_RE.match(source)
    if not m:
        return "malformed man source (expected man:<name>.<2|3>)"
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
    for attr in dir(container):
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
            _attr_index[modname] = _public_attrs(_load(modname))
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


# ------------------------------------------------------------------- driver

def check_file(corpus: str, path: Path, man_root: Path, seen_ids: set[str],
               problems: list[str]) -> int:
    if not path.exists():
        problems.append(f"{path}: missing")
        return 0
    count = 0
    per_source: Counter[str] = Counter()
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            where = f"{path.name}:{lineno}"
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
            count += 1
            keys = set(rec)
            if keys != KEYS:
                missing, extra = KEYS - keys, keys - KEYS
                problems.append(f"{where}: keys mismatch missing={sorted(missing)} extra={sorted(extra)}")
            bad = [k for k in KEYS if not isinstance(rec.get(k), str) or not rec.get(k, "").strip()]
            if bad:
                problems.append(f"{where}: empty or non-string fields {sorted(bad)}")
                continue
            rid, src = rec["id"], rec["source"]
            if rec["corpus"] != corpus:
                problems.append(f"{where}: corpus {rec['corpus']!r}, expected {corpus!r}")
            m = ID_RE.match(rid)
            if not m or m.group(1) != corpus:
                problems.append(f"{where}: id {rid!r} should look like {corpus}-NNN")
            if rid in seen_ids:
                problems.append(f"{where}: duplicate id {rid!r}")
            seen_ids.add(rid)
            if not src.startswith(SOURCE_PREFIX[corpus]):
                problems.append(f"{where}: source {src!r} should start with {SOURCE_PREFIX[corpus]!r}")
                continue
            per_source[src] += 1
            err = man_page_problem(src, man_root) if corpus == "libc" else torch_problem(src)
            if err:
                problems.append(f"{where}: {src}: {err}")
    for src, n in per_source.items():
        if n > MAX_PER_SOURCE:
            problems.append(f"{path.name}: {src} used by {n} questions (max {MAX_PER_SOURCE})")
    if count < MIN_QUESTIONS:
        problems.append(f"{path.name}: only {count} questions (need at least {MIN_QUESTIONS})")
    return count


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--man-root", default="/usr/share/man", type=Path)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    problems: list[str] = []
    seen_ids: set[str] = set()
    counts = {c: check_file(c, p, args.man_root, seen_ids, problems) for c, p in FILES.items()}
    for p in problems:
        print(f"PROBLEM: {p}", file=sys.stderr)
    status = "OK" if not problems else "FAIL"
    print(f"{status}: libc={counts['libc']} pytorch={counts['pytorch']} "
          f"questions checked, {len(problems)} problem(s)")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
