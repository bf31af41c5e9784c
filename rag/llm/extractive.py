"""`llm=extractive`: answers made of context sentences, no LLM.

The answer is the `max_sentences` context sentences most similar to the question (by the
embedder's cosine similarity), kept in the order they appear in the contexts. It is fast and
cannot hallucinate, so it is the floor an LLM generator has to beat on answer metrics.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rag.store.cache import ArtifactCache
from rag.chunker import sentence_spans
from rag.embedder.base import Embedder
from rag.llm.base import Generator
from rag.llm.prompt import NO_ANSWER, as_context
from rag.store.models import use_cache
from rag.config.schema import PositiveInt, Similarity, checked
from rag.types import Context


def context_sentences(contexts: Sequence[Context | str]) -> list[str]:
    """Sentences of all contexts in reading order. Overlapping chunks repeat sentences; a repeat
    is kept once (at its first position) so that it cannot fill the answer twice."""
    seen: set[str] = set()
    out: list[str] = []
    for c in map(as_context, contexts):
        for start, end in sentence_spans(c.text):
            s = " ".join(c.text[start:end].split())
            if s and s not in seen:
                seen.add(s)
                out.append(s)
    return out


class ExtractiveGenerator(Generator):
    @checked("llm")
    def __init__(self, embedder: Embedder, max_sentences: PositiveInt = 2, min_similarity: Similarity = 0.0,
                 no_answer: str = NO_ANSWER):
        self.embedder = embedder
        self.max_sentences = int(max_sentences)
        self.min_similarity = float(min_similarity)
        self.no_answer = no_answer

    def use_cache(self, cache: ArtifactCache) -> None:
        use_cache(self.embedder, cache)  # the embedder's ONNX export

    @property
    def id(self) -> dict[str, Any]:
        return {
            "class": type(self).__name__,
            "embedder": self.embedder.id,
            "max_sentences": self.max_sentences,
            "min_similarity": self.min_similarity,
            "no_answer": self.no_answer,
        }

    def warm_up(self) -> None:
        self.embedder.warm_up()

    def _encode_questions(self, questions: list[str]) -> np.ndarray:
        # encode_queries adds the embedder's query prefix (bge); sentences are passages
        return self.embedder.encode_queries(questions)

    def generate(self, questions: list[str], contexts: list[list[Context]]) -> list[str]:
        if len(questions) != len(contexts):
            raise ValueError(f"generate: {len(questions)} questions but {len(contexts)} context lists")
        if not questions:
            return []
        per_question = [context_sentences(c) for c in contexts]
        # one encode call for every sentence of every question: batching is what makes it fast
        flat = [s for sents in per_question for s in sents]
        sent_vecs = self.embedder.encode(flat, show_progress=False) if flat else None
        q_vecs = self._encode_questions(list(questions))
        answers: list[str] = []
        offset = 0
        for q, sents in enumerate(per_question):
            if not sents or sent_vecs is None:  # sent_vecs is None only when no question has sentences
                answers.append(self.no_answer)
                continue
            sims = sent_vecs[offset : offset + len(sents)] @ q_vecs[q]
            offset += len(sents)
            best = np.argsort(-sims, kind="stable")[: self.max_sentences]
            keep = sorted(int(i) for i in best if sims[i] >= self.min_similarity)
            answers.append(" ".join(sents[i] for i in keep) if keep else self.no_answer)
        return answers
