"""Encoding: the harness's embedding stage against a bare SentenceTransformer.encode, and the
cost of a full cache hit.

- throughput: `rag.embedder.npy_writer.encode_to_npy` with the configured `SentenceTransformerEmbedder`
  (conf/embedder/minilm.yaml: dedupe, blocks of 8192, a float32 .npy written block by block)
  vs `SentenceTransformer.encode` on the same texts with the same batch size and normalization,
  same loaded model; runs alternate A B B A so drift of a shared machine cancels. The ratio is
  harness chunks/s over bare chunks/s (target >= 0.95).
- cache hit: `Artifacts.vectors` on a warm artifact cache with a fresh embedder; the model must
  never load (the embedder's `model` cached_property stays unset and
  `load_sentence_transformer` records no call).

Texts: the first chunks of the PubMedQA abstracts cut by the default chunker (512 characters).
"""
from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import finish, pubmedqa_chunks, ratio, row, run_mode, scratch_dir, start


def make_embedder(name: str = "minilm_torch", **overrides: Any) -> Any:
    """The embedder as a run builds it from `embedder=<name>` (composed, so a config that extends
    another works; progress bars off)."""
    from benchmarks.common import compose
    from rag.run.session import create

    node = compose([f"embedder={name}"]).embedder
    node.show_progress = False
    for k, v in overrides.items():
        node[k] = v
    return create(node)


def loaded_embedder(texts: list[str]) -> tuple[Any, float]:
    """The default torch embedder, its model loaded (the seconds that took, excluded from every
    throughput) and warmed up on the first texts (first-call allocations)."""
    embedder = make_embedder("minilm_torch")
    t0 = time.perf_counter()
    _ = embedder.model  # a cached property: this loads it
    load_s = time.perf_counter() - t0
    embedder.encode(texts[:16])
    return embedder, load_s


def texts_facts(texts: list[str], batch_size: int) -> dict[str, Any]:
    """The leading keys of an encoding result (texts_note: the table's words for them)."""
    return {"n_texts": len(texts), "mean_chars": round(sum(map(len, texts)) / len(texts), 1), "batch_size": batch_size}


def texts_note(result: dict[str, Any]) -> str:
    return f"{result['n_texts']} PubMedQA chunks, ~{result['mean_chars']:.0f} chars, batch {result['batch_size']}"


def chunk_set_of(texts: list[str]) -> Any:
    from rag.store.chunk_set import ChunkSet
    from rag.store.cache import make_key
    from rag.types import Chunk

    h = hashlib.sha256("\0".join(texts).encode()).hexdigest()
    chunks = [Chunk(id=f"bench{i}#0", doc_id=f"bench{i}", text=t, source="pubmed", start=0, end=len(t), position=0)
              for i, t in enumerate(texts)]
    return ChunkSet(make_key("chunks", {"bench": "encoding"}, {"texts": h}), chunks)


def attention_flops(layers: int, hidden: int, queries: float, keys: float) -> float:
    """QK^T and AV for `queries` positions each attending to `keys` positions: 2 x 2 x hidden per
    (query, key) per layer (grouped-query attention shares keys and values, not this arithmetic)."""
    return 4.0 * layers * hidden * queries * keys


def encode_flops(st: Any, texts: Sequence[str | tuple[str, str]], batch_size: int, sort_by: str = "chars") -> dict[str, Any]:
    """Work of encoding `texts` (strings, or (query, passage) pairs for a cross-encoder, `st` a
    CrossEncoder) in batches sorted by length, longest first, each batch padded to its longest:
    sorted by characters as sentence-transformers does (`sort_by="chars"`, a pair's summed), or by
    tokens as the harness's stage does (`"tokens"`, SentenceTransformerEmbedder.encode_blocks).
    Tokens, padded tokens and GFLOP (2 x non-embedding parameters per token, plus attention over
    the sequence: attention_flops)."""
    tok = st.tokenizer
    max_len = int(st.max_seq_length)
    lengths = np.array([len(ids) for ids in tok(texts, truncation=True, max_length=max_len)["input_ids"]])
    keys = lengths if sort_by == "tokens" else np.array([len(t) if isinstance(t, str) else sum(map(len, t)) for t in texts])
    order = np.argsort(-keys, kind="stable")
    padded, attn = 0, 0.0
    cfg = st[0].model.config if hasattr(st[0], "model") else st[0].auto_model.config
    layers, hidden = int(cfg.num_hidden_layers), int(cfg.hidden_size)
    for a in range(0, len(texts), batch_size):
        seq = int(lengths[order[a : a + batch_size]].max())
        m = len(order[a : a + batch_size])
        padded += seq * m
        attn += attention_flops(layers, hidden, seq * m, seq)
    params = sum(p.numel() for n, p in st.named_parameters() if "embeddings" not in n)
    gflop = (2.0 * params * padded + attn) / 1e9
    return {"tokens": int(lengths.sum()), "padded_tokens": int(padded), "padding_overhead": round(padded / lengths.sum(), 3),
            "non_embedding_params": int(params), "gflop": round(gflop, 2)}


