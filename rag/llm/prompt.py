"""The user message of a RAG question: numbered context passages plus the question.

The template is a config value (`llm.prompt.template`) with the placeholders `{contexts}`,
`{question}` and optionally `{no_answer}`; write a literal brace as `{{` or `}}`. Context texts are
substituted as values, so braces inside passages need no escaping.
"""
from __future__ import annotations

import string
from collections.abc import Sequence

from rag.types import Context, RagError

NO_ANSWER = "The context does not contain the answer."

# Passages first and the instruction last: small models follow what they read last. On a handful
# of hand-made questions SmolLM2-135M copied passages back less often with this layout than with
# the instruction first (weak evidence; the template is a config value to experiment with).
DEFAULT_TEMPLATE = (
    "Context:\n{contexts}\n\n"
    "Question: {question}\n\n"
    "Answer the question concisely, in one or two sentences, using only the numbered context passages "
    "above. If they do not contain the answer, reply exactly: {no_answer}"
)
DEFAULT_CONTEXT_FORMAT = "[{n}] {label}{text}"

TEMPLATE_FIELDS = {"contexts", "question", "no_answer"}
CONTEXT_FIELDS = {"n", "label", "text"}


def _fields(fmt: str, name: str, allowed: set[str], required: set[str]) -> None:
    try:
        used = {f for _, f, _, _ in string.Formatter().parse(fmt) if f is not None}
    except ValueError as e:
        raise RagError(f"{name}: {e} (write a literal brace as {{{{ or }}}})") from e
    unknown = used - allowed
    if unknown:
        raise RagError(f"{name}: unknown placeholder(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    missing = required - used
    if missing:
        raise RagError(f"{name} must contain {', '.join('{' + m + '}' for m in sorted(missing))}")


def as_context(c: Context | str) -> Context:
    """Plain strings are accepted as unlabeled contexts."""
    return c if isinstance(c, Context) else Context(text=str(c))


class PromptBuilder:
    def __init__(
        self,
        template: str = DEFAULT_TEMPLATE,
        context_format: str = DEFAULT_CONTEXT_FORMAT,
        no_answer: str = NO_ANSWER,
    ):
        _fields(template, "llm.prompt.template", TEMPLATE_FIELDS, {"contexts", "question"})
        _fields(context_format, "llm.prompt.context_format", CONTEXT_FIELDS, {"text"})
        self.template = template
        self.context_format = context_format
        self.no_answer = no_answer

    @property
    def id(self) -> dict[str, str]:
        return {"template": self.template, "context_format": self.context_format, "no_answer": self.no_answer}

    def format_contexts(self, contexts: Sequence[Context | str]) -> str:
        if not contexts:
            return "(no passages)"
        parts = []
        for n, c in enumerate(map(as_context, contexts), start=1):
            label = f"({c.label}) " if c.label else ""
            parts.append(self.context_format.format(n=n, label=label, text=c.text.strip()))
        return "\n\n".join(parts)

    def build(self, question: str, contexts: Sequence[Context | str]) -> str:
        return self.template.format(
            contexts=self.format_contexts(contexts), question=question.strip(), no_answer=self.no_answer
        )


def chat_messages(system_prompt: str | None, user: str) -> list[dict[str, str]]:
    """The chat messages of one prompt: the system prompt (when there is one), then the user
    message; what `hf.render_chat` renders with the tokenizer's template and what `llm=openai`
    sends to a server, which applies the same template."""
    return ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
        {"role": "user", "content": user}
    ]
