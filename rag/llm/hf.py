"""Answers from a chat LLM run with transformers (`llm=smollm2`, `llm=hf`, `llm=qwen2_5_1_5b_4bit`).

Prompts are batched with left padding; batches are formed from prompts of similar length, so
little compute goes to padding, and the answers are returned in question order.

Two runtimes decode them: `loop` (default; rag/llm/decoding.py: finished answers leave the
batch, answers end at stop strings or when they start repeating) and `generate` (transformers'
own `generate`, the runtime before the loop; stop rules are applied to its output afterwards, so
both give the same answers, and it stays as the reference the benchmark compares against).
"""
from __future__ import annotations

import logging
import time
from typing import Any

from tqdm.auto import tqdm

from rag.llm.base import Generator
from rag.llm.decoding import DecodingRules, finish_text, greedy_batch, rules_cut
from rag.llm.loading import CausalLM, probe_threads  # noqa: F401  (probe_threads: its old home)
from rag.llm.prompt import PromptBuilder
from rag.config.schema import Device, NonNegative, PositiveInt, Text, Threads, checked
from rag.types import Context, RagError

log = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = "You are a careful assistant that answers questions from the given context passages only."


def render_chat(tokenizer: Any, system_prompt: str | None, user: str) -> str:
    """The prompt text ending where the assistant's reply begins. Models without a chat template
    (base models) get a plain-text layout instead of failing."""
    messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
        {"role": "user", "content": user}
    ]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    head = f"{system_prompt}\n\n" if system_prompt else ""
    return f"{head}{user}\n\nAnswer:"


def length_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar length (longest first, so that running out of
    memory shows up in the first batch rather than the last)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


RUNTIMES = ("loop", "generate")