def _sum_work(parts: list[dict[str, Any]]) -> dict[str, Any]:
    tokens, padded = sum(p["tokens"] for p in parts), sum(p["padded_tokens"] for p in parts)
    return {"tokens": tokens, "padded_tokens": padded, "padding_overhead": round(padded / tokens, 3),
            "non_embedding_params": parts[0]["non_embedding_params"], "gflop": round(sum(p["gflop"] for p in parts), 2)}


def cache_hits(cache: Any, chunk_set: Any, repeats: int = 5) -> tuple[list[float], bool, bool, Any]:
    """Artifacts.vectors with fresh embedders on a warm cache: (ms each, whether a model loaded,
    whether the vectors were a hit, load_sentence_transformer's cache info). No model may load."""
    from rag.run.artifacts import Artifacts
    from rag.embedder.sentence_transformer import load_sentence_transformer

    load_sentence_transformer.cache_clear()  # from here on, any model load would be a new call
    hits_ms, fresh, arts = [], None, None
    for _ in range(repeats):
        fresh = make_embedder("minilm_torch")
        arts = Artifacts(cache, chunk_set)
        t0 = time.perf_counter()
        vecs = arts.vectors(fresh)
        float(vecs[-1, -1])  # touch the memory map
        hits_ms.append(1000 * (time.perf_counter() - t0))
    info = load_sentence_transformer.cache_info()
    assert arts is not None, "cache_hits needs at least one repeat"
    model_loaded = ("model" in fresh.__dict__) or info.misses > 0 or info.currsize > 0
    return hits_ms, model_loaded, bool(arts.record["vectors"]["hit"]), info


def gemm_gflops(repeats: int = 5, dtype: str = "float32") -> float:
    """Matrix-multiply throughput of torch on this machine now (its own threads) in `dtype`
    (float32, or bfloat16 where the CPU computes it natively): the compute ceiling an encoder's
    dense layers can reach at that precision."""
    import torch

    a = torch.randn(8192, 384).to(getattr(torch, dtype))
    b = torch.randn(384, 1536).to(getattr(torch, dtype))
    a @ b
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        ts.append(time.perf_counter() - t0)
    return round(2 * 8192 * 384 * 1536 / statistics.median(ts) / 1e9, 1)


def gemm_ceilings(bf16: bool) -> dict[str, float]:
    """The float32 GEMM ceiling, and the bfloat16 one beside it when a bf16 candidate is measured."""
    out = {"fp32": gemm_gflops()}
    if bf16:
        out["bf16"] = gemm_gflops(dtype="bfloat16")
    return out


