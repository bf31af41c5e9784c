"""Shared pieces of the corpus readers: the interface, input fingerprints and strict input checks.

A corpus is built from keyword arguments (Hydra instantiates it from YAML). `load()` returns its
documents in a deterministic order; `fingerprint()` is a cheap JSON-able description of
everything that determines them, which the caller uses as a cache key for `load()`'s result.
Every problem with the input is reported as a one-line `RagError` naming the file (and line).
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, overload

from rag.types import Document, RagError


class Corpus:
    """Base class of the corpus readers.

    `skipped` lists what `load()` left out (unrenderable pages, articles without an abstract...);
    it is reset by every `load()`. `parts`: the corpora a mixed corpus is made of, each read and
    cached on its own (empty for a reader of its own inputs).
    """

    # Bump when a reader's output changes for the same inputs (parsing, normalisation), so that
    # documents cached under the old fingerprint are not reused.
    format_version = 1
    parts: Sequence[Corpus] = ()

    def __init__(self) -> None:
        self.skipped: list[str] = []

    def load(self) -> list[Document]:
        """Reads the corpus. Required.

        The runner reads a corpus through the artifact cache (`iter_documents`, which calls this
        unless a reader streams): on a later run with the same `fingerprint` (class,
        `format_version`, `settings()`, `inputs()`) the cached documents are used and nothing is
        read. Documents it leaves out go to `self.skipped`, with why.

        Returns:
            The documents, each with a unique `id`, its `text` and its group tag (`source`);
            `meta` is kept as it is.

        Raises:
            RagError: An input file is missing or unreadable, in one line naming it.

        Example:
            A corpus of one folder's text files:

                class Folder(Corpus):
                    def __init__(self, path: str):
                        super().__init__()
                        self.path = path

                    def load(self):
                        return [Document(id=p.stem, text=p.read_text(), source="notes")
                                for p in sorted(Path(self.path).glob("*.txt"))]
        """
        raise NotImplementedError

    def iter_documents(self) -> Iterator[Document]:
        """The documents of `load()`, one at a time. Readers of files that can outgrow memory
        (JSONL, BEIR, MEDLINE) stream them; the corpus artifact is written from this stream."""
        yield from self.load()

    def settings(self) -> dict[str, Any]:
        """The constructor arguments that change the loaded documents."""
        return {}

    def inputs(self) -> Any:
        """Fingerprint of the input files (paths, sizes, mtimes)."""
        return None

    def title(self) -> str:
        """What a person calls this corpus in a sentence ("PubMedQA", "libc", "docs.jsonl"): the
        reports name the corpora a fitted part learnt from by it (rag/run/fitted.py)."""
        return type(self).__name__.removesuffix("Corpus")

    def fingerprint(self) -> dict[str, Any]:
        return {
            "class": type(self).__name__,
            "format": self.format_version,
            "settings": self.settings(),
            "inputs": self.inputs(),
        }


# ---- input files -------------------------------------------------------------------------------


def as_path(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.expanduser(os.fspath(path))).absolute()


def file_fingerprint(path: str | os.PathLike[str]) -> dict[str, Any]:
    p = as_path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise RagError(f"{p}: file not found") from None
    except OSError as e:
        raise RagError(f"{p}: cannot stat: {e.strerror}") from None
    return {"path": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def listing_fingerprint(paths: Iterable[Path], root: Path | None = None) -> dict[str, Any]:
    """One hash over (name, size, mtime) of many files: cheap to compute, changes whenever any
    file is added, removed, replaced or touched. Symlinks are described, not followed, since
    adding or retargeting a link changes what a directory walk yields."""
    h = hashlib.sha256()
    n = 0
    for p in sorted(paths):
        st = p.lstat()
        name = p.relative_to(root).as_posix() if root else str(p)
        h.update(f"{name}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
        n += 1
    return {"root": str(root) if root else None, "files": n, "sha256": h.hexdigest()[:20]}


BOM = b"\xef\xbb\xbf"


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The file's bytes, without a UTF-8 byte-order mark; missing, empty (or all-whitespace),
    compressed and UTF-16 files are errors that say which."""
    p = as_path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise RagError(f"{p}: file not found") from None
    except IsADirectoryError:
        raise RagError(f"{p}: is a directory, expected a file") from None
    except OSError as e:
        raise RagError(f"{p}: cannot read: {e.strerror}") from None
    data = data.removeprefix(BOM)  # Windows editors write one; it is not part of the text
    if not data.strip():
        raise RagError(f"{p}: file is empty")
    for magic, kind in ((b"\x1f\x8b", "gzip-compressed (gunzip it first)"), (b"BZh", "bzip2-compressed (bunzip2 it first)"),
                        (b"\xfd7zXZ", "xz-compressed (unxz it first)"), (b"PK\x03\x04", "a zip archive (unzip it first)"),
                        (b"\xff\xfe", "UTF-16 encoded (save it as UTF-8)"), (b"\xfe\xff", "UTF-16 encoded (save it as UTF-8)")):
        if data.startswith(magic):
            raise RagError(f"{p}: file is {kind}, expected UTF-8 text")
    return data


