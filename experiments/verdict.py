"""Every run against the baseline: paired differences over the questions both share, Holm's
correction across every compared cell, the smallest detectable difference per metric, and the
verdict in words and as a terminal table.

The family corrected together is every (non-baseline run, metric) cell the summary marks, so a
▲/▼ means "significantly better/worse at family-wise level alpha", in the metric's own direction,
however many jobs and metrics the sweep has.
"""
from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from experiments import metric_info as MI
from experiments.aggregate import RunRecord
from experiments.stats import PERMUTATIONS, has_value, holm, min_detectable_effect, paired_bootstrap, shared_ids
from rag.run.provenance import generated, human, labels_source, marked

ALPHA = 0.05
POWER = 0.8
# The terminal's headline: the objective first, then these when the runs report them.
HEADLINE = ("mrr_id", "hit_at_k_id", "recall_at_k", "mrr", "ndcg_at_k", "answer_gt", "hallucination")
MAX_HEADLINE = 6
MAX_RUNS_IN_WORDS = 3
MAX_METRICS_IN_WORDS = 3
WIDTH = 100


def question_values(rec: RunRecord, metric: str) -> dict[str, float | None]:
    """Question id -> the run's per-question value of `metric`. The derived latency is the sum of
    the question's stage latencies but generation (metric_info.LATENCY), for the questions whose
    retrieval was timed (a run times a sample of its questions; routing alone is not a latency)."""
    if metric != MI.LATENCY:
        return rec.question_values(metric)
    out: dict[str, float | None] = {}
    for r in rec.per_question():
        lat = r.get("latency_ms")
        if "id" in r and isinstance(lat, Mapping) and lat.get("retrieve") is not None:
            out[str(r["id"])] = float(sum(float(v) for k, v in lat.items()
                                          if v is not None and k not in MI.LATENCY_EXCLUDED_STAGES))
    return out


def has_latency(rec: RunRecord) -> bool:
    rows = rec.per_question()
    return bool(rows) and isinstance(rows[0].get("latency_ms"), Mapping)


@dataclass
class Comparison:
    """The corrected comparison of a set of runs with their baseline."""

    table: pd.DataFrame  # one row per (run, metric) cell
    mde: pd.DataFrame  # one row per metric
    alpha: float
    n_tests: int


def compare(records: list[RunRecord], labels: list[str], metrics: list[str], base: int | None,
            resamples: int = 1000, seed: int = 0, confidence: float = 0.95, alpha: float = ALPHA,
            permutations: int = PERMUTATIONS,
            min_effects: Mapping[str, tuple[float, float]] | None = None) -> Comparison:
    """Paired differences of every successful run from the baseline, metric by metric, over the
    question ids both runs have a value for; Holm-adjusted p-values over all the cells; the
    minimum detectable effect per metric. A cell is a win or a loss (its marker) only when it is
    significant and its difference is at least the smallest that matters (metric_info.min_effect,
    `min_effects` from report.min_effect), against the baseline's mean over the shared questions."""
    rows: list[dict[str, Any]] = []
    if base is None:
        return Comparison(pd.DataFrame(rows), mde_table(None, None, metrics, alpha, 0), alpha, 0)
    base_vals = {m: question_values(records[base], m) for m in metrics}
    for i, rec in enumerate(records):
        if not rec.ok or i == base:
            continue
        for m in metrics:
            other = question_values(rec, m)
            if not base_vals[m] or not other:
                continue
            d = paired_bootstrap(base_vals[m], other, resamples, confidence, seed, permutations)
            if d.n == 0:
                continue
            wins, ties, losses = win_tie_loss(base_vals[m], other, m)
            shared = [float(base_vals[m][q]) for q in shared_ids(base_vals[m], other)]  # type: ignore[arg-type]
            rows.append({
                "job": rec.job_num if rec.job_num is not None else "", "label": labels[i], "metric": m,
                "baseline": labels[base], "diff": d.mean_diff, "ci_low": d.ci_low, "ci_high": d.ci_high,
                "n": d.n, "n_run": _count(other), "n_baseline": _count(base_vals[m]), "sd_diff": d.sd_diff,
                "p_value": d.p_value, "wins": wins, "ties": ties, "losses": losses,
                "min_effect": MI.min_effect(m, float(np.mean(shared)) if shared else None, min_effects),
            })
    table = pd.DataFrame(rows)
    n_tests = 0
    if not table.empty:
        table["p_holm"] = holm(table["p_value"].to_numpy(float))
        n_tests = int(table["p_value"].notna().sum())
        table["significant"] = table["p_holm"] < alpha
        table["matters"] = table["diff"].abs() >= table["min_effect"]
        table["better"] = [MI.better(m, d) for m, d in zip(table["metric"], table["diff"])]
        table["marker"] = [MI.marker(m, d, bool(s) and bool(x)) for m, d, s, x
                           in zip(table["metric"], table["diff"], table["significant"], table["matters"])]
        table["mde"] = [min_detectable_effect(sd, n, alpha / max(n_tests, 1), POWER)
                        for sd, n in zip(table["sd_diff"], table["n"])]
    return Comparison(table, mde_table(table, records[base], metrics, alpha, n_tests, base_vals), alpha, n_tests)


