"""The seed that ships in data/seed/ (rag/seed.py, rag/cache.py): it holds exactly what a cold
`make demo` would otherwise compute from the shipped data, and it is current, so that a code change
to a key of those artifacts fails here rather than silently making the demo slow again (`make seed`
rebuilds it)."""
from __future__ import annotations

import json
from pathlib import Path

from rag.cache import ArtifactCache
from rag.config import PROJECT_ROOT
from rag.pipeline import run
from rag.seed import INDEX, build_seed, main
from tests.conftest import MODEL_CACHE

SEED = PROJECT_ROOT / "data" / "seed"


def test_the_seed_index_lists_every_entry_and_each_is_intact():
    index = json.loads((SEED / INDEX).read_text())
    listed = {(a["kind"], a["key"]) for a in index["artifacts"]}
    on_disk = {(p.parent.name, p.name) for p in SEED.glob("vectors/*") if p.is_dir()}
    assert listed == on_disk and len(listed) == 2, "v1's chunks (shared by v2, v3) and v4's"
    store = ArtifactCache(SEED)
    assert all(store.lookup(kind, key) is not None for kind, key in listed)
    assert index["records"]["rerank_scores"] == len(list(SEED.glob("rerank_scores/*/*.json"))) == 300


def test_cold_v3_and_v4_runs_on_the_default_slice_embed_no_chunk_and_score_no_candidate(compose_cfg, tmp_path):
    """An empty cache and the shipped seed: the chunk vectors are restored, every question's
    cross-encoder scores are read from the seed, and nothing is recorded anew (the timed latency
    sample scores, but never records). One cache for both versions: the corpus renders once."""
    cache = tmp_path / "cache"
    recorded = set((MODEL_CACHE / "rerank_scores").glob("*/*.json"))  # the reranker's cache is the model cache
    for version in ("v3", "v4"):
        cfg = compose_cfg([f"+version={version}", "llm=none", f"paths.cache={cache}", f"paths.model_cache={MODEL_CACHE}",
                           "embedder.show_progress=false", "eval.latency.sample=1", "eval.latency.repeats=1"])
        out = tmp_path / f"out-{version}"
        run(cfg, out)
        metrics = json.loads((out / "metrics.json").read_text())
        vectors = metrics["artifacts"]["vectors"]
        manifest = json.loads((cache / "vectors" / vectors["key"] / "manifest.json").read_text())
        assert vectors["hit"] and manifest.get("seeded_from", "").startswith(str(SEED)), \
            f"{version}: its chunk vectors were embedded, not restored: the seed is stale (make seed)"
        assert set((MODEL_CACHE / "rerank_scores").glob("*/*.json")) == recorded, \
            f"{version}: candidates were scored, not read from the seed: the seed is stale (make seed)"
        assert metrics["timings_s"]["rerank"] < 10, "150 questions read, not scored (about 70 s when scored)"
    assert not (cache / "rerank_scores").exists()


def test_build_seed_copies_intact_vectors_and_score_records(tmp_path, capsys):
    cache = ArtifactCache(tmp_path / "cache")
    cache.get_or_build("vectors", "k1", lambda tmp: {"n": (tmp / "vectors.npy").write_bytes(b"\x00" * 8)})
    cache.get_or_build("index", "k2", lambda tmp: {"n": (tmp / "index.faiss").write_bytes(b"\x00")})
    cache.put_record("rerank_scores", "ab12", {"scores": [0.5]})
    (tmp_path / "cache" / "vectors" / "broken").mkdir()  # no manifest: never shipped
    out = tmp_path / "seed"
    assert main([str(tmp_path / "cache"), "--out", str(out)]) == 0
    assert "1 artifacts" in capsys.readouterr().out
    assert ArtifactCache(out).lookup("vectors", "k1") is not None and not (out / "index").exists()
    assert not (out / "vectors" / "broken").exists()
    assert ArtifactCache(tmp_path / "other", seed=out).get_record("rerank_scores", "ab12")["scores"] == [0.5]
    index = build_seed(tmp_path / "cache", out)  # a rebuild replaces, and keeps what is not its own
    assert [a["key"] for a in index["artifacts"]] == ["k1"] and index["records"] == {"rerank_scores": 1}


def test_a_missing_cache_is_one_line_and_exit_2(tmp_path, capsys):
    assert main([str(tmp_path / "absent")]) == 2
    assert capsys.readouterr().err.strip() == f"rag.seed: error: {tmp_path / 'absent'}: no such directory"