def decode_utf8(data: bytes, path: str | os.PathLike[str]) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise RagError(f"{path}:{line}: invalid UTF-8 (byte 0x{data[e.start]:02x})") from None


def read_text(path: str | os.PathLike[str]) -> str:
    return decode_utf8(read_bytes(path), as_path(path))


def load_json(path: str | os.PathLike[str]) -> Any:
    p = as_path(path)
    try:
        obj = json.loads(read_text(p))
    except json.JSONDecodeError as e:
        raise RagError(f"{p}:{e.lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
    check_encodable(obj, str(p))
    return obj


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based line number, object) for each non-blank line of a JSON-lines file."""
    p = as_path(path)
    data = read_bytes(p)
    if data.lstrip().startswith(b"[") and _is_json_array(data):
        out = p.with_suffix(".jsonl").name if p.suffix != ".jsonl" else f"{p.stem}-lines.jsonl"
        raise RagError(
            f"{p}: this is one JSON array, not JSON lines: write one JSON object per line "
            f"(e.g. jq -c '.[]' {p.name} > {out})"
        )
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        where = f"{p}:{lineno}"
        if b"\x00" in raw:
            column = raw.index(b"\x00") + 1
            raise RagError(f"{where}: NUL byte at column {column}: a binary file, or UTF-16 without a byte-order mark?")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RagError(f"{where}: invalid UTF-8 (byte 0x{raw[e.start]:02x})") from None
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise RagError(f"{where}: invalid JSON: {e.msg} (column {e.colno})") from None
        if not isinstance(obj, dict):
            raise RagError(f"{where}: expected a JSON object, got {_json_type(obj)}")
        if "\\u" in line:  # only a \u escape can produce a lone surrogate
            check_encodable(obj, where)
        yield lineno, obj


def _is_json_array(data: bytes) -> bool:
    try:
        return isinstance(json.loads(data), list)
    except ValueError:  # not one JSON document: perhaps JSON lines whose first line is an array
        return data.lstrip().startswith(b"[\n") or data.lstrip().startswith(b"[\r\n")


def _json_type(obj: Any) -> str:
    return {list: "an array", dict: "an object", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(obj), type(obj).__name__)


def check_encodable(obj: Any, where: str, field: str = "") -> None:
    """JSON's \\u escapes can encode half of a UTF-16 surrogate pair (\\ud800), which Python
    accepts but no UTF-8 file can hold: reject it here, naming the field, not when the cache is
    written."""
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError as e:
            name = f"field '{field}'" if field else "a value"
            raise RagError(
                f"{where}: {name} contains a lone surrogate \\u{ord(obj[e.start]):04x} at character {e.start + 1} "
                "(half of a UTF-16 pair, not valid text); remove or fix that escape"
            ) from None
    elif isinstance(obj, dict):
        for k, v in obj.items():
            check_encodable(k, where, field)
            check_encodable(v, where, f"{field}.{k}" if field else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            check_encodable(v, where, f"{field}[{i}]")


def claim_id(first_line: dict[str, int], key: str, lineno: int, where: str, what: str) -> None:
    """Records that `key` appears on `lineno` of a JSONL file; a repeat is one error naming both lines."""
    if key in first_line:
        raise RagError(f"{where}: duplicate {what} id {key!r} (first on line {first_line[key]})")
    first_line[key] = lineno


def concatenate_parts(parts: Sequence[Any], who: str, what: str) -> list[Any]:
    """Everything the parts load, in order (documents or questions, anything with an `id`); an id
    that two parts both hold is one error naming the parts."""
    out: list[Any] = []
    owner: dict[str, int] = {}
    for i, part in enumerate(parts):
        for item in part.load():
            if item.id in owner:
                first = owner[item.id]
                raise RagError(f"{who}: duplicate {what} id {item.id!r} in part {i} ({type(part).__name__}), "
                               f"already in part {first} ({type(parts[first]).__name__})")
            owner[item.id] = i
            out.append(item)
    return out


def jsonl_records(path: Path, id_field: str, what: str, setting: str | None = None,
                  taken: Iterable[str] = ()) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """("file:line", id, object) for each line of a JSON-lines file whose `id_field` is unique:
    a missing id or a repeated one is one error naming the line (and the first line of the id).
    `setting` names the setting that reads the id from another field, `taken` the fields read for
    something else (see `present_field`)."""
    first_line: dict[str, int] = {}
    for lineno, obj in iter_jsonl(path):
        where = f"{path}:{lineno}"
        key = (present_field(obj, id_field, where, setting, is_id=True, taken=taken) if setting
               else text_field(obj, id_field, where, is_id=True))
        claim_id(first_line, key, lineno, where, what)
        yield where, key, obj


@overload
def text_value(value: Any, field: str, where: str, *, required: Literal[True] = True, is_id: bool = False) -> str: ...


@overload
def text_value(value: Any, field: str, where: str, *, required: bool, is_id: bool = False) -> str | None: ...


def text_value(value: Any, field: str, where: str, *, required: bool = True, is_id: bool = False) -> str | None:
    """The one rule for every text-valued field of every input format (documents, titles,
    questions, answers, ids, sources, corpus tags, relevance labels; JSONL, BEIR, PubMedQA,
    MEDLINE): the value must be a JSON string, non-blank when `required`; an id may also be an
    integer (many datasets number their records), which becomes its decimal text. Anything else is
    one line in one shape, "<where>: field '<field>' must be a string, got a number (42)", and a
    missing or blank required value is "<where>: missing or empty field '<field>'". A blank
    optional value is None."""
    if isinstance(value, str):
        if value.strip():
            return value
        value = None
    if value is None:
        if required:
            raise RagError(f"{where}: missing or empty field '{field}'")
        return None
    if is_id and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    shown = json.dumps(value, ensure_ascii=False, default=str)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    raise RagError(f"{where}: field '{field}' must be {'a string or an integer' if is_id else 'a string'}, "
                   f"got {_json_type(value)} ({shown})")


@overload
def text_field(obj: dict[str, Any], field: str, where: str, *, required: Literal[True] = True,
               is_id: bool = False) -> str: ...


@overload
def text_field(obj: dict[str, Any], field: str, where: str, *, required: bool, is_id: bool = False) -> str | None: ...


def text_field(obj: dict[str, Any], field: str, where: str, *, required: bool = True, is_id: bool = False) -> str | None:
    """obj[field] under `text_value`'s rule; `where` is "file:line" for the message."""
    return text_value(obj.get(field), field, where, required=required, is_id=is_id)


