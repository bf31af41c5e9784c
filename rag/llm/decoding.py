"""The decoding loop of `HFGenerator` (`llm.runtime=loop`), and the rules that end an answer.

The loop runs the model's own forward pass, as `transformers.generate` does, with a DynamicCache:
one prefill of a left-padded batch, then one token per step. Two things differ from `generate`:

- **Finished rows leave the batch.** `generate` keeps computing a finished row (feeding it pad
  tokens) until the longest answer of its batch ends; here its KV cache rows are dropped, so a
  batch costs what its live answers cost. That is what makes large batches pay: with 16-32
  prompts a batch, a few long answers no longer hold every other row.
- **Answers end by rule** (`DecodingRules`): at the end-of-turn token, at a stop string, or when
  the answer starts repeating itself (the last `repeat_stop_ngram` tokens already occurred in it:
  the answer is cut where the repeat began). Optionally, `no_repeat_ngram_size` forbids any token
  that would complete an n-gram already in the answer (the answer only: a RAG answer should be
  free to copy spans of its passages, which transformers' NoRepeatNGram over the whole sequence
  would forbid).

Stop rules only cut: every answer is a prefix of what the model would have said without them, so
they change no greedy decision. The n-gram ban does change decisions, and is off by default.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rag.types import RagError


@dataclass(frozen=True)
class DecodingRules:
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    repeat_stop_ngram: int = 0  # 0 = off
    no_repeat_ngram_size: int = 0  # 0 = off

    def __post_init__(self) -> None:
        if self.max_new_tokens <= 0:
            raise RagError(f"llm.max_new_tokens must be positive, got {self.max_new_tokens}")
        for name in ("repeat_stop_ngram", "no_repeat_ngram_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0 or v == 1:
                raise RagError(f"llm.{name} must be 0 (off) or an n-gram size >= 2, got {v!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise RagError(f"llm.stop must be a list of non-empty strings, got {list(self.stop)!r}")

    @property
    def id(self) -> dict[str, Any]:
        return {"max_new_tokens": self.max_new_tokens, "stop": list(self.stop),
                "repeat_stop_ngram": self.repeat_stop_ngram, "no_repeat_ngram_size": self.no_repeat_ngram_size}

    @property
    def legacy(self) -> bool:
        """No rule beyond the length cap: the decoding of the generator before stop rules."""
        return not (self.stop or self.repeat_stop_ngram or self.no_repeat_ngram_size)


@dataclass
class Answer:
    """One row's tokens as they are generated, with the bookkeeping the rules need."""

    tokens: list[int] = field(default_factory=list)
    cut: int | None = None  # tokens kept when a repeat rule ended the answer
    done: bool = False
    _grams: dict[int, set[tuple[int, ...]]] = field(default_factory=dict)
    _follow: dict[tuple[int, ...], set[int]] = field(default_factory=dict)

    def push(self, token: int, rules: DecodingRules) -> None:
        self.tokens.append(token)
        n = rules.repeat_stop_ngram
        if n and len(self.tokens) >= n:
            seen = self._grams.setdefault(n, set())
            gram = tuple(self.tokens[-n:])
            if gram in seen:
                self.cut, self.done = len(self.tokens) - n, True
            seen.add(gram)
        m = rules.no_repeat_ngram_size
        if m and len(self.tokens) >= m:
            self._follow.setdefault(tuple(self.tokens[-m:-1]), set()).add(self.tokens[-1])

    def banned(self, rules: DecodingRules) -> set[int]:
        m = rules.no_repeat_ngram_size
        if not m or len(self.tokens) < m - 1:
            return set()
        return self._follow.get(tuple(self.tokens[len(self.tokens) - m + 1:]), set())

    def kept(self) -> list[int]:
        return self.tokens if self.cut is None else self.tokens[: self.cut]


