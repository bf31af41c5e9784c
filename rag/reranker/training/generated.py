"""Training questions written by an LLM for sampled passages (doc2query / InPars-style few-shot
prompting), kept only when the first stage finds their passage's document again (round-trip
filtering, as Promptagator does), and cached as an artifact of kind `queries`.

The few-shot examples below were written for this purpose (they are not evaluation questions).
Generation goes through the configured generator's public interface (`generate(questions,
contexts)`): many prompts per call, batched by length, greedy by default.
"""
from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rag.store.cache import ArtifactCache, make_key
from rag.corpus.slicing import content_fingerprint
from rag.reranker.training.dataset import take_in_turn
from rag.reranker.training.examples import Example
from rag.reranker.training.passages import PassagePool
from rag.reranker.training.text import is_prose
from rag.types import Document, RagError

log = logging.getLogger(__name__)

KIND = "queries"
FILE = "queries.jsonl"
VERSION = 1
OVERSAMPLE = 2.5  # passages prompted per wanted question: the round trip drops many
ROUND_TRIP_K = 20  # a question is kept when its document is among the first stage's top 20
PASSAGE_CHARS = 600

FEW_SHOT = (
    ("The rename() function changes the name of a file. If the new name already exists, it is "
     "atomically replaced, so another process never sees it missing.",
     "Does rename() replace an existing file atomically?"),
    ("Tensor.detach() returns a new tensor, detached from the current graph. The result will never "
     "require gradient and shares storage with the original.",
     "How do I get a copy of a tensor that does not track gradients?"),
    ("Patients with chronic kidney disease who received the vaccine had lower antibody titres than "
     "healthy controls six months after vaccination.",
     "Do patients with kidney disease respond as well to the vaccine?"),
)
PROMPT = "Write a question that a user might ask, which the passage answers.\n\n" + "".join(
    f"Passage: {p}\nQuestion: {q}\n\n" for p, q in FEW_SHOT
) + "Passage: {contexts}\nQuestion:{question}"


def generator_settings(config: Any) -> tuple[Any, dict[str, Any]]:
    """The question generator (`reranker.train.generator`: an llm config or the generator Hydra
    made of it), set to this module's few-shot prompt with no system prompt, and its id."""
    if config is None:
        raise RagError("reranker.train.queries.generated > 0 needs reranker.train.generator (an llm config)")
    if isinstance(config, Mapping):
        from hydra.utils import instantiate

        config = instantiate(dict(config), _convert_="all")
    if not all(hasattr(config, a) for a in ("generate", "id", "prompt", "system_prompt")):
        raise RagError(f"reranker.train.generator: expected a prompt-driven LLM generator (llm=smollm2, llm=hf), "
                       f"got {type(config).__name__}")
    from rag.llm.prompt import PromptBuilder

    config.prompt = PromptBuilder(template=PROMPT, context_format="{text}")
    config.system_prompt = None
    return config, config.id


def sample_passages(pool: PassagePool, n: int, seed: int) -> list[int]:
    """n prose passages, taken in turn from each source, in a seeded order."""
    rng = random.Random(f"generate:{seed}")
    by_source: dict[str, list[int]] = {}
    for i, p in enumerate(pool.passages):
        if len(p.text) >= 200 and is_prose(" ".join(p.text.split())[:300]):
            by_source.setdefault(p.source, []).append(i)
    return take_in_turn(by_source, n, rng)


def clean_question(text: str) -> str | None:
    line = (text.strip().splitlines() or [""])[0].strip()
    for prefix in ("Question:", "Q:"):
        if line.startswith(prefix):
            line = line[len(prefix):].strip()
    if not line.endswith("?") or not 4 <= len(line.split()) <= 30:
        return None
    if any(line == q for _, q in FEW_SHOT):  # the model copied an example
        return None
    return line


def _wanted(s: Mapping[str, Any]) -> int:
    return int(s["queries"]["generated"] * OVERSAMPLE) + 1


def generation_key(docs: Sequence[Document], s: Mapping[str, Any], generator_config: Any) -> str:
    _, gen_id = generator_settings(generator_config)
    return make_key(KIND, {"generator": gen_id, "prompt": PROMPT, "passages": _wanted(s), "seed": s["seed"],
                           "chunk": [s["chunk_size"], s["chunk_overlap"]], "round_trip_k": ROUND_TRIP_K,
                           "version": VERSION}, {"corpus": content_fingerprint(list(docs))})


def _generate(docs: Sequence[Document], s: Mapping[str, Any], generator: Any, tmp: Path,
              say: Callable[[str], None]) -> dict[str, Any]:
    from rag.types import Context, Hits

    pool = PassagePool(docs, s["chunk_size"], s["chunk_overlap"], label=False)
    rows = sample_passages(pool, _wanted(s), int(s["seed"]))
    texts = [" ".join(pool.passages[r].text.split())[:PASSAGE_CHARS] for r in rows]
    t0 = time.perf_counter()
    answers = generator.generate([""] * len(texts), [[Context(text=t)] for t in texts])
    seconds = time.perf_counter() - t0
    stats = dict(generator.stats or {})
    questions = [clean_question(a) for a in answers]
    asked = [(r, q) for r, q in zip(rows, questions) if q]
    hits = pool.bm25.search([q for _, q in asked], ROUND_TRIP_K) if asked else Hits.empty(0, ROUND_TRIP_K)
    kept = 0
    with open(tmp / FILE, "w", encoding="utf-8") as f:
        for i, (r, q) in enumerate(asked):
            found = {pool.passages[int(x)].doc_id for x in hits.ids[i] if x >= 0}
            ok = pool.passages[r].doc_id in found
            kept += ok
            f.write(json.dumps({"doc_id": pool.passages[r].doc_id, "start": pool.passages[r].start,
                                "question": q, "round_trip": ok}, ensure_ascii=False) + "\n")
    say(f"generated {len(asked)} questions for {len(rows)} passages in {seconds:.0f}s "
        f"({stats.get('tokens_per_s', '?')} tokens/s), {kept} kept by the round trip")
    return {"prompted": len(rows), "well_formed": len(asked), "kept": kept, "seconds": round(seconds, 1),
            "tokens_per_s": stats.get("tokens_per_s")}


def generated_examples(docs: Sequence[Document], s: Mapping[str, Any], generator_config: Any,
                       cache: ArtifactCache, say: Callable[[str], None] | None = None) -> list[Example]:
    """The kept generated questions, each with its passage (labelled as the settings say)."""
    say = say or (lambda m: log.info("%s", m))
    generator, gen_id = generator_settings(generator_config)
    key = generation_key(docs, s, generator_config)
    art = cache.get_or_build(KIND, key, lambda tmp: _generate(docs, s, generator, tmp, say),
                             inputs={"generator": gen_id, "passages": _wanted(s)})
    pool = PassagePool(docs, s["chunk_size"], s["chunk_overlap"], s["label_passages"])
    out = []
    for line in art.file(FILE).read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        row = pool.containing(rec["doc_id"], rec["start"]) if rec["round_trip"] else None
        if row is not None:
            p = pool.passages[row]
            out.append(Example(p.doc_id, p.source, "generated", rec["question"], pool.text(row)))
    return out
