"""Per-question latency, measured by the job that reports it.

A run retrieves every question through the candidates kept in memory (rag.retriever), so the jobs
of a sweep that differ only downstream of retrieval search once. Their latencies must not come
from that memory: a number measured by the job that filled it, copied into every later job, is what
made a 3x3 chunk x alpha sweep report one noisy figure per chunk size. So each run times a
sample of its questions again, after the main pass:

- warm: `warmup` questions are searched and reranked first, untimed (code paths, allocator,
  filter masks and FAISS selectors, the query encoder's first call);
- fresh: every timed search searches anew (`rag.run.query.retrieve_rerank(..., reuse=False)`);
- repeated: each sampled question `repeats` times; its latency is the median of its repeats;
- reported as the median and 95th percentile over the sampled questions, with the sample size,
  repeats and warm-up written beside them (`latency_method` in metrics.json).

The sample is spread evenly over the question list (which is grouped by corpus, so every corpus
is represented). It is a cost/precision balance: every job of a sweep pays for it, and a sweep
whose jobs only refuse should cost little more than one run (docs/reference/bench.md).

Generation is batched: a question's generation latency is its share of its batch's wall time,
reported only when this run generated the answers. Answers reused from the cache were timed by the
run that made them, so no generation latency is reported for them.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rag.run.query import retrieve_rerank
from rag.reranker.base import Reranker
from rag.retriever.base import Retriever
from rag.retriever.source_filter import SourceFilter
from rag.types import Chunk, RagError


@dataclass(frozen=True)
class LatencySettings:
    sample: int | None = 16  # questions timed (None: every question; 0: none, no latency is reported)
    repeats: int = 2
    warmup: int = 2

    def __post_init__(self) -> None:
        if self.sample is not None and int(self.sample) < 0:
            raise RagError(f"eval.latency.sample must be >= 0 (null: every question, 0: none), got {self.sample}")
        if int(self.repeats) < 1:
            raise RagError(f"eval.latency.repeats must be >= 1, got {self.repeats}")
        if int(self.warmup) < 0:
            raise RagError(f"eval.latency.warmup must be >= 0, got {self.warmup}")

    @classmethod
    def from_config(cls, node: Mapping[str, Any] | None) -> LatencySettings:
        node = dict(node or {})
        unknown = set(node) - {"sample", "repeats", "warmup"}
        if unknown:
            raise RagError(f"eval.latency: unknown key(s) {sorted(unknown)}; known: sample, repeats, warmup")
        return cls(**node)


def sample_rows(n: int, sample: int | None) -> np.ndarray:
    """`sample` row numbers spread evenly over 0..n-1 (all of them when sample is None or >= n)."""
    if sample is None or sample >= n:
        return np.arange(n)
    if sample == 0:
        return np.arange(0)
    return np.unique(np.linspace(0, n - 1, int(sample)).round().astype(int))


def measure(retriever: Retriever, reranker: Reranker, queries: list[str], filters: list[SourceFilter], depth: int,
            chunks: Sequence[Chunk], k: int, settings: LatencySettings) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, Any]]:
    """(sampled rows, {"retrieve": ms, "rerank": ms} per sampled row, how it was measured)."""
    rows = sample_rows(len(queries), settings.sample)

    def once(i: int) -> tuple[float, float]:
        return retrieve_rerank(retriever, reranker, queries[i], filters[i], depth, chunks, k, reuse=False)[1:]

    for i in rows[: settings.warmup]:
        once(int(i))
    times = np.zeros((len(rows), settings.repeats, 2))
    for r in range(settings.repeats):  # rounds over the sample, so a burst of load hits every question alike
        for j, i in enumerate(rows):
            times[j, r] = once(int(i))
    med = np.median(times, axis=1)
    if len(rows) == 0:
        return rows, {"retrieve": np.zeros(0), "rerank": np.zeros(0)}, {"measured": "off (eval.latency.sample=0)"}
    method = {
        "measured": "in this run, after its main pass: fresh searches (memo bypassed), warm, repeated",
        "questions": len(rows),
        "of_questions": len(queries),
        "repeats": settings.repeats,
        "warmup": int(min(settings.warmup, len(rows))),
        "per_question": f"median of {settings.repeats} repeat(s)",
    }
    return rows, {"retrieve": med[:, 0], "rerank": med[:, 1]}, method


def summary(stages: Mapping[str, np.ndarray | None]) -> dict[str, float]:
    """Median and 95th percentile per stage and of their per-question sum, in milliseconds. NaN
    marks a question a stage did not time (e.g. not in the answered sample): it is left out of
    that stage, and the total covers the questions every reported stage timed."""
    out: dict[str, float] = {}
    present = {k: np.asarray(v, float) for k, v in stages.items() if v is not None and np.any(~np.isnan(v))}
    if not present:
        return out
    total = functools.reduce(np.add, present.values())  # per question, over the stages
    for name, ms in {**present, "total": total}.items():
        ms = ms[~np.isnan(ms)]
        if len(ms) == 0:
            continue
        out[f"{name}_ms_median"] = round(float(np.median(ms)), 3)
        out[f"{name}_ms_p95"] = round(float(np.percentile(ms, 95)), 3)
    return out
