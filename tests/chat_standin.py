"""A local stand-in for an OpenAI-compatible chat endpoint: a real HTTP server for tests.

``with chat_standin(reply) as (base_url, server): ...`` serves ``POST /v1/chat/completions`` on
127.0.0.1 (a free port) from a thread. ``reply(request_json)`` decides each answer:

* a ``str``: a 200 reply in OpenAI's chat-completion shape with that text as the message content;
* ``(status, body, headers)``: sent as is (``body``: a dict is sent as JSON, a str as text);
* ``Reply(...)``: a str with a ``delay`` (seconds to wait before answering: slow replies and
  timeouts) and a ``finish_reason``.

``server.requests`` lists every request's JSON (thread-safe append), ``server.max_in_flight`` is
the most requests handled at once. Exceptions in ``reply`` become a 500 with the message, so a
broken test script shows up as a failed call, not a hung test.
"""
from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Reply:
    text: str
    delay: float = 0.0
    finish_reason: str = "stop"


def completion_body(text: str, model: str, finish_reason: str = "stop") -> dict:
    return {
        "id": "chatcmpl-standin", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


class StandinServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # slow handlers of timed-out requests must not hold up the test

    def __init__(self, reply: Callable[[dict], object]):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.reply = reply
        self.requests: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()

    @property
    def count(self) -> int:
        with self.lock:
            return len(self.requests)


class _Handler(BaseHTTPRequestHandler):
    server: StandinServer

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send(404, {"error": {"message": f"no route {self.path}"}}, {})
            return
        length = int(self.headers.get("Content-Length") or 0)
        try:
            request = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._send(400, {"error": {"message": "body is not JSON"}}, {})
            return
        srv = self.server
        with srv.lock:
            srv.requests.append(request)
            srv.in_flight += 1
            srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
        try:
            try:
                answer = srv.reply(request)
            except Exception as exc:  # a broken script is a 500, visible in the test
                answer = (500, {"error": {"message": f"stand-in reply raised {exc!r}"}}, {})
            if isinstance(answer, str):
                answer = Reply(answer)
            if isinstance(answer, Reply) and answer.delay:
                time.sleep(answer.delay)
        finally:
            # counted as in flight while being answered, not while the reply is written: a client
            # that has read a reply may send its next request before this handler's thread resumes
            with srv.lock:
                srv.in_flight -= 1
        if isinstance(answer, Reply):
            self._send(200, completion_body(answer.text, request.get("model", ""), answer.finish_reason), {})
        else:
            status, body, headers = answer
            self._send(status, body, headers)

    def _send(self, status: int, body: object, headers: dict) -> None:
        data = json.dumps(body).encode() if not isinstance(body, str) else body.encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if not isinstance(body, str) else "text/plain")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, str(value))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
            pass


@contextlib.contextmanager
def chat_standin(reply: Callable[[dict], object]) -> Iterator[tuple[str, StandinServer]]:
    """Serves `reply` on a free loopback port; yields ``(base_url ending in /v1, server)``."""
    server = StandinServer(reply)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def last_user_text(request: dict) -> str:
    """The text of the request's last user message (text parts joined)."""
    for message in reversed(request.get("messages", [])):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            return "\n".join(p.get("text", "") for p in content if p.get("type") == "text")
    return ""
