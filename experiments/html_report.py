"""report.html: the verdict, the charts and every question of a set of runs, in one static file.

No server and no network request of any kind: CSS and JavaScript are inline, the charts are the
summary's own SVGs inlined, the per-question evidence is embedded JSON, and a Content-Security-
Policy of `default-src 'none'` forbids the page to fetch anything. It can be mailed or attached to
a paper's supplement and opened offline in any browser.

Everything statistical comes from the Report (experiments.report.analyze): nothing is computed
twice. What is added here is presentational: the per-run configuration, the metric glossary, the
per-question table and, per question and run, the ranked contexts with the span of each chunk that
matches the ground truth (the labelled span when the records carry one, else the sentence or
window with the most content words in common with the ground truth: cheap and deterministic).

Large runs stay usable: context texts are cut to `max_context_chars` around their matching span,
lower still when the distinct texts would exceed TEXT_BUDGET_CHARS, and identical strings (a chunk
retrieved by several runs, or for several questions) are stored once.
"""
from __future__ import annotations

import html
import json
import logging
import math
import re
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from experiments import metric_info as MI
from experiments.stats import has_value

if TYPE_CHECKING:
    from experiments.aggregate import RunRecord
    from experiments.report import Report

log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).parent / "templates"
TEXT_BUDGET_CHARS = 14_000_000  # distinct context text kept in one page (about 14 MB of UTF-8 for ASCII)
MAX_DATA_BYTES = 22_000_000  # the embedded data, all told: keeps the page under 25 MB
MIN_CONTEXT_CHARS = 240
KNOWN_RETRIEVED = {"rank", "chunk_id", "doc_id", "score", "sim_to_truth", "relevant", "text"}
SPAN_FIELDS = ("span", "label_span", "relevant_span", "evidence_span", "match_span")
STOPWORDS = frozenset(
    "a an the of to in on for and or but is are was were be been being it its this that these those with as by "
    "at from into than then so if not no do does did can could should would will may might must has have had "
    "which who whom what when where why how there their they them he she his her we our you your i me my".split())
_WORD = re.compile(r"\w+", re.UNICODE)
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+|\n\s*\n|\n(?=\s*[-*•\d])")
WINDOW_WORDS = 40


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


def labelled_span(entry: dict[str, Any]) -> tuple[int, int] | None:
    for f in SPAN_FIELDS:
        v = entry.get(f)
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
        lo, hi = (mid, hi) if total(mid) <= budget else (lo, mid - 1)
    log.info("report.html: %d distinct context texts; each cut to %d characters", len(lengths), lo)
    return lo


# ---------------------------------------------------------------------------------------------
# the embedded data


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


def _labels(entry: dict[str, Any], source: str | None) -> dict[str, Any]:
    """The relevance labels a retrieved entry carries (any field the scorer added beyond the known
    ones); without any, whether the chunk comes from the question's source document."""
    extra = {k: v for k, v in entry.items() if k not in KNOWN_RETRIEVED and k not in SPAN_FIELDS
             and isinstance(v, (bool, int, float, str)) and v is not None}
    if extra:
        return extra
    if source:
        return {"source document": entry.get("doc_id") == source}
    return {}


