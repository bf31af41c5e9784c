"""v1..v4 and their ablations on corpora none of ragrig's fitted parts has seen: the cross-domain
bed of data/xdomain/ (PostgreSQL's manual, the Debian Administrator's Handbook, git's user manual
and how-tos; benchmarks/xdomain_data.py builds and checks it).

On each corpus, each side is `python run.py corpus=jsonl ... qa=jsonl ... llm=none
eval.latency.sample=0` in a fresh process, as a user runs it: v1, v2, v3, v4, and the ablations v2
and v3 with `retriever.source_filter.mode=none` (router off) and v3 with `reranker=none` (reranker
off: it retrieves as v2 does, a check). Retrieval is what is measured, and no answerer changes
what is retrieved: `llm=none` (the reranking benchmark's choice) gives the ranking `llm=extractive`
gives, without a pass over every question's contexts that took minutes a run on a loaded machine;
no latency sample either. Per corpus: each side's nDCG@5, MRR and
hit@5 by source id with their 95% CIs; the paired differences of CONTRASTS (every side against v1,
then v3 - v2, v2 - v2 router off, v3 - v3 router off) with paired-bootstrap CIs and sign-flip
p-values, Holm-corrected over all the corpus's cells (experiments.stats, as the sweeps' verdict);
each routed side's router accuracy and whatever else metrics.json's `routing` reports. Writes the
JSON like every family and `<work_dir>/xdomain.md`, the tables by corpus.

Opt-in (`--only xdomain`; `make bench` runs it on its own): 21 runs, each corpus embedded twice
(v4 chunks per group): 80 minutes with an empty cache on 2 cores that other jobs kept busy (load 8-35).
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from benchmarks.common import environment, finish, row, run_pipeline_subprocess, scratch_dir, start
from benchmarks.xdomain_data import ROOT, SOURCES
from experiments.aggregate import load_run
from experiments.stats import holm, paired_bootstrap
from experiments.verdict import ALPHA, question_values
from rag.store.atomic import atomic_write_text

CORPORA = tuple(sorted(SOURCES, key=lambda name: len(SOURCES[name].pages)))  # smallest first: results come sooner
ROUTER_OFF = "retriever.source_filter.mode=none"
SIDES = {  # label -> the version and its ablation
    "v1": ["+version=v1"],
    "v2": ["+version=v2"],
    "v2, router off": ["+version=v2", ROUTER_OFF],
    "v3": ["+version=v3"],
    "v3, reranker off": ["+version=v3", "reranker=none"],
    "v3, router off": ["+version=v3", ROUTER_OFF],
    "v4": ["+version=v4"],
}
COMMON = ["llm=none", "eval.latency.sample=0"]
METRICS = ("ndcg_at_k", "mrr_id", "hit_at_k_id")
LABELS = {"ndcg_at_k": "nDCG@5", "mrr_id": "MRR (source id)", "hit_at_k_id": "hit@5 (source id)"}
# (side, baseline): side - baseline, question by question. Every side against v1 (the verdict's
# view), then what each fitted part adds where it is the only difference.
CONTRASTS = (
    *((label, "v1") for label in SIDES if label != "v1"),
    ("v3", "v2"),  # the cross-encoder, on the router's candidates
    ("v2", "v2, router off"),  # the router
    ("v3", "v3, router off"),  # the router, under the cross-encoder
)
RESAMPLES = 1000
TINY_SIDES = ("v1", "v2", "v2, router off")


def bench_xdomain(quick: bool = True, full: bool = False, tiny: bool = False, overrides: list[str] | None = None,
                  work_dir: Path | None = None, corpora: list[str] | None = None) -> dict[str, Any]:
    """v1..v4, v2 and v3 with the router off and v3 with the reranker off on the cross-domain bed
    (three corpora the fitted parts never saw): nDCG@5, MRR and hit@5 with CIs, paired differences
    with Holm, the router's accuracy.

    quick and full measure the same; tiny runs v1, v2 and v2 without its router on a few
    documents and questions of the git corpus, in a cache of its own (tests the benchmark, not the
    versions)."""
    clock = start()
    with scratch_dir("xdomain") as tmp:
        work = Path(work_dir) if work_dir is not None else tmp
        base = [*COMMON, *(overrides or [])]
        sides = SIDES
        beds = {name: ROOT / name for name in (corpora or CORPORA)}
        if tiny:
            sides = {label: SIDES[label] for label in TINY_SIDES}
            beds = {"git": tiny_bed(ROOT / "git", tmp / "bed")}
            base.append(f"paths.cache={tmp / 'cache'}")
        out: dict[str, Any] = {"sides": sides, "common": base, "contrasts": [list(c) for c in CONTRASTS],
                               "corpora": {}}
        for name, bed in beds.items():
            out["corpora"][name] = run_corpus(bed, work / name, sides, base)
    out["table"] = table(out)
    out["markdown"] = markdown(out)
    if work_dir is not None:
        atomic_write_text(Path(work_dir) / "xdomain.md", out["markdown"])
    return finish(out, clock)


def tiny_bed(src: Path, dst: Path, n_questions: int = 6, n_docs: int = 12) -> Path:
    """A few of `src`'s questions (spread over its groups) with their documents and some others."""
    docs = [json.loads(line) for line in (src / "docs.jsonl").read_text(encoding="utf-8").splitlines()]
    questions = [json.loads(line) for line in (src / "questions.jsonl").read_text(encoding="utf-8").splitlines()]
    by_group: dict[str, list[dict[str, Any]]] = {}
    for q in questions:
        by_group.setdefault(q["group"], []).append(q)
    picked = [q for i in range(n_questions) for g in sorted(by_group) if i < len(by_group[g])
              for q in [by_group[g][i]]][:n_questions]
    wanted = {q["doc_id"] for q in picked}
    kept = [d for d in docs if d["id"] in wanted]
    kept += [d for d in docs if d["id"] not in wanted][: max(0, n_docs - len(kept))]
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in kept), encoding="utf-8")
    (dst / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in picked), encoding="utf-8")
    return dst


