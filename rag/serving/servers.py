"""Real serving engines on 127.0.0.1, started from local model folders (tests, benchmarks, the
README's examples): `transformers serve` for chat (rag/llm/servable.py) and Infinity for
embeddings and /rerank (`InfinityServer`). Each runs in its own process group, so that stopping it
stops everything it started; its log lets a caller count the requests it served.

Infinity pins numpy<2, transformers<=5.0 and sentence-transformers<4, which the project's own
versions are past, so it lives in a virtual environment of its own (`make infinity` builds
.venv-infinity; RAGRIG_INFINITY names another `infinity_emb` executable).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Self

from rag.config.compose import PROJECT_ROOT
from rag.types import RagError

INFINITY_VERSION = "0.0.78"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalServer:
    """A server process on 127.0.0.1:`port`, ready when GET `health_path` answers 200."""

    name = "server"
    health_path = "/health"

    def __init__(self, port: int | None = None, threads: int | None = 1, log_path: str | Path | None = None):
        self.port, self.threads = port or free_port(), threads
        self.log_path = Path(log_path) if log_path else None
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout_s: float = 300.0) -> Self:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
        if self.threads:
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(self.threads)
        log = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(self.command(), env=env, stdout=log or subprocess.DEVNULL,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            if log is not None:
                log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RagError(f"{self.name} exited with status {self.proc.returncode} before it was ready "
                               f"(log: {self.log_path})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{self.health_path}", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RagError(f"{self.name} was not ready within {timeout_s:.0f} s (log: {self.log_path})")

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

    def served(self, needle: str) -> int:
        """Access-log lines containing `needle` (e.g. "POST /v1/chat/completions")."""
        if not self.log_path or not self.log_path.exists():
            return 0
        return sum(needle in line for line in self.log_path.read_text(errors="replace").splitlines())

    def __enter__(self) -> Self:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def infinity_executable() -> str | None:
    """RAGRIG_INFINITY, else the project's .venv-infinity (make infinity), else `infinity_emb` on PATH."""
    env = os.environ.get("RAGRIG_INFINITY")
    if env:
        return env
    local = PROJECT_ROOT / ".venv-infinity" / "bin" / "infinity_emb"
    if local.exists():
        return str(local)
    return shutil.which("infinity_emb")


class InfinityServer(LocalServer):
    """Infinity (`infinity_emb v2`) serving local folders under the names given: an embedding
    model answers /embeddings, a cross-encoder /rerank (Infinity tells them apart itself). The
    routes have no /v1 prefix: base_url is http://127.0.0.1:PORT."""

    name = "infinity_emb"

    def __init__(self, models: dict[str, str], port: int | None = None, threads: int | None = 1,
                 log_path: str | Path | None = None, batch_size: int = 32, executable: str | None = None):
        super().__init__(port, threads, log_path)
        self.models, self.batch_size = dict(models), int(batch_size)
        self.executable = executable or infinity_executable()
        if not self.executable:
            raise RagError("infinity_emb is not installed: `make infinity` builds .venv-infinity "
                           f"(infinity-emb[server,torch]=={INFINITY_VERSION}), or set RAGRIG_INFINITY")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [str(self.executable), "v2", "--host", "127.0.0.1", "--port", str(self.port), "--device", "cpu",
               "--engine", "torch", "--no-bettertransformer", "--batch-size", str(self.batch_size)]
        for name, folder in self.models.items():
            cmd += ["--model-id", str(folder), "--served-model-name", name]
        return cmd
