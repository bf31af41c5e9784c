"""Chat completions over the shared HTTP transport (rag/endpoint.py): `llm=openai`, the LLM judge
(`eval.judge`) and the listwise reranker talk to any OpenAI-compatible `/chat/completions` (vLLM,
llama.cpp's server, Ollama, TGI, `transformers serve`, hosted APIs) through `ChatEndpoint.chat`.
Retries, timeouts, one-line errors and the key's handling are the endpoint's.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from rag.serving.concurrent import Cancelled, map_concurrent
from rag.endpoint import Endpoint, EndpointError
from rag.serving.reply import BadReply, reported_tokens, shown

__all__ = ["Cancelled", "ChatEndpoint", "Completion", "EndpointError", "map_concurrent"]


@dataclass
class Completion:
    text: str
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None
    served_model: str | None
    latency_ms: float
    attempts: int
    # Why the reply holds no answer though it came back fine ("content null", "refusal",
    # "content_filter"); None for an answer. Its text is "", which is no answer to score or cache.
    withheld: str | None = None

    def usage(self) -> dict[str, int | None]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}


class ChatEndpoint(Endpoint):
    """One chat endpoint and model. `what` names the config node in messages (`llm`, `eval.judge`)."""

    # what `chat` sends or reads itself: `extra_body` must not set them (a streamed reply is unreadable)
    own_fields = ("model", "messages", "stream")

    def chat(self, messages: list[dict[str, str]], params: dict[str, Any],
             stop: threading.Event | None = None) -> Completion:
        """One chat completion, retried on transient failures (Endpoint.post)."""
        reply = self.post("/chat/completions", {"model": self.model, "messages": messages, **params}, _completion, stop)
        done = reply.value
        done.latency_ms, done.attempts = reply.latency_ms, reply.attempts
        return done


def _completion(data: Any) -> Completion | None:
    """The first choice's text and the usage; None for a body that is no completion (retried), a
    BadReply for text that is not a string or token counts that are not counts (they become costs).
    A completion without an answer (content null, a refusal, text a content filter removed) is
    one, with `withheld` saying why."""
    try:
        choice = data["choices"][0]
        message = choice["message"]
        content = message.get("content")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    if content is not None and not isinstance(content, str):
        raise BadReply(f"choices[0].message.content is {shown(content)}, not text")
    finish = choice.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise BadReply(f"choices[0].finish_reason is {shown(finish)}, not text")
    return Completion(text=content or "", prompt_tokens=reported_tokens(data, "prompt_tokens"),
                      completion_tokens=reported_tokens(data, "completion_tokens"),
                      finish_reason=finish, served_model=data.get("model"), latency_ms=0.0,
                      attempts=0, withheld=withheld(content, message.get("refusal"), finish))


def withheld(content: str | None, refusal: Any, finish_reason: str | None) -> str | None:
    """Why a completion holds no answer (None: it holds one, perhaps an empty one). A refusal
    (OpenAI's `message.refusal`) or a content filter's removal is the server declining to answer,
    and content null is no text at all: none of them is the model's answer to the prompt."""
    if refusal not in (None, ""):
        return "refusal"
    if content is None:
        return "content null"
    if finish_reason == "content_filter" and not content.strip():
        return "content_filter"
    return None
