"""The configuration's schema: the checks for the type and range of a value, and the rules of the
components' settings. rag/run/settings.py applies them with the run's own rules, once, at start-up,
before any file is read or model loaded.

A component's settings are its constructor's parameters, so the constructor is the one place a
setting is described: its annotation carries its rule (`chunk_size: PositiveInt = 512`, `alpha:
Fraction = 0.5`, `device: Device = "cpu"`), and `check_component` applies those rules to the
component's config node, whichever class its `_target_` names (`fusion.k` exists only under
`fusion=rrf`), and to the nested nodes that have a `_target_` of their own (`chunker.routes.*`,
`corpus.parts.*`, `reranker.llm`). `@checked(prefix)` on the constructor applies the same rules
to a component built from Python. Plain annotations have the obvious rule: `int` an integer,
`float` a finite number, `bool` true or false, `str` a non-empty string, and `X | None` also null.

Adding a setting: annotate the constructor's parameter (with one of the aliases below where plain
`int`, `float` or `str` says too little), give its default in the yaml, and describe it in
docs/reference/config.md. Nothing else: no table here lists the components' keys.

`resolved(cfg)` reports a missing `???` value or an interpolation that cannot be resolved by its
key. Every failure is one `RagError` line naming the key and the value, e.g. `eval.k must be an
integer, got 2.5`. Integers must be integers (not 2.5, not true, not "five"); numbers must be
finite. What one value's type cannot say stays in the constructor: a rule that spans two settings
(the chunk overlap's is also checked here, `check_overlap`, so that it fails at start-up), a file
that must exist, a mode named in a message of its own.
"""
from __future__ import annotations

import functools
import inspect
import math
import os
import re
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Annotated, Any, TypeVar, Union

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from rag.types import RagError

Check = Callable[[str, Any], None]
F = TypeVar("F", bound=Callable[..., Any])

