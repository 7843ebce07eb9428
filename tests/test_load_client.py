"""benchmarks/_http_client.py, the load test's lean HTTP client: requests answered over one
kept-alive connection by a real HTTP/1.1 server on the loopback interface (blocking and asyncio
twins), bodies read by Content-Length, and the responses it cannot read refused by name."""
import asyncio
import importlib.util
import json
import pathlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

CLIENT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "_http_client.py"


def _client():
    spec = importlib.util.spec_from_file_location("_http_client_under_test", CLIENT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: several requests per connection
    connections: set = set()

    def do_POST(self):  # noqa: N802 - the handler API's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).connections.add(self.client_address)
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"0\r\n\r\n")
            return
        out = json.dumps({"path": self.path, "got": json.loads(body), "big": "x" * 200_000}).encode()
        self.send_response(201 if self.path == "/created" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture()
def server():
    _Echo.connections = set()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv.server_address
    srv.shutdown()
    srv.server_close()


def test_blocking_connection_reads_bodies_by_length_over_one_connection(server):
    mod = _client()
    conn = mod.Connection(*server)
    try:
        for i in range(3):
            status, body = conn.post("/query", json.dumps({"question": f"q{i}"}).encode())
            got = json.loads(body)
            assert status == 200 and got["got"] == {"question": f"q{i}"} and len(got["big"]) == 200_000
        assert conn.post("/created", b"{}")[0] == 201
        with pytest.raises(ValueError, match="transfer-encoding"):
            conn.post("/chunked", b"{}")
    finally:
        conn.close()
    assert len(_Echo.connections) == 1  # every request on the one kept-alive connection


def test_async_connection_answers_concurrent_clients(server):
    mod = _client()

    async def main():
        conns = [mod.AsyncConnection(*server) for _ in range(4)]
        try:
            async def one(c, i):
                return [await c.post("/query", json.dumps({"i": i, "n": n}).encode()) for n in range(2)]
            return await asyncio.gather(*(one(c, i) for i, c in enumerate(conns)))
        finally:
            for c in conns:
                await c.close()
    answers = asyncio.run(main())
    for i, pair in enumerate(answers):
        assert [json.loads(b)["got"] for _, b in pair] == [{"i": i, "n": 0}, {"i": i, "n": 1}]
        assert all(status == 200 for status, _ in pair)
    assert len(_Echo.connections) == 4


def test_response_heads_without_a_length_are_refused():
    mod = _client()
    assert mod.parse_head(b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 12\r\nRetry-After: 1") == (429, 12)
    with pytest.raises(ValueError, match="Content-Length"):
        mod.parse_head(b"HTTP/1.1 200 OK\r\nContent-Type: application/json")