def win_tie_loss(baseline: Mapping[str, float | None], other: Mapping[str, float | None], metric: str) -> tuple[int, int, int]:
    """Questions on which `other` is better than the baseline, equal, and worse (in the metric's
    own direction: fewer hallucinations win), over the questions both have a value for."""
    wins = ties = losses = 0
    for q in shared_ids(baseline, other):
        a, b = baseline[q], other[q]
        assert a is not None and b is not None  # shared_ids keeps the scored values only
        d = float(b) - float(a)
        if abs(d) <= 1e-9 * max(1.0, abs(float(a))):
            ties += 1
        elif MI.better(metric, d):
            wins += 1
        else:
            losses += 1
    return wins, ties, losses


def _count(values: Mapping[str, float | None]) -> int:
    return sum(1 for v in values.values() if has_value(v))


def mde_table(table: Any, baseline: RunRecord | None, metrics: list[str], alpha: float, n_tests: int,
              base_vals: dict[str, dict[str, float | None]] | None = None) -> pd.DataFrame:
    """Per metric: the difference a paired test finds with 80% power. From the median standard
    deviation of the per-question differences and the median shared-question count over the
    metric's cells, at Holm's strictest level alpha/m (conservative) and at the nominal alpha.
    Without a pair (one run), from the baseline's own spread: sd * sqrt(2) is the spread of a
    difference of two uncorrelated runs, an upper bound when runs are positively correlated."""
    rows = []
    m_tests = max(n_tests, 1)
    for m in metrics:
        cells = table[table["metric"] == m] if isinstance(table, pd.DataFrame) and not table.empty else None
        sd, n, basis = float("nan"), 0, ""
        if cells is not None and len(cells):
            sds = cells["sd_diff"].to_numpy(float)
            sds = sds[np.isfinite(sds) & (sds > 0)]
            if len(sds):
                sd, n, basis = float(np.median(sds)), int(np.median(cells["n"])), "paired"
        if basis == "" and baseline is not None:
            vals = base_vals[m] if base_vals else question_values(baseline, m)
            v = np.array([x for x in vals.values() if has_value(x)], float)
            if len(v) >= 2:
                sd, n, basis = float(v.std(ddof=1)) * math.sqrt(2), len(v), "unpaired (baseline spread)"
        rows.append({"metric": m, "sd_diff": sd, "n": n, "basis": basis,
                     "alpha": alpha / m_tests, "mde": min_detectable_effect(sd, n, alpha / m_tests, POWER),
                     "mde_nominal": min_detectable_effect(sd, n, alpha, POWER)})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# words


def _diff_ci(m: str, r: Mapping[str, Any]) -> str:
    """'+0.095 [+0.054, +0.136]'."""
    sec = abs(float(r["diff"])) >= 1000  # one scale for the difference and its interval
    return (f"{MI.fmt_unit(m, r['diff'], True, sec)} "
            f"[{MI.fmt_unit(m, r['ci_low'], True, sec)}, {MI.fmt_unit(m, r['ci_high'], True, sec)}]")


