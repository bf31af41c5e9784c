"""The benchmark families (benchmarks) in tiny configurations: they run and return
the keys that the CLI's --headline and docs/reference/bench.md rely on. The figures themselves come from
`python -m benchmarks` (see docs/reference/bench.md)."""
from __future__ import annotations

import importlib.util
import inspect
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import REGISTRY, bm25, common, faiss_indexes
from rag.config.compose import PROJECT_ROOT

COMMON_KEYS = {"table", "environment", "wall_s", "loadavg_start", "loadavg_end"}


def _check_table(res):
    assert COMMON_KEYS <= set(res), set(res)
    assert res["table"] and all({"measure", "value", "unit", "note"} <= set(r) for r in res["table"])
    assert "loadavg_1_5_15" in res["environment"]


def test_registry_functions_take_quick_and_full():
    assert set(REGISTRY) == {"bm25", "faiss", "encoding", "onnx", "reranker_backends", "end_to_end", "scale", "medline", "ray_encoding",
                             "generation", "serving", "served_models", "generation_speed", "openvino_generation",
                             "retrieval_latency", "alpha_sweep",
                             "grid_sweep", "reranking", "demo", "xdomain", "own_data"}
    for fn in REGISTRY.values():
        params = inspect.signature(fn).parameters
        assert list(params)[:2] == ["quick", "full"] and "tiny" in params


def test_zipf_corpus_and_queries():
    texts = list(common.zipf_texts(2000, seed=3))
    lengths = np.array([len(t.split()) for t in texts])
    assert len(texts) == 2000 and 55 < lengths.mean() < 65
    words = " ".join(texts).split()
    _, counts = np.unique(words, return_counts=True)
    counts = np.sort(counts)[::-1]
    assert counts[0] > 5 * counts[9]  # a heavy head, as in a Zipf law
    qs = common.zipf_queries(20)
    assert all(3 <= len(q.split()) <= 6 for q in qs)
    assert texts == list(common.zipf_texts(2000, seed=3))  # deterministic


def test_structured_vectors_have_near_neighbours():
    x = common.structured_vectors(3000, seed=0)
    q = common.structured_vectors(20, seed=1)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, rtol=1e-5)
    sims = np.sort(q @ x.T, axis=1)[:, ::-1]
    assert sims[:, 0].mean() > 0.6 and abs(float((x[:500] @ x[500:1000].T).mean())) < 0.05


def test_peak_rss_probe_sees_numpy_memory():
    # In a fresh interpreter: in the test process, memory freed by earlier tests can be reused
    # without a page fault, and a new array need not raise the peak at all.
    probe = (
        "import numpy as np\n"
        "from benchmarks import common\n"
        "before = common.proc_mem()\n"
        "assert common.reset_peak()\n"
        "a = np.ones(50 * 2**20 // 8)\n"
        "a[::512] = 2.0\n"
        "after = common.proc_mem()\n"
        "print(after['VmHWM'] - before['VmRSS'])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
    )
    assert int(out.stdout.strip()) > 40 * 2**20


def test_bm25_tiny():
    res = bm25.bench_bm25(quick=True, full=False, tiny=True)
    _check_table(res)
    (comp,) = res["comparisons"]
    for side in ("bm25s", "rank_bm25"):
        c = comp[side]
        assert c["build_s"] > 0 and c["query_ms_median"] > 0 and "peak_build_delta_mb" in c
    assert comp["query_speedup"] > 0 and comp["build_ratio"] > 0


def test_bm25_skips_rank_bm25_past_its_time_limit(monkeypatch):
    monkeypatch.setattr(bm25, "RANK_BM25_LIMIT_S", 0.0)
    res = bm25.bench_bm25(quick=True, full=False, tiny=True, sizes=(500, 1000), n_queries=5)
    assert [s["n_docs"] for s in res["skipped"]] == [1000]
    assert {(c["backend"], c["n_docs"]) for c in res["cases"]} == {("bm25s", 500), ("rank_bm25", 500), ("bm25s", 1000)}
    assert any(r["value"] == "skipped" for r in res["table"])


