"""One HTTP transport for every model role behind a server: chat completions (`llm=openai`, the
judge, the listwise reranker), embeddings (`embedder=openai`) and `/rerank` (`reranker=http`).

The connections are httpx's (a pooled, thread-safe client per endpoint); what a request may cost
is ours, the same for every role. A request is bounded: one deadline (`timeout_s`) for all of it,
connecting, sending and the whole reply (rag/serving/http_deadline.py), a cap on the reply's size, and at
most `max_retries` retries, with exponential backoff and jitter, on what is worth retrying (429,
5xx, timeouts, refused or broken connections), honouring the server's Retry-After. Anything else
(a wrong URL, an unknown model, a bad key, a redirect loop, a reply the role cannot read after its
retries) is a one-line `EndpointError` naming the config node, the URL and the model.

A reply is data to check, like a file: its JSON is read strictly (NaN, Infinity and numbers too
large for a float are refused where they stand), and a role's parser raises `BadReply` for a
reply of the right shape whose content is wrong (a missing index, a score that is no number).
Such a reply is refused at once, not retried: the server answered, wrongly.

The API key is read from the environment variable the config names (`api_key_env`) and is kept
out of every message and `repr`; configs, caches and outputs only ever hold the variable's name.

How a role talks to its server is one `EndpointSettings`, the `endpoint` node of each role
(conf/endpoint/default.yaml, composed into `llm.endpoint`, `embedder.endpoint`, `reranker.endpoint`
and `eval.judge.endpoint`): its defaults and checks are written once, here, for every role.
"""
from __future__ import annotations

import json
import logging
import math
import os
import random
import threading
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from email.utils import parsedate_to_datetime
from typing import Annotated, Any, ClassVar, Generic, TypeVar
from urllib.parse import urlsplit

from rag.serving.concurrent import Cancelled
from rag.serving.http_deadline import DeadlineTransport, deadline, seconds_left
from rag.serving.reply import BadReply, decode_reply
from rag.config.schema import shown
from rag.serving.secrets import problem as secret_problem
from rag.serving.secrets import redact, redact_url
from rag.types import RagError

log = logging.getLogger(__name__)
# httpx logs every request at INFO; a run's log would hold one line per chunk batch.
logging.getLogger("httpx").setLevel(logging.WARNING)

T = TypeVar("T")
E = TypeVar("E", bound="Endpoint")
RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
MAX_RETRY_AFTER_S = 120.0  # a server asking for longer is treated as down rather than waited for
MAX_BODY_BYTES = 256 * 2**20  # far above any reply a role reads (64 texts x 4096-d vectors is ~6 MiB)


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