@overload
def present_field(obj: dict[str, Any], field: str, where: str, setting: str, *, is_id: bool = False,
                  required: Literal[True] = True, otherwise: str = "", taken: Iterable[str] = ()) -> str: ...


@overload
def present_field(obj: dict[str, Any], field: str, where: str, setting: str, *, is_id: bool = False,
                  required: bool, otherwise: str = "", taken: Iterable[str] = ()) -> str | None: ...


def present_field(obj: dict[str, Any], field: str, where: str, setting: str, *, is_id: bool = False,
                  required: bool = True, otherwise: str = "", taken: Iterable[str] = ()) -> str | None:
    """obj[field] under `text_value`'s rule, where a line without the field at all (a file
    written with other names: `content` for `text`) is told apart from an empty value: the line
    names the fields the line has and the setting that reads another one,
    "<where>: no 'text' field (fields: id, content); set corpus.text_field=content to read
    another field". `otherwise`: a second way out, e.g. "or give 'relevant' labels"; `taken`: the
    fields the reader reads for something else, never suggested."""
    if field in obj:  # there: `required` says whether a blank value is an error or None
        return text_value(obj.get(field), field, where, required=required, is_id=is_id)
    fields = ", ".join(obj) if obj else "none: the line is an empty object"
    guess = _likely_field({k: v for k, v in obj.items() if k not in set(taken)}, is_id)
    fix = f"set {setting}={guess or '<field>'} to read another field"
    raise RagError(f"{where}: no '{field}' field (fields: {fields}); {fix}{' ' + otherwise if otherwise else ''}")


def _likely_field(obj: dict[str, Any], is_id: bool) -> str | None:
    """The field a user most likely meant: for an id, one whose name says id (`_id`, `doc_id`);
    for a text, the longest text value on the line. None when nothing fits."""
    texts = {k: v for k, v in obj.items() if isinstance(v, str) and v.strip()}
    if is_id:
        named = [k for k in obj if "id" in k.lower() and isinstance(obj[k], (str, int)) and not isinstance(obj[k], bool)]
        return named[0] if named else None
    return max(texts, key=lambda k: len(texts[k])) if texts else None


def aliased_field(obj: dict[str, Any], field: str, old: str | None, where: str,
                  *, is_id: bool = False) -> tuple[str | None, str]:
    """(value, the name it was read under) of an optional text field that files may still give
    under its old name (`source` for `group`). The new name wins when both are there: the old one
    is then an ordinary field of the line (a `source` URL beside a `group`, say)."""
    name = old if old is not None and field not in obj and old in obj else field
    return text_field(obj, name, where, required=False, is_id=is_id), name


# ---- document checks ---------------------------------------------------------------------------


def check_documents(docs: Sequence[Document], origin: str) -> list[Document]:
    """Reject empty texts and duplicate ids; `origin` names the input in the message."""
    return list(checked_documents(docs, origin))


def checked_documents(docs: Iterable[Document], origin: str) -> Iterator[Document]:
    """check_documents on a stream: each document passed on once it is checked."""
    seen: set[str] = set()
    for d in docs:
        if not d.text.strip():
            raise RagError(f"{origin}: document {d.id!r} has empty text")
        if d.id in seen:
            raise RagError(f"{origin}: duplicate document id {d.id!r}")
        seen.add(d.id)
        yield d


def normalize_space(text: str) -> str:
    return " ".join(text.split())
