"""What each metric is called, which way is better, what it needs and what it means: the one
table the terminal, the summary, the report, the charts, the verdict and the gate read, and the
source of the metric reference in docs/reference/metrics.md (`python -m experiments.metric_info --markdown`).

A metric's key (metrics.json `metrics`, per_question.jsonl, summary.csv, comparison.csv) never
changes: files are a contract. Its label is what every printed table, sentence and chart calls it,
and `resolve` maps the key, the label and the obvious spellings of either back to the key.

Metrics are handled generically everywhere else (any numeric per-question field listed in
metrics.json "metrics"); a metric missing here gets its own name as label, no unit, and is taken
as higher-is-better. `{k}`, `{tau_recall}` and `{tau_h}` are filled from the runs' config.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rag.store.atomic import block_between, replace_block
from rag.types import RagError

LOWER_MARK = "↓"  # appended to the label of every lower-is-better metric, on every chart and table
LOWER_NOTE = "↓ lower is better"
BETTER, WORSE = "▲", "▼"  # a significant difference in the metric's own direction, whichever way that is
MARKER_NOTE = "▲/▼: better/worse than {baseline} in the metric's direction"
# Derived at report time from per_question.jsonl: the question's retrieval latency (every stage but
# generation). Generation is left out: it runs in batches (each question is charged its batch's
# share) and may cover a sample of the questions only (slice.answer_questions_per_corpus), so a
# sum with it would compare unlike questions; its cost is in the summary's Cost table.
LATENCY = "latency_ms"
LATENCY_EXCLUDED_STAGES = ("generate",)

_ANSWER = "a ground-truth answer (the question's `answer`)"
_GENERATED = "a generated answer (any `llm` but `none`) and a ground-truth answer"
_DOC_ID = "the question's `doc_id` (the id of the document that holds its answer)"
_UNANSWERED = ("the question was not answered (`llm=none`, or outside the answered sample "
               "`slice.answer_questions_per_corpus`) or has no ground-truth answer")


@dataclass(frozen=True)
class MetricInfo:
    label: str
    unit: str = "mean over questions"
    higher_is_better: bool = True
    formula: str = ""
    threshold: str = ""
    high: str = ""
    low: str = ""
    decimals: int = 3
    family: str = ""
    needs: str = ""
    null_when: str = ""
    span: tuple[float, float] | None = (0.0, 1.0)  # the values a question can take; None: unbounded
    aliases: tuple[str, ...] = ()  # more spellings `resolve` accepts, besides the key and the label
    where: str = "metrics.json `metrics` and `by_corpus`; per_question.jsonl"
    # The smallest difference that matters (report.min_effect): a smaller one, however significant,
    # is no win or loss. In the metric's unit, or a share of the baseline's mean, whichever is larger.
    min_effect: float = 0.01
    min_effect_share: float = 0.0


_SIM = "cosine of the fixed evaluation embedder's vectors"
SIM_FAMILY = "similarity to the answer"
ID_FAMILY = "source id"
LABEL_FAMILY = "relevance labels (IR)"
METRICS: dict[str, MetricInfo] = {
    "recall_at_k": MetricInfo(
        "recall@{k} (sim)", "share of questions, 0–1",
        formula="1 if max over the top-{k} chunks c of sim(E(c), E(G)) ≥ τ, else 0 (G: the ground truth; " + _SIM + ")",
        threshold="τ = {tau_recall} (eval.tau_recall)",
        high="the answer's content is somewhere in the top {k} for most questions",
        low="the retriever rarely brings back a passage resembling the answer",
        family=SIM_FAMILY, needs=_ANSWER, null_when="the question has no ground-truth answer (BEIR queries)",
        aliases=("recall@k (similarity)",)),
    "mrr": MetricInfo(
        "MRR (sim)", "mean reciprocal rank, 0–1",
        formula="1 / rank of the first chunk c with sim(E(c), E(G)) ≥ τ; 0 if none in the top {k}",
        threshold="τ = {tau_recall} (eval.tau_recall)",
        high="a passage resembling the answer comes first or near the top",
        low="such passages are missing or ranked low",
        family=SIM_FAMILY, needs=_ANSWER, null_when="the question has no ground-truth answer (BEIR queries)",
        aliases=("MRR (similarity)",)),
    "precision_at_k": MetricInfo(
        "precision@{k} (sim)", "share of top-{k} chunks, 0–1",
        formula="(chunks c in the top {k} with sim(E(c), E(G)) ≥ τ) / {k}",
        threshold="τ = {tau_recall} (eval.tau_recall)",
        high="most of the context given to the LLM is on topic",
        low="the context is mostly noise (even when one good chunk is in it)",
        family=SIM_FAMILY, needs=_ANSWER, null_when="the question has no ground-truth answer (BEIR queries)",
        aliases=("precision@k (similarity)",)),
    "hit_at_k_id": MetricInfo(
        "hit@{k} (source id)", "share of questions, 0–1",
        formula="1 if any of the top-{k} chunks comes from the question's source document, else 0",
        threshold="exact match of document ids (no threshold)",
        high="the right document is found for most questions",
        low="retrieval lands in other documents",
        family=ID_FAMILY, needs=_DOC_ID, null_when="the question has no `doc_id`"),
    "mrr_id": MetricInfo(
        "MRR (source id)", "mean reciprocal rank, 0–1",
        formula="1 / rank of the first chunk from the question's source document; 0 if none in the top {k}",
        threshold="exact match of document ids (no threshold)",
        high="the source document's chunks rank first",
        low="the source document is missing or ranked low",
        family=ID_FAMILY, needs=_DOC_ID, null_when="the question has no `doc_id`"),
    "answer_gt": MetricInfo(
        "answer–truth similarity", "cosine similarity, −1–1",
        formula="sim(E(A), E(G)) (A: the generated answer; " + _SIM + ")",
        threshold="none (a mean of cosines); hallucination uses τ_h = {tau_h}",
        high="answers say what the ground truth says",
        low="answers miss or contradict the ground truth",
        family="answer", needs=_GENERATED, null_when=_UNANSWERED, span=(-1.0, 1.0),
        aliases=("answer-gt", "answer-truth similarity", "answer similarity")),
    "grounding": MetricInfo(
        "grounding", "cosine similarity, −1–1",
        formula="sim(E(A), E(concatenation of the contexts C given to the LLM))",
        threshold="none (a mean of cosines); hallucination uses τ_h = {tau_h}",
        high="answers stay close to the passages they were given",
        low="answers drift away from their context (made up, or generic)",
        family="answer", needs="a generated answer (any `llm` but `none`)",
        null_when="the question was not answered (`llm=none`, or outside `slice.answer_questions_per_corpus`)",
        span=(-1.0, 1.0)),
    "hallucination": MetricInfo(
        "hallucination rate", "share of questions, 0–1", higher_is_better=False,
        formula="1 if answer–truth similarity < τ_h and grounding < τ_h, else 0",
        threshold="τ_h = {tau_h} (eval.tau_h)",
        high="many answers match neither the truth nor their context",
        low="few answers are unsupported",
        family="answer", needs=_GENERATED, null_when=_UNANSWERED),
    # The label metrics (eval/labels.py) rank relevance units: the labelled documents or answer
    # spans that the top-{k} chunks find, each counted once, so their ideal does not depend on the
    # chunker. trec_eval computes them (ndcg_cut, recall, map_cut).
    "ndcg_at_k": MetricInfo(
        "nDCG@{k}", "0–1",
        formula="DCG of the labelled units the top {k} chunks find, by grade / DCG of the ideal ranking of the labels",
        threshold="relevance labels (graded; a span label is found by a chunk that overlaps it)",
        high="labelled documents or spans are found, and found first",
        low="labelled documents or spans are missing or ranked low",
        family=LABEL_FAMILY, needs="relevance labels (`relevant`), or a `doc_id` (one label of grade 1)",
        null_when="the question has no label of grade ≥ 1", aliases=("ndcg_cut",)),
    "recall_at_k_label": MetricInfo(
        "recall@{k} (labels)", "share of a question's labels, 0–1",
        formula="labelled units found by the top {k} chunks / all labelled units of the question",
        threshold="relevance labels (grade > 0)",
        high="most labelled evidence is retrieved",
        low="most labelled evidence is missed",
        family=LABEL_FAMILY, needs="relevance labels (`relevant`), or a `doc_id` (one label of grade 1)",
        null_when="the question has no label of grade ≥ 1"),
    "map_at_k": MetricInfo(
        "MAP@{k}", "0–1",
        formula="sum over the labelled units found in the top {k} of precision at their rank / all labelled units",
        threshold="relevance labels (grade > 0)",
        high="labelled units are found and ranked above unlabelled ones",
        low="labelled units are missing or buried",
        family=LABEL_FAMILY, needs="relevance labels (`relevant`), or a `doc_id` (one label of grade 1)",
        null_when="the question has no label of grade ≥ 1", aliases=("map_cut",)),
    "judge_faithfulness": MetricInfo(
        "faithfulness (judge)", "share of measured questions, 0–1",
        formula="LLM judge (eval.judge): 1 if every claim of the answer is supported by its passages, else 0; "
                "mean of the measured repeats",
        threshold="the judge's verdict; unmeasured judgements are counted beside the mean, not averaged",
        high="the judge finds the answers supported by their passages",
        low="the judge finds unsupported claims",
        family="judge", needs="`eval.judge` and a generated answer",
        null_when="no judge, the question was not answered, or every judgement of it was unmeasured"),
    "judge_correctness": MetricInfo(
        "correctness (judge)", "share of measured questions, 0–1",
        formula="LLM judge (eval.judge): correct 1, partially correct 0.5, incorrect 0 against the ground truth; "
                "mean of the measured repeats",
        threshold="the judge's verdict; unmeasured judgements are counted beside the mean, not averaged",
        high="the judge finds the answers correct",
        low="the judge finds the answers wrong",
        family="judge", needs="`eval.judge`, a generated answer and a ground-truth answer",
        null_when="no judge, the question was not answered, or every judgement of it was unmeasured"),
    LATENCY: MetricInfo(
        "retrieval latency", "ms per question", higher_is_better=False, decimals=1,
        formula="the question's retrieve + rerank time (every stage but generation, which runs in batches and "
                "may cover a sample of the questions), from per_question.jsonl",
        threshold="none (wall-clock; depends on the machine and its load)",
        high="slow retrieval (e.g. a reranker's cost)", low="fast retrieval",
        family="cost", needs="the run's latency sample (`eval.latency`)",
        null_when="the question is outside the timed sample (`eval.latency.sample`)", span=None,
        aliases=("latency", "retrieval latency (ms)"), min_effect=1.0, min_effect_share=0.1,
        where="derived by the report from per_question.jsonl `latency_ms` (ms per stage); summary.csv, "
              "comparison.csv"),
}


def info(name: str) -> MetricInfo:
    """A metric's entry; one the table does not list has no range and no smallest difference that matters."""
    return METRICS.get(name) or MetricInfo(name, span=None, min_effect=0.0)


