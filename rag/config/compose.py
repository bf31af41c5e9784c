"""OmegaConf resolvers used by conf/ (registered before Hydra composes the config), and the
one-line form of Hydra's configuration errors shared by every command-line entry point."""
from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import Any

from rag.types import RagError

PROJECT_ROOT = Path(__file__).resolve().parents[2]

# A short random id drawn once per process: it makes the default run and sweep directories unique
# even for runs started in the same second (conf/config.yaml, `${ragrig_run_id:}`).
RUN_ID = secrets.token_hex(3)


def data_dir() -> Path:
    """The development data shipped in data/ (or RAGRIG_DATA): what the default configs read."""
    env = os.environ.get("RAGRIG_DATA")
    return Path(env) if env else PROJECT_ROOT / "data"


def register_resolvers() -> None:
    # imported here so that PROJECT_ROOT needs no OmegaConf (benchmarks run on GPU machines without it)
    from omegaconf import OmegaConf

    # ${ragrig_root:} lets configs name project files (data/qa/...) independently of the cwd.
    if not OmegaConf.has_resolver("ragrig_root"):
        OmegaConf.register_new_resolver("ragrig_root", lambda: str(PROJECT_ROOT))
    # Cached like Hydra's ${now:}: the jobs of a sweep (other processes, other nodes) receive the
    # launching process's resolver cache with their config, so they resolve the same sweep dir.
    if not OmegaConf.has_resolver("ragrig_run_id"):
        OmegaConf.register_new_resolver("ragrig_run_id", lambda: RUN_ID, use_cache=True)


def compose_config(overrides: list[str], config_name: str = "config") -> Any:
    """The project's conf/ composed with `overrides`, outside a Hydra app (the entry points besides
    run.py); a bad override or option is one RagError line (`config_error_line`), not Hydra's
    traceback. Registers the project's resolvers first."""
    from hydra import compose, initialize_config_dir

    register_resolvers()
    try:
        with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
            return compose(config_name=config_name, overrides=overrides)
    except Exception as e:
        if not is_config_error(e):
            raise
        raise RagError(config_error_line(e)) from None


def config_error_line(e: BaseException) -> str:
    """Hydra's and OmegaConf's composition errors as one line: the problem, the bad override and,
    for an unknown config-group option, the options there are (no search path, no doc links). A
    secret-looking value in the quoted override is redacted (rag.serving.secrets)."""
    from rag.serving.secrets import redact_assignments

    return redact_assignments(_config_error_line(e))


def _config_error_line(e: BaseException) -> str:
    unknown = _moved_key_line(e) or _other_option_line(e) or _unknown_key_line(e)
    if unknown:
        return unknown
    lines = [ln.strip() for ln in str(e).splitlines()]
    text: list[str] = []
    options: list[str] = []
    section = "text"
    for ln in lines:
        if not ln or ln.startswith("See https://"):
            continue
        if ln.startswith("Config search path"):
            section = "skip"
        elif ln.startswith("Available options in"):
            section = "options"
        elif section == "options":
            options.append(ln)
        elif section == "text":
            text.append(ln)
    msg = " ".join(text).replace("\\'", "'") or type(e).__name__
    for prefix in ("In 'config': ", "In 'hydra/config': "):
        msg = msg.removeprefix(prefix)
    override = getattr(e, "override", None)
    if override and str(override) not in msg:
        msg = f"override {override!r}: {msg}"
    cause = e.__cause__
    if cause is not None and str(cause).strip():
        first = str(cause).strip().splitlines()[0]
        if first not in msg:
            msg += f" ({first})"
    if options:
        msg += f" (available: {', '.join(options)})"
    from hydra.errors import OverrideParseException

    if isinstance(e, OverrideParseException):
        msg += " (quote a value holding any of ()[]{},='\";#&~ for Hydra, e.g. 'corpus.path=\"my docs (v2).jsonl\"')"
    return msg


