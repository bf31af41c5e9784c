"""Charts made of small panels, one per metric, with horizontal bars: every label stays
horizontal and readable however many metrics and runs there are, and each metric gets its own
axis (latency in ms beside 0–1 scores). Lower-is-better metrics carry their ↓ mark.

- version_chart: a bar per variant/run (mean, 95% CI whisker, value, ▲/▼ vs the baseline with
  "better"/"worse" in the metric's own direction, in blue/vermilion);
- corpus_chart: per question corpus, a bar per run (beyond five runs, the baseline and the best
  four by the objective, the title says so);
- win_tie_loss_chart: per metric, each run's questions won, tied and lost against the baseline
  (colour-blind-safe blue/grey/orange, counts beside every bar);
- run_chart: one run, overall and per corpus (for run trackers).
"""
from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from experiments import chart_rules as R
from experiments import metric_info as MI
from experiments.charts import FORMATS, HATCHES, _gray_shades, _n_questions, _new_figure, _yerr, metric_label, save
from rag.run.result import RunResult, metric_columns

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _panel_grid(fig: Figure, n: int, ncols: int) -> list[Any]:
    nrows = math.ceil(n / ncols)
    return [fig.add_subplot(nrows, ncols, i + 1) for i in range(n)]


def _unit_range(metric: str, values: np.ndarray) -> bool:
    """Whether the metric's axis is 0–1: its range holds 0–1 (chart_rules.natural_range) and so
    do its values."""
    finite = values[np.isfinite(values)]
    inside = not len(finite) or (float(finite.min()) >= -0.001 and float(finite.max()) <= 1.001)
    rng = R.natural_range(metric, finite)
    return rng is not None and rng[0] <= 0 and rng[1] >= 1 and inside


def _value_axis(ax: Any, metric: str, k: Any, unit01: bool, top: float, room: float) -> None:
    """The value axis of a panel: 0–1 for 0–1 metrics, else from zero; its unit written under it."""
    if unit01:
        ax.set_xlim(0, 1 + room)
        ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0], ["0", ".25", ".5", ".75", "1"])
    else:
        ax.set_xlim(0, max(top, 1e-9) * (1 + room + 0.15))
    ax.set_xlabel(R.axis_unit(metric, k), fontsize=7.5, labelpad=1)


def _note_colour(note: str) -> str:
    """Blue for a note that says better, vermilion for worse, else black."""
    if note.endswith("better"):
        return R.BETTER
    if note.endswith("worse"):
        return R.WORSE
    return "black"


def _hbars(ax: Any, pos: np.ndarray, means: np.ndarray, err: np.ndarray, height: float, shades: list[Any],
           hatches: list[str], notes: list[str], digits: int) -> float:
    """Horizontal bars with CI whiskers and the value (and note, e.g. '▲ better') after each
    whisker, blue when the note says better and vermilion when worse. Returns the largest whisker end."""
    ax.barh(pos, np.nan_to_num(means), height, xerr=err, capsize=2, color=shades, edgecolor="black",
            linewidth=0.6, hatch=hatches, error_kw={"elinewidth": 0.8})
    ends = means + err[1]
    for y, v, e, note in zip(pos, means, ends, notes):
        if np.isfinite(v):
            ax.text(e, y, f" {v:.{digits}f}{(' ' + note) if note else ''}", va="center", ha="left", fontsize=7.5,
                    color=_note_colour(note), fontweight="bold" if note else "normal")
    return float(np.nanmax(ends)) if np.isfinite(ends).any() else 0.0


def version_chart(
    df: pd.DataFrame,
    metrics: list[str],
    out_dir: Path,
    k: Any = "k",
    group_col: str = "label",
    markers: dict[tuple[str, str], str] | None = None,
    formats: Iterable[str] = FORMATS,
    name: str = "version_comparison",
    title: str | None = None,
    baseline: str | None = None,
) -> list[Path]:
    """version_figure, saved as `name`."""
    fig = version_figure(df, metrics, k, group_col, markers, title, baseline)
    return save(fig, out_dir, name, formats) if fig else []


