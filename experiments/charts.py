"""Charts of a set of runs (PNG and SVG), chosen from what varies between them.

- version comparison: one panel per metric, a bar per variant (or run) with its 95% CI
  (experiments.panels, with the per-corpus breakdown);
- grid sweep: heatmap of the objective over two numeric parameters (e.g. chunk size x alpha),
  annotated cells, plus one small heatmap per metric;
- one numeric parameter: metrics (or the objective per setting of the others) against it;
- latency vs quality: median per-question latency against recall@k and MRR, one point per job;
- otherwise (e.g. an Optuna search): the objective of each job in launch order, best so far.

Every chart is titled, its axes name their units, and series differ by hatch, marker and line
style, not by colour alone, so they read in grayscale. Built on matplotlib's object API (no
pyplot state), so it is safe in any process and needs no display.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib
import numpy as np
import pandas as pd

from experiments import chart_rules as R
from experiments import metric_info as MI

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from matplotlib.typing import RcKeyType

FORMATS = ("png", "svg")
HATCHES = ["", "///", "...", "xxx", "\\\\\\", "+++", "ooo", "---", "***", "|||"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p"]
LINESTYLES = ["-", "--", "-.", ":"]
CMAP = "viridis"  # lightness rises monotonically: reads in grayscale

_RC: dict[RcKeyType, Any] = {
    "svg.hashsalt": "ragrig",  # stable SVG ids
    "hatch.linewidth": 0.7,
    "axes.titlesize": 11,
    "axes.labelsize": 9.5,
    "xtick.labelsize": 8.5,
    "ytick.labelsize": 8.5,
    "legend.fontsize": 8,
}

PARAM_LABELS = {
    "chunker.chunk_size": "chunk size ({unit})",
    "chunker.chunk_overlap": "chunk overlap ({unit})",
    "chunker.min_chunk_size": "minimum chunk size ({unit})",
    "fusion.alpha": "fusion α (weight of dense scores, 0–1)",
    "fusion.k": "RRF k (rank offset)",
    "eval.k": "k (chunks scored per question)",
    "eval.tau_recall": "relevance threshold τ (cosine)",
    "retriever.candidates": "candidates per retriever (chunks)",
    "reranker.top_n": "reranker top-N (chunks)",
    "index.ef_search": "HNSW ef_search (candidates)",
    "index.M": "HNSW M (links per node)",
    "index.nprobe": "IVF nprobe (cells)",
    "index.nlist": "IVF nlist (cells)",
}


# ---------------------------------------------------------------------------------------------
# labels


def metric_label(name: str, k: Any = "k", unit: bool = False) -> str:
    """The metric's name for charts and tables, '↓' marking lower-is-better ones (metric_info)."""
    return MI.label(name, k, unit=unit)


def param_label(key: str, chunk_unit: str = "characters") -> str:
    if key == "variant":
        return "variant"
    return PARAM_LABELS.get(key, key).format(unit=chunk_unit)


def chunk_unit(config: dict[str, Any] | None) -> str:
    target = str(((config or {}).get("chunker") or {}).get("_target_", ""))
    return "tokens" if target.endswith("TokenChunker") else "characters"


LATENCY_PREFERENCE = ("latency_total_ms_median", "latency_retrieve_ms_median")


def latency_column(df: pd.DataFrame) -> str | None:
    """The per-question latency to plot: a median when the runs report one (end to end first),
    else retrieval time per question; None when no run reports latency."""
    derived = {MI.LATENCY, f"{MI.LATENCY}_ci_low", f"{MI.LATENCY}_ci_high", f"{MI.LATENCY}_n"}
    cols = [c for c in df.columns if c.startswith("latency_") and c not in derived and df[c].notna().any()]
    for c in LATENCY_PREFERENCE:
        if c in cols:
            return c
    for c in cols:
        if c.endswith("_ms_median"):
            return c
    for c in ("latency_retrieve_ms_per_question", *cols):
        if c in cols and c.endswith(("_ms_per_question", "_ms_median", "_ms")):
            return c
    return None


