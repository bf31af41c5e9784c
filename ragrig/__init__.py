"""ragrig's Python API: what `python run.py`, `python -m rag.ask` and `python -m experiments.compare`
do, from a notebook or a script.

    import ragrig

    data = ["corpus=jsonl", "corpus.path=docs.jsonl", "qa=jsonl", "qa.path=questions.jsonl"]
    v1 = ragrig.run(["+version=v1", *data])
    v3 = ragrig.run(["+version=v3", *data])
    v3.metrics["mrr"]                       # the mean of each metric
    v3.per_question()                       # one row per question (pandas)

    with ragrig.open_session(["+version=v3", *data]) as session:
        print(session.ask("What does O_NONBLOCK do?").answer)

    cmp = ragrig.compare([v1, v3])
    print(cmp.verdict)                      # the verdict as the command line prints it
    cmp.table                               # one row per run (pandas)

Relative paths (`docs.jsonl`) are read from the directory Python was started in.

Overrides are written exactly as on the command line, so a configuration means the same thing
in both. Every name exported here is the stable surface; the modules behind it (`rag.*`, `eval.*`,
`experiments.*`) may change. A user error (a bad override, a bad input file) raises
`ragrig.RagError` with the same one line the command line prints.
"""
from __future__ import annotations

from ragrig.api import Answer, Comparison, Run, Session, compare, compose, load_run, open_session, run
from rag.types import RagError

__all__ = ["Answer", "Comparison", "RagError", "Run", "Session", "compare", "compose", "load_run", "open_session",
           "run"]
