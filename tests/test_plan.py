"""The dry run (rag/run/plan.py): for every served role, what the run would send given the cache,
with nothing sent; the counts it calls exact are the ones the run itself then reports, and a
sweep's plan counts work its jobs share once. One scripted server plays the embedding, rerank and
chat engines (tests/test_server.py runs real ones)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rag.run.output import format_table
from rag.run.pipeline import run
from rag.run.plan import combine
from tests.conftest import PROJECT_ROOT, tiny_overrides
from tests.scripted_endpoint import ScriptedEndpoint, echo
from tests.test_http_reranker import overlap
from tests.test_openai_embedder import minilm, served  # noqa: F401 (minilm is a fixture)

LATENCY = ["eval.latency.sample=2", "eval.latency.repeats=2", "eval.latency.warmup=1"]  # 5 timed searches


def endpoint(model):
    return ScriptedEndpoint(chat=echo, embed=served(model), rerank=overlap, models=["emb", "rr", "m"])


def roles(base_url: str, *which: str, fresh: Path) -> list[str]:
    """Served roles. The reranker's scores are recorded in the model cache that every test shares
    across sessions: a namespace of this test's own temporary directory starts it afresh."""
    out = []
    if "embed" in which:
        out += ["embedder=openai", f"embedder.base_url={base_url}", "embedder.model=emb", "embedder.batch_size=4"]
    if "rerank" in which:
        out += ["reranker=http", f"reranker.base_url={base_url}", "reranker.model=rr", "reranker.top_n=5",
                f"reranker.endpoint.cache_namespace={fresh}"]
    if "generate" in which:
        out += ["llm=openai", f"llm.base_url={base_url}", "llm.model=m", "llm.max_tokens=16"]
    return out


def test_a_served_reranker_is_counted_exactly_and_what_follows_is_bounded(tiny_files, compose_cfg, minilm):  # noqa: F811
    with endpoint(minilm) as srv:
        over = tiny_overrides(tiny_files) + roles(srv.base_url, "rerank", "generate", fresh=tiny_files["cache"]) + LATENCY
        plan = run(compose_cfg(over + ["dry_run=true"]), tiny_files["out"] / "dry")["dry_run"]
        assert srv.requests == [], "a dry run sends nothing, not even GET /models"
        result = run(compose_cfg(over), tiny_files["out"] / "run")
        again = run(compose_cfg(over + ["dry_run=true"]), tiny_files["out"] / "dry-again")["dry_run"]
    n = result["counts"]["questions"]
    rerank, generate = plan["roles"]["rerank"], plan["roles"]["generate"]
    assert "embed" not in plan["roles"], "the in-process embedder sends nothing"
    assert rerank["exact"] and rerank["requests"] == n + 5 == result["usage"]["rerank"]["requests_sent"]
    assert rerank["items"] == result["usage"]["rerank"]["documents"]
    assert plan["bounded_after"] == "rerank" and not generate["exact"]
    assert generate["requests"] == n == result["usage"]["generate"]["requests_sent"]
    assert generate["output_tokens_at_most"] == 16 * n and "first stage's top k" in generate["tokens_method"]
    # Rerun: every question's scores and every answer are cached; only the timed searches would rerank.
    assert again["roles"]["rerank"]["requests"] == 5 and again["roles"]["rerank"]["cached"] == n
    assert again["roles"]["generate"]["exact"] and again["roles"]["generate"]["requests"] == 0
    assert again["roles"]["generate"]["cached"] == n and again["bounded_after"] == "rerank"
    assert json.loads((tiny_files["out"] / "dry" / "dry_run.json").read_text()) == plan
    assert not (tiny_files["out"] / "dry" / "metrics.json").exists()


