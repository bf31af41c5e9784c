"""Synthetic 4-version and 9-job grid sweeps, reported with today's chart code."""
import json, shutil, sys
from pathlib import Path
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from eval.stats import bootstrap_ci
from experiments.aggregate import load_records
from experiments.report import ReportSettings
from experiments.report_files import build_report

CORPORA = ("libc", "pubmed", "scifact")


def agg(v):
    v = np.asarray(v, float)
    lo, hi = bootstrap_ci(v, 300, seed=0)
    return {"mean": float(v.mean()), "ci95": [lo, hi], "n": len(v)}


def write_run(path, variant, overrides, values, latency, job, corpora):
    path.mkdir(parents=True, exist_ok=True)
    n = len(latency)
    metrics = {m: agg(v) for m, v in values.items()}
    by_corpus = {c: {m: agg([v[i] for i in range(n) if corpora[i] == c]) for m, v in values.items()} for c in CORPORA}
    config = {"variant": variant, "objective": "mrr", "eval": {"k": 5, "bootstrap": {"resamples": 300, "seed": 0}},
              "chunker": {"_target_": "rag.chunker.SlidingWindowChunker", "chunk_size": 512, "chunk_overlap": 64},
              "fusion": {"_target_": "rag.retriever.fusion.WeightedFusion", "alpha": 0.5}}
    for o in overrides:
        key, _, val = o.lstrip("+").partition("=")
        node = config
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = json.loads(val) if val.replace(".", "", 1).isdigit() else val
    doc = {"variant": variant, "objective": {"name": "mrr", "value": metrics["mrr"]["mean"]}, "metrics": metrics,
           "by_corpus": by_corpus, "counts": {"questions": n, "chunks": 100},
           "latency": {"retrieve_ms_median": float(np.median(latency)), "total_ms_median": float(np.median(latency)) + 400},
           "timings_s": {"retrieve": 0.1, "score": 0.2}, "artifacts": {}, "config": config}
    (path / "metrics.json").write_text(json.dumps(doc))
    rows = []
    for i in range(n):
        r = {"id": f"q{i}", "corpus": corpora[i], **{m: float(v[i]) for m, v in values.items()}}
        r["latency_ms"] = {"retrieve": latency[i] * 0.6, "rerank": latency[i] * 0.4}
        rows.append(r)
    (path / "per_question.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / ".hydra").mkdir(exist_ok=True)
    (path / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    mode = "MULTIRUN" if job is not None else "RUN"
    (path / ".hydra" / "hydra.yaml").write_text(
        f"hydra:\n  mode: {mode}\n  job:\n    num: {job if job is not None else '???'}\n"
        "  runtime:\n    choices:\n      chunker: sliding_window\n")


def values_for(rng, n, quality, base):
    mrr = np.clip(base + quality + rng.normal(0, 0.12, n), 0, 1)
    rec = (mrr > 0.35).astype(float)
    hit = (rng.uniform(0, 1, n) < 0.97 + 0.03 * (quality > 0.05)).astype(float)
    mrr_id = np.clip(hit * (0.7 + 0.3 * rng.uniform(0, 1, n)), 0, 1)
    ans = np.clip(0.55 + 0.5 * quality + rng.normal(0, 0.1, n), 0, 1)
    hall = (rng.uniform(0, 1, n) < 0.3 - 1.5 * quality).astype(float)
    return {"recall_at_k": rec, "mrr": mrr, "hit_at_k_id": hit, "mrr_id": mrr_id, "answer_gt": ans,
            "hallucination": hall}


def versions(root):
    rng = np.random.default_rng(1)
    n = 90
    base = rng.uniform(0, 0.8, n)
    corpora = [CORPORA[i % 3] for i in range(n)]
    for j, (v, q, lat) in enumerate((("v1", 0.0, 40), ("v2", 0.12, 180), ("v3", 0.05, 60), ("v4", -0.06, 35))):
        write_run(root / v, v, [f"+version={v}"], values_for(rng, n, q, base), rng.gamma(4, lat / 4, n), j, corpora)
    (root / "multirun.yaml").write_text("hydra: {}\n")


def grid(root):
    rng = np.random.default_rng(2)
    n = 30
    base = rng.uniform(0, 0.8, n)
    corpora = [CORPORA[i % 3] for i in range(n)]
    job = 0
    for cs in (256, 512, 1024):
        for alpha in (0.3, 0.5, 0.7):
            q = 0.03 * (alpha - 0.5) + rng.normal(0, 0.02)  # noise: no cell differs
            if (cs, alpha) == (512, 0.7):
                q = 0.2  # one cell really better
            ov = [f"chunker.chunk_size={cs}", "retriever=hybrid", f"fusion.alpha={alpha}"]
            write_run(root / str(job), "custom", ov, values_for(rng, n, q, base), rng.gamma(4, (20 + cs / 20) / 4, n),
                      job, corpora)
            job += 1
    (root / "multirun.yaml").write_text("hydra: {}\n")


def main(dest):
    dest = Path(dest)
    for name, make in (("versions", versions), ("grid", grid)):
        work = Path("/tmp/charts/work") / name
        shutil.rmtree(work, ignore_errors=True)
        make(work / "sweep")
        build_report(load_records([work / "sweep"]), work / "out", ReportSettings(html=False, formats=("png",)))
        out = dest / name
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(work / "out" / "charts", out)
        print(name, sorted(p.name for p in out.iterdir()))


if __name__ == "__main__":
    main(sys.argv[1])
