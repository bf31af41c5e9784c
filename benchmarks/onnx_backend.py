"""The embedder's backends (rag/embedder/backend_choice.py: `backend: auto`, conf/embedder/minilm*.yaml) against torch fp32.

- speed: chunks/s of the embedding stage's own path (`SentenceTransformerEmbedder.encode_blocks`:
  batches by token count) with torch fp32, torch bf16 autocast (where the CPU computes bf16
  natively), ONNX fp32 and ONNX int8, and OpenVINO fp32 and bf16 (bf16 where native; where openvino
  is installed) on the same PubMedQA chunks: each part of the chunks is
  encoded by every backend in turn, the order rotating, `repeats` times, and each backend's time on
  a part is its best; model loading/export timed separately.
- arithmetic: each backend's GFLOP/s on that work (benchmarks.encoding.encode_flops) against the
  machine's float32 GEMM ceiling, and the bf16 one where bf16 is native (same run).
- vectors: max |difference|, min and mean cosine to torch fp32's, and the top-10 overlap of
  PubMedQA questions over the chunks (what `auto` requires: min cosine >= 0.9999, overlap >= 0.98).
- the pick: the probe `backend: auto` runs on first use (rag/embedder/probe.py), measured here
  afresh, and the backend it picks; and what the same rule picks from this run's longer measurement.
- retrieval quality: the pipeline (`run.py +version=v1`) on the default slice with each backend
  pinned and with the default (`auto`): recall@k, MRR, hit@k by document id, paired CIs against
  torch fp32, and the share of questions whose top-k chunks are identical to fp32's. These runs use
  the configured artifact cache (paths.cache): quality does not depend on cold or warm caches, and
  a second benchmark run reuses their vectors.
"""
from __future__ import annotations

import functools
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
from benchmarks.encoding import encode_flops, gemm_ceilings, make_embedder
from rag.store.cache import ArtifactCache
from rag.embedder.backend_choice import (
    MIN_COSINE,
    MIN_OVERLAP,
    Measured,
    candidate_named,
    choose,
    cpu_flags,
    explain,
    native_bf16,
)
from rag.embedder.backend_choice import openvino_available
from rag.embedder.probe import probe_texts, top_overlap

# name -> (embedder config, overrides, the backend's name in rag.embedder.backend_choice)
VARIANTS: dict[str, tuple[str, dict[str, Any], str]] = {
    "torch": ("minilm_torch", {}, "torch fp32"),
    "torch_bf16": ("minilm_torch", {"precision": "bf16"}, "torch bf16"),
    "onnx": ("minilm_onnx", {}, "onnx fp32"),
    "onnx_int8": ("minilm_onnx_int8", {}, "onnx int8"),
    "openvino": ("minilm_torch", {"backend": "openvino"}, "openvino fp32"),
    "openvino_bf16": ("minilm_torch", {"backend": "openvino", "precision": "bf16"}, "openvino bf16"),
}
# The pipeline's command line per variant (quality runs); "auto" is the default embedder.
RUNS = {"torch": ["embedder=minilm_torch"], "torch_bf16": ["embedder=minilm_torch", "embedder.precision=bf16"],
        "onnx": ["embedder=minilm_onnx"], "onnx_int8": ["embedder=minilm_onnx_int8"],
        "openvino": ["embedder=minilm_torch", "embedder.backend=openvino"],
        "openvino_bf16": ["embedder=minilm_torch", "embedder.backend=openvino", "embedder.precision=bf16"],
        "auto": ["embedder=minilm"]}
QUALITY_METRICS = ("recall_at_k", "mrr", "hit_at_k_id", "mrr_id", "precision_at_k")


def variants_here() -> list[str]:
    """bf16 only where the CPU computes it natively (emulated, it is slower than fp32 and no
    candidate); OpenVINO where it is installed."""
    bf16, openvino = native_bf16(cpu_flags()) is not None, openvino_available()
    return [n for n in VARIANTS if (bf16 or not n.endswith("bf16")) and (openvino or not n.startswith("openvino"))]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


