"""Sweeps end to end through Hydra's own entry point (`python run.py -m ...`) on the tiny corpus:
the summary and charts written by the multirun callback, failed jobs, the joblib launcher on a
shared cold cache, the sweep presets (grid, versions, Optuna) and MLflow tracking of a sweep."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from rag.store.cache import ArtifactCache
from rag.config.compose import PROJECT_ROOT
from tests.conftest import TINY_DOCS, TINY_QA, tiny_overrides, write_jsonl
from tests.test_experiments import assert_valid_png

ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    # One BLAS/OpenMP thread per process: parallel jobs (and parallel test runs) on a small machine
    # otherwise oversubscribe the cores and slow every encode by an order of magnitude.
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
TIMEOUT = 400


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    corpus = write_jsonl(root / "corpus.jsonl", [{"id": i, "text": t, "source": s} for i, s, t in TINY_DOCS])
    qa = write_jsonl(root / "qa.jsonl", [{"id": i, "question": q, "answer": a, "source": s, "corpus": c}
                                         for i, q, a, s, c in TINY_QA])
    return {"corpus": corpus, "qa": qa, "cache": root / "cache", "out": root / "out", "root": root}


def sweep_overrides(files: dict[str, Path]) -> list[str]:
    """tiny_overrides without the fixed chunk size (the sweeps set it)."""
    return [o for o in tiny_overrides(files) if not o.startswith("chunker.chunk_size=")]


def multirun(args: list[str], sweep_dir: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(PROJECT_ROOT / "run.py"), "-m", *args, f"hydra.sweep.dir={sweep_dir}"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env or ENV, timeout=TIMEOUT, cwd=PROJECT_ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def grid_sweep(tiny) -> Path:
    """The 2 x 2 chunk size x alpha grid, basic launcher, as a user runs it."""
    sweep = tiny["root"] / "grid"
    multirun(sweep_overrides(tiny) + ["chunker.chunk_size=100,150", "retriever=hybrid", "fusion.alpha=0.3,0.7"], sweep)
    return sweep


def test_grid_multirun_writes_summary_and_charts(grid_sweep):
    df = pd.read_csv(grid_sweep / "summary.csv")
    assert len(df) == 4
    assert list(df["job"]) == [0, 1, 2, 3]
    assert set(df["status"]) == {"ok"}
    assert list(df["chunker.chunk_size"]) == [100, 100, 150, 150]
    assert list(df["fusion.alpha"]) == [0.3, 0.7, 0.3, 0.7]
    assert (df["retriever"] == "hybrid").all()
    for m in ("recall_at_k", "mrr", "precision_at_k", "hit_at_k_id", "mrr_id"):
        for col in (m, f"{m}_ci_low", f"{m}_ci_high"):
            assert df[col].between(0, 1).all(), col
        assert (df[f"{m}_ci_low"] <= df[m]).all() and (df[m] <= df[f"{m}_ci_high"]).all()
    assert (df["objective"] == "mrr").all() and (df["objective_value"] == df["mrr"]).all()
    assert df["label"].tolist() == ["chunk_size=100 alpha=0.3", "chunk_size=100 alpha=0.7",
                                    "chunk_size=150 alpha=0.3", "chunk_size=150 alpha=0.7"]
    # each job's metrics.json is the source of its row
    for _, row in df.iterrows():
        m = json.loads((Path(row["run_dir"]) / "metrics.json").read_text())
        assert m["metrics"]["mrr"]["mean"] == pytest.approx(row["mrr"])

    md = (grid_sweep / "summary.md").read_text()
    assert "4 jobs: 4 ok, 0 failed" in md and "(baseline)" in md
    # the defaults (chunk_size 512, alpha 0.5), composed inside the running sweep, are not in this
    # grid: its first cell is the baseline, the verdict says why and names the best cell
    assert ("Baseline: chunk_size=100 alpha=0.3, the first run: no run has the configuration's default values "
            "(chunk_size=512, alpha=0.5)") in md
    assert "Best: " in md.split("## Results")[0]
    charts = grid_sweep / "charts"
    for name in ("grid_heatmap", "grid_heatmap_metrics", "latency_quality"):
        assert_valid_png(charts / f"{name}.png")
        assert (charts / f"{name}.svg").read_text().lstrip().startswith("<?xml")
        assert f"charts/{name}.png" in md
    assert not (charts / "version_comparison.png").exists()


def test_compare_rebuilds_from_sweep_and_single_run(grid_sweep, tiny, tmp_path):
    from experiments.compare import main as compare_main

    out = tmp_path / "cmp"
    assert compare_main([str(grid_sweep), str(grid_sweep / "0"), "--out", str(out)]) == 0  # duplicates dropped
    df = pd.read_csv(out / "summary.csv")
    assert len(df) == 4
    before = pd.read_csv(grid_sweep / "summary.csv")
    assert df["mrr"].tolist() == pytest.approx(before["mrr"].tolist())
    assert_valid_png(out / "charts" / "grid_heatmap.png")


@pytest.mark.heavy
def test_failing_job_is_recorded_and_does_not_stop_the_sweep_with_mlflow(tiny):
    """alpha=1.5 is a RagError in its job only; the sweep finishes, the summary says which job
    failed and why, and MLflow holds the sweep's parent run and both jobs."""
    pytest.importorskip("mlflow")
    sweep = tiny["root"] / "failing"
    store = tiny["root"] / "mlruns"
    args = sweep_overrides(tiny) + ["chunker.chunk_size=120", "retriever=hybrid", "fusion.alpha=1.5,0.5",
                                    "tracking=mlflow", f"tracking.tracking_uri=file:{store}", "tracking.experiment=sweeps"]
    done = multirun(args, sweep)
    assert "fusion.alpha must be in [0, 1], got 1.5" in done.stderr
    failure = json.loads((sweep / "0" / "failure.json").read_text())
    assert failure["error_type"] == "RagError" and failure["message"] == "fusion.alpha must be in [0, 1], got 1.5"
    assert not (sweep / "0" / "metrics.json").exists()
    assert (sweep / "1" / "metrics.json").exists() and not (sweep / "1" / "failure.json").exists()

    df = pd.read_csv(sweep / "summary.csv")
    assert df["status"].tolist() == ["failed", "ok"]
    assert df.loc[0, "error"] == "fusion.alpha must be in [0, 1], got 1.5"
    assert df.loc[0, "fusion.alpha"] == 1.5 and pd.isna(df.loc[0, "mrr"])
    md = (sweep / "summary.md").read_text()
    assert "2 jobs: 1 ok, 1 failed" in md and "## Failed jobs" in md

    from experiments.tracking import mlflow_client

    client = mlflow_client(f"file:{store}")
    exp = client.get_experiment_by_name("sweeps")
    runs = client.search_runs([exp.experiment_id])
    by_kind = {r.data.tags.get("ragrig.kind", "job"): r for r in runs}
    parent = by_kind["sweep"]
    jobs = [r for r in runs if r.data.tags.get("ragrig.kind") != "sweep"]
    assert len(jobs) == 2 and all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in jobs)
    status = {r.data.params["fusion.alpha"]: r for r in jobs}
    assert status["1.5"].info.status == "FAILED" and "got 1.5" in status["1.5"].data.tags["ragrig.error"]
    ok = status["0.5"]
    assert ok.info.status == "FINISHED" and ok.data.params["retriever"] == "hybrid"
    assert ok.data.metrics["mrr"] == pytest.approx(json.loads((sweep / "1" / "metrics.json").read_text())["metrics"]["mrr"]["mean"])
    assert {"per_question.jsonl", "metrics.json", "charts"} <= {a.path for a in client.list_artifacts(ok.info.run_id)}
    assert {"summary.csv", "summary.md", "charts"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}