def question_data(rep: Report, records: list[RunRecord], max_chars: int,
                  budget: int = TEXT_BUDGET_CHARS) -> dict[str, Any]:
    """Questions (union over the successful runs, in order of first appearance) with, per run, the
    metrics, answer, ranked contexts (with their matching span) and the contexts given to the LLM."""
    from experiments import faults as F
    from experiments.verdict import question_values

    ok = [(i, r) for i, r in enumerate(records) if r.ok]
    metrics = rep.metrics
    classes = [F.run_classes(rec) for _, rec in ok]
    moved = [{**{q: 1 for q in t["ids"]["fixed"]}, **{q: -1 for q in t["ids"]["broken"]}}
             for t in (rep.transitions.get(lab, {"ids": {"fixed": [], "broken": []}}) for lab in rep.ok_labels)]
    questions: dict[str, dict[str, Any]] = {}
    per_run: list[dict[str, dict[str, Any]]] = []
    for _, rec in ok:
        rows = {}
        for r in rec.per_question():
            if "id" not in r:
                continue
            qid = str(r["id"])
            rows[qid] = r
            if qid not in questions:
                questions[qid] = {"id": qid, "q": r.get("question", ""), "g": r.get("ground_truth", ""),
                                  "sid": r.get("source"), "c": r.get("corpus") or "unlabelled"}
        per_run.append(rows)
    latency = [question_values(rec, MI.LATENCY) if MI.LATENCY in metrics else {} for _, rec in ok]

    # Pass 1: every text with its matching span; then one length limit that fits the budget.
    truth_words = {qid: content_words(q["g"] or "") for qid, q in questions.items()}
    spans: dict[tuple[str, str], tuple[int, int] | None] = {}
    pending: list[tuple[str, tuple[int, int] | None]] = []

    def span_of(text: str, qid: str, entry: dict[str, Any] | None = None) -> tuple[int, int] | None:
        given = labelled_span(entry) if entry else None
        if given:
            return given
        key = (qid, text)
        if key not in spans:
            spans[key] = match_span(text, truth_words[qid])
        return spans[key]

    for rows in per_run:
        for qid, r in rows.items():
            for e in r.get("retrieved") or []:
                pending.append((e.get("text") or "", span_of(e.get("text") or "", qid, e)))
            for c in r.get("contexts") or []:
                pending.append((c.get("text") or "", span_of(c.get("text") or "", qid)))
    limit = context_limit([len(t) for t in {t for t, _ in pending}], max_chars, budget)

    strings, labels = Strings(), Strings()  # labels: distinct label sets, as JSON
    out_questions = []
    for qid, q in questions.items():
        runs = []
        for j, rows in enumerate(per_run):
            r = rows.get(qid)
            if r is None:
                runs.append(None)
                continue
            ret = []
            for e in r.get("retrieved") or []:
                text, hs, he = cut(e.get("text") or "", span_of(e.get("text") or "", qid, e), limit)
                ret.append([e.get("rank"), strings(str(e.get("chunk_id", ""))), strings(e.get("doc_id")),
                            _num(e.get("score")), _num(e.get("sim_to_truth")), 1 if e.get("relevant") else 0,
                            strings(text), hs, he, labels(json.dumps(_labels(e, q["sid"]), sort_keys=True))])
            ctx = []
            for c in r.get("contexts") or []:
                text, hs, he = cut(c.get("text") or "", span_of(c.get("text") or "", qid), limit)
                ctx.append([c.get("label") or "", strings(text), hs, he])
            lat = r.get("latency_ms") if isinstance(r.get("latency_ms"), dict) else {}
            values = [_num(latency[j].get(qid)) if m == MI.LATENCY else _num(r.get(m)) for m in metrics]
            fault = classes[j].get(qid)
            runs.append({"m": values, "a": strings(r["answer"]) if isinstance(r.get("answer"), str) else -1,
                         "lat": {k: _num(v, 1) for k, v in lat.items()}, "r": ret, "x": ctx,
                         "f": F.CLASSES.index(fault) if fault else -1,
                         "t": moved[j].get(qid, 0) if j < len(moved) else 0})
        out_questions.append({**q, "s": source_label(q["sid"]), "r": runs})
    doc_ids = {e.get("doc_id") for rows in per_run for r in rows.values() for e in r.get("retrieved") or []}
    return {"questions": out_questions, "strings": strings.values, "labels": [json.loads(x) for x in labels.values],
            "fault_classes": [F.WORDS[c] for c in F.CLASSES],
            "context_limit": limit,
            "docs": {d: source_label(d) for d in sorted(doc_ids - {None}) if source_label(d) != d}}


# ---------------------------------------------------------------------------------------------
# charts, configuration, tables


