"""The seed that ships in data/seed/ (rag/store/seed.py, rag/store/cache.py): it holds exactly what a cold
`make demo` would otherwise compute from the shipped data, and it is current, so that a code change
to a key of those artifacts fails here rather than silently making the demo slow again (`make seed`
rebuilds it)."""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from rag.store.cache import ArtifactCache
from rag.store.cache_records import RECORD_SUMS
from rag.config.compose import PROJECT_ROOT
from rag.run.pipeline import run
from rag.reranker.pointwise import SCORES
from rag.store.seed import INDEX, build_seed, main
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


def test_every_seed_record_matches_its_checksum(tmp_path, caplog):
    index = json.loads((SEED / INDEX).read_text())
    assert sorted(index[RECORD_SUMS]["rerank_scores"]) == sorted(p.stem for p in SEED.glob("rerank_scores/*/*.json"))
    seeded = ArtifactCache(tmp_path / "cache", seed=SEED)
    assert all(seeded.get_record("rerank_scores", key) for key in index[RECORD_SUMS]["rerank_scores"]), \
        "every record matches its checksum"
    assert not [r for r in caplog.records if r.name == "rag.store.cache"]


@pytest.mark.heavy
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
        assert "fitted" not in metrics, f"{version}: the demo's corpora are what its parts were fitted on"
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
    assert capsys.readouterr().err.strip() == f"rag.store.seed: error: {tmp_path / 'absent'}: no such directory"


def _v3(cfg_for, cache: Path, model_cache: Path, seed: Path, out: Path) -> list[dict]:
    cfg = cfg_for(["+version=v3", "llm=none", f"paths.cache={cache}", f"paths.model_cache={model_cache}",
                   f"paths.seed={seed}", "embedder.show_progress=false", "eval.latency.sample=0"])
    run(cfg, out)
    return [json.loads(line) for line in (out / "per_question.jsonl").read_text().splitlines()]


@pytest.mark.heavy
def test_a_seed_record_with_a_flipped_byte_is_named_and_scored_anew_as_an_unseeded_run_would(
        compose_cfg, tmp_path, monkeypatch, caplog):
    """A score of -5.1 turned into 5.1 by one byte would put that question's worst candidate
    first; the record fails its checksum, is named, and the cross-encoder scores the question."""
    read: list[str] = []
    get_record = ArtifactCache.get_record

    def noting(self, kind, key):
        if kind == SCORES:
            read.append(key)
        return get_record(self, kind, key)

    monkeypatch.setattr(ArtifactCache, "get_record", noting)
    intact = _v3(compose_cfg, tmp_path / "cache", MODEL_CACHE, SEED, tmp_path / "intact")
    monkeypatch.undo()
    sums = json.loads((SEED / INDEX).read_text())[RECORD_SUMS][SCORES]
    seed = tmp_path / "seed"  # a copy, then one byte of one of v3's records flipped
    shutil.copytree(SEED, seed, ignore=shutil.ignore_patterns("vectors"))
    shutil.copytree(SEED / "vectors", seed / "vectors", copy_function=os.link)  # never written
    store = ArtifactCache(seed)
    key, path, original = next(
        (k, p, rec["scores"]) for k in sorted(set(read) & set(sums))
        for p in [store.record_path(SCORES, k, seed)] for rec in [json.loads(p.read_text())]
        if -min(rec["scores"]) > max(rec["scores"]))
    worst = json.dumps(min(original))  # as the file spells it; the flip keeps the file's length
    text, n = re.subn(rf"(?<=[ \[]){re.escape(worst)}(?=[,\]])", " " + worst[1:], path.read_text())
    assert n == 1
    path.write_text(text)
    # the model artifacts are shared read-only; the recomputed record goes to this test's own cache
    models = tmp_path / "models"
    for kind in ("onnx_model", "cross_encoder", "corpus"):
        shutil.copytree(MODEL_CACHE / kind, models / kind, copy_function=os.link)
    caplog.set_level(logging.WARNING, logger="rag.store.cache")
    flipped = _v3(compose_cfg, tmp_path / "cache", models, seed, tmp_path / "flipped")
    assert f"cache: seed record {path} is damaged (its sha256 differs from the one in {seed / INDEX}); " \
           "computing it instead" in [r.getMessage() for r in caplog.records]
    assert [[d["chunk_id"] for d in r["retrieved"]] for r in flipped] == \
           [[d["chunk_id"] for d in r["retrieved"]] for r in intact], "every question ranks as with the intact seed"
    assert np.allclose([d["score"] for r in flipped for d in r["retrieved"]],
                       [d["score"] for r in intact for d in r["retrieved"]], rtol=0, atol=1e-6)
    [rescored] = [p for p in (models / SCORES).glob("*/*.json")]
    assert rescored.stem == key, "only the damaged record's question was scored"
    assert np.allclose(ArtifactCache(models).get_record(SCORES, key)["scores"], original, rtol=0, atol=1e-3), \
        "the cross-encoder's own scores are what the record held before the flip"