@pytest.mark.heavy
def test_joblib_jobs_share_a_cold_cache(tiny, tmp_path):
    """Four jobs in two worker processes race for the same cold artifacts: each artifact is built
    exactly once, every job uses the same keys, and the cache holds nothing half-written."""
    cache = tmp_path / "cold-cache"
    sweep = tmp_path / "joblib"
    args = [o for o in sweep_overrides(tiny) if not o.startswith("paths.cache=")]
    args += [f"paths.cache={cache}", "chunker.chunk_size=120", "hydra/launcher=ragrig_joblib", "retriever=hybrid",
             "fusion.alpha=0.2,0.4,0.6,0.8"]
    done = multirun(args, sweep, env={**ENV, "RAGRIG_JOBS": "2"})
    assert "n_jobs=2" in done.stdout + done.stderr
    docs = [json.loads((sweep / str(i) / "metrics.json").read_text()) for i in range(4)]
    kinds = ("chunks", "vectors", "index", "bm25")
    for kind in kinds:
        keys = {d["artifacts"][kind]["key"] for d in docs}
        assert len(keys) == 1, (kind, keys)
        assert sum(not d["artifacts"][kind]["hit"] for d in docs) == 1, kind  # built once
        entries = [p.name for p in (cache / kind).iterdir() if not p.name.startswith(".")]
        assert entries == [keys.pop()], entries  # no temporary or duplicate directories
        assert ArtifactCache(cache).lookup(kind, entries[0], verify=True) is not None  # checksums hold
    # identical artifacts give identical retrieval for identical settings: counts agree across jobs
    assert len({json.dumps(d["counts"], sort_keys=True) for d in docs}) == 1
    df = pd.read_csv(sweep / "summary.csv")
    assert len(df) == 4 and set(df["status"]) == {"ok"}
    assert_valid_png(sweep / "charts" / "metric_lines.png")