_XML_PROLOG = re.compile(r"<\?xml.*?\?>\s*|<!DOCTYPE.*?>\s*|<metadata>.*?</metadata>\s*", re.S)
_ID = re.compile(r'\bid="([^"]+)"')
_SIZE = re.compile(r'(<svg\b[^>]*?)\s+width="[^"]*"\s+height="[^"]*"', re.S)
_EXTERNAL = re.compile(r'(?:href|src)\s*=\s*"(?!#|data:)|url\((?!#|data:)|@import', re.I)  # heatmaps are data: PNGs


def inline_svg(svg: str, prefix: str) -> str:
    """A matplotlib SVG ready to inline: no prolog or metadata, ids prefixed (several charts share
    glyph and clip-path ids), scaled to its container; refuses anything that could fetch."""
    svg = _XML_PROLOG.sub("", svg)
    svg = _ID.sub(lambda m: f'id="{prefix}{m.group(1)}"', svg)
    svg = re.sub(r'(xlink:href|href)="#', lambda m: f'{m.group(1)}="#{prefix}', svg)
    svg = re.sub(r"url\(#", f"url(#{prefix}", svg)
    svg = _SIZE.sub(r'\1 width="100%"', svg, count=1)
    if _EXTERNAL.search(svg):
        raise ValueError("chart SVG refers to an external resource")
    return svg.strip()


def chart_svgs(rep: Report) -> list[dict[str, str]]:
    """The summary's charts as inline SVG; rendered into a scratch directory when the summary was
    asked for PNG only."""
    from experiments.report import make_charts

    paths = [p for p in rep.charts if p.suffix == ".svg"]
    tmp = None
    if not paths and not rep.frame.empty and rep.settings.charts:
        tmp = tempfile.TemporaryDirectory(prefix="ragrig-report-")
        try:
            paths = [p for p in make_charts(rep, Path(tmp.name), ("svg",)) if p.suffix == ".svg"]
        except Exception:
            log.exception("report.html: charts failed")
    try:
        return [{"name": p.stem, "title": p.stem.replace("_", " "), "svg": inline_svg(p.read_text(encoding="utf-8"), f"c{i}-")}
                for i, p in enumerate(paths)]
    finally:
        if tmp is not None:
            tmp.cleanup()


