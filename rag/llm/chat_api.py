"""Chat completions over the shared HTTP transport (rag/endpoint.py): `llm=openai`, the LLM judge
(`eval.judge`) and the listwise reranker talk to any OpenAI-compatible `/chat/completions` (vLLM,
llama.cpp's server, Ollama, TGI, `transformers serve`, hosted APIs) through `ChatEndpoint.chat`.
Retries, timeouts, one-line errors and the key's handling are the endpoint's.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from rag.concurrent import Cancelled, map_concurrent
from rag.endpoint import Endpoint, EndpointError
from rag.reply import BadReply, reported_tokens, shown

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
    BadReply for text that is not a string or token counts that are not counts (they become costs)."""
    try:
        choice = data["choices"][0]
        content = choice["message"].get("content")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    if content is not None and not isinstance(content, str):
        raise BadReply(f"choices[0].message.content is {shown(content)}, not text")
    return Completion(text=content or "", prompt_tokens=reported_tokens(data, "prompt_tokens"),
                      completion_tokens=reported_tokens(data, "completion_tokens"),
                      finish_reason=choice.get("finish_reason"), served_model=data.get("model"), latency_ms=0.0,
                      attempts=0)
