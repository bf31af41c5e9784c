"""Whether a component runs behind a server: its `endpoint`, its own or its generator's (rag/serving/served.py)."""
from __future__ import annotations

from rag.chunker.contextualize import LLMContextualizer
from rag.compressor.base import NoCompressor
from rag.compressor.llm import LLMCompressor
from rag.llm.base import Generator, NoGenerator
from rag.llm.openai import OpenAIGenerator
from rag.reranker.base import NoReranker
from rag.reranker.listwise import ListwiseReranker
from rag.serving.served import served
from rag.types import Context


def test_a_component_is_served_when_it_or_its_generator_calls_a_server():
    remote = OpenAIGenerator("http://127.0.0.1:9/v1", "some-model")
    assert served(remote) and remote.resumable
    for part in (ListwiseReranker(llm=remote), LLMCompressor(remote), LLMContextualizer(remote)):
        assert served(part) and part.endpoint is remote.endpoint


def test_in_process_components_and_absent_ones_are_not_served():
    local = NoGenerator()
    assert not served(None) and not served(local) and not local.resumable
    for part in (ListwiseReranker(llm=local), LLMCompressor(local), LLMContextualizer(local), NoReranker(),
                 NoCompressor()):
        assert not served(part)


def test_a_generator_without_a_tokenizer_estimates_its_prompt_tokens_from_characters():
    counts, method = Generator().count_prompt_tokens(["abcd", ""], [[Context("x" * 8)], []])
    assert counts == [3, 0] and method == "estimated as characters / 4"