def flatten(cfg: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(cfg, dict):
        out: dict[str, str] = {}
        for k, v in cfg.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    value = json.dumps(cfg, ensure_ascii=False) if isinstance(cfg, list) else str(cfg)
    return {prefix.rstrip("."): value}


def config_rows(records: list[RunRecord]) -> list[dict[str, Any]]:
    """Every config key of every run; keys whose values differ first (those are highlighted)."""
    flat = [flatten(r.config or {}) for r in records]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    rows = [{"key": k, "values": [f.get(k, "") for f in flat]} for k in keys]
    for r in rows:
        r["differs"] = len(set(r["values"])) > 1
    return sorted(rows, key=lambda r: not r["differs"])


def _result_rows(rep: Report) -> list[dict[str, Any]]:
    cmp = {(str(r["label"]), r["metric"]): r for _, r in rep.comparison.iterrows()} if not rep.comparison.empty else {}
    rows = []
    for _, row in rep.frame.iterrows():
        lab = str(row["label"])
        cells = []
        for m in rep.metrics:
            v = row.get(m)
            c = cmp.get((lab, m))
            cell = {"value": MI.fmt(m, v) if has_value(v) else "",
                    "ci": f"[{MI.fmt(m, row.get(f'{m}_ci_low'))}, {MI.fmt(m, row.get(f'{m}_ci_high'))}]",
                    "marker": "", "cls": "", "diff": "", "p": ""}
            if c is not None:
                cell.update(marker=c["marker"], cls=("better" if c["better"] else "worse") if c["significant"] else "",
                            diff=f"{MI.fmt(m, c['diff'], True)} [{MI.fmt(m, c['ci_low'], True)}, "
                                 f"{MI.fmt(m, c['ci_high'], True)}]",
                            p=_p(c["p_value"]), p_holm=_p(c["p_holm"]), n=int(c["n"]),
                            wtl=(f"{int(c['wins'])} / {int(c['ties'])} / {int(c['losses'])}"
                                 if "wins" in c and c["wins"] == c["wins"] else ""))
            cells.append(cell)
        rows.append({"label": lab, "job": row["job"], "status": row["status"], "error": row.get("error", ""),
                     "baseline": lab == rep.baseline, "cells": cells})
    return rows


def served_rows(rep: Report) -> tuple[list[str], list[dict[str, Any]]]:
    """(role columns, rows): per run, the requests it sent to served models and their cost
    (metrics.json `usage`; the summary's Cost section)."""
    if rep.frame.empty:
        return [], []
    roles = [c.removesuffix("_requests") for c in rep.frame.columns if c.endswith("_requests")]
    if not roles:
        return [], []
    def num(v: Any, fmt: str) -> str:
        return format(v, fmt) if has_value(v) else ""

    rows = []
    for _, row in rep.frame.iterrows():
        cells = [f"{num(row.get(f'{r}_requests'), '.0f')} / {num(row.get(f'cost_{r}'), '.4f')}" for r in roles]
        rows.append({"label": str(row["label"]), "cells": cells, "total": num(row.get("cost_total"), ".4f"),
                     "currency": row.get("currency") if isinstance(row.get("currency"), str) else ""})
    return roles, rows


def corpus_rows(rep: Report, metrics: list[str]) -> list[dict[str, Any]]:
    """Mean [95% CI] of each headline metric per question corpus and run (from metrics.json)."""
    bc = rep.by_corpus
    if bc.empty:
        return []
    idx = bc.set_index(["corpus", "run", "metric"])
    rows = []
    for corpus in dict.fromkeys(bc["corpus"]):
        for run in dict.fromkeys(bc["run"]):
            cells = []
            for m in metrics:
                if (corpus, run, m) in idx.index:
                    r = idx.loc[(corpus, run, m)]
                    cells.append(f"{MI.fmt(m, r['mean'])} [{MI.fmt(m, r['ci_low'])}, {MI.fmt(m, r['ci_high'])}]")
                else:
                    cells.append("")
            n = bc[(bc["corpus"] == corpus) & (bc["run"] == run)]["n"]
            rows.append({"corpus": corpus, "run": run, "n": int(n.max()) if len(n) else 0, "cells": cells})
    return rows


def sample_notes(records: list[RunRecord]) -> list[str]:
    """Each sample a run took (metrics.json `slice`), once per distinct line; the runs it applies
    to are named when not every run took it: a report never hides that questions were left out."""
    from rag.corpus.slicing import Kept

    ok = [r for r in records if r.ok and r.result is not None]
    runs: dict[str, list[str]] = {}
    for r in ok:
        for key, entry in (r.result.slice or {}).items():
            k = Kept.from_json(key, entry)
            if k.sampled:
                runs.setdefault(k.line(), []).append(r.variant)
    return [line if len(names) == len(ok) else f"{line}: {', '.join(names)}" for line, names in runs.items()]


def _p(p: Any) -> str:
    if not has_value(p):
        return "–"
    return f"{p:.2g}" if p >= 0.001 else f"{p:.0e}"


def _thresholds(records: list[RunRecord]) -> tuple[Any, Any]:
    for r in records:
        ev = (r.config or {}).get("eval") or {}
        if ev:
            return ev.get("tau_recall", 0.75), ev.get("tau_h", 0.5)
    return 0.75, 0.5


# ---------------------------------------------------------------------------------------------
# the page


def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=jinja2.select_autoescape(
        ["html", "j2"]), trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)