def _diff_words(m: str, r: Mapping[str, Any], k: Any) -> str:
    return f"{MI.label(m, k)} by {_diff_ci(m, r)}"


def _listing(items: list[str]) -> str:
    if len(items) > MAX_METRICS_IN_WORDS:
        more = len(items) - MAX_METRICS_IN_WORDS
        items = items[:MAX_METRICS_IN_WORDS] + [f"{more} more metric{'s' if more > 1 else ''}"]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _n_words(table: pd.DataFrame) -> str:
    lo, hi = int(table["n"].min()), int(table["n"].max())
    return f"{lo} shared questions" if lo == hi else f"{lo}–{hi} shared questions per comparison"


def _mde_rows(mde: pd.DataFrame, metrics: list[str] | None) -> pd.DataFrame:
    rows = mde[mde["mde"].notna()] if not mde.empty else mde
    if metrics is not None and not rows.empty:
        rows = rows[rows["metric"].isin(metrics)]
    return rows


def mde_words(mde: pd.DataFrame, k: Any, metrics: list[str] | None = None) -> str:
    """'recall@5 (sim) 0.102; MRR (sim) 0.107' for the metrics whose detectable difference is
    inside their range."""
    rows = _mde_rows(mde, metrics)
    parts = [f"{MI.label(r['metric'], k)} {MI.fmt_unit(r['metric'], r['mde'])}" for _, r in rows.iterrows()
             if not MI.undetectable(r["metric"], float(r["mde"]))]
    return "; ".join(parts)


def mde_text(m: str, mde: float) -> str:
    """A detectable difference for a table cell, flagged where it exceeds the metric's range."""
    if MI.undetectable(m, float(mde)):
        return f"{MI.fmt(m, mde)} (beyond the metric's range: too few questions)"
    return MI.fmt(m, mde)


def too_few_words(mde: pd.DataFrame, k: Any, metrics: list[str] | None = None) -> str:
    """'too few questions to detect any difference in recall@5 (sim) (n=6)' for the metrics whose
    detectable difference is as large as their whole range; '' when there are none."""
    rows = [r for _, r in _mde_rows(mde, metrics).iterrows() if MI.undetectable(r["metric"], float(r["mde"]))]
    if not rows:
        return ""
    ns = {int(r["n"]) for r in rows}
    if len(ns) == 1:
        names = _and([MI.label(r["metric"], k) for r in rows])
        return f"too few questions to detect any difference in {names} (n={ns.pop()})"
    return "too few questions to detect any difference in " + _and(
        [f"{MI.label(r['metric'], k)} (n={int(r['n'])})" for r in rows])


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _detectable_sentence(lead: str, words: str, few: str, tail: str = "") -> str:
    """The detectable differences, then the metrics no difference could show in: one sentence each."""
    out = []
    if words:
        out.append(f"{lead}: {words}{tail}.")
    if few:
        out.append(few[0].upper() + few[1:] + ".")
    return " ".join(out)


def decisive(table: pd.DataFrame) -> pd.Series:
    """The cells that are a win or a loss: significant after Holm's correction and at least the
    smallest difference that matters (a table without that column: significant alone)."""
    sig = table["significant"].astype(bool)
    return sig & table["matters"].astype(bool) if "matters" in table else sig


def small_words(small: pd.DataFrame, k: Any) -> str:
    """The significant differences smaller than what matters, which the verdict calls neither a
    win nor a loss: 'v2 on retrieval latency ↓ by +0.3 ms [+0.2 ms, +0.4 ms] (it takes 1.0 ms)'."""
    items = [f"{r['label']} on {_diff_words(r['metric'], r, k)} (it takes {MI.fmt_unit(r['metric'], r['min_effect'])})"
             for _, r in small.iterrows()]
    if len(items) > MAX_METRICS_IN_WORDS:
        items = items[:MAX_METRICS_IN_WORDS] + [f"{len(items) - MAX_METRICS_IN_WORDS} more (see the table)"]
    return ("Significant, but smaller than the smallest difference that matters (report.min_effect), so neither "
            f"a win nor a loss: {_and(items)}.")


