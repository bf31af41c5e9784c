"""What the charts decide, checked on the figures they draw: colour scales span a metric's range
(not the noise between cells), metrics of one family share one scale, cells and bars that differ
significantly from the baseline say better or worse in the metric's own direction, crowded charts
show the baseline and the best jobs and say so, win/tie/loss uses colour-blind-safe colours with
the counts written, and every value axis names its unit.

The frames are built here in the shape experiments.report gives the charts (summary frame,
comparison table, per-corpus table), so these tests need no run directory."""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
from matplotlib.colors import to_rgba

from experiments import chart_rules as R
from experiments import metric_info as MI
from experiments.charts import grid_heatmap_figures, latency_figure
from experiments.panels import corpus_figure, version_figure, win_tie_loss_figure

SIZES, ALPHAS = (256, 512, 1024), (0.3, 0.5, 0.7)


def grid_frame(mrr: list[float], half_ci: float = 0.163, latency: list[float] | None = None) -> pd.DataFrame:
    """A 3 x 3 chunk size x alpha sweep as the report's summary frame; the middle cell is the baseline."""
    rows = []
    for i, (cs, a) in enumerate(itertools.product(SIZES, ALPHAS)):
        lat = latency[i] if latency else 40.0 + i
        rows.append({
            "job": i, "label": f"chunk_size={cs} alpha={a}", "status": "ok", "baseline": (cs, a) == (512, 0.5),
            "chunker.chunk_size": cs, "fusion.alpha": a,
            "mrr": mrr[i], "mrr_ci_low": mrr[i] - half_ci, "mrr_ci_high": mrr[i] + half_ci, "mrr_n": 30,
            "hit_at_k_id": 0.97 + 0.03 * (i % 2), "hit_at_k_id_ci_low": 0.9, "hit_at_k_id_ci_high": 1.0,
            MI.LATENCY: lat, f"{MI.LATENCY}_ci_low": lat - 2, f"{MI.LATENCY}_ci_high": lat + 2,
            "latency_total_ms_median": lat, "objective_value": mrr[i],
        })
    return pd.DataFrame(rows)


NOISE = [0.41, 0.39, 0.47, 0.44, 0.42, 0.49, 0.40, 0.45, 0.43]


def comparison(rows: list[tuple[str, str, float, float, float, bool]]) -> pd.DataFrame:
    """(label, metric, diff, ci_low, ci_high, significant) -> the report's comparison table."""
    return pd.DataFrame([{"label": lab, "metric": m, "diff": d, "ci_low": lo, "ci_high": hi, "significant": s,
                          "marker": MI.marker(m, d, s)} for lab, m, d, lo, hi, s in rows])


def cell_texts(ax) -> dict[tuple[int, int], str]:
    return {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}


def test_grid_heatmap_colours_span_the_metrics_range_not_the_observed_one():
    """0.39-0.49 inside a ±0.163 CI: on a scale stretched over those values noise looks decisive."""
    figs = grid_heatmap_figures(grid_frame(NOISE), "fusion.alpha", "chunker.chunk_size", "mrr", ["mrr"])
    ax = figs["grid_heatmap"].axes[0]
    assert ax.images[0].get_clim() == (0.0, 1.0)
    texts = cell_texts(ax)
    assert texts[(0, 0)].startswith("0.410") and texts[(2, 2)].startswith("0.430")  # values in the cells
    assert "full range" in ax.get_title() and "typical 95% CI ±0.163" in ax.get_title()
    # nothing differs: the baseline is shown and no cell claims a difference
    figs = grid_heatmap_figures(grid_frame(NOISE), "fusion.alpha", "chunker.chunk_size", "mrr", ["mrr"],
                                comparison=comparison([("chunk_size=1024 alpha=0.5", "mrr", 0.03, -0.1, 0.16, False)]),
                                baseline="chunk_size=512 alpha=0.5")
    texts = cell_texts(figs["grid_heatmap"].axes[0])
    assert texts[(1, 1)].endswith("baseline")
    assert not any("better" in t or "worse" in t for t in texts.values())
    assert "no cell differs significantly" in figs["grid_heatmap"].axes[0].get_title()


