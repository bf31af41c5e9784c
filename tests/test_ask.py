"""The ask command answers from cached artifacts, one question or a prompt loop."""
from __future__ import annotations

import os
import subprocess
import sys

from rag.config import PROJECT_ROOT
from tests.conftest import tiny_overrides


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
