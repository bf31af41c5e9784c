"""rag/run/settings.py: the composed config becomes typed settings once, at the door; below it no
module reads the raw config, and each component is built from its own node."""
from __future__ import annotations

import ast
import os

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from eval.scoring import ScoreSettings
from rag.config.compose import PROJECT_ROOT, register_resolvers
from rag.run.latency import LatencySettings
from rag.run.settings import Settings, load
from rag.types import RagError

register_resolvers()


def composed(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_the_default_config_loads_into_typed_settings():
    s = load(composed("+version=v3"))
    assert isinstance(s, Settings) and s.variant == "v3" and s.objective == "mrr"
    assert isinstance(s.score, ScoreSettings) and s.score.k == 5 and s.score.tau_recall == 0.75
    assert isinstance(s.latency, LatencySettings) and s.latency.sample == 16
    assert s.slice.docs_per_source == 120 and s.slice.answer_questions_per_corpus is None
    assert s.report.html is True and s.report.max_context_chars == 1200
    assert s.nodes.judge is None  # eval.judge is off by default
    assert s.pricing.currency == "USD" and s.pricing.price("generate").cost(10, 10**6, 10**6) == 0.0
    for name in ("corpus", "qa", "chunker", "fusion", "retriever", "reranker", "llm", "eval_embedder"):
        assert "_target_" in getattr(s.nodes, name), name
    assert s.resolved["variant"] == "v3" and s.resolved["eval"]["k"] == 5


def test_relative_paths_are_taken_from_the_directory_the_command_started_in(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = load(composed("paths.cache=c"))  # model_cache defaults to ${paths.cache}
    assert s.paths.cache == str(tmp_path / "c") and s.paths.model_cache == str(tmp_path / "c")
    assert os.path.isabs(load(composed("paths.model_cache=m")).paths.model_cache)


def test_the_judge_node_is_kept_only_when_enabled():
    s = load(composed("eval.judge.enabled=true", "eval.judge.model=m"))
    assert s.nodes.judge is not None and s.nodes.judge.model == "m"


@pytest.mark.parametrize("override, message", [
    ("eval.k=2.5", r"^eval.k must be an integer, got 2.5$"),
    ("slice.seed=x", r"^slice.seed must be an integer, got 'x'$"),
    ("+context.label=true", r"^context: unknown key\(s\) \['label'\]; known: labels, expand_neighbors, budget_chars$"),
    ("+eval.latency.samples=3", r"^eval.latency: unknown key\(s\) \['samples'\]"),
    ("report.html=maybe", r"^report.html must be true or false, got 'maybe'$"),
    ("pricing.generate.input=-1", r"^pricing.generate.input must be >= 0, got -1$"),
    ("pricing.embed.output=cheap", r"^pricing.embed.output must be a number, got 'cheap'$"),
    ("+pricing.embd={input: 1}", r"^pricing.embd: unknown model role; known: contextualize, embed, rerank, compress, generate, judge, relevance$"),
    ("+pricing.judge.per_token=1", r"^pricing.judge: unknown key\(s\) \['per_token'\]; known: input, output, request"),
    ("+report.min_effect.speed=1", r"^report.min_effect.speed: no such metric; known: recall_at_k, "),
    ("+report.min_effect.ndcg_at_k=-0.1", r"^report.min_effect.ndcg_at_k must be a difference >= 0 in the metric's unit"),
    ("report.min_effect=0.01", r"^report.min_effect must be a mapping of metric to smallest difference"),
])
def test_a_bad_value_is_one_line_at_the_door(override, message):
    with pytest.raises(RagError, match=message):
        load(composed(override))


# The modules that may hold the composed config: the door (settings, the schema it applies), the
# command-line entry points that compose it and hand it to the door at once, the session's
# `create` (a component's node), and the pipeline's run, which accepts a composed config for
# library callers and passes it through the door first.
MAY_HOLD_CONFIG = {"rag/run/settings.py", "rag/config/schema.py", "rag/run/session.py", "rag/run/pipeline.py", "rag/config/compose.py",
                   "rag/run/output.py", "rag/ask.py", "rag/corpus/export.py", "rag/reranker/training/cli.py",
                   "rag/testset/__main__.py"}


def test_no_module_below_the_door_reads_the_composed_config():
    """Components and stages get typed settings or their own node, never `cfg`: no module of rag/
    or eval/ outside the door names omegaconf or a `cfg` (imports inside functions included)."""
    readers = []
    for package in ("rag", "eval"):
        for f in sorted((PROJECT_ROOT / package).rglob("*.py")):
            rel = f.relative_to(PROJECT_ROOT).as_posix()
            tree = ast.parse(f.read_text(encoding="utf-8"))
            names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
                a.arg for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                for a in n.args.args}
            imports = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | {
                a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            if ("cfg" in names or any(m.split(".")[0] == "omegaconf" for m in imports)) and rel not in MAY_HOLD_CONFIG:
                readers.append(rel)
    assert readers == []



@pytest.mark.parametrize("overrides, chosen", [
    (["+version=v3", "sweep=demo", "llm=extractive"], set()),
    (["slice.questions_per_corpus=20", "eval.k=10"], {"slice.questions_per_corpus"}),
    (["+slice.answer_questions_per_corpus=2", "slice.docs_per_source=5"],
     {"slice.answer_questions_per_corpus", "slice.docs_per_source"}),
    (["slice=all"], {"slice.docs_per_source", "slice.questions_per_corpus", "slice.answer_questions_per_corpus"}),
    (None, {"slice.docs_per_source", "slice.questions_per_corpus", "slice.answer_questions_per_corpus"}),
])
def test_the_slice_settings_a_user_set_are_the_ones_on_the_command_line(overrides, chosen):
    """Outside a Hydra run (the Python API) every sample counts as the user's."""
    from rag.run.settings import chosen_slice_settings

    assert chosen_slice_settings(overrides) == chosen