def test_grid_heatmap_metrics_share_one_scale_per_family_and_latency_has_its_own_in_ms():
    latency = [30.0, 31, 32, 45, 46, 47, 70, 71, 72]
    figs = grid_heatmap_figures(grid_frame(NOISE, latency=latency), "fusion.alpha", "chunker.chunk_size", "mrr",
                                ["mrr", "hit_at_k_id"])
    fig = figs["grid_heatmap_metrics"]
    panels = {ax.get_title(): ax for ax in fig.axes if ax.images}
    assert set(panels) == {MI.label("mrr"), MI.label("hit_at_k_id"), MI.label(MI.LATENCY)}
    # hit@k 0.97 vs 1.00 on the same 0–1 scale as MRR: no full-contrast panel for a 0.03 difference
    assert panels[MI.label("mrr")].images[0].get_clim() == panels[MI.label("hit_at_k_id")].images[0].get_clim() \
        == (0.0, 1.0)
    lo, hi = panels[MI.label(MI.LATENCY)].images[0].get_clim()
    assert lo == 0.0 and hi >= 72  # from zero: twice the colour is twice as slow
    colorbar_labels = [ax.get_ylabel() for ax in fig.axes if not ax.images]
    assert any("ms" in lab and MI.label(MI.LATENCY, mark=False) in lab for lab in colorbar_labels)
    assert all("0–1" in lab for lab in colorbar_labels if "ms" not in lab)


def test_grid_heatmap_frames_the_cells_that_differ_significantly_and_says_which_way():
    mrr = list(NOISE)
    mrr[5] = 0.62  # chunk_size=512 alpha=0.7
    latency = [40.0] * 9
    latency[6] = 90.0  # chunk_size=1024 alpha=0.3: slower, so a higher latency is worse
    cmp = comparison([
        ("chunk_size=512 alpha=0.7", "mrr", 0.2, 0.08, 0.31, True),
        ("chunk_size=256 alpha=0.5", "mrr", -0.03, -0.15, 0.09, False),
        ("chunk_size=1024 alpha=0.3", MI.LATENCY, 50.0, 44.0, 56.0, True),
    ])
    figs = grid_heatmap_figures(grid_frame(mrr, latency=latency), "fusion.alpha", "chunker.chunk_size", "mrr",
                                ["mrr"], comparison=cmp, baseline="chunk_size=512 alpha=0.5")
    ax = figs["grid_heatmap"].axes[0]
    texts = cell_texts(ax)
    assert texts[(1, 2)] == "0.620\nbetter" and texts[(1, 1)] == "0.420\nbaseline" and texts[(0, 1)] == "0.390"
    frames = {to_rgba(p.get_edgecolor()) for p in ax.patches}
    assert to_rgba(R.BETTER) in frames and to_rgba(R.WORSE) not in frames
    lat_ax = next(a for a in figs["grid_heatmap_metrics"].axes if a.get_title() == MI.label(MI.LATENCY))
    assert cell_texts(lat_ax)[(2, 0)].endswith("worse")
    assert to_rgba(R.WORSE) in {to_rgba(p.get_edgecolor()) for p in lat_ax.patches}