def lower_is_better(name: str) -> bool:
    return not info(name).higher_is_better


def label(name: str, k: Any = "k", unit: bool = False, mark: bool = True) -> str:
    """'recall@5 (sim)', 'hallucination rate ↓', with unit: 'MRR (sim) (mean reciprocal rank, 0–1)'."""
    i = info(name)
    text = i.label.format(k=k)
    if unit:
        text = f"{text} ({i.unit.format(k=k)})"
    if mark and not i.higher_is_better:
        text = f"{text} {LOWER_MARK}"
    return text


def describe(name: str, k: Any = "k", tau_recall: Any = 0.75, tau_h: Any = 0.5) -> dict[str, Any]:
    """Every field of the metric's entry, placeholders filled (for the report's metric glossary)."""
    i = info(name)
    fill = {"k": k, "tau_recall": tau_recall, "tau_h": tau_h}
    return {
        "name": name, "label": label(name, k, mark=False), "unit": i.unit.format(**fill),
        "higher_is_better": i.higher_is_better, "formula": i.formula.format(**fill) or "see metrics.json",
        "threshold": i.threshold.format(**fill), "high": i.high.format(**fill), "low": i.low.format(**fill),
        "decimals": i.decimals, "family": i.family, "needs": i.needs, "null_when": i.null_when,
    }


