"""A lean HTTP/1.1 client for load tests: JSON POSTs over one kept-alive connection, the
response read by its Content-Length (what ``colgraph serve`` sends), nothing else.

Why: the load generator runs on the same 2 cores as the server it measures, so its own CPU is
taken from the server. httpx (``AsyncClient``) spent about 3 ms of CPU per request here
(``benchmarks/service_load.py``, 32 clients, client ``getrusage`` over 224 requests against the
server's 16 ms per batched request), a sixth of the machine's budget per answered query; a
client that writes the request bytes itself and reads the answer by length spends a fraction of
that. Supported: ``200``-style responses with a ``Content-Length`` header (chunked bodies and
connection upgrades raise ``ValueError``)."""
from __future__ import annotations

import asyncio
import socket


def request_bytes(host: str, port: int, path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def parse_head(head: bytes) -> tuple[int, int]:
    """``(status, content length)`` from a response's status line and headers."""
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = None
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value.strip())
        elif name == b"transfer-encoding" and value.strip().lower() != b"identity":
            raise ValueError(f"transfer-encoding {value.strip()!r} is not supported")
    if length is None:
        raise ValueError("the response has no Content-Length")
    return status, length


class AsyncConnection:
    """One kept-alive connection; ``await post(path, body)`` -> ``(status, body bytes)``."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        self._writer.write(request_bytes(self.host, self.port, path, body))
        head = await self._reader.readuntil(b"\r\n\r\n")
        status, length = parse_head(head[:-4])
        return status, await self._reader.readexactly(length)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except OSError:
                pass
            self._writer = None


class Connection:
    """The blocking twin of :class:`AsyncConnection`."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._sock = socket.create_connection((host, port))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._file = self._sock.makefile("rb")  # buffered: the head line by line, then the body by length

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        self._sock.sendall(request_bytes(self.host, self.port, path, body))
        head = []
        while (line := self._file.readline()) != b"\r\n":
            if not line:
                raise ConnectionError("the server closed the connection")
            head.append(line)
        status, length = parse_head(b"".join(head)[:-2])
        body = self._file.read(length)
        if len(body) < length:
            raise ConnectionError("the server closed the connection")
        return status, body

    def close(self) -> None:
        self._file.close()
        self._sock.close()
