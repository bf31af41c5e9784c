"""`llm=openai`: answers from any OpenAI-compatible `/v1/chat/completions` endpoint: vLLM,
llama.cpp's server, Ollama, TGI, `transformers serve`, or a hosted API.

The prompt is the in-process generator's: the same system prompt and the same user message
(`PromptBuilder`), sent as chat messages so that the server applies the model's own chat template,
as `HFGenerator` does with the tokenizer's. With greedy decoding and the same token limit, a server
running the same weights gives the in-process answers (docs/explanation/serving.md lists the differences seen).

Requests are independent, so the pipeline caches every answer as it arrives
(`rag.llm.answer_cache`): a run stopped by a dead server resumes with the missing answers
only. The cache key is the endpoint's model id, the request parameters and the exact prompt, not
the URL: the same model moved to another host or port keeps its answers. Two endpoints that serve
different weights under one model id (e.g. two quantizations) need `llm.endpoint.cache_namespace`
set apart. Requests, retries and the timeout are the `endpoint` node's
(rag.endpoint.EndpointSettings).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from rag.llm.base import Generator
from rag.endpoint import EndpointSettings
from rag.llm.chat_api import ChatEndpoint, Completion, map_concurrent
from rag.llm.hf import DEFAULT_SYSTEM_PROMPT
from rag.llm.prompt import PromptBuilder, chat_messages
from rag.config.schema import NonNegative, PositiveInt, Text, checked
from rag.types import Context

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4.0  # the usual estimate for English text when no tokenizer is at hand


def stop_list(stop: list[str] | str | None) -> list[str] | None:
    """llm.stop as the request's list: one string is a list of one; an empty list is no stop."""
    if isinstance(stop, str):
        return [stop]
    return list(stop) if stop else None


