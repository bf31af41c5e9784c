"""The ONNX embedder backend (rag/embedder/sentence_transformer.py, conf/embedder/minilm_onnx*.yaml) against torch.

- speed: chunks/s of `SentenceTransformerEmbedder.encode` with backend torch, onnx and onnx +
  int8 on the same PubMedQA chunks (runs ordered torch, onnx, int8, int8, onnx, torch so drift
  cancels); model loading/export timed separately.
- vectors: max |difference| and cosine to the torch vectors.
- retrieval quality: the pipeline (`run.py +version=v1`) on the default slice with
  embedder=minilm_torch, minilm_onnx (= minilm) and minilm_onnx_int8: recall@k, MRR, hit@k by document id, and
  the share of questions whose top-k chunks are identical to torch's. These runs use the
  configured artifact cache (paths.cache): quality does not depend on cold or warm caches, and
  a second benchmark run reuses their vectors.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    environment,
    finish,
    main_cache,
    median,
    per_call_ms,
    pubmedqa_chunks,
    pubmedqa_questions,
    ratio,
    row,
    run_mode,
    run_pipeline_subprocess,
    scratch_dir,
    start,
)
from benchmarks.encoding import make_embedder
from rag.cache import ArtifactCache

VARIANTS = {"torch": "minilm_torch", "onnx": "minilm_onnx", "onnx_int8": "minilm_onnx_int8"}
QUALITY_METRICS = ("recall_at_k", "mrr", "hit_at_k_id", "mrr_id", "precision_at_k")


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


def speed_and_vectors(texts: list[str], cache_dir: Path, blocks: int) -> dict[str, Any]:
    embedders, load_s = {}, {}
    for name, conf in VARIANTS.items():
        e = make_embedder(conf)
        e.use_cache(ArtifactCache(cache_dir))
        t0 = time.perf_counter()
        _ = e.model
        load_s[name] = round(time.perf_counter() - t0, 3)
        e.encode(texts[:16])  # warm-up
        embedders[name] = e
    # Each part of the texts is encoded by every backend, the order rotating from part to part,
    # so a drifting machine load hits all three alike.
    size = -(-len(texts) // blocks)
    parts = [texts[i : i + size] for i in range(0, len(texts), size)]
    names = list(VARIANTS)
    times = {k: 0.0 for k in names}
    vecs: dict[str, list[np.ndarray]] = {k: [] for k in names}
    for b, part in enumerate(parts):
        for name in names[b % 3 :] + names[: b % 3]:
            t0 = time.perf_counter()
            vecs[name].append(embedders[name].encode(part))
            times[name] += time.perf_counter() - t0
    full = {k: np.concatenate(v) for k, v in vecs.items()}
    # One question at a time, as retrieval encodes them (rag.query.retrieve_rerank): latency, not throughput.
    questions = pubmedqa_questions(30)
    query_ms = {}
    for name in names:
        e = embedders[name]
        e.encode_queries(questions[:1])
        query_ms[name] = median(per_call_ms(lambda q: e.encode_queries([q]), questions))
    n = len(texts)
    out: dict[str, Any] = {"n_texts": n, "blocks": len(parts), "load_or_export_s": load_s,
                           "ids": {k: e.id for k, e in embedders.items()},
                           "model_dirs": {k: str(getattr(e.model, "model_dir", "")) for k, e in embedders.items()}}
    for name in names:
        c = cosines(full[name], full["torch"])
        out[name] = {
            "seconds": round(times[name], 3),
            "chunks_per_s": round(n / times[name], 2),
            "speedup_vs_torch": ratio(times["torch"], times[name]),
            "max_abs_diff": float(np.abs(full[name] - full["torch"]).max()),
            "cosine_min": round(float(c.min()), 9),
            "cosine_mean": round(float(c.mean()), 6),
            "query_ms_median": query_ms[name],
            "query_speedup_vs_torch": ratio(query_ms["torch"], query_ms[name]),
        }
    return out


def paired_ci(base: dict[str, dict[str, float]], other: dict[str, dict[str, float]], metric: str,
              resamples: int = 2000, seed: int = 0) -> list[float] | None:
    """95% bootstrap interval of the mean per-question difference (other - base), questions paired."""
    d = np.array([other[q][metric] - base[q][metric] for q in base
                  if q in other and base[q].get(metric) is not None and other[q].get(metric) is not None])
    if d.size == 0:
        return None
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, (resamples, d.size))].mean(1)
    return [round(float(np.percentile(means, 2.5)), 4), round(float(np.percentile(means, 97.5)), 4)]


def quality(out_root: Path, overrides: list[str]) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    top: dict[str, dict[str, list[str]]] = {}
    per_q: dict[str, dict[str, dict[str, float]]] = {}
    for name, conf in VARIANTS.items():
        res = run_pipeline_subprocess(["+version=v1", f"embedder={conf}", *overrides], out_root / name)
        if "error" in res:
            runs[name] = {"error": res["error"]}
            continue
        runs[name] = {
            "metrics": {m: res["metrics"][m] for m in QUALITY_METRICS if m in res["metrics"]},
            "timings_s": res["timings_s"],
            "process_wall_s": res["process_wall_s"],
            "counts": res["counts"],
            "vectors_cached": res["artifacts"].get("vectors", {}).get("hit"),
        }
        with open(out_root / name / "per_question.jsonl") as f:
            records = [json.loads(line) for line in f]
        top[name] = {r["id"]: [x["chunk_id"] for x in r["retrieved"]] for r in records}
        per_q[name] = {r["id"]: {m: r.get(m) for m in QUALITY_METRICS} for r in records}
    if "torch" in top:
        for name, ranked in top.items():
            if name == "torch":
                continue
            same = [ranked.get(q) == ids for q, ids in top["torch"].items()]
            overlap = [len(set(ranked.get(q, [])) & set(ids)) / max(1, len(ids)) for q, ids in top["torch"].items()]
            runs[name]["same_topk_as_torch"] = round(float(np.mean(same)), 4)
            runs[name]["topk_overlap_with_torch"] = round(float(np.mean(overlap)), 4)
            runs[name]["delta_vs_torch"] = {
                m: round(runs[name]["metrics"][m]["mean"] - runs["torch"]["metrics"][m]["mean"], 4)
                for m in runs[name]["metrics"] if m in runs["torch"]["metrics"]
            }
            runs[name]["delta_vs_torch_paired_ci95"] = {
                m: paired_ci(per_q["torch"], per_q[name], m) for m in runs[name]["metrics"]
            }
    return runs


def bench_onnx(quick: bool = True, full: bool = False, n_texts: int | None = None, tiny: bool = False,
               with_quality: bool | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """ONNX backend (fp32 and int8) vs torch: chunks/s speed-ups, vector differences and retrieval
    quality of v1 on the default slice with each embedder."""
    clock = start()
    n_texts = n_texts or {"tiny": 24, "quick": 1000, "full": 2000}[run_mode(tiny, full)]
    blocks = 3 if tiny else 6
    with_quality = (not tiny) if with_quality is None else with_quality
    texts = pubmedqa_chunks(n_texts)
    with scratch_dir("onnx") as tmp:
        tmp = Path(tmp)
        cache = tmp / "cache" if tiny else main_cache()
        speed = speed_and_vectors(texts, cache, blocks)
        runs = quality(tmp / "runs", list(overrides or [])) if with_quality else {}

    table = [row("torch", speed["torch"]["chunks_per_s"], "chunks/s", f"{speed['n_texts']} PubMedQA chunks")]
    for name in ("onnx", "onnx_int8"):
        s = speed[name]
        table.append(row(f"{name}", s["chunks_per_s"], "chunks/s"))
        table.append(row(f"**{name} speed-up vs torch**", s["speedup_vs_torch"], "x"))
        table.append(row(f"{name}: max |vector - torch vector|", s["max_abs_diff"], "",
                         f"cosine to torch: min {s['cosine_min']}, mean {s['cosine_mean']}"))
    for name in VARIANTS:
        s = speed[name]
        note = "" if name == "torch" else f"{s['query_speedup_vs_torch']}x faster than torch"
        table.append(row(f"{name}: one-question encode latency (median of 30)", s["query_ms_median"], "ms", note))
    table.append(row("model load (torch) / export-or-load (onnx, int8)",
                     " / ".join(str(speed["load_or_export_s"][k]) for k in VARIANTS), "s",
                     "an export happens once per model into the artifact cache"))
    for name, r in runs.items():
        if "error" in r:
            table.append(row(f"v1 with {VARIANTS[name]}", "failed", "", r["error"][:200]))
            continue
        m = r["metrics"]
        cells = ", ".join(f"{k} {m[k]['mean']:.3f}" for k in ("recall_at_k", "mrr", "hit_at_k_id") if k in m)
        note = f"embed stage {r['timings_s'].get('embed', float('nan')):.1f} s" + (" (cached)" if r["vectors_cached"] else "")
        if "delta_vs_torch" in r:
            d = r["delta_vs_torch"]
            ci = r.get("delta_vs_torch_paired_ci95", {})
            note += (f"; delta vs torch: recall {d.get('recall_at_k', 0):+.3f} {ci.get('recall_at_k')}, "
                     f"MRR {d.get('mrr', 0):+.3f} {ci.get('mrr')}, hit@k_id {d.get('hit_at_k_id', 0):+.3f} "
                     f"{ci.get('hit_at_k_id')} (paired 95% CI); same top-k for {r['same_topk_as_torch']:.0%} of questions, "
                     f"top-k overlap {r['topk_overlap_with_torch']:.0%}")
        table.append(row(f"v1 with {VARIANTS[name]}: {cells}", r["counts"]["questions"], "questions", note))
    # The default embedder (conf/embedder/minilm.yaml) is the fp32 ONNX one: its speed-up over
    # the torch path it replaced, and how far its vectors are from torch's.
    result = {"speed": speed, "quality": runs, "table": table, "environment": environment(),
              "embed_speedup": speed["onnx"]["speedup_vs_torch"],
              "embed_cosine_min_vs_torch": speed["onnx"]["cosine_min"],
              "embed_max_abs_diff_vs_torch": speed["onnx"]["max_abs_diff"]}
    table.insert(0, row("**embed_speedup** (default embedder = fp32 ONNX, vs torch)", speed["onnx"]["speedup_vs_torch"], "x",
                        f"1 - min cosine to torch: {1 - speed['onnx']['cosine_min']:.1e} (target <= 1e-6)"))
    return finish(result, clock)
