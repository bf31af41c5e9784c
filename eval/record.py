"""One question of a run: a line of per_question.jsonl, typed.

`eval.scoring.score` builds a `QuestionRecord` per question (what was retrieved and every metric),
`eval.scoring.add_judge_scores` adds the judge's verdicts, `rag.run.pipeline` adds what the run measured
around it (latency, the groups a router chose, generation details, the contexts the LLM was given),
and `to_json()` is the line written. The report reads the file back through `from_json`, so the
file's keys are named here and nowhere else.

`to_json` writes the keys in the order runs have always written them (per_question.jsonl stays the
same bytes for the same run): `id`, `question`, `ground_truth`, `source`, `corpus`, `labels`,
`provenance`, `retrieved`, `answer`, the metrics, `judge` and the `judge_<metric>` values,
`latency_ms`, `routed`, `route_margin`, `route_filtered`, `generation`, `contexts`. A key the run
did not produce (no answer, no router, no generation details, no provenance for a question written
by a person, and everything the pipeline adds, on a record only scored) is left out rather than
written as null. `from_json`
also reads the files of older runs and of hand-made fixtures: a field they lack is None (an empty
list for `labels` and `retrieved`); only `id` is required, and in a retrieved chunk what every run
has written.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag.serving.reply import BadReply, decode_reply
from rag.types import RagError, Relevance

# The keys of a record that are not metrics; every other key holding a number or null is one.
STRUCTURE = ("id", "question", "ground_truth", "source", "corpus", "labels", "provenance", "retrieved", "answer",
             "judge", "latency_ms", "routed", "route_margin", "route_filtered", "generation", "contexts")
LATENCY_STAGES = ("retrieve", "rerank", "generate", "route")
HIT_FIELDS = ("rank", "chunk_id", "doc_id", "score", "sim_to_truth", "relevant", "grade", "relevant_label", "text")
HIT_REQUIRED = ("rank", "chunk_id", "doc_id", "score", "text")
GENERATION_FIELDS = ("usage", "finish_reason", "served_model", "attempts", "from_earlier_run")


def iter_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The objects of a per_question.jsonl, one at a time, read strictly: the one reader of the
    file (the gate, compare, aggregate, pooling, validation and the Python API go through it).
    ragrig writes no `NaN` or `Infinity` (rag.store.strict_json), so such a token, a number too large for
    a float, or a line that is not a JSON object is a file ragrig did not write as it is: RagError
    `unreadable per_question.jsonl, line 2: ...`, never a value that compares as a win or a
    question dropped for want of one. Blank lines are skipped."""
    name = Path(path).name
    try:
        with open(path, "rb") as fh:  # lines end at \n only: an answer may hold U+2028
            for lineno, raw in enumerate(fh, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise RagError(f"unreadable {name}, line {lineno}: not UTF-8 ({e.reason})") from None
                if line.strip():
                    yield _line(line, name, lineno)
    except OSError as e:
        raise RagError(f"unreadable {name}: {e.strerror or e}") from None


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every object of a per_question.jsonl (`iter_lines`)."""
    return list(iter_lines(path))


def _line(line: str, name: str, lineno: int) -> dict[str, Any]:
    try:
        row = decode_reply(line)
    except (BadReply, ValueError) as e:
        raise RagError(f"unreadable {name}, line {lineno}: {e}") from None
    if not isinstance(row, dict):
        raise RagError(f"unreadable {name}, line {lineno}: a per-question record is a JSON object, "
                       f"not {type(row).__name__}")
    return row


def _mapping(doc: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        # ValueError, as for bad JSON: a reader treats both as an unreadable line
        raise ValueError(f"{what} is a JSON object, not {type(doc).__name__}")  # noqa: TRY004
    return doc


def _is_value(v: Any) -> bool:
    """A metric's value: a number, or null where the question lacks what the metric needs."""
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


@dataclass(frozen=True)
class RetrievedChunk:
    """One of the question's top k, best first."""

    rank: int
    chunk_id: str  # "<doc id>#<position>"
    doc_id: str
    score: float  # the retriever's (or reranker's) score
    sim_to_truth: float | None  # cosine of the chunk and the ground truth; None without a ground truth
    relevant: bool | None  # sim_to_truth >= eval.tau_recall; None without a ground truth
    grade: int | None  # the labels' grade of its document; None: the question has no labels
    relevant_label: bool | None  # grade > 0; None: the question has no labels
    text: str
    # Keys kept as read and written back: a labelled span, a label field another scorer added, and
    # eval.relevance=llm's `judge_grade` (written only by those runs, so other runs keep their bytes).
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RetrievedChunk:
        """ValueError without the fields every run has written (rank, chunk_id, doc_id, score,
        text); the others are None when absent (runs from before the labels)."""
        doc = _mapping(doc, "a retrieved chunk")
        missing = [k for k in HIT_REQUIRED if k not in doc]
        if missing:
            raise ValueError(f"a retrieved chunk has no {', '.join(missing)}")
        return cls(rank=doc["rank"], chunk_id=doc["chunk_id"], doc_id=doc["doc_id"], score=doc["score"],
                   sim_to_truth=doc.get("sim_to_truth"), relevant=doc.get("relevant"), grade=doc.get("grade"),
                   relevant_label=doc.get("relevant_label"), text=doc["text"],
                   extra={k: v for k, v in doc.items() if k not in HIT_FIELDS})

    def to_json(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in HIT_FIELDS}, **self.extra}