def test_faiss_tiny():
    res = faiss_indexes.bench_faiss(quick=True, full=False, tiny=True, sizes=(2000,))
    _check_table(res)
    cases = {c["index"]: c for c in res["cases"]}
    has_chroma = importlib.util.find_spec("chromadb") is not None  # the chroma extra
    assert set(cases) == ({"flat_l2", "flat_ip", "hnsw", "ivf", "ivf_sq8", "ivf_pq", "ivf_pq_refine", "hnsw_sq8"}
                          | ({"chroma"} if has_chroma else set()))
    assert [s["index"] for s in res["skipped"]] == ([] if has_chroma else ["chroma"])
    assert cases["flat_ip"]["recall_at_10"] == 1.0 and cases["hnsw"]["recall_at_10"] > 0.9
    for c in cases.values():
        assert c["build_s"] >= 0 and c["query_ms_median"] > 0 and c["qps_batched"] > 0
    assert cases["flat_l2"]["vs_bandwidth_floor"] > 0 and res["floors"]["2000"]["floor_ms"] > 0


def test_faiss_long_cases_only_with_full(monkeypatch):
    monkeypatch.setattr(faiss_indexes, "FULL_ONLY", {("hnsw", 1500): "too long"})
    res = faiss_indexes.bench_faiss(quick=True, full=False, tiny=True, sizes=(1500,))
    assert "hnsw" not in {c["index"] for c in res["cases"]}
    assert res["skipped"][0]["index"] == "hnsw"


def test_medline_tiny_reads_the_generated_baseline_by_glob():
    from benchmarks.medline import bench_medline

    res = bench_medline(quick=True, full=False, tiny=True)
    _check_table(res)
    assert res["files"] == 2 and res["articles"] == 400 and res["articles_per_s"] > 0
    assert res["uncompressed_mb"] > res["compressed_mb"] > 0


def test_scale_tiny():
    from benchmarks.scale import bench_scale

    res = bench_scale(quick=True, full=False, tiny=True)
    _check_table(res)
    case = res["sizes"]["3000"]
    assert "error" not in case, case.get("error")
    assert case["peak_rss_mb"] > 0 and len(case["phases"]) == 7 and case["chunk_set_is_store"]
    assert case["recall_at_10"] > 0.5 and case["hybrid_ms_p50"] > 0
    assert [o["index"] for o in case["other_indexes"]] == ["ivf_sq8", "hnsw_sq8"]
    assert set(case["targets"]) == {"peak_rss_mb", "hybrid_p50_ms", "recall_at_10", "build_s"}


@pytest.mark.slow
def test_bm25_case_in_a_fresh_process():
    res = bm25.bench_bm25(quick=True, full=False, tiny=True, sizes=(500,), n_queries=5, isolate=True)
    assert all("error" not in c and "process_wall_s" in c for c in res["cases"])


@pytest.mark.slow
def test_encoding_tiny():
    from benchmarks.encoding import bench_encoding

    res = bench_encoding(quick=True, full=False, tiny=True)
    _check_table(res)
    assert res["harness_vs_bare"] > 0 and res["max_abs_diff_vs_bare"] < 1e-5
    assert res["cache_hit_is_hit"] and not res["cache_hit_model_loaded"]


@pytest.mark.slow
def test_onnx_tiny():
    pytest.importorskip("onnxruntime")
    from benchmarks.onnx_backend import bench_onnx

    res = bench_onnx(quick=True, full=False, tiny=True)
    _check_table(res)
    s = res["speed"]
    assert s["onnx"]["cosine_min"] > 0.999 and s["onnx_int8"]["cosine_min"] > 0.95
    assert s["onnx"]["speedup_vs_torch"] > 0 and res["quality"] == {}


