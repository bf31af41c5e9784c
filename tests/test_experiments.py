"""The experiments layer without the pipeline: statistics, run loading, the report and its charts,
the compare CLI, MLflow tracking against a real local store, the benchmark registry.

Runs here are synthetic run directories (metrics.json + per_question.jsonl written by the test),
so these tests need no model and take seconds; tests/test_sweeps.py runs real sweeps."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eval.stats import bootstrap_ci
from experiments import charts
from experiments.aggregate import find_run_dirs, load_records, summary_frame
from experiments.compare import main as compare_main
from experiments.report import ReportSettings
from experiments.report_files import build_report
from experiments.stats import holm, min_detectable_effect, paired_bootstrap, sign_flip_p_value
from rag.store import strict_json

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
METRICS = ("recall_at_k", "mrr")


def assert_valid_png(path: Path) -> None:
    import matplotlib.image as mpimg

    assert path.exists(), path
    assert path.read_bytes()[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100, img.shape
    assert float(img[..., :3].std()) > 0.01, f"{path} is blank"


# ---------------------------------------------------------------------------------------------
# statistics


def test_bootstrap_ci_covers_known_mean():
    rng = np.random.default_rng(1)
    values = rng.normal(0.0, 0.2, size=300)
    values = values - values.mean() + 0.3  # a sample whose mean is exactly 0.3
    lo, hi = bootstrap_ci(values, n_resamples=1000, seed=0)
    assert lo < 0.3 < hi
    assert hi - lo < 0.1

    # Coverage over many samples from the same distribution is close to the nominal 95%.
    covered = 0
    trials = 200
    for i in range(trials):
        sample = rng.normal(0.3, 0.2, size=100)
        lo, hi = bootstrap_ci(sample, n_resamples=400, seed=i)
        covered += lo <= 0.3 <= hi
    assert 0.88 <= covered / trials <= 0.995, covered / trials


def test_paired_bootstrap_flags_a_real_difference_not_a_null_one():
    rng = np.random.default_rng(7)
    n = 200
    ids = [f"q{i}" for i in range(n)]
    base = rng.uniform(0, 1, n)  # question difficulty: large, shared by both variants
    better = np.clip(base + 0.05 + rng.normal(0, 0.05, n), 0, 1)
    noise = rng.normal(0, 0.05, n)
    null = base + (noise - noise.mean())  # per-question noise, no difference on average

    a = dict(zip(ids, base))
    d = paired_bootstrap(a, dict(zip(ids, better)), n_resamples=2000, seed=0)
    assert d.significant and d.direction == 1 and d.marker() == "▲"
    assert d.ci_low > 0 and d.mean_diff == pytest.approx(float(np.mean(better - base)))
    assert d.n == n and d.p_value < 0.01

    d0 = paired_bootstrap(a, dict(zip(ids, null)), n_resamples=2000, seed=0)
    assert not d0.significant and d0.direction == 0 and d0.marker() == ""
    assert d0.ci_low < 0 < d0.ci_high

    worse = paired_bootstrap(dict(zip(ids, better)), a, n_resamples=2000, seed=0)
    assert worse.direction == -1 and worse.marker() == "▼"

    # The same shift is invisible to unpaired intervals: they overlap widely.
    lo_a, hi_a = bootstrap_ci(base, 2000, seed=0)
    lo_b, hi_b = bootstrap_ci(better, 2000, seed=0)
    assert lo_b < hi_a


def test_paired_bootstrap_uses_common_questions_only():
    a = {"q1": 1.0, "q2": 0.0, "q3": None, "q4": 1.0}
    b = {"q1": 1.0, "q2": 1.0, "q3": 1.0, "q5": 0.0}
    d = paired_bootstrap(a, b, n_resamples=200)
    assert d.n == 2  # q3 has no value in a; q4, q5 are not in both
    assert d.mean_diff == pytest.approx(0.5)
    same = paired_bootstrap(a, a, n_resamples=200)
    assert (same.ci_low, same.ci_high) == (0.0, 0.0) and not same.significant
    empty = paired_bootstrap({"x": 1.0}, {"y": 1.0})
    assert empty.n == 0 and not empty.significant


def test_sign_flip_test_is_exact_on_small_samples_and_calibrated_under_the_null():
    from math import comb

    # d in {-1, +1}: the sign-flip test is the two-sided sign test, exactly
    d = np.array([1.0] * 8 + [-1.0] * 2)
    assert sign_flip_p_value(d) == pytest.approx(2 * sum(comb(10, i) for i in range(8, 11)) / 2**10)
    # ties (zero differences) carry no information; 40 wins and 20 losses among 100
    d = np.array([1.0] * 40 + [-1.0] * 20 + [0.0] * 40)
    exact = 2 * sum(comb(60, i) for i in range(40, 61)) / 2**60
    assert sign_flip_p_value(d, permutations=20_000) == pytest.approx(exact, abs=0.004)
    assert sign_flip_p_value(np.zeros(5)) == 1.0
    assert sign_flip_p_value(np.ones(30), permutations=999) == pytest.approx(1 / 1000)  # the +1 floor
    rng = np.random.default_rng(0)
    ps = np.array([sign_flip_p_value(rng.normal(0, 1, 40), 500, seed=i) for i in range(400)])
    assert 0.02 <= float(np.mean(ps < 0.05)) <= 0.09  # nominal 5% under the null


def test_holm_on_a_constructed_case():
    p = [0.01, 0.04, 0.03, 0.005, float("nan")]
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> 0.06 (monotone)
    adjusted = holm(p)
    assert adjusted[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02]) and np.isnan(adjusted[4])
    assert list(holm([0.5, 0.9])) == [1.0, 1.0]  # capped at 1
    # Holm against its definition on random p-values: reject the i-th smallest while p_(i) <= alpha/(m-i+1)
    rng = np.random.default_rng(2)
    for _ in range(50):
        p = rng.uniform(0, 0.05, 8) ** rng.uniform(0.5, 2)
        order = np.argsort(p)
        rejected = np.zeros(8, bool)
        for i, j in enumerate(order):
            if p[j] > 0.05 / (8 - i):
                break
            rejected[j] = True
        assert list(holm(p) <= 0.05) == list(rejected)


def test_minimum_detectable_effect_has_the_power_it_claims():
    assert min_detectable_effect(0.3, 150) == pytest.approx((1.959964 + 0.841621) * 0.3 / np.sqrt(150), rel=1e-5)
    assert min_detectable_effect(0.3, 150, alpha=0.05 / 20) > min_detectable_effect(0.3, 150)
    assert np.isnan(min_detectable_effect(0.0, 150)) and np.isnan(min_detectable_effect(0.3, 1))
    # differences of exactly the MDE are found about 80% of the time by the paired test
    rng = np.random.default_rng(4)
    n, sd = 100, 0.25
    effect = min_detectable_effect(sd, n)
    found = [sign_flip_p_value(rng.normal(effect, sd, n), 400, seed=i) < 0.05 for i in range(300)]
    assert 0.7 <= float(np.mean(found)) <= 0.9, np.mean(found)


# ---------------------------------------------------------------------------------------------
# synthetic runs


def write_run(path: Path, *, variant: str = "custom", overrides: list[str] = (), values: dict[str, list[float]],
              latency_ms: float = 10.0, job: int | None = None, k: int = 5, ids: list[str] | None = None,
              question_latency: list[float] | None = None) -> Path:
    """A run directory as the pipeline and Hydra leave it (metrics.json, per_question.jsonl,
    .hydra/overrides.yaml, .hydra/hydra.yaml)."""
    path.mkdir(parents=True, exist_ok=True)
    n = len(next(iter(values.values())))
    metrics = {}
    for m, v in values.items():
        lo, hi = bootstrap_ci(np.array(v), 200, seed=0)
        metrics[m] = {"mean": float(np.mean(v)), "ci95": [lo, hi], "n": n}
    config = {"variant": variant, "objective": "mrr", "eval": {"k": k, "bootstrap": {"resamples": 300, "seed": 0}},
              "chunker": {"_target_": "rag.chunker.SlidingWindowChunker", "chunk_size": 512, "chunk_overlap": 64},
              "fusion": {"_target_": "rag.retriever.fusion.WeightedFusion", "alpha": 0.5}}
    for o in overrides:
        key, _, val = o.lstrip("+").partition("=")
        node = config
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = json.loads(val) if val.replace(".", "", 1).isdigit() else val
    doc = {
        "variant": variant,
        "objective": {"name": "mrr", "value": metrics["mrr"]["mean"]},
        "metrics": metrics,
        "by_corpus": {"libc": metrics},
        "counts": {"questions": n, "chunks": 100},
        "latency": {"retrieve_ms_median": latency_ms, "total_ms_median": latency_ms},
        "timings_s": {"retrieve": 0.1, "score": 0.2},
        "artifacts": {},
        "config": config,
    }
    (path / "metrics.json").write_text(json.dumps(doc))
    rows = [{"id": ids[i] if ids else f"q{i}", "corpus": "libc", **{m: v[i] for m, v in values.items()}}
            for i in range(n)]
    for i, r in enumerate(rows if question_latency is not None else []):
        r["latency_ms"] = {"retrieve": question_latency[i] / 2, "rerank": question_latency[i] / 2}
    # as the pipeline writes it (rag.store.strict_json): a NaN given for "not measured" is null
    (path / "per_question.jsonl").write_text("".join(strict_json.dumps(r) + "\n" for r in rows))
    (path / ".hydra").mkdir(exist_ok=True)
    (path / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    mode = "MULTIRUN" if job is not None else "RUN"
    (path / ".hydra" / "hydra.yaml").write_text(
        f"hydra:\n  mode: {mode}\n  job:\n    num: {job if job is not None else '???'}\n"
        "  runtime:\n    choices:\n      chunker: sliding_window\n")
    return path


def synthetic_grid(root: Path, failed: tuple[int, float] | None = (512, 0.7)) -> Path:
    """A 2 x 3 chunk_size x alpha sweep directory; one job failed."""
    rng = np.random.default_rng(0)
    n = 40
    base = rng.uniform(0, 1, n)
    sweep = root / "sweep"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    job = 0
    for cs in (256, 512):
        for alpha in (0.3, 0.5, 0.7):
            ov = [f"chunker.chunk_size={cs}", "retriever=hybrid", f"fusion.alpha={alpha}"]
            d = sweep / str(job)
            if failed == (cs, alpha):
                (d / ".hydra").mkdir(parents=True)
                (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in ov))
                (d / "failure.json").write_text(json.dumps({"error_type": "RagError", "message": "boom"}))
            else:
                shift = 0.3 * alpha - 0.0002 * cs
                mrr = np.clip(base + shift + rng.normal(0, 0.02, n), 0, 1)
                rec = (mrr > 0.5).astype(float)
                write_run(d, overrides=ov, values={"recall_at_k": list(rec), "mrr": list(mrr)},
                          latency_ms=5 + cs / 100, job=job)
            job += 1
    return sweep


def test_load_records_finds_ok_failed_and_unfinished_runs(tmp_path):
    sweep = synthetic_grid(tmp_path)
    (sweep / "9" / ".hydra").mkdir(parents=True)  # killed before writing anything
    (sweep / "9" / ".hydra" / "overrides.yaml").write_text("- chunker.chunk_size=1024\n- fusion.alpha=0.9\n")
    (sweep / "mlruns" / "x").mkdir(parents=True)  # tracker copies are never runs
    (sweep / "mlruns" / "x" / "metrics.json").write_text("{}")
    dirs = find_run_dirs([tmp_path])
    assert [d.name for d in dirs] == ["0", "1", "2", "3", "4", "5", "9"]
    records = load_records([sweep])
    status = {r.path.name: r.status for r in records}
    assert status["5"] == "failed" and status["9"] == "failed" and status["0"] == "ok"
    assert records[5].failure["message"] == "boom"
    assert "no metrics.json" in records[6].failure["message"]
    df, varying, metrics = summary_frame(records)
    assert varying == ["chunker.chunk_size", "fusion.alpha"]
    assert metrics == list(METRICS)
    assert list(df["chunker.chunk_size"]) == [256, 256, 256, 512, 512, 512, 1024]
    assert df.loc[0, "label"] == "chunk_size=256 alpha=0.3"
    for col in ("status", "error", "mrr", "mrr_ci_low", "mrr_ci_high", "recall_at_k_n", "overrides"):
        assert col in df.columns


def test_report_marks_failures_differences_and_draws_grid_charts(tmp_path):
    sweep = synthetic_grid(tmp_path)
    rep = build_report(load_records([sweep]), sweep, ReportSettings())
    df = pd.read_csv(sweep / "summary.csv")
    assert len(df) == 6 and list(df["status"]).count("failed") == 1
    failed = df[df["status"] == "failed"].iloc[0]
    assert failed["error"] == "boom" and failed["error_type"] == "RagError"
    assert failed["chunker.chunk_size"] == 512 and failed["fusion.alpha"] == 0.7
    # the baseline is the cell with the configuration's defaults (chunk_size 512, alpha 0.5), not a corner
    assert df["baseline"].tolist().count(True) == 1 and df.loc[df["baseline"], "label"].tolist() == [
        "chunk_size=512 alpha=0.5"]

    # alpha raises MRR by 0.3 * 0.4 from 0.3 to 0.7: a clear paired difference vs the baseline
    cmp = pd.read_csv(sweep / "comparison.csv")
    row = cmp[(cmp["label"] == "chunk_size=256 alpha=0.7") & (cmp["metric"] == "mrr")].iloc[0]
    assert bool(row["significant"]) and row["marker"] == "▲" and row["ci_low"] > 0

    md = (sweep / "summary.md").read_text()
    assert "▲" in md and "(baseline)" in md and "## Failed jobs" in md and "boom" in md
    names = {p.name for p in rep.charts}
    assert {"grid_heatmap.png", "grid_heatmap.svg", "grid_heatmap_metrics.png", "latency_quality.png"} <= names
    assert "version_comparison.png" not in names  # the variant does not vary
    for p in rep.charts:
        if p.suffix == ".png":
            assert_valid_png(p)
            assert f"charts/{p.name}" in md
        else:
            assert p.read_text().lstrip().startswith("<?xml")


def test_version_chart_for_variants_and_configurable_baseline(tmp_path):
    rng = np.random.default_rng(3)
    base = rng.uniform(0, 1, 30)
    for i, v in enumerate(["v1", "v2", "v3"]):
        mrr = np.clip(base + 0.1 * i, 0, 1)
        write_run(tmp_path / "day1" / v if i < 2 else tmp_path / "day2" / v, variant=v, overrides=[f"+version={v}"],
                  values={"recall_at_k": list((mrr > 0.4).astype(float)), "mrr": list(mrr)})
    out = tmp_path / "report"
    rep = build_report(load_records([tmp_path / "day2", tmp_path / "day1"]), out, ReportSettings(baseline="v2"))
    assert rep.varying == ["variant"] and rep.baseline == "v2"
    assert list(rep.frame["label"]) == ["v3", "v1", "v2"]
    assert {p.name for p in rep.charts} >= {"version_comparison.png", "version_comparison.svg", "latency_quality.png",
                                            "win_tie_loss.png", "win_tie_loss.svg"}
    assert_valid_png(out / "charts" / "version_comparison.png")
    assert_valid_png(out / "charts" / "win_tie_loss.png")
    svg = (out / "charts" / "win_tie_loss.svg").read_text()
    assert "Questions won, tied and lost against v2" in svg
    cmp = rep.comparison.set_index(["label", "metric"])
    assert cmp.loc[("v1", "mrr"), "marker"] == "▼" and cmp.loc[("v3", "mrr"), "marker"] == "▲"
    # default baseline: v1 when present
    rep = build_report(load_records([tmp_path]), tmp_path / "r2", ReportSettings(charts=False))
    assert rep.baseline == "v1" and rep.charts == []


def test_one_numeric_parameter_draws_lines_and_many_draw_jobs(tmp_path):
    rng = np.random.default_rng(5)
    base = rng.uniform(0, 1, 20)
    for i, a in enumerate((0.1, 0.5, 0.9)):
        write_run(tmp_path / "alpha" / str(i), overrides=[f"fusion.alpha={a}"], job=i,
                  values={"recall_at_k": list((base > a).astype(float)), "mrr": list(base * a)})
    rep = build_report(load_records([tmp_path / "alpha"]), tmp_path / "r1")
    assert {p.name for p in rep.charts} >= {"metric_lines.png", "latency_quality.png"}
    assert_valid_png(tmp_path / "r1" / "charts" / "metric_lines.png")

    for i in range(5):  # an Optuna-like search: scattered values of three parameters
        ov = [f"fusion.alpha={rng.uniform():.3f}", f"eval.k={3 + i}", f"chunker.chunk_overlap={10 * i}"]
        write_run(tmp_path / "opt" / str(i), overrides=ov, job=i, values={"recall_at_k": [1.0, 0.0], "mrr": [0.5, 0.2 * i / 5]})
    rep = build_report(load_records([tmp_path / "opt"]), tmp_path / "r2")
    names = {p.name for p in rep.charts}
    assert "jobs_objective.png" in names and "grid_heatmap.png" not in names
    assert_valid_png(tmp_path / "r2" / "charts" / "jobs_objective.png")


def test_verdict_corrects_for_every_cell_and_reads_lower_is_better_metrics(tmp_path):
    """v2..v4 vs v1 on 120 questions. v2: MRR clearly higher, hallucination clearly lower (better),
    slower. Every run: recall 14 wins / 4 losses of 120 questions (sign test p = 0.031, not
    significant once corrected over the 12 cells)."""
    rng = np.random.default_rng(11)
    n = 120
    base = rng.uniform(0.2, 0.8, n)
    hall = (np.arange(n) % 10 < 4).astype(float)  # 40%
    rec = (np.arange(n) % 2).astype(float)
    lat = rng.uniform(8, 12, n)
    write_run(tmp_path / "v1", variant="v1", overrides=["+version=v1"], question_latency=list(lat),
              values={"recall_at_k": list(rec), "mrr": list(base), "hallucination": list(hall)})
    rec_up = rec.copy()
    rec_up[np.flatnonzero(rec == 0)[:14]] = 1.0
    rec_up[np.flatnonzero(rec == 1)[:4]] = 0.0
    for v, shift in (("v2", 0.1), ("v3", 0.0), ("v4", 0.0)):
        h = np.where(np.arange(n) % 10 < 1, 1.0, 0.0) if v == "v2" else hall
        write_run(tmp_path / v, variant=v, overrides=[f"+version={v}"],
                  question_latency=list(lat + (50 if v == "v2" else rng.normal(0, 0.5, n))),
                  values={"recall_at_k": list(rec_up), "mrr": list(np.clip(base + shift + rng.normal(0, 0.03, n), 0, 1)),
                          "hallucination": list(h)})
    rep = build_report(load_records([tmp_path]), tmp_path / "out", ReportSettings(charts=False, html=False))
    cmp = rep.comparison.set_index(["label", "metric"])
    assert rep.n_tests == 12 and set(cmp.index.get_level_values("metric")) == {"recall_at_k", "mrr", "hallucination",
                                                                                "latency_ms"}
    recall = cmp.xs("recall_at_k", level="metric")
    assert (recall["p_value"] < 0.05).all() and (recall["p_holm"] > 0.05).all()  # raw yes, corrected no
    assert not recall["significant"].any() and (recall["marker"] == "").all()
    # ▲ is better in the metric's own direction: fewer hallucinations are a ▲, slower retrieval a ▼
    assert cmp.loc[("v2", "mrr"), "marker"] == "▲" and cmp.loc[("v2", "hallucination"), "marker"] == "▲"
    assert cmp.loc[("v2", "latency_ms"), "marker"] == "▼"
    assert bool(cmp.loc[("v2", "hallucination"), "better"]) and not bool(cmp.loc[("v2", "latency_ms"), "better"])
    assert (cmp["n"] == n).all()

    words = rep.verdict.replace("\u00a0", " ")  # numbers keep their unit with a no-break space
    assert words.startswith(f"Against the baseline v1, over {n} shared questions:")
    assert "v2 beats v1 on MRR (sim) by +0.1" in words and "hallucination rate ↓ by -0.300" in words
    assert ", but loses on retrieval latency ↓ by +50.0 ms" in words
    assert "significant after Holm's correction over 12 comparisons" in words
    assert "Nothing else differs" in words and "recall@5 (sim) 0." in words  # what would have been detectable
    assert "v3" not in words and "v4" not in words

    md = (tmp_path / "out" / "summary.md").read_text()
    assert md.index("## Verdict") < md.index("## Results") and rep.verdict in md
    assert "No correction for multiple comparisons" not in md and "Holm–Bonferroni" in md
    assert "## Smallest detectable difference" in md and "hallucination rate ↓" in md
    df = pd.read_csv(tmp_path / "out" / "comparison.csv")
    assert {"p_value", "p_holm", "significant", "better", "mde", "n", "sd_diff"} <= set(df.columns)

    text = rep.terminal()
    assert rep.verdict.split(":")[0] in text and str(tmp_path / "out" / "summary.md") in text
    assert all(len(line) <= 100 for line in text.splitlines()), max(text.splitlines(), key=len)
    assert "0.60 [" in text or "▲" in text  # the headline table with CIs and markers


def test_win_tie_loss_counts_questions_in_the_metrics_direction(tmp_path):
    from experiments.verdict import win_tie_loss

    base = {"a": 0.5, "b": 0.5, "c": 0.5, "d": None, "e": 0.1}
    other = {"a": 0.7, "b": 0.5, "c": 0.2, "d": 0.9, "f": 1.0, "e": float("nan")}
    assert win_tie_loss(base, other, "mrr") == (1, 1, 1)  # d and e have no pair, f no baseline
    assert win_tie_loss(base, other, "hallucination") == (1, 1, 1)  # c went down: the win
    assert win_tie_loss({"a": 1.0}, {"a": 0.0}, "hallucination") == (1, 0, 0)

    write_run(tmp_path / "v1", variant="v1", overrides=["+version=v1"], values={"mrr": [0.5, 0.5, 0.5, 0.0]})
    write_run(tmp_path / "v2", variant="v2", overrides=["+version=v2"], values={"mrr": [1.0, 1.0, 0.5, 0.0]})
    rep = build_report(load_records([tmp_path]), tmp_path / "out", ReportSettings(charts=False, html=False))
    row = rep.comparison.iloc[0]
    assert (row["wins"], row["ties"], row["losses"]) == (2, 2, 0)
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "## Win / tie / loss vs baseline (v1)" in md and "| v2 | 2 / 2 / 0 |" in md
    assert {"wins", "ties", "losses"} <= set(pd.read_csv(tmp_path / "out" / "comparison.csv").columns)


def test_comparisons_use_shared_questions_only_and_say_so(tmp_path):
    rng = np.random.default_rng(1)
    v = rng.uniform(0, 1, 60)
    write_run(tmp_path / "v1", variant="v1", overrides=["+version=v1"], values={"mrr": list(v)})
    write_run(tmp_path / "v2", variant="v2", overrides=["+version=v2"], values={"mrr": list(v[10:] + 0.2)},
              ids=[f"q{i}" for i in range(10, 60)])
    rep = build_report(load_records([tmp_path]), tmp_path / "out", ReportSettings(charts=False, html=False))
    row = rep.comparison.iloc[0]
    assert (row["n"], row["n_run"], row["n_baseline"]) == (50, 50, 60)
    assert row["diff"] == pytest.approx(0.2)
    assert "over 50 shared questions" in rep.verdict and "v2 has 50 and v1 60" in rep.verdict

    write_run(tmp_path / "v3", variant="v3", overrides=["+version=v3"], values={"mrr": [0.5] * 5},
              ids=[f"other{i}" for i in range(5)])
    rep = build_report(load_records([tmp_path / "v1", tmp_path / "v3"]), tmp_path / "out2",
                       ReportSettings(charts=False, html=False))
    assert rep.comparison.empty and rep.verdict.startswith("No comparison: v1 and v3 share no question")


def test_single_run_verdict_gives_the_detectable_difference(tmp_path):
    rng = np.random.default_rng(1)
    write_run(tmp_path / "v1", variant="v1", overrides=["+version=v1"], values={"mrr": list(rng.uniform(0, 1, 80))})
    rep = build_report(load_records([tmp_path]), tmp_path / "out", ReportSettings(charts=False, html=False))
    assert rep.comparison.empty and rep.n_tests == 0
    assert rep.verdict.startswith("One run (v1): MRR (sim) 0.") and "over 80 questions" in rep.verdict
    assert rep.mde.iloc[0]["basis"].startswith("unpaired") and 0.1 < rep.mde.iloc[0]["mde"] < 0.3


def test_run_chart_and_labels():
    assert charts.metric_label("recall_at_k", 5) == "recall@5 (sim)"
    assert charts.metric_label("hallucination") == "hallucination rate ↓"  # lower is better, marked
    assert charts.metric_label("ndcg_at_k", 10) == "nDCG@10" and charts.metric_label("my_metric") == "my_metric"
    assert "0–1" in charts.metric_label("mrr", unit=True)
    assert charts.param_label("chunker.chunk_size", "tokens") == "chunk size (tokens)"
    df = pd.DataFrame({"latency_retrieve_ms_per_question": [1.0], "latency_total_ms_median": [2.0]})
    assert charts.latency_column(df) == "latency_total_ms_median"
    assert charts.latency_column(df[["latency_retrieve_ms_per_question"]]) == "latency_retrieve_ms_per_question"
    assert "ms" in charts.latency_label("latency_total_ms_median")


def test_compare_cli_mixes_sweeps_and_single_runs(tmp_path):
    sweep = synthetic_grid(tmp_path / "2025-01-01", failed=None)
    single = write_run(tmp_path / "2025-01-02" / "12-00-00-v1", variant="v1", overrides=["+version=v1"],
                       values={"recall_at_k": [1.0, 0.0, 1.0], "mrr": [1.0, 0.0, 0.5]})
    out = tmp_path / "cmp"
    assert compare_main([str(sweep), str(single.parent), "--out", str(out), "--formats", "png"]) == 0
    df = pd.read_csv(out / "summary.csv")
    assert len(df) == 7 and set(df["status"]) == {"ok"}
    assert (out / "summary.md").exists() and (out / "comparison.csv").exists()
    pngs = sorted((out / "charts").glob("*.png"))
    assert pngs and not list((out / "charts").glob("*.svg"))
    for p in pngs:
        assert_valid_png(p)
    assert compare_main([str(tmp_path / "nothing-here")]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert compare_main([str(empty)]) == 2  # nothing to compare is a user error too
    # default --out: a new directory under outputs/compare/<timestamp>, created (so claimed) at once
    from experiments.compare import default_out

    a = default_out(tmp_path / "compare")
    assert a.is_dir()
    assert default_out(tmp_path / "compare") != a


# ---------------------------------------------------------------------------------------------
# tracking


def test_mlflow_tracker_logs_to_a_local_store(tmp_path):
    pytest.importorskip("mlflow")
    from experiments.tracking import PARENT_RUN_FILE, MLflowTracker, NullTracker, mlflow_client

    assert NullTracker().log_job(tmp_path) is None
    uri = f"file:{tmp_path / 'mlruns'}"
    run = write_run(tmp_path / "sweep" / "0", variant="v2", overrides=["+version=v2", "fusion.alpha=0.3"],
                    values={"recall_at_k": [1.0, 0.0], "mrr": [1.0, 0.25]}, job=0)
    (run / "config_resolved.yaml").write_text("variant: v2\n")
    result = json.loads((run / "metrics.json").read_text())
    tracker = MLflowTracker(tracking_uri=uri, experiment="ragrig-test")

    parent = tracker.start_sweep(tmp_path / "sweep", ["fusion.alpha=0.3,0.7"])
    assert (tmp_path / "sweep" / PARENT_RUN_FILE).read_text() == parent
    run_id = tracker.log_job(run, result=result, overrides=["+version=v2", "fusion.alpha=0.3", "hydra.verbose=true"],
                             choices={"chunker": "sliding_window", "hydra/launcher": "basic"},
                             sweep_dir=tmp_path / "sweep", job_name="v2-0")
    failed_id = tracker.log_job(tmp_path / "sweep" / "1", failure={"error_type": "RagError", "message": "bad alpha"},
                                overrides=["fusion.alpha=1.5"], sweep_dir=tmp_path / "sweep")
    (tmp_path / "sweep" / "summary.csv").write_text("status,objective_value\nok,0.625\nfailed,\n")
    tracker.end_sweep(tmp_path / "sweep", [tmp_path / "sweep" / "summary.csv"])

    client = mlflow_client(uri)
    got = client.get_run(run_id)
    assert got.info.status == "FINISHED" and got.info.run_name == "v2-0"
    assert got.data.params == {"chunker": "sliding_window", "version": "v2", "fusion.alpha": "0.3"}
    assert got.data.metrics["mrr"] == pytest.approx(0.625)
    assert got.data.metrics["objective"] == pytest.approx(0.625)
    assert "mrr_ci_low" in got.data.metrics and "latency_total_ms_median" in got.data.metrics
    assert got.data.tags["mlflow.parentRunId"] == parent
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"metrics.json", "per_question.jsonl", "config_resolved.yaml", "charts"} <= artifacts
    assert [a.path for a in client.list_artifacts(run_id, "charts")] == ["charts/run_metrics.png"]
    local = client.download_artifacts(run_id, "per_question.jsonl", str(tmp_path / "dl"))
    assert Path(local).read_text() == (run / "per_question.jsonl").read_text()

    bad = client.get_run(failed_id)
    assert bad.info.status == "FAILED" and bad.data.tags["ragrig.error"] == "bad alpha"
    sweep_run = client.get_run(parent)
    assert sweep_run.info.status == "FINISHED" and sweep_run.data.metrics["jobs_failed"] == 1.0
    assert "summary.csv" in {a.path for a in client.list_artifacts(parent)}


def test_derived_latency_counts_only_questions_whose_retrieval_was_timed(tmp_path):
    """A run times a sample of its questions; a routed run also records every question's routing
    time. Routing alone is not a retrieval latency, so those questions are not compared."""
    from experiments.verdict import question_values

    run = write_run(tmp_path / "v2", variant="v2", values={"mrr": [0.5, 0.5, 0.5]})
    rows = [json.loads(line) for line in (run / "per_question.jsonl").read_text().splitlines()]
    rows[0]["latency_ms"] = {"route": 1.0, "retrieve": 4.0, "rerank": 2.0, "generate": 900.0}
    rows[1]["latency_ms"] = {"route": 1.5}
    rows[2]["latency_ms"] = {}
    (run / "per_question.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (rec,) = load_records([run])
    assert question_values(rec, "latency_ms") == {"q0": 7.0}


def test_every_metric_the_scorer_reports_has_a_name_and_a_meaning():
    """The report, charts and verdict read names and directions from metric_info; a metric missing
    there is shown under its raw field name with no explanation."""
    from eval.scoring import ALL_METRICS
    from experiments.metric_info import LATENCY, METRICS

    missing = [m for m in (*ALL_METRICS, "judge_faithfulness", "judge_correctness", LATENCY) if m not in METRICS]
    assert not missing
    assert all(METRICS[m].formula and METRICS[m].high and METRICS[m].low for m in METRICS)


def test_the_verdict_says_what_served_models_cost_when_they_cost_anything():
    from experiments.verdict import cost_words

    frame = pd.DataFrame([{"label": "v2", "status": "ok", "cost_total": 0.0, "currency": "USD"},
                          {"label": "v3", "status": "ok", "cost_total": 0.01234, "currency": "USD"},
                          {"label": "v4", "status": "failed", "cost_total": float("nan"), "currency": None}])
    assert cost_words(frame) == ("Served models cost (requests this run sent, at the config's pricing): "
                                 "v2 0.0000 USD, v3 0.0123 USD.")
    assert cost_words(frame.assign(cost_total=0.0)) == "" and cost_words(frame.drop(columns="cost_total")) == ""


def test_a_grid_reports_heatmaps_marks_the_cells_that_beat_its_baseline(tmp_path):
    """Through the whole report: the comparison table reaches the heatmaps, so the cells that
    differ significantly from the baseline are named in the chart, on the metric's 0–1 scale."""
    sweep = synthetic_grid(tmp_path, failed=None)
    rep = build_report(load_records([sweep]), sweep, ReportSettings(formats=("svg",), html=False))
    better = set(rep.comparison[rep.comparison["significant"] & rep.comparison["better"]
                                & (rep.comparison["metric"] == "mrr")]["label"])
    assert better  # alpha raises MRR by 0.3 * 0.4 from 0.3 to 0.7
    svg = (sweep / "charts" / "grid_heatmap.svg").read_text()
    assert "better" in svg and "baseline" in svg and "colours span the metric's full range" in svg


