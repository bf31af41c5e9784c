"""Ask a configured pipeline a question, using its cached artifacts.

    python -m rag.ask "Why was fcntl64 added?" +version=v3
    python -m rag.ask --corpus libc "What does O_NONBLOCK do?" +version=v3 eval.k=3
    python -m rag.ask -q "Is a=b the same as a==b?" +version=v3   # -q: the question, whatever it holds
    python -m rag.ask +version=v3 -- What does a == b mean        # after --: only question words
    python -m rag.ask -i +version=v3            # a prompt loop: one load, many questions
    python -m rag.ask corpus=jsonl corpus.path=docs.jsonl "When do backups run?"   # your own corpus, no questions needed

Hydra overrides are given exactly as for run.py, so the same configuration finds the same
artifacts. A word is an override only when it has the override form (`key=value`, `+key=value`,
`++key=value`, `~key`) with a key that starts with a top-level config key or group (`eval.k=3`,
`+version=v3`); every other word belongs to the question, e.g. "What does a == b mean?" (its
text before `=` is no key).
Everything is loaded from the cache; the command says so if anything had to be built. Prints the
answer, the numbered contexts with their sources and scores, and the per-stage latency.

Exit status: 0 answered; 2 a user error (a bad override, an unknown group option, bad input: one
line); 130 interrupted (Ctrl-C: one line).
"""
from __future__ import annotations

import argparse
import functools
import logging
import re
import sys
import textwrap
import time
from typing import TYPE_CHECKING, Any

from rag.config.cli import HelpFormatter, run_cli
from rag.config.compose import PROJECT_ROOT, compose_config
from rag.types import RagError

if TYPE_CHECKING:
    from rag.run.session import Session

# key=value, +key=value, ++key=value, ~key, ~key=value; a key is dotted names, group paths with /
# and an optional @package.
OVERRIDE = re.compile(r"^(?:\+{1,2}|~)?(?P<key>[A-Za-z_][\w-]*)(?:[./][\w-]+)*(?:@[\w.-]*)?(?P<eq>=.*)?$", re.DOTALL)


@functools.cache
def top_level_keys() -> frozenset[str]:
    """What an override can start with: the top-level keys of conf/config.yaml, the config groups
    (directories of conf/) and Hydra's own node."""
    import yaml

    conf = PROJECT_ROOT / "conf"
    keys = {p.name for p in conf.iterdir() if p.is_dir()} | {"hydra"}
    data = yaml.safe_load((conf / "config.yaml").read_text(encoding="utf-8")) or {}
    return frozenset(keys | {k for k in data if isinstance(k, str)} - {"defaults"})


def is_override(word: str) -> bool:
    m = OVERRIDE.match(word)
    if m is None or m.group("key") not in top_level_keys():
        return False
    return bool(m.group("eq")) or word.startswith("~")


def split_words(words: list[str]) -> tuple[str, list[str]]:
    """(question, overrides) from the positional words (see the module docstring)."""
    overrides = [w for w in words if is_override(w)]
    question = " ".join(w for w in words if not is_override(w)).strip()
    return question, overrides


def answer(session: Session, question: str, corpus: str | None = None) -> dict[str, Any]:
    """One question through retrieve -> rerank -> contexts -> generate, timed per stage."""
    from rag.run.query import retrieve_rerank

    filters = session.retriever.filters_for([corpus], [question])  # mode=router routes the text, not --corpus
    hits, retrieve_ms, rerank_ms = retrieve_rerank(session.retriever, session.reranker, question, filters[0],
                                                   session.depth, session.chunk_set.chunks, session.score.k,
                                                   reuse=False)
    contexts = session.context_builder.build(hits, session.chunk_set)[0]
    t0 = time.perf_counter()
    answers = session.generator.generate([question], [contexts])
    generate_ms = 1000 * (time.perf_counter() - t0)
    scores = {int(r): float(s) for r, s in hits.row(0)}
    details = session.generator.last_details if answers is not None else None
    return {
        "question": question,
        "answer": None if answers is None else answers[0],
        "withheld": (details[0].get("withheld") if details else None),  # a reply that held no answer: why
        "contexts": [
            {"label": c.label or session.chunk_set.chunks[c.chunk_rows[0]].doc_id,
             "score": scores.get(c.chunk_rows[0]), "text": c.text}
            for c in contexts
        ],
        "latency_ms": {"retrieve": retrieve_ms, "rerank": rerank_ms,
                       "generate": generate_ms if answers is not None else 0.0},
    }


