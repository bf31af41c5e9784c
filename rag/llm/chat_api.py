"""A client for OpenAI-compatible `/chat/completions` endpoints (vLLM, llama.cpp's server, Ollama,
TGI, `transformers serve`, hosted APIs), shared by `llm=openai` and the LLM judge (`eval.judge`).

Plain `http.client` with one keep-alive connection per worker thread: no client package to
install, and the same code talks to every engine. Requests run in a bounded thread pool. Each
request is bounded too: a per-request timeout and at most `max_retries` retries, with exponential
backoff and jitter, on what is worth retrying (429, 5xx, timeouts, refused or reset connections),
honouring the server's Retry-After. Anything else (a wrong URL, an unknown model, a bad key) is a
one-line `EndpointError` naming the URL, the model and the key's environment variable.

The API key is read from the environment variable the config names (`api_key_env`) and is kept
out of every message and `repr`; configs and outputs only ever hold the variable's name.
"""
from __future__ import annotations

import http.client
import json
import logging
import os
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

from rag.types import RagError

log = logging.getLogger(__name__)

T = TypeVar("T")
STALE_ERRORS = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
MAX_RETRY_AFTER_S = 120.0  # a server asking for longer is treated as down rather than waited for
TRANSIENT_ERRORS = (ConnectionRefusedError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError,
                    http.client.HTTPException, TimeoutError, socket.timeout)


class EndpointError(RagError):
    """A request that failed for good. `transient`: the last failure was of a retryable kind (the
    retries ran out); otherwise the server refused the request as such (status 400-499)."""

    def __init__(self, message: str, status: int | None = None, transient: bool = False, body: str = "",
                 unreachable: bool = False):
        super().__init__(message)
        self.status = status
        self.transient = transient
        self.body = body
        self.unreachable = unreachable

    @property
    def fatal(self) -> bool:
        """True when no other request of the run can succeed either: no server, a bad key, a wrong
        path or model. A 400, a 5xx or a timeout may be about this one request (a too-long prompt)."""
        return self.unreachable or self.status in (401, 403, 404)


class Cancelled(Exception):
    """Raised in a worker when another request has already failed for good."""


@dataclass
class Completion:
    text: str
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None
    served_model: str | None
    latency_ms: float
    attempts: int

    def usage(self) -> dict[str, int | None]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}