@pytest.mark.slow
def test_reranker_backends_tiny_sets_each_backend_against_its_gemm_ceiling():
    pytest.importorskip("onnxruntime")
    from benchmarks.reranker_backends import bench_reranker_backends

    res = bench_reranker_backends(quick=True, full=False, tiny=True)
    _check_table(res)
    b = res["backends"]
    assert {"torch fp32", "onnx fp32"} <= set(b) and res["pairs"] == res["pool"] * res["questions"]
    assert all(x["gflops"] > 0 and x["vs_gemm_ceiling"] > 0 for x in b.values())
    assert b["torch fp32"]["overlap"] == 1.0 and b["onnx fp32"]["overlap"] == 1.0, "ONNX fp32 keeps fp32's order"
    assert res["auto"]["picks"] in b and res["auto"]["line"].startswith(res["auto"]["picks"])
    assert ("torch bf16" in b) == ("bf16" in res["gemm_gflops"])
    assert res["gflop"] > 0 and res["padded_tokens"] >= res["tokens"]


@pytest.mark.slow
def test_end_to_end_tiny():
    from benchmarks.end_to_end import bench_end_to_end

    res = bench_end_to_end(quick=True, full=False, tiny=True)
    _check_table(res)
    v1 = res["runs"]["v1"]
    assert "error" not in v1["cold"], v1["cold"]
    assert "embed" in v1["cold"]["timings_s"] and all(v1["warm"]["artifacts_hit"].values())
    assert not all(v1["cold"]["artifacts_hit"].values())


def test_generation_prompts_hold_their_answer_among_five_passages():
    from benchmarks.generation import PASSAGES, rag_prompts

    questions, contexts, truths = rag_prompts(7)
    answers = [json.loads(line)["answer"] for line in (PROJECT_ROOT / "data/qa/pytorch.jsonl").read_text().splitlines()]
    assert len(questions) == len(contexts) == 7 and truths == answers[:7]
    for i, ctx in enumerate(contexts):
        assert len(ctx) == PASSAGES and [c.text for c in ctx].count(answers[i]) == 1
        assert [c.text for c in ctx].index(answers[i]) == i % PASSAGES  # the answer is not always first


@pytest.mark.slow
def test_generation_tiny_runs_the_cpu_baseline():
    from benchmarks.generation import bench_generation

    res = bench_generation(quick=True, full=False, tiny=True)
    _check_table(res)
    cpu = res["variants"]["cpu_float32"]
    assert cpu["new_tokens"] > 0 and cpu["tokens_per_s"] > 0 and len(cpu["answers"]) == 2
    assert -1 <= res["quality"]["cpu_float32"]["answer_gt"] <= 1


def test_generation_answer_quality_pairs_each_variant_with_the_cpu():
    from benchmarks.generation import answer_quality, rag_prompts

    _, _, truths = rag_prompts(3)
    # the truth itself scores 1 against the truth; an unrelated answer scores lower, and the paired
    # difference says so
    result = {"n_prompts": 3, "variants": {"cpu_float32": {"answers": truths},
                                           "cuda_4bit": {"answers": ["Paris is the capital of France."] * 3}}}
    q = answer_quality(result, resamples=100)
    assert q["cpu_float32"]["answer_gt"] > 0.999
    assert q["cuda_4bit"]["answer_gt"] < 0.5 and q["cuda_4bit"]["answer_gt_diff_ci"][1] < 0


@pytest.mark.slow
def test_onnx_reports_the_default_embedders_pick_against_torch_fp32_and_the_gemm_ceilings():
    pytest.importorskip("onnxruntime")
    from benchmarks.onnx_backend import bench_onnx

    res = bench_onnx(quick=True, full=False, tiny=True)
    speed, pick = res["speed"], res["auto"]
    picked = next(n for n in speed["names"] if speed[n]["backend"] == pick["this_run_picks"])
    assert res["embed_speedup"] == speed[picked]["speedup_vs_torch"]
    assert 1 - res["embed_cosine_min_vs_torch"] <= 1e-4, "within backend auto's tolerance of fp32"
    assert pick["backend"] in {"torch fp32", "torch bf16", "onnx fp32", "openvino fp32", "openvino bf16"}
    assert pick["line"].startswith(pick["backend"])
    assert pick["int8_eligible"] is False, "int8 stays a pinned choice"
    assert speed["gemm_gflops"]["fp32"] > 0 and all(speed[n]["vs_gemm_ceiling"] > 0 for n in speed["names"])
    assert ("torch_bf16" in speed["names"]) == ("bf16" in speed["gemm_gflops"])


