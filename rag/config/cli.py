"""What every ragrig command line shares: surviving a reader that goes away (`| head -1`,
`| grep -q`) with the command's own exit status, a help formatter that shows each option's
default, and the argument types several commands validate the same way."""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any, NoReturn, TextIO


class _PipeSafe:
    """A standard stream whose reader may close early. The first write or flush that meets a
    closed pipe points the descriptor at /dev/null (Python's documented recipe), so the command
    runs on to its end: its result files written, its exit status its own."""

    def __init__(self, stream: TextIO):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_gone()
            return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_gone()

    def _reader_gone(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)
        # What the failed write left buffered now drains into /dev/null; interpreter shutdown
        # flushes this stream again and must not report the pipe a second time.
        with contextlib.suppress(OSError):
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_std_streams() -> None:
    """Makes stdout and stderr survive a closed pipe (idempotent)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _PipeSafe):
            setattr(sys, name, _PipeSafe(stream))


def run_cli(main: Callable[[], int | None]) -> NoReturn:
    """`sys.exit(main())` for a `python -m` entry point: output to a reader that has gone is
    dropped, never a BrokenPipeError traceback, and the exit status stays main's (a PASS is 0)."""
    guard_std_streams()
    try:
        status = main()
    finally:  # argparse's --help and errors leave through SystemExit: flushed here as well
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    sys.exit(status)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's and epilog's line breaks (usage examples, exit codes) and adds
    "(default: X)" to every option that has a default and does not state it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or "(default" in text or action.default is None or action.default is False
                or action.default is argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


def positive_int(text: str, lo: int = 1) -> int:
    what = "a positive integer" if lo == 1 else f"an integer >= {lo}"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if value < lo:
        raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
    return value


def seed_int(text: str) -> int:
    return positive_int(text, lo=0)


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value
