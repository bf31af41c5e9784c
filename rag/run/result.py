"""The result of one run: metrics.json, typed.

`rag.run.pipeline.run` builds a `RunResult` and writes `to_json()` as metrics.json; everything that
reads a run back (the sweep summary, MLflow tracking, charts, benchmarks) goes through
`RunResult.from_json` and `flatten`, so the column names of a run's flat row are decided here and
nowhere else.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class _Absent:
    """`qa_split` needs three states: null (no split) is written by today's runs, while runs from
    before qa_split existed have no key at all, and metrics.json must round-trip byte for byte."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()

# Every metrics.json ever written has these; the others came later (or appear only sometimes).
REQUIRED = ("variant", "objective", "metrics", "by_corpus", "counts", "latency", "timings_s", "artifacts", "config")
# metrics.json's key order, which pipeline.run has always kept; optional keys slot in where it put them.
KEY_ORDER = ("variant", "objective", "metrics", "by_corpus", "counts", "slice", "qa_split", "latency", "latency_method",
             "usage", "stopped_answers", "compression", "timings_s", "artifacts", "backends", "config", "routing", "provenance", "fitted")
NAN = float("nan")


@dataclass(frozen=True)
class Objective:
    name: str
    value: float | None  # None when the objective is a judge metric nothing could measure