def better(name: str, diff: float) -> bool:
    """Whether a difference (run − baseline) is an improvement in the metric's direction."""
    return diff < 0 if lower_is_better(name) else diff > 0


def marker(name: str, diff: float, significant: bool) -> str:
    """▲ for a significant improvement, ▼ for a significant loss: a fall in latency is a ▲."""
    if not significant:
        return ""
    return BETTER if better(name, diff) else WORSE


def width(name: str) -> float | None:
    """The largest possible difference between two runs' means (None: unbounded)."""
    span = info(name).span
    return None if span is None else span[1] - span[0]


def min_effect_setting(key: str, value: Any) -> tuple[float, float]:
    """One `report.min_effect` value as (in the metric's unit, share of the baseline's mean): a
    number such as 0.02 (or 5 for latency, in ms), or a percentage such as "10%". A bad one is one
    RagError line naming `key`."""
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            share = float(value.strip()[:-1]) / 100
        except ValueError:
            share = float("nan")
        if math.isfinite(share) and share >= 0:
            return 0.0, share
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value), 0.0
    raise RagError(f"{key} must be a difference >= 0 in the metric's unit (0.02, or 5 for ms) or a share of "
                   f"the baseline's mean (\"10%\"), got {value!r}")


def min_effects(settings: Any, key: str = "report.min_effect") -> dict[str, tuple[float, float]]:
    """`report.min_effect` (metric -> value; a metric by key or label) as metric key -> (in the
    metric's unit, share); a name that is no metric is one RagError line."""
    if settings in (None, {}):
        return {}
    if not isinstance(settings, Mapping):
        raise RagError(f"{key} must be a mapping of metric to smallest difference, e.g. "
                       f"{{ndcg_at_k: 0.02, latency_ms: \"10%\"}}, got {settings!r}")
    out = {}
    for name, value in settings.items():
        metric = resolve(str(name))
        if metric not in METRICS:
            raise RagError(f"{key}.{name}: no such metric; known: {', '.join(METRICS)}")
        out[metric] = min_effect_setting(f"{key}.{name}", value)
    return out


