"""`reranker=llm`: pointwise relevance from a chat LLM.

Each (query, passage) pair is asked "does this passage answer the query? Yes or No", and scored by
logit(Yes) - logit(No) at the position where the answer would begin. One forward pass per pair,
no generation. With SmolLM2-135M the margins are small, so compare against
`reranker=none` before trusting it.
"""
from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from rag.llm.hf import length_batches, render_chat
from rag.llm.loading import CausalLM
from rag.reranker.base import Reranker
from rag.config.schema import Device, PositiveInt, Text, checked
from rag.types import Chunk, Hits, RagError

log = logging.getLogger(__name__)

# Passage first, query and question last. On 20 PubMedQA questions x 8 candidates with
# SmolLM2-135M this layout gave MRR 0.42 (random order: 0.34); query-first layouts, with or
# without a "relevance judge" system prompt, gave 0.26-0.31.
DEFAULT_PROMPT = "Passage: {passage}\n\nQuery: {query}\n\nIs this passage relevant to the query? Answer Yes or No."

_FIELD = re.compile(r"\{(query|passage)\}")


def first_token_id(tokenizer: Any, word: str) -> int:
    ids = tokenizer.encode(word, add_special_tokens=False)
    if not ids:
        raise RagError(f"reranker: the tokenizer encodes {word!r} as no tokens")
    return int(ids[0])


class LLMReranker(CausalLM, Reranker):
    """The model's load settings (gguf_file, dtype, device, quantization, num_threads) are the
    generator's (rag.llm.loading.CausalLM); `use_cache` gives the artifact cache of a GGUF model's
    conversion."""

    @checked("reranker")
    def __init__(
        self,
        model: str,
        top_n: PositiveInt = 20,
        batch_size: PositiveInt = 8,
        prompt_template: Text = DEFAULT_PROMPT,  # checked below: it must hold {query} and {passage}
        system_prompt: Text | None = None,  # "" as null: no system message
        gguf_file: Text | None = None,  # "" as null: the model's plain weights
        dtype: str = "float32",
        device: Device = "cpu",
        quantization: str | None = None,
        num_threads: PositiveInt | None = None,
    ):
        for field in ("{query}", "{passage}"):
            if field not in prompt_template:
                raise RagError(f"reranker.prompt_template must contain {field}")
        self.top_n = int(top_n)
        self.batch_size = int(batch_size)
        self.prompt_template = prompt_template
        self.system_prompt = system_prompt or None
        CausalLM.__init__(self, model, gguf_file, dtype, device, quantization, num_threads)

    def warm_up(self) -> None:
        self.set_threads()
        self.load()

    def fill(self, query: str, passage: str) -> str:
        # one pass, so a "{passage}" inside a query stays literal text
        values = {"query": query, "passage": passage}
        return _FIELD.sub(lambda m: values[m.group(1)], self.prompt_template)

    def score_pairs(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        """logit(Yes) - logit(No) per (query, passage) pair, float32."""
        import torch

        self.warm_up()
        tok, lm = self.load()
        yes, no = first_token_id(tok, "Yes"), first_token_id(tok, "No")
        if yes == no:
            raise RagError("reranker: 'Yes' and 'No' start with the same token for this tokenizer")
        texts = [render_chat(tok, self.system_prompt, self.fill(q, p)) for q, p in pairs]
        encoded = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        scores = np.zeros(len(pairs), np.float32)
        t0 = time.perf_counter()
        device = getattr(lm, "device", "cpu")
        for batch in tqdm(length_batches([len(e) for e in encoded], self.batch_size), desc="rerank",
                          unit="batch", mininterval=2.0, leave=False):
            inputs = tok.pad({"input_ids": [encoded[i] for i in batch]}, padding=True, return_tensors="pt")
            inputs = {k: v.to(device) for k, v in inputs.items()}
            with torch.inference_mode():
                # left padding puts every prompt's last token at -1; only that position's logits
                # are needed, and computing all of them costs seq_len x vocab floats per pair
                try:
                    logits = lm(**inputs, logits_to_keep=1).logits[:, -1, :].float()
                except TypeError:  # an architecture without logits_to_keep
                    logits = lm(**inputs).logits[:, -1, :].float()
            scores[batch] = (logits[:, yes] - logits[:, no]).cpu().numpy()
        log.info("rerank: scored %d pairs in %.1f s", len(pairs), time.perf_counter() - t0)
        return scores

    def rerank(self, queries: list[str], hits: Hits, chunks: Sequence[Chunk], k: int, reuse: bool = True) -> Hits:
        # (query row, original rank, chunk row) of every candidate to score, for one batched pass
        cands: list[tuple[int, int, int]] = []
        for q in range(hits.n_queries):
            valid = [int(i) for i in hits.ids[q] if i >= 0]
            cands += [(q, rank, row) for rank, row in enumerate(valid[: self.top_n])]
        scores: np.ndarray | list[float] = (
            self.score_pairs([(queries[q], chunks[row].text) for q, _, row in cands]) if cands else [])
        by_query: list[list[tuple[float, int, int]]] = [[] for _ in range(hits.n_queries)]
        for (q, rank, row), s in zip(cands, scores):
            by_query[q].append((float(s), rank, row))
        rows: list[list[tuple[int, float]]] = []
        for q, scored in enumerate(by_query):
            scored.sort(key=lambda t: (-t[0], t[1]))  # ties keep the retrieval order
            ranked = [(r, s) for s, _, r in scored]
            # candidates past top_n (only when k > top_n) follow in retrieval order, scored below
            # every reranked one so that the row stays sorted by descending score
            rest = [int(i) for i in hits.ids[q] if i >= 0][self.top_n :]
            floor = min((s for _, s in ranked), default=0.0)
            ranked += [(r, floor - 1.0 - j) for j, r in enumerate(rest)]
            rows.append(ranked)
        return Hits.from_rows(rows, k)