def latency_label(col: str) -> str:
    name = col.removeprefix("latency_")
    if name.endswith("_ms_median"):
        stage = name.removesuffix("_ms_median")
        stage = "end-to-end" if stage == "total" else stage
        return f"median {stage} latency per question (ms) {MI.LOWER_MARK}"
    if name.endswith("_ms_per_question"):
        stage = name.removesuffix("_ms_per_question")
        return f"{stage} time per question (ms, batch time / questions) {MI.LOWER_MARK}"
    return f"{name} (ms) {MI.LOWER_MARK}"


# ---------------------------------------------------------------------------------------------
# helpers


def _new_figure(w: float, h: float) -> Figure:
    # Imported here: matplotlib's figure machinery builds a font cache under $HOME on first import,
    # and a single run (which imports the report code but draws nothing) must write only its own
    # output and the artifact cache.
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), layout="constrained")


def save(fig: Figure, out_dir: Path, name: str, formats: Iterable[str] = FORMATS) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    with matplotlib.rc_context(_RC):
        for fmt in formats:
            p = out_dir / f"{name}.{fmt}"
            meta = {"Date": None} if fmt == "svg" else {"Software": "ragrig (matplotlib)"}
            fig.savefig(p, dpi=150, metadata=meta)
            paths.append(p)
    return paths


def _gray_shades(n: int, hi: float = 0.9) -> list[tuple[float, ...]]:
    """n colours of rising lightness (fills up to `hi`; lines and markers use a darker range)."""
    cmap = matplotlib.colormaps[CMAP]
    return [cmap(x) for x in np.linspace(0.15, hi, max(n, 1))][:n]


def _is_numeric(values: Sequence[Any]) -> bool:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return bool(vals) and all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in vals)


def _fmt_tick(v: Any) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{float(v):g}"
    return str(v)


def _yerr(df: pd.DataFrame, m: str) -> np.ndarray:
    mean = df[m].to_numpy(float)
    lo = df[f"{m}_ci_low"].to_numpy(float) if f"{m}_ci_low" in df else mean
    hi = df[f"{m}_ci_high"].to_numpy(float) if f"{m}_ci_high" in df else mean
    return np.vstack([np.clip(mean - lo, 0, None), np.clip(hi - mean, 0, None)])


def _n_questions(df: pd.DataFrame, metrics: list[str]) -> str:
    ns: set[int] = set()
    for m in metrics:
        if f"{m}_n" in df:
            ns.update(int(x) for x in df[f"{m}_n"].dropna() if x)
    if not ns:
        return ""
    return f"n = {min(ns)}" if len(ns) == 1 else f"n = {min(ns)}–{max(ns)}"


# ---------------------------------------------------------------------------------------------
# charts


def _grid(df: pd.DataFrame, x_key: str, y_key: str, value: str) -> tuple[list[Any], list[Any], np.ndarray, np.ndarray]:
    """(x values, y values, mean of `value` per cell over the other parameters, failed mask)."""
    xs = sorted(df[x_key].dropna().unique().tolist())
    ys = sorted(df[y_key].dropna().unique().tolist())
    grid = np.full((len(ys), len(xs)), np.nan)
    failed = np.zeros_like(grid, bool)
    for i, yv in enumerate(ys):
        for j, xv in enumerate(xs):
            cell = df[(df[x_key] == xv) & (df[y_key] == yv)]
            okc = cell[cell["status"] == "ok"]
            if len(okc) and value in okc and okc[value].notna().any():
                grid[i, j] = float(okc[value].mean())
            elif len(cell):
                failed[i, j] = True
    return xs, ys, grid, failed