# The probe's pick may be slower than torch fp32 in a longer measurement only by this much: the
# probe takes a candidate 5% faster than fp32 in its own seconds, and a drifting machine moves a
# repeated measurement by a few percent.
NOT_SLOWER = 0.95


@pytest.mark.slow
def test_the_default_backends_are_not_slower_than_torch_fp32_on_this_machine():
    """What `backend: auto` picks from its few-second probe, measured again at length beside torch
    fp32 (interleaved, best of 2): the embedder's on 256 PubMedQA chunks, the cross-encoder's on 4
    questions' pools. Here, not on the machine the defaults were chosen on."""
    pytest.importorskip("onnxruntime")
    from benchmarks.onnx_backend import bench_onnx
    from benchmarks.reranker_backends import bench_reranker_backends

    emb = bench_onnx(quick=True, full=False, n_texts=256, repeats=2, with_quality=False)
    speed = emb["speed"]
    probe_pick = next(n for n in speed["names"] if speed[n]["backend"] == emb["auto"]["backend"])
    assert speed[probe_pick]["speedup_vs_torch"] >= NOT_SLOWER, (emb["auto"]["line"], speed[probe_pick])
    rr = bench_reranker_backends(quick=True, full=False, questions=4, rounds=2)
    picked = rr["backends"][rr["auto"]["picks"]]
    assert picked["speedup_vs_fp32"] >= NOT_SLOWER, (rr["auto"]["line"], picked)


@pytest.mark.slow
def test_retrieval_latency_tiny(tmp_path):
    from benchmarks.retrieval_latency import bench_retrieval_latency
    from tests.conftest import TINY_DOCS, TINY_QA, write_jsonl

    corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": i, "text": t, "source": s} for i, s, t in TINY_DOCS])
    qa = write_jsonl(tmp_path / "q.jsonl", [{"id": i, "question": q, "answer": a, "source": s, "corpus": c}
                                           for i, q, a, s, c in TINY_QA])
    ov = ["debug=tiny", f"corpus.path={corpus}", f"qa.path={qa}", f"paths.cache={tmp_path / 'cache'}",
          "chunker.chunk_size=120", "chunker.chunk_overlap=20"]
    res = bench_retrieval_latency(tiny=True, repeats=2, warmup=1, overrides=ov)
    _check_table(res)
    r = res["results"]
    assert set(r) == {"flat", "hnsw", "bm25", "hybrid"}
    for name, direct in (("flat", "direct_faiss"), ("hnsw", "direct_faiss"), ("bm25", "direct_bm25s"),
                         ("hybrid", "direct_faiss_bm25s_fused")):
        assert 0 < r[name]["harness"]["p50_ms"] <= r[name]["harness"]["p95_ms"]
        assert r[name][direct]["p50_ms"] > 0


@pytest.mark.slow
def test_generation_speed_tiny(tmp_path):
    """Before/after on a tiny v3: the loop with the old decoding gives the old runtime's answers."""
    from benchmarks.generation_speed import bench_generation_speed
    from tests.conftest import TINY_DOCS, TINY_QA, write_jsonl

    corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": i, "text": t, "source": s} for i, s, t in TINY_DOCS])
    qa = write_jsonl(tmp_path / "q.jsonl", [{"id": i, "question": q, "answer": a, "source": s, "corpus": c}
                                           for i, q, a, s, c in TINY_QA])
    ov = ["debug=tiny", f"corpus.path={corpus}", f"qa.path={qa}", "chunker.chunk_size=120", "chunker.chunk_overlap=20"]
    res = bench_generation_speed(tiny=True, overrides=ov)
    _check_table(res)
    assert res["generation_identical_share"] == 1.0 and res["generation_speedup"] > 0
    assert res["n_questions"] == 3 and res["limits"]["read_gb_s"] > 0
    ph = res["phases"]
    assert ph["prefill_gflop_s"] > 0 and 0 < ph["decode_vs_gemm"] < ph["prefill_vs_gemm"]
    assert ph["decode_vs_bandwidth"] > 0 and ph["decode_mb_per_token"] > 4 * res["model"]["params"] / 1e6
    assert set(res["quality"]) == {"before", "after"}


