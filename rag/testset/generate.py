"""Where the questions and answers come from: any configured `llm` (`testset.generator=llm`) or the
structural templates of man pages, docstrings and headed documentation (`testset.generator=templates`,
no model; rag/reranker/training/structure.py recognises them by the text).

The LLM is asked twice per question: its kind's few-shot prompt (rag/testset/prompts.py) writes the
question from the passage(s), then the generator's own prompt (`llm.prompt`, as in a run) answers
it from the same passage(s). Every reply is recorded in the artifact cache as it arrives (record
kinds `testset_question` and `testset_answer`, keyed by the generator's id with the prompt it was
given, the question and the passages' text), so a rerun, or a run with more questions, asks only
about what is new; a dry run counts those requests and their prompt tokens and sends nothing.
Served generators get every missing request of a step at once (their requests run concurrently);
in-process ones one request at a time, because a batch's padding can change a greedy answer and
each reply is recorded on its own (as rag/chunker/contextualize.py does).
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rag.store.cache import ArtifactCache, make_key
from rag.llm.base import CHARS_PER_TOKEN, Generator, generate_each
from rag.reranker.training.structure import heading_at
from rag.reranker.training.templates import structural_questions
from rag.reranker.training.text import sentences
from rag.serving.secrets import redacted_data
from rag.testset.passages import Passages
from rag.testset.prompts import digest, prompt_builder
from rag.types import Context, Document, RagError

log = logging.getLogger(__name__)

QUESTION, ANSWER = "question", "answer"
RECORDS = {QUESTION: "testset_question", ANSWER: "testset_answer"}
TEMPLATE_ANSWER_CHARS = 300


@dataclass(frozen=True)
class Request:
    """One prompt: writing a question of `kind` from `texts` (step question, `question` empty), or
    answering `question` from them (step answer)."""

    step: str
    kind: str
    texts: tuple[str, ...]
    question: str = ""


@dataclass
class Usage:
    """What was (or, in a dry run, would be) sent, and how its tokens were counted."""

    requests: int = 0
    from_cache: int = 0
    prompt_tokens: int = 0
    token_count: str = ""


def check_generator(llm: Any) -> Any:
    if not all(hasattr(llm, a) for a in ("generate", "id", "prompt", "system_prompt", "count_prompt_tokens")):
        raise RagError(f"testset.generator=llm needs a prompt-driven generator (llm=smollm2, llm=hf, llm=openai), got "
                       f"{type(llm).__name__}; testset.generator=templates needs none")
    return llm


class Asker:
    """The configured generator, asked through the record cache."""

    def __init__(self, llm: Any, cache: ArtifactCache) -> None:
        self.llm = check_generator(llm)
        self.cache = cache
        self.own = (llm.prompt, llm.system_prompt)  # the answer step's prompt: the generator's own
        self.usage = Usage()

    @contextmanager
    def prompting(self, step: str, kind: str) -> Iterator[None]:
        if step == QUESTION:
            self.llm.prompt, self.llm.system_prompt = prompt_builder(kind), None
        try:
            yield
        finally:
            self.llm.prompt, self.llm.system_prompt = self.own

    @staticmethod
    def _contexts(r: Request) -> list[Context]:
        return [Context(" ".join(t.split())) for t in r.texts]

    def _key(self, r: Request) -> str:
        """(with the request's prompt set) the record's key."""
        texts = [hashlib.sha256(" ".join(t.split()).encode("utf-8", "surrogatepass")).hexdigest() for t in r.texts]
        return make_key(RECORDS[r.step], {"generator": self.llm.id, "question": r.question, "passages": texts})

    def prompt_digest(self, r: Request) -> str:
        with self.prompting(r.step, r.kind):
            return digest(self.llm.system_prompt, self.llm.prompt.build(r.question, self._contexts(r)))

    def generator_id(self) -> dict[str, Any]:
        """The generator's id without its prompt (provenance names each prompt by its digest), as
        every question's provenance and the summary write it (rag.serving.secrets.redacted_data)."""
        return redacted_data({k: v for k, v in self.llm.id.items() if k not in ("prompt", "system_prompt")})

    def _groups(self, requests: Sequence[Request]) -> dict[tuple[str, str], list[int]]:
        groups: dict[tuple[str, str], list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault((r.step, r.kind if r.step == QUESTION else ""), []).append(i)
        return groups

    def _tokens(self, requests: Sequence[Request]) -> tuple[list[int], str]:
        """(with the requests' prompt set) each prompt's tokens and how they were counted: by the
        generator where it counts whole prompts (llm=openai: llm.tokenizer and the chat template,
        else characters / 4), else as the characters of the whole prompt / 4 (the base estimate
        counts only the question and its passages, most of a RAG prompt but not of a few-shot one)."""
        questions, contexts = [r.question for r in requests], [self._contexts(r) for r in requests]
        if type(self.llm).count_prompt_tokens is not Generator.count_prompt_tokens:
            return self.llm.count_prompt_tokens(questions, contexts)
        chars = [len(self.llm.system_prompt or "") + len(self.llm.prompt.build(q, c)) for q, c in zip(questions, contexts)]
        return [int(round(n / CHARS_PER_TOKEN)) for n in chars], f"estimated as characters / {CHARS_PER_TOKEN}"

    def count(self, requests: Sequence[Request]) -> Usage:
        """What asking `requests` would send: the ones not recorded, and their prompt tokens
        (llm.tokenizer where the generator has one, else characters / 4)."""
        usage = Usage()
        for (step, kind), rows in self._groups(requests).items():
            with self.prompting(step, kind):
                todo = [requests[i] for i in rows if self.cache.get_record(RECORDS[step], self._key(requests[i])) is None]
                usage.from_cache += len(rows) - len(todo)
                if todo:
                    tokens, usage.token_count = self._tokens(todo)
                    usage.requests += len(todo)
                    usage.prompt_tokens += sum(tokens)
        return usage

    def recorded(self, requests: Sequence[Request]) -> list[str | None]:
        """Each request's recorded reply, or None; nothing is asked."""
        out: list[str | None] = []
        for r in requests:
            with self.prompting(r.step, r.kind):
                rec = self.cache.get_record(RECORDS[r.step], self._key(r))
            out.append(None if rec is None else str(rec["reply"]))
        return out

    def ask(self, requests: Sequence[Request]) -> list[str]:
        """Each request's reply, recorded ones from the cache."""
        replies: list[str] = [""] * len(requests)
        for (step, kind), rows in self._groups(requests).items():
            with self.prompting(step, kind):
                todo = []
                for i in rows:
                    rec = self.cache.get_record(RECORDS[step], self._key(requests[i]))
                    if rec is None:
                        todo.append(i)
                    else:
                        replies[i] = str(rec["reply"])
                self.usage.from_cache += len(rows) - len(todo)
                if not todo:
                    continue
                log.info("testset: asking the LLM %d %s prompts (%s)", len(todo), step, kind or "own prompt")
                tokens, self.usage.token_count = self._tokens([requests[i] for i in todo])
                self.usage.prompt_tokens += sum(tokens)

                def record(j: int, reply: str) -> None:
                    i = todo[j]
                    replies[i] = reply
                    self.cache.put_record(RECORDS[step], self._key(requests[i]), {"reply": reply})
                    self.usage.requests += 1

                generate_each(self.llm, [(requests[i].question, self._contexts(requests[i])) for i in todo], record)
        return replies


@dataclass(frozen=True)
class TemplateQuestion:
    kind: str
    row: int
    question: str
    answer: str


def answer_start(text: str, offset: int) -> int:
    """Where the text a template points at begins: after a line that only names the flag or error
    asked about, at its first character that is not blank (a man page indents its text; a
    passage holds its text, not the indentation before it)."""
    end = text.find("\n", offset)
    start = end + 1 if end >= 0 and len(text[offset:end].split()) == 1 else offset
    while start < len(text) and text[start].isspace():
        start += 1
    return start


def template_answer(text: str) -> str:
    """Up to two sentences of `text`, up to the next heading: a man page's section ("RETURN VALUE",
    at column 0) or documentation's (rag.reranker.training.structure.heading_at)."""
    body: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if body and ((line[:1].isupper() and line.strip().isupper()) or heading_at(lines, i) is not None):
            break
        body.append(line)
    return " ".join(sentences("\n".join(body))[:2])[:TEMPLATE_ANSWER_CHARS].strip()


def template_questions(docs: Sequence[Document], passages: Passages) -> list[TemplateQuestion]:
    """The structural templates' questions (rag/reranker/training/templates.py) of the man pages,
    docstrings and headed documentation among `docs`, each answered by the text its template points at:
    up to two sentences from there, within the passage that holds their start."""
    out: list[TemplateQuestion] = []
    for doc in docs:
        for variant, question, offset in structural_questions(doc):
            start = answer_start(doc.text, offset)
            row = passages.containing(doc.id, start)
            if row is None:
                continue
            answer = template_answer(doc.text[start:passages[row].end])
            if answer:
                out.append(TemplateQuestion(f"template:{variant}", row, question, answer))
    return out