def _heatmap(ax: Any, fig: Figure, xs: list[Any], ys: list[Any], grid: np.ndarray, failed: np.ndarray,
             x_label: str, y_label: str, cbar_label: str, limits: tuple[float, float], fontsize: float = 9,
             digits: int = 3, reverse: bool = False, marks: dict[tuple[int, int], str] | None = None) -> None:
    """Annotated heatmap on fixed `limits` (chart_rules.value_limits); `reverse` (lower-is-better
    metrics) keeps "brighter is better"; `marks` frames the baseline's cell and the cells that
    differ significantly from it, and names the change in the cell."""
    from matplotlib.patches import Rectangle

    vmin, vmax = limits
    cmap = matplotlib.colormaps[CMAP + ("_r" if reverse else "")].with_extremes(bad="white")
    im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", origin="lower")
    for i in range(len(ys)):
        for j in range(len(xs)):
            v = grid[i, j]
            word = (marks or {}).get((i, j), "")
            if np.isfinite(v):
                r, g, b, _ = cmap((v - vmin) / (vmax - vmin))
                ink = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
                text = f"{v:.{digits}f}" + (f"\n{word}" if word else "")
                ax.text(j, i, text, ha="center", va="center", fontsize=fontsize, color=ink, fontweight="bold",
                        linespacing=1.15)
            else:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="xxx", edgecolor="0.4", linewidth=0))
                ax.text(j, i, "failed" if failed[i, j] else "n/a", ha="center", va="center", fontsize=fontsize,
                        color="black", bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
            if word in ("better", "worse"):  # a frame that shows on dark and bright cells alike
                ax.add_patch(Rectangle((j - 0.46, i - 0.46), 0.92, 0.92, fill=False, edgecolor="black", linewidth=4.5))
                ax.add_patch(Rectangle((j - 0.46, i - 0.46), 0.92, 0.92, fill=False,
                                       edgecolor=R.BETTER if word == "better" else R.WORSE, linewidth=2.2))
            elif word == "baseline":
                ax.add_patch(Rectangle((j - 0.46, i - 0.46), 0.92, 0.92, fill=False, edgecolor="white",
                                       linewidth=1.6, linestyle=(0, (3, 2))))
    ax.set_xticks(range(len(xs)), [_fmt_tick(v) for v in xs])
    ax.set_yticks(range(len(ys)), [_fmt_tick(v) for v in ys])
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    cb = fig.colorbar(im, ax=ax, shrink=0.9)
    cb.set_label(cbar_label, fontsize=fontsize)
    cb.ax.tick_params(labelsize=fontsize - 1)


def _marks(df: pd.DataFrame, x_key: str, y_key: str, metric: str, comparison: pd.DataFrame | None,
           baseline: str | None) -> dict[tuple[int, int], str]:
    xs, ys, _, _ = _grid(df, x_key, y_key, metric)
    return R.cell_changes(df, x_key, y_key, xs, ys, R.significant_changes(comparison, metric), baseline)


MARK_NOTE = "framed cells: significantly better (blue) or worse (vermilion) than the baseline (dashed)"


def grid_heatmaps(
    df: pd.DataFrame,
    x_key: str,
    y_key: str,
    objective: str,
    metrics: list[str],
    out_dir: Path,
    k: Any = "k",
    unit: str = "characters",
    others: list[str] | None = None,
    formats: Iterable[str] = FORMATS,
    comparison: pd.DataFrame | None = None,
    baseline: str | None = None,
) -> list[Path]:
    """grid_heatmap and grid_heatmap_metrics (grid_heatmap_figures), saved."""
    figs = grid_heatmap_figures(df, x_key, y_key, objective, metrics, k, unit, others, comparison, baseline)
    return [p for name, fig in figs.items() for p in save(fig, out_dir, name, formats)]


def grid_heatmap_figures(
    df: pd.DataFrame,
    x_key: str,
    y_key: str,
    objective: str,
    metrics: list[str],
    k: Any = "k",
    unit: str = "characters",
    others: list[str] | None = None,
    comparison: pd.DataFrame | None = None,
    baseline: str | None = None,
) -> dict[str, Figure]:
    """The objective over (x_key, y_key), annotated; then one small heatmap per metric (and the
    retrieval latency). Colours span each metric's natural range, shared by every 0–1 metric, so
    a difference inside the noise looks small; cells that differ significantly from the baseline
    (`comparison`, experiments.verdict) are framed and say whether better or worse."""
    figs: dict[str, Figure] = {}
    over = f" (mean over {', '.join(others)})" if others else ""
    xs, ys, grid, failed = _grid(df, x_key, y_key, objective)
    fig = _new_figure(max(6.4, 1.6 + 1.1 * len(xs)), max(4.2, 1.7 + 0.7 * len(ys)))
    ax = fig.add_subplot()
    marks = _marks(df, x_key, y_key, objective, comparison, baseline)
    _heatmap(ax, fig, xs, ys, grid, failed, param_label(x_key, unit), param_label(y_key, unit),
             metric_label(objective, k, unit=True), R.value_limits(objective, grid.ravel()), fontsize=10,
             reverse=MI.lower_is_better(objective), marks=marks)
    ok = df[df["status"] == "ok"]
    note = ""
    if f"{objective}_ci_low" in ok and len(ok):
        half = float(np.nanmedian((ok[f"{objective}_ci_high"] - ok[f"{objective}_ci_low"]) / 2))
        nq = _n_questions(ok, [objective])
        note = f"\n{nq} questions per cell; typical 95% CI ±{half:.3f}; colours span the metric's full range"
    if any(w in ("better", "worse") for w in marks.values()):
        note += "\n" + MARK_NOTE
    elif baseline and marks:
        note += "\nno cell differs significantly from the baseline (dashed frame)"
    ax.set_title(f"Grid sweep: {metric_label(objective, k)} (objective) by {param_label(y_key, unit).split(' (')[0]}"
                 f" × {param_label(x_key, unit).split(' (')[0]}{over}{note}", fontsize=10)
    figs["grid_heatmap"] = fig

    ms = [m for m in metrics if m in df and df[m].notna().any()]
    if MI.LATENCY in df and df[MI.LATENCY].notna().any() and MI.LATENCY not in ms:
        ms.append(MI.LATENCY)
    if ms:
        grids = {m: _grid(df, x_key, y_key, m) for m in ms}
        limits = R.family_limits({m: grids[m][2].ravel().tolist() for m in ms})
        ncols = min(3, len(ms))
        nrows = math.ceil(len(ms) / ncols)
        fig = _new_figure(4.7 * ncols, 3.3 * nrows + 0.7)
        any_mark = False
        for idx, m in enumerate(ms):
            ax = fig.add_subplot(nrows, ncols, idx + 1)
            xs, ys, grid, failed = grids[m]
            marks = _marks(df, x_key, y_key, m, comparison, baseline)
            any_mark |= any(w in ("better", "worse") for w in marks.values())
            _heatmap(ax, fig, xs, ys, grid, failed, param_label(x_key, unit), param_label(y_key, unit),
                     metric_label(m, k, unit=True), limits[m], fontsize=7.5, digits=MI.info(m).decimals - 1,
                     reverse=MI.lower_is_better(m), marks=marks)
            ax.set_title(metric_label(m, k), fontsize=9.5)
        notes = ["colours span each metric's full range (one 0–1 scale for all 0–1 metrics)"]
        if any(map(MI.lower_is_better, ms)):
            notes.append(f"{MI.LOWER_NOTE} (its colours reversed: brighter is better)")
        if any_mark:
            notes.append(MARK_NOTE)
        fig.suptitle(f"Grid sweep: every metric (mean over questions){over}", fontsize=11)
        fig.supxlabel("\n".join(notes), fontsize=8.5)
        figs["grid_heatmap_metrics"] = fig
    return figs


def line_chart(
    df: pd.DataFrame,
    x_key: str,
    metrics: list[str],
    out_dir: Path,
    k: Any = "k",
    unit: str = "characters",
    series_col: str | None = None,
    objective: str | None = None,
    formats: Iterable[str] = FORMATS,
) -> list[Path]:
    """Metrics against one numeric parameter, with 95% CI bars. With `series_col`, the objective
    only, one line per value of series_col."""
    ok = df[df["status"] == "ok"].sort_values(x_key)
    if ok.empty:
        return []
    fig = _new_figure(6.8, 4.3)
    ax = fig.add_subplot()
    lines: list[tuple[str, pd.DataFrame, str]]
    if series_col:
        if objective is None:
            raise ValueError("line_chart: one line per series_col value needs the objective")
        lines = [(str(s), sub, objective) for s, sub in ok.groupby(series_col, sort=False)]
    else:
        lines = [(metric_label(m, k), ok, m) for m in metrics if m in ok and ok[m].notna().any()]
    for i, (name, sub, m) in enumerate(lines):
        sub = sub.groupby(x_key, as_index=False).mean(numeric_only=True).sort_values(x_key)
        ax.errorbar(sub[x_key], sub[m], yerr=_yerr(sub, m), label=name, marker=MARKERS[i % len(MARKERS)],
                    linestyle=LINESTYLES[i % len(LINESTYLES)], color="black" if i == 0 else _gray_shades(len(lines), 0.7)[i],
                    capsize=3, markersize=6, linewidth=1.3, markerfacecolor="white" if i % 2 else None)
    failed = df[df["status"] != "ok"]
    for xv in failed[x_key].dropna().unique():
        ax.axvline(xv, color="0.5", linestyle=":", linewidth=1)
        ax.text(xv, 0.02, " failed", rotation=90, fontsize=7, transform=ax.get_xaxis_transform(), va="bottom")
    ax.set_xlabel(param_label(x_key, unit))
    if series_col:
        ax.set_ylabel(metric_label(objective or "", k, unit=True))
        ax.set_title(f"{metric_label(objective or '', k)} (objective) vs {param_label(x_key, unit).split(' (')[0]}"
                     " with 95% CI", fontsize=10.5)
    else:
        ax.set_ylabel("mean over questions (0–1; similarities: cosine)")
        ax.set_title(f"Metrics vs {param_label(x_key, unit).split(' (')[0]} (mean with 95% bootstrap CI)")
    ax.grid(linewidth=0.4, alpha=0.6)
    ax.legend(title=series_col or "metric", title_fontsize=8)
    return save(fig, out_dir, "metric_lines", formats)


def latency_chart(
    df: pd.DataFrame,
    out_dir: Path,
    k: Any = "k",
    group_col: str | None = None,
    metrics: Sequence[str] = ("recall_at_k", "mrr"),
    formats: Iterable[str] = FORMATS,
    objective: str | None = None,
    limit: int = R.MAX_JOBS_SHOWN,
) -> list[Path]:
    """latency_quality (latency_figure), saved. `group_col` is kept for callers: the jobs' labels
    already name the parameters."""
    fig = latency_figure(df, k, metrics, objective, limit)
    return save(fig, out_dir, "latency_quality", formats) if fig else []


def latency_figure(df: pd.DataFrame, k: Any = "k", metrics: Sequence[str] = ("recall_at_k", "mrr"),
                   objective: str | None = None, limit: int = R.MAX_JOBS_SHOWN) -> Figure | None:
    """Median per-question latency (x) against recall@k and MRR (y), one point per job. Up to
    `limit` jobs get a colour and marker each (legend by job label); beyond, the baseline and the
    best by the objective do (chart_rules.shown_jobs, the title says so) and the rest are small
    grey dots for context. None when no two jobs report latency."""
    ok = df[df["status"] == "ok"]
    col = latency_column(ok)
    ms = [m for m in metrics if m in ok and ok[m].notna().any()]
    if col is None or not ms or ok.empty:
        return None
    shown = R.shown_jobs(ok, objective, limit)
    labels = ok["label"].astype(str)
    base = {str(x) for x, b in zip(ok["label"], ok["baseline"]) if bool(b)} if "baseline" in ok else set()
    rest = ok[~labels.isin(shown).to_numpy()]
    fig = _new_figure(4.4 * len(ms) + 2.6, 4.3)
    axes = [fig.add_subplot(1, len(ms), i + 1) for i in range(len(ms))]
    for ax, m in zip(axes, ms):
        if len(rest):
            ax.plot(rest[col], rest[m], linestyle="none", marker="o", markersize=4, color="0.7",
                    label=f"other {len(rest)} jobs")
        for gi, g in enumerate(shown):
            sub = ok[(labels == g).to_numpy()]
            colour = R.OKABE_ITO[gi % len(R.OKABE_ITO)]
            ax.errorbar(sub[col], sub[m], yerr=_yerr(sub, m), linestyle="none", marker=MARKERS[gi % len(MARKERS)],
                        markersize=9, capsize=2.5, color=colour, markeredgecolor="black", ecolor=colour,
                        elinewidth=1.0, alpha=0.95, label=g + (" (baseline)" if g in base else ""))
        ax.set_xlabel(latency_label(col))
        ax.set_ylabel(metric_label(m, k, unit=True))
        ax.set_title(f"{metric_label(m, k)} vs latency", fontsize=10)
        ax.grid(linewidth=0.4, alpha=0.6)
        ax.margins(x=0.12)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, title="job", loc="outside right center", title_fontsize=8, fontsize=7.5)
    note = R.shown_note(shown, len(ok), objective, k, has_baseline=bool(base & set(shown)))
    better = "" if any(map(MI.lower_is_better, ms)) else "; up and left is better"
    title = f"Latency vs quality: one point per job (95% CI bars{better})"
    fig.suptitle(title + (f"\n{note}" if note else ""), fontsize=11)
    return fig