def verdict_text(cmp: Comparison, baseline: str | None, runs: list[str], k: Any, objective: str,
                 single: Mapping[str, Any] | None = None) -> str:
    """The verdict in words: which runs beat or lose to the baseline on which metrics, by how
    much [95% CI], significant after Holm's correction; what else could have been detected."""
    t = cmp.table
    if baseline is None:
        return "No successful run: nothing to compare."
    if t.empty and runs:
        return (f"No comparison: {baseline} and {_listing(list(runs))} share no question with a per-question value "
                "(per_question.jsonl missing or disjoint question sets), so they cannot be compared question by "
                "question.")
    if t.empty:
        head = f"One run ({baseline})"
        if single:
            head += (f": {MI.label(objective, k)} {MI.fmt(objective, single.get('mean'))} "
                     f"[{MI.fmt(objective, single.get('lo'))}, {MI.fmt(objective, single.get('hi'))}] "
                     f"over {single.get('n')} questions")
        words, few = mde_words(cmp.mde, k), too_few_words(cmp.mde, k)
        head += ". No baseline to compare with" + ("" if words else ".")
        if words:
            head += (f"; a paired comparison on these questions would detect differences of about: {words} "
                     f"(80% power, two-sided α = {cmp.alpha:g}; from this run's spread, assuming uncorrelated runs).")
        return head + (f" {few[0].upper()}{few[1:]}." if few else "")
    sig = t[decisive(t)]
    small = t[t["significant"] & ~decisive(t)]
    sentences = [f"Against the baseline {baseline}, over {_n_words(t)}:"]
    clauses = []
    # The runs that gain most on the objective first, then those with the most differences.
    gain = {r: float(x["diff"]) * (-1 if MI.lower_is_better(objective) else 1)
            for r, x in sig[sig["metric"] == objective].set_index("label").iterrows()}
    ordered = [r for r in runs if r in set(sig["label"])]
    ordered.sort(key=lambda r: (-gain.get(r, float("-inf")), -int((sig["label"] == r).sum())))
    for run in ordered[:MAX_RUNS_IN_WORDS]:
        cells = sig[sig["label"] == run]
        cells = cells.iloc[np.argsort((cells["metric"] != objective).to_numpy(), kind="stable")]
        wins = [_diff_words(r["metric"], r, k) for _, r in cells[cells["better"]].iterrows()]
        losses = [_diff_words(r["metric"], r, k) for _, r in cells[~cells["better"]].iterrows()]
        parts = []
        if wins:
            parts.append(f"{run} beats {baseline} on {_listing(wins)}")
        if losses:
            parts.append(("but loses on " if wins else f"{run} loses to {baseline} on ") + _listing(losses))
        clauses.append(", ".join(parts))
    if clauses:
        sentences.append("; ".join(clauses) + ".")
        more = len(ordered) - MAX_RUNS_IN_WORDS
        if more > 0:
            sentences.append(f"{more} more run{'s' if more > 1 else ''} differ{'s' if more == 1 else ''} "
                             "(see the table).")
        sentences.append(f"Each is significant after Holm's correction over {cmp.n_tests} comparisons "
                         f"(family-wise α = {cmp.alpha:g}).")
        rest = "Nothing else differs; at these question counts a paired test detects (80% power) differences from about"
    else:
        by = " by the smallest difference that matters or more" if len(small) else ""
        sentences.append(f"no run differs from the baseline on any metric{by} after Holm's correction over "
                         f"{cmp.n_tests} comparisons (family-wise α = {cmp.alpha:g}).")
        rest = "At these question counts a paired test detects (80% power) differences from about"
    if len(small):
        sentences.append(small_words(small, k))
    # Metrics where some run showed no difference: what difference would have shown.
    silent = [m for m in dict.fromkeys(t["metric"]) if (sig["metric"] == m).sum() < (t["metric"] == m).sum()]
    words, few = mde_words(cmp.mde, k, silent), too_few_words(cmp.mde, k, silent)
    if len(sig) == len(t):
        sentences.append("Every comparison differs.")
    elif words or few:
        if not words and clauses:
            sentences.append("Nothing else differs.")
        sentences.append(_detectable_sentence(rest, words, few))
    elif clauses:
        sentences.append("Nothing else differs.")
    absent = [m for m in cmp.mde["metric"] if m not in set(t["metric"])] if not cmp.mde.empty else []
    if absent:
        names = ", ".join(MI.label(m, k) for m in absent)
        no_base = cmp.mde.set_index("metric").loc[absent, "n"].eq(0).all()
        sentences.append(f"Not compared: {names} ({baseline} has no values of them)." if no_base else
                         f"Not compared: {names} (no run shares values of them with {baseline}).")
    short = t[(t["n"] < t["n_run"]) | (t["n"] < t["n_baseline"])]
    if not short.empty:
        r = short.iloc[0]
        sentences.append(f"Only shared questions are compared: e.g. {r['label']} has {int(r['n_run'])} and "
                         f"{baseline} {int(r['n_baseline'])} questions with a {MI.label(r['metric'], k)}, "
                         f"{int(r['n'])} in common.")
    return " ".join(sentences)


