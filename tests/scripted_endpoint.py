"""A real HTTP server on 127.0.0.1 whose replies a test scripts: for the client's own behaviour
(retries, Retry-After, error lines, key handling, concurrency), which a real engine cannot be
made to show on demand. What engines actually answer is tested against a real one in
tests/test_server.py (marker `server`)."""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = tuple[int, dict[str, str], Any]  # status, headers, body (dict -> JSON, str -> as is, Trickle)


@dataclass
class Trickle:
    """A reply sent slowly: `piece` bytes every `every_s` seconds. `body` once (with its
    Content-Length); `forever`: a reply that claims a terabyte and never stops sending; `headers`:
    the status line and headers trickle too, an endless header. The server gives up after
    `limit_s` or when the client hangs up, so that no test can hang on it."""

    body: Any = None
    every_s: float = 0.05
    piece: int = 1
    forever: bool = False
    headers: bool = False
    limit_s: float = 8.0

    def chunks(self) -> Any:
        if self.headers:
            yield b"HTTP/1.1 200 OK\r\n"
            while True:
                yield from (bytes([c]) for c in b"X-Slow: still coming\r\n")
        data = (json.dumps(self.body) if not isinstance(self.body, str) else self.body).encode()
        yield (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
               f"Content-Length: {10**12 if self.forever else len(data)}\r\n\r\n").encode()
        while True:
            yield from (data[i:i + self.piece] for i in range(0, len(data), self.piece))
            if not self.forever:
                return


def completion(text: str, prompt_tokens: int = 10, completion_tokens: int = 5, model: str = "m") -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def echo(request: dict[str, Any], n: int) -> Reply:
    """Answers with the last line of the user message, so each prompt has its own answer."""
    user = request["messages"][-1]["content"]
    return 200, {}, completion("answer: " + user.strip().splitlines()[-1][:60])


class ScriptedEndpoint:
    """`chat(request_json, n)` -> Reply for POST .../chat/completions (n counts from 0), `embed`
    for .../embeddings and `rerank` for .../rerank;
    `models` is the id list of GET .../models (None: 404). Every request is recorded."""

    def __init__(self, chat: Callable[[dict[str, Any], int], Reply] = echo, models: list[str] | None = None,
                 delay_s: float = 0.0, hang_up: bool = False, embed: Callable[[dict[str, Any], int], Reply] | None = None,
                 rerank: Callable[[dict[str, Any], int], Reply] | None = None):
        self.chat, self.models, self.delay_s = chat, models, delay_s
        self.embed, self.rerank = embed, rerank  # POST .../embeddings and .../rerank, when given
        self.hang_up = hang_up  # close every connection after replying, without saying so (as some servers do)
        self.requests: list[dict[str, Any]] = []
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _trickle(self, slow: Trickle) -> None:
                self.close_connection = True
                end = time.monotonic() + slow.limit_s
                try:
                    for chunk in slow.chunks():
                        if time.monotonic() > end:
                            return
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        time.sleep(slow.every_s)
                except OSError:
                    pass  # the client hung up: what a deadline is for

            def _reply(self, status: int, headers: dict[str, str], body: Any) -> None:
                if isinstance(body, Trickle):
                    self._trickle(body)
                    return
                data = (json.dumps(body) if not isinstance(body, str) else body).encode()
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.endswith("/models") and outer.models is not None:
                    self._reply(200, {}, {"object": "list", "data": [{"id": m} for m in outer.models]})
                else:
                    self._reply(404, {}, {"detail": "Not Found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with outer._lock:
                    n = len(outer.requests)
                    outer.requests.append({"path": self.path, "json": body, "headers": dict(self.headers),
                                           "t": time.monotonic(), "peer": self.client_address[1]})
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                try:
                    if outer.delay_s:
                        time.sleep(outer.delay_s)
                    route = next((fn for suffix, fn in (("/v1/chat/completions", outer.chat),
                                                        ("/v1/embeddings", outer.embed), ("/v1/rerank", outer.rerank))
                                  if self.path.endswith(suffix) and fn is not None), None)
                    if route is None:
                        self._reply(404, {}, {"detail": "Not Found"})
                        return
                    self._reply(*route(body, n))
                    self.close_connection = outer.hang_up
                finally:
                    with outer._lock:
                        outer.in_flight -= 1

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that hung up (a timeout test) is not the server's failure

        self.server = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> "ScriptedEndpoint":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def posted(self, suffix: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["path"].endswith(suffix)]

    def await_requests(self, n: int, within_s: float = 5.0) -> int:
        """How many requests arrived, once `n` have or `within_s` passed: a client that gave up
        (a timeout) can be faster than the server's thread that records its request."""
        end = time.monotonic() + within_s
        while len(self.requests) < n and time.monotonic() < end:
            time.sleep(0.01)
        return len(self.requests)

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["path"].endswith("/chat/completions")]
