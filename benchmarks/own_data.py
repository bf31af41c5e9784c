"""A user's own corpus to its verdict: `python run.py -m +version=v1,v2,v3,v4 llm=extractive` on a
corpus none of the shipped caches holds (PostgreSQL's manual from the cross-domain bed,
data/xdomain/postgresql: 147 documents, about 1,000 chunks, 57 questions), each side with an empty
artifact cache and no seed, as a new user's first sweep runs.

Two sides: `pinned`, the transformer roles on the backends they had before `backend: auto` (the
pipeline's embedder ONNX fp32, the evaluation embedder torch fp32, the cross-encoder torch fp32),
and `auto`, the defaults. Each side is two sweeps on one cache, v1,v2 and then v3,v4 (the
cross-encoder's settings exist only where it does), so the side's wall time is the two sweeps'
together (each role's backend measured on this machine; its probe's seconds are in
the first run's `load_models` and `rerank` stages). Per side: the sweep's wall seconds, the seconds
of each stage summed over the four jobs, the latency sample's share of them (it re-times
eval.latency.sample questions end to end), and whether each version's retrieval metrics agree with
the other side's to the third decimal.

Opt-in (`--only own_data`; `make bench` runs it after the cross-domain bed): about 10 minutes on 2
idle cores.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from benchmarks.common import finish, row, scratch_dir, start
from benchmarks.demo import jobs_by_variant
from benchmarks.sweeps import run_process
from benchmarks.xdomain import tiny_bed
from benchmarks.xdomain_data import ROOT
from rag.run.result import RunResult

CORPUS = "postgresql"
GROUPS: tuple[tuple[str, ...], ...] = (("v1", "v2"), ("v3", "v4"))  # without and with the cross-encoder
PINNED = ["embedder.backend=onnx", "embedder.precision=fp32", "eval.embedder.backend=torch"]
# The sweep's overrides are checked against the config before +version is applied: the reranker is
# named so that its settings are known (v3 and v4 both rerank with it).
PINNED_RERANKER = ["reranker=cross_encoder", "reranker.backend=torch", "reranker.precision=fp32"]
SIDES = ("pinned", "auto")
RETRIEVAL = ("ndcg_at_k", "mrr_id", "hit_at_k_id", "recall_at_k", "mrr")


def corpus_overrides(root: Path = ROOT, name: str = CORPUS) -> list[str]:
    return ["corpus=jsonl", f"corpus.path={root / name / 'docs.jsonl'}", "qa=jsonl",
            f"qa.path={root / name / 'questions.jsonl'}"]


def stage_sums(jobs: dict[str, RunResult]) -> dict[str, float]:
    """Each stage's seconds summed over the sweep's jobs."""
    out: dict[str, float] = {}
    for job in jobs.values():
        for stage, s in (job.timings_s or {}).items():
            out[stage] = round(out.get(stage, 0.0) + float(s), 2)
    return out


def retrieval(jobs: dict[str, RunResult]) -> dict[str, dict[str, float | None]]:
    return {v: {m: (None if (x := j.metrics.get(m)) is None else round(float(x["mean"]), 3)) for m in RETRIEVAL}
            for v, j in jobs.items()}


def bench_own_data(quick: bool = True, full: bool = False, tiny: bool = False, overrides: list[str] | None = None,
                   work_dir: Path | None = None) -> dict[str, Any]:
    """v1..v4 on a corpus of about 1,000 chunks with an empty cache: per stage, backends pinned as before `auto` and `auto`."""
    clock = start()
    with scratch_dir("own-data") as tmp:
        args, groups = ["llm=extractive"], GROUPS
        extra = list(overrides or [])
        if tiny:  # the benchmark's code on a dozen of the corpus's documents, v1 and v3 (no generator to load)
            extra = extra or corpus_overrides(tiny_bed(ROOT / CORPUS, tmp / "data" / CORPUS).parent)
            args, groups = ["llm=none", "eval.latency.sample=2", "eval.latency.repeats=1"], (("v1",), ("v3",))
        elif not any(o.startswith("corpus") for o in extra):
            extra = corpus_overrides() + extra
        work = Path(work_dir) if work_dir is not None else tmp
        versions = ",".join(v for g in groups for v in g)
        out: dict[str, Any] = {"command": " ".join(["python run.py -m", f"+version={versions}", *args, *extra]),
                               "sides": {}}
        for side in SIDES:
            cache = work / "cache"
            shutil.rmtree(cache, ignore_errors=True)  # each side starts cold
            wall, jobs = 0.0, {}
            for group in groups:
                pins = (PINNED + (PINNED_RERANKER if "v3" in group else [])) if side == "pinned" else []
                sweep_dir = work / "runs" / side / "-".join(group)
                shutil.rmtree(sweep_dir, ignore_errors=True)
                res = run_process([*args, f"+version={','.join(group)}", *pins], sweep_dir, cache, extra, multirun=True)
                wall += res["wall_s"]
                jobs.update(jobs_by_variant(sweep_dir))
            stages = stage_sums(jobs)
            total = sum(stages.values())
            out["sides"][side] = {
                "wall_s": round(wall, 2), "stages_s": stages,
                "latency_share": round(stages.get("latency", 0.0) / total, 3) if total else None,
                "retrieval": retrieval(jobs),
                "backends": {v: {role: note.get("line") for role, note in (j.backends or {}).items()}
                             for v, j in jobs.items()},
            }
        shutil.rmtree(work / "cache", ignore_errors=True)
    pinned, auto = out["sides"]["pinned"], out["sides"]["auto"]
    out["speedup"] = round(pinned["wall_s"] / auto["wall_s"], 3) if auto["wall_s"] else None
    out["same_retrieval"] = pinned["retrieval"] == auto["retrieval"]
    out["table"] = [
        row("own_data_pinned_s", pinned["wall_s"], "s", "backends pinned as before auto; empty cache"),
        row("own_data_auto_s", auto["wall_s"], "s", "the defaults (backend=auto); empty cache"),
        row("own_data_speedup", out["speedup"], "x", "pinned / auto, the same run"),
        row("latency_share_auto", auto["latency_share"], "", "the latency sample's share of the stages' seconds"),
        row("same retrieval metrics to 3 decimals", out["same_retrieval"]),
    ]
    for stage in sorted(set(pinned["stages_s"]) | set(auto["stages_s"])):
        out["table"].append(row(f"stage {stage}", auto["stages_s"].get(stage), "s",
                                f"pinned {pinned['stages_s'].get(stage)} s"))
    return finish(out, clock)