def render_html(rep: Report, records: list[RunRecord]) -> str:
    from experiments.report import best_run, method_note
    from experiments.verdict import headline_metrics, mde_text

    k = rep.k
    tau_recall, tau_h = _thresholds(records)
    ok_labels = rep.ok_labels
    metric_meta = [{**MI.describe(m, k, tau_recall, tau_h), "short": MI.label(m, k)} for m in rep.metrics]
    key = headline_metrics(rep.objective, rep.metrics, 3)
    budget = TEXT_BUDGET_CHARS
    for _ in range(4):  # other fields (ids, answers, long labels) can outgrow the estimate: cut harder
        qdata = question_data(rep, records, rep.settings.max_context_chars, budget)
        data = {"runs": ok_labels, "baseline": rep.baseline, "metrics": metric_meta, "objective": rep.objective,
                "key": key[:2], "tau_recall": tau_recall, **qdata}
        payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        size = len(payload.encode("utf-8"))
        if size <= MAX_DATA_BYTES or qdata["context_limit"] <= MIN_CONTEXT_CHARS:
            break
        budget = int(budget * 0.9 * MAX_DATA_BYTES / size)
    # Nothing in the data may end the <script> element early: "</" and "<!--" escaped as JSON allows.
    payload = payload.replace("</", "<\\/").replace("<!--", "\\u003c!--")
    best = best_run(rep)
    return _env().get_template("report.html.j2").render(
        title=rep.settings.title, source=rep.source, generated=time.strftime("%Y-%m-%d %H:%M:%S"),
        verdict=rep.verdict, baseline=rep.baseline, n_tests=rep.n_tests, alpha=rep.alpha, k=k,
        metrics=metric_meta, results=_result_rows(rep), has_comparison=not rep.comparison.empty,
        mde=[{"label": MI.label(r["metric"], k), "mde": mde_text(r["metric"], r["mde"]),
              "nominal": mde_text(r["metric"], r["mde_nominal"]), "sd": MI.fmt(r["metric"], r["sd_diff"]),
              "n": int(r["n"]), "basis": r["basis"]} for _, r in rep.mde.iterrows()] if not rep.mde.empty else [],
        mde_alpha=f"{rep.alpha:g}/{max(rep.n_tests, 1)}", method=method_note(rep) if rep.n_tests else "",
        charts=chart_svgs(rep), runs=[str(x) for x in rep.frame["label"]] if not rep.frame.empty else [],
        config=config_rows(records), objective=MI.label(rep.objective, k), varying=rep.varying,
        corpus_metrics=[MI.label(m, k) for m in rep.headline()], corpus_rows=corpus_rows(rep, rep.headline()),
        served=served_rows(rep),
        best=None if best is None else {"label": best["label"], "value": MI.fmt(rep.objective, best[rep.objective])},
        n_questions=len(qdata["questions"]), context_limit=qdata["context_limit"], lower_note=MI.LOWER_NOTE,
        samples=sample_notes(records),
        data_json=payload, css=(TEMPLATES / "report.css").read_text(encoding="utf-8"),
        js=(TEMPLATES / "report.js").read_text(encoding="utf-8"), esc=html.escape,
    )


def write_html(rep: Report, records: list[RunRecord], path: Path) -> Path:
    """Renders the page and writes it atomically (a half-written report is never left behind)."""
    from rag.cache import atomic_write_text

    path = Path(path)
    atomic_write_text(path, render_html(rep, records))
    return path


def write_run_report(run_dir: Path, max_context_chars: int = 1200) -> Path | None:
    """report.html next to one run's metrics.json (its metrics, charts and every question). Never
    raises: the run's results are already written, a report problem is only logged."""
    try:
        from experiments.aggregate import load_records
        from experiments.report import ReportSettings, analyze

        run_dir = Path(run_dir)
        records = [r for r in load_records([run_dir]) if r.path.resolve() == run_dir.resolve()]
        if not records or not records[0].ok:
            return None
        # No charts: a run's page must stay cheap (no matplotlib), its tables carry the numbers.
        settings = ReportSettings(title=f"Run {records[0].variant}: {run_dir.name}", charts=False,
                                  max_context_chars=max_context_chars)
        rep = analyze(records, run_dir, settings, source=f"Run directory: `{run_dir}`")
        return write_html(rep, records, run_dir / "report.html")
    except Exception as e:
        from rag.cache import storage_fault

        fault = storage_fault(e)
        if fault is not None:  # a full or read-only disk is no bug: one line, no traceback
            log.warning("report.html for %s not written (%s: %s); the run's results are unaffected",
                        run_dir, fault.strerror, fault.filename or run_dir)
        else:
            log.exception("report.html for %s failed; the run's results are unaffected", run_dir)
        return None
