"""A server's reply read as data, like a file: strict JSON, and the checks the roles share.

Python's json reads NaN, Infinity and -Infinity, which JSON does not have, and 1e999 as an
infinite float, and reads an escaped lone surrogate ("\\ud800") into a string that no file can hold;
`decode_reply` refuses them where they stand, so that none reaches a score, a vector, the cache or
a result file. A role's parser raises `BadReply` for a reply of the right shape whose
content is wrong; rag/endpoint.py turns it into a one-line error naming the endpoint and model.
"""
from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterable
from typing import Any

__all__ = ["BadReply", "decode_reply", "reported_tokens", "shown"]


class BadReply(Exception):
    """A reply whose content is wrong; the message says what, in the reply's own terms ("index 0
    twice", "score of document 2 is true, not a number")."""


class _Unusable:
    """Where a number JSON does not have stood in a decoded reply (found by `_where`)."""


def decode_reply(text: str) -> Any:
    """A reply's JSON, read strictly. Python's json reads NaN, Infinity and -Infinity, which JSON
    does not have, and 1e999 as an infinite float: refused here, at the door, with where the value
    stood, so that none reaches a score, a vector or a result file. ValueError: no JSON at all."""
    found: list[str] = []

    def unusable(token: str) -> _Unusable:
        found.append(token)
        return _Unusable()

    def real(token: str) -> float | _Unusable:
        value = float(token)
        return value if math.isfinite(value) else unusable(token)

    def integer(token: str) -> int | _Unusable:
        value = int(token)
        return value if abs(value) <= sys.float_info.max else unusable(token)

    try:
        data = json.loads(text, parse_constant=unusable, parse_float=real, parse_int=integer)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if found:
        try:
            where = _where(data, "") or "the top"
        except RecursionError:
            where = "a deeply nested place"
        raise BadReply(f"{found[0][:40]} at {where}, not a finite number")
    if _SURROGATE_ESCAPE.search(text):  # only an escape makes one: the body's bytes were decoded as UTF-8
        try:
            lone = _lone_surrogate(data, "")
        except RecursionError:
            lone = ("a deeply nested place", "")
        if lone is not None:
            raise BadReply(f"a lone surrogate ({lone[1]}) at {lone[0] or 'the top'}, not text")
    return data


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _lone_surrogate(node: Any, path: str) -> tuple[str, str] | None:
    """(where, the surrogate as its escape) of the first string or key that holds a lone surrogate,
    which UTF-8 cannot encode (a pair of escapes is read as the one character it stands for)."""
    if isinstance(node, str):
        try:
            node.encode("utf-8")
        except UnicodeEncodeError as e:
            return path, f"\\u{ord(node[e.start]):04x}"
        return None
    if isinstance(node, dict):
        for key in node:
            found = _lone_surrogate(key, path)
            if found is not None:
                return (f"a key of {found[0]}" if found[0] else "a key"), found[1]
    for key, child in _children(node):
        found = _lone_surrogate(child, path + _step(key, path))
        if found is not None:
            return found
    return None


def _where(node: Any, path: str) -> str | None:
    if isinstance(node, _Unusable):
        return path
    for key, child in _children(node):
        found = _where(child, path + _step(key, path))
        if found is not None:
            return found
    return None


def _children(node: Any) -> Iterable[tuple[str | int, Any]]:
    """An object's (key, value) pairs or an array's (index, item) pairs; nothing for a scalar."""
    if isinstance(node, dict):
        return node.items()
    if isinstance(node, list):
        return enumerate(node)
    return ()


def _step(key: str | int, path: str) -> str:
    """`key` as the next step of `path`: [2] for an array index, .name after a path, name at the top."""
    if isinstance(key, int):
        return f"[{key}]"
    return f".{key}" if path else str(key)


def shown(value: Any) -> str:
    """A value of a reply as its JSON wrote it, cut short: true, null, "0.5"."""
    return " ".join(json.dumps(value, default=str).split())[:40]


def reported_tokens(data: Any, *names: str) -> int | None:
    """The first of `names` that a reply's `usage` reports, as a count of tokens; None when it
    reports none (some servers do not). A value that is no whole number >= 0 is a BadReply: it
    would become a cost."""
    usage = data.get("usage") if isinstance(data, dict) else None
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise BadReply(f"usage is {shown(usage)}, not an object")
    for name in names:
        value = usage.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != int(value):
            raise BadReply(f"usage.{name} is {shown(value)}, not a count of tokens")
        return int(value)
    return None