def version_figure(
    df: pd.DataFrame,
    metrics: list[str],
    k: Any = "k",
    group_col: str = "label",
    markers: dict[tuple[str, str], str] | None = None,
    title: str | None = None,
    baseline: str | None = None,
) -> Figure | None:
    """One small panel per metric, one horizontal bar per variant/run (mean with its 95% CI
    whisker and value). Panels keep every label horizontal and readable however many metrics
    and runs there are, and give each metric its own axis (latency in ms beside 0–1 scores).
    `markers[(group, metric)]` (▲/▼ vs a baseline, metric_info.marker) is printed after the value
    with the word it means, in blue (better) or vermilion (worse)."""
    ok = df[df["status"] == "ok"]
    groups = list(ok[group_col].astype(str))
    metrics = [m for m in metrics if m in ok and ok[m].notna().any()]
    if not groups or not metrics:
        return None
    n_g, n_m = len(groups), len(metrics)
    ncols = min(n_m, 4 if n_m > 6 else 3)
    nrows = math.ceil(n_m / ncols)
    label_w = min(max(len(g) for g in groups), 34) * 0.062
    fig = _new_figure(1.0 + label_w + 3.0 * ncols, 1.3 + nrows * (0.75 + 0.24 * n_g))
    axes = _panel_grid(fig, n_m, ncols)
    shades = _gray_shades(n_g)
    hatches = [HATCHES[i % len(HATCHES)] for i in range(n_g)]
    pos = np.arange(n_g)[::-1].astype(float)
    for idx, (ax, m) in enumerate(zip(axes, metrics)):
        means = ok[m].to_numpy(float)
        err = _yerr(ok, m)
        notes = [_change_note((markers or {}).get((g, m), "")) for g in groups]
        unit01 = _unit_range(m, np.concatenate([means, means + err[1]]))
        top = _hbars(ax, pos, means, err, 0.72, shades, hatches, notes, 3 if unit01 else 1)
        _value_axis(ax, m, k, unit01, top, 0.3 if unit01 and not any(notes) else 0.45)
        ax.set_yticks(pos, [textwrap.shorten(g, 34, placeholder="…") for g in groups] if idx % ncols == 0 else [])
        ax.set_title("\n".join(textwrap.wrap(metric_label(m, k), 26)), fontsize=9.5)
        ax.grid(axis="x", linewidth=0.4, alpha=0.6)
        ax.set_axisbelow(True)
        ax.tick_params(axis="x", labelsize=7.5)
    nq = _n_questions(ok, metrics)
    fig.suptitle(title or f"Variant comparison: mean of each metric with 95% bootstrap CI ({nq} questions)",
                 fontsize=11)
    notes = ["bar: mean over questions; whisker: 95% CI"]
    if markers and any(markers.values()):
        notes.append(MI.MARKER_NOTE.format(baseline=baseline or "the baseline")
                     + " (blue/vermilion), significant after Holm correction")
    if any(MI.lower_is_better(m) for m in metrics):
        notes.append(MI.LOWER_NOTE)
    fig.supxlabel("; ".join(notes), fontsize=8)
    return fig


def _change_note(marker: str) -> str:
    """'▲ better' or '▼ worse' for a significance marker; '' for none."""
    word = R.change(marker)
    return f"{marker} {word}" if word else marker


def _corpus_runs(tidy: pd.DataFrame, runs: list[str], frame: pd.DataFrame | None, objective: str | None,
                 limit: int) -> tuple[list[str], str]:
    """The runs a per-corpus chart shows and the title's note on the ones left out: every run up
    to `limit`; beyond, the baseline and the best by the objective (from `frame`, else from the
    first metric's question-weighted mean over the corpora, the first run as the baseline)."""
    if len(runs) <= limit:
        return runs, ""
    if frame is None:
        first = tidy[tidy["metric"] == tidy["metric"].iloc[0]]
        objective = objective or str(first["metric"].iloc[0])
        score = {r: float(np.average(g["mean"], weights=g["n"])) for r, g in first.groupby("run")}
        frame = pd.DataFrame({"label": runs, "status": "ok", "baseline": [i == 0 for i in range(len(runs))],
                              objective: [score.get(r, np.nan) for r in runs]})
    frame = frame[frame["label"].astype(str).isin(runs)]
    shown = [r for r in R.shown_jobs(frame, objective, limit)]
    base = bool("baseline" in frame and frame[frame["label"].astype(str).isin(shown)]["baseline"].any())
    return shown, R.shown_note(shown, len(runs), objective, has_baseline=base)


def corpus_chart(
    tidy: pd.DataFrame,
    metrics: list[str],
    out_dir: Path,
    k: Any = "k",
    formats: Iterable[str] = FORMATS,
    name: str = "corpus_breakdown",
    frame: pd.DataFrame | None = None,
    objective: str | None = None,
    limit: int = R.MAX_JOBS_SHOWN,
) -> list[Path]:
    """corpus_figure, saved as `name`."""
    fig = corpus_figure(tidy, metrics, k, frame, objective, limit)
    return save(fig, out_dir, name, formats) if fig else []


