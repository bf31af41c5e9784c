"""Secrets never reach a file or the terminal.

ragrig reads API keys only from the environment (`api_key_env` names the variable), so a config
never needs to hold one. A value that looks like a secret is therefore refused where it enters
(a key override, a key pasted where a variable's name belongs, credentials in a URL) before Hydra
or ragrig writes the configuration anywhere, and the refusal names the key without its value.
`redact(text)` is the net behind that: every log line (rag.logs) and the HTTP client's error lines
go through it. A value the config takes from the environment (`${oc.env:NAME}`) is used as it is
but written as `${oc.env:NAME}`: every file ragrig writes configuration or a component's id into
goes through `redacted_data`.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

from rag.types import RagError

REDACTED = "…redacted"

# Config keys that would hold a credential itself rather than the name of a variable holding it.
# A key is read as its words, whatever the spelling (`x-api-key`, `X_Api_Key`, `sessionToken`):
# a word that only ever names a credential, a `<what>_key` of these owners, or a last word `token`
# not after one of the tokenizer's words (`session_token`, `hf_token`; not `bos_token`,
# `per_token`, nor `max_tokens`). A name ending in `_env` names a variable and is none of these.
_SECRET_WORDS = {"apikey", "password", "passwd", "passphrase", "secret", "credential", "credentials", "cookie", "cookies",
                 "authorization", "auth", "bearer", "accesstoken"}
_KEY_OWNERS = {"api", "access", "private", "secret", "signing", "encryption", "client", "subscription", "license",
               "master", "session", "auth"}
_TOKENIZER_WORDS = {"bos", "eos", "pad", "unk", "sep", "cls", "mask", "per", "max", "min", "num", "special", "start",
                    "end", "stop", "first", "last", "new", "prefix", "suffix", "eot", "default", "image", "sentinel"}
# Roles whose node has `api_key_env` (conf: llm=openai, embedder=openai, reranker=http, eval.judge,
# and any llm@<node>.llm=openai): the last word of the node that a refusal names.
_KEYED_ROLES = ("llm", "embedder", "reranker", "judge")
# ragrig's own variables (RAGRIG_DATA, RAGRIG_CACHE, RAGRIG_JOBS, ...) name places and counts, and
# where a run read its data from is part of its record; any other `${oc.env:NAME}` may hold a
# credential, and its value is written as the interpolation it came from.
_OWN_VARIABLES = "RAGRIG_"
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


def key_words(key: str) -> list[str]:
    """A key's words, lower case: `x-api-key`, `X_API_KEY` and `xApiKey` are all x, api, key."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", str(key))
    return [w for w in re.split(r"[^a-z0-9]+", spaced.lower()) if w]


def is_secret_key(key: str) -> bool:
    """Whether a config key (its last part) names a credential itself (see `_SECRET_WORDS`)."""
    words = key_words(str(key).rpartition(".")[2])
    if not words or words[-1] == "env":
        return False
    if any(w in _SECRET_WORDS for w in words) or "".join(words) in _SECRET_WORDS:
        return True
    if any(a in _KEY_OWNERS and b == "key" for a, b in zip(words, words[1:])):
        return True
    return words[-1] == "token" and (len(words) == 1 or words[-2] not in _TOKENIZER_WORDS)


def key_setting(key: str) -> str:
    """What to do instead of writing a key into `key`: export it and name the variable in the
    role's `api_key_env` (an endpoint's `extra_body.token` is the role's; ragrig sends the key as
    `Authorization: Bearer`)."""
    role = key.partition(".endpoint.")[0] if ".endpoint." in key else key.rpartition(".")[0]
    if role.rpartition(".")[2] in _KEYED_ROLES and not role.startswith("hydra"):
        return f"export it and set {role}.api_key_env=NAME (the variable's name; sent as Authorization: Bearer)"
    return "export it and name its variable in the api_key_env of the role that sends it (llm, embedder, reranker, eval.judge)"


def problem(key: str, value: object) -> str | None:
    """The one line refusing `key=value`, or None when it holds nothing secret-looking. The line
    never holds the value itself."""
    name = key.rpartition(".")[2]
    if value is None or value == "":
        return None
    if is_secret_key(name) and isinstance(value, str):  # (a number is a setting, not a key)
        return f"{key} is not accepted: a key in the config would be written into the run's files; {key_setting(key)}"
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


# `${oc.env:NAME}` and `${oc.env:NAME,default}`: the variable's name.
_ENV_REFERENCE = re.compile(r"\$\{oc\.env:\s*([A-Za-z_][A-Za-z0-9_]*)")
# Values an `${oc.env:NAME}` of a validated config resolved to -> NAME. A run resolves its config
# once and hands the values to its components, whose ids and records are written far from the
# config (cache manifests, generated questions' provenance): the value itself is the only thread
# back to where it came from. It only grows (one process may validate many jobs' configs).
_FROM_ENVIRONMENT: dict[str, str] = {}
_SHORTEST_INSIDE = 6  # a shorter value ("1", "true") is replaced only where it is the whole string


def note_environment(raw: Any) -> None:
    """Remembers what each `${oc.env:NAME}` in `raw` (a config as written, unresolved) resolves
    to, so that `redacted_data` writes the interpolation instead of the value. Variables that are
    unset (their default stands, written in the config) and ragrig's own are left out."""
    for _, value in _leaves(raw):
        if not isinstance(value, str):
            continue
        for name in _ENV_REFERENCE.findall(value):
            resolved = os.environ.get(name)
            if resolved and not name.startswith(_OWN_VARIABLES):
                _FROM_ENVIRONMENT[resolved] = name


def _unresolved(text: str) -> str:
    """`text` with every value that came from the environment written as its interpolation."""
    name = _FROM_ENVIRONMENT.get(text)
    if name is not None:
        return f"${{oc.env:{name}}}"
    for value in sorted((v for v in _FROM_ENVIRONMENT if len(v) >= _SHORTEST_INSIDE), key=len, reverse=True):
        if value in text:
            text = text.replace(value, f"${{oc.env:{_FROM_ENVIRONMENT[value]}}}")
    return text


def redacted_data(node: Any, key: str = "") -> Any:
    """Plain data as ragrig may write it into a file (metrics.json, config_resolved.yaml, .hydra/,
    a cache manifest, a generated question's provenance, dry_run.json, failure.json): a copy in
    which a value from `${oc.env:NAME}` is that interpolation again, a string under a key that
    names a credential (`is_secret_key`) is `REDACTED`, and every string has passed `redact`.
    Every writer of configuration or of a component's id goes through this one function."""
    if isinstance(node, dict):
        return {k: redacted_data(v, str(k)) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [redacted_data(v, key) for v in node]
    if not isinstance(node, str):
        return node
    if node and is_secret_key(key) and not node.startswith("${"):  # (an interpolation as written names no value)
        return REDACTED
    return redact(_unresolved(node))


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
