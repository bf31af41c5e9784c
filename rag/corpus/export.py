"""`python -m rag.corpus.export --out data/corpora [corpus ...]`: build corpora from local sources.

Renders the man pages, walks the installed torch package's docstrings and reads PubMedQA/MEDLINE
files through the artifact cache (so later runs start warm), and exports each corpus as JSONL
(`id`, `text`, `source`, `meta`), the format `corpus=jsonl` reads. Nothing is downloaded.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from rag.artifacts import load_corpus
from rag.cache import ArtifactCache, atomic_write_text
from rag.config import PROJECT_ROOT, register_resolvers
from rag.settings import load
from rag.types import RagError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpora", nargs="*", default=["pubmedqa", "libc", "pytorch"], help="corpus config names")
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "data" / "corpora")
    parser.add_argument("overrides", nargs=argparse.REMAINDER, help="extra Hydra overrides")
    args = parser.parse_args(argv)
    register_resolvers()
    for name in args.corpora:
        with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
            cfg = compose(config_name="config", overrides=[f"corpus={name}", *args.overrides])
        t0 = time.perf_counter()
        try:
            settings = load(cfg)
            docs, skipped = load_corpus(instantiate(settings.nodes.corpus, _convert_="all"),
                                        ArtifactCache(settings.paths.cache))
        except RagError as e:
            print(f"ragrig data: error: {e}", file=sys.stderr)
            return 2
        out = args.out / f"{name}.jsonl"
        atomic_write_text(out, "".join(json.dumps(d.to_json(), ensure_ascii=False) + "\n" for d in docs))
        chars = sum(len(d.text) for d in docs)
        print(f"{name}: {len(docs)} documents, {chars / 1e6:.1f} M characters, {len(skipped)} skipped, "
              f"{time.perf_counter() - t0:.1f} s -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