def min_effect(name: str, baseline_mean: float | None = None,
               settings: Mapping[str, tuple[float, float]] | None = None) -> float:
    """The smallest difference of `name` that matters against a baseline with this mean: the
    metric's own (metric_info; `report.min_effect` replaces it), in its unit or as a share of the
    baseline's mean, whichever is larger (latency: 1 ms or 10%)."""
    i = info(name)
    absolute, share = (settings or {}).get(name, (i.min_effect, i.min_effect_share))
    base = abs(float(baseline_mean)) if baseline_mean is not None and math.isfinite(float(baseline_mean)) else 0.0
    return max(absolute, share * base)


def min_effect_words(name: str) -> str:
    """'0.01', '1 ms or 10% of the baseline's mean, whichever is larger': the default, in words."""
    i = info(name)
    unit = " ms" if name == LATENCY else ""
    absolute = f"{i.min_effect:g}{unit}"
    if not i.min_effect_share:
        return absolute
    return f"{absolute} or {i.min_effect_share:.0%} of the baseline's mean, whichever is larger"


def undetectable(name: str, mde: float) -> bool:
    """A detectable difference as large as the metric's whole range: no difference can be seen."""
    w = width(name)
    return w is not None and math.isfinite(mde) and mde >= w


# ---- names the user types ----------------------------------------------------------------------