# matplotlib's raster and vector formats that the charts can be saved in
CHART_FORMATS = ("png", "svg", "pdf", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp")
_DEVICE = re.compile(r"^(cpu|cuda|mps|xpu|hip|npu|auto)(:\d+)?$")


def shown(value: Any) -> str:
    """A value as the user wrote it on the command line (true, null, 'five', 2.5, nan)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


# ---- checks ---------------------------------------------------------------------------------
# Dataclasses rather than closures, so that `X | None` can turn a rule into its nullable form.


@dataclass(frozen=True)
class _Integer:
    lo: int | None = None
    nullable: bool = False

    def __call__(self, key: str, v: Any) -> None:
        if v is None and self.nullable:
            return
        null = " or null" if self.nullable else ""
        if isinstance(v, bool) or not isinstance(v, int):
            raise RagError(f"{key} must be an integer{null}, got {shown(v)}")
        if self.lo is not None and v < self.lo:
            what = "positive" if self.lo == 1 else f">= {self.lo}"
            raise RagError(f"{key} must be {what}{null}, got {v}")


@dataclass(frozen=True)
class _Number:
    lo: float | None = None
    hi: float | None = None
    above: float | None = None
    note: str = ""
    nullable: bool = False

    def __call__(self, key: str, v: Any) -> None:
        if v is None and self.nullable:
            return
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RagError(f"{key} must be a number, got {shown(v)}")
        is_ = f" is {self.note} and" if self.note else ""
        if not math.isfinite(v):
            raise RagError(f"{key}{is_} must be a finite number, got {shown(v)}")
        lo, hi = self.lo, self.hi
        if lo is not None and hi is not None and not lo <= v <= hi:
            raise RagError(f"{key}{is_} must be in [{lo:g}, {hi:g}], got {shown(v)}")
        if lo is not None and hi is None and v < lo:
            raise RagError(f"{key}{is_} must be >= {lo:g}, got {shown(v)}")
        if self.above is not None and v <= self.above:
            raise RagError(f"{key}{is_} must be > {self.above:g}, got {shown(v)}")


@dataclass(frozen=True)
class _String:
    nonempty: bool = True
    nullable: bool = False
    choices: tuple[str, ...] | None = None

    def __call__(self, key: str, v: Any) -> None:
        if v is None and self.nullable:
            return
        if not isinstance(v, str):
            raise RagError(f"{key} must be a string{' or null' if self.nullable else ''}, got {shown(v)}")
        if self.nonempty and not v.strip():
            raise RagError(f"{key} must not be empty")
        if self.choices is not None and v not in self.choices:
            raise RagError(f"{key} must be one of {', '.join(self.choices)}, got {shown(v)}")


@dataclass(frozen=True)
class _Path:
    what: str = "a file"
    nullable: bool = False
    blank: bool = False  # "" reads as null

    def __call__(self, key: str, v: Any) -> None:
        if isinstance(v, os.PathLike):  # a Path, given from Python
            return
        if (self.nullable and v is None) or (self.blank and v == ""):
            return
        if not isinstance(v, str) or not v.strip():
            raise RagError(f"{key} must name {self.what}, got {shown(v) if v != '' else 'an empty value'}")


def integer(lo: int | None = None, nullable: bool = False) -> Check:
    return _Integer(lo, nullable)


def number(lo: float | None = None, hi: float | None = None, *, above: float | None = None,
           note: str = "", nullable: bool = False) -> Check:
    """A finite int or float; `lo`/`hi` inclusive bounds, `above` an exclusive lower bound."""
    return _Number(lo, hi, above, note, nullable)


def string(nonempty: bool = True, nullable: bool = False, choices: tuple[str, ...] | None = None) -> Check:
    return _String(nonempty, nullable, choices)


def path(what: str = "a file", nullable: bool = False, blank: bool = False) -> Check:
    return _Path(what, nullable, blank)


def boolean(key: str, v: Any) -> None:
    if not isinstance(v, bool):
        raise RagError(f"{key} must be true or false, got {shown(v)}")


def device(key: str, v: Any) -> None:
    if not isinstance(v, str) or not _DEVICE.match(v):
        raise RagError(f"{key} must be a device such as cpu, cuda, cuda:1 or mps, got {shown(v)}")


def strings(nonempty: bool = False, choices: tuple[str, ...] | None = None, blank_items: bool = False) -> Check:
    def check(key: str, v: Any) -> None:
        # a tuple can only come from Python (a config list is a list), where it is as good
        if not isinstance(v, (list, tuple)) or not all(isinstance(s, str) and (s or blank_items) for s in v):
            what = "strings" if blank_items else "names"
            raise RagError(f"{key} must be a list of {what}, e.g. [a,b], got {shown(v)}")
        if nonempty and not v:
            raise RagError(f"{key} must list at least one name")
        bad = [s for s in v if choices is not None and s not in choices]
        if bad:
            raise RagError(f"{key}: unknown {bad}; choose from {list(choices or ())}")

    return check


def groups(key: str, v: Any) -> None:
    if not isinstance(v, list) or not all(isinstance(g, list) and g and all(isinstance(s, str) and s for s in g) for g in v):
        raise RagError(f"{key} must be a list of lists of source tags, e.g. [[pubmed],[libc,pytorch]], got {shown(v)}")


def label(key: str, v: Any) -> None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, (str, int))):
        raise RagError(f"{key} must be a run label, variant or job number, got {shown(v)}")


def threads(key: str, v: Any) -> None:
    """torch CPU threads: a count, null (leave torch's default) or auto (rag.llm decides)."""
    if v == "auto":
        return
    try:
        integer(1, nullable=True)(key, v)
    except RagError:
        raise RagError(f"{key} must be a positive integer, auto or null, got {shown(v)}") from None


def file_list(key: str, v: Any) -> None:
    """One file, or a list of them (each named by its index)."""
    if isinstance(v, (list, tuple)):
        for i, item in enumerate(v):
            path()(f"{key}.{i}", item)


def fields(**rules: Check) -> Check:
    """A mapping's own keys, each with its rule where present: a node that is no component of its
    own (`retriever.source_filter`), so no constructor describes it."""

    def check(key: str, v: Any) -> None:
        for name, rule in rules.items():
            if isinstance(v, dict) and name in v:
                rule(f"{key}.{name}", v[name])

    return check


# ---- rules attached to annotations -----------------------------------------------------------

PositiveInt = Annotated[int, integer(1)]
NonNegativeInt = Annotated[int, integer(0)]
Positive = Annotated[float, number(above=0)]  # a rate, a duration, a share of a CPU
NonNegative = Annotated[float, number(0)]
Fraction = Annotated[float, number(0, 1)]
Similarity = Annotated[float, number(-1, 1)]
Cosine = Annotated[float, number(-1, 1, note="a cosine threshold")]
Percentile = Annotated[float, number(0, 100)]
Device = Annotated[str, device]
Text = Annotated[str, string(nonempty=False)]  # may be empty ("" is a meaningful value)
FilePath = Annotated[str | os.PathLike[str], path()]
Directory = Annotated[str | os.PathLike[str], path("a directory")]
MaybeDirectory = Annotated[str | os.PathLike[str] | None, path("a directory", nullable=True, blank=True)]
Separators = Annotated[Sequence[str], strings(blank_items=True)]  # "" means: fixed windows
Threads = Annotated[int | str | None, threads]

_PLAIN: dict[Any, Check] = {int: integer(), float: number(), bool: boolean, str: string()}


def _or_null(check: Check) -> Check:
    if isinstance(check, (_Integer, _Number, _String, _Path)):
        return replace(check, nullable=True)

    def nullable(key: str, v: Any) -> None:
        if v is not None:
            check(key, v)

    return nullable


def rule(annotation: Any) -> Check | None:
    """The check an annotation stands for; None where it says nothing checkable (a class, a
    mapping, a union of several types)."""
    if typing.get_origin(annotation) is Annotated:
        checks = [m for m in annotation.__metadata__ if callable(m)]
        return checks[-1] if checks else rule(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (Union, types.UnionType):
        others = [a for a in typing.get_args(annotation) if a is not type(None)]
        inner = rule(others[0]) if len(others) == 1 else None
        return _or_null(inner) if inner is not None else None
    try:
        return _PLAIN.get(annotation)
    except TypeError:  # an unhashable annotation
        return None


def _hints(func: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(func, include_extras=True)
    except Exception:  # noqa: BLE001 - one name only importable for type checkers: evaluate the others
        hints = {}
        scope = getattr(inspect.unwrap(func), "__globals__", {})
        for name, ann in getattr(func, "__annotations__", {}).items():
            try:
                hints[name] = eval(ann, scope) if isinstance(ann, str) else ann  # noqa: S307 - our own annotations
            except Exception:  # noqa: BLE001 - that one has no rule
                continue
        return hints


@functools.cache
def parameter_rules(func: Callable[..., Any]) -> dict[str, Check]:
    """Each named parameter's rule, from its annotation (computed once per function)."""
    func = inspect.unwrap(func)
    hints = _hints(func)
    out: dict[str, Check] = {}
    for name, p in inspect.signature(func).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or name not in hints:
            continue
        check = rule(hints[name])
        if check is not None:
            out[name] = check
    return out


def _plain(value: Any) -> Any:
    # Hydra hands a constructor DictConfig/ListConfig values
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def check_arguments(func: Callable[..., Any], prefix: str, arguments: dict[str, Any]) -> None:
    """Applies `func`'s parameter rules to `arguments`, naming each `<prefix>.<parameter>`."""
    rules = parameter_rules(func)
    for name, value in arguments.items():
        check = rules.get(name)
        if check is not None:
            check(f"{prefix}.{name}", _plain(value))


def checked(prefix: str) -> Callable[[F], F]:
    """Applies a constructor's annotation rules to the arguments it is called with (defaults are
    not checked), naming `<prefix>.<parameter>` as the config does (`chunker.chunk_size`), so that
    a component built from Python is refused with the line a run would give."""

    def decorate(init: F) -> F:
        signature = inspect.signature(init)

        @functools.wraps(init)
        def init_checked(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:  # a wrong call: Python's own message, which rag.run.session translates
                return init(*args, **kwargs)
            check_arguments(init, prefix, dict(bound.arguments))
            return init(*args, **kwargs)

        return typing.cast(F, init_checked)

    return decorate


# ---- components' nodes ----------------------------------------------------------------------


def _target(node: dict[str, Any]) -> Callable[..., Any] | None:
    from hydra.utils import get_method

    try:
        target = get_method(str(node["_target_"]))
    except Exception:  # noqa: BLE001 - not importable: instantiating it says why, in its own line
        return None
    return target.__init__ if inspect.isclass(target) else target


def check_component(key: str, node: Any, skip: frozenset[str] = frozenset()) -> list[tuple[str, dict[str, Any]]]:
    """Checks a component's resolved config node (a mapping with `_target_`) against its
    constructor's annotations, naming `key.<parameter>`, then each nested node that has a
    `_target_` of its own. Nested nodes in `skip` (dotted keys) are left out: they are an
    interpolation of a node checked under its own name (`chunker.embedder: ${embedder}`).
    Returns the nodes checked, for the rules that span settings (`check_overlap`)."""
    if not isinstance(node, dict) or "_target_" not in node:
        return []
    func = _target(node)
    if func is not None:
        rules = parameter_rules(func)
        for name, value in node.items():
            if name in rules:
                rules[name](f"{key}.{name}", value)
    done = [(key, node)]
    for nested, child in _nested(node, key):
        if nested not in skip:
            done += check_component(nested, child, skip)
    return done


def _children(node: Any) -> list[tuple[str, Any]]:
    if isinstance(node, dict):
        return [(str(k), v) for k, v in node.items()]
    if isinstance(node, list):
        return [(str(i), v) for i, v in enumerate(node)]
    return []


def _nested(node: Any, key: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The outermost nodes with a `_target_` below `node` (not `node` itself)."""
    for k, child in _children(node):
        if k.startswith("_"):
            continue
        if isinstance(child, dict) and "_target_" in child:
            yield f"{key}.{k}", child
        else:
            yield from _nested(child, f"{key}.{k}")


def _at(data: Any, key: str) -> Any:
    for part in key.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


_INTERPOLATION = re.compile(r"^\$\{.*\}$")


def interpolated_nodes(raw: Any, key: str) -> frozenset[str]:
    """The dotted keys below `raw`, a node as written (unresolved), whose whole value is an
    interpolation (`${embedder}`)."""
    found: set[str] = set()
    for k, child in _children(raw):
        if isinstance(child, str) and _INTERPOLATION.match(child):
            found.add(f"{key}.{k}")
        else:
            found |= interpolated_nodes(child, f"{key}.{k}")
    return frozenset(found)


def check_components(raw: Any, data: dict[str, Any], keys: Sequence[str]) -> None:
    """Checks the components' nodes named by `keys` (dotted: `eval.embedder`) in the resolved
    `data`, in that order, then the rules that span two settings, once every value has passed its
    own. `raw` is the configuration as written, where a node's interpolations show."""
    done: list[tuple[str, dict[str, Any]]] = []
    for key in keys:
        done += check_component(key, _at(data, key), interpolated_nodes(_at(raw, key), key))
    for key, node in done:
        check_overlap(key, node)


def check_overlap(key: str, node: dict[str, Any]) -> None:
    """A chunker's overlap must be smaller than its size: two settings, so no one annotation can
    say it; run after every single value has passed its own rule."""
    size, overlap = node.get("chunk_size"), node.get("chunk_overlap")
    if isinstance(size, int) and isinstance(overlap, int) and overlap >= size:
        raise RagError(f"{key}.chunk_overlap ({overlap}) must be smaller than {key}.chunk_size ({size})")


# ---- the run's own keys -----------------------------------------------------------------------


def _values(node: Any, parts: list[str], prefix: str) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every value matching `parts` (`*` matches any key or list index)."""
    if not parts:
        yield prefix, node
        return
    head, rest = parts[0], parts[1:]
    if head == "*":
        items = _children(node)
    elif isinstance(node, dict) and head in node:
        items = [(head, node[head])]
    else:
        items = []
    for k, child in items:
        yield from _values(child, rest, f"{prefix}.{k}" if prefix else str(k))


def resolved(cfg: DictConfig) -> dict[str, Any]:
    """The configuration as plain data, with `???` values and broken interpolations reported by
    their key in one line."""
    try:
        missing = sorted(OmegaConf.missing_keys(cfg))
        if missing:
            raise RagError(f"{missing[0]} is required and has no default: add {missing[0]}=... to the command line")
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # type: ignore[return-value]
    except MissingMandatoryValue as e:
        raise RagError(f"{e.full_key} is required and has no default: add {e.full_key}=... to the command line") from None
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "config"
        msg = str(e).strip().splitlines()[0]
        msg = re.sub(r"^\w+ raised while resolving interpolation: ", "", msg).strip('"')
        raise RagError(f"{key}: cannot resolve its value: {msg}") from None


def check_all(data: dict[str, Any], rules: dict[str, Check]) -> None:
    """Applies each rule to every value its dotted pattern matches in the resolved `data`."""
    for pattern, check in rules.items():
        for key, value in _values(data, pattern.split("."), ""):
            check(key, value)
