"""Secrets never reach a file or the terminal.

ragrig reads API keys only from the environment (`api_key_env` names the variable), so a config
never needs to hold one. A value that looks like a secret is therefore refused where it enters
(a key override, a key pasted where a variable's name belongs, credentials in a URL) before Hydra
or ragrig writes the configuration anywhere, and the refusal names the key without its value.
`redact(text)` is the net behind that: every log line (rag.logs) and the HTTP client's error lines
go through it.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

from rag.types import RagError

REDACTED = "…redacted"

# Config keys that would hold a credential itself rather than the name of a variable holding it
# (the names, and their endings: OPENAI_API_KEY, db_password; not max_tokens or per_token).
_SECRET_KEYS = {"api_key", "apikey", "token", "access_token", "auth_token", "api_token", "bearer_token", "hf_token",
                "password", "passwd", "secret", "client_secret", "authorization"}
_SECRET_ENDINGS = ("_api_key", "_apikey", "_access_token", "_auth_token", "_api_token", "_password", "_secret")
# The shapes of common providers' keys: the prefix is kept in messages (it says which key it was).
_KEY_PATTERNS = (
    r"sk-[A-Za-z0-9_\-]{16,}", r"sk_(?:live|test)_[A-Za-z0-9]{16,}", r"rk_(?:live|test)_[A-Za-z0-9]{16,}",
    r"gh[pousr]_[A-Za-z0-9]{30,}", r"github_pat_[A-Za-z0-9_]{30,}", r"hf_[A-Za-z]{30,}", r"glpat-[A-Za-z0-9_\-]{20,}",
    r"xox[abposr]-[A-Za-z0-9\-]{10,}", r"AKIA[0-9A-Z]{16}", r"AIza[0-9A-Za-z_\-]{35}",
)
_KEY = re.compile(r"(?<![A-Za-z0-9_\-])(" + "|".join(_KEY_PATTERNS) + r")")
_PREFIX = re.compile(r"^(sk-(?:proj-|ant-)?|sk_live_|sk_test_|rk_live_|rk_test_|gh[pousr]_|github_pat_|hf_|glpat-|"
                     r"xox[abposr]-|AKIA|AIza)")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{8,}")
# scheme://userinfo@ : the userinfo ends at the first '/', so an '@' in a path or query is no match
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)([^/\s@'\"]+)@")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def redact_url(url: str) -> str:
    """`url` without the user and password of its authority: http://…redacted@host/v1."""
    return _USERINFO.sub(lambda m: f"{m.group(1)}{REDACTED}@", str(url))


def redact(text: str) -> str:
    """`text` with credentials in URLs, provider-shaped keys and Authorization values replaced."""
    text = redact_url(text)
    text = _KEY.sub(lambda m: _shown(m.group(1)), text)
    return _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)


def _shown(value: str) -> str:
    """A secret as a message may show it: its provider's prefix, if it has one, and no more."""
    m = _PREFIX.match(value)
    return (m.group(1) if m else "") + REDACTED


def looks_like_secret(value: object) -> bool:
    """A provider-shaped key, or a long random-looking token (letters mixed with digits, no path
    or host separators): what a pasted key looks like, and what a variable's name does not."""
    if not isinstance(value, str):
        return False
    v = value.strip()
    if _KEY.fullmatch(v) or _PREFIX.match(v) and len(v) >= 12:
        return True
    if len(v) < 20 or re.search(r"[\s/.:]", v):
        return False
    classes = sum((any(c.islower() for c in v), any(c.isupper() for c in v), any(c.isdigit() for c in v)))
    return classes >= 2 and any(c.isdigit() for c in v)


def is_env_name(value: object) -> bool:
    """Whether `value` can be an environment variable's name and is not a pasted key (a variable
    that is set counts as a name, whatever it looks like)."""
    if not isinstance(value, str) or not _ENV_NAME.match(value):
        return False
    return value in os.environ or not looks_like_secret(value)


def _is_secret_key(key: str) -> bool:
    k = key.lower()
    return k in _SECRET_KEYS or k.endswith(_SECRET_ENDINGS)