def _norm(name: str) -> str:
    """Case, dashes, the ↓ mark, spacing and the cut-off k do not tell metrics apart."""
    s = name.strip().lower().replace("–", "-").replace("—", "-").replace(LOWER_MARK, "")
    s = re.sub(r"@\s*(\d+|\{k\})", "@k", s)
    s = re.sub(r"_at_(\d+)", "_at_k", s)
    return " ".join(s.split())


def _spellings(key: str) -> set[str]:
    """The key, the label and the aliases: each names this metric alone."""
    i = METRICS[key]
    return {_norm(n) for n in (key, i.label, *i.aliases)}


def _loose_spellings(key: str) -> set[str]:
    """Spellings that may fit two metrics: the key with '@k' for '_at_k' ('recall@k' from
    recall_at_k) and the label without its qualifier ('recall@k' from 'recall@k (labels)')."""
    i = METRICS[key]
    return {_norm(key.replace("_at_k", "@k")), _norm(i.label.split(" (")[0])}


class AmbiguousMetric(RagError):
    """A name that could mean two metrics (e.g. 'recall@5': by similarity or by labels)."""


def resolve(name: str) -> str:
    """The metric key a typed name means: the key, the printed label or an obvious spelling of
    either (case-insensitive, any cut-off: 'nDCG@5', 'ndcg@10', 'ndcg_at_k', 'MRR (source id)',
    'hallucination rate ↓'); a label without its qualifier when only one metric has it ('hit@5').
    A name the table does not know comes back unchanged (a run may hold metrics it does not
    list); one that fits two metrics raises AmbiguousMetric naming both."""
    n = _norm(name)
    for key in METRICS:
        if n in _spellings(key):
            return key
    loose = [key for key in METRICS if n in _loose_spellings(key)]
    if len(loose) == 1:
        return loose[0]
    if loose:
        cut = re.search(r"@\s*(\d+)", name)
        choices = " or ".join(f"{key} ('{label(key, cut.group(1) if cut else 'k', mark=False)}')" for key in loose)
        raise AmbiguousMetric(f"metric {name!r} could be {choices}; name one of them")
    return name


