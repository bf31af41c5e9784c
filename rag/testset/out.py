"""The files `python -m rag.testset` writes, and the rule by which it replaces one: only its own,
checked at start-up, before a passage is cut or a request is sent.

- The question file (`testset.out`) is replaced only when the summary beside it
  (`<out>` with the suffix .summary.json) vouches for it: every summary records the sha256 of the
  question file the generator wrote there (`out_sha256`), and the file still has it. A file with
  no such summary (a user's own question file) or changed since (a question fixed by hand) is
  refused: move it, or choose another testset.out.
- A summary (`.summary.json`, a dry run's `.dry_run.json`) is replaced only when it is a testset
  summary of this `testset.out` (a JSON object naming it, with its passage and filter counts).
- The corpus's own files and the question file of the composed `qa` (every path their settings
  name, and anything inside a corpus folder) are never written, whoever wrote them.
- `testset.out` naming a folder, a link, or a path below a file is refused.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.utils import to_absolute_path

from rag.store.atomic import atomic_write_text
from rag.testset.settings import TestsetSettings
from rag.types import RagError

_GLOB = set("*?[")


def sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _read_summary(path: Path, out: Path) -> dict[str, Any] | None:
    """The testset summary at `path` for the question file `out`, or None when it is no such thing."""
    if path.is_symlink() or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("out") != str(out) or not {"passages", "filters"} <= set(data):
        return None
    return data


def vouched_sha(ts: TestsetSettings) -> str | None:
    """The sha256 the summary beside `ts.out` records for the question file written there."""
    summary = _read_summary(ts.out.with_suffix(".summary.json"), ts.out)
    value = summary.get("out_sha256") if summary else None
    return value if isinstance(value, str) else None


def _input_paths(node: Any, where: str) -> Iterator[tuple[str, str]]:
    """(setting, value) of every string in a corpus or qa node that could name a file or folder."""
    if isinstance(node, dict):
        for k, v in node.items():
            if str(k) != "_target_":
                yield from _input_paths(v, f"{where}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _input_paths(v, f"{where}[{i}]")
    elif isinstance(node, str) and node and ("/" in node or "." in node) and "://" not in node:
        yield where, node


def _protected(out: Path, setting: str, value: str, corpus: bool) -> str | None:
    """Why `out` may not be written, given one input path setting; None when it may."""
    if _GLOB & set(value):
        if fnmatch.fnmatch(str(out), to_absolute_path(value)):
            return f"matches {setting}={value}"
        return None
    p = Path(to_absolute_path(value))
    same = p.resolve() == out.resolve() or (p.exists() and out.exists() and out.samefile(p))
    if same:
        return f"is {setting}"
    if corpus and p.is_dir() and p.resolve() in out.resolve().parents:
        return f"is inside the corpus folder {setting}={value}"
    return None


def check_out(ts: TestsetSettings, corpus: Any, qa: Any) -> None:
    """Refuses (RagError, one line) a `testset.out` the generator may not write, before anything
    is loaded or asked (see the module docstring). `corpus` and `qa` are the resolved nodes."""
    out = ts.out
    for node, name, is_corpus in ((corpus, "corpus", True), (qa, "qa", False)):
        for setting, value in _input_paths(node, name):
            why = _protected(out, setting, value, is_corpus)
            if why:
                raise RagError(f"testset.out={out} {why}: the question set is never written over its own "
                               "inputs; choose another testset.out")
    if out.is_symlink():
        raise RagError(f"testset.out={out} is a link; the question set is written only as a file of its own: "
                       "choose another testset.out")
    if out.exists() and not out.is_file():
        raise RagError(f"testset.out={out} is a folder, not a file: name the question file, e.g. "
                       f"testset.out={out / 'questions.jsonl'}")
    parent = next((a for a in out.parents if a.exists()), None)
    if parent is not None and not parent.is_dir():
        raise RagError(f"testset.out={out}: {parent} is a file, not a folder; choose another testset.out")
    if out.exists():
        vouched = vouched_sha(ts)
        if vouched is None:
            raise RagError(f"testset.out={out} exists and was not written by python -m rag.testset (no "
                           f"{out.with_suffix('.summary.json').name} beside it vouches for it); it is not replaced: "
                           "move it, or choose another testset.out")
        if sha256(out) != vouched:
            raise RagError(f"testset.out={out} was changed since python -m rag.testset wrote it (its sha256 differs "
                           f"from the one in {out.with_suffix('.summary.json').name}); it is not replaced: move it, "
                           "or choose another testset.out")
    summary = ts.summary_path
    if summary.is_symlink() or (summary.exists() and _read_summary(summary, out) is None):
        raise RagError(f"{summary} exists and is not the summary python -m rag.testset wrote for testset.out={out}; "
                       "it is not replaced: move it, or choose another testset.out")


def write_summary(ts: TestsetSettings, summary: dict[str, Any], out_sha256: str | None) -> None:
    """The summary, vouching for the question file at `ts.out` (`out_sha256`: the file just
    written, or the earlier one this run left in place)."""
    doc = {**summary, "out_sha256": out_sha256} if out_sha256 else dict(summary)
    ts.summary_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(ts.summary_path, json.dumps(doc, indent=2, ensure_ascii=False, default=str) + "\n")


def write_questions(ts: TestsetSettings, text: str) -> str:
    """Writes the question file whole; its sha256, for the summary that vouches for it."""
    ts.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(ts.out, text)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def kept_sha(ts: TestsetSettings) -> str | None:
    """The sha256 of the question file an earlier run wrote and this one leaves in place (a run
    that wrote none: a dry run, or no question passed), so that its summary still vouches for it."""
    vouched = vouched_sha(ts)
    return vouched if vouched is not None and ts.out.is_file() and sha256(ts.out) == vouched else None