def run_dir(work: Path, label: str) -> Path:
    return work / re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")


def run_corpus(bed: Path, work: Path, sides: dict[str, list[str]], base: list[str]) -> dict[str, Any]:
    """Every side on one corpus, then the contrasts between them. A side that fails is reported
    with its error; the others still run and are compared."""
    data = ["corpus=jsonl", f"corpus.path={bed / 'docs.jsonl'}", "qa=jsonl", f"qa.path={bed / 'questions.jsonl'}"]
    runs: dict[str, dict[str, Any]] = {}
    for label, extra in sides.items():
        res = run_pipeline_subprocess([*extra, *data, *base], run_dir(work, label))
        if "error" in res:
            runs[label] = {"error": res["error"]}
            continue
        runs[label] = {
            "wall_s": res["process_wall_s"],
            "metrics": {m: res["metrics"].get(m) for m in METRICS},
            "routing": res.get("routing"),
            "counts": {k: res["counts"].get(k) for k in ("documents", "chunks", "questions")},
            "timings_s": res.get("timings_s"),
        }
    ok = [label for label in sides if "error" not in runs[label]]
    return {"runs": runs, "contrasts": contrasts({label: run_dir(work, label) for label in ok})}


def contrasts(dirs: dict[str, Path], resamples: int = RESAMPLES) -> list[dict[str, Any]]:
    """CONTRASTS between the runs in `dirs` (label -> run directory), metric by metric: the mean
    paired difference over the questions both have, its paired-bootstrap 95% CI, the sign-flip
    p-value and Holm's adjustment over every cell here (the corpus's family)."""
    records = {label: load_run(d) for label, d in dirs.items()}
    rows: list[dict[str, Any]] = []
    for side, baseline in CONTRASTS:
        if side not in records or baseline not in records:
            continue
        for m in METRICS:
            d = paired_bootstrap(question_values(records[baseline], m), question_values(records[side], m), resamples)
            rows.append({"side": side, "baseline": baseline, "metric": m, "diff": d.mean_diff, "ci_low": d.ci_low,
                         "ci_high": d.ci_high, "n": d.n, "p_value": d.p_value})
    adjusted = holm([r["p_value"] for r in rows])
    for r, p in zip(rows, adjusted):
        r["p_holm"] = None if math.isnan(p) else float(p)
        r["significant"] = r["p_holm"] is not None and r["p_holm"] < ALPHA
        r["p_value"] = None if math.isnan(r["p_value"]) else r["p_value"]
    return rows


# -- tables -----------------------------------------------------------------------------------

def _mean_ci(cell: dict[str, Any] | None) -> str:
    if not cell or cell.get("mean") is None:
        return "-"
    lo, hi = cell.get("ci95") or (None, None)
    return f"{cell['mean']:.3f}" + (f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else "")


def _diff(r: dict[str, Any]) -> str:
    mark = ("▲" if r["diff"] > 0 else "▼") if r["significant"] else ""
    return f"{mark}{r['diff']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]"