class OpenAIGenerator(Generator):
    resumable = True  # answers are independent of each other: the pipeline may cache them one by one

    @checked("llm")
    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: Text | None = None,  # "" as null: a server without keys
        temperature: NonNegative = 0.0,
        max_tokens: PositiveInt = 96,
        stop: list[str] | str | None = None,
        seed: int | None = 0,
        top_p: float | None = None,
        endpoint: EndpointSettings | None = None,
        dry_run: bool = False,
        tokenizer: Text | None = None,  # "" as null: no tokenizer
        prompt: dict[str, Any] | None = None,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    ):
        settings = endpoint or EndpointSettings()
        self.endpoint: ChatEndpoint = settings.transport("llm", base_url, str(model), api_key_env, kind=ChatEndpoint)
        self.temperature = float(temperature)
        self.max_tokens = int(max_tokens)
        self.stop = stop_list(stop)
        self.seed = None if seed is None else int(seed)
        self.top_p = None if top_p is None else float(top_p)
        self.concurrency = settings.concurrency
        self.extra_body = dict(settings.extra_body)
        self.cache_namespace = settings.cache_namespace
        self.dry_run = bool(dry_run)
        self.tokenizer = tokenizer
        self._loaded_tokenizer: tuple[Any, str | None] | None = None  # (tokenizer or None, its path), once
        self.prompt = PromptBuilder(**dict(prompt or {}))
        self.system_prompt = system_prompt or None
        self._checked = False
        self._lock = threading.Lock()
        self.last_latencies_ms: list[float] | None = None
        self.last_details: list[dict[str, Any]] | None = None

    @property
    def id(self) -> dict[str, Any]:
        return {
            "class": type(self).__name__,
            "model": self.endpoint.model,
            **({"cache_namespace": self.cache_namespace} if self.cache_namespace else {}),
            "params": self.params(),
            "prompt": self.prompt.id,
            "system_prompt": self.system_prompt,
        }

    @property
    def no_answer(self) -> str:
        return self.prompt.no_answer

    def params(self) -> dict[str, Any]:
        """The request fields besides model and messages. The seed goes to the server only when
        sampling: greedy answers do not depend on it, so it must not split the cache either."""
        out: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        if self.stop:
            out["stop"] = self.stop
        if self.top_p is not None:
            out["top_p"] = self.top_p
        if self.seed is not None and self.temperature > 0:
            out["seed"] = self.seed
        return {**out, **self.extra_body}

    def warm_up(self) -> None:
        """Checks once that the server answers and serves the model (GET /models), so a wrong
        URL or key fails in one line before the first prompt is sent."""
        with self._lock:
            if not self._checked:
                self.endpoint.check()
                self._checked = True

    def messages(self, question: str, contexts: list[Context]) -> list[dict[str, str]]:
        return chat_messages(self.system_prompt, self.prompt.build(question, contexts))

    def _ask(self, messages: list[dict[str, str]], stop: threading.Event) -> Completion:
        return self.endpoint.chat(messages, self.params(), stop)

    def iter_generate(self, questions: list[str], contexts: list[list[Context]]) -> Iterator[tuple[int, dict[str, Any]]]:
        """(index, record) for each answer as it arrives: `answer`, `latency_ms` (the request's wall
        time, retries included), `usage`, `finish_reason`, `served_model`, `attempts`, and
        `withheld` where the reply holds no answer (rag.llm.chat_api.withheld: never cached). The first
        request that fails for good stops the rest and raises its one-line error after the
        answers still in flight have been yielded."""
        if len(questions) != len(contexts):
            raise ValueError(f"generate: {len(questions)} questions but {len(contexts)} context lists")
        self.warm_up()
        prompts = [self.messages(q, c) for q, c in zip(questions, contexts)]
        bar = tqdm(total=len(prompts), desc="generate (server)", unit="answer", mininterval=2.0, leave=False)
        try:
            for i, done in map_concurrent(self._ask, prompts, self.concurrency):
                bar.update(1)
                if done.finish_reason == "length":
                    log.debug("llm: answer %d stopped at max_tokens=%d", i, self.max_tokens)
                # a withheld reply's text (a refusal's apology) is no answer to score either
                yield i, {"answer": "" if done.withheld else done.text.strip(),
                          "latency_ms": round(done.latency_ms, 3), "usage": done.usage(),
                          "finish_reason": done.finish_reason, "served_model": done.served_model,
                          "attempts": done.attempts, **({"withheld": done.withheld} if done.withheld else {})}
        finally:
            bar.close()

    def generate(self, questions: list[str], contexts: list[list[Context]]) -> list[str]:
        records: list[dict[str, Any] | None] = [None] * len(questions)
        for i, rec in self.iter_generate(questions, contexts):
            records[i] = rec
        done = [r for r in records if r is not None]
        self.last_details = done
        self.last_latencies_ms = [r["latency_ms"] for r in done]
        self.last_stopped = [r["finish_reason"] == "length" for r in done]
        return [r["answer"] for r in done]

    @property
    def token_limit(self) -> tuple[str, int]:
        return "llm.max_tokens", self.max_tokens

    # -- dry run ----------------------------------------------------------------------------

    def count_prompt_tokens(self, questions: list[str], contexts: list[list[Context]]) -> tuple[list[int], str]:
        """Prompt tokens per question as the server would count them: with `tokenizer` (or the
        model id, when it is a local folder) the chat template is applied and tokenized here;
        without one, characters / 4, and the method says so."""
        messages = [self.messages(q, c) for q, c in zip(questions, contexts)]
        tok, source = self._load_tokenizer()
        if tok is not None:
            counts = []
            for m in messages:
                ids = tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True)
                if hasattr(ids, "keys") and "input_ids" in ids:  # transformers 5 returns a BatchEncoding
                    ids = ids["input_ids"]
                counts.append(len(ids))
            return counts, f"counted with the tokenizer at {source} and its chat template"
        chars = [sum(len(x["content"]) for x in m) for m in messages]
        return [int(round(c / CHARS_PER_TOKEN)) for c in chars], (
            f"estimated as characters / {CHARS_PER_TOKEN:g} (no local tokenizer: set llm.tokenizer to count exactly)")

    def _load_tokenizer(self) -> tuple[Any, str | None]:
        """The local tokenizer (None when there is none, or it has no chat template), loaded once:
        a dry run counts a prompt per window, context or chunk."""
        if self._loaded_tokenizer is None:
            self._loaded_tokenizer = self._find_tokenizer()
        return self._loaded_tokenizer

    def _find_tokenizer(self) -> tuple[Any, str | None]:
        source = self.tokenizer
        if source is None and Path(self.endpoint.model).expanduser().is_dir():
            source = self.endpoint.model
        if source is None:
            return None, None
        from rag.store.models import resolve_model

        path = resolve_model(str(source), "llm.tokenizer", must_exist=False, install="pip install --no-deps").path
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError) as e:
            log.warning("llm.tokenizer %s could not be loaded (%s); estimating tokens instead", source,
                        str(e).splitlines()[0] if str(e) else type(e).__name__)
            return None, None
        if not getattr(tok, "chat_template", None):
            log.warning("llm.tokenizer %s has no chat template; estimating tokens instead", source)
            return None, None
        return tok, path