def test_grid_heatmap_frames_no_cell_whose_significant_difference_is_smaller_than_what_matters():
    """A held-back corpus's grid: +0.3 ms, significant, is no cell anybody should read as worse."""
    latency = [40.0] * 9
    latency[6] = 40.3
    cmp = comparison([("chunk_size=1024 alpha=0.3", MI.LATENCY, 0.3, 0.2, 0.4, True),
                      ("chunk_size=512 alpha=0.7", "mrr", 0.2, 0.08, 0.31, True)])
    cmp["min_effect"] = [MI.min_effect(MI.LATENCY, 40.0), MI.min_effect("mrr", 0.42)]
    cmp["matters"] = cmp["diff"].abs() >= cmp["min_effect"]
    assert R.significant_changes(cmp, MI.LATENCY) == {}
    assert R.significant_changes(cmp, "mrr") == {"chunk_size=512 alpha=0.7": "better"}
    figs = grid_heatmap_figures(grid_frame(NOISE, latency=latency), "fusion.alpha", "chunker.chunk_size", "mrr",
                                ["mrr"], comparison=cmp, baseline="chunk_size=512 alpha=0.5")
    lat_ax = next(a for a in figs["grid_heatmap_metrics"].axes if a.get_title() == MI.label(MI.LATENCY))
    assert not cell_texts(lat_ax)[(2, 0)].endswith("worse")
    assert to_rgba(R.WORSE) not in {to_rgba(p.get_edgecolor()) for p in lat_ax.patches}


def test_significance_without_a_correction_column_is_a_paired_ci_that_excludes_zero():
    table = pd.DataFrame([
        {"label": "a", "metric": "mrr", "diff": 0.1, "ci_low": 0.02, "ci_high": 0.18},
        {"label": "b", "metric": "mrr", "diff": 0.05, "ci_low": -0.01, "ci_high": 0.11},
        {"label": "c", "metric": "hallucination", "diff": 0.1, "ci_low": 0.05, "ci_high": 0.15},
    ])
    assert R.significant_changes(table, "mrr") == {"a": "better"}
    assert R.significant_changes(table, "hallucination") == {"c": "worse"}  # more hallucination


def nine_jobs() -> pd.DataFrame:
    mrr = [0.30, 0.55, 0.35, 0.60, 0.33, 0.50, 0.31, 0.58, 0.45]
    return grid_frame(mrr, half_ci=0.05, latency=[400.0 + 7 * i for i in range(9)])


def test_latency_chart_beyond_five_jobs_shows_the_baseline_and_the_best_four_and_says_so():
    frame = nine_jobs()
    fig = latency_figure(frame, k=5, metrics=("mrr",), objective="mrr")
    names = [t.get_text() for t in fig.legends[0].get_texts()]
    labels = list(frame["label"])
    best4 = [labels[i] for i in (1, 3, 5, 7)]  # MRR 0.55, 0.60, 0.50, 0.58
    baseline = labels[4]
    assert names == ["other 4 jobs", best4[0], best4[1], f"{baseline} (baseline)", best4[2], best4[3]]
    assert "top 5 of 9 jobs shown: the baseline and the best 4 by MRR" in fig._suptitle.get_text()
    assert "(ms)" in fig.axes[0].get_xlabel()
    # four jobs: all shown, no note
    fig = latency_figure(frame.iloc[:4], metrics=("mrr",), objective="mrr")
    assert len(fig.legends[0].get_texts()) == 4 and "shown" not in fig._suptitle.get_text()


def test_the_best_jobs_of_a_lower_is_better_objective_are_the_lowest():
    frame = nine_jobs().assign(hallucination=[0.9, 0.1, 0.8, 0.2, 0.5, 0.3, 0.7, 0.4, 0.6])
    shown = R.shown_jobs(frame, "hallucination")
    labels = list(frame["label"])
    assert shown == [labels[i] for i in (1, 3, 4, 5, 7)]  # 0.1, 0.2, baseline, 0.3, 0.4


def test_corpus_breakdown_beyond_five_runs_shows_the_baseline_and_the_best_four():
    frame = nine_jobs()
    tidy = pd.DataFrame([{"run": lab, "corpus": c, "metric": "mrr", "mean": v, "ci_low": v - 0.1,
                          "ci_high": v + 0.1, "n": 10}
                         for lab, v in zip(frame["label"], frame["mrr"]) for c in ("libc", "pubmed")])
    fig = corpus_figure(tidy, ["mrr"], k=5, frame=frame, objective="mrr")
    names = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(names) == 5 and f"{frame['label'][4]} (baseline)" in names
    assert "top 5 of 9 jobs shown" in fig._suptitle.get_text()
    assert fig.axes[0].get_xlim() == (0.0, 1.22) and "0–1" in fig.axes[0].get_xlabel()
    # without the summary frame: the first run is the baseline, the best by the first metric follow
    fig = corpus_figure(tidy, ["mrr"], k=5)
    names = [t.get_text() for t in fig.legends[0].get_texts()]
    assert names == [frame["label"][i] for i in (0, 1, 3, 5, 7)]


