"""`compressor=llm`: a generator reads one context at a time with the question and writes out the
parts of it that bear on the question, or a fixed "no excerpt" reply (LangChain's
LLMChainExtractor). Any generator extracts: the in-process
SmolLM2, or a served model (`llm@compressor.llm=openai`); the prompt is the generator's own prompt
settings (`compressor.llm.prompt`), so the same text reaches either engine. Each excerpt is
recorded in the artifact cache (kind `excerpt`, keyed by the generator's id, the question and the
context), so a rerun asks nothing.

The excerpt is kept only when it is drawn from the context: an answer that restates or invents
(none of its sentences found in the context, whitespace aside) is dropped as "no excerpt",
counted in `unfaithful_excerpts`. An extractor that may paraphrase is a generator, not a
compressor.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from rag.store.cache import make_key
from rag.chunker import sentence_spans
from rag.compressor.base import Compressor
from rag.llm.base import Generator, withheld
from rag.store.models import UsesCache, use_cache
from rag.config.schema import Text, checked
from rag.types import Context, RagError

log = logging.getLogger(__name__)

EXCERPTS = "excerpt"  # record kind: one context's excerpt for one question


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()


class LLMCompressor(UsesCache, Compressor):
    name = "llm"

    @checked("compressor")
    def __init__(self, llm: Generator, none_reply: Text = "NO_OUTPUT"):
        if not isinstance(llm, Generator):
            raise RagError("compressor.llm must be a generator config (an llm/ option, e.g. smollm2 or openai)")
        self.llm, self.none_reply = llm, str(none_reply)
        self.endpoint = llm.endpoint  # served through its generator
        self.usage = {"requests": 0, "from_cache": 0, "unfaithful_excerpts": 0, "empty_excerpts": 0}

    def use_cache(self, cache: Any) -> None:
        super().use_cache(cache)
        use_cache(self.llm, cache)

    @property
    def id(self) -> dict[str, Any]:
        return {"compressor": self.name, "llm": self.llm.id, "none_reply": self.none_reply}

    def warm_up(self) -> None:
        self.llm.warm_up()

    def excerpt(self, query: str, context: Context) -> str:
        # the label may be None: in the key as null, as it always was
        inputs: Mapping[str, Any] = {"query": query, "text": context.text, "label": context.label}
        key = make_key(EXCERPTS, {"llm": self.llm.id}, inputs)
        rec = self.cache.get_record(EXCERPTS, key)
        if rec is not None:
            self.usage["from_cache"] += 1
            return rec["excerpt"]
        answer = (self.llm.generate([query], [[context]]) or [""])[0] or ""
        self.usage["requests"] += 1
        if withheld(self.llm) is not None:  # no excerpt: an empty one this run, asked again by the next
            return answer
        try:
            self.cache.put_record(EXCERPTS, key, {"excerpt": answer})
        except OSError as e:
            log.warning("compressor: excerpts are not recorded in the cache (%s)", e)
        return answer

    def drawn_from(self, excerpt: str, context: Context) -> str:
        """The excerpt's sentences that stand in the context (whitespace and case aside)."""
        source = _norm(context.text)
        kept = [excerpt[a:b] for a, b in sentence_spans(excerpt) if _norm(excerpt[a:b]) in source]
        return " ".join(kept)

    def select(self, queries: list[str], contexts: list[list[Context]]) -> list[list[Context]]:
        out: list[list[Context]] = []
        for query, ctx in zip(queries, contexts):
            kept: list[Context] = []
            for c in ctx:
                answer = self.excerpt(query, c).strip()
                if not answer or self.none_reply.lower() in answer.lower():
                    self.usage["empty_excerpts"] += 1
                    continue
                text = self.drawn_from(answer, c)
                if not text:
                    self.usage["unfaithful_excerpts"] += 1
                    continue
                kept.append(Context(text, c.label))
            out.append(kept)
        return out

    def compress(self, queries: list[str], contexts: list[list[Context]]):  # noqa: ANN201
        done = super().compress(queries, contexts)
        done.stats.update(self.usage)
        return done