def stage_encode(embedder: Any, texts: list[str]) -> np.ndarray:
    """The embedding stage's own path: encode_blocks (batches by token count), rows back in order."""
    out = np.empty((len(texts), embedder.dim), np.float32)
    for rows, vecs in embedder.encode_blocks(texts, len(texts)):
        out[rows] = vecs
    return out


def one_query(embedder: Any, question: str) -> np.ndarray:
    return embedder.encode_queries([question])


def speed_and_vectors(texts: list[str], cache_dir: Path, blocks: int, repeats: int = 3) -> dict[str, Any]:
    names = variants_here()
    embedders, load_s = {}, {}
    for name in names:
        conf, overrides, _ = VARIANTS[name]
        e = make_embedder(conf, **overrides)
        e.use_cache(ArtifactCache(cache_dir))
        t0 = time.perf_counter()
        _ = e.model
        load_s[name] = round(time.perf_counter() - t0, 3)
        stage_encode(e, texts[:16])  # warm-up
        embedders[name] = e
    # Each part of the texts is encoded by every backend, the order rotating from turn to turn, so
    # a drifting machine load hits all alike; a backend's time on a part is its best of `repeats`.
    size = -(-len(texts) // blocks)
    parts = [texts[i : i + size] for i in range(0, len(texts), size)]
    times = dict.fromkeys(names, 0.0)
    vecs: dict[str, list[np.ndarray]] = {k: [] for k in names}
    turn = 0
    for part in parts:
        best = dict.fromkeys(names, float("inf"))
        for r in range(repeats):
            for name in names[turn % len(names):] + names[: turn % len(names)]:
                t0 = time.perf_counter()
                v = stage_encode(embedders[name], part)
                best[name] = min(best[name], time.perf_counter() - t0)
                if r == 0:
                    vecs[name].append(v)
            turn += 1
        for name in names:
            times[name] += best[name]
    full = {k: np.concatenate(v) for k, v in vecs.items()}
    # One question at a time, as retrieval encodes them (rag.run.query.retrieve_rerank): latency, not throughput.
    questions = pubmedqa_questions(60)
    query_ms, q_vecs = {}, {}
    for name in names:
        e = embedders[name]
        e.encode_queries(questions[:1])
        query_ms[name] = median(per_call_ms(functools.partial(one_query, e), questions[:30]))
        q_vecs[name] = e.encode_queries(questions)
    # The arithmetic of the work (the same for every backend: the stage's batches by tokens).
    st = embedders["torch"].model
    work = [encode_flops(st, part, embedders["torch"].batch_size, "tokens") for part in parts]
    gflop = sum(w["gflop"] for w in work)
    ceilings = gemm_ceilings(any(n.endswith("bf16") for n in names))
    n = len(texts)
    out: dict[str, Any] = {"names": names, "n_texts": n, "blocks": len(parts), "repeats": repeats,
                           "load_or_export_s": load_s,
                           "gflop": round(gflop, 2), "gemm_gflops": ceilings,
                           "ids": {k: e.id for k, e in embedders.items()},
                           "model_dirs": {k: str(getattr(e.model, "model_dir", "")) for k, e in embedders.items()}}
    for name in names:
        c = cosines(np.concatenate([full[name], q_vecs[name]]), np.concatenate([full["torch"], q_vecs["torch"]]))
        precision = VARIANTS[name][2].split()[1]
        ceiling = ceilings.get(precision, ceilings["fp32"])
        out[name] = {
            "backend": VARIANTS[name][2],
            "seconds": round(times[name], 3),
            "chunks_per_s": round(n / times[name], 2),
            "speedup_vs_torch": ratio(times["torch"], times[name]),
            "gflops": round(gflop / times[name], 1),
            "vs_gemm_ceiling": ratio(gflop / times[name], ceiling),
            "ceiling": precision if precision in ceilings else "fp32",
            "max_abs_diff": float(np.abs(full[name] - full["torch"]).max()),
            "cosine_min": round(float(c.min()), 9),
            "cosine_mean": round(float(c.mean()), 6),
            "top10_overlap": round(top_overlap(q_vecs["torch"], full["torch"], q_vecs[name], full[name]), 4),
            "query_ms_median": query_ms[name],
            "query_speedup_vs_torch": ratio(query_ms["torch"], query_ms[name]),
        }
    out["embedders"] = embedders
    return out


def auto_pick(speed: dict[str, Any], tiny: bool) -> dict[str, Any]:
    """What `backend: auto` picks: its own probe (rag/embedder/probe.py, measured afresh here,
    not read from the cache) and the same rule over this run's longer measurement."""
    default = make_embedder("minilm")
    default.use_cache(speed["embedders"]["onnx"].cache)
    flags = cpu_flags()
    allowed = default.allowed(flags)
    passages, questions = probe_texts(12, 4) if tiny else probe_texts()
    t0 = time.perf_counter()
    probe_kw = {"speed_passages": 4} if tiny else {}
    measured = default.measure_backends(allowed, passages, questions, **probe_kw)
    probe_s = time.perf_counter() - t0
    best = choose(measured)
    date = time.strftime("%Y-%m-%d")
    line = best.candidate.name + explain(best, measured, False, native_bf16(flags), date)
    long = [Measured(candidate_named(VARIANTS[n][2]), speed[n]["chunks_per_s"], speed[n]["cosine_min"],
                     speed[n]["top10_overlap"]) for n in speed["names"]]
    long_best = choose([m for m in long if m.candidate in allowed])
    return {"line": line, "backend": best.candidate.name, "probe_s": round(probe_s, 1),
            "probe": {m.candidate.name: m.to_json() for m in measured},
            "this_run_picks": long_best.candidate.name,
            "int8_eligible": next((m.eligible(False) for m in long if m.candidate.precision == "int8"), None)}


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


def quality(out_root: Path, overrides: list[str], names: list[str]) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    top: dict[str, dict[str, list[str]]] = {}
    per_q: dict[str, dict[str, dict[str, float]]] = {}
    for name in names:
        res = run_pipeline_subprocess(["+version=v1", *RUNS[name], *overrides], out_root / name)
        if "error" in res:
            runs[name] = {"error": res["error"]}
            continue
        runs[name] = {
            "metrics": {m: res["metrics"][m] for m in QUALITY_METRICS if m in res["metrics"]},
            "timings_s": res["timings_s"],
            "process_wall_s": res["process_wall_s"],
            "counts": res["counts"],
            "vectors_cached": res["artifacts"].get("vectors", {}).get("hit"),
            "backend": ((res.get("backends") or {}).get("embedder") or {}).get("line"),
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
               with_quality: bool | None = None, overrides: list[str] | None = None,
               repeats: int | None = None) -> dict[str, Any]:
    """The embedder's backends (torch fp32 and bf16, ONNX fp32 and int8, OpenVINO fp32 and bf16) and
    `backend: auto`'s pick:
    chunks/s against torch fp32, GFLOP/s against the GEMM ceilings, agreement of the vectors, and
    retrieval quality of v1 on the default slice with each."""
    clock = start()
    n_texts = n_texts or {"tiny": 24, "quick": 1000, "full": 2000}[run_mode(tiny, full)]
    blocks = 3 if tiny else 6
    repeats = repeats or (1 if tiny else 3)
    with_quality = (not tiny) if with_quality is None else with_quality
    texts = pubmedqa_chunks(n_texts)
    with scratch_dir("onnx") as tmp:
        tmp = Path(tmp)
        cache = tmp / "cache" if tiny else main_cache()
        speed = speed_and_vectors(texts, cache, blocks, repeats)
        pick = auto_pick(speed, tiny)
        del speed["embedders"]
        runs = quality(tmp / "runs", list(overrides or []), [*speed["names"], "auto"]) if with_quality else {}

    ceilings = speed["gemm_gflops"]
    table = [row("**backend: auto picks**", pick["backend"], "", pick["line"]),
             row("the same rule on this run's longer measurement picks", pick["this_run_picks"], "",
                 f"the probe took {pick['probe_s']} s"),
             row("float32 GEMM ceiling", ceilings["fp32"], "GFLOP/s", "torch, 8192x384 @ 384x1536, same run")]
    if "bf16" in ceilings:
        table.append(row("bf16 GEMM ceiling", ceilings["bf16"], "GFLOP/s", "the same matmul in bf16"))
    for name in speed["names"]:
        s = speed[name]
        agree = "" if name == "torch" else (
            f"; {s['speedup_vs_torch']}x torch fp32; cosine to fp32 min {s['cosine_min']}, mean {s['cosine_mean']}, "
            f"top-10 overlap {s['top10_overlap']} (auto needs >= {MIN_COSINE}, >= {MIN_OVERLAP})")
        table.append(row(f"{s['backend']}", s["chunks_per_s"], "chunks/s",
                         f"{s['gflops']} GFLOP/s = {s['vs_gemm_ceiling']}x the {s['ceiling']} GEMM ceiling{agree}"))
    for name in speed["names"]:
        s = speed[name]
        note = "" if name == "torch" else f"{s['query_speedup_vs_torch']}x faster than torch fp32"
        table.append(row(f"{s['backend']}: one-question encode latency (median of 30)", s["query_ms_median"], "ms", note))
    table.append(row("model load / export-or-load (" + ", ".join(speed["names"]) + ")",
                     " / ".join(str(speed["load_or_export_s"][k]) for k in speed["names"]), "s",
                     "an export happens once per model into the artifact cache"))
    for name, r in runs.items():
        label = "auto (the default)" if name == "auto" else VARIANTS[name][2]
        if "error" in r:
            table.append(row(f"v1 with {label}", "failed", "", r["error"][:200]))
            continue
        m = r["metrics"]
        cells = ", ".join(f"{k} {m[k]['mean']:.3f}" for k in ("recall_at_k", "mrr", "hit_at_k_id") if k in m)
        note = f"embed stage {r['timings_s'].get('embed', float('nan')):.1f} s" + (" (cached)" if r["vectors_cached"] else "")
        if name == "auto":
            note += f"; ran {r['backend']}"
        if "delta_vs_torch" in r:
            d = r["delta_vs_torch"]
            ci = r.get("delta_vs_torch_paired_ci95", {})
            note += (f"; delta vs torch fp32: recall {d.get('recall_at_k', 0):+.3f} {ci.get('recall_at_k')}, "
                     f"MRR {d.get('mrr', 0):+.3f} {ci.get('mrr')}, hit@k_id {d.get('hit_at_k_id', 0):+.3f} "
                     f"{ci.get('hit_at_k_id')} (paired 95% CI); same top-k for {r['same_topk_as_torch']:.0%} of questions, "
                     f"top-k overlap {r['topk_overlap_with_torch']:.0%}")
        table.append(row(f"v1 with {label}: {cells}", r["counts"]["questions"], "questions", note))
    # embed_speedup: the default embedder (backend: auto, as its rule picks from this run's
    # measurement) against torch fp32 in the same run.
    picked = next(n for n in speed["names"] if VARIANTS[n][2] == pick["this_run_picks"])
    result = {"speed": speed, "auto": pick, "quality": runs, "table": table, "environment": environment(),
              "embed_speedup": speed[picked]["speedup_vs_torch"],
              "embed_cosine_min_vs_torch": speed[picked]["cosine_min"],
              "embed_max_abs_diff_vs_torch": speed[picked]["max_abs_diff"]}
    table.insert(0, row(f"**embed_speedup** (the default, backend auto: {pick['this_run_picks']}, vs torch fp32)",
                        speed[picked]["speedup_vs_torch"], "x",
                        f"1 - min cosine to torch fp32: {1 - speed[picked]['cosine_min']:.1e}"))
    return finish(result, clock)