@dataclass(frozen=True)
class GivenContext:
    """One numbered passage of the LLM's prompt."""

    label: str | None  # the source label the prompt shows (context.labels), or None
    text: str

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> GivenContext:
        doc = _mapping(doc, "a context")
        if "text" not in doc:
            raise ValueError("a context has a text")
        return cls(doc.get("label"), doc["text"])

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "text": self.text}


@dataclass
class QuestionLatency:
    """The question's own times in milliseconds; None: not timed (retrieve and rerank are timed for
    the latency sample only, generate for fresh answers, route with a router)."""

    retrieve: float | None = None
    rerank: float | None = None
    generate: float | None = None
    route: float | None = None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> QuestionLatency:
        doc = _mapping(doc, "latency_ms")
        return cls(**{s: doc.get(s) for s in LATENCY_STAGES})

    def to_json(self) -> dict[str, float]:
        return {s: v for s in LATENCY_STAGES if (v := getattr(self, s)) is not None}


@dataclass(frozen=True)
class TokenUsage:
    prompt_tokens: int | None
    completion_tokens: int | None

    def to_json(self) -> dict[str, int | None]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}


@dataclass(frozen=True)
class Generation:
    """What a served generator reported about the answer (llm=openai)."""

    usage: TokenUsage | None  # the tokens the server counted
    finish_reason: str | None
    served_model: str | None  # the model the server named in its reply
    attempts: int | None  # requests sent for this answer, retries included
    from_earlier_run: bool | None  # the answer came from the cache
    extra: dict[str, Any] = field(default_factory=dict)  # keys this code does not know, kept as read

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Generation:
        doc = _mapping(doc, "generation")
        u = doc.get("usage")
        usage = None if u is None else TokenUsage(u.get("prompt_tokens"), u.get("completion_tokens"))
        return cls(usage=usage, finish_reason=doc.get("finish_reason"), served_model=doc.get("served_model"),
                   attempts=doc.get("attempts"), from_earlier_run=doc.get("from_earlier_run"),
                   extra={k: v for k, v in doc.items() if k not in GENERATION_FIELDS})

    def to_json(self) -> dict[str, Any]:
        return {"usage": None if self.usage is None else self.usage.to_json(), "finish_reason": self.finish_reason,
                "served_model": self.served_model, "attempts": self.attempts,
                "from_earlier_run": self.from_earlier_run, **self.extra}


@dataclass(frozen=True)
class JudgedMetric:
    """One judge metric of the question (eval/judge.py): the repeats' verdicts as the judge returned
    them ({"verdicts", "scores", "reasons", "errors"}, a list each, one entry per repeat) and their
    mean score (None when no repeat was measured)."""

    verdicts: dict[str, Any]
    score: float | None


