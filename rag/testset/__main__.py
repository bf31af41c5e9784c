"""Writes a question file for a corpus without questions, with the corpus, slice and llm choices of a run:

    python -m rag.testset corpus=jsonl corpus.path=examples/toy/docs.jsonl testset.n=12 testset.out=toy-questions.jsonl
    python -m rag.testset corpus=jsonl corpus.path=docs.jsonl llm=openai llm.base_url=http://127.0.0.1:8000/v1 llm.model=m
    python -m rag.testset corpus=libc testset.generator=templates      # man pages, docstrings, headed docs: no model
    python -m rag.testset corpus=jsonl corpus.path=docs.jsonl testset.dry_run=true   # count requests, send nothing

The file is read by `qa=jsonl qa.path=<out>`; its summary (filter counts, questions per source,
document and kind, requests and tokens) is `<out>` with the suffix .summary.json (a dry run's
counts: .dry_run.json). An existing `<out>` is replaced only when it is the file an earlier run
wrote, unchanged (its summary records its sha256); never the corpus or the question file
(rag/testset/out.py). The settings are conf/testset/default.yaml's (`testset.*`); the llm is
SmolLM2-135M unless `llm=` says otherwise.

Exit status: 0 written (or counted, in a dry run); 2 a user error (one line); 130 interrupted.
"""
from __future__ import annotations

import argparse
import logging
import sys

from rag.config.cli import HelpFormatter, run_cli
from rag.types import RagError


def parser() -> argparse.ArgumentParser:
    about, _, exits = (__doc__ or "").partition("Exit status:")
    ap = argparse.ArgumentParser(prog="python -m rag.testset", description=about.rstrip(),
                                 epilog="exit status:" + exits.rstrip(), formatter_class=HelpFormatter)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, as for run.py (corpus=jsonl testset.n=50)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        generate(args.overrides)
    except RagError as e:
        print(f"ragrig testset: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nragrig testset: interrupted", file=sys.stderr)
        return 130
    return 0


def generate(overrides: list[str]) -> dict:
    """Composes conf/testset.yaml with `overrides` and builds the question file; its summary."""
    from rag.store.cache import ArtifactCache
    from rag.config.compose import compose_config
    from rag.corpus.loading import load_corpus
    from rag.corpus.slicing import slice_documents
    from rag.store.models import use_cache
    from rag.run.session import create, model_cache
    from rag.run.settings import load
    from rag.testset.build import Inputs, build
    from rag.testset.out import check_out
    from rag.testset.settings import load_testset

    cfg = compose_config(overrides, config_name="testset")
    settings = load(cfg)
    ts = load_testset(settings.resolved.get("testset"))
    if settings.dry_run and not ts.dry_run:  # the run's own switch means the same here
        from dataclasses import replace

        ts = replace(ts, dry_run=True)
    # before a model is loaded or a request sent: the files it would write must be its own to write
    check_out(ts, settings.resolved.get("corpus"), settings.resolved.get("qa"))
    models = model_cache(settings)
    chunker = create(ts.passages)
    llm = create(settings.nodes.llm) if ts.generator == "llm" else None
    if llm is not None:
        use_cache(llm, models)

    def embedder() -> object:
        e = create(settings.nodes.eval_embedder)
        use_cache(e, models)
        return e

    cache = ArtifactCache(settings.paths.cache, seed=settings.paths.seed)
    docs, _ = load_corpus(create(settings.nodes.corpus), cache)
    docs = slice_documents(list(docs), [], settings.slice.docs_per_source, settings.slice.seed)
    return build(ts, Inputs(docs, chunker, llm, embedder, cache, getattr(llm, "no_answer", None)))


if __name__ == "__main__":
    run_cli(main)
