"""The ask command answers from cached artifacts, one question or a prompt loop."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rag.config.compose import PROJECT_ROOT
from tests.conftest import MODEL_CACHE, tiny_overrides


def ask(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rag.ask", *args], input=stdin, capture_output=True, text=True,
                          cwd=PROJECT_ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)


@pytest.mark.heavy
def test_ask_uses_the_cache_and_shows_sources_and_latency(tiny_files):
    overrides = tiny_overrides(tiny_files) + ["+version=v2", "context.labels=true"]
    first = ask(["Why was fcntl64 added?", "--corpus", "libc", *overrides])
    assert first.returncode == 0, first.stderr[-2000:]
    assert "built (not cached before)" in first.stdout  # cold cache: it had to build
    again = ask(["Why was fcntl64 added?", "--corpus", "libc", *overrides])
    assert again.returncode == 0, again.stderr[-2000:]
    assert "every artifact from the cache" in again.stdout
    assert "[1] man page fcntl(2)" in again.stdout
    assert "latency: retrieve" in again.stdout


def test_interactive_mode_serves_several_questions_on_one_load(tiny_files):
    overrides = tiny_overrides(tiny_files) + ["+version=v1"]
    done = ask(["-i", *overrides], stdin="How does AdamW apply weight decay?\nWhat does mmap do?\n")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("Q: ") == 2
    assert done.stdout.count("loaded in") == 1


def test_bad_override_is_one_line(tiny_files):
    done = ask(["q?", *tiny_overrides(tiny_files), "eval.k=0"])
    assert done.returncode == 2
    assert "ragrig ask: error: eval.k must be positive, got 0" in done.stderr


def test_ask_on_your_own_corpus_needs_no_question_set(tiny_files):
    """No qa=...: corpus=jsonl comes with qa=none, and a typed question is answered from the
    whole corpus (no PubMedQA question is checked against it)."""
    own = [f"corpus.path={tiny_files['corpus']}", f"paths.cache={tiny_files['cache']}",
           f"paths.model_cache={MODEL_CACHE}", "embedder.show_progress=false", "+version=v1"]
    done = ask(["How does AdamW apply weight decay?", "corpus=jsonl", *own])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "[1] torch:torch.optim.AdamW" in done.stdout
    assert "question" not in done.stderr.lower(), "nothing about a question set"


def test_control_characters_from_the_server_and_the_corpus_are_shown_escaped(tiny_files):
    """A served answer and a corpus document are data: their NUL, ESC (a colour, a screen clear, a
    window title) and C1 bytes reach the terminal escaped; newlines and tabs of the answer stay."""
    import re

    from tests.conftest import TINY_DOCS, write_jsonl
    from tests.scripted_endpoint import ScriptedEndpoint, completion

    hostile = "fcntl64 \x1b[2J\x1b]0;pwned\x07 was added\x00 for large file offsets \x9b31m"
    write_jsonl(tiny_files["corpus"], [{"id": i, "text": t, "source": s} for i, s, t in TINY_DOCS]
                + [{"id": "man:evil.2", "text": hostile, "source": "libc"}])
    answer = "It was\x00 added \x1b[31mfor offsets\x1b[0m\nin Linux\t2.4 \x9b \x7f"
    with ScriptedEndpoint(lambda r, n: (200, {}, completion(answer))) as srv:
        done = ask(["Why was fcntl64 added?", *tiny_overrides(tiny_files), "llm=openai", f"llm.base_url={srv.base_url}",
                    "llm.model=m", "eval.k=10"])
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", out), "no control character reaches the terminal raw"
    assert "A: It was\\x00 added \\x1b[31mfor offsets\\x1b[0m\nin Linux\t2.4 \\x9b \\x7f\n" in out
    assert "fcntl64 \\x1b[2J\\x1b]0;pwned\\x07 was added\\x00 for large file offsets \\x9b31m" in out


def test_a_reply_that_held_no_answer_is_said_so(tiny_files):
    from tests.scripted_endpoint import ScriptedEndpoint

    refusal = {"choices": [{"index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": None, "refusal": "I can't."}}]}
    with ScriptedEndpoint(lambda r, n: (200, {}, refusal)) as srv:
        done = ask(["Why was fcntl64 added?", *tiny_overrides(tiny_files), "llm=openai", f"llm.base_url={srv.base_url}",
                    "llm.model=m"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "A: (no answer: the server's reply held none: refusal)" in done.stdout


def test_every_control_character_but_newline_and_tab_is_escaped():
    from rag.ask import format_answer, printable

    controls = "".join(map(chr, [*range(0x20), 0x7f, *range(0x80, 0xa0)]))
    shown = printable(controls + "\ud800 é ✓")
    assert shown.count("\\x") == len(controls) - 2 and "\n" in shown and "\t" in shown
    assert shown.endswith("\\ud800 é ✓")
    out = format_answer({"question": "why\x1b[8m?", "answer": "a\x00", "latency_ms": {"retrieve": 1.0}, "contexts": [
        {"label": "doc\x1b]0;t\x07", "score": 0.5, "text": "text\x00 \x1b[2J \udc80"}]})
    assert "Q: why\\x1b[8m?" in out and "A: a\\x00" in out and "[1] doc\\x1b]0;t\\x07  score 0.500" in out
    assert "text\\x00 \\x1b[2J \\udc80" in out
    out.encode("utf-8")  # a lone surrogate from a corpus would end the print with a UnicodeEncodeError