class HFGenerator(CausalLM, Generator):
    """Answers from a chat LLM loaded with transformers (the load settings and the model: CausalLM;
    `use_cache` gives the artifact cache of a GGUF model's conversion)."""

    @checked("llm")
    def __init__(
        self,
        model: str,
        gguf_file: Text | None = None,  # "" as null: the model's plain weights
        dtype: str = "float32",
        device: Device = "cpu",
        quantization: str | None = None,
        max_new_tokens: PositiveInt = 64,
        temperature: NonNegative = 0.0,
        batch_size: PositiveInt = 16,
        num_threads: Threads = None,
        prompt: dict[str, Any] | None = None,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        seed: int = 0,
        stop: list[str] | tuple[str, ...] | None = None,
        repeat_stop_ngram: int = 0,
        no_repeat_ngram_size: int = 0,
        runtime: str = "loop",
    ):
        self.rules = DecodingRules(int(max_new_tokens), tuple(stop or ()), int(repeat_stop_ngram),
                                   int(no_repeat_ngram_size))
        self.max_new_tokens = self.rules.max_new_tokens
        self.temperature = float(temperature)
        self.batch_size = int(batch_size)
        self.runtime = runtime
        self.prompt = PromptBuilder(**dict(prompt or {}))
        self.system_prompt = system_prompt or None
        self.seed = int(seed)
        if runtime not in RUNTIMES:
            raise RagError(f"llm.runtime must be one of {list(RUNTIMES)}, got {runtime!r}")
        if runtime == "generate" and self.rules.no_repeat_ngram_size:
            raise RagError("llm.no_repeat_ngram_size needs llm.runtime=loop (it changes decisions while decoding)")
        CausalLM.__init__(self, model, gguf_file, dtype, device, quantization, num_threads)
        # of the last generate(): new_tokens, seconds, tokens_per_s, prefill/decode work
        self.stats: dict[str, float] = {}
        self.last_latencies_ms: list[float] | None = None  # each question's share of its batch

    @property
    def id(self) -> dict[str, Any]:
        # Every decoding setting is here (the answers' cache key). Runtime, batch size and threads
        # are not: they change speed, and answers only as far as float rounding goes.
        ident = {
            "class": type(self).__name__,
            "model": self.model_name,
            "gguf_file": self.gguf_file,
            "dtype": self.dtype,
            "quantization": self.quantization,
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            # greedy answers do not depend on the seed; keep it out so it cannot split a cache
            **({"seed": self.seed} if self.temperature > 0 else {}),
            "prompt": self.prompt.id,
            "system_prompt": self.system_prompt,
        }
        if not self.rules.legacy:  # the old decoding keeps its old key, so its cached answers stay valid
            ident["decoding"] = self.rules.id
        return ident

    @property
    def no_answer(self) -> str:
        return self.prompt.no_answer

    def warm_up(self) -> None:
        self.set_threads()
        self.load()

    def prompts(self, questions: list[str], contexts: list[list[Context]]) -> list[str]:
        """The full prompt texts (chat template applied), e.g. for inspecting what the model saw."""
        self.warm_up()
        tok = self.load()[0]
        return [render_chat(tok, self.system_prompt, self.prompt.build(q, c)) for q, c in zip(questions, contexts)]

    def generate(self, questions: list[str], contexts: list[list[Context]]) -> list[str]:
        # num_threads is process-wide in torch: restore it so later stages (the evaluation
        # embedder) keep their own setting.
        import torch

        previous = torch.get_num_threads()
        try:
            return self._generate(questions, contexts)
        finally:
            torch.set_num_threads(previous)

    def _generate(self, questions: list[str], contexts: list[list[Context]]) -> list[str]:
        if len(questions) != len(contexts):
            raise ValueError(f"generate: {len(questions)} questions but {len(contexts)} context lists")
        if not questions:
            return []
        texts = self.prompts(questions, contexts)
        tok, lm = self.load()
        encoded = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        limit = getattr(lm.config, "max_position_embeddings", None)
        if limit and max(map(len, encoded)) + self.max_new_tokens > limit:
            log.warning("llm: a prompt of %d tokens + %d new tokens exceeds the model's %d positions",
                        max(map(len, encoded)), self.max_new_tokens, limit)
        answers: list[str] = [""] * len(texts)
        latencies = [0.0] * len(texts)
        stopped = [False] * len(texts)
        totals = {"new_tokens": 0, "answer_tokens": 0, "prefill_tokens": 0, "padded_prefill_tokens": 0,
                  "decode_row_steps": 0, "decode_steps": 0}
        run_batch = self._loop_batch if self.runtime == "loop" else self._generate_batch
        t0 = time.perf_counter()
        for batch in tqdm(length_batches([len(e) for e in encoded], self.batch_size), desc="generate",
                          unit="batch", mininterval=2.0, leave=False):
            tb = time.perf_counter()
            texts_out, counts, at_limit = run_batch(tok, lm, [encoded[i] for i in batch])
            share = 1000.0 * (time.perf_counter() - tb) / len(batch)
            for i, text, cut in zip(batch, texts_out, at_limit):
                answers[i], latencies[i], stopped[i] = text, share, cut
            for k, v in counts.items():
                totals[k] += v
        seconds = time.perf_counter() - t0
        self.last_latencies_ms = latencies
        self.last_stopped = stopped
        self.stats = {**totals, "seconds": round(seconds, 3),
                      "tokens_per_s": round(totals["new_tokens"] / seconds, 2) if seconds > 0 else 0.0}
        empty = sum(1 for a in answers if not a)
        if empty:
            log.warning("llm: %d of %d answers are empty", empty, len(answers))
        return answers

    def _eos(self, tok: Any, lm: Any) -> set[int]:
        eos = getattr(lm.generation_config, "eos_token_id", None)
        eos = tok.eos_token_id if eos is None else eos
        return set(eos if isinstance(eos, (list, tuple)) else [eos])

    @property
    def token_limit(self) -> tuple[str, int]:
        return "llm.max_new_tokens", self.max_new_tokens

    def _loop_batch(self, tok: Any, lm: Any, rows: list[list[int]]) -> tuple[list[str], dict[str, int], list[bool]]:
        import torch

        rng = None
        if self.temperature > 0:
            rng = torch.Generator().manual_seed(self.seed)
        with torch.inference_mode():
            out, stats = greedy_batch(lm, tok, rows, self.rules, self._eos(tok, lm), self.temperature, rng)
        texts = [finish_text(tok.decode(a.kept(), skip_special_tokens=True), self.rules) for a in out]
        stats["new_tokens"] = sum(len(a.tokens) for a in out)
        stats["answer_tokens"] = sum(len(a.kept()) for a in out)
        return texts, stats, [not a.done for a in out]  # not ended by a stop: it ran out of new tokens

    def _generate_batch(self, tok: Any, lm: Any, rows: list[list[int]]) -> tuple[list[str], dict[str, int], list[bool]]:
        """transformers' generate (the runtime before the loop): every row runs until the batch's
        longest answer ends; stop rules cut the output afterwards."""
        import torch

        sampling = self.temperature > 0
        gen_kwargs: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "do_sample": sampling,
                                      "pad_token_id": tok.pad_token_id}
        if sampling:
            gen_kwargs["temperature"] = self.temperature
            torch.manual_seed(self.seed)
        else:  # a model's own sampling defaults would only trigger "ignored flag" warnings
            gen_kwargs.update(temperature=None, top_p=None, top_k=None)
        inputs = tok.pad({"input_ids": rows}, padding=True, return_tensors="pt")
        inputs = {k: v.to(lm.device) for k, v in inputs.items()}
        with torch.inference_mode():
            out = lm.generate(**inputs, **gen_kwargs)
        new = out[:, inputs["input_ids"].shape[1]:]
        stop_ids = self._eos(tok, lm) | {tok.pad_token_id}
        texts, n_new, n_kept, at_limit = [], 0, 0, []
        for row in new.tolist():
            a = rules_cut(row, self.rules, stop_ids)
            n_new += len([t for t in row if t != tok.pad_token_id])
            n_kept += len(a.kept())
            decoded = tok.decode(a.kept(), skip_special_tokens=True)
            texts.append(finish_text(decoded, self.rules))
            at_limit.append(not a.done and not stop_ids & set(row) and not any(x in decoded for x in self.rules.stop))
        pad = int(inputs["input_ids"].numel())
        return texts, {"new_tokens": n_new, "answer_tokens": n_kept, "prefill_tokens": int(inputs["attention_mask"].sum()),
                       "padded_prefill_tokens": pad, "decode_row_steps": int(new.shape[0] * max(new.shape[1] - 1, 0)),
                       "decode_steps": int(max(new.shape[1] - 1, 0))}, at_limit