@dataclass
class ChatEndpoint:
    """One endpoint and model. `what` names the config node in messages (`llm`, `eval.judge`)."""

    base_url: str
    model: str
    api_key_env: str | None = None
    timeout_s: float = 120.0
    max_retries: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    what: str = "llm"
    _local: threading.local = field(default_factory=threading.local, repr=False)

    def __post_init__(self) -> None:
        parts = urlsplit(str(self.base_url))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RagError(f"{self.what}.base_url must be an http(s) URL such as http://127.0.0.1:8000/v1, "
                           f"got {self.base_url!r}")
        if not self.model or not str(self.model).strip():
            raise RagError(f"{self.what}.model must name the model the endpoint serves")
        for name in ("timeout_s", "backoff_s", "max_backoff_s"):
            if float(getattr(self, name)) <= 0:
                raise RagError(f"{self.what}.{name} must be positive, got {getattr(self, name)}")
        if int(self.max_retries) < 0:
            raise RagError(f"{self.what}.max_retries must be >= 0, got {self.max_retries}")
        self.base_url = str(self.base_url).rstrip("/")
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, parts.port
        self._prefix = parts.path.rstrip("/")
        self._key = self._read_key()

    def _read_key(self) -> str | None:
        if not self.api_key_env:
            return None
        key = os.environ.get(str(self.api_key_env), "")
        if not key:
            raise RagError(f"{self.what}.api_key_env={self.api_key_env}: the environment variable {self.api_key_env} "
                           "is not set (export it, or set api_key_env=null for a server without keys)")
        return key

    def __repr__(self) -> str:  # never the key
        return f"ChatEndpoint({self.base_url!r}, model={self.model!r}, api_key_env={self.api_key_env!r})"

    # -- transport --------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._scheme == "https":
                conn = http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout_s,
                                                   context=ssl.create_default_context())
            else:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)
            self._local.conn = conn
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn, self._local.used = None, False
        if conn is not None:
            conn.close()

    def _send(self, method: str, path: str, payload: dict[str, Any] | None) -> tuple[int, dict[str, str], str]:
        headers = {"Accept": "application/json"}
        body = None
        if payload is not None:
            body = json.dumps(payload, ensure_ascii=False).encode()
            headers["Content-Type"] = "application/json"
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        for fresh in (False, True):
            reused = getattr(self._local, "used", False) and getattr(self._local, "conn", None) is not None
            conn = self._connection()
            try:
                conn.request(method, self._prefix + path, body=body, headers=headers)
                resp = conn.getresponse()
                text = resp.read().decode("utf-8", errors="replace")
            except STALE_ERRORS:
                self._drop_connection()
                # A kept-alive connection the server has closed in the meantime fails at once,
                # before any response: that is no failed attempt, just a new connection.
                if reused and not fresh:
                    continue
                raise
            except BaseException:
                self._drop_connection()  # a half-used connection cannot carry the next request
                raise
            self._local.used = True
            if resp.getheader("Connection", "").lower() == "close":
                self._drop_connection()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, text
        raise AssertionError("unreachable")

    def url(self, path: str) -> str:
        return self.base_url + path

    def redact(self, text: str) -> str:
        return text.replace(self._key, "***") if self._key else text

    # -- requests ---------------------------------------------------------------------------

    def chat(self, messages: list[dict[str, str]], params: dict[str, Any], stop: threading.Event | None = None) -> Completion:
        """One chat completion, retried on transient failures. `stop` set by another thread ends
        the retries early (with `Cancelled`)."""
        payload = {"model": self.model, "messages": messages, **params}
        t0 = time.perf_counter()
        last = "no attempt"
        for attempt in range(int(self.max_retries) + 1):
            if stop is not None and stop.is_set():
                raise Cancelled()
            try:
                status, headers, text = self._send("POST", "/chat/completions", payload)
            except socket.gaierror as e:
                raise EndpointError(f"{self.what}: cannot resolve the host of {self.base_url} ({e.strerror or e}); "
                                    f"check {self.what}.base_url", unreachable=True) from None
            except ssl.SSLError as e:
                raise EndpointError(f"{self.what}: TLS error talking to {self.base_url}: {e}", unreachable=True) from None
            except TRANSIENT_ERRORS as e:
                last, delay = self._describe_transient(e), None
                unreachable = not isinstance(e, (TimeoutError, socket.timeout))
            except OSError as e:  # no route to host, network unreachable: retry like a refusal
                last, delay, unreachable = f"{type(e).__name__}: {e.strerror or e}", None, True
            else:
                unreachable = False
                if status == 200:
                    done = self._completion(text, t0, attempt + 1)
                    if done is not None:
                        return done
                    last, delay = f"an unreadable response body: {_one_line(text)[:200]}", None
                elif status in RETRY_STATUS:
                    last, delay = f"HTTP {status}: {self.redact(_error_message(text))}", _retry_after(headers)
                else:
                    raise self._refused(status, text)
            if attempt < int(self.max_retries):
                pause = self._backoff(attempt, delay)
                log.info("%s: %s; retry %d/%d in %.1f s", self.what, last, attempt + 1, self.max_retries, pause)
                if stop is not None and stop.wait(pause):
                    raise Cancelled()
                if stop is None:
                    time.sleep(pause)
        seconds = time.perf_counter() - t0
        status = None
        if last.startswith("HTTP "):
            status = int(last.split()[1].rstrip(":"))
        hint = " - is the server running?" if "refused" in last else ""
        raise EndpointError(
            f"{self.what}: POST {self.url('/chat/completions')} failed after {_attempts(int(self.max_retries) + 1)} "
            f"over {seconds:.1f} s: {last}{hint} ({self.what}.model={self.model})", status=status, transient=True,
            unreachable=unreachable)

    def _describe_transient(self, e: BaseException) -> str:
        if isinstance(e, ConnectionRefusedError):
            return f"cannot connect to {self.base_url} (connection refused)"
        if isinstance(e, (TimeoutError, socket.timeout)):
            return f"no response within {self.timeout_s:g} s ({self.what}.timeout_s)"
        return f"the connection broke ({type(e).__name__})"

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, MAX_RETRY_AFTER_S)
        # exponential with jitter, so that parallel workers do not retry in lockstep
        return min(float(self.max_backoff_s), float(self.backoff_s) * 2**attempt) * random.uniform(0.5, 1.0)

    def _completion(self, text: str, t0: float, attempts: int) -> Completion | None:
        try:
            data = json.loads(text)
            choice = data["choices"][0]
            content = choice["message"].get("content") or ""
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            return None
        usage = data.get("usage") or {}
        return Completion(text=content, prompt_tokens=usage.get("prompt_tokens"),
                          completion_tokens=usage.get("completion_tokens"), finish_reason=choice.get("finish_reason"),
                          served_model=data.get("model"), latency_ms=1000.0 * (time.perf_counter() - t0),
                          attempts=attempts)

    def _refused(self, status: int, text: str) -> EndpointError:
        msg = self.redact(_error_message(text))
        where = f"POST {self.url('/chat/completions')} -> HTTP {status}: {msg}"
        if status in (401, 403):
            key = (f"the key in ${self.api_key_env}" if self.api_key_env else
                   f"no key was sent: set {self.what}.api_key_env to the name of the variable that holds it")
            hint = f"the server rejected the API key ({key})"
        elif status == 404:
            hint = (f"wrong {self.what}.base_url (it usually ends in /v1) or a model the server does not serve "
                    f"({self.what}.model={self.model})")
        else:
            hint = f"{self.what}.model={self.model}"
        return EndpointError(f"{self.what}: {where} - {hint}", status=status, body=msg)

    def check(self) -> list[str] | None:
        """A cheap look before a run: GET /models. A refused connection or a rejected key stops
        here, before any work; a listed model set without this model is an unknown model. Servers
        without a usable /models (some answer 404 or 500) are let through: the first completion
        request reports what is wrong. Returns the served model ids when the server lists them."""
        try:
            status, _, text = self._send("GET", "/models", None)
        except socket.gaierror as e:
            raise EndpointError(f"{self.what}: cannot resolve the host of {self.base_url} ({e.strerror or e}); "
                                f"check {self.what}.base_url", unreachable=True) from None
        except ConnectionRefusedError:
            raise EndpointError(f"{self.what}: cannot connect to {self.base_url} (connection refused) - is the server "
                                f"running? ({self.what}.base_url)", unreachable=True) from None
        except (OSError, http.client.HTTPException) as e:
            log.warning("%s: GET %s failed (%s); going on", self.what, self.url("/models"), type(e).__name__)
            return None
        if status in (401, 403):
            raise self._refused(status, text)
        if status != 200:
            return None
        try:
            ids = [str(m["id"]) for m in json.loads(text).get("data", [])]
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        if ids and self.model not in ids:
            shown = ", ".join(ids[:8]) + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")
            raise EndpointError(f"{self.what}: the server at {self.base_url} does not serve model {self.model!r} "
                                f"({self.what}.model); it serves: {shown}", status=404)
        return ids


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

    with ThreadPoolExecutor(max_workers=max(1, int(concurrency)), thread_name_prefix="chat") as pool:
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


def _retry_after(headers: dict[str, str]) -> float | None:
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _attempts(n: int) -> str:
    return "1 attempt" if n == 1 else f"{n} attempts"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _error_message(text: str) -> str:
    """The server's own words: OpenAI/vLLM `{"error": {"message"}}`, Ollama/llama.cpp `{"error"}`,
    FastAPI `{"detail"}`, else the start of the body."""
    try:
        data = json.loads(text)
    except ValueError:
        return _one_line(text)[:300] or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error", data.get("detail", data.get("message")))
        if isinstance(err, dict):
            err = err.get("message") or err.get("msg") or err
        if isinstance(err, list) and err and isinstance(err[0], dict):  # FastAPI validation errors
            err = "; ".join(str(x.get("msg", x)) for x in err[:3])
        if err:
            return _one_line(str(err))[:300]
    return _one_line(text)[:300]
