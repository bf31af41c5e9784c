"""Ask a configured pipeline a question, using its cached artifacts.

    python -m rag.ask "Why was fcntl64 added?" +version=v3
    python -m rag.ask --corpus libc "What does O_NONBLOCK do?" +version=v3 eval.k=3
    python -m rag.ask -i +version=v3            # a prompt loop: one load, many questions

Arguments with `=` are Hydra overrides, exactly as for run.py, so the same configuration finds
the same artifacts. Everything is loaded from the cache; the command says so if anything had to
be built. Prints the answer, the numbered contexts with their sources and scores, and the
per-stage latency.
"""
from __future__ import annotations

import argparse
import logging
import sys
import textwrap
import time
from typing import Any

from hydra import compose, initialize_config_dir

from rag.config import PROJECT_ROOT, register_resolvers
from rag.types import RagError


def answer(session: Any, question: str, corpus: str | None = None) -> dict[str, Any]:
    """One question through retrieve -> rerank -> contexts -> generate, timed per stage."""
    filters = session.retriever.filters_for([corpus], [question])  # mode=router routes the text, not --corpus
    fused, retrieve_ms = session.retriever.search_timed([question], session.depth, filters)
    t0 = time.perf_counter()
    hits = session.reranker.rerank([question], fused, session.chunk_set.chunks, session.settings.k)
    rerank_ms = 1000 * (time.perf_counter() - t0)
    contexts = session.context_builder.build(hits, session.chunk_set)[0]
    t0 = time.perf_counter()
    answers = session.generator.generate([question], [contexts])
    generate_ms = 1000 * (time.perf_counter() - t0)
    scores = {int(r): float(s) for r, s in hits.row(0)}
    return {
        "question": question,
        "answer": None if answers is None else answers[0],
        "contexts": [
            {"label": c.label or session.chunk_set.chunks[c.chunk_rows[0]].doc_id,
             "score": scores.get(c.chunk_rows[0]), "text": c.text}
            for c in contexts
        ],
        "latency_ms": {"retrieve": float(retrieve_ms[0]), "rerank": rerank_ms,
                       "generate": generate_ms if answers is not None else 0.0},
    }


def format_answer(result: dict[str, Any], width: int = 100) -> str:
    lines = [f"Q: {result['question']}"]
    lines.append(f"A: {result['answer']}" if result["answer"] is not None else "A: (llm=none: retrieval only)")
    lines.append("contexts:")
    for i, c in enumerate(result["contexts"], 1):
        score = "" if c["score"] is None else f"  score {c['score']:.3f}"
        lines.append(f"  [{i}] {c['label']}{score}")
        body = " ".join(c["text"].split())
        lines.append(textwrap.indent(textwrap.shorten(body, width=3 * width, placeholder=" …"), "      "))
    lat = result["latency_ms"]
    lines.append("latency: " + ", ".join(f"{k} {v:.0f} ms" for k, v in lat.items()) + f" (total {sum(lat.values()):.0f} ms)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Ask a configured ragrig pipeline a question.")
    parser.add_argument("words", nargs="*", help="the question, then Hydra overrides (key=value, +version=v3)")
    parser.add_argument("-i", "--interactive", action="store_true", help="read questions from a prompt until EOF")
    parser.add_argument("--corpus", default=None, help="the question's corpus tag (pubmed, libc, pytorch) for source filtering")
    args = parser.parse_intermixed_args(argv)
    overrides = [w for w in args.words if "=" in w and not w.startswith("=")]
    question = " ".join(w for w in args.words if w not in overrides).strip()
    if not question and not args.interactive:
        parser.error("give a question, or -i for a prompt loop")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    register_resolvers()
    from rag.pipeline import open_session

    try:
        with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
        t0 = time.perf_counter()
        session = open_session(cfg)
        session.generator.warm_up()
        load_s = time.perf_counter() - t0
        built = [kind for kind, a in session.artifacts.record.items() if not a["hit"]]
        note = f"; built (not cached before): {', '.join(built)}" if built else "; every artifact from the cache"
        print(f"[{cfg.get('variant', 'custom')}: {len(session.chunk_set)} chunks, loaded in {load_s:.1f} s{note}]")
        if question:
            print(format_answer(answer(session, question, args.corpus)))
        if args.interactive:
            while True:
                try:
                    q = input("\nquestion> ").strip()
                except EOFError:
                    print()
                    break
                if q:
                    print(format_answer(answer(session, q, args.corpus)))
    except RagError as e:
        print(f"ragrig ask: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
