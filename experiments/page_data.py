"""report.html's page data: the JSON document the page embeds and its script
(experiments/templates/report.js) reads, and how it is encoded.

`PageData` and the TypedDicts under it are the contract between this module and report.js (also
described in docs/reference/datamodel.md, "The report's page data"): a key added here is read there by the
same name. Every question of every run is read back from per_question.jsonl through
`eval.record.QuestionRecord`.

Per question and run the page shows the ranked contexts with the span of each chunk that matches
the ground truth (the labelled span when the record carries one, else the sentence or window with
the most content words in common with the ground truth: cheap and deterministic). Large runs stay
usable: context texts are cut to `max_context_chars` around their matching span, lower still when
the distinct texts would exceed TEXT_BUDGET_CHARS, and identical strings (a chunk retrieved by
several runs, or for several questions) are stored once in `strings`, which the other fields point
into by index.
"""
from __future__ import annotations

import json
import logging
import math
import re
from typing import TYPE_CHECKING, Any, TypedDict

from eval.record import QuestionRecord, RetrievedChunk
from experiments import metric_info as MI
from rag.run.provenance import generator_name

if TYPE_CHECKING:
    from experiments.aggregate import RunRecord
    from experiments.report import Report

log = logging.getLogger(__name__)

TEXT_BUDGET_CHARS = 14_000_000  # distinct context text kept in one page (about 14 MB of UTF-8 for ASCII)
MAX_DATA_BYTES = 22_000_000  # the embedded data, all told: keeps the page under 25 MB
MIN_CONTEXT_CHARS = 240
SPAN_FIELDS = ("span", "label_span", "relevant_span", "evidence_span", "match_span")
STOPWORDS = frozenset(
    "a an the of to in on for and or but is are was were be been being it its this that these those with as by "
    "at from into than then so if not no do does did can could should would will may might must has have had "
    "which who whom what when where why how there their they them he she his her we our you your i me my".split())
_WORD = re.compile(r"\w+", re.UNICODE)
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+|\n\s*\n|\n(?=\s*[-*•\d])")
WINDOW_WORDS = 40


# ---------------------------------------------------------------------------------------------
# the contract: what report.js reads


# The chunks of a question are tables by column: one list per field, entry i of every list about
# the same chunk. A page holds up to millions of them, and field names written once per question
# and run rather than once per chunk keep the data at the size of unnamed rows.


class RetrievedData(TypedDict):
    """A run's ranked chunks for one question, best first."""

    rank: list[int]
    chunk_id: list[int]  # index into `strings`
    doc_id: list[int]  # index into `strings` (-1: none)
    score: list[float | None]
    sim_to_truth: list[float | None]
    relevant: list[bool]  # by similarity: sim_to_truth >= tau_recall
    text: list[int]  # index into `strings`: the text, cut to `context_limit` around its span
    span: list[list[int] | None]  # [start, end) of the piece matching the ground truth, in the cut text
    labels: list[int]  # index into `labels`: the relevance labels the record carries


class ContextData(TypedDict):
    """The passages the LLM was given, in prompt order."""

    label: list[str]
    text: list[int]  # index into `strings`, cut as a retrieved text is
    span: list[list[int] | None]


class RunData(TypedDict):
    """One run's evidence for one question."""

    metrics: list[float | None]  # the question's value of each metric, in PageData `metrics` order
    answer: int  # index into `strings` (-1: no answer)
    latency_ms: dict[str, float | None]  # by stage
    retrieved: RetrievedData
    contexts: ContextData
    fault: int  # index into `fault_classes` (-1: not classified)
    change: int  # against the baseline: 1 fixed, -1 broken, 0 neither


class PassageData(TypedDict):
    """A passage a generated question was written from."""

    doc_id: int  # index into `strings`
    start: int  # the passage's [start, end) in its document's text
    end: int
    text: int  # index into `strings`, cut as a retrieved text is (-1: not recorded)
    span: list[int] | None  # the piece matching the ground truth, in the cut text


class GeneratedData(TypedDict):
    """How a generated question was made (its record's `provenance`, python -m rag.testset)."""

    kind: str  # "factoid", "how_why", "two_passage", "template:<name>"
    generator: str  # the generator's short name (rag.run.provenance.generator_name)
    passages: list[PassageData]


class EveryQuestion(TypedDict):
    id: str
    question: str
    ground_truth: str | None
    source_id: str | None  # the id of the document holding the answer
    source: str  # that document named for a reader ("man page fcntl(2)")
    corpus: str  # the group tag ("unlabelled" when none)
    runs: list[RunData | None]  # in `runs` order; None where the run lacks the question