def _in_flight(key: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise RagError(f"{key} must be an integer, got {shown(v)}")
    if not 1 <= v <= 256:
        raise RagError(f"{key} must be between 1 and 256, got {v}")


def _count(key: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise RagError(f"{key} must be an integer, got {shown(v)}")
    if v < 0:
        raise RagError(f"{key} must be >= 0, got {v}")


def _seconds(key: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RagError(f"{key} must be a number, got {shown(v)}")
    if not math.isfinite(v):
        raise RagError(f"{key} must be a finite number, got {shown(v)}")
    if v <= 0:
        raise RagError(f"{key} must be positive, got {shown(v)}")


def _fields(key: str, v: Any) -> None:
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise RagError(f"{key} must be a mapping of request fields, e.g. {{top_k: 1}}, got {shown(v)}")


@dataclass(frozen=True)
class EndpointSettings:
    """How a role talks to its server: the `endpoint` node of `llm=openai`, `embedder=openai`,
    `reranker=http` and `eval.judge`. Hydra builds it from the node (`_target_`) and hands it to
    the role, which names it in messages (`what`) and says which settings it takes: the reranker
    sends one request at a time, and only the chat roles send `extra_body`.

    Each setting's rule is its annotation's (rag/config/schema.py reads them at start-up, naming the
    node's full key); `check` applies them again for settings built in Python.

    `cache_namespace` is no transport setting but a label of the endpoint: two servers that serve
    different weights under one model id (two quantizations) keep their outputs apart by it. It
    goes into the role's cache keys as it is written (a number stays a number)."""

    concurrency: Annotated[int, _in_flight] = 4  # requests in flight at once
    timeout_s: Annotated[float, _seconds] = 120.0  # one deadline per request: connecting, sending, the whole reply
    max_retries: Annotated[int, _count] = 4
    backoff_s: Annotated[float, _seconds] = 0.5
    max_backoff_s: Annotated[float, _seconds] = 30.0
    extra_body: Annotated[dict[str, Any], _fields] = field(default_factory=dict)
    cache_namespace: str | int | float | None = None  # any label: key material as written, so not coerced

    def check(self, what: str, takes: tuple[str, ...] | None = None, reserved: Sequence[str] = ()) -> None:
        """A one-line RagError naming `<what>.endpoint.<setting>` for the first bad value, for a
        setting outside `takes` (None: all) set away from its default, and for an `extra_body`
        field among `reserved` (those the request sets itself)."""
        key = f"{what}.endpoint"
        default = EndpointSettings()
        hints = typing.get_type_hints(EndpointSettings, include_extras=True)
        for f in fields(self):
            value = getattr(self, f.name)
            if takes is not None and f.name not in takes and value != getattr(default, f.name):
                raise RagError(f"{key}.{f.name} is not a setting of {what} (it takes {', '.join(takes)})")
            for rule in getattr(hints[f.name], "__metadata__", ()):
                rule(f"{key}.{f.name}", value)
        clash = set(reserved) & set(self.extra_body)
        if clash:
            raise RagError(f"{key}.extra_body must not set {sorted(clash)}: the request sets them itself")

    def transport(self, what: str, base_url: str, model: str, api_key_env: str | None = None, *,
                  kind: type[E] | None = None, takes: tuple[str, ...] | None = None) -> E:
        """The role's `Endpoint` (or `kind`) to `base_url` and `model`, checked first: a pool of
        `concurrency` connections, or one for a role that does not take `concurrency`."""
        cls: type[Any] = Endpoint if kind is None else kind
        self.check(what, takes, cls.own_fields)
        connections = self.concurrency if takes is None or "concurrency" in takes else 1
        made: E = cls(base_url, str(model), api_key_env, settings=self, what=what, connections=connections)
        return made


@dataclass
class Reply(Generic[T]):
    """What a role's parser made of a successful reply, and what it took."""

    value: T
    latency_ms: float
    attempts: int


class _Failure(Exception):
    """One failed attempt: what to say about it, whether to retry, how long the server asked to wait."""

    def __init__(self, text: str, retry: bool, unreachable: bool = False, retry_after: float | None = None,
                 status: int | None = None):
        super().__init__(text)
        self.text, self.retry, self.unreachable, self.retry_after, self.status = (
            text, retry, unreachable, retry_after, status)


@dataclass
class Endpoint:
    """One server and model. `what` names the config node in messages (`llm`, `embedder`,
    `reranker`, `eval.judge`); `settings` are its `endpoint` node's; `connections` bounds the pool
    (the role's concurrency)."""

    base_url: str
    model: str
    api_key_env: str | None = None
    settings: EndpointSettings = field(default_factory=EndpointSettings)
    what: str = "llm"
    connections: int = 8
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    own_fields: ClassVar[tuple[str, ...]] = ()  # request fields the transport sets: `extra_body` must not

    def __post_init__(self) -> None:
        parts = urlsplit(str(self.base_url))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RagError(f"{self.what}.base_url must be an http(s) URL such as http://127.0.0.1:8000/v1, "
                           f"got {redact_url(str(self.base_url))!r}")
        if parts.username is not None or parts.password is not None:
            # every message names the URL; the key comes from api_key_env instead
            raise RagError(secret_problem(f"{self.what}.base_url", str(self.base_url))
                           or f"{self.what}.base_url must not hold credentials")
        if not self.model or not str(self.model).strip():
            raise RagError(f"{self.what}.model must name the model the endpoint serves")
        self.settings.check(self.what)
        self.base_url = str(self.base_url).rstrip("/")
        self._key = self._read_key()
        self._client: Any = None

    def _read_key(self) -> str | None:
        if not self.api_key_env:
            return None
        key = os.environ.get(str(self.api_key_env), "")
        if not key:
            raise RagError(f"{self.what}.api_key_env={self.api_key_env}: the environment variable {self.api_key_env} "
                           "is not set (export it, or set api_key_env=null for a server without keys)")
        return key

    def __repr__(self) -> str:  # never the key
        return f"{type(self).__name__}({self.base_url!r}, model={self.model!r}, api_key_env={self.api_key_env!r})"

    def __getstate__(self) -> dict[str, Any]:  # a pickled endpoint (a sweep's job) opens its own pool
        state = dict(self.__dict__)
        state["_client"], state["_lock"] = None, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- transport --------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        import httpx

        with self._lock:
            if self._client is None:
                headers = {"Accept": "application/json"}
                if self._key:
                    headers["Authorization"] = f"Bearer {self._key}"
                n = max(1, int(self.connections))
                limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
                self._client = httpx.Client(headers=headers, timeout=float(self.settings.timeout_s),
                                            follow_redirects=True, limits=limits, transport=DeadlineTransport(limits))
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def url(self, path: str) -> str:
        return self.base_url + path

    def redact(self, text: str) -> str:
        return redact(text.replace(self._key, "***") if self._key else text)

    def _send(self, method: str, path: str, payload: dict[str, Any] | None) -> tuple[int, dict[str, str], str]:
        """One attempt: (status, lower-cased headers, body), or a `_Failure` for the transport's errors."""
        import httpx

        try:
            with deadline(float(self.settings.timeout_s)):
                try:
                    return self._exchange(method, path, payload)
                except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
                    # A kept-alive connection the server closed in the meantime fails at once, before
                    # any response: that is no failed attempt, just a new connection (once).
                    return self._exchange(method, path, payload)
        except httpx.TimeoutException:
            raise _Failure(f"no complete response within {self.settings.timeout_s:g} s "
                           f"({self.what}.endpoint.timeout_s)", retry=True) from None
        except httpx.TooManyRedirects as e:
            raise EndpointError(f"{self.what}: {method} {self.url(path)} was redirected more than "
                                f"{self.client.max_redirects} times, last to {self.redact(str(e.request.url))} "
                                f"(a redirect loop); check {self.what}.base_url", unreachable=True) from None
        except httpx.ConnectError as e:
            text = str(e)
            if "Name or service not known" in text or "nodename nor servname" in text or "getaddrinfo" in text \
                    or "Temporary failure in name resolution" in text:
                raise EndpointError(f"{self.what}: cannot resolve the host of {self.base_url} ({_one_line(text)}); "
                                    f"check {self.what}.base_url", unreachable=True) from None
            if "SSL" in text or "certificate" in text.lower():
                raise EndpointError(f"{self.what}: TLS error talking to {self.base_url}: {_one_line(text)}",
                                    unreachable=True) from None
            what = "connection refused" if "refused" in text.lower() else _one_line(text) or type(e).__name__
            raise _Failure(f"cannot connect to {self.base_url} ({what})", retry=True, unreachable=True) from None
        except (httpx.TransportError, httpx.DecodingError) as e:  # reset, broken pipe, protocol errors
            raise _Failure(f"the connection broke ({type(e).__name__})", retry=True) from None

    def _exchange(self, method: str, path: str, payload: dict[str, Any] | None) -> tuple[int, dict[str, str], str]:
        """The request and its whole reply, read in pieces against the deadline and the size cap."""
        import httpx

        with self.client.stream(method, self.url(path), json=payload) as resp:
            body = bytearray()
            for piece in resp.iter_bytes():
                body += piece
                if len(body) > MAX_BODY_BYTES:
                    raise self.bad_reply(path, f"a reply of more than {MAX_BODY_BYTES // 2**20} MiB", method)
                left = seconds_left()  # the sockets keep the deadline; this is for a proxy's transport
                if left is not None and left <= 0:
                    raise httpx.ReadTimeout("the request's deadline has passed")
            text = body.decode(resp.encoding or "utf-8", errors="replace")
            return resp.status_code, {k.lower(): v for k, v in resp.headers.items()}, text

    def bad_reply(self, path: str, what: str, method: str = "POST") -> EndpointError:
        """A reply refused for its content: one line, never retried (the server answered, wrongly)."""
        return EndpointError(f"{self.what}: {method} {self.url(path)} answered wrongly: {self.redact(what)} "
                             f"({self.what}.model={self.model}); nothing of this reply is kept")

    def _read(self, path: str, text: str, parse: Callable[[Any], T | None]) -> T | None:
        try:
            return parse(decode_reply(text))
        except BadReply as e:
            raise self.bad_reply(path, str(e)) from None
        except ValueError:
            return None

    # -- requests ---------------------------------------------------------------------------

    def post(self, path: str, payload: dict[str, Any], parse: Callable[[Any], T | None],
             stop: threading.Event | None = None) -> Reply[T]:
        """POST `payload` to `path`, retried on transient failures; `parse` turns the JSON reply
        into the role's value (None: unreadable, retried like a 5xx; `BadReply`: refused at once).
        A request past its deadline is a timeout, retried like one. `stop` set by another thread
        ends the retries early (with `Cancelled`)."""
        t0 = time.perf_counter()
        last, unreachable, status = "no attempt", False, None
        retries = int(self.settings.max_retries)
        for attempt in range(retries + 1):
            if stop is not None and stop.is_set():
                raise Cancelled()
            delay = None
            try:
                code, headers, text = self._send("POST", path, payload)
            except _Failure as f:
                last, unreachable, status = f.text, f.unreachable, None
            else:
                unreachable = False
                if code == 200:
                    value = self._read(path, text, parse)
                    if value is not None:
                        return Reply(value, 1000.0 * (time.perf_counter() - t0), attempt + 1)
                    last, status = f"an unreadable response body: {_one_line(self.redact(text))[:200]}", None
                elif code in RETRY_STATUS:
                    last, status = f"HTTP {code}: {self.redact(_error_message(text))}", code
                    delay = _retry_after(headers)
                else:
                    raise self._refused("POST", path, code, text)
            if attempt < retries:
                pause = self._backoff(attempt, delay)
                log.info("%s: %s; retry %d/%d in %.1f s", self.what, last, attempt + 1, retries, pause)
                if stop is not None:
                    if stop.wait(pause):
                        raise Cancelled()
                else:
                    time.sleep(pause)
        seconds = time.perf_counter() - t0
        hint = " - is the server running?" if "refused" in last else ""
        raise EndpointError(
            f"{self.what}: POST {self.url(path)} failed after {_attempts(retries + 1)} "
            f"over {seconds:.1f} s: {last}{hint} ({self.what}.model={self.model})", status=status, transient=True,
            unreachable=unreachable)

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, MAX_RETRY_AFTER_S)
        # exponential with jitter, so that parallel workers do not retry in lockstep
        s = self.settings
        return min(float(s.max_backoff_s), float(s.backoff_s) * 2**attempt) * random.uniform(0.5, 1.0)

    def _refused(self, method: str, path: str, status: int, text: str) -> EndpointError:
        msg = self.redact(_error_message(text))
        where = f"{method} {self.url(path)} -> HTTP {status}: {msg}"
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
        without a usable /models (some answer 404 or 500) are let through: the first request
        reports what is wrong. Returns the served model ids when the server lists them."""
        try:
            status, _, text = self._send("GET", "/models", None)
        except _Failure as f:
            if f.unreachable and "refused" in f.text:
                raise EndpointError(f"{self.what}: cannot connect to {self.base_url} (connection refused) - is the "
                                    f"server running? ({self.what}.base_url)", unreachable=True) from None
            log.warning("%s: GET %s failed (%s); going on", self.what, self.url("/models"), f.text)
            return None
        if status in (401, 403):
            raise self._refused("GET", "/models", status, text)
        if status != 200:
            return None
        try:
            ids = [str(m["id"]) for m in decode_reply(text).get("data", [])]
        except (BadReply, ValueError, KeyError, TypeError, AttributeError):
            return None
        if ids and self.model not in ids:
            shown = ", ".join(ids[:8]) + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")
            raise EndpointError(f"{self.what}: the server at {self.base_url} does not serve model {self.model!r} "
                                f"({self.what}.model); it serves: {shown}", status=404)
        return ids


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
