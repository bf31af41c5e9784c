"""One total deadline per HTTP request: connecting, sending, the reply's headers and its whole body.

httpx's timeouts bound each socket operation on its own, so a server that trickles a byte every
half second, or never stops sending, holds a request for as long as it likes. Here every socket
operation waits at most until the deadline of the request it serves. A request runs on one thread
from start to end (httpx's synchronous client), so the deadline is the thread's own: set it with
`deadline(seconds)` around the request.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import httpcore
import httpx

_local = threading.local()
_WRITE_SLICE = 64 * 1024  # httpcore re-arms the timeout for every send; a slice each keeps the deadline


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Every socket operation of this thread ends by `seconds` from now (a timeout error)."""
    _local.at = time.monotonic() + float(seconds)
    try:
        yield
    finally:
        _local.at = None


def seconds_left() -> float | None:
    """Time left before this thread's deadline; None outside `deadline`."""
    at = getattr(_local, "at", None)
    return None if at is None else at - time.monotonic()


def _bounded(timeout: float | None, error: type[Exception]) -> float | None:
    left = seconds_left()
    if left is None:
        return timeout
    if left <= 0:
        raise error("the request's deadline has passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _bounded(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for start in range(0, len(buffer), _WRITE_SLICE):
            self._inner.write(buffer[start:start + _WRITE_SLICE], _bounded(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, _bounded(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_tcp(host, port, _bounded(timeout, httpcore.ConnectTimeout), local_address,
                                               socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_unix_socket(path, _bounded(timeout, httpcore.ConnectTimeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class DeadlineTransport(httpx.HTTPTransport):
    """httpx's own transport (its request and error handling) over sockets that keep the
    calling thread's deadline. httpx takes no network backend, hence the pool built here."""

    def __init__(self, limits: httpx.Limits):
        super().__init__(limits=limits)
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(), max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
            network_backend=_Backend())