class QuestionData(EveryQuestion, total=False):
    # Only for a generated question (a record with provenance): a question written by a person
    # has no such key, so the data of a set of human questions is what it has always been.
    generated: GeneratedData


class Evidence(TypedDict):
    """Every question of the successful runs, and the tables their fields point into."""

    questions: list[QuestionData]
    strings: list[str]  # every distinct text and id, once
    labels: list[dict[str, Any]]  # every distinct set of relevance labels, once
    fault_classes: list[str]  # the fault classes' names (experiments.faults)
    context_limit: int  # the characters kept of each context text
    docs: dict[str, str]  # document id -> its readable name, where the two differ


class Header(TypedDict):
    """What the page shows of the runs besides their questions."""

    runs: list[str]  # the successful runs' labels, in column order
    baseline: str | None
    metrics: list[dict[str, Any]]  # per metric: metric_info.describe's fields and `short`
    objective: str
    key: list[str]  # the (at most two) headline metrics the question table opens with
    tau_recall: Any  # the similarity threshold of `relevant`


class PageData(Header, Evidence):
    """The embedded document: the header's fields, then the evidence's."""


# ---------------------------------------------------------------------------------------------
# the span of a chunk that matches the ground truth


def content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if len(w) > 1 and w not in STOPWORDS}


def match_span(text: str, truth_words: set[str]) -> tuple[int, int] | None:
    """The piece of `text` (a sentence, or a window of WINDOW_WORDS words inside run-on text)
    sharing the most content words with the ground truth, scored by the cosine of the two word
    sets so that a long piece does not win by size alone; None below 2 shared words."""
    if not truth_words or not text:
        return None
    bounds = [m.start() for m in _SENTENCE_END.finditer(text)]
    bounds.append(len(text) + 1)
    best, best_score = None, 0.0
    b, piece_start, piece_end, count = 0, 0, 0, 0
    words: set[str] = set()

    def close() -> None:
        nonlocal best, best_score
        shared = len(words & truth_words)
        if shared >= 2:
            score = shared / math.sqrt(len(words) * len(truth_words))
            if score > best_score:
                best, best_score = (piece_start, piece_end), score

    for m in _WORD.finditer(text):
        s = m.start()
        if s >= bounds[b] or count >= WINDOW_WORDS:
            close()
            while s >= bounds[b]:
                b += 1
            words, count, piece_start = set(), 0, s
        w = m.group().lower()
        if len(w) > 1 and w not in STOPWORDS:
            words.add(w)
        count += 1
        piece_end = m.end()
    close()
    if best is None:
        return None
    s, e = best
    # a sentence's closing punctuation belongs to it
    while e < len(text) and text[e] in ".!?;:)\"'":
        e += 1
    return s, e


def labelled_span(fields: dict[str, Any]) -> tuple[int, int] | None:
    """A span a retrieved chunk's record carries in one of SPAN_FIELDS, when well formed."""
    for f in SPAN_FIELDS:
        v = fields.get(f)
        if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, int) for x in v) and v[0] < v[1]:
            return int(v[0]), int(v[1])
    return None