def test_compare_refuses_a_run_whose_pooling_was_interrupted_naming_the_command_that_finishes_it(tmp_path, capsys):
    from rag.run.rundir import mark_pooling

    a = write_run(tmp_path / "a", values={"mrr": [0.2, 0.4]})
    b = write_run(tmp_path / "b", values={"mrr": [0.3, 0.5]})
    mark_pooling([a, b], f"python -m experiments.pooling {a} {b}")
    assert compare_main([str(a), str(b), "--out", str(tmp_path / "out"), "--no-charts"]) == 2
    err = capsys.readouterr().err
    assert err == (f"compare: error: {a}: pooling its relevance labels was interrupted (pooling_pending.json), so its "
                   f"per_question.jsonl and metrics.json may disagree; finish it with: python -m experiments.pooling "
                   f"{a} {b}\n")
    assert not (tmp_path / "out").exists()


def test_compare_out_never_removes_what_a_received_marker_lists_outside_it(tmp_path):
    """--out is a results folder received from someone else, whose marker lists an absolute path
    and a path through a link: the comparison replaces only the files inside it."""
    from rag.run.rundir import REPORT_MARKER

    run = write_run(tmp_path / "run", values={"mrr": [0.2, 0.4]})
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("my thesis")
    (home / "figure.png").write_bytes(b"my figure")
    out = tmp_path / "received"
    out.mkdir()
    (out / "summary.md").write_text("their summary")
    (out / REPORT_MARKER).write_text(json.dumps({"files": [str(home / "thesis.tex"), "summary.md",
                                                           "../home/figure.png"]}))
    assert compare_main([str(run), "--out", str(out), "--no-charts", "--no-html"]) == 0
    assert (home / "thesis.tex").read_text() == "my thesis" and (home / "figure.png").read_bytes() == b"my figure"
    assert json.loads((out / REPORT_MARKER).read_text())["files"] == ["comparison.csv", "summary.csv", "summary.md"]
