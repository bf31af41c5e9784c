"""rag.config.cli: what every command line shares. A command whose reader has gone (`| head -1`) runs on
to its own exit status with nothing on stderr; --help states every option's default; the shared
argument types refuse what they must, in argparse's one line."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap

import pytest

from rag.config.cli import HelpFormatter, non_negative_float, positive_int, seed_int
from rag.config.compose import PROJECT_ROOT

# Writes far more than a pipe holds, to stdout and then stderr, then a file, and exits 3.
SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from rag.config.cli import run_cli

    def main():
        for _ in range(2000):
            print("x" * 100)
        print("to stderr", file=sys.stderr)
        Path(sys.argv[1]).write_text("done")
        return 3

    run_cli(main)
""")


@pytest.mark.parametrize("stderr_too", [False, True])
@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_a_closed_pipe_leaves_the_status_and_the_work_to_the_command(tmp_path, stderr_too, unbuffered):
    read, write = os.pipe()
    os.close(read)
    env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
    try:
        done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "result")], stdout=write,
                              stderr=write if stderr_too else subprocess.PIPE, cwd=PROJECT_ROOT, env=env, timeout=60)
    finally:
        os.close(write)
    assert done.returncode == 3 and (tmp_path / "result").read_text() == "done"
    assert stderr_too or done.stderr == b"to stderr\n"  # stderr still reaches a reader that stayed


def test_help_shows_every_default_it_has_once():
    ap = argparse.ArgumentParser(prog="x", formatter_class=HelpFormatter)
    ap.add_argument("--n", type=int, default=5, help="how many")
    ap.add_argument("--seed", type=int, default=0, help="the seed")
    ap.add_argument("--out", default=None, help="where (default: a new directory)")
    ap.add_argument("--fast", action="store_true", help="skip the slow part")
    ap.add_argument("--k", type=int, default=3, help="cut-off (default: 3)")
    text = " ".join(ap.format_help().split())
    assert "how many (default: 5)" in text and "the seed (default: 0)" in text
    assert "where (default: a new directory)" in text and text.count("(default: 3)") == 1
    assert "skip the slow part" in text and "(default: False)" not in text and "None" not in text


@pytest.mark.parametrize("convert,text,message", [
    (positive_int, "0", "must be a positive integer, got 0"),
    (positive_int, "-3", "must be a positive integer, got -3"),
    (positive_int, "ten", "must be a positive integer, got 'ten'"),
    (seed_int, "-1", "must be an integer >= 0, got -1"),
    (non_negative_float, "-0.1", "must be a number >= 0, got '-0.1'"),
    (non_negative_float, "nan", "must be a number >= 0, got 'nan'"),
])
def test_the_shared_argument_types_refuse_in_one_line(convert, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        convert(text)
    assert convert("1") == 1