def fmt(name: str, value: Any, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    d = info(name).decimals
    return f"{float(value):+.{d}f}" if signed else f"{float(value):.{d}f}"


def fmt_unit(name: str, value: Any, signed: bool = False, seconds: bool | None = None) -> str:
    """`fmt` with the metric's unit where it has one worth printing: latency in ms, or in s from
    1000 ms (`seconds` forces one scale, e.g. for a difference and its CI together). A no-break
    space keeps number and unit on one line."""
    if name != LATENCY or value is None or (isinstance(value, float) and math.isnan(value)):
        return fmt(name, value, signed)
    v = float(value)
    if seconds if seconds is not None else abs(v) >= 1000:
        return (f"{v / 1000:+.2f}" if signed else f"{v / 1000:.2f}") + "\u00a0s"
    return f"{fmt(name, v, signed)}\u00a0ms"


# ---- the reference page --------------------------------------------------------------------------

BEGIN = "<!-- metric reference: generated by `python -m experiments.metric_info --write docs/reference/metrics.md`; edit METRICS, not this -->"
END = "<!-- end of the generated metric reference -->"

READING = """\
### How to read the verdict

- **Two recall@k and two MRRs.** `recall@k (sim)` and `MRR (sim)` are the similarity metrics,
  ragrig's first: a chunk counts when its embedding is within τ of the ground-truth answer's.
  `recall@k (labels)` and `MRR (source id)` are the information-retrieval ones: a chunk counts
  when it matches a relevance label or comes from the question's source document. They answer
  different questions and often disagree; the label is printed with its family everywhere
  (terminal, summary.md, report.html, charts), and the gate accepts the key or the label.
- **▲ is better, ▼ is worse**, in the metric's own direction, and only where the difference is
  significant after Holm's correction over every compared (run, metric) cell and at least the
  smallest difference that matters (each card above; `report.min_effect`). A fall in a
  {lower} metric (hallucination rate, retrieval latency) is a ▲.
- **Detectable differences.** "A paired test detects differences from about X 0.08" is the
  difference these question counts find with 80% power: a smaller one may exist and go unseen,
  so "no difference" can mean "too few questions". Where that difference is as large as the
  metric's whole range, the verdict says "too few questions to detect any difference in X (n=6)".
- **The baseline** is `report.baseline` (`python -m experiments.compare --baseline`) when set;
  else v1 when the runs include it; else, in a parameter sweep, the cell with the configuration's
  default values; else the first run, and the verdict says so. A parameter sweep's verdict also
  names its best cell on the objective, with its CI and whether it beats the baseline after Holm.
""".replace("{lower}", LOWER_MARK)


def markdown(k: Any = "k", tau_recall: Any = 0.75, tau_h: Any = 0.5) -> str:
    """The metric reference (docs/reference/metrics.md): one card per metric, from METRICS."""
    fill = {"k": k, "tau_recall": tau_recall, "tau_h": tau_h}
    intro = ("Every name a table, sentence or chart prints is the **label** (each card's title); files keep "
             "the **key** (metrics.json `metrics` and `by_corpus`, per_question.jsonl, summary.csv, "
             "comparison.csv: a contract that does not change). `python -m experiments.gate --metric` takes "
             "either, in any case and with any cut-off (`nDCG@10`, `ndcg_at_k`). `k` is `eval.k` (5 by "
             "default); a metric that lacks what it needs is null for that question and left out of its mean "
             "and CI (`n` counts the questions that have it). E(x) is the fixed evaluation embedder's vector "
             "of x, sim the cosine, G the ground-truth answer, A the generated answer, C the contexts given "
             "to the LLM. The smallest difference that matters is what the verdict and the charts require "
             "besides significance before they call a difference a win or a loss (`report.min_effect`).")
    rows = ["## Metric reference", "", intro]
    for key, i in METRICS.items():
        better = "lower is better ↓" if not i.higher_is_better else "higher is better"
        rows += ["", f"### {label(key, k, mark=False)}", "",
                 f"`{key}` · {i.family} · {better} · {i.unit.format(**fill)}", "",
                 f"- **Formula:** {i.formula.format(**fill)}.",
                 f"- **Threshold:** {i.threshold.format(**fill)}.",
                 f"- **High:** {i.high.format(**fill)}; **low:** {i.low.format(**fill)}.",
                 f"- **Needs:** {i.needs}; **null when** {i.null_when}.",
                 f"- **Smallest difference that matters:** {min_effect_words(key)}.",
                 f"- **In:** {i.where}."]
    return "\n".join(rows) + "\n\n" + READING


def write_page(path: Any) -> bool:
    """Replaces the generated block of `path` (between BEGIN and END) with `markdown()`; True when
    the file changed."""
    return replace_block(path, BEGIN, END, markdown())


def page_block(text: str) -> str:
    """The generated block of a page's text, as `markdown()` wrote it."""
    return block_between(text, BEGIN, END)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m experiments.metric_info",
                                 description="The metric reference, from the table every report reads.")
    ap.add_argument("--markdown", action="store_true", help="print the reference (markdown)")
    ap.add_argument("--write", metavar="PAGE", help="replace the generated block of PAGE (docs/reference/metrics.md)")
    args = ap.parse_args(argv)
    if args.write:
        try:
            print(f"{args.write}: {'updated' if write_page(args.write) else 'already up to date'}")
        except (RagError, OSError) as e:
            print(f"metric_info: error: {e}", file=__import__("sys").stderr)
            return 2
    if args.markdown or not args.write:
        print(markdown(), end="")
    return 0


if __name__ == "__main__":
    from rag.config.cli import run_cli  # a reader that goes away (| head -1) costs no traceback

    run_cli(main)