def printable(text: Any) -> str:
    """`text` as it may reach a terminal: control characters (NUL, ESC and the rest of C0 and C1,
    DEL) and lone surrogates escaped as \\x1b, \\ud800, newlines and tabs kept. An answer comes
    from a server and a context from a corpus: neither may move the cursor, recolour or clear the
    screen, or end the print with a UnicodeEncodeError."""
    return _CONTROL.sub(lambda m: _escape(m.group()), str(text))


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _escape(ch: str) -> str:
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"


def format_answer(result: dict[str, Any], width: int = 100) -> str:
    lines = [f"Q: {printable(result['question'])}"]
    if result["answer"] is None:
        lines.append("A: (llm=none: retrieval only)")
    elif result.get("withheld"):
        lines.append(f"A: (no answer: the server's reply held none: {printable(result['withheld'])})")
    else:
        lines.append(f"A: {printable(result['answer'])}")
    lines.append("contexts:")
    for i, c in enumerate(result["contexts"], 1):
        score = "" if c["score"] is None else f"  score {c['score']:.3f}"
        lines.append(f"  [{i}] {printable(c['label'])}{score}")
        body = printable(" ".join(c["text"].split()))
        lines.append(textwrap.indent(textwrap.shorten(body, width=3 * width, placeholder=" …"), "      "))
    lat = result["latency_ms"]
    lines.append("latency: " + ", ".join(f"{k} {v:.0f} ms" for k, v in lat.items()) + f" (total {sum(lat.values()):.0f} ms)")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    about, _, exits = __doc__.partition("Exit status:")
    parser = argparse.ArgumentParser(
        prog="python -m rag.ask", description=about.rstrip(), epilog="exit status:" + exits.rstrip(),
        formatter_class=HelpFormatter,
    )
    parser.add_argument("words", nargs="*", help="the question, and Hydra overrides (eval.k=3, +version=v3)")
    parser.add_argument("-q", "--question", default=None,
                        help="the question, taken whole, never as an override (default: the words that are no override)")
    parser.add_argument("-i", "--interactive", action="store_true",
                        help="after any question given, read more from a prompt until EOF (default: answer once)")
    parser.add_argument("--corpus", default=None,
                        help="the question's corpus tag (pubmed, libc, pytorch) for source filtering (default: none, "
                             "every corpus)")
    return parser


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    tail: list[str] = []
    if "--" in argv:  # everything after -- is the question
        cut = argv.index("--")
        argv, tail = argv[:cut], argv[cut + 1:]
    args = ap.parse_intermixed_args(argv)
    question, overrides = split_words(args.words)
    parts = [p for p in (args.question, question, " ".join(tail)) if p and p.strip()]
    question = " ".join(p.strip() for p in parts)
    if not question and not args.interactive:
        ap.error("give a question (or -q QUESTION), or -i for a prompt loop")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return ask(question, overrides, args.corpus, args.interactive)
    except KeyboardInterrupt:
        print("\nragrig ask: interrupted", file=sys.stderr)
        return 130


def ask(question: str, overrides: list[str], corpus: str | None, interactive: bool) -> int:
    from rag.run.session import open_session
    from rag.run.settings import load

    try:
        cfg = compose_config(overrides)
        t0 = time.perf_counter()
        # --corpus must select documents of this corpus: a typo would silently retrieve nothing.
        settings = load(cfg)
        # Typed questions need no question set: on a corpus of your own (qa=none) there is none.
        session = open_session(settings, askers=[(f"--corpus {corpus!r}", corpus, None)], scored=False)
        session.generator.warm_up()
        load_s = time.perf_counter() - t0
        built = [kind for kind, a in session.artifacts.record.items() if not a["hit"]]
        note = f"; built (not cached before): {', '.join(built)}" if built else "; every artifact from the cache"
        print(f"[{settings.variant}: {len(session.chunk_set)} chunks, loaded in {load_s:.1f} s{note}]")
        if question:
            print(format_answer(answer(session, question, corpus)))
        if interactive:
            while True:
                try:
                    q = input("\nquestion> ").strip()
                except EOFError:
                    print()
                    break
                if q:
                    print(format_answer(answer(session, q, corpus)))
    except RagError as e:
        print(f"ragrig ask: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    run_cli(main)
