"""LLM relevance labels (`eval.relevance=llm`): a judge LLM grades each (question, retrieved chunk)
pair 0-3 with a UMBRELA-style prompt (Upadhyay et al., 2024; the prompt is in
conf/eval/default.yaml, `relevance_judge.llm.prompt`), for a question set that has no labels.

- Each pair is asked once: the grade is recorded in the artifact cache under the judge's id (its
  model, decoding and prompt), the question and the chunk's text (record kind `relevance_grade`),
  so the runs of a sweep that retrieve the same chunk share its grade, and a rerun asks nothing.
- A reply without a grade is *unjudged*: counted, and treated as not judged (never as 0 or 3).
- The labels a run is scored with are documents, as human labels are: a document's grade is the
  highest grade any of its judged chunks got, kept when it reaches `relevant_from` (default 2: a
  chunk that is only "related" does not make its document relevant, TREC DL's binary cut). The
  ideal ranking of nDCG is then the same for every chunking of the corpus.
- Pooling (`pool_runs`): at the end of a sweep every run is scored again against the labels of
  all runs' judged pairs together, the way TREC pools the runs of its participants, so that no
  run is measured against only what it found itself.
"""
from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rag.store.cache import ArtifactCache, make_key
from rag.llm.base import Generator, generate_each
from rag.config.schema import checked
from rag.types import Chunk, Context, RagError, Relevance

log = logging.getLogger(__name__)

RECORD = "relevance_grade"
GRADES = (0, 1, 2, 3)
SOURCE = "llm"
# A number as a reply writes it, read whole so that no part of it passes for a grade: a sign, a
# fraction, an exponent, a ratio and letters glued to it ("-1", "2.5", "1e3", "1/3", "2nd") belong
# to it. It starts where no word, sign, point or slash stands before it ("score-1" holds none).
_NUMBER = r"(?<![\w.+\-/\u2212])([-+\u2212]?\d+(?:[.,]\d+)?(?:[eE][-+]?\d+)?(?:/[-+]?\d+(?:\.\d+)?)?[\w%]*)"
_FINAL = re.compile(r"final\s*score\W*?" + _NUMBER, re.I)
_FIRST = re.compile(_NUMBER)


def parse_grade(reply: str | None) -> int | None:
    """The grade of a reply: the number after "final score", else the reply's first number, when it
    is a whole number 0-3 ("2", "Grade: 2", "2." at a sentence's end); None otherwise ("-1", "2.5",
    "1e3", "1/3", "10" or no number: the pair stays unjudged, never graded by a piece of a number)."""
    text = reply or ""
    m = _FINAL.search(text) or _FIRST.search(text)
    if m is None or m.group(1) not in ("0", "1", "2", "3"):
        return None
    return int(m.group(1))


@dataclass
class Grades:
    """Per question, the grade of each retrieved chunk in rank order (None: unjudged), and what
    asking for them took."""

    per_question: list[list[int | None]]
    pairs: int = 0  # distinct (question, chunk text) pairs
    asked: int = 0  # of those, sent to the judge in this run (the others were recorded)
    unjudged: int = 0  # pairs whose reply held no grade


class RelevanceJudge:
    """Grades (question, chunk) pairs 0-3 with any generator (`llm`: the in-process SmolLM2 by
    default, or a served model: `llm@eval.relevance_judge.llm=openai`)."""

    @checked("eval.relevance_judge")
    def __init__(self, llm: Generator, relevant_from: int = 2) -> None:
        if not isinstance(llm, Generator):
            raise RagError("eval.relevance_judge.llm must be a generator config (an llm/ option, e.g. smollm2 or openai)")
        if relevant_from not in (1, 2, 3):
            raise RagError(f"eval.relevance_judge.relevant_from must be 1, 2 or 3, got {relevant_from}")
        self.llm, self.relevant_from = llm, relevant_from
        self.endpoint = llm.endpoint

    def use_cache(self, cache: ArtifactCache) -> None:
        from rag.store.models import use_cache

        use_cache(self.llm, cache)

    @property
    def id(self) -> dict[str, Any]:
        return {"llm": self.llm.id}

    def describe(self) -> dict[str, Any]:
        """What metrics.json's provenance says about the judge: its model and its prompt's digest."""
        lid = self.llm.id
        prompt = hashlib.sha256(repr((lid.get("system_prompt"), lid.get("prompt"))).encode()).hexdigest()[:16]
        return {"judge": str(lid.get("model") or lid.get("name") or type(self.llm).__name__), "prompt": prompt,
                "relevant_from": self.relevant_from}

    def key(self, question: str, passage: str) -> str:
        text = hashlib.sha256(" ".join(passage.split()).encode("utf-8", "surrogatepass")).hexdigest()
        return make_key(RECORD, self.id, {"question": question, "passage": text})

    def grade(self, questions: Sequence[str], ranked: Sequence[Sequence[Chunk]], cache: ArtifactCache) -> Grades:
        """The grade of every (question, chunk) pair, asking only for pairs not recorded yet."""
        keys = [[self.key(q, c.text) for c in chunks] for q, chunks in zip(questions, ranked)]
        todo: dict[str, tuple[str, str]] = {}
        replies: dict[str, str] = {}
        for q, chunks, ks in zip(questions, ranked, keys):
            for c, k in zip(chunks, ks):
                if k in replies or k in todo:
                    continue
                rec = cache.get_record(RECORD, k)
                if rec is None:
                    todo[k] = (q, c.text)
                else:
                    replies[k] = str(rec["reply"])
        pairs = len(replies) + len(todo)
        if todo:
            log.info("relevance: asking the judge about %d of %d (question, chunk) pairs", len(todo), pairs)
            asked = list(todo)

            def record(i: int, reply: str) -> None:
                replies[asked[i]] = reply
                cache.put_record(RECORD, asked[i], {"reply": reply})

            generate_each(self.llm, [(q, [Context(p)]) for q, p in todo.values()], record)
        grades = {k: parse_grade(replies.get(k)) for k in (*replies, *todo)}  # a withheld reply: unjudged
        return Grades(per_question=[[grades[k] for k in ks] for ks in keys], pairs=pairs, asked=len(todo),
                      unjudged=sum(g is None for g in grades.values()))


def document_labels(judged: Iterable[tuple[str, int | None]], relevant_from: int) -> tuple[Relevance, ...]:
    """Each judged document with its highest grade over its judged chunks; a grade below
    `relevant_from` is kept as 0 (judged, not relevant), as TREC qrels keep judged non-relevant
    documents. Empty when nothing was judged: the question is then unlabelled."""
    best: dict[str, int] = {}
    for doc, grade in judged:
        if grade is not None:
            best[doc] = max(best.get(doc, 0), grade)
    return tuple(Relevance(doc, g if g >= relevant_from else 0) for doc, g in sorted(best.items()))


def question_labels(ranked: Sequence[Sequence[Chunk]], grades: Sequence[Sequence[int | None]],
                    relevant_from: int) -> list[tuple[Relevance, ...]]:
    """Each question's labels from its own judged chunks (one run's pool)."""
    return [document_labels(((c.doc_id, g) for c, g in zip(chunks, gs)), relevant_from)
            for chunks, gs in zip(ranked, grades)]
