"""`python -m rag.reranker.training`: build (or find) the cached cross-encoder that
reranker=cross_encoder uses, with the same configuration a run composes (so it builds exactly the
artifact a run would use), or print the training data it would build (--data-only)."""
from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

from rag.types import RagError


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m rag.reranker.training", description=__doc__.splitlines()[0])
    ap.add_argument("--cache-dir", help="artifact cache (default: the config's paths.cache)")
    ap.add_argument("--epochs", type=int, help="epochs (reranker.train.epochs)")
    ap.add_argument("--seed", type=int, help="seed (reranker.train.seed)")
    ap.add_argument("--device", help="cpu, cuda or cuda:N (reranker.train.device)")
    ap.add_argument("--reference", action="store_true",
                    help="when training: also rank the validation queries with the base model as a bi-encoder")
    ap.add_argument("--train", action="store_true",
                    help="train here even when the model that ships in models/cross_encoder/ has this recipe's key")
    ap.add_argument("--data-only", action="store_true", help="print training data statistics and examples; no training")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. +version=v3 reranker.train.lr=1e-4")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from rag.config.compose import PROJECT_ROOT, register_resolvers
    from rag.reranker.training.artifact import METRICS_FILE, build_trained_model, dataset_for
    from rag.run.session import model_cache
    from rag.run.settings import load

    register_resolvers()
    overrides = ["reranker=cross_encoder"]
    if args.cache_dir:
        overrides.append(f"paths.cache={Path(args.cache_dir).absolute()}")
    for name in ("epochs", "seed", "device"):
        if getattr(args, name) is not None:
            overrides.append(f"reranker.train.{name}={getattr(args, name)}")
    overrides += args.overrides
    try:
        with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
        settings = load(cfg)
        train = instantiate(settings.nodes.reranker.train, _convert_="all")
        cache = model_cache(settings)
        if args.data_only:
            data = dataset_for(train, cache)
            print(json.dumps(data.stats, indent=2))
            for g in random.Random(0).sample(data.train, min(6, len(data.train))):
                print(json.dumps(asdict(g), indent=2, ensure_ascii=False))
            return 0
        t0 = time.perf_counter()
        art = build_trained_model(train, cache, progress=lambda m: logging.getLogger(__name__).info("%s", m),
                                  reference=args.reference, shipped=not args.train)
    except RagError as e:
        print(f"ragrig: error: {e}", file=sys.stderr)
        return 2
    if art.hit:
        how = "found in cache"
    elif art.manifest.get("source") == "shipped":
        how = "from the shipped model"
    else:
        how = "trained"
    print(f"cross-encoder {how}: {art.path} ({time.perf_counter() - t0:.1f}s)")
    metrics_file = art.path / METRICS_FILE
    if metrics_file.exists():
        m = json.loads(metrics_file.read_text())
        print(json.dumps({k: m.get(k) for k in ("data", "training", "heldout_before", "heldout_after",
                                                 "heldout_biencoder_reference", "total_seconds")}, indent=2))
    return 0