def best_words(best: Mapping[str, Any], baseline: str | None, table: pd.DataFrame, objective: str, k: Any) -> str:
    """A parameter sweep's best run on the objective, its CI, and whether it beats the baseline
    after Holm's correction (the cell of `table` that compares the two)."""
    lab, name = str(best["label"]), MI.label(objective, k)
    job = f" (job {best['job']})" if str(best.get("job", "")) != "" else ""
    value = (f"{name} {MI.fmt(objective, best.get(objective))} [{MI.fmt(objective, best.get(f'{objective}_ci_low'))}, "
             f"{MI.fmt(objective, best.get(f'{objective}_ci_high'))}]")
    if lab == baseline:
        return f"Best: the baseline {lab}{job} itself, {value}."
    cells = table[(table["label"] == lab) & (table["metric"] == objective)] if not table.empty else table
    if cells.empty:
        return f"Best: {lab}{job}, {value}; it shares no question with {baseline}, so it is not compared."
    r = cells.iloc[0]
    how = ("significantly better after Holm's correction" if bool(r["significant"]) and bool(r["better"])
           else "not significantly different after Holm's correction")
    if bool(r["significant"]) and bool(r["better"]) and "matters" in r and not bool(r["matters"]):
        how += (f", but by less than the smallest difference that matters "
                f"({MI.fmt_unit(objective, r['min_effect'])})")
    return (f"Best: {lab}{job}, {value}; against {baseline} {_diff_ci(objective, r)}, "
            f"{how} (Holm-adjusted p = {p_text(r['p_holm'])}).")


def p_text(p: Any) -> str:
    """A p-value as the report prints it: two significant digits, '–' for none."""
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "–"
    return f"{p:.2g}" if p >= 0.001 else f"{p:.0e}"


def cost_words(frame: Any) -> str:
    """The verdict's cost line: what each run's requests to served models cost (`pricing`), when
    any cost anything."""
    if frame is None or frame.empty or "cost_total" not in frame:
        return ""
    ok = frame[(frame["status"] == "ok") & frame["cost_total"].notna()]
    if ok.empty or not (ok["cost_total"] > 0).any():
        return ""
    def cur(r: Any) -> str:
        return f" {r['currency']}" if isinstance(r.get("currency"), str) else ""

    runs = ", ".join(f"{r['label']} {float(r['cost_total']):.4f}{cur(r)}" for _, r in ok.iterrows())
    return f"Served models cost (requests this run sent, at the config's pricing): {runs}."