# ---- the CLI: families, overrides, the headline ratios ------------------------------------------

def dummy_family(quick, full, tiny=False, overrides=None, work_dir=None):
    """A family for the test."""
    return {"table": [{"measure": "answer", "value": 42.0, "unit": "s", "note": ""}], "overrides": overrides,
            "work_dir": str(work_dir), "quick": quick}


def test_cli_runs_named_families_with_overrides_and_lists_them(tmp_path, monkeypatch, capsys):
    import benchmarks
    from benchmarks.__main__ import main

    monkeypatch.setitem(benchmarks.FAMILIES, "dummy", "tests.test_benchmarks:dummy_family")
    assert main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert "alpha_sweep" in listed and "dummy" in listed and "A family for the test" in listed
    with pytest.raises(SystemExit) as e:
        main(["--only", "nope"])
    assert e.value.code == 2
    assert main(["--out", str(tmp_path), "--only", "dummy", "--", "eval.k=3"]) == 0
    res = json.loads((tmp_path / "dummy.json").read_text())
    assert res["overrides"] == ["eval.k=3"] and res["work_dir"] == str(tmp_path / "dummy") and res["quick"]
    assert "| answer | 42.0 | s |" in (tmp_path / "bench.md").read_text()
    assert json.loads((tmp_path / "results.json").read_text())["results"]["dummy"]["table"]


def test_a_plain_run_leaves_out_the_sweeps(tmp_path, monkeypatch):
    from benchmarks import __main__ as cli

    ran = []
    monkeypatch.setattr(cli, "_run", lambda args, names, done: ran.extend(names) or 0)
    for flags in ([], ["--full"]):
        ran.clear()
        assert cli.main(["--out", str(tmp_path), *flags]) == 0
        assert ran and not {"alpha_sweep", "grid_sweep", "demo", "xdomain", "own_data"} & set(ran)
    assert "serving" in ran  # --full adds the opt-in families, not the sweeps


@pytest.mark.parametrize("layout", ["families", "before"])
def test_headline_gathers_the_ratios_and_the_demos_times(tmp_path, layout):
    from benchmarks.__main__ import main

    sweeps = {"alpha_sweep": {"alpha_sweep_ratio": 1.1}, "grid_sweep": {"grid_sweep_ratio": 1.05},
              "demo": {"demo_cold_s": 290.0, "demo_warm_s": 44.0, "rerank_ms_per_question": 600.0}}
    # "before": the sweeps' results.json of experiments/bench.py, results at its top level
    (tmp_path / "results.json").write_text(json.dumps({"mode": "quick", "results": sweeps} if layout == "families"
                                                      else sweeps))
    (tmp_path / "families").mkdir()
    (tmp_path / "families" / "results.json").write_text(json.dumps({"results": {
        "generation_speed": {"generation_speedup": 2.5, "generation_identical_share": 1.0},
        "openvino_generation": {"generation_speedup_openvino": 3.1, "openvino_identical_share": 0.75},
        "onnx": {"embed_speedup": 1.6}}}))
    assert main(["--headline", "--out", str(tmp_path)]) == 0
    heads = json.loads((tmp_path / "headline.json").read_text())
    assert heads == {"generation_speedup": 2.5, "generation_identical_share": 1.0, "embed_speedup": 1.6,
                     "generation_speedup_openvino": 3.1, "openvino_identical_share": 0.75,
                     "alpha_sweep_ratio": 1.1, "grid_sweep_ratio": 1.05, "demo_cold_s": 290.0, "demo_warm_s": 44.0,
                     "rerank_ms_per_question": 600.0}
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["grid_sweep_ratio"] == 1.05
    assert json.loads((tmp_path / "families" / "results.json").read_text())["alpha_sweep_ratio"] == 1.1


