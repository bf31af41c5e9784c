"""The configuration schema (rag/schema.py): every shipped configuration passes it, and a bad value
is one line naming the key and the value, whichever component the groups chose."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rag.config import PROJECT_ROOT
from rag.schema import shown
from rag.settings import validate
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