def rules_cut(tokens: Iterable[int], rules: DecodingRules, stop_ids: set[int]) -> Answer:
    """What the rules keep of tokens generated without them (a runtime that cannot stop a row as it
    goes): everything before the first stop token, ended where a repeat rule ends the answer."""
    a = Answer()
    for t in tokens:
        if t in stop_ids:
            break
        a.push(t, rules)
        if a.done:
            break
    return a


def finish_text(text: str, rules: DecodingRules) -> str:
    """The answer text up to the first stop string."""
    for s in rules.stop:
        i = text.find(s)
        if i >= 0:
            text = text[:i]
    return text.strip()


def hits_stop(tok: Any, answer: Answer, rules: DecodingRules) -> bool:
    """Whether the decoded tail of the answer contains a stop string. Only the last few tokens
    are decoded: a stop string that ends at this token starts within them."""
    if not rules.stop:
        return False
    longest = max(len(s) for s in rules.stop)
    tail = tok.decode(answer.tokens[-(longest + 2):], skip_special_tokens=True)
    return any(s in tail for s in rules.stop)


def cache_argument(lm: Any) -> str:
    """The name a model's forward takes its KV cache by: `cache` from transformers 5 on, which
    warns (FutureWarning, in the middle of a run's output) for the older `past_key_values` that
    transformers 4 takes."""
    import inspect

    try:
        params = inspect.signature(lm.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def greedy_batch(lm: Any, tok: Any, rows: list[list[int]], rules: DecodingRules, eos: set[int],
                 temperature: float = 0.0, generator: Any = None) -> tuple[list[Answer], dict[str, int]]:
    """Decodes one batch of token-id prompts; returns one Answer per row and step counts."""
    import torch
    from transformers import DynamicCache

    device = lm.device
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), int(tok.pad_token_id), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, width - len(row):] = torch.tensor(row, dtype=torch.long)
        mask[r, width - len(row):] = 1
    # As transformers' generate: positions count real tokens only; an all-ones mask is dropped.
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    cache = DynamicCache(config=lm.config)
    answers = [Answer() for _ in rows]
    live = list(range(len(rows)))
    stats = {"prefill_tokens": int(mask.sum()), "padded_prefill_tokens": ids.numel(), "decode_row_steps": 0, "decode_steps": 0}

    kv = {cache_argument(lm): cache}

    def forward(x: Any, m: Any, p: Any) -> Any:
        attn = None if bool(m.all()) else m.to(device)
        out = lm(input_ids=x.to(device), attention_mask=attn, position_ids=p.to(device), **kv,
                 use_cache=True, logits_to_keep=1)
        return out.logits[:, -1].to(dtype=torch.float32, device="cpu")

    logits = forward(ids, mask, positions)
    next_pos = positions[:, -1:] + 1
    for step in range(rules.max_new_tokens):
        for j, i in enumerate(live):
            banned = answers[i].banned(rules)
            if banned:
                logits[j, list(banned)] = float("-inf")
        if temperature > 0:
            probs = torch.softmax(logits / temperature, dim=-1)
            chosen = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        else:
            chosen = logits.argmax(-1)
        keep = []
        for j, i in enumerate(live):
            t = int(chosen[j])
            a = answers[i]
            if t in eos:
                a.done = True
                continue
            a.push(t, rules)
            if not a.done and hits_stop(tok, a, rules):
                a.done = True
            if not a.done:
                keep.append(j)
        if not keep or step == rules.max_new_tokens - 1:
            break
        if len(keep) < len(live):
            sel = torch.tensor(keep, dtype=torch.long)
            cache.batch_select_indices(sel.to(device))
            mask, chosen, next_pos = mask[sel], chosen[sel], next_pos[sel]
            live = [live[j] for j in keep]
        mask = torch.cat([mask, torch.ones((len(live), 1), dtype=torch.long)], dim=1)
        stats["decode_row_steps"] += len(live)
        stats["decode_steps"] += 1
        logits = forward(chosen[:, None], mask, next_pos)
        next_pos = next_pos + 1
    return answers, stats