def problem(key: str, value: object) -> str | None:
    """The one line refusing `key=value`, or None when it holds nothing secret-looking. The line
    never holds the value itself."""
    name = key.rpartition(".")[2]
    if value is None or value == "":
        return None
    if _is_secret_key(name) and isinstance(value, str):  # (a number is a setting, not a key)
        parent = key.rpartition(".")[0]
        where = f"{parent}.api_key_env=NAME" if parent and not parent.startswith("hydra") else "the role's api_key_env=NAME"
        return (f"{key} is not accepted: a key in the config would be written into the run's files; "
                f"export it and set {where} (the variable's name)")
    if name.lower().endswith("_env") and not is_env_name(value):
        what = "looks like a key" if looks_like_secret(value) else "is not a variable's name"
        shown = _shown(str(value)) if looks_like_secret(value) else REDACTED
        return f"{key} must name an environment variable (got a value that {what}: {shown})"
    if isinstance(value, str) and _USERINFO.search(value):
        return (f"{key} must not hold credentials (got {redact(value)}); give the key through the role's "
                "api_key_env (the name of an environment variable holding it)")
    if isinstance(value, str) and redact(value) != value:
        return f"{key} holds what looks like a key ({redact(value)}); ragrig takes keys only from the environment (api_key_env)"
    return None


def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            yield from _leaves(v, f"{prefix}.{i}" if prefix else str(i))
    else:
        yield prefix, node


def override_problem(override: str) -> str | None:
    """`problem` for a command-line override (`+llm.api_key=...`, a sweep's `a,b` included)."""
    key, sep, value = str(override).partition("=")
    key = key.lstrip("+~")
    if not sep:
        return None
    if key.rpartition(".")[2].lower().endswith("_env"):
        for part in re.split(r"[,()\[\]\s]+", value):
            if part and part not in ("choice", "range", "glob", "null") and problem(key, part):
                return problem(key, part)
        return None
    return problem(key, value)


def config_problem(data: Any) -> str | None:
    """The first secret-looking value in a config (plain data, resolved or not) and in the
    overrides recorded under `hydra.overrides`, as one line; None when there is none. The config's
    own keys are judged first and Hydra's node last, so that the line names the key the user set
    (not `hydra.job.override_dirname`, which repeats the overrides)."""
    data = data if isinstance(data, dict) else {}
    hydra = data.get("hydra") if isinstance(data.get("hydra"), dict) else {}
    own = {k: v for k, v in data.items() if k != "hydra"}
    overrides = hydra.get("overrides") if isinstance(hydra.get("overrides"), dict) else {}
    for _, value in _leaves(overrides):
        line = override_problem(value) if isinstance(value, str) else None
        if line:
            return line
    for key, value in [*_leaves(own), *_leaves({k: v for k, v in hydra.items() if k != "overrides"}, "hydra")]:
        line = problem(key, value)
        if line:
            return line
    return None


def check(data: Any) -> None:
    """Raises RagError (one line, no value) for the first secret-looking value in `data`."""
    line = config_problem(data)
    if line:
        raise RagError(line)


def redacted_data(node: Any) -> Any:
    """A copy of plain config data with every string passed through `redact` (for the run's record
    of its configuration, .hydra/)."""
    if isinstance(node, dict):
        return {k: redacted_data(v) for k, v in node.items()}
    if isinstance(node, list):
        return [redacted_data(v) for v in node]
    return redact(node) if isinstance(node, str) else node


_ASSIGNMENT = re.compile(r"(?P<key>[+~]?[A-Za-z_][\w.]*)=(?P<value>[^\s'\",)\]]+)")


def redact_assignments(text: str) -> str:
    """`redact`, and the value of every `key=value` in `text` (an override quoted in an error
    message) that `problem` would refuse, e.g. `+llm.api_key=abc` or `llm.api_key_env=sk-...`."""
    def one(m: re.Match[str]) -> str:
        key, value = m.group("key"), m.group("value")
        if not problem(key.lstrip("+~"), value):
            return m.group(0)
        if _USERINFO.search(value):
            return f"{key}={redact_url(value)}"
        return f"{key}={_shown(value) if looks_like_secret(value) else REDACTED}"

    return redact(_ASSIGNMENT.sub(one, text))