def corpus_figure(
    tidy: pd.DataFrame,
    metrics: list[str],
    k: Any = "k",
    frame: pd.DataFrame | None = None,
    objective: str | None = None,
    limit: int = R.MAX_JOBS_SHOWN,
) -> Figure | None:
    """Per question corpus: one panel per metric, one block of bars per corpus, one bar per run
    (mean with 95% CI). `tidy` has columns run, corpus, metric, mean, ci_low, ci_high, n. Beyond
    `limit` runs, the baseline and the best by `objective` (`frame`: the report's summary frame)."""
    if tidy.empty:
        return None
    runs = list(dict.fromkeys(tidy["run"].astype(str)))
    corpora = list(dict.fromkeys(tidy["corpus"].astype(str)))
    metrics = [m for m in metrics if m in set(tidy["metric"])]
    if not metrics or len(corpora) < 1:
        return None
    runs, shown_note = _corpus_runs(tidy, runs, frame, objective, limit)
    if frame is not None and "baseline" in frame:
        base = {str(x) for x, b in zip(frame["label"], frame["baseline"]) if bool(b)}
    else:
        base = set()
    n_r, n_c, n_m = len(runs), len(corpora), len(metrics)
    ncols = min(n_m, 3)
    nrows = math.ceil(n_m / ncols)
    fig = _new_figure(2.4 + 3.1 * ncols, 1.4 + nrows * (0.75 + 0.2 * n_r * n_c + 0.15 * n_c))
    axes = _panel_grid(fig, n_m, ncols)
    colours = [R.OKABE_ITO[i % len(R.OKABE_ITO)] for i in range(n_r)]
    height = 0.8 / n_r
    for idx, (ax, m) in enumerate(zip(axes, metrics)):
        sub = tidy[tidy["metric"] == m].set_index(["run", "corpus"])
        base_pos = np.arange(n_c)[::-1].astype(float)
        tops, unit01 = [], True
        for i, r in enumerate(runs):
            legend = None  # the first panel names the runs
            if idx == 0:
                legend = r + (" (baseline)" if r in base else "")
            vals = np.array([sub["mean"].get((r, c), np.nan) for c in corpora], float)
            lo = np.array([sub["ci_low"].get((r, c), np.nan) for c in corpora], float)
            hi = np.array([sub["ci_high"].get((r, c), np.nan) for c in corpora], float)
            unit01 &= _unit_range(m, np.concatenate([vals, hi]))
            err = np.vstack([np.clip(np.nan_to_num(vals - lo), 0, None), np.clip(np.nan_to_num(hi - vals), 0, None)])
            pos = base_pos + 0.4 - height * (i + 0.5)
            ax.barh(pos, np.nan_to_num(vals), height, xerr=err, capsize=1.5, color=colours[i], edgecolor="black",
                    linewidth=0.5, hatch=HATCHES[i % len(HATCHES)], error_kw={"elinewidth": 0.7},
                    label=legend)
            tops.append(float(np.nanmax(vals + err[1])) if np.isfinite(vals).any() else 0.0)
            for y, v, e in zip(pos, vals, vals + err[1]):
                if np.isfinite(v):
                    ax.text(e, y, f" {v:.2f}", va="center", ha="left", fontsize=6.5)
        _value_axis(ax, m, k, unit01, max(tops + [1e-9]), 0.22)
        ax.set_yticks(base_pos, corpora if idx % ncols == 0 else [])
        ax.set_title("\n".join(textwrap.wrap(metric_label(m, k), 26)), fontsize=9.5)
        ax.grid(axis="x", linewidth=0.4, alpha=0.6)
        ax.set_axisbelow(True)
        ax.tick_params(axis="x", labelsize=7.5)
    fig.legend(title="run", loc="outside right upper", title_fontsize=8, fontsize=7.5)
    title = "Per question corpus: mean of each metric with 95% bootstrap CI"
    fig.suptitle(title + (f"\n{shown_note}" if shown_note else ""), fontsize=11)
    note = "bar: mean over the corpus's questions; whisker: 95% CI"
    if any(MI.lower_is_better(m) for m in metrics):
        note += f"; {MI.LOWER_NOTE}"
    fig.supxlabel(note, fontsize=8)
    return fig


WTL_PARTS = (("wins", "won", R.WIN, "///"), ("ties", "tied", R.TIE, ""), ("losses", "lost", R.LOSS, "..."))