def fake_run_py(calls):
    """Stands in for `python run.py`: writes a real metrics.json (tests/fixtures/metrics) where
    the run (or each of a multirun's jobs) would, and takes 2 s a job on paper."""
    import subprocess

    fixture = PROJECT_ROOT / "tests" / "fixtures" / "metrics" / "baseline.json"

    def run(argv, timeout=None, env=None):
        calls.append(argv)
        multirun = argv[0] == "-m"
        where = Path(next(a for a in argv if a.startswith(("hydra.run.dir=", "hydra.sweep.dir="))).split("=", 1)[1])
        jobs = 9 if "sweep=chunk_alpha" in argv else 5 if multirun else 1
        for j in range(jobs):
            d = where / str(j) if multirun else where
            d.mkdir(parents=True, exist_ok=True)
            (d / "metrics.json").write_text(fixture.read_text())
        return subprocess.CompletedProcess(argv, 0, "", ""), 2.0 * jobs

    return run


def test_alpha_sweep_tiny(tmp_path, monkeypatch):
    from benchmarks import sweeps

    calls = []
    monkeypatch.setattr(sweeps, "run_py", fake_run_py(calls))
    res = sweeps.bench_alpha_sweep(tiny=True, overrides=["eval.k=3"], work_dir=tmp_path)
    _check_table(res)
    assert res["alpha_sweep_ratio"] == res["ratio_warm"] == 5.0 and "ratio_cold" not in res  # tiny: warm only
    assert len(calls) == 3 and all("eval.k=3" in c for c in calls)
    assert res["latency_method"]["measured"] and len(res["sweep_jobs_retrieve_ms_median"]) == 5
    assert set(res["objective_by_alpha"]) == {"0.1", "0.3", "0.5", "0.7", "0.9"}
    res = sweeps.bench_alpha_sweep(tiny=True, cold=True, repeats=2, overrides=["eval.k=3"], work_dir=tmp_path)
    assert res["ratio_cold"] == 5.0 and len(res["warm_ratio_repeats"]) == 2 and len(calls) == 3 + 2 + 5


def test_grid_sweep_tiny(tmp_path, monkeypatch):
    from benchmarks import sweeps

    calls = []
    monkeypatch.setattr(sweeps, "run_py", fake_run_py(calls))
    res = sweeps.bench_grid_sweep(tiny=True, overrides=["eval.k=3"], work_dir=tmp_path)
    _check_table(res)
    assert res["grid_sweep_ratio"] == 3.0 and res["jobs"] == 9 and len(calls) == 4
    assert not (tmp_path / "caches" / "grid-runs").exists()  # the cold caches are removed again


@pytest.mark.slow
def test_reranking_tiny_trains_the_cross_encoder_and_compares_each_v3_with_v2(tmp_path):
    """Real processes end to end: a seconds-long model trained by `python -m rag.reranker.training`,
    then v2, v3 and v3 with that model run by `python run.py` and compared question by question."""
    from benchmarks.reranking import METRICS, bench_reranking

    res = bench_reranking(tiny=True, work_dir=tmp_path)
    _check_table(res)
    assert res["training"]["hit"] is False and "trained" in res["training"]["status"]
    dev = res["sets"]["dev"]
    assert [r["reranker"].rsplit(".", 1)[1] for r in dev["runs"].values()] == ["NoReranker", "MMRReranker",
                                                                               "CrossEncoderReranker"]
    assert {(d["label"], d["metric"]) for d in dev["diffs"]} == {(s, m) for s in ("v3 (MMR)", "v3 (cross-encoder)")
                                                                  for m in METRICS}
    assert all(d["n"] == 4 and d["ci_low"] <= d["diff"] <= d["ci_high"] for d in dev["diffs"])
    assert dev["n_tests"] == len(dev["diffs"])


