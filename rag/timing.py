"""Wall time per pipeline stage."""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

log = logging.getLogger(__name__)


class StageTimer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def add(self, name: str, seconds: float) -> None:
        """Time spent in a stage that runs interleaved with another (one question at a time)."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        log.info("stage %-10s %8.2f s", name, seconds)

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in self.seconds.items()}
