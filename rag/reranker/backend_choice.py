"""Which backend computes the cross-encoder's logits on this machine (`reranker.backend: auto`).

The candidates are the embedders' (rag/embedder/backend_choice.py): torch fp32 (the reference),
torch bf16 autocast where the CPU computes bf16 natively, ONNX Runtime fp32 where onnxruntime is
installed, and OpenVINO fp32 (bf16 where native) on the same export. What "exact enough" means
differs: a reranker is judged by the order it gives, so a candidate is eligible when each probe
question's top TOP candidates are, on average over the questions, at least MIN_OVERLAP fp32's top
TOP. The probe scores a fixed pool of passages for each of a few questions the project ships
(PubMedQA's, read by rag.embedder.probe) with every candidate, interleaved, and the choice is torch fp32 unless an eligible candidate is faster by MARGIN.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rag.embedder.backend_choice import MARGIN, REFERENCE, Candidate, candidate_named

TOP = 5
MIN_OVERLAP = 0.98
POOL = 20  # passages a question's pool holds, as reranker.top_n's default
QUESTIONS = 6  # 120 pairs, a few seconds per candidate on 2 cores; one top-5 swap in 30 places fails MIN_OVERLAP
SPEED_QUESTIONS = 1  # scored ROUNDS times by every candidate for its rate
ROUNDS = 3

Score = Callable[[list[tuple[str, str]]], np.ndarray]


@dataclass(frozen=True)
class Measured:
    """One candidate in one probe: its rate (pairs/s) and how much of fp32's top TOP it keeps."""

    candidate: Candidate
    rate: float
    overlap: float  # mean share of fp32's top TOP among the candidate's, over the probe questions
    max_diff: float  # the largest absolute difference of a logit from fp32's

    @property
    def eligible(self) -> bool:
        return self.candidate == REFERENCE or self.overlap >= MIN_OVERLAP

    def to_json(self) -> dict[str, Any]:
        return {"rate": round(self.rate, 2), "overlap": round(self.overlap, 4), "max_diff": float(f"{self.max_diff:.3g}")}

    @classmethod
    def from_json(cls, name: str, d: Mapping[str, Any]) -> Measured:
        return cls(candidate_named(name), float(d["rate"]), float(d["overlap"]), float(d["max_diff"]))


def probe_pairs(passages: Sequence[str], questions: Sequence[str], pool: int = POOL) -> list[list[tuple[str, str]]]:
    """For each question, its pool: `pool` consecutive passages from the ones near its own abstract
    (PubMedQA gives each abstract up to two passages, in the questions' order), so that each pool
    holds the question's own passages among others of the same kind."""
    out = []
    for i, q in enumerate(questions):
        start = min(2 * i, max(len(passages) - pool, 0))
        out.append([(q, p) for p in passages[start:start + pool]])
    return out


def _top(scores: np.ndarray, top: int) -> set[int]:
    return set(np.argsort(-scores, kind="stable")[:top].tolist())


def measure(scorers: Mapping[Candidate, Score], pools: list[list[tuple[str, str]]],
            rounds: int = ROUNDS, speed_questions: int = SPEED_QUESTIONS) -> list[Measured]:
    """Each candidate's rate (best of `rounds` interleaved rounds over the first `speed_questions`
    pools, the order rotating) and its agreement with torch fp32 (which `scorers` must hold) over
    every pool."""
    if REFERENCE not in scorers:
        raise ValueError("the probe compares with torch fp32, which is not among the candidates")
    names = list(scorers)
    speed = [pair for p in pools[:speed_questions] for pair in p]
    for score in scorers.values():
        score(speed[:2])  # first-call allocations and lazy initialisation, untimed
    best = dict.fromkeys(names, float("inf"))
    for r in range(rounds):
        for c in names[r % len(names):] + names[: r % len(names)]:
            t0 = time.perf_counter()
            scorers[c](speed)
            best[c] = min(best[c], time.perf_counter() - t0)
    logits = {c: [np.asarray(scorers[c](p), np.float64) for p in pools] for c in names}
    ref = logits[REFERENCE]
    out = []
    for c in names:
        overlap = float(np.mean([len(_top(a, TOP) & _top(b, TOP)) / min(TOP, len(a)) for a, b in zip(ref, logits[c])]))
        diff = max(float(np.max(np.abs(a - b))) for a, b in zip(ref, logits[c]))
        out.append(Measured(c, len(speed) / best[c], overlap, diff))
    return out


def choose(measured: Sequence[Measured], margin: float = MARGIN) -> Measured:
    """The fastest eligible candidate when more than `margin` faster than torch fp32 in the same
    probe, else torch fp32."""
    reference = next((m for m in measured if m.candidate == REFERENCE), None)
    if reference is None:
        raise ValueError("a probe without torch fp32 has nothing to compare with")
    best = reference
    for m in measured:
        if m.eligible and m.rate >= reference.rate * (1.0 + margin) and m.rate > best.rate:
            best = m
    return best


def explain(best: Measured, measured: Sequence[Measured], bf16_flag: str | None, date: str) -> str:
    """The words after the chosen backend's name: how much faster than fp32 and how close, or why
    no other candidate was taken."""
    reference = next(m for m in measured if m.candidate == REFERENCE)

    def ratio(m: Measured) -> str:
        return f"{m.rate / reference.rate:.2f}x"

    if best.candidate != REFERENCE:
        native = f" ({bf16_flag})" if best.candidate.precision == "bf16" and bf16_flag else ""
        return (f"{native}, {ratio(best)} torch fp32 (top-{TOP} overlap {best.overlap:.2f}, logits within "
                f"{best.max_diff:.2g}), probe {date}")
    others = []
    for m in measured:
        if m.candidate == REFERENCE:
            continue
        if m.eligible:
            others.append(f"{m.candidate.name} {ratio(m)}")
        else:
            others.append(f"{m.candidate.name} {ratio(m)} but top-{TOP} overlap {m.overlap:.2f} (needs {MIN_OVERLAP})")
    if not others:
        return f": the only candidate on this machine, probe {date}"
    return f": no eligible candidate was {MARGIN:.0%} faster ({'; '.join(others)}), probe {date}"
