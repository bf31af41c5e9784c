"""The configuration schema (rag/config/schema.py): every shipped configuration passes it, and a bad value
is one line naming the key and the value, whichever component the groups chose. A component's
rules are its constructor's annotations: the same rule refuses a bad value in the config and in a
direct call."""
from __future__ import annotations

import inspect
import typing
from typing import Annotated

import pytest
from hydra.utils import get_method
from omegaconf import OmegaConf

from rag.config.compose import PROJECT_ROOT
from rag.config.schema import (Fraction, PositiveInt, Text, check_component, checked, parameter_rules, shown, string)
from rag.run.settings import COMPONENTS, validate
from rag.types import RagError
from tests.test_configs import NEEDS

GROUPS = ["corpus", "qa", "chunker", "embedder", "index", "retriever", "fusion", "reranker", "llm", "eval", "tracking"]


def options() -> list[tuple[str, str]]:
    return [(g, p.stem) for g in GROUPS for p in sorted((PROJECT_ROOT / "conf" / g).glob("*.yaml"))]


@pytest.mark.parametrize("group,option", options(), ids=[f"{g}={o}" for g, o in options()])
def test_every_shipped_option_passes(group, option, compose_cfg):
    validate(compose_cfg([f"{group}={option}", *NEEDS.get((group, option), [])]))


@pytest.mark.parametrize("preset", ["+version=v1", "+version=v2", "+version=v3", "+version=v4", "sweep=chunk_alpha",
                                    "sweep=alpha", "sweep=versions", "sweep=optuna"])
def test_every_preset_passes(preset, compose_cfg):
    validate(compose_cfg([preset]))


def test_a_required_value_is_named(compose_cfg):
    with pytest.raises(RagError, match=r"^qa.path is required and has no default: add qa.path=\.\.\. to the command line$"):
        validate(compose_cfg(["qa=jsonl"]))


@pytest.mark.parametrize("overrides,message", [
    (["chunker=per_source", "chunker.routes.libc.chunk_overlap=500"],
     "chunker.routes.libc.chunk_overlap (500) must be smaller than chunker.routes.libc.chunk_size (384)"),
    (["chunker=per_source", "chunker.routes.pubmed.chunk_size=0"], "chunker.routes.pubmed.chunk_size must be positive, got 0"),
    (["chunker=semantic", "chunker.breakpoint_percentile=150"], "chunker.breakpoint_percentile must be in [0, 100], got 150"),
    (["retriever=hybrid", "retriever.lexical.b=1.5"], "retriever.lexical.b must be in [0, 1], got 1.5"),
    (["retriever=bm25", "retriever.k1=0"], "retriever.k1 must be > 0, got 0"),
    (["reranker=mmr", "reranker.top_n=2.0"], "reranker.top_n must be an integer, got 2"),
    (["llm=smollm2", "llm.temperature=-0.5"], "llm.temperature must be >= 0, got -0.5"),
    (["eval.embedder.batch_size=0"], "eval.embedder.batch_size must be positive, got 0"),
    (["corpus=mixed", "corpus.parts.0.path="], "corpus.parts.0.path must name a file, got an empty value"),
    (["eval.bootstrap.seed=-1"], "eval.bootstrap.seed must be >= 0, got -1"),
    (["chunker=per_source", "chunker.chunk_size=0"], "chunker.chunk_size must be positive or null, got 0"),
    (["chunker=sliding_window", "chunker.chunk_size=null"], "chunker.chunk_size must be an integer, got null"),
    (["fusion=rrf", "fusion.k=inf"], "fusion.k must be an integer, got inf"),
    (["fusion=weighted", "fusion.alpha=nan"], "fusion.alpha must be a finite number, got nan"),
])
def test_values_deep_in_components_are_checked(overrides, message, compose_cfg):
    with pytest.raises(RagError) as err:
        validate(compose_cfg(overrides))
    assert str(err.value) == message


def test_values_are_shown_as_written_on_the_command_line():
    assert [shown(v) for v in (True, None, "five", 2.5, float("nan"), 3)] == ["true", "null", "'five'", "2.5", "nan", "3"]


def test_validate_returns_the_resolved_config(compose_cfg):
    data = validate(compose_cfg(["eval.k=7"]))
    assert data["eval"]["k"] == 7 and data["paths"]["root"] == str(PROJECT_ROOT)
    assert OmegaConf.is_config(compose_cfg([])) and isinstance(data, dict)


