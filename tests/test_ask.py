"""The ask command answers from cached artifacts, one question or a prompt loop."""
from __future__ import annotations

import os
import subprocess
import sys

from rag.config import PROJECT_ROOT
from tests.conftest import MODEL_CACHE, tiny_overrides


def ask(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rag.ask", *args], input=stdin, capture_output=True, text=True,
                          cwd=PROJECT_ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)


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
