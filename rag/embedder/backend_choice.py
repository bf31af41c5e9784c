"""Which backend computes a sentence embedder's vectors on this machine (`embedder.backend: auto`).

The candidates are the ways this process can compute the model's vectors: torch fp32 (the
reference), torch bf16 autocast where the CPU computes bf16 natively (AVX512-BF16, AMX-BF16: an
emulated bf16 is slower than fp32, so it is never a candidate there), ONNX Runtime fp32 where
onnxruntime is installed, and OpenVINO fp32 (and bf16, where native) on the same export where
openvino is installed. ONNX int8 is not one: its vectors are ~0.985 cosine from fp32's on
ordinary chunks, far outside the tolerance below, so it stays a pinned choice
(embedder=minilm_onnx_int8).

The probe (rag/embedder/probe.py) measures each candidate's rate and its agreement with fp32 on
texts the project ships; `choose` is the rule that turns those measurements into a backend: torch
fp32 unless an eligible candidate is faster by MARGIN. Everything here is pure: the facts of the
machine, the rule and its words; nothing loads a model.
"""
from __future__ import annotations

import hashlib
import importlib.util
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

# Eligibility against fp32 on the probe texts: every vector within this cosine of fp32's, and the
# probe questions' top TOP passages mostly fp32's. bf16 autocast measures 0.99997 / 0.99-1.0.
MIN_COSINE = 0.9999
MIN_OVERLAP = 0.98
TOP = 10
# "fp32's own vectors" (what the evaluation embedder requires): the ONNX fp32 export meets it
# (1 - 2e-7); bf16 does not (1 - 3e-5).
EXACT_COSINE = 1.0 - 1e-6
# A candidate replaces fp32 only when this much faster in the same probe: below it the probe's own
# noise (a shared machine, best of 3) could make the default slower than fp32.
MARGIN = 0.05
# CPU flags under which bf16 matrix multiplication runs in hardware (oneDNN uses them); arm64's
# flag is `bf16`.
BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")
LIBRARIES = ("torch", "onnxruntime", "openvino", "sentence-transformers", "transformers")


@dataclass(frozen=True, order=True)
class Candidate:
    backend: str  # torch | onnx | openvino
    precision: str  # fp32 | bf16 | int8 (onnx int8: pinned only)

    @property
    def name(self) -> str:
        return f"{self.backend} {self.precision}"


REFERENCE = Candidate("torch", "fp32")
TORCH_BF16 = Candidate("torch", "bf16")
ONNX_FP32 = Candidate("onnx", "fp32")
ONNX_INT8 = Candidate("onnx", "int8")
OPENVINO_FP32 = Candidate("openvino", "fp32")
OPENVINO_BF16 = Candidate("openvino", "bf16")


def candidate_named(name: str) -> Candidate:
    backend, precision = name.split(" ")
    return Candidate(backend, precision)


@dataclass(frozen=True)
class Measured:
    """One candidate in one probe: its rate and its agreement with torch fp32's vectors."""

    candidate: Candidate
    rate: float  # texts/s, the best of the probe's rounds
    min_cosine: float  # the lowest cosine to fp32's vector over the probe texts
    overlap: float  # mean share of fp32's top TOP passages among the candidate's, over the probe questions

    def eligible(self, exact: bool) -> bool:
        if self.candidate == REFERENCE:
            return True
        if exact:
            return self.min_cosine >= EXACT_COSINE
        return self.min_cosine >= MIN_COSINE and self.overlap >= MIN_OVERLAP

    def to_json(self) -> dict[str, Any]:
        return {"rate": round(self.rate, 2), "min_cosine": round(self.min_cosine, 8), "overlap": round(self.overlap, 4)}

    @classmethod
    def from_json(cls, name: str, d: Mapping[str, Any]) -> Measured:
        return cls(candidate_named(name), float(d["rate"]), float(d["min_cosine"]), float(d["overlap"]))


def choose(measured: Sequence[Measured], exact: bool = False, margin: float = MARGIN) -> Measured:
    """The candidate to run: the fastest eligible one when it is more than `margin` faster than torch
    fp32 in the same probe, else torch fp32 itself. `exact`: only candidates that give fp32's own
    vectors are eligible (the evaluation embedder)."""
    reference = next((m for m in measured if m.candidate == REFERENCE), None)
    if reference is None:
        raise ValueError("a probe without torch fp32 has nothing to compare with")
    best = reference
    for m in measured:
        if m.eligible(exact) and m.rate >= reference.rate * (1.0 + margin) and m.rate > best.rate:
            best = m
    return best