@dataclass(frozen=True)
class RunResult:
    """metrics.json's top-level keys. Frozen, but the dicts inside are shared with the document
    it was read from (copying a run's config for every row of a summary buys nothing)."""

    variant: str
    objective: Objective
    metrics: dict[str, dict[str, Any]]  # metric -> {"mean", "ci95": [lo, hi], "n", ...judge notes}
    by_corpus: dict[str, dict[str, dict[str, Any]]]  # corpus -> metric -> as in `metrics`
    counts: dict[str, int]
    latency: dict[str, float]
    timings_s: dict[str, float]
    artifacts: dict[str, Any]
    config: dict[str, Any]
    qa_split: Any = ABSENT  # None: the whole question set; ABSENT: a run from before the key
    latency_method: dict[str, Any] | None = None  # None: absent (runs before it was recorded)
    usage: dict[str, Any] | None = None  # None: absent (no usage was recorded)
    routing: dict[str, Any] | None = None  # None: absent (no router)
    compression: dict[str, Any] | None = None  # None: absent (compressor=none)
    # What the slice kept of each input: {"questions" | "documents" | "answered_questions":
    # {"kept": 50, "of": 60, "setting": "slice.questions_per_corpus", "value": 50}} (value null:
    # everything kept; "answered_questions" only when answers were generated). None: absent (runs
    # from before it was recorded). rag.corpus.slicing.Kept writes and reads each entry.
    slice: dict[str, dict[str, Any]] | None = None
    # Where the questions and the relevance labels came from: {"questions": {"human", "generated",
    # "generators"}, "labels": {"source": "qa" | "llm", ...}} (rag.run.provenance). None: absent (runs
    # from before it was recorded, read as human questions with the question file's labels).
    provenance: dict[str, Any] | None = None
    # The run's fitted parts, when some was fitted on corpora other than this run's: {"corpus":
    # {"name", "documents"}, "parts": {"reranker" | "router" | "chunker": {"on": [{"name",
    # "fingerprint", "documents"}], "this_corpus", ...}}, "check": the ablation sweep's command}
    # (rag.run.fitted). None: absent (every part fitted on this corpus, or a run from before it was recorded).
    fitted: dict[str, Any] | None = None
    # How many answers stopped at the generator's token limit: {"stopped": 6, "of": 6, "setting":
    # "llm.max_tokens", "value": 64} (rag.llm.base.Stopped). None: absent (no answers, a generator
    # without a limit, or a run from before it was recorded).
    stopped_answers: dict[str, Any] | None = None
    # Which backend computed each local embedder role's vectors and the cross-encoder's logits, and
    # why: {"embedder" | "eval.embedder" | "reranker": {"backend", "precision", "line", "probe"?}}
    # (rag.embedder.backend_choice, rag.reranker.backend_choice).
    # None: absent (no such role, or a run from before it was recorded).
    backends: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys this code does not know, kept as read

    # -- reading and writing --------------------------------------------------------------------

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RunResult:
        """A metrics.json document (parsed). ValueError when it is not one: a dry run's plan, or
        a document missing what every run writes."""
        if not isinstance(doc, Mapping):
            # ValueError, as for bad JSON: readers treat both as an unreadable metrics.json
            raise ValueError(f"a run's result is a JSON object, not {type(doc).__name__}")  # noqa: TRY004
        if "dry_run" in doc:
            raise ValueError("a dry run's plan (llm.dry_run=true), not a run's result")
        missing = [k for k in REQUIRED if k not in doc]
        if missing:
            raise ValueError(f"not a run's result: no {', '.join(missing)}")
        obj = doc["objective"]
        if not isinstance(obj, Mapping) or "name" not in obj or "value" not in obj:
            raise ValueError(f"not a run's result: objective must have a name and a value, got {obj!r}")
        return cls(
            variant=doc["variant"], objective=Objective(obj["name"], obj["value"]),
            **{k: doc[k] for k in REQUIRED[2:]},
            qa_split=doc.get("qa_split", ABSENT),
            latency_method=doc.get("latency_method"), usage=doc.get("usage"), routing=doc.get("routing"),
            compression=doc.get("compression"), slice=doc.get("slice"), provenance=doc.get("provenance"),
            fitted=doc.get("fitted"), stopped_answers=doc.get("stopped_answers"),
            backends=doc.get("backends"),
            extra={k: v for k, v in doc.items() if k not in KEY_ORDER},
        )

    @classmethod
    def read(cls, path: Path | str) -> RunResult:
        """metrics.json at `path` (OSError, ValueError when unreadable or not a result)."""
        return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")))

    def to_json(self) -> dict[str, Any]:
        """The metrics.json document, keys in the order pipeline.run has always written them."""
        absent = {"qa_split": self.qa_split is ABSENT, "latency_method": self.latency_method is None,
                  "usage": not self.usage, "routing": self.routing is None,  # usage: never written empty
                  "compression": not self.compression, "slice": self.slice is None,
                  "provenance": self.provenance is None, "fitted": self.fitted is None,
                  "stopped_answers": self.stopped_answers is None, "backends": self.backends is None}
        doc = {key: getattr(self, key) for key in KEY_ORDER if not absent.get(key, False)}
        doc["objective"] = {"name": self.objective.name, "value": self.objective.value}  # keeps its place
        return {**doc, **self.extra}

    # -- one flat row ---------------------------------------------------------------------------

    def flatten(self, metric_names: Iterable[str] | None = None, *, with_n: bool = True) -> dict[str, Any]:
        """The run as one flat row (the sweep summary's columns; MLflow's metrics):
        objective (its name), objective_value; per metric `m`, `m`, `m_ci_low`, `m_ci_high` and
        `m_n` (`with_n`); `<corpus>/<m>` (means); `latency_<key>`; `n_<count>`; `t_<stage>_s`; per
        model role behind a server `<role>_requests` and `cost_<role>`, and `cost_total`.
        `metric_names`: the metric columns (a set of runs shares them; one the run lacks is NaN,
        n 0); default: the run's own."""
        row: dict[str, Any] = {"objective": self.objective.name, "objective_value": self.objective.value}
        row.update(metric_columns(self.metrics, self.metrics if metric_names is None else metric_names, with_n))
        for corpus, per in self.by_corpus.items():
            for name, agg in per.items():
                row[f"{corpus}/{name}"] = agg["mean"]
        row.update({f"latency_{k}": v for k, v in self.latency.items()})
        row.update({f"n_{k}": v for k, v in self.counts.items()})
        row.update({f"t_{stage}_s": s for stage, s in self.timings_s.items()})
        roles = {role: u for role, u in (self.usage or {}).items() if isinstance(u, dict)}
        for role, u in roles.items():
            row[f"{role}_requests"] = u.get("requests_sent")
            row[f"cost_{role}"] = u.get("cost")
        if self.compression:
            row["compression_removed_share"] = self.compression.get("chars_removed_share")
            row["compression_fallbacks"] = self.compression.get("fallback_questions")
        if self.routing:  # the router's accuracy, the share it filtered, the questions that filter lost
            row["routing_accuracy"] = self.routing.get("accuracy")
            row["routing_routed_share"] = self.routing.get("routed_share")
            row["routing_lost_recall"] = (self.routing.get("lost_recall") or {}).get("lost")
        if roles:
            row["cost_total"] = sum(float(u.get("cost") or 0.0) for u in roles.values())
            row["currency"] = (self.usage or {}).get("currency")
        return row

    @staticmethod
    def unfinished_row(metric_names: Iterable[str], objective: str = "") -> dict[str, Any]:
        """The row of a run that left no result (failed, killed): `flatten`'s leading columns,
        empty."""
        return {"objective": objective, "objective_value": NAN, **metric_columns({}, metric_names)}

    @property
    def k(self) -> Any:
        """eval.k of the run ("k" when its config does not say)."""
        return (self.config.get("eval") or {}).get("k", "k")


def metric_columns(aggregates: Mapping[str, Any], names: Iterable[str], with_n: bool = True) -> dict[str, Any]:
    """`m`, `m_ci_low`, `m_ci_high` (and `m_n`) of each metric in `names`, from metrics.json
    aggregates ({"mean", "ci95", "n"}); NaN (n 0) for a metric not there."""
    row: dict[str, Any] = {}
    for name in names:
        agg = aggregates.get(name)
        row[name] = agg["mean"] if agg else NAN
        row[f"{name}_ci_low"] = agg["ci95"][0] if agg else NAN
        row[f"{name}_ci_high"] = agg["ci95"][1] if agg else NAN
        if with_n:
            row[f"{name}_n"] = agg["n"] if agg else 0
    return row
