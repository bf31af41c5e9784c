"""`reranker=llm_listwise`: an LLM reads a window of numbered passages and answers with their order
("[3] > [1] > [2]"), RankGPT's sliding window over the fused top_n (Sun et al. 2023), through any
generator: the in-process SmolLM2 or `llm=openai`'s endpoint (Ollama, vLLM, a hosted API).

The window (`window` passages) starts at the bottom of the top_n and moves up by `step`, each
ordering the passages it holds, so the best passages bubble to the top in one pass. The ranking
prompt is the generator's own prompt settings (`reranker.llm.prompt`), so the same text reaches
either engine. An answer is parsed for passage numbers in the order written; one that names none
(unparsed) or leaves some out (partial) is counted, per run, and its question keeps the first-stage
order: a half-read permutation is no ranking. Each window's answer is recorded in the artifact
cache (kind `listwise_order`, keyed by the generator's id, the query and the window's texts), so a
rerun asks nothing; a timed search (`reuse=False`) asks again.
"""
from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Sequence
from typing import Any

from rag.store.cache import ArtifactCache, make_key
from rag.store.models import UsesCache, use_cache
from rag.llm.base import Generator, withheld
from rag.reranker.base import Reranker
from rag.config.schema import PositiveInt, checked
from rag.types import Chunk, Context, Hits, RagError

log = logging.getLogger(__name__)

ORDERS = "listwise_order"  # record kind: one window's answer and the order read from it
_NUMBER = re.compile(r"\d+")


def read_order(answer: str, n: int) -> tuple[list[int], str]:
    """(0-based order, status) from an answer naming passages 1..n: `ok` when it names every one,
    `partial` when only some (the order returned then holds just those), `unparsed` when none.
    Numbers out of range and repeats are skipped, as RankGPT does."""
    seen: list[int] = []
    for m in _NUMBER.finditer(answer or ""):
        i = int(m.group()) - 1
        if 0 <= i < n and i not in seen:
            seen.append(i)
    if not seen:
        return [], "unparsed"
    return seen, "ok" if len(seen) == n else "partial"


class ListwiseReranker(UsesCache, Reranker):
    @checked("reranker")
    def __init__(self, llm: Generator, top_n: PositiveInt = 20, window: PositiveInt = 10, step: PositiveInt = 5,
                 passage_chars: PositiveInt = 600):
        if step > window:
            raise RagError(f"reranker.step ({step}) must not exceed reranker.window ({window}): passages would be skipped")
        if not isinstance(llm, Generator):
            raise RagError("reranker.llm must be a generator config (an llm/ option, e.g. smollm2 or openai)")
        self.llm = llm
        self.endpoint = llm.endpoint  # served through its generator
        self.top_n, self.window, self.step, self.passage_chars = top_n, window, step, passage_chars
        self.usage: dict[str, Any] = {"requests": 0, "windows_from_cache": 0, "questions": 0, "unparsed_questions": 0,
                                      "partial_questions": 0, "prompt_tokens": 0, "completion_tokens": 0}

    def use_cache(self, cache: ArtifactCache) -> None:
        super().use_cache(cache)
        use_cache(self.llm, cache)  # the generator's own model artifacts (the GGUF conversion)

    def warm_up(self) -> None:
        self.llm.warm_up()

    def passage(self, chunk: Chunk) -> Context:
        text = " ".join(chunk.text.split())
        return Context(text[: self.passage_chars])

    def _key(self, query: str, passages: list[Context]) -> str:
        h = hashlib.sha256()
        for p in passages:
            h.update(p.text.encode("utf-8", "surrogatepass") + b"\0")
        return make_key(ORDERS, {"llm": self.llm.id}, {"query": query, "passages": h.hexdigest()})

    def window_spans(self, n: int) -> list[tuple[int, int]]:
        """(start, end) of each window over n candidates, bottom to top, `step` apart: the same
        for any answers (an answer changes what a window holds, not where it lies)."""
        spans, end = [], n
        while end > 0:
            start = max(0, end - self.window)
            spans.append((start, end))
            if start == 0:
                break
            end -= self.step
        return spans

    def recorded_answer(self, query: str, passages: list[Context]) -> str | None:
        """The answer recorded for this window, or None (also rag.run.plan's: is a request due?)."""
        rec = self.cache.get_record(ORDERS, self._key(query, passages))
        return None if rec is None else rec["answer"]

    def _ask(self, query: str, passages: list[Context], reuse: bool) -> tuple[list[int], str]:
        key = self._key(query, passages)
        if reuse:
            recorded = self.recorded_answer(query, passages)
            if recorded is not None:
                self.usage["windows_from_cache"] += 1
                return read_order(recorded, len(passages))
        answer = (self.llm.generate([query], [passages]) or [""])[0] or ""
        self.usage["requests"] += 1
        self._count_tokens()
        if reuse and withheld(self.llm) is None:  # a reply that held no answer is asked again by the next run
            try:
                self.cache.put_record(ORDERS, key, {"answer": answer})
            except OSError as e:
                log.warning("reranker: window answers are not recorded in the cache (%s)", e)
        return read_order(answer, len(passages))

    def _count_tokens(self) -> None:
        details = self.llm.last_details  # llm=openai: the server's usage per request
        if details:
            for d in details:
                u = (d or {}).get("usage") or {}
                self.usage["prompt_tokens"] += int(u.get("prompt_tokens") or 0)
                self.usage["completion_tokens"] += int(u.get("completion_tokens") or 0)
            return
        stats = self.llm.stats  # the in-process generator's counts
        if stats is not None:
            self.usage["prompt_tokens"] += int(stats.get("prefill_tokens", 0))
            self.usage["completion_tokens"] += int(stats.get("new_tokens", 0))

    def order(self, query: str, candidates: list[int], chunks: Sequence[Chunk], reuse: bool) -> tuple[list[int], str]:
        """The candidates (chunk rows, first-stage order) reordered by sliding windows, bottom to
        top; the first-stage order with the status of the first window that failed to parse."""
        ranked = list(candidates)
        for start, end in self.window_spans(len(ranked)):
            rows = ranked[start:end]
            got, status = self._ask(query, [self.passage(chunks[r]) for r in rows], reuse)
            if status != "ok":
                return list(candidates), status
            ranked[start:end] = [rows[i] for i in got]
        return ranked, "ok"

    def rerank(self, queries: list[str], hits: Hits, chunks: Sequence[Chunk], k: int, reuse: bool = True) -> Hits:
        if len(queries) != hits.n_queries:
            raise RagError(f"reranker: {len(queries)} queries but {hits.n_queries} rows of candidates")
        rows: list[list[tuple[int, float]]] = []
        for q in range(hits.n_queries):
            valid = [int(i) for i in hits.ids[q] if i >= 0]
            head, tail = valid[: self.top_n], valid[self.top_n :]
            ranked, status = self.order(queries[q], head, chunks, reuse)
            if reuse:
                self.usage["questions"] += 1
                if status != "ok":
                    self.usage[f"{status}_questions"] += 1
            ordered = ranked + tail
            rows.append([(r, float(len(ordered) - j)) for j, r in enumerate(ordered[: int(k)])])
        return Hits.from_rows(rows, int(k))