def jobs_chart(df: pd.DataFrame, objective: str, out_dir: Path, k: Any = "k",
               formats: Iterable[str] = FORMATS) -> list[Path]:
    """The objective of each job in launch order (e.g. Optuna trials), with the best so far."""
    if df.empty:
        return []
    order = np.arange(len(df))
    x = np.array([j if isinstance(j, (int, np.integer)) else i for i, j in zip(order, df["job"])], float)
    y = df[objective].to_numpy(float) if objective in df else np.full(len(df), np.nan)
    okm = (df["status"] == "ok").to_numpy() & np.isfinite(y)
    fig = _new_figure(7.0, 4.2)
    ax = fig.add_subplot()
    sub = df[okm]
    ax.errorbar(x[okm], y[okm], yerr=_yerr(sub, objective), linestyle="none", marker="o", color="black",
                markerfacecolor="white", capsize=2.5, ecolor="0.45", elinewidth=0.9, label="job (95% CI)")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if okm.any():
        best = np.fmax.accumulate(np.where(okm, y, -np.inf))
        best[~np.isfinite(best)] = np.nan
        ax.step(x, best, where="post", color="0.35", linestyle="--", linewidth=1.2, label="best so far")
    for xf in x[~okm]:
        ax.plot([xf], [0], marker="x", color="black", linestyle="none", markersize=8)
    if (~okm).any():
        ax.plot([], [], marker="x", color="black", linestyle="none", label="failed job")
    ax.set_xlabel("job number (launch order)")
    ax.set_ylabel(metric_label(objective, k, unit=True))
    ax.set_title(f"{metric_label(objective, k)} (objective) per job")
    ax.grid(linewidth=0.4, alpha=0.6)
    ax.legend()
    return save(fig, out_dir, "jobs_objective", formats)
