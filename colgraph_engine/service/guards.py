"""Request guards: body size limits, the optional bearer token, and per-route request metrics.

The middlewares are plain ASGI (no per-request task or body copy):

* :class:`BodyLimit` answers 413 when a request body is larger than its path's limit: at once
  when ``Content-Length`` says so, otherwise as soon as the streamed body passes the limit (the
  response the app would have sent is replaced by the 413).
* :class:`RequestMetrics` counts every answered request by route template (``/documents/{doc_id}``,
  not the concrete path, so labels stay few), method and status, and times it.

:class:`BearerToken` (only when a token is set) compares ``Authorization: Bearer <token>`` in
constant time; a missing or wrong token is a 401 with ``WWW-Authenticate: Bearer``.
"""
from __future__ import annotations

import hmac
import json
import time

from .metrics import ServiceMetrics


class _TooLarge(Exception):
    pass


async def _send_json(send, status: int, body: dict, headers: list[tuple[bytes, bytes]] = ()) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            (b"connection", b"close"), *headers]})
    await send({"type": "http.response.body", "body": data})


class BodyLimit:
    """413 for bodies over ``limit_for(path)`` bytes (see the module docstring)."""

    def __init__(self, app, limit_for):
        self.app, self.limit_for = app, limit_for

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.limit_for(scope["path"])
        message = f"request body: expected at most {limit} bytes for {scope['path']}"
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    return await _send_json(send, 400, {"detail": "Content-Length: expected an integer"})
                if declared > limit:
                    return await _send_json(send, 413, {"detail": f"{message}, got {declared}"})
        seen = 0
        exceeded = False
        started = False

        async def limited_receive():
            nonlocal seen, exceeded
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    exceeded = True
                    raise _TooLarge
            return msg

        async def guarded_send(msg):
            nonlocal started
            if exceeded:
                if not started:  # whatever the app made of the cut body, the answer is 413
                    started = True
                    await _send_json(send, 413, {"detail": f"{message}, got more"})
                return
            started = started or msg["type"] == "http.response.start"
            await send(msg)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _TooLarge:
            if not started:
                await _send_json(send, 413, {"detail": f"{message}, got more"})


class RequestMetrics:
    """Counts and times requests per route template (see the module docstring)."""

    def __init__(self, app, metrics: ServiceMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status = 500

        async def recording_send(msg):
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route = scope.get("route")
            name = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.inc(route=name, method=scope.get("method", ""), status=str(status))
            self.metrics.request_seconds.observe(time.perf_counter() - t0, route=name)


class BearerToken:
    """401 unless ``Authorization: Bearer <token>`` (compared in constant time), for every path
    but `open_paths` and those under `open_prefixes` (GET and HEAD only there: the web page's
    static files, which hold nothing of the index); checked before the body is read, so an
    unauthenticated upload costs nothing."""

    def __init__(self, app, token: str, open_paths=("/health",), open_prefixes=()):
        if not isinstance(token, str) or not token.strip():
            raise ValueError("token: expected a non-empty string")
        self.app, self.expected, self.open_paths = app, token.encode(), frozenset(open_paths)
        self.open_prefixes = tuple(open_prefixes)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in self.open_paths or (
                self.open_prefixes and scope["path"].startswith(self.open_prefixes)
                and scope.get("method") in ("GET", "HEAD")):
            return await self.app(scope, receive, send)
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
        scheme, _, given = header.partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.expected):
            return await _send_json(send, 401, {"detail": "Authorization: expected 'Bearer <token>' with the "
                                                          "service's token"}, [(b"www-authenticate", b"Bearer")])
        return await self.app(scope, receive, send)


__all__ = ["BearerToken", "BodyLimit", "RequestMetrics"]