def win_tie_loss_chart(comparison: pd.DataFrame, metrics: list[str], out_dir: Path, baseline: str | None,
                       k: Any = "k", formats: Iterable[str] = FORMATS, name: str = "win_tie_loss") -> list[Path]:
    """win_tie_loss_figure, saved as `name`."""
    fig = win_tie_loss_figure(comparison, metrics, baseline, k)
    return save(fig, out_dir, name, formats) if fig else []


def win_tie_loss_figure(comparison: pd.DataFrame, metrics: list[str], baseline: str | None,
                        k: Any = "k") -> Figure | None:
    """One panel per metric, one stacked bar per run: the share of the shared questions on which
    it beats the baseline (blue), ties (grey) and loses (orange) (experiments.verdict.win_tie_loss);
    the counts on the segments wide enough to hold them and all three beside the bar."""
    if comparison.empty or "wins" not in comparison:
        return None
    metrics = [m for m in metrics if m in set(comparison["metric"])]
    runs = list(dict.fromkeys(comparison["label"].astype(str)))
    if not metrics or not runs:
        return None
    cells = comparison.set_index(["label", "metric"])
    ncols = min(len(metrics), 3)
    nrows = math.ceil(len(metrics) / ncols)
    fig = _new_figure(2.4 + 3.6 * ncols, 1.4 + nrows * (0.8 + 0.32 * len(runs)))
    axes = _panel_grid(fig, len(metrics), ncols)
    for idx, (ax, m) in enumerate(zip(axes, metrics)):
        pos = np.arange(len(runs))[::-1].astype(float)
        counts = {col: np.array([float(cells[col].get((r, m), np.nan)) for r in runs]) for col, *_ in WTL_PARTS}
        total = np.nansum(np.vstack(list(counts.values())), axis=0)
        left = np.zeros(len(runs))
        for col, word, colour, hatch in WTL_PARTS:
            share = np.nan_to_num(counts[col] / np.where(total > 0, total, np.nan))
            ax.barh(pos, share, 0.6, left=left, color=colour, edgecolor="black", linewidth=0.5, hatch=hatch,
                    label=word if idx == 0 else None)
            for y, x0, w, n in zip(pos, left, share, counts[col]):
                if w >= 0.08 and np.isfinite(n):
                    ax.text(x0 + w / 2, y, f"{int(n)}", va="center", ha="center", fontsize=7, fontweight="bold",
                            bbox={"boxstyle": "round,pad=0.12", "fc": "white", "ec": "none", "alpha": 0.85})
            left = left + share
        for j, y in enumerate(pos):
            w, t, lo = (counts[c][j] for c, *_ in WTL_PARTS)
            if np.isfinite([w, t, lo]).all():
                ax.text(1.02, y, f"{int(w)}/{int(t)}/{int(lo)}", va="center", ha="left", fontsize=7)
        ax.set_xlim(0, 1.3)
        ax.set_xticks([0, 0.5, 1.0], ["0", "½", "all"])
        ax.set_xlabel("share of the shared questions", fontsize=7.5, labelpad=1)
        ax.set_yticks(pos, runs if idx % ncols == 0 else [])
        ax.set_title("\n".join(textwrap.wrap(metric_label(m, k), 26)), fontsize=9.5)
        ax.grid(axis="x", linewidth=0.4, alpha=0.6)
        ax.set_axisbelow(True)
        ax.spines["right"].set_visible(False)
    fig.legend(loc="outside right upper", fontsize=7.5, title="questions", title_fontsize=8)
    fig.suptitle(f"Questions won, tied and lost against {baseline or 'the baseline'}", fontsize=11)
    note = "beside each bar: won/tied/lost counts"
    if any(MI.lower_is_better(m) for m in metrics):
        note += f"; {MI.LOWER_NOTE} (a lower value wins)"
    fig.supxlabel(note, fontsize=8)
    return fig


def run_chart(result: RunResult, out_dir: Path, formats: Iterable[str] = ("png",)) -> list[Path]:
    """One run: each metric overall and per question corpus, with 95% CIs (for run trackers)."""
    names = list(result.metrics)
    if not names:
        return []
    rows = [("all", result.metrics)] + list(result.by_corpus.items())
    frame = pd.DataFrame([{"label": label, "status": "ok", **metric_columns(per, names)} for label, per in rows])
    title = f"Run {result.variant}: metrics overall and per question corpus (95% CI)"
    return version_chart(frame, names, out_dir, k=result.k, formats=formats, name="run_metrics", title=title)