def cut(text: str, span: tuple[int, int] | None, limit: int) -> tuple[str, int, int]:
    """`text` cut to `limit` characters around `span` (kept whole when it fits), with the span's
    new offsets (-1, -1 when none)."""
    s, e = span if span else (-1, -1)
    if len(text) <= limit:
        return text, s, e
    if span is None:
        return text[:limit] + "…", -1, -1
    start = max(0, min(s - limit // 4, len(text) - limit))
    end = min(len(text), start + limit)
    piece = ("…" if start else "") + text[start:end] + ("…" if end < len(text) else "")
    off = start - (1 if start else 0)
    ns, ne = max(s - off, 1 if start else 0), min(e - off, len(piece) - (1 if end < len(text) else 0))
    return piece, (ns if ne > ns else -1), (ne if ne > ns else -1)


def context_limit(lengths: list[int], max_chars: int, budget: int = TEXT_BUDGET_CHARS) -> int:
    """The longest cut (at most max_chars) under which the distinct texts fit the budget."""
    def total(limit: int) -> int:
        return sum(min(n, limit) for n in lengths)

    if total(max_chars) <= budget:
        return max_chars
    lo, hi = MIN_CONTEXT_CHARS, max_chars
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if total(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    log.info("report.html: %d distinct context texts; each cut to %d characters", len(lengths), lo)
    return lo


# ---------------------------------------------------------------------------------------------
# the encoding


def source_label(doc_id: str | None) -> str:
    """'pmid:123' -> 'PubMed PMID 123', 'man:fcntl.2' -> 'man page fcntl(2)', 'torch:x.y' ->
    'PyTorch x.y': the names rag.context.source_label gives v4's context labels (a test keeps the
    two in step), without importing the pipeline (and FAISS) into the report."""
    if not doc_id:
        return ""
    kind, _, rest = str(doc_id).partition(":")
    if not rest:
        return str(doc_id)
    if kind == "man":
        name, _, section = rest.rpartition(".")
        return f"man page {name}({section})" if name else f"man page {rest}"
    return {"pmid": "PubMed PMID ", "torch": "PyTorch ", "torchdoc": "PyTorch docs "}.get(kind, f"{kind}:") + rest


class Strings:
    """One table for every repeated string (texts, chunk ids, document ids): stored once, referred
    to by index."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.values: list[str] = []

    def __call__(self, s: str | None) -> int:
        if s is None:
            return -1
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.values)
            self.values.append(s)
        return i


def _num(v: Any, digits: int = 4) -> float | None:
    if v is None or isinstance(v, bool):
        return None if v is None else float(v)
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return round(f, digits) if math.isfinite(f) else None


def _span(start: int, end: int) -> list[int] | None:
    return None if start < 0 else [start, end]


def _labels(hit: RetrievedChunk, source: str | None) -> dict[str, Any]:
    """The relevance labels a retrieved chunk carries (its grade by the labels, and any field
    another scorer added); without any, whether the chunk comes from the question's source
    document."""
    fields = {"grade": hit.grade, "relevant_label": hit.relevant_label, **hit.extra}
    found = {k: v for k, v in fields.items() if k not in SPAN_FIELDS and isinstance(v, (bool, int, float, str))}
    if found:
        return found
    if source:
        return {"source document": hit.doc_id == source}
    return {}


def _passage_texts(r: QuestionRecord) -> list[str]:
    """The texts of the passages a generated question was written from, where recorded."""
    passages = (r.provenance or {}).get("passages") if isinstance(r.provenance, dict) else None
    return [p["text"] for p in passages or [] if isinstance(p, dict) and isinstance(p.get("text"), str)]


def _records(rec: RunRecord) -> dict[str, QuestionRecord]:
    """A run's questions by id (lines without an id are no question)."""
    rows = (QuestionRecord.from_json(line) for line in rec.per_question() if "id" in line)
    return {str(r.id): r for r in rows}


def question_data(rep: Report, records: list[RunRecord], max_chars: int,
                  budget: int = TEXT_BUDGET_CHARS) -> Evidence:
    """Questions (union over the successful runs, in order of first appearance) with, per run, the
    metrics, answer, ranked contexts (with their matching span) and the contexts given to the LLM."""
    from experiments import faults as F
    from experiments.verdict import question_values

    ok = [rec for rec in records if rec.ok]
    metrics = rep.metrics
    classes = [F.run_classes(rec) for rec in ok]
    moved = [{**{q: 1 for q in t["ids"]["fixed"]}, **{q: -1 for q in t["ids"]["broken"]}}
             for t in (rep.transitions.get(lab, {"ids": {"fixed": [], "broken": []}}) for lab in rep.ok_labels)]
    per_run = [_records(rec) for rec in ok]
    first: dict[str, QuestionRecord] = {}
    for rows in per_run:
        for qid, r in rows.items():
            first.setdefault(qid, r)
    latency = [question_values(rec, MI.LATENCY) if MI.LATENCY in metrics else {} for rec in ok]

    # Pass 1: every text with its matching span; then one length limit that fits the budget.
    truth_words = {qid: content_words(r.ground_truth or "") for qid, r in first.items()}
    spans: dict[tuple[str, str], tuple[int, int] | None] = {}

    def span_of(text: str, qid: str, hit: RetrievedChunk | None = None) -> tuple[int, int] | None:
        given = labelled_span(hit.extra) if hit else None
        if given:
            return given
        key = (qid, text)
        if key not in spans:
            spans[key] = match_span(text, truth_words[qid])
        return spans[key]

    texts: set[str] = set()
    for rows in per_run:
        for qid, r in rows.items():
            for hit in r.retrieved:
                texts.add(hit.text or "")
                span_of(hit.text or "", qid, hit)
            for c in r.contexts or []:
                texts.add(c.text or "")
                span_of(c.text or "", qid)
    for qid, r in first.items():
        for text in _passage_texts(r):
            texts.add(text)
            span_of(text, qid)
    limit = context_limit([len(t) for t in texts], max_chars, budget)

    strings, labels = Strings(), Strings()  # labels: distinct label sets, as JSON

    def retrieved(hits: list[RetrievedChunk], qid: str) -> RetrievedData:
        out: RetrievedData = {"rank": [], "chunk_id": [], "doc_id": [], "score": [], "sim_to_truth": [],
                              "relevant": [], "text": [], "span": [], "labels": []}
        for hit in hits:
            text, hs, he = cut(hit.text or "", span_of(hit.text or "", qid, hit), limit)
            out["rank"].append(hit.rank)
            out["chunk_id"].append(strings(str(hit.chunk_id)))
            out["doc_id"].append(strings(hit.doc_id))
            out["score"].append(_num(hit.score))
            out["sim_to_truth"].append(_num(hit.sim_to_truth))
            out["relevant"].append(bool(hit.relevant))
            out["text"].append(strings(text))
            out["span"].append(_span(hs, he))
            out["labels"].append(labels(json.dumps(_labels(hit, first[qid].source), sort_keys=True)))
        return out

    def given(r: QuestionRecord, qid: str) -> ContextData:
        out: ContextData = {"label": [], "text": [], "span": []}
        for c in r.contexts or []:
            text, hs, he = cut(c.text or "", span_of(c.text or "", qid), limit)
            out["label"].append(c.label or "")
            out["text"].append(strings(text))
            out["span"].append(_span(hs, he))
        return out

    def run_data(j: int, r: QuestionRecord, qid: str) -> RunData:
        ranked, contexts = retrieved(r.retrieved, qid), given(r, qid)
        lat = r.latency_ms.to_json() if r.latency_ms is not None else {}
        fault = classes[j].get(qid)
        return {"metrics": [_num(latency[j].get(qid)) if m == MI.LATENCY else _num(r.metric(m)) for m in metrics],
                "answer": strings(r.answer), "latency_ms": {k: _num(v, 1) for k, v in lat.items()},
                "retrieved": ranked, "contexts": contexts,
                "fault": F.CLASSES.index(fault) if fault else -1,
                "change": moved[j].get(qid, 0) if j < len(moved) else 0}

    def generated(prov: dict[str, Any], qid: str) -> GeneratedData:
        passages: list[PassageData] = []
        for p in prov.get("passages") or []:
            if not isinstance(p, dict):
                continue
            text = p.get("text")
            cut_text, hs, he = cut(text, span_of(text, qid), limit) if isinstance(text, str) else ("", -1, -1)
            start, end = (v if isinstance(v := p.get(k), int) else -1 for k in ("start", "end"))
            passages.append({"doc_id": strings(None if p.get("doc_id") is None else str(p["doc_id"])),
                             "start": start, "end": end,
                             "text": strings(cut_text) if isinstance(text, str) else -1, "span": _span(hs, he)})
        return {"kind": str(prov.get("kind") or ""), "generator": generator_name(prov.get("generator")),
                "passages": passages}

    out_questions: list[QuestionData] = []
    for qid, q in first.items():
        runs: list[RunData | None] = []
        for j, rows in enumerate(per_run):
            mine = rows.get(qid)
            runs.append(None if mine is None else run_data(j, mine, qid))
        entry: QuestionData = {"id": qid, "question": q.question or "", "ground_truth": q.ground_truth,
                               "source_id": q.source, "source": source_label(q.source),
                               "corpus": q.corpus or "unlabelled", "runs": runs}
        if isinstance(q.provenance, dict):
            entry["generated"] = generated(q.provenance, qid)
        out_questions.append(entry)
    doc_ids = {hit.doc_id for rows in per_run for r in rows.values() for hit in r.retrieved}
    return {"questions": out_questions, "strings": strings.values, "labels": [json.loads(x) for x in labels.values],
            "fault_classes": [F.WORDS[c] for c in F.CLASSES],
            "context_limit": limit,
            "docs": {d: source_label(d) for d in sorted(doc_ids - {None}) if source_label(d) != d}}


def page_json(rep: Report, records: list[RunRecord], header: Header) -> tuple[str, PageData]:
    """The page data and its JSON as the page embeds it, cut harder until it fits MAX_DATA_BYTES."""
    budget = TEXT_BUDGET_CHARS
    for _ in range(4):  # other fields (ids, answers, long labels) can outgrow the estimate: cut harder
        evidence = question_data(rep, records, rep.settings.max_context_chars, budget)
        data: PageData = {**header, **evidence}
        payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        size = len(payload.encode("utf-8"))
        if size <= MAX_DATA_BYTES or evidence["context_limit"] <= MIN_CONTEXT_CHARS:
            break
        budget = int(budget * 0.9 * MAX_DATA_BYTES / size)
    # Nothing in the data may end the <script> element early: "</" and "<!--" escaped as JSON allows.
    return payload.replace("</", "<\\/").replace("<!--", "\\u003c!--"), data