@dataclass
class QuestionRecord:
    """A line of per_question.jsonl. Scoring fills the fields up to `judge`; the pipeline the rest."""

    id: str
    question: str | None = None
    ground_truth: str | None = None  # None: the question has only relevance labels (a BEIR query)
    source: str | None = None  # the id of the document holding the answer, when known
    corpus: str | None = None  # the question's group tag
    labels: list[Relevance] = field(default_factory=list)  # the relevance labels the label metrics used
    # How a generated question was made (QAItem.provenance), each passage with its `text` (added by
    # the pipeline); None: a question written by a person, or unmarked.
    provenance: dict[str, Any] | None = None
    retrieved: list[RetrievedChunk] = field(default_factory=list)
    answer: str | None = None  # None: no answer generated for this question
    metrics: dict[str, float | None] = field(default_factory=dict)  # None: the question lacks what it needs
    judge: dict[str, JudgedMetric] = field(default_factory=dict)  # by judge metric (without "judge_")
    latency_ms: QuestionLatency | None = None  # None: not recorded (a record only scored)
    routed: list[str] | None = None  # the group tags a router picked for the question
    route_margin: float | None = None  # the pick's score over the runner-up's (rag.retriever.routing)
    route_filtered: bool | None = None  # whether the search was filtered to the pick (else: every group)
    generation: Generation | None = None
    contexts: list[GivenContext] | None = None  # None: not recorded (a record only scored)
    extra: dict[str, Any] = field(default_factory=dict)  # keys this code does not know, kept as read

    def metric(self, name: str) -> float | None:
        """The question's value of a metric, a judge metric (`judge_<metric>`) included; None when
        it has none."""
        if name.startswith("judge_") and name[len("judge_"):] in self.judge:
            return self.judge[name[len("judge_"):]].score
        return self.metrics.get(name)

    # -- reading and writing --------------------------------------------------------------------

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> QuestionRecord:
        """A parsed line of per_question.jsonl. ValueError when it is not an object or has no id."""
        doc = _mapping(doc, "a per-question record")
        if "id" not in doc:
            raise ValueError("a per-question record has an id")
        judged = doc.get("judge") or {}
        scores = {f"judge_{m}" for m in judged}
        rest = {k: v for k, v in doc.items() if k not in STRUCTURE and k not in scores}
        lat, gen, ctx = doc.get("latency_ms"), doc.get("generation"), doc.get("contexts")
        return cls(
            id=doc["id"], question=doc.get("question"), ground_truth=doc.get("ground_truth"),
            source=doc.get("source"), corpus=doc.get("corpus"),
            labels=[_relevance(x) for x in doc.get("labels") or []], provenance=doc.get("provenance"),
            retrieved=[RetrievedChunk.from_json(x) for x in doc.get("retrieved") or []],
            answer=doc.get("answer"),
            metrics={k: v for k, v in rest.items() if _is_value(v)},
            judge={m: JudgedMetric(v, doc.get(f"judge_{m}")) for m, v in judged.items()},
            latency_ms=None if lat is None else QuestionLatency.from_json(lat),
            routed=doc.get("routed"), route_margin=doc.get("route_margin"), route_filtered=doc.get("route_filtered"),
            generation=None if gen is None else Generation.from_json(gen),
            contexts=None if ctx is None else [GivenContext.from_json(c) for c in ctx],
            extra={k: v for k, v in rest.items() if not _is_value(v)},
        )

    def to_json(self) -> dict[str, Any]:
        """The line's object, keys in the order the pipeline has always written them."""
        doc: dict[str, Any] = {
            "id": self.id, "question": self.question, "ground_truth": self.ground_truth, "source": self.source,
            "corpus": self.corpus, "labels": [r.to_json() for r in self.labels],
        }
        if self.provenance is not None:
            doc["provenance"] = self.provenance
        doc["retrieved"] = [h.to_json() for h in self.retrieved]
        if self.answer is not None:
            doc["answer"] = self.answer
        doc.update(self.metrics)
        if self.judge:
            doc["judge"] = {m: j.verdicts for m, j in self.judge.items()}
            doc.update({f"judge_{m}": j.score for m, j in self.judge.items()})
        if self.latency_ms is not None:
            doc["latency_ms"] = self.latency_ms.to_json()
        if self.routed is not None:
            doc["routed"] = self.routed
        if self.route_margin is not None:
            doc["route_margin"] = self.route_margin
        if self.route_filtered is not None:
            doc["route_filtered"] = self.route_filtered
        if self.generation is not None:
            doc["generation"] = self.generation.to_json()
        if self.contexts is not None:
            doc["contexts"] = [c.to_json() for c in self.contexts]
        return {**doc, **self.extra}


def _relevance(doc: Mapping[str, Any]) -> Relevance:
    doc = _mapping(doc, "a relevance label")
    span = doc.get("span")
    return Relevance(doc["doc"], doc.get("grade", 1), None if span is None else (int(span[0]), int(span[1])))
