"""v3's reranker against v2, reproducibly: the cross-encoder recipe of conf/reranker/cross_encoder.yaml
is built (or found) by `python -m rag.reranker.training`, then v2, v3 as shipped (the trained
cross-encoder) and v3 with `reranker=mmr` (its earlier default) each run as `python run.py ...
llm=none` on the dev slice and on the held-out set (`qa=heldout`, every question); each v3 is
compared with v2 question by question (paired bootstrap 95% CIs, Holm over the cells of one
question set), as `python -m experiments.compare` would. This is the measurement behind the
README's versions section and docs/explanation/cross_encoder.md; it decides v3's default reranker.

Opt-in (`--only reranking`): training takes about 3.5 minutes on 2 cores when the model is not
cached, and reranking 382 questions with the cross-encoder about 2.5 more.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.aggregate import load_records
from benchmarks.common import (
    finish,
    row,
    run_pipeline_subprocess,
    run_python,
    scratch_dir,
    start,
    tiny_dataset,
)
from experiments.verdict import compare

# label: (overrides, whether the side reranks with the trained cross-encoder and so takes the
# model's own overrides)
SIDES = {
    "v2": (["+version=v2"], False),
    "v3 (MMR)": (["+version=v3", "reranker=mmr"], False),
    "v3 (cross-encoder)": (["+version=v3"], True),
}
QUESTION_SETS = {
    "dev": [],  # the default slice: 50 questions per corpus
    "heldout": ["qa=heldout", "slice.questions_per_corpus=null"],
}
METRICS = ("mrr_id", "mrr", "ndcg_at_k", "map_at_k", "recall_at_k_label", "hit_at_k_id")
COMMON = ["llm=none"]
# tiny: a cross-encoder trained in seconds on the tiny corpus (tests the benchmark, not v3).
TINY_TRAIN = ["reranker.train.corpus=${corpus}", "reranker.train.queries={labelled: 0, templates: 0, mined: 12, generated: 0}",
              "reranker.train.max_length=32", "reranker.train.val_queries=4", "reranker.train.val_fraction=0.25",
              "reranker.train.chunk_size=200", "reranker.train.chunk_overlap=30", "reranker.max_length=64"]


def bench_reranking(quick: bool = True, full: bool = False, tiny: bool = False, overrides: list[str] | None = None,
                    work_dir: Path | None = None) -> dict[str, Any]:
    """v3 with MMR and v3 with the trained cross-encoder against v2, on the dev slice and the
    held-out set: paired differences with 95% CIs, rerank latency, training time.

    quick and full measure the same; tiny trains a seconds-long model on a dozen abstracts."""
    clock = start()
    with scratch_dir("reranking") as tmp:
        work = Path(work_dir) if work_dir is not None else Path(tmp)
        base, model = [*COMMON, *(overrides or [])], []  # model: the cross-encoder side's own overrides
        sets = QUESTION_SETS
        if tiny:
            base, model = [*base, *tiny_dataset(Path(tmp) / "data"), f"paths.cache={Path(tmp) / 'cache'}"], TINY_TRAIN
            sets = {"dev": []}
        out: dict[str, Any] = {"overrides": base, "training": train_model([*base, *model])}
        out["sets"] = {name: compare_sides(work / name, [*base, *extra], model) for name, extra in sets.items()}
    out["table"] = table(out)
    return finish(out, clock)


def train_model(overrides: list[str]) -> dict[str, Any]:
    """`python -m rag.reranker.training` with the run's overrides: found in the cache or trained."""
    done, wall = run_python(["-m", "rag.reranker.training", *overrides])
    if done.returncode != 0:
        raise RuntimeError(f"python -m rag.reranker.training: exit {done.returncode}: {done.stderr.strip()[-1200:]}")
    status = next((line for line in done.stdout.splitlines() if line.startswith("cross-encoder ")), "")
    return {"wall_s": round(wall, 1), "hit": "found in cache" in status, "status": status}


def compare_sides(work: Path, overrides: list[str], model: list[str]) -> dict[str, Any]:
    """Every side on one question set, each v3 against v2."""
    runs: dict[str, dict[str, Any]] = {}
    for label, (extra, trained) in SIDES.items():
        res = run_pipeline_subprocess([*extra, *overrides, *(model if trained else [])], run_dir(work, label))
        if "error" in res:
            raise RuntimeError(f"{label}: {res['error']}")
        runs[label] = {"reranker": res["config"]["reranker"]["_target_"], "wall_s": res["process_wall_s"],
                       "rerank_s": res["timings_s"].get("rerank"),
                       "rerank_ms_median": res["latency"].get("rerank_ms_median"),
                       "rerank_ms_p95": res["latency"].get("rerank_ms_p95"),
                       "questions": res["counts"].get("questions"),
                       "metrics": {m: res["metrics"].get(m) for m in METRICS}}
    records = load_records([run_dir(work, label) for label in SIDES])
    labels = list(SIDES)
    cmp = compare(records, labels, list(METRICS), base=0)
    diffs = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()
              if k in ("label", "metric", "diff", "ci_low", "ci_high", "n", "p_holm", "significant")}
             for r in cmp.table.to_dict("records")]
    return {"runs": runs, "diffs": diffs, "n_tests": cmp.n_tests}


def run_dir(work: Path, label: str) -> Path:
    return work / "".join(c if c.isalnum() else "_" for c in label)


def table(out: dict[str, Any]) -> list[dict[str, Any]]:
    t = out["training"]
    rows = [row("cross-encoder training (python -m rag.reranker.training)", t["wall_s"], "s",
                "found in the cache" if t["hit"] else "trained in this run")]
    for name, s in out["sets"].items():
        for d in s["diffs"]:
            sig = "Holm-significant" if d["significant"] else "not significant"
            rows.append(row(f"{name}: {d['label']} - v2, {d['metric']}", d["diff"], "",
                            f"95% CI [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}], n={d['n']}, {sig}"))
        for label, r in s["runs"].items():
            if r["rerank_ms_median"] is not None:
                rows.append(row(f"{name}: {label} rerank latency p50 / p95", r["rerank_ms_median"], "ms",
                                f"p95 {r['rerank_ms_p95']} ms; {r['questions']} questions"))
    return rows