def harness_vs_bare(embedder: Any, texts: list[str], blocks: int,
                    tmp: Path) -> tuple[list[list[str]], dict[str, float], dict[str, float], list[Any], float]:
    """Both sides on the same texts: (the parts, seconds and CPU seconds per side, the harness's
    (cache, chunk set) per part, the largest difference between their vectors)."""
    from rag.run.artifacts import Artifacts
    from rag.store.cache import ArtifactCache

    st = embedder.model
    # The texts in `blocks` parts; each part is encoded by both sides, in alternating order
    # (harness first, then bare first, ...), so a drifting machine load hits both alike.
    # The harness side is the whole stage: Artifacts.vectors on an empty cache (dedupe,
    # encode in blocks, .npy, checksum, atomic publish).
    size = -(-len(texts) // blocks)
    parts = [texts[i : i + size] for i in range(0, len(texts), size)]
    times = {"harness": 0.0, "bare": 0.0}
    cpu = {"harness": 0.0, "bare": 0.0}  # this process's CPU time: less sensitive to other processes
    harness_vecs: list[np.ndarray] = []
    bare_vecs: list[np.ndarray] = []
    caches: list[tuple[ArtifactCache, Any]] = []
    for b, part in enumerate(parts):
        chunk_set = chunk_set_of(part)
        for side in (("harness", "bare") if b % 2 == 0 else ("bare", "harness")):
            c0 = time.process_time()
            t0 = time.perf_counter()
            if side == "harness":
                cache = ArtifactCache(tmp / f"cache-{b}")
                vecs = Artifacts(cache, chunk_set).vectors(embedder)
                caches.append((cache, chunk_set))
            else:
                vecs = st.encode(part, batch_size=embedder.batch_size, normalize_embeddings=embedder.normalize,
                                 convert_to_numpy=True, show_progress_bar=False)
            times[side] += time.perf_counter() - t0
            cpu[side] += time.process_time() - c0
            (harness_vecs if side == "harness" else bare_vecs).append(np.asarray(vecs))
    max_abs = float(np.abs(np.concatenate(harness_vecs) - np.concatenate(bare_vecs)).max())
    return parts, times, cpu, caches, max_abs


def bench_encoding(quick: bool = True, full: bool = False, n_texts: int | None = None, tiny: bool = False,
                   blocks: int | None = None) -> dict[str, Any]:
    """Embedding stage (Artifacts.vectors: encode_to_npy + SentenceTransformerEmbedder) vs bare
    SentenceTransformer.encode on 1000 PubMedQA chunks (2000 with full), and the cost of a full
    cache hit (no model load)."""
    clock = start()
    n_texts = n_texts or {"tiny": 16, "quick": 1000, "full": 2000}[run_mode(tiny, full)]
    blocks = blocks or (2 if tiny else 10)
    texts = pubmedqa_chunks(n_texts)
    embedder, load_s = loaded_embedder(texts)
    st = embedder.model

    with scratch_dir("encoding") as tmp:
        tmp = Path(tmp)
        parts, times, cpu, caches, max_abs = harness_vs_bare(embedder, texts, blocks, tmp)
        harness_s, bare_s = times["harness"], times["bare"]
        work = _sum_work([encode_flops(st, part, embedder.batch_size, "chars") for part in parts])
        harness_work = _sum_work([encode_flops(st, part, embedder.batch_size, "tokens") for part in parts])
        useful_gflop = work["gflop"] * work["tokens"] / work["padded_tokens"]  # ~ the unpadded work
        gemm = gemm_gflops()

        hits_ms, model_loaded, hit_ok, info = cache_hits(*caches[0])

    n = len(texts)
    cold_part_s = harness_s / len(parts)
    result = {
        **texts_facts(texts, embedder.batch_size),
        "blocks": len(parts),
        "model_load_s": round(load_s, 3),
        "harness_s": round(harness_s, 3),
        "bare_s": round(bare_s, 3),
        "harness_chunks_per_s": round(n / harness_s, 2),
        "bare_chunks_per_s": round(n / bare_s, 2),
        "harness_vs_bare": ratio(bare_s, harness_s),
        "harness_cpu_s": round(cpu["harness"], 3),
        "bare_cpu_s": round(cpu["bare"], 3),
        "harness_vs_bare_cpu": ratio(cpu["bare"], cpu["harness"]),
        "max_abs_diff_vs_bare": max_abs,
        "work": work,
        "gemm_gflops": gemm,
        "harness_work": harness_work,
        "harness_gflops": round(harness_work["gflop"] / harness_s, 1),
        "harness_vs_gemm_ceiling": ratio(harness_work["gflop"] / harness_s, gemm),
        "bare_gflops": round(work["gflop"] / bare_s, 1),
        "useful_gflops_harness": round(useful_gflop / harness_s, 1),
        "useful_vs_gemm_ceiling_harness": ratio(useful_gflop / harness_s, gemm),
        "cache_hit_ms": [round(x, 3) for x in hits_ms],
        "cache_hit_ms_median": round(statistics.median(hits_ms), 3),
        "cache_hit_texts": len(parts[0]),
        "cache_hit_vs_cold_build": ratio(statistics.median(hits_ms) / 1000, cold_part_s),
        "cache_hit_is_hit": hit_ok,
        "cache_hit_model_loaded": model_loaded,
        "load_sentence_transformer_cache_info": info._asdict(),
    }
    result["table"] = encoding_table(result)
    return finish(result, clock)


def encoding_table(result: dict[str, Any]) -> list[dict[str, Any]]:
    work, harness_work = result["work"], result["harness_work"]
    return [
        row("bare SentenceTransformer.encode", result["bare_chunks_per_s"], "chunks/s", texts_note(result)),
        row("harness embedding stage (Artifacts.vectors -> encode_to_npy)", result["harness_chunks_per_s"], "chunks/s",
            f"{result['blocks']} interleaved parts, empty cache each"),
        row("**harness / bare throughput**", result["harness_vs_bare"], "x",
            f"target >= 0.95; by CPU time {result['harness_vs_bare_cpu']}x"),
        row("max |harness - bare| vector difference", result["max_abs_diff_vs_bare"], ""),
        row("encoder arithmetic rate (harness)", result["harness_gflops"], "GFLOP/s",
            f"{harness_work['gflop']} GFLOP for {work['tokens']:,} tokens: {harness_work['padding_overhead']}x with "
            f"padding, batches sorted by tokens (bare, sorted by characters: {work['padding_overhead']}x, "
            f"{result['bare_gflops']} GFLOP/s)"),
        row("useful (unpadded) arithmetic rate (harness)", result["useful_gflops_harness"], "GFLOP/s",
            f"{result['useful_vs_gemm_ceiling_harness']}x the GEMM ceiling"),
        row("**encoder rate / float32 GEMM ceiling**", result["harness_vs_gemm_ceiling"], "x",
            f"torch {result['gemm_gflops']} GFLOP/s on a 8192x384 @ 384x1536 matmul, same run"),
        row("model load (excluded above)", result["model_load_s"], "s"),
        row("**vectors: full cache hit**", result["cache_hit_ms_median"], "ms",
            f"median of 5, fresh embedder, {result['cache_hit_texts']} vectors; {result['cache_hit_vs_cold_build']}x their cold build"),
        row("model loaded on a cache hit", "yes" if result["cache_hit_model_loaded"] else "no", "", "target: no"),
    ]