@pytest.mark.slow
def test_demo_tiny_times_the_demo_cold_then_warm(tmp_path):
    from benchmarks.demo import bench_demo

    res = bench_demo(tiny=True, work_dir=tmp_path)
    assert res["demo_cold_s"] > 0 and res["demo_warm_s"] > 0
    assert set(res["cold_stages_s"]) == {"v1", "v2"} and res["cold_stages_s"]["v1"]["embed"] > 0
    assert res["same_objectives_warm"] is True
    assert [r["measure"] for r in res["table"]][:3] == ["demo_cold_s", "demo_warm_s", "rerank_ms_per_question"]


def fake_xdomain_run(values, calls):
    """Stands in for a `python run.py` of the xdomain family: a real metrics.json
    (tests/fixtures/metrics) and a per_question.jsonl whose nDCG@5, MRR and hit@5 are the side's
    `values`, one per question of the run's question file, in its order."""
    fixture = json.loads((PROJECT_ROOT / "tests" / "fixtures" / "metrics" / "baseline.json").read_text())

    def run(overrides, out_dir, timeout=3600):
        calls.append(overrides)
        qa = Path(next(o for o in overrides if o.startswith("qa.path=")).split("=", 1)[1])
        ids = [json.loads(line)["id"] for line in qa.read_text().splitlines()]
        out_dir.mkdir(parents=True)
        routing = {"method": "centroid", "accuracy": 0.5, "n": len(ids), "by_corpus": {}, "routed_share": 0.25,
                   "lost_recall": {"questions": 4, "lost": 1, "gained": 0, "depth": 5}, "calibration": {"folds": 5}}
        doc = {**fixture, "routing": routing} if "+version=v2" in overrides else fixture
        (out_dir / "metrics.json").write_text(json.dumps(doc))
        (out_dir / "per_question.jsonl").write_text("".join(
            json.dumps({"id": i, "ndcg_at_k": v, "mrr_id": v, "hit_at_k_id": v}) + "\n"
            for i, v in zip(ids, values[out_dir.name])))
        return {**doc, "process_wall_s": 1.0}

    return run


def test_xdomain_compares_the_sides_question_by_question_with_holm(tmp_path, monkeypatch):
    """The family's own code on the tiny bed, each run replaced by its metrics: every side runs on
    the bed without an answerer, and each contrast is the paired difference over the questions,
    Holm-adjusted over the corpus's cells."""
    from benchmarks import xdomain

    values = {"v1": [1, 1, 0, 0, 1, 1], "v2": [0, 0, 0, 0, 1, 1], "v2_router_off": [1, 1, 1, 0, 1, 1]}
    calls: list[list[str]] = []
    monkeypatch.setattr(xdomain, "run_pipeline_subprocess", fake_xdomain_run(values, calls))
    res = xdomain.bench_xdomain(tiny=True, work_dir=tmp_path)
    _check_table(res)
    assert [c[:2] for c in calls] == [["+version=v1", "corpus=jsonl"], ["+version=v2", "corpus=jsonl"],
                                      ["+version=v2", "retriever.source_filter.mode=none"]]
    assert all({"llm=none", "eval.latency.sample=0", "qa=jsonl"} <= set(c) for c in calls)
    git = res["corpora"]["git"]
    assert git["runs"]["v2"]["routing"]["accuracy"] == 0.5
    diffs = {(d["side"], d["baseline"], d["metric"]): d for d in git["contrasts"]}
    assert set(diffs) == {(s, b, m) for s, b in [("v2", "v1"), ("v2, router off", "v1"), ("v2", "v2, router off")]
                          for m in xdomain.METRICS}
    lost = diffs[("v2", "v2, router off", "ndcg_at_k")]
    assert lost["n"] == 6 and lost["diff"] == pytest.approx(-0.5) and lost["ci_low"] <= -0.5 <= lost["ci_high"]
    assert diffs[("v2", "v1", "ndcg_at_k")]["diff"] == pytest.approx(-1 / 3)
    assert all(d["p_holm"] >= d["p_value"] for d in git["contrasts"])
    page = (tmp_path / "xdomain.md").read_text()
    assert "| v2 - v2, router off | -0.500 [" in page
    assert "routed 0.25 of the questions; lost to routing 1 of 4 questions (gained 0, top 5)" in page
    assert xdomain.routing_extras(git["runs"]["v2"]["routing"]) == {
        "routed_share": 0.25, "lost_recall.questions": 4, "lost_recall.lost": 1, "lost_recall.gained": 0,
        "lost_recall.depth": 5}