def near_names(name: str, known: list[str]) -> str:
    """ " (did you mean x?)" for a misspelt name among `known`, or ""."""
    import difflib

    close = difflib.get_close_matches(name, known, n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def _unknown_key_line(e: BaseException) -> str | None:
    """An override of a key the config does not have (a misspelling, usually): which node lacks it,
    the nearest keys it has, all of them, and how to add a new key on purpose."""
    cause = e.__cause__
    full_key = str(getattr(cause, "full_key", None) or "")
    if "not in struct" not in str(cause or "") or not full_key:
        return None
    key = str(getattr(cause, "key", ""))
    node = getattr(cause, "parent_node", None)
    try:
        keys = [str(k) for k in node.keys() if not str(k).startswith("_")] if node is not None else []
    except Exception:  # noqa: BLE001 - a node that cannot list its keys: say less
        keys = []
    parent = full_key.rpartition(".")[0]
    where = f"'{parent}'" if parent else "the config"
    value = str(getattr(e, "override", "") or "").partition("=")[2] or "..."
    line = f"Could not override '{full_key}': {where} has no key '{key}'{near_names(key, keys)}"
    if keys:
        line += f"; its keys: {', '.join(keys)}"
    return line + f". To add a new key use +{full_key}={value}"


def endpoint_settings() -> tuple[str, ...]:
    """The settings of a role's `endpoint` node (rag.endpoint.EndpointSettings)."""
    from dataclasses import fields

    from rag.endpoint import EndpointSettings

    return tuple(f.name for f in fields(EndpointSettings))


def _moved_key_line(e: BaseException) -> str | None:
    """An endpoint setting overridden by its name from before the roles' endpoint settings moved
    into their `endpoint` node (`llm.timeout_s=30`): the key it is now, and, when the chosen option
    has no endpoint (llm=smollm2), the option that has it."""
    cause = e.__cause__
    full_key = str(getattr(cause, "full_key", None) or "")
    parent, _, key = full_key.rpartition(".")
    if "not in struct" not in str(cause or "") or not parent or key not in endpoint_settings():
        return None
    moved = f"{parent}.endpoint.{key}"
    # Hydra names the value only in its own hint, with the whole key: +llm.extra_body.top_k=1
    given = re.search(rf"\+{re.escape(full_key)}((?:\.[\w-]+)*)=(.*)$", str(e))
    deeper, value = (given.group(1), given.group(2).strip()) if given else ("", "...")
    assign = f"+{moved}{deeper}={value}" if deeper else f"{moved}={value}"  # a new field of extra_body
    node = getattr(cause, "parent_node", None)
    endpoint = node.get("endpoint") if node is not None and "endpoint" in node else None
    if endpoint is not None:
        return f"{full_key} is now {moved}: use {assign}" if key in endpoint else None
    group, _, rest = parent.partition(".")
    having = [o for o in options_with(group, f"{rest}.endpoint" if rest else "endpoint")
              if key in _endpoint_node(group, o, rest)]
    if not having:
        return None
    return f"{full_key} is now {moved}, a setting of {group}={having[0]}; add {group}={having[0]} before {assign}"


def _endpoint_node(group: str, option: str, rest: str) -> set[str]:
    """The settings of the `endpoint` node of conf/<group>/<option>.yaml (under `rest`): its own
    and those it composes from conf/endpoint/default.yaml."""
    import yaml

    node = yaml.safe_load((PROJECT_ROOT / "conf" / group / f"{option}.yaml").read_text(encoding="utf-8"))
    for part in [*rest.split("."), "endpoint"] if rest else ["endpoint"]:
        node = node.get(part) if isinstance(node, dict) else None
    shared = yaml.safe_load((PROJECT_ROOT / "conf" / "endpoint" / "default.yaml").read_text(encoding="utf-8"))
    return set(node or {}) | set(shared)


def _other_option_line(e: BaseException) -> str | None:
    """An override of a setting that the chosen option of a config group lacks but another option
    has (corpus.path=docs.jsonl while corpus=mixed): Hydra's hint, +corpus.path, would add a key
    the chosen corpus cannot read; the fix is to choose the option that has it."""
    cause = e.__cause__
    full_key = str(getattr(cause, "full_key", None) or "")
    if "not in struct" not in str(cause or "") or not full_key:
        return None
    group, _, key = full_key.partition(".")
    having = options_with(group, key)
    if not having:
        return None
    # Hydra names the value only in its own hint: "To append to your config use +corpus.path=x"
    given = re.search(rf"\+{re.escape(full_key)}=(.*)$", str(e))
    value = given.group(1).strip() if given else "..."
    first, rest = having[0], having[1:]
    others = f" (and {', '.join(rest)})" if rest else ""
    return f"{full_key} is a setting of {group}={first}{others}; add {group}={first} before {full_key}={value}"


_ABSENT = object()


def options_with(group: str, key: str) -> list[str]:
    """The options of config group `group` (conf/<group>/*.yaml) that set the dotted `key`: those
    that require it (`???`) first, your own files' option (jsonl) first among them."""
    import yaml

    folder = PROJECT_ROOT / "conf" / group
    if not key or not folder.is_dir():
        return []
    found = []
    for f in folder.glob("*.yaml"):
        node = yaml.safe_load(f.read_text(encoding="utf-8"))
        for part in key.split("."):
            node = node.get(part, _ABSENT) if isinstance(node, dict) else _ABSENT
        if node is not _ABSENT:
            found.append((node != "???", f.stem != "jsonl", f.stem))
    return [stem for *_, stem in sorted(found)]


def is_config_error(e: BaseException) -> bool:
    """Errors of composing or resolving the configuration (a user's override or config file)."""
    from hydra.errors import ConfigCompositionException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    return isinstance(e, (ConfigCompositionException, OverrideParseException, OmegaConfBaseException))