def provenance_words(provenances: list[dict[str, Any] | None]) -> str:
    """The verdict's sentence on what the measurements stand on, when any run's questions were
    generated (python -m rag.testset) or its relevance labels graded by an LLM (`provenances`: the
    runs' metrics.json `provenance`); empty for human questions with the question file's labels."""
    if not any(marked(p) for p in provenances):
        return ""
    gen = [bool(generated(p)) for p in provenances]
    llm = [labels_source(p) == "llm" for p in provenances]
    every_generated = all(generated(p) and not human(p) for p in provenances)
    questions = "generated questions" if every_generated else "questions partly generated"
    if any(gen) and any(llm):
        words = f"Measured on {questions} and LLM relevance labels, not human ones"
    elif any(gen):
        words = f"Measured on {questions}, not {'human-written' if every_generated else 'only human-written'} ones"
    else:
        words = "Measured with LLM relevance labels, not human ones"
    if len(set(gen)) > 1 or len(set(llm)) > 1:
        words += " (not in every run: see Questions and labels)"
    return words + "."


# ---------------------------------------------------------------------------------------------
# the terminal


def headline_metrics(objective: str, metrics: list[str], limit: int = MAX_HEADLINE) -> list[str]:
    out = [objective] if objective in metrics else []
    out += [m for m in HEADLINE if m in metrics and m not in out]
    return out[:limit]


def _term_cell(row: Mapping[str, Any], m: str, marker: str) -> str:
    v = row.get(m)
    if not has_value(v):
        return "–"
    d = max(MI.info(m).decimals - 1, 0)
    lo, hi = row.get(f"{m}_ci_low"), row.get(f"{m}_ci_high")
    ci = "" if lo is None or (isinstance(lo, float) and math.isnan(lo)) else f" [{lo:.{d}f},{hi:.{d}f}]"
    return f"{v:.{d}f}{ci}{marker}"


def headline_table(frame: pd.DataFrame, cmp: Comparison, metrics: list[str], baseline: str | None, k: Any,
                   objective: str, width: int = WIDTH) -> str:
    """Each run's headline metrics, mean [95% CI] with corrected ▲/▼, split into blocks of
    columns that fit `width`."""
    markers = {}
    if not cmp.table.empty:
        markers = {(str(r["label"]), r["metric"]): r["marker"] for _, r in cmp.table.iterrows()}
    labels = [str(x) + (" (baseline)" if str(x) == baseline else "") for x in frame["label"]]
    first_w = min(max([len(x) for x in labels] + [3]), 40)
    cells: dict[str, list[str]] = {m: [] for m in metrics}
    for (_, row), lab in zip(frame.iterrows(), labels):
        for m in metrics:
            cells[m].append("failed" if row["status"] != "ok" else _term_cell(row, m, markers.get((str(row["label"]), m), "")))
    heads = {m: MI.label(m, k) + (" (objective)" if m == objective else "") for m in metrics}
    widths = {m: max([len(heads[m])] + [len(c) for c in cells[m]]) for m in metrics}
    blocks: list[list[str]] = [[]]
    used = first_w
    for m in metrics:
        if blocks[-1] and used + 2 + widths[m] > width:
            blocks.append([])
            used = first_w
        blocks[-1].append(m)
        used += 2 + widths[m]
    out = []
    for block in blocks:
        out.append("run".ljust(first_w) + "".join("  " + heads[m].rjust(widths[m]) for m in block))
        for i, lab in enumerate(labels):
            out.append(lab[:first_w].ljust(first_w) + "".join("  " + cells[m][i].rjust(widths[m]) for m in block))
        out.append("")
    return "\n".join(out).rstrip()


def terminal_text(verdict: str, table: str, baseline: str | None, paths: Mapping[str, Any], n_tests: int,
                  width: int = WIDTH) -> str:
    lines = ["", "=" * min(width, 40) + " verdict " + "=" * min(width, 40)]
    lines += textwrap.wrap(verdict, width)
    lines += ["", table, ""]
    if baseline is not None and n_tests:
        note = MI.LOWER_NOTE.replace(" ", "\u00a0")  # kept on one line
        lines += textwrap.wrap(f"Mean [95% CI]. {MI.MARKER_NOTE.format(baseline=baseline)}, significant after "
                               f"Holm's correction over {n_tests} comparisons. {note}.", width)
    elif MI.LOWER_MARK in table:
        lines.append(f"{MI.LOWER_NOTE}.")
    for name, p in paths.items():
        if p:
            lines.append(f"{name + ':':<10}{p}")
    return "\n".join(lines)
