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

from experiments import metric_info as MI

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FORMATS = ("png", "svg")
HATCHES = ["", "///", "...", "xxx", "\\\\\\", "+++", "ooo", "---", "***", "|||"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p"]
LINESTYLES = ["-", "--", "-.", ":"]
CMAP = "viridis"  # lightness rises monotonically: reads in grayscale

_RC = {
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
    ns = set()
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
             x_label: str, y_label: str, cbar_label: str, fontsize: float = 9, digits: int = 3,
             reverse: bool = False) -> None:
    """Annotated heatmap; `reverse` (lower-is-better metrics) keeps "brighter is better"."""
    from matplotlib.patches import Rectangle

    finite = grid[np.isfinite(grid)]
    vmin, vmax = (float(finite.min()), float(finite.max())) if len(finite) else (0.0, 1.0)
    if vmin == vmax:
        vmin, vmax = vmin - 0.05, vmax + 0.05
    cmap = matplotlib.colormaps[CMAP + ("_r" if reverse else "")].with_extremes(bad="white")
    im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", origin="lower")
    for i in range(len(ys)):
        for j in range(len(xs)):
            v = grid[i, j]
            if np.isfinite(v):
                r, g, b, _ = cmap((v - vmin) / (vmax - vmin))
                light = 0.299 * r + 0.587 * g + 0.114 * b > 0.5
                ax.text(j, i, f"{v:.{digits}f}", ha="center", va="center", fontsize=fontsize,
                        color="black" if light else "white", fontweight="bold")
            else:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="xxx", edgecolor="0.4", linewidth=0))
                ax.text(j, i, "failed" if failed[i, j] else "n/a", ha="center", va="center", fontsize=fontsize,
                        color="black", bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
    ax.set_xticks(range(len(xs)), [_fmt_tick(v) for v in xs])
    ax.set_yticks(range(len(ys)), [_fmt_tick(v) for v in ys])
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    cb = fig.colorbar(im, ax=ax, shrink=0.9)
    cb.set_label(cbar_label, fontsize=fontsize)
    cb.ax.tick_params(labelsize=fontsize - 1)


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
) -> list[Path]:
    """The objective over (x_key, y_key), annotated; then one small heatmap per metric."""
    paths: list[Path] = []
    over = f" (mean over {', '.join(others)})" if others else ""
    xs, ys, grid, failed = _grid(df, x_key, y_key, objective)
    fig = _new_figure(max(6.4, 1.6 + 1.1 * len(xs)), max(4.2, 1.7 + 0.7 * len(ys)))
    ax = fig.add_subplot()
    _heatmap(ax, fig, xs, ys, grid, failed, param_label(x_key, unit), param_label(y_key, unit),
             metric_label(objective, k, unit=True), fontsize=10, reverse=MI.lower_is_better(objective))
    ok = df[df["status"] == "ok"]
    note = ""
    if f"{objective}_ci_low" in ok and len(ok):
        half = float(np.nanmedian((ok[f"{objective}_ci_high"] - ok[f"{objective}_ci_low"]) / 2))
        nq = _n_questions(ok, [objective])
        note = f"\n({nq} questions per cell; typical 95% CI ±{half:.3f})"
    ax.set_title(f"Grid sweep: {metric_label(objective, k)} (objective) by {param_label(y_key, unit).split(' (')[0]}"
                 f" × {param_label(x_key, unit).split(' (')[0]}{over}{note}", fontsize=10.5)
    paths += save(fig, out_dir, "grid_heatmap", formats)

    ms = [m for m in metrics if m in df and df[m].notna().any()]
    if ms:
        ncols = min(3, len(ms))
        nrows = math.ceil(len(ms) / ncols)
        fig = _new_figure(4.7 * ncols, 3.3 * nrows + 0.5)
        for idx, m in enumerate(ms):
            ax = fig.add_subplot(nrows, ncols, idx + 1)
            xs, ys, grid, failed = _grid(df, x_key, y_key, m)
            _heatmap(ax, fig, xs, ys, grid, failed, param_label(x_key, unit), param_label(y_key, unit),
                     metric_label(m, k, unit=True), fontsize=7.5, digits=2, reverse=MI.lower_is_better(m))
            ax.set_title(metric_label(m, k), fontsize=9.5)
        note = f"; {MI.LOWER_NOTE} (its colours reversed: brighter is better)" if any(map(MI.lower_is_better, ms)) else ""
        fig.suptitle(f"Grid sweep: every metric (mean over questions){over}{note}", fontsize=11)
        paths += save(fig, out_dir, "grid_heatmap_metrics", formats)
    return paths


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
    if series_col:
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
    max_legend: int = 10,
) -> list[Path]:
    """Median per-question latency (x) against recall@k and MRR (y), one point per job. Up to
    `max_legend` jobs get a marker each (legend by job label); more are grouped by `group_col`."""
    ok = df[df["status"] == "ok"]
    col = latency_column(ok)
    ms = [m for m in metrics if m in ok and ok[m].notna().any()]
    if col is None or not ms or ok.empty:
        return []
    if len(ok) <= max_legend or group_col is None or group_col not in ok:
        keys = ok["label"].astype(str)
        legend_title = "job"
    else:
        keys = ok[group_col].map(_fmt_tick)
        legend_title = group_col
    groups = list(dict.fromkeys(keys))
    shades = _gray_shades(len(groups))
    fig = _new_figure(4.4 * len(ms) + 2.6, 4.3)
    axes = [fig.add_subplot(1, len(ms), i + 1) for i in range(len(ms))]
    for ax, m in zip(axes, ms):
        for gi, g in enumerate(groups):
            sub = ok[(keys == g).to_numpy()]
            ax.errorbar(sub[col], sub[m], yerr=_yerr(sub, m), linestyle="none", marker=MARKERS[gi % len(MARKERS)],
                        markersize=9.5 - 1.3 * (gi % 4), capsize=2.5, color=shades[gi], markeredgecolor="black",
                        markerfacecolor=shades[gi] if gi % 2 == 0 else "white", ecolor="0.35", elinewidth=0.8,
                        alpha=0.9, label=g)
        ax.set_xlabel(latency_label(col))
        ax.set_ylabel(metric_label(m, k, unit=True))
        ax.set_title(f"{metric_label(m, k)} vs latency", fontsize=10)
        ax.grid(linewidth=0.4, alpha=0.6)
        ax.margins(x=0.12)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, title=legend_title, loc="outside right center", title_fontsize=8, fontsize=7.5)
    fig.suptitle("Latency vs quality: one point per job (95% CI bars)", fontsize=11)
    return save(fig, out_dir, "latency_quality", formats)


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