def test_a_served_embedder_is_counted_and_everything_after_it_bounded(tiny_files, compose_cfg, minilm):  # noqa: F811
    with endpoint(minilm) as srv:
        over = (tiny_overrides(tiny_files) + roles(srv.base_url, "embed", "rerank", "generate", fresh=tiny_files["cache"]) + LATENCY
                + ["pricing.embed.input=1.0", "pricing.generate.request=0.01"])
        plan = run(compose_cfg(over + ["dry_run=true"]), tiny_files["out"] / "dry")["dry_run"]
        assert srv.requests == []
        result = run(compose_cfg(over), tiny_files["out"] / "run")
        again = run(compose_cfg(over + ["dry_run=true"]), tiny_files["out"] / "dry-again")["dry_run"]
    n, chunks = result["counts"]["questions"], result["counts"]["chunks"]
    embed = plan["roles"]["embed"]
    assert embed["exact"] and plan["bounded_after"] == "embed"
    # a dimension probe and the chunk batches (4 texts each), the questions, the warm-up query, 5 timed searches
    assert (embed["requests"], embed["items"]) == (1 + -(-chunks // 4) + n + 1 + 5, 1 + chunks + n + 1 + 5)
    assert result["usage"]["embed"]["requests_sent"] == embed["requests"], result["usage"]["embed"]
    assert embed["items"] == result["usage"]["embed"]["texts"]
    assert embed["cost"] == pytest.approx(embed["input_tokens"] / 1e6)
    assert "characters / 4" in embed["tokens_method"]
    for role in ("rerank", "generate"):
        assert not plan["roles"][role]["exact"]
        assert plan["roles"][role]["requests"] >= result["usage"][role]["requests_sent"] > 0
    assert plan["roles"]["generate"]["cost"] == pytest.approx(0.01 * n)
    # Rerun: the chunk vectors are cached; the queries are asked again.
    assert again["roles"]["embed"]["requests"] == n + 1 + 5 and again["roles"]["embed"]["cached"] == 1
    text = format_table({"dry_run": plan})
    assert text.startswith(f"dry run: {sum(r['requests'] for r in plan['roles'].values())} request(s) would be sent")
    assert "counts are exact through embed" in text and "at most" in text


def test_a_routed_run_counts_the_pseudo_queries_its_router_calibrates_on(tiny_files, compose_cfg, minilm):  # noqa: F811
    """v2's router encodes pseudo-queries cut from the corpus to calibrate its filter: the plan
    counts them, and what the run then sends is what the plan said."""
    with endpoint(minilm) as srv:
        over = tiny_overrides(tiny_files) + roles(srv.base_url, "embed", fresh=tiny_files["cache"]) + LATENCY + ["+version=v2"]
        plan = run(compose_cfg(over + ["dry_run=true"]), tiny_files["out"] / "dry")["dry_run"]["roles"]["embed"]
        result = run(compose_cfg(over), tiny_files["out"] / "run")
    n, chunks = result["counts"]["questions"], result["counts"]["chunks"]
    pseudo = result["routing"]["calibration"]["pseudo_queries"]
    assert pseudo == 200 and any("the router's calibration: 200 pseudo-queries" in note for note in plan["notes"])
    assert (plan["requests"], plan["items"]) == (1 + -(-chunks // 4) + n + 1 + 5 + pseudo // 4,
                                                 1 + chunks + n + 1 + 5 + pseudo)
    assert (result["usage"]["embed"]["requests_sent"], result["usage"]["embed"]["texts"]) == (plan["requests"], plan["items"])


def test_a_dry_run_after_an_interrupted_embedding_counts_only_the_blocks_left(tiny_files, compose_cfg, minilm,  # noqa: F811
                                                                              monkeypatch):
    import numpy as np

    from rag.embedder import npy_writer

    monkeypatch.setattr(npy_writer, "ENCODE_BLOCK", 4)
    with endpoint(minilm) as srv:
        over = tiny_overrides(tiny_files) + roles(srv.base_url, "embed", fresh=tiny_files["cache"])
        plan = run(compose_cfg(over + ["dry_run=true"]), tiny_files["out"] / "dry")["dry_run"]["roles"]["embed"]
        (key,) = [k for k in plan["units"] if k]
        chunks = plan["units"][key][1] - 1  # less the dimension probe
        # What an embedding killed after its first two blocks of 4 texts leaves in the cache.
        partial = Path(tiny_files["cache"]) / "vectors" / f".partial-{key}"
        partial.mkdir(parents=True)
        np.save(partial / "unique.npy", np.zeros((chunks, 384), np.float32))
        (partial / "blocks.json").write_text(json.dumps({"n": chunks, "dim": 384, "block": 4, "done": [0, 1]}))
        again = run(compose_cfg(over + ["dry_run=true"]), tiny_files["out"] / "dry2")["dry_run"]["roles"]["embed"]
    assert again["units"][key][1] == chunks - 8 + 1
    assert any("not asked again" in note for note in again["notes"])


def test_in_process_models_make_an_empty_plan(tiny_files, compose_cfg):
    plan = run(compose_cfg(tiny_overrides(tiny_files) + ["dry_run=true"]), tiny_files["out"])["dry_run"]
    assert plan["roles"] == {} and plan["bounded_after"] is None
    assert "every model runs in process" in format_table({"dry_run": plan})


def test_a_sweep_counts_a_unit_its_jobs_share_once():
    job = {"currency": "USD", "roles": {"rerank": {
        "base_url": "u", "model": "m", "exact": True, "items_are": "documents", "units": {"q1": [1, 5, 100, 0]},
        "other": [2, 10, 200, 0], "price": {"input": 1.0, "output": 0.0, "request": 0.5}}}}
    other = json.loads(json.dumps(job))
    other["roles"]["rerank"]["units"]["q2"] = [1, 5, 50, 0]
    both = combine([job, other])["roles"]["rerank"]
    assert both["requests"] == 2 + 2 + 1 + 1 and both["input_tokens"] == 200 + 200 + 100 + 50
    assert both["shared_units"] == 1 and both["jobs"] == 2
    assert both["cost"] == pytest.approx(6 * 0.5 + 550 / 1e6)


def test_a_dry_sweep_prints_and_writes_its_plan(tiny_files, minilm, tmp_path):  # noqa: F811
    with endpoint(minilm) as srv:
        cmd = [sys.executable, str(PROJECT_ROOT / "run.py"), "-m", *tiny_overrides(tiny_files),
               *roles(srv.base_url, "rerank", fresh=tmp_path), "reranker.fuse.method=none,rrf", "dry_run=true",
               "eval.latency.sample=0", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert srv.requests == []
    assert proc.returncode == 0, proc.stderr[-2000:]
    sweep = json.loads((tmp_path / "sweep" / "dry_run.json").read_text())
    rerank = sweep["roles"]["rerank"]
    assert sweep["jobs"] == 2 and rerank["jobs"] == 2
    assert rerank["shared_units"] == rerank["requests"] > 0, "the fusion method is downstream of the scores"
    assert "dry run (sweep of 2 job(s))" in proc.stdout


def test_listwise_windows_are_counted_as_the_run_asks_them(tiny_files, compose_cfg):
    from tests.test_listwise_reranker import ranking_server

    with ScriptedEndpoint(ranking_server()) as srv:
        over = [*tiny_overrides(tiny_files), "reranker=llm_listwise", "llm@reranker.llm=openai",
                f"reranker.llm.base_url={srv.base_url}", "reranker.llm.model=m", "reranker.top_n=6",
                "reranker.window=4", "reranker.step=2", f"reranker.llm.endpoint.cache_namespace={tiny_files['cache']}",
                "reranker.llm.max_tokens=20", *LATENCY]
        plan = run(compose_cfg(over + ["dry_run=true"]), tiny_files["out"] / "dry")["dry_run"]["roles"]["rerank"]
        assert srv.requests == []
        result = run(compose_cfg(over), tiny_files["out"] / "run")
        again = run(compose_cfg(over + ["dry_run=true"]), tiny_files["out"] / "again")["dry_run"]["roles"]["rerank"]
    n = result["counts"]["questions"]
    # 6 candidates in windows of 4 moving by 2: 2 windows per search; the questions and 5 timed searches
    assert not plan["exact"] and plan["requests"] == 2 * (n + 5) == result["usage"]["rerank"]["requests_sent"]
    assert plan["output_tokens_at_most"] == 20 * plan["requests"] and plan["items_are"] == "windows"
    assert again["exact"] and again["cached"] == 2 * n and again["requests"] == 2 * 5


def test_an_llm_compressor_behind_a_server_is_counted_per_context(tiny_files, compose_cfg, minilm):  # noqa: F811
    with endpoint(minilm) as srv:
        over = (tiny_overrides(tiny_files) + roles(srv.base_url, "generate", fresh=tiny_files["cache"])
                + ["compressor=llm", "llm@compressor.llm=openai", f"compressor.llm.base_url={srv.base_url}",
                   "compressor.llm.model=m", f"compressor.llm.endpoint.cache_namespace={tiny_files['cache']}", "eval.k=3",
                   "eval.latency.sample=0"])
        plan = run(compose_cfg(over + ["dry_run=true"]), tiny_files["out"] / "dry")["dry_run"]["roles"]
        assert srv.requests == []
        result = run(compose_cfg(over), tiny_files["out"] / "run")
    n = result["counts"]["answered_questions"]
    # one request per context: k chunks of one document that touch are one context (rag/context.py)
    assert plan["compress"]["requests"] == result["compression"]["requests"] <= 3 * n
    assert plan["compress"]["items_are"] == "contexts" and plan["compress"]["input_tokens"] > 0