@dataclass(frozen=True)
class Choice:
    """The backend an embedder runs and why, in words (`line`) and as data (metrics.json)."""

    candidate: Candidate
    why: str  # what follows the backend's name in `line`
    probe: dict[str, Any] | None = None  # the measurements behind it (None: pinned, or its vectors were cached)

    @property
    def line(self) -> str:
        return f"{self.candidate.name}{self.why}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": self.candidate.backend, "precision": self.candidate.precision,
                               "line": self.line}
        if self.probe is not None:
            out["probe"] = self.probe
        return out


def explain(best: Measured, measured: Sequence[Measured], exact: bool, bf16_flag: str | None, date: str) -> str:
    """The words after the chosen backend's name: how much faster than fp32, and for fp32, why no
    other candidate was taken."""
    reference = next(m for m in measured if m.candidate == REFERENCE)

    def ratio(m: Measured) -> str:
        return f"{m.rate / reference.rate:.2f}x"

    if best.candidate != REFERENCE:
        native = f" ({bf16_flag})" if best.candidate.precision == "bf16" and bf16_flag else ""
        agree = (f"fp32's own vectors, min cosine {best.min_cosine:.7f}" if exact else
                 f"min cosine {best.min_cosine:.5f}, top-{TOP} overlap {best.overlap:.2f}")
        return f"{native}, {ratio(best)} torch fp32 ({agree}), probe {date}"
    others = []
    for m in measured:
        if m.candidate == REFERENCE:
            continue
        if not m.eligible(exact):
            need = "fp32's own vectors" if exact else f"min cosine {MIN_COSINE}, top-{TOP} overlap {MIN_OVERLAP}"
            others.append(f"{m.candidate.name} {ratio(m)} but min cosine {m.min_cosine:.5f}, "
                          f"top-{TOP} overlap {m.overlap:.2f} (needs {need})")
        else:
            others.append(f"{m.candidate.name} {ratio(m)}")
    if not others:
        return f": the only candidate on this machine, probe {date}"
    return f": no eligible candidate was {MARGIN:.0%} faster ({'; '.join(others)}), probe {date}"


# -- the machine -----------------------------------------------------------------------------------

def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags (x86 `flags`, arm64 `Features`); empty where /proc/cpuinfo is absent."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def native_bf16(flags: frozenset[str]) -> str | None:
    """The flag under which this CPU computes bf16 in hardware, or None."""
    return next((f for f in BF16_FLAGS if f in flags), None)


def onnx_available() -> bool:
    return importlib.util.find_spec("onnxruntime") is not None and importlib.util.find_spec("onnx") is not None


def openvino_available() -> bool:
    return importlib.util.find_spec("openvino") is not None


def machine_candidates(flags: frozenset[str], onnx: bool, openvino: bool = False) -> list[Candidate]:
    """What can compute the vectors here, torch fp32 first. OpenVINO runs the ONNX export, so it
    needs onnx (the exporter) as well."""
    bf16 = native_bf16(flags) is not None
    out = [REFERENCE]
    if bf16:
        out.append(TORCH_BF16)
    if onnx:
        out.append(ONNX_FP32)
    if onnx and openvino:
        out.append(OPENVINO_FP32)
        if bf16:
            out.append(OPENVINO_BF16)
    return out


def candidates_here(flags: frozenset[str]) -> list[Candidate]:
    """machine_candidates with the libraries this process can import."""
    return machine_candidates(flags, onnx_available(), openvino_available())


def machine_facts(flags: frozenset[str], threads: int) -> dict[str, Any]:
    """What a probe's result depends on besides the model: the CPU (its flags, hashed), the threads
    it ran on and the libraries' versions."""
    versions: dict[str, str | None] = {}
    for lib in LIBRARIES:
        try:
            versions[lib] = version(lib)
        except PackageNotFoundError:
            versions[lib] = None
    return {"cpu": cpu_name(), "flags": hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16],
            "bf16": native_bf16(flags), "threads": threads, "versions": versions}
