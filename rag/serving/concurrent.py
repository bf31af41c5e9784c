"""Requests to a server, several at a time: `map_concurrent` runs a function over items on a
bounded pool of threads and stops the rest at the first failure that is final (a bad key, a
refused reply), so a role never goes on sending what cannot succeed."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

T = TypeVar("T")


class Cancelled(Exception):
    """Raised in a worker when another request has already failed for good."""


def map_concurrent(fn: Callable[[T, threading.Event], Any], items: Sequence[T], concurrency: int,
                   is_fatal: Callable[[BaseException], bool] = lambda e: True) -> Iterator[tuple[int, Any]]:
    """Runs `fn(item, stop)` over `items` on `concurrency` threads and yields (index, result) as
    they finish. An exception for which `is_fatal` holds stops the rest: queued items are
    cancelled, `stop` is set for the running ones (their retries end), the results that still
    arrive are yielded, then the first fatal exception is raised. A non-fatal exception is yielded
    as the result (the caller decides what it means)."""
    stop = threading.Event()
    first: BaseException | None = None

    def work(item: T) -> Any:
        if stop.is_set():
            raise Cancelled()
        try:
            return fn(item, stop)
        except Cancelled:
            raise
        except BaseException as e:
            if is_fatal(e):
                stop.set()  # here, not in the consumer: a free worker must not start the next item
            raise

    with ThreadPoolExecutor(max_workers=max(1, int(concurrency)), thread_name_prefix="endpoint") as pool:
        pending: dict[Future, int] = {pool.submit(work, item): i for i, item in enumerate(items)}
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    i = pending.pop(fut)
                    if fut.cancelled():
                        continue
                    e = fut.exception()
                    if e is None:
                        yield i, fut.result()
                    elif isinstance(e, Cancelled):
                        continue
                    elif is_fatal(e):
                        if first is None:
                            first = e
                            stop.set()
                            for f in pending:
                                f.cancel()
                    else:
                        yield i, e
        finally:
            stop.set()
            for f in pending:
                f.cancel()
    if first is not None:
        raise first
