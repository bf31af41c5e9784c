"""`python -m rag.corpus.export --out data/corpora [corpus ...] [override ...]`: build corpora from local sources.

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

from hydra.utils import instantiate

from rag.store.atomic import atomic_write_text
from rag.store.cache import ArtifactCache
from rag.corpus.loading import load_corpus
from rag.config.compose import PROJECT_ROOT, compose_config
from rag.run.settings import load
from rag.types import RagError


DEFAULT_CORPORA = ("pubmedqa", "libc", "pytorch")


def main(argv: list[str] | None = None) -> int:
    from rag.config.cli import HelpFormatter

    parser = argparse.ArgumentParser(prog="python -m rag.corpus.export", description=__doc__.splitlines()[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("words", nargs="*", metavar="CORPUS|OVERRIDE",
                        help=f"corpus config names (default: {' '.join(DEFAULT_CORPORA)}) and Hydra overrides "
                             "(key=value), e.g. jsonl corpus.path=docs.jsonl")
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "data" / "corpora",
                        help="directory the <corpus>.jsonl files are written to")
    args = parser.parse_args(argv)
    # A word with = (or a ~deletion) is an override; positional overrides after the names were
    # otherwise taken for corpus names.
    overrides = [w for w in args.words if "=" in w or w.startswith("~")]
    names = [w for w in args.words if w not in overrides] or list(DEFAULT_CORPORA)
    for name in names:
        t0 = time.perf_counter()
        try:
            settings = load(compose_config([f"corpus={name}", *overrides]))
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
    from rag.config.cli import run_cli

    run_cli(main)
