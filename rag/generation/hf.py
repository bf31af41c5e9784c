"""Answers from a chat LLM run with transformers (`llm=smollm2`, `llm=hf`, `llm=qwen2_5_1_5b_4bit`).

Prompts are batched with left padding; batches are formed from prompts of similar length, so
little compute goes to padding, and the answers are returned in question order.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from tqdm.auto import tqdm

from rag.generation.base import Generator
from rag.generation.llm import check_device, load_causal_lm
from rag.generation.prompt import PromptBuilder
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


class HFGenerator(Generator):
    def __init__(
        self,
        model: str,
        gguf_file: str | None = None,
        dtype: str = "float32",
        device: str = "cpu",
        quantization: str | None = None,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        batch_size: int = 4,
        num_threads: int | None = None,
        prompt: dict[str, Any] | None = None,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        cache_dir: str | None = None,
        seed: int = 0,
    ):
        self.model_name = model
        self.gguf_file = gguf_file
        self.dtype = dtype
        self.device = device
        self.quantization = None if quantization in (None, "none") else quantization
        self.max_new_tokens = int(max_new_tokens)
        self.temperature = float(temperature)
        self.batch_size = int(batch_size)
        self.num_threads = num_threads
        self.prompt = PromptBuilder(**dict(prompt or {}))
        self.system_prompt = system_prompt or None
        self.cache_dir = None if cache_dir is None else str(cache_dir)
        self.seed = int(seed)
        if self.max_new_tokens <= 0:
            raise RagError(f"llm.max_new_tokens must be positive, got {max_new_tokens}")
        if self.batch_size <= 0:
            raise RagError(f"llm.batch_size must be positive, got {batch_size}")
        if self.temperature < 0:
            raise RagError(f"llm.temperature must be >= 0, got {temperature}")
        check_device(self.device, self.quantization)  # a 4-bit config on a CPU machine fails here, at start-up
        self._lm: tuple[Any, Any] | None = None
        self.stats: dict[str, float] = {}  # of the last generate(): new_tokens, seconds, tokens_per_s

    @property
    def id(self) -> dict[str, Any]:
        return {
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

    @property
    def no_answer(self) -> str:
        return self.prompt.no_answer

    def _set_threads(self) -> None:
        if self.num_threads:
            import torch

            torch.set_num_threads(int(self.num_threads))

    def warm_up(self) -> None:
        self._set_threads()
        if self._lm is None:
            self._lm = load_causal_lm(
                self.model_name, self.gguf_file, self.dtype, self.device, self.quantization, self.cache_dir
            )

    def prompts(self, questions: list[str], contexts: list[list[Context]]) -> list[str]:
        """The full prompt texts (chat template applied), e.g. for inspecting what the model saw."""
        self.warm_up()
        tok = self._lm[0]
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
        import torch

        texts = self.prompts(questions, contexts)
        tok, lm = self._lm
        encoded = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        limit = getattr(lm.config, "max_position_embeddings", None)
        if limit and max(map(len, encoded)) + self.max_new_tokens > limit:
            log.warning("llm: a prompt of %d tokens + %d new tokens exceeds the model's %d positions",
                        max(map(len, encoded)), self.max_new_tokens, limit)

        sampling = self.temperature > 0
        gen_kwargs: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "do_sample": sampling,
            "pad_token_id": tok.pad_token_id,
        }
        if sampling:
            gen_kwargs["temperature"] = self.temperature
            torch.manual_seed(self.seed)
        else:  # a model's own sampling defaults would only trigger "ignored flag" warnings
            gen_kwargs.update(temperature=None, top_p=None, top_k=None)

        answers: list[str] = [""] * len(texts)
        new_tokens = 0
        t0 = time.perf_counter()
        device = lm.device
        for batch in tqdm(length_batches([len(e) for e in encoded], self.batch_size), desc="generate",
                          unit="batch", mininterval=2.0, leave=False):
            inputs = tok.pad({"input_ids": [encoded[i] for i in batch]}, padding=True, return_tensors="pt")
            inputs = {k: v.to(device) for k, v in inputs.items()}
            with torch.inference_mode():
                out = lm.generate(**inputs, **gen_kwargs)
            new = out[:, inputs["input_ids"].shape[1]:]
            for i, row in zip(batch, new):
                ids = [t for t in row.tolist() if t != tok.pad_token_id]
                new_tokens += len(ids)
                answers[i] = tok.decode(ids, skip_special_tokens=True).strip()
        seconds = time.perf_counter() - t0
        self.stats = {"new_tokens": new_tokens, "seconds": round(seconds, 3),
                      "tokens_per_s": round(new_tokens / seconds, 2) if seconds > 0 else 0.0}
        empty = sum(1 for a in answers if not a)
        if empty:
            log.warning("llm: %d of %d answers are empty", empty, len(answers))
        return answers