class Toy:
    @checked("toy")
    def __init__(self, size: PositiveInt = 4, share: Fraction = 0.5, name: str = "a", prefix: Text = "",
                 limit: PositiveInt | None = None, flag: bool = True, mode: Annotated[str, string(choices=("a", "b"))] = "a",
                 anything: dict | None = None):
        self.size = size


@pytest.mark.parametrize("kwargs,message", [
    ({"size": 0}, "toy.size must be positive, got 0"),
    ({"size": 2.5}, "toy.size must be an integer, got 2.5"),
    ({"share": 1.5}, "toy.share must be in [0, 1], got 1.5"),
    ({"share": float("nan")}, "toy.share must be a finite number, got nan"),
    ({"name": ""}, "toy.name must not be empty"),
    ({"name": 3}, "toy.name must be a string, got 3"),
    ({"limit": 0}, "toy.limit must be positive or null, got 0"),
    ({"flag": "yes"}, "toy.flag must be true or false, got 'yes'"),
    ({"mode": "c"}, "toy.mode must be one of a, b, got 'c'"),
])
def test_an_annotation_is_the_rule_of_a_direct_call(kwargs, message):
    with pytest.raises(RagError) as err:
        Toy(**kwargs)
    assert str(err.value) == message


def test_what_an_annotation_allows_passes_and_what_it_does_not_say_is_not_checked():
    Toy(prefix="", limit=None, anything={"x": [1]})
    assert set(parameter_rules(Toy.__init__)) == {"size", "share", "name", "prefix", "limit", "flag", "mode"}


def test_a_config_node_is_checked_by_the_class_its_target_names():
    node = {"_target_": f"{__name__}.Toy", "size": 0}
    with pytest.raises(RagError, match=r"^thing\.size must be positive, got 0$"):
        check_component("thing", node)
    nested = {"_target_": f"{__name__}.Toy", "anything": {"inner": {"_target_": f"{__name__}.Toy", "share": 2}}}
    with pytest.raises(RagError, match=r"^thing\.anything\.inner\.share must be in \[0, 1\], got 2$"):
        check_component("thing", nested)


def test_a_node_that_interpolates_another_is_named_by_the_key_the_user_set(compose_cfg):
    with pytest.raises(RagError, match=r"^embedder\.batch_size must be positive, got 0$"):
        validate(compose_cfg(["chunker=semantic", "compressor=embedding", "embedder.batch_size=0"]))


def _settings(node, key):
    """(dotted key, parameter, constructor) of every scalar setting of `node` and of the nodes with a
    `_target_` inside it."""
    if isinstance(node, dict) and "_target_" in node:
        target = get_method(node["_target_"])
        init = target.__init__ if isinstance(target, type) else target
        for k, v in node.items():
            if not k.startswith("_") and (v is None or isinstance(v, (bool, int, float, str))):
                yield f"{key}.{k}", k, init
    if isinstance(node, dict):
        children = list(node.items())
    elif isinstance(node, list):
        children = list(enumerate(node))
    else:
        children = []
    for k, v in children:
        yield from _settings(v, f"{key}.{k}")


def _several_types(init, name) -> bool:
    """Whether a parameter takes values of several types (`stop: list[str] | str | None`, a label
    of any kind): no one rule fits, and none is asked for."""
    hint = typing.get_type_hints(init, include_extras=True).get(name)
    return len([a for a in typing.get_args(hint) if a is not type(None)]) > 1


@pytest.mark.parametrize("group,option", options(), ids=[f"{g}={o}" for g, o in options()])
def test_every_setting_of_a_shipped_option_has_a_rule(group, option, compose_cfg):
    """A new setting is annotated in its constructor: the one place its rule lives."""
    data = validate(compose_cfg([f"{group}={option}", *NEEDS.get((group, option), [])]))
    for key in [k for k in COMPONENTS if k.split(".")[0] == group]:
        node = data
        for part in key.split("."):
            node = node[part]
        unruled = [k for k, name, init in _settings(node, key) if name in inspect.signature(init).parameters
                   and name not in parameter_rules(init) and not _several_types(init, name)]
        assert not unruled, f"settings with no rule in their constructor's annotations: {unruled}"
