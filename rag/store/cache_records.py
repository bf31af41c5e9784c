"""Reading a record back (one small JSON result of the artifact cache: an answer, a judgement):
whether the bytes at its path are the record asked for (`checked_record`; an artifact's directory
is checked against its key by the same rule, `foreign`), the seed's checksums of its records
(`seed_record_sums`), and each failure named once (`report_once`). How the cache seals
its own records, and where they lie: rag/store/cache.py."""
from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("rag.store.cache")  # what it reports is the cache's, under the cache's name

RECORD_SUMS = "record_sha256"  # SEED.json's {kind: {key: sha256 of the record's file}}
# Damaged records already reported by this process, by the same stat: a record that several stages
# look up is named once, and again only once it has been rewritten and damaged anew.
_REPORTED: set[tuple[str, int, int, int]] = set()
# The seed's record checksums, parsed once per version of its SEED.json.
_SEED_SUMS: dict[Path, tuple[tuple[int, int, int], dict[str, Any]]] = {}


def parse_record(raw: bytes) -> tuple[Any, str | None]:
    """(the JSON in `raw`, None) or (None, what is wrong with it)."""
    try:
        return json.loads(raw.decode("utf-8")), None
    except (ValueError, UnicodeDecodeError):
        return None, "is damaged (not valid JSON: truncated or overwritten)"


OLDER_RECORD = "has no checksum (written by an older ragrig)"


def checked_record(path: Path, key: str, verify: Callable[[bytes], tuple[Any, str | None]],
                   what: str, remedy: str) -> dict[str, Any] | None:
    """The record in `path` if `verify` passes it and it is `key`'s; None when there is none or
    it fails (reported once per version of the file: "cache: <what> <path> <problem>; <remedy>")."""
    try:
        body, problem = verify(path.read_bytes())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:  # a directory or an unreadable file where the record belongs
        body, problem = None, f"is unreadable ({e.strerror})"
    if problem is None and not isinstance(body, dict):
        problem = "is damaged (not a JSON object)"
    elif problem is None:
        problem = foreign(body.get("key"), key, "record", "file")
    if problem is None:
        return body
    if problem == OLDER_RECORD:
        # A cache from before records carried checksums holds many of them: one line per kind's
        # folder, not one per record.
        report_once(path.parent.parent, f"cache: {what}s in {path.parent.parent} have no checksum (written by an "
                                        "older ragrig); rebuilding each as it is read")
        return None
    report_once(path, f"cache: {what} {path} {problem}; {remedy}")
    return None


def foreign(held: Any, key: str, what: str, where: str) -> str | None:
    """What is wrong with an entry found at `key`'s place that names key `held` (None: nothing):
    a copied or moved entry is another configuration's result, never this one's. `what`: "record"
    or "entry"; `where`: what was moved, "file" or "directory"."""
    if held == key:
        return None
    return f"is damaged (it holds the {what} of key {held!r}, not {key!r}: a moved or copied {where})"


def report_once(path: Path, line: str) -> None:
    try:
        st = path.stat()
        seen = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
    except OSError:
        seen = (str(path), -1, -1, -1)
    if seen not in _REPORTED:
        _REPORTED.add(seen)
        log.warning("%s", line)


def seed_record_sums(index: Path) -> dict[str, Any]:
    """{kind: {key: sha256}} from the seed's manifest; {} when it has none (then no seed record
    is trusted). Parsed once per version of the file."""
    try:
        st = index.stat()
    except OSError:
        return {}
    stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
    cached = _SEED_SUMS.get(index)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    try:
        data, problem = parse_record(index.read_bytes())
    except OSError as e:
        data, problem = None, f"is unreadable ({e.strerror})"
    sums = data.get(RECORD_SUMS) if isinstance(data, dict) else None
    if problem is not None or not isinstance(sums, dict):
        report_once(index, f"cache: seed manifest {index} {problem or 'lists no record checksums'}; "
                           "its records are computed instead")
        sums = {}
    sums = {kind: keys for kind, keys in sums.items() if isinstance(keys, dict)}
    _SEED_SUMS[index] = (stamp, sums)
    return sums