@pytest.mark.heavy
def test_versions_preset_sweeps_plus_version(tiny):
    """`sweep=versions` sweeps the `+version` presets; the command line narrows the list."""
    sweep = tiny["root"] / "versions"
    done = multirun(sweep_overrides(tiny) + ["chunker.chunk_size=120", "sweep=versions", "+version=v1,v2"], sweep)
    df = pd.read_csv(sweep / "summary.csv")
    assert df["variant"].tolist() == ["v1", "v2"] and df["label"].tolist() == ["v1", "v2"]
    assert df["baseline"].tolist() == [True, False]
    assert_valid_png(sweep / "charts" / "version_comparison.png")
    md = (sweep / "summary.md").read_text()
    assert "v1 (baseline)" in md and "Differences vs baseline (v1)" in md
    # the multirun's last words: the verdict, the headline table and where the files are
    tail = done.stdout[done.stdout.index(" verdict "):]
    assert "Against the baseline v1" in tail and "v1 (baseline)" in tail
    assert f"report:   {sweep / 'report.html'}" in tail and f"summary:  {sweep / 'summary.md'}" in tail
    assert all(len(line) <= 100 for line in tail.splitlines())
    assert (sweep / "report.html").exists() and (sweep / "0" / "report.html").exists()


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=True)


def test_sweep_presets_compose(monkeypatch):
    grid = _compose(["sweep=chunk_alpha"])
    assert dict(grid.hydra.sweeper.params) == {"chunker.chunk_size": "256,512,1024", "fusion.alpha": "0.3,0.5,0.7"}
    assert grid.retriever._target_.endswith("HybridRetriever") and grid.fusion._target_.endswith("WeightedFusion")

    versions = _compose(["sweep=versions"])
    listed = versions.hydra.sweeper.params["+version"].split(",")
    assert listed == ["v1", "v2", "v3", "v4"]
    for v in listed:  # every swept version is a preset (v3/v4 come with the reranking work)
        if not (PROJECT_ROOT / "conf" / "version" / f"{v}.yaml").exists():
            pytest.skip(f"conf/version/{v}.yaml does not exist yet")

    opt = _compose(["sweep=optuna"])
    assert opt.hydra.sweeper._target_.endswith("OptunaSweeper") and opt.hydra.sweeper.direction == "maximize"
    assert set(opt.hydra.sweeper.params) == {"chunker.chunk_size", "chunker.chunk_overlap", "fusion.alpha",
                                             "retriever.candidates", "eval.k"}
    assert opt.retriever._target_.endswith("HybridRetriever")

    monkeypatch.setenv("RAGRIG_JOBS", "3")
    assert _compose(["hydra/launcher=ragrig_joblib"]).hydra.launcher.n_jobs == 3
    assert _compose([]).hydra.callbacks.sweep_summary._target_ == "experiments.callbacks.SweepSummaryCallback"
    assert _compose([]).tracking._target_ == "experiments.tracking.NullTracker"


@pytest.mark.heavy
def test_optuna_sweep_maximizes_the_objective(tiny):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    sweep = tiny["root"] / "optuna"
    args = sweep_overrides(tiny) + ["sweep=optuna", "hydra.sweeper.n_trials=2", "chunker.chunk_size=choice(100,150)",
                                    "chunker.chunk_overlap=choice(0,20)", "retriever.candidates=choice(10,20)"]
    multirun(args, sweep)
    results = (sweep / "optimization_results.yaml").read_text()
    assert "best_value" in results and "best_params" in results
    df = pd.read_csv(sweep / "summary.csv")
    assert len(df) == 2 and set(df["status"]) == {"ok"}
    import yaml

    best = yaml.safe_load(results)["best_value"]
    assert best == pytest.approx(df["mrr"].max())
    assert (sweep / "charts" / "latency_quality.png").exists()