def routing_extras(routing: dict[str, Any] | None) -> dict[str, Any]:
    """What metrics.json's `routing` holds beside the accuracy, by its own keys: its scalar figures
    (a routed share, ...) and those of its nested objects (the recall lost to routing:
    `lost_recall.lost`, ...), but the per-group ones and the calibration's settings."""
    out: dict[str, Any] = {}
    for k, v in (routing or {}).items():
        if k in ("method", "accuracy", "n", "by_corpus", "calibration"):
            continue
        for key, value in (v.items() if isinstance(v, dict) else [(None, v)]):
            if isinstance(value, int | float | str | bool) or value is None:
                out[k if key is None else f"{k}.{key}"] = value
    return out


def _routing_words(routing: dict[str, Any] | None) -> str:
    if not routing or routing.get("accuracy") is None:
        return "-"
    by = ", ".join(f"{g} {v['accuracy']:.2f}" for g, v in (routing.get("by_corpus") or {}).items())
    words = f"{routing['accuracy']:.2f} ({by})"
    extras = routing_extras(routing)
    if isinstance(extras.get("routed_share"), int | float):
        words += f"; routed {extras['routed_share']:.2f} of the questions"
    lost = routing.get("lost_recall")
    if isinstance(lost, dict) and "lost" in lost:
        words += (f"; lost to routing {lost['lost']} of {lost.get('questions')} questions"
                  f" (gained {lost.get('gained')}, top {lost.get('depth')})")
    return words


def _p(p: float | None) -> str:
    return "-" if p is None else f"{p:.3g}"


def table(out: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, c in out["corpora"].items():
        for label, r in c["runs"].items():
            if "error" in r:
                rows.append(row(f"{name}: {label}", "failed", "", r["error"][-300:]))
                continue
            ndcg = r["metrics"].get("ndcg_at_k") or {}
            note = f"95% CI {_mean_ci(ndcg).split(' ', 1)[-1]}; {r['counts']['questions']} questions"
            if r.get("routing"):
                note += f"; router accuracy {_routing_words(r['routing'])}"
            rows.append(row(f"{name}: {label} nDCG@5", ndcg.get("mean"), "", note))
        for d in c["contrasts"]:
            if d["metric"] != "ndcg_at_k":
                continue
            sig = "Holm-significant" if d["significant"] else "not significant"
            rows.append(row(f"{name}: {d['side']} - {d['baseline']}, nDCG@5", d["diff"], "",
                            f"95% CI [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}], n={d['n']}, p_holm={_p(d['p_holm'])}, {sig}"))
    return rows


def markdown(out: dict[str, Any]) -> str:
    env = environment()
    lines = ["# v1..v4 on the cross-domain bed", "",
             f"{env['time']} · `python -m benchmarks --only xdomain` · {env['cpus']} CPUs · load average "
             f"{env['loadavg_1_5_15']} · every side `{' '.join(out['common'])}`", "",
             "Mean [95% CI] over the corpus's questions; Δ: paired difference from v1 [paired-bootstrap 95% CI], "
             f"▲/▼ where Holm-significant at {ALPHA} over the corpus's {len(CONTRASTS) * len(METRICS)} cells.", ""]
    for name, c in out["corpora"].items():
        first = next((r for r in c["runs"].values() if "counts" in r), None)
        size = f"{first['counts']['documents']} documents, {first['counts']['questions']} questions" if first else ""
        lines += [f"## {name} ({size})", "",
                  "| side | " + " | ".join(LABELS[m] for m in METRICS) + " | Δ nDCG@5 vs v1 | router accuracy |",
                  "|---|" + "---:|" * len(METRICS) + "---:|---|"]
        vs_v1 = {d["side"]: d for d in c["contrasts"] if d["baseline"] == "v1" and d["metric"] == "ndcg_at_k"}
        for label, r in c["runs"].items():
            if "error" in r:
                lines.append(f"| {label} | failed: `{r['error'][-200:]}` |" + " |" * (len(METRICS) + 1))
                continue
            means = [_mean_ci(r["metrics"].get(m)) for m in METRICS]
            delta = _diff(vs_v1[label]) if label in vs_v1 else "-"
            lines.append(f"| {label} | " + " | ".join(means) + f" | {delta} | {_routing_words(r.get('routing'))} |")
        lines += ["", "| difference | " + " | ".join(LABELS[m] for m in METRICS) + " |",
                  "|---|" + "---:|" * len(METRICS)]
        cells: dict[tuple[str, str], dict[str, str]] = {}
        for d in c["contrasts"]:
            cells.setdefault((d["side"], d["baseline"]), {})[d["metric"]] = _diff(d)
        for (side, baseline), by_metric in cells.items():
            lines.append(f"| {side} - {baseline} | " + " | ".join(by_metric.get(m, "-") for m in METRICS) + " |")
        lines.append("")
    return "\n".join(lines)