def test_win_tie_loss_uses_colour_blind_safe_colours_and_writes_every_count():
    table = pd.DataFrame([
        {"label": "v2", "metric": "mrr", "wins": 63, "ties": 0, "losses": 27},
        {"label": "v3", "metric": "mrr", "wins": 1, "ties": 87, "losses": 2},
    ])
    fig = win_tie_loss_figure(table, ["mrr"], "v1", k=5)
    ax = fig.axes[0]
    fills = [to_rgba(b.get_facecolor()) for b in ax.patches]
    assert set(fills) == {to_rgba(R.WIN), to_rgba(R.TIE), to_rgba(R.LOSS)}
    assert (R.WIN, R.TIE, R.LOSS) == ("#0072B2", "#BBBBBB", "#E69F00")  # Okabe-Ito blue, grey, orange
    texts = {t.get_text() for t in ax.texts}
    assert {"63/0/27", "1/87/2"} <= texts  # a 1-question win is too thin to hold its number
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["won", "tied", "lost"]
    assert ax.get_xlabel() == "share of the shared questions"


def test_every_value_axis_of_the_version_chart_names_its_unit():
    frame = pd.DataFrame([
        {"label": v, "status": "ok", "mrr": m, "mrr_ci_low": m - 0.05, "mrr_ci_high": m + 0.05,
         MI.LATENCY: lat, f"{MI.LATENCY}_ci_low": lat - 5, f"{MI.LATENCY}_ci_high": lat + 5}
        for v, m, lat in (("v1", 0.42, 38.0), ("v2", 0.52, 182.7), ("v3", 0.47, 20.0))])
    fig = version_figure(frame, ["mrr", MI.LATENCY], k=5)
    xlabels = {ax.get_title(): ax.get_xlabel() for ax in fig.axes}
    assert xlabels == {"MRR (sim)": "mean reciprocal rank, 0–1", MI.label(MI.LATENCY): "ms per question"}


def test_a_slower_run_reads_worse_and_a_faster_one_better_whatever_the_arrow():
    frame = pd.DataFrame([
        {"label": v, "status": "ok", MI.LATENCY: lat, f"{MI.LATENCY}_ci_low": lat - 5,
         f"{MI.LATENCY}_ci_high": lat + 5}
        for v, lat in (("v1", 38.0), ("v2", 182.7), ("v3", 20.0))])
    markers = {("v2", MI.LATENCY): MI.marker(MI.LATENCY, 144.7, True),
               ("v3", MI.LATENCY): MI.marker(MI.LATENCY, -18.0, True)}
    fig = version_figure(frame, [MI.LATENCY], k=5, markers=markers, baseline="v1")
    notes = {t.get_text().strip(): t.get_color() for t in fig.axes[0].texts}
    slower = next(t for t in notes if t.startswith("182.7"))
    faster = next(t for t in notes if t.startswith("20.0"))
    assert slower.endswith("worse") and notes[slower] == R.WORSE
    assert faster.endswith("better") and notes[faster] == R.BETTER
    assert notes["38.0"] == "black"  # the baseline: no mark
    assert np.isclose(fig.axes[0].get_xlim()[0], 0.0)  # latency bars start at zero


def test_jobs_without_an_objective_fill_the_view_in_launch_order():
    frame = nine_jobs().drop(columns=["objective_value", "mrr"])
    labels = list(frame["label"])
    assert R.shown_jobs(frame, "mrr") == [labels[i] for i in (0, 1, 2, 3, 4)]  # the baseline (4) among them
    assert R.shown_jobs(frame.drop(columns="baseline"), None, limit=3) == labels[:3]