def test_xdomain_reports_a_failed_side_and_compares_the_others(tmp_path, monkeypatch):
    from benchmarks import xdomain

    values = {"v1": [1] * 6, "v2": [0] * 6}
    ok = fake_xdomain_run(values, [])

    def run(overrides, out_dir, timeout=3600):
        if out_dir.name == "v2_router_off":
            return {"error": "exit 2: retriever.source_filter.mode: bad", "overrides": overrides}
        return ok(overrides, out_dir, timeout)

    monkeypatch.setattr(xdomain, "run_pipeline_subprocess", run)
    git = xdomain.bench_xdomain(tiny=True, work_dir=tmp_path)["corpora"]["git"]
    assert git["runs"]["v2, router off"] == {"error": "exit 2: retriever.source_filter.mode: bad"}
    assert {(d["side"], d["baseline"]) for d in git["contrasts"]} == {("v2", "v1")}
    assert "| v2, router off | failed: `exit 2: retriever.source_filter.mode: bad` |" in (tmp_path / "xdomain.md").read_text()


@pytest.mark.slow
def test_xdomain_tiny_runs_the_versions_on_the_bed(tmp_path):
    """Real processes end to end: v1, v2 and v2 without its router on six questions of the git
    corpus, in a cache of their own."""
    from benchmarks.xdomain import bench_xdomain

    git = bench_xdomain(tiny=True, work_dir=tmp_path)["corpora"]["git"]
    assert all("error" not in r for r in git["runs"].values()), git["runs"]
    assert git["runs"]["v2"]["routing"]["n"] == 6 and git["runs"]["v1"]["routing"] is None
    assert all(d["n"] == 6 for d in git["contrasts"])


@pytest.mark.openvino
def test_openvino_generation_benchmark_reports_the_speedup_and_the_answer_differences():
    from benchmarks.openvino_generation import bench_openvino_generation

    res = bench_openvino_generation(tiny=True)
    assert res["n_questions"] == 3 and res["generation_speedup_openvino"] > 0
    assert 0 <= res["openvino_identical_share"] <= 1
    ceiling = res["engines"]["openvino"]["native_ceiling"]
    assert res["decode_ratio_openvino_native"] > 0 and ceiling["identical_answers"] == ceiling["n"] == 3
    assert set(res["answer_differences"]) == {"answer_gt", "grounding", "hallucination"}
    assert all("p_holm" in d for d in res["answer_differences"].values())


@pytest.mark.slow
def test_own_data_times_a_cold_sweep_per_stage_with_backends_pinned_and_auto(tmp_path):
    from benchmarks import own_data

    res = own_data.bench_own_data(tiny=True, work_dir=tmp_path)
    _check_table(res)
    for side in ("pinned", "auto"):
        s = res["sides"][side]
        assert s["wall_s"] > 0 and s["stages_s"]["embed"] >= 0 and set(s["retrieval"]) == {"v1", "v3"}
        assert 0 <= s["latency_share"] < 1
    assert res["sides"]["pinned"]["backends"]["v3"]["reranker"] == "torch fp32 (pinned: backend=torch, precision=fp32)"
    assert res["sides"]["auto"]["backends"]["v3"]["reranker"].startswith(("torch", "onnx"))
    assert res["same_retrieval"] is (res["sides"]["pinned"]["retrieval"] == res["sides"]["auto"]["retrieval"])
