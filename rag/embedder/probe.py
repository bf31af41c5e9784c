"""The probe behind `embedder.backend: auto`: each candidate backend's rate and its agreement with
torch fp32, measured in this process on texts the project ships (rag/embedder/backend_choice.py
turns the measurements into a choice).

Rates are measured interleaved: each round encodes the same passages with every candidate, the
order rotating from round to round, and a candidate's rate is its best round, so that a shared
machine's drifting load hits every candidate alike. Agreement is each vector's cosine to fp32's
(passages and questions) and the overlap of each question's top passages with fp32's.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rag.store.cache import ArtifactCache, make_key
from rag.config.compose import data_dir
from rag.embedder.backend_choice import REFERENCE, TOP, Candidate, Measured

# 128 passages and 32 questions: on 2 idle cores the whole probe of three candidates takes seconds
# (torch fp32 ~55 passages/s), and 32 x 10 top passages are enough to see a 2% overlap loss.
PASSAGES = 128
QUESTIONS = 32
PASSAGE_CHARS = 512  # the default chunker's size (conf/chunker/sliding_window.yaml)
SPEED_PASSAGES = 32  # encoded ROUNDS times by each candidate for its rate
ROUNDS = 3

Encode = Callable[[list[str]], np.ndarray]
PROBE_FILE = "probe.json"  # a probe's record in its cache entry


class _Measured(Protocol):
    @property
    def candidate(self) -> Candidate: ...

    def to_json(self) -> dict[str, Any]: ...


def recorded_probe(cache: ArtifactCache, kind: str, params: Mapping[str, Any],
                   run: Callable[[], Sequence[_Measured]], fields: Mapping[str, Any]) -> dict[str, Any]:
    """A probe's record, measured by `run` once per `params` (what its result depends on, `machine`
    among them) and kept in `cache` under `kind`; parallel jobs wait for one. The record holds the
    date, the machine, `fields`, the seconds it took and each candidate's measurements."""

    def build(tmp: Path) -> dict[str, Any]:
        t0 = time.perf_counter()
        measured = run()
        record = {"date": time.strftime("%Y-%m-%d"), "machine": params["machine"], **fields,
                  "seconds": round(time.perf_counter() - t0, 1),
                  "candidates": {m.candidate.name: m.to_json() for m in measured}}
        (tmp / PROBE_FILE).write_text(json.dumps(record, indent=2))
        return {}

    art = cache.get_or_build(kind, make_key(kind, params), build, inputs=params)
    return dict(json.loads(art.file(PROBE_FILE).read_text()))


def probe_file() -> Path:
    return data_dir() / "pubmedqa" / "ori_pqal.json"


def probe_texts(passages: int | None = None, questions: int | None = None) -> tuple[list[str], list[str]]:
    """The probe's passages (the first two PASSAGE_CHARS windows of each PubMedQA abstract, in the
    file's order; PASSAGES of them) and questions (those of the first QUESTIONS abstracts). OSError
    or ValueError when the shipped file is missing or unreadable."""
    passages = PASSAGES if passages is None else passages
    questions = QUESTIONS if questions is None else questions
    records = list(json.loads(probe_file().read_text(encoding="utf-8")).values())
    out: list[str] = []
    for rec in records:
        text = " ".join(rec["CONTEXTS"])
        out.extend(text[i : i + PASSAGE_CHARS] for i in range(0, min(len(text), 2 * PASSAGE_CHARS), PASSAGE_CHARS))
        if len(out) >= passages:
            break
    return out[:passages], [str(rec["QUESTION"]) for rec in records[:questions]]


def _unit(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, np.float64)
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


def top_overlap(q_ref: np.ndarray, p_ref: np.ndarray, q: np.ndarray, p: np.ndarray, top: int = TOP) -> float:
    """Mean share of each question's `top` passages under the reference vectors that are also
    among its `top` under the other vectors."""
    top = min(top, len(p_ref))
    a = np.argsort(-(_unit(q_ref) @ _unit(p_ref).T), axis=1, kind="stable")[:, :top]
    b = np.argsort(-(_unit(q) @ _unit(p).T), axis=1, kind="stable")[:, :top]
    return float(np.mean([len(set(x) & set(y)) / top for x, y in zip(a, b)]))


def measure(encoders: Mapping[Candidate, Encode], passages: list[str], questions: list[str],
            rounds: int | None = None, speed_passages: int | None = None) -> list[Measured]:
    """Each candidate's rate (passages/s, best of `rounds` interleaved rounds over the first
    `speed_passages` passages; ROUNDS, SPEED_PASSAGES) and agreement with torch fp32 (which
    `encoders` must hold)."""
    rounds = ROUNDS if rounds is None else rounds
    speed_passages = SPEED_PASSAGES if speed_passages is None else speed_passages
    if REFERENCE not in encoders:
        raise ValueError("the probe compares with torch fp32, which is not among the candidates")
    names = list(encoders)
    speed = passages[:speed_passages]
    for encode in encoders.values():
        encode(passages[:2])  # first-call allocations and lazy initialisation, untimed
    best = dict.fromkeys(names, float("inf"))
    first: dict[Candidate, np.ndarray] = {}
    for r in range(rounds):
        for c in names[r % len(names):] + names[: r % len(names)]:
            t0 = time.perf_counter()
            vecs = encoders[c](speed)
            best[c] = min(best[c], time.perf_counter() - t0)
            first.setdefault(c, vecs)
    p_vecs = {c: np.concatenate([first[c], encoders[c](passages[speed_passages:])]) for c in names}
    q_vecs = {c: encoders[c](questions) for c in names}
    ref_all = _unit(np.concatenate([p_vecs[REFERENCE], q_vecs[REFERENCE]]))
    out = []
    for c in names:
        cos = (ref_all * _unit(np.concatenate([p_vecs[c], q_vecs[c]]))).sum(1)
        overlap = top_overlap(q_vecs[REFERENCE], p_vecs[REFERENCE], q_vecs[c], p_vecs[c])
        out.append(Measured(c, len(speed) / best[c], float(cos.min()), overlap))
    return out
