"""The HTTP service (issue 15): in-process (starlette's TestClient) and as a real uvicorn server on
127.0.0.1 with a real HTTP client (httpx). Results are compared with the pipeline called
in-process on the same index; batching under concurrent clients; every 4xx path; draining on
shutdown; writes through HTTP seen by the next query while readers keep being answered."""
from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn
from fastapi.testclient import TestClient
from PIL import Image

from colgraph_engine.demos.corpus import _photo, demo_documents
from colgraph_engine.kg import Encoders, KnowledgeIndex
from colgraph_engine.demos import kg_data as kg_demo
from colgraph_engine.pipeline import Pipeline, PipelineConfig, Query
from colgraph_engine.service import DynamicBatcher, QueueFull, ServiceConfig, ShuttingDown, create_app
from colgraph_engine.service.app import json_bytes
from colgraph_engine.service.writer import check_file_name

ENC = Encoders.offline()
QUESTIONS = [
    "Which photo shows the mission patch on the astronaut's suit?",
    "What did the space shuttle carry into orbit?",
    "Where does the cat sit in the harbour cafe?",
    "Which sport is associated with the film poster?",
    "Where is Mount Fuji seen from the train?",
    "Who commanded the shuttle mission?",
]
OBSERVATORY_NOTE = (b"The Zorvandel observatory stands on the northern ridge of Kalimtor. Astronomers of Kalimtor "
             b"built the Zorvandel observatory in 1921.")


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("service") / "template"
    index = KnowledgeIndex.create(path, ENC)
    index.add_documents(demo_documents() + kg_demo.demo_documents())
    return path


@pytest.fixture
def index_dir(template, tmp_path) -> Path:
    """A fresh copy of the committed demo index (tests that write get their own)."""
    dst = tmp_path / "index"
    shutil.copytree(template, dst)
    return dst


@pytest.fixture(scope="module")
def shared_client(template):
    """One read-only in-process service over the template (no test through it writes)."""
    app = create_app(KnowledgeIndex.open(template, ENC), ENC, service=ServiceConfig(max_wait_ms=1.0))
    with TestClient(app) as c:
        yield c


def png_bytes(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


def comparable(d: dict) -> dict:
    """A result as JSON without what differs run to run (timings) or is the service's own (batch)."""
    d = json.loads(json_bytes(d)) if not isinstance(d, dict) or "batch" not in d else dict(d)
    d.pop("timings", None)
    d.pop("batch", None)
    return d


def in_process(path: Path, query: Query, **changes) -> dict:
    pipe = Pipeline(KnowledgeIndex.open(path, ENC), ENC, PipelineConfig().replace(**changes))
    return comparable(json.loads(json_bytes(pipe.retrieve(query).as_dict())))


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (for a server started in a subprocess)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_serving(proc: subprocess.Popen, url: str, why, timeout: float = 60.0) -> None:
    """Returns once the `colgraph serve` process `proc` answers ``GET /health`` at `url`; fails
    with ``why()`` (its stderr) when it exits first, or after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, why()
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "colgraph serve did not come up"
        time.sleep(0.1)


@contextmanager
def serving(app, **config):
    """The app on a real uvicorn server on 127.0.0.1 (an ephemeral port), in a thread."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                           timeout_graceful_shutdown=30, **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", server, thread
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


# -- queries -------------------------------------------------------------------------------

def test_query_equals_the_pipeline_in_process(shared_client, template):
    for q in QUESTIONS[:3]:
        r = shared_client.post("/query", json={"question": q, "config": {"kd": 3, "hops": 2}})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["batch"]["size"] >= 1 and set(body["timings"]) >= {"encode", "recall", "visual", "context"}
        assert comparable(body) == in_process(template, Query(q), kd=3, hops=2)
        assert body["documents"] and body["context"]


def test_query_image_as_base64_json_and_as_multipart_file(shared_client, template):
    cat = _photo("chelsea")[30:270, 60:400]
    data = png_bytes(cat)
    want = in_process(template, Query("Where does this animal live?", image=np.asarray(Image.open(io.BytesIO(data))),
                                      caption="a tabby cat"), kd=2)
    assert want["documents"][0]["doc_id"] == "harbour-cafe" and want["has_image"]
    r = shared_client.post("/query", json={"question": "Where does this animal live?", "caption": "a tabby cat",
                                           "image_base64": base64.b64encode(data).decode(), "config": {"kd": 2}})
    assert r.status_code == 200, r.text
    assert comparable(r.json()) == want
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    r = shared_client.post("/query", json={"question": "Where does this animal live?", "caption": "a tabby cat",
                                           "image_base64": url, "config": {"kd": 2}})
    assert comparable(r.json()) == want
    r = shared_client.post("/query/form", data={"question": "Where does this animal live?", "caption": "a tabby cat",
                                                "config": json.dumps({"kd": 2})},
                           files={"image": ("cat.png", data, "image/png")})
    assert r.status_code == 200, r.text
    assert comparable(r.json()) == want


def test_batch_request_answers_in_order_with_per_query_configs(shared_client, template):
    queries = [{"question": QUESTIONS[0]}, {"question": QUESTIONS[1], "config": {"kd": 2, "visual_ranker": "off"}},
               {"question": QUESTIONS[2], "config": {"retrieval": "chunks"}}]
    r = shared_client.post("/query/batch", json={"queries": queries})
    assert r.status_code == 200, r.text
    items = r.json()["results"]
    assert [i["status"] for i in items] == [200, 200, 200]
    for item, q in zip(items, queries):
        assert comparable(item["result"]) == in_process(template, Query(q["question"]), **q.get("config", {}))
    assert items[1]["result"]["images"] == []  # visual ranker off for that query only
    assert items[0]["result"]["batch"]["size"] == 1  # three configs: three retrieve_batch calls


def test_openapi_schema_comes_from_the_models(shared_client):
    spec = shared_client.get("/openapi.json").json()
    assert {"/query", "/query/form", "/query/batch", "/documents", "/documents/{doc_id}", "/health", "/info",
            "/metrics"} <= set(spec["paths"])
    schemas = spec["components"]["schemas"]
    kd = schemas["ConfigOverrides"]["properties"]["kd"]["anyOf"][0]
    assert (kd["minimum"], kd["maximum"]) == (1, 100)
    assert "only_context" not in schemas["ConfigOverrides"]["properties"]
    assert set(schemas["ConfigOverrides"]["properties"]["filter"]["anyOf"][0]["enum"]) == {"off", "mkg", "default"}
    assert {"question", "documents", "images", "timings", "batch"} <= set(schemas["QueryResponse"]["properties"])


def test_health_info_and_metrics(shared_client):
    h = shared_client.get("/health").json()
    assert h["status"] == "ok" and h["documents"] == 7 and h["generation"] >= 1
    info = shared_client.get("/info").json()
    assert info["index"]["counts"]["documents"] == 7 and info["encoders"] == ENC.describe()
    assert info["service"]["max_batch"] == 32 and info["service"]["token"] is False
    assert "native" in info["backends"] and info["pipeline_config"]["kd"] == 10
    shared_client.post("/query", json={"question": QUESTIONS[3]})
    text = shared_client.get("/metrics").text
    check_exposition(text)
    assert re.search(r'^colgraph_requests_total\{route="/query",method="POST",status="200"\} [1-9]', text, re.M)
    assert re.search(r'^colgraph_stage_seconds_count\{stage="recall"\} [1-9]', text, re.M)
    assert re.search(r"^colgraph_batch_size_count [1-9]", text, re.M)
    assert re.search(r"^colgraph_queue_depth 0$", text, re.M)
    assert re.search(r"^colgraph_index_documents 7$", text, re.M)


SAMPLE = re.compile(r'^([a-z_]+)(\{([a-z_]+="[^"\\]*"(,[a-z_]+="[^"\\]*")*)?\})? (-?[0-9.e+-]+|\+Inf)$')


def check_exposition(text: str) -> None:
    """Every line a HELP/TYPE comment or a valid sample; histogram buckets cumulative, +Inf = count."""
    assert text.endswith("\n")
    buckets: dict[str, list[float]] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("# "):
            assert re.match(r"^# (HELP [a-z_]+ .+|TYPE [a-z_]+ (counter|gauge|histogram))$", line), line
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, labels, value = m.group(1), m.group(3) or "", float(m.group(5))
        series = re.sub(r',?le="[^"]*"', "", labels)
        if name.endswith("_bucket"):
            buckets.setdefault(name[:-7] + series, []).append(value)
        elif name.endswith("_count"):
            counts[name[:-6] + series] = value
    assert buckets
    for key, values in buckets.items():
        assert values == sorted(values), f"{key}: buckets not cumulative"
        assert values[-1] == counts[key], f"{key}: +Inf bucket != count"


# -- every 4xx ----------------------------------------------------------------------------------

BAD_QUERIES = [
    ("not json", b"{question:", 422),
    ("missing question", {"caption": "x"}, 422),
    ("extra field", {"question": "q", "colour": 1}, 422),
    ("blank question", {"question": "   "}, 422),
    ("question too long", {"question": "x" * 5000}, 422),
    ("question not a string", {"question": 5}, 422),
    ("unknown config key", {"question": "q", "config": {"kdd": 3}}, 422),
    ("kd below range", {"question": "q", "config": {"kd": 0}}, 422),
    ("kd above the service cap", {"question": "q", "config": {"kd": 101}}, 422),
    ("kd as a string", {"question": "q", "config": {"kd": "5"}}, 422),
    ("unknown filter", {"question": "q", "config": {"filter": "bogus"}}, 422),
    ("threshold out of range", {"question": "q", "config": {"threshold": 2.0}}, 422),
    ("only_context is not an override", {"question": "q", "config": {"only_context": False}}, 422),
    ("image not base64", {"question": "q", "image_base64": "!!!"}, 422),
    ("image not an image", {"question": "q", "image_base64": base64.b64encode(b"hello").decode()}, 422),
    ("data URL without base64", {"question": "q", "image_base64": "data:image/png,abc"}, 422),
    ("answer without a generator", {"question": "q", "answer": True}, 422),
]


@pytest.mark.parametrize("what,body,code", BAD_QUERIES, ids=[b[0] for b in BAD_QUERIES])
def test_bad_query_bodies_are_refused_with_a_message(shared_client, what, body, code):
    if isinstance(body, bytes):
        r = shared_client.post("/query", content=body, headers={"content-type": "application/json"})
    else:
        r = shared_client.post("/query", json=body)
    assert r.status_code == code, (what, r.text)
    assert r.json()["detail"]


def test_other_bad_requests(shared_client):
    c = shared_client
    big = np.zeros((200, 200, 3), np.uint8)
    r = c.post("/query", content=b"question=q", headers={"content-type": "text/plain"})
    assert r.status_code == 422
    assert c.get("/query").status_code == 405
    assert c.get("/nowhere").status_code == 404
    r = c.post("/query/batch", json={"queries": []})
    assert r.status_code == 422
    r = c.post("/query/batch", json={"queries": [{"question": "q"}] * 65})
    assert r.status_code == 422 and "at most 64" in r.json()["detail"]
    r = c.post("/query/batch", json={"queries": [{"question": "q"}, {"question": " "}]})
    assert r.status_code == 422 and r.json()["detail"].startswith("queries[1].question")
    r = c.post("/query/form", data={"question": "q", "config": "{not json"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"].startswith("config")
    r = c.post("/query/form", data={"question": "q", "config": json.dumps({"kd": 500})})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == "config.kd"
    r = c.post("/query/form", data={"question": "q"}, files={"image": ("x.png", b"not a png", "image/png")})
    assert r.status_code == 422 and r.json()["detail"].startswith("image: cannot read")
    r = c.post("/query/form", data={"caption": "no question"})
    assert r.status_code == 422
    r = c.delete("/documents/no-such-document")
    assert r.status_code == 404 and "no-such-document" in r.json()["detail"]
    assert c.post("/documents").status_code == 422  # no files
    # pixel limit of the query image
    small = create_app(KnowledgeIndex.open(c.app.state.colgraph.path, ENC), ENC,
                       service=ServiceConfig(max_image_pixels=100 * 100))
    with TestClient(small) as c2:
        r = c2.post("/query", json={"question": "q", "image_base64": base64.b64encode(png_bytes(big)).decode()})
        assert r.status_code == 422 and "at most 10000 pixels" in r.json()["detail"]


def test_body_size_limits_declared_and_streamed(template):
    app = create_app(KnowledgeIndex.open(template, ENC), ENC, service=ServiceConfig(max_query_bytes=1000))
    with TestClient(app) as c:
        r = c.post("/query", json={"question": "q" * 2000})
        assert r.status_code == 413 and "at most 1000 bytes" in r.json()["detail"]

        def chunks():  # no Content-Length: the limit is enforced on the stream
            for _ in range(10):
                yield b" " * 200
        r = c.post("/query", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert c.post("/query", json={"question": "a small one"}).status_code == 200


def test_bearer_token(template):
    app = create_app(KnowledgeIndex.open(template, ENC), ENC, service=ServiceConfig(token="s3cret"))
    with TestClient(app) as c:
        assert c.get("/health").status_code == 200  # open for probes
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Basic s3cret"}):
            r = c.post("/query", json={"question": "q"}, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert c.get("/metrics", headers=headers).status_code == 401
        r = c.post("/query", json={"question": QUESTIONS[0]}, headers={"authorization": "Bearer s3cret"})
        assert r.status_code == 200
        assert "access-control-allow-origin" not in r.headers  # CORS off by default


def test_cors_only_when_origins_are_given(template):
    app = create_app(KnowledgeIndex.open(template, ENC), ENC, service=ServiceConfig(cors_origins=("http://a.test",)))
    with TestClient(app) as c:
        r = c.options("/query", headers={"origin": "http://a.test", "access-control-request-method": "POST"})
        assert r.headers["access-control-allow-origin"] == "http://a.test"
        r = c.options("/query", headers={"origin": "http://b.test", "access-control-request-method": "POST"})
        assert "access-control-allow-origin" not in r.headers


def test_queue_full_is_429_with_retry_after_and_shutdown_is_503(template):
    app = create_app(KnowledgeIndex.open(template, ENC), ENC, service=ServiceConfig(queue_size=2, retry_after_s=3))
    with TestClient(app) as c:
        r = c.post("/query/batch", json={"queries": [{"question": q} for q in QUESTIONS[:3]]})
        assert r.status_code == 429 and r.headers["retry-after"] == "3"
        r = c.post("/query/batch", json={"queries": [{"question": q} for q in QUESTIONS[:2]]})
        assert r.status_code == 200
        assert re.search(r'^colgraph_rejected_total\{reason="queue_full"\} 1$', c.get("/metrics").text, re.M)
        c.portal.call(app.state.batcher.close)
        r = c.post("/query", json={"question": "q"})
        assert r.status_code == 503 and r.headers["retry-after"] == "3"
        assert c.get("/health").json()["status"] == "draining"


def test_read_only_index_refuses_writes(template):
    memory = KnowledgeIndex(ENC)
    memory.add_documents(kg_demo.demo_documents())
    with TestClient(create_app(memory, ENC)) as c:
        r = c.post("/documents", files=[("files", ("a.txt", OBSERVATORY_NOTE, "text/plain"))])
        assert r.status_code == 409 and "read-only" in r.json()["detail"]
        assert c.post("/query", json={"question": QUESTIONS[4]}).status_code == 200


def test_bad_uploads(index_dir):
    with TestClient(create_app(KnowledgeIndex.open(index_dir, ENC), ENC,
                               service=ServiceConfig(max_upload_files=3))) as c:
        for name in (".hidden.txt", "a/b.txt", ".."):
            r = c.post("/documents", files=[("files", (name, b"some text", "text/plain"))])
            assert r.status_code == 422 and r.json()["detail"].startswith("files[0]: "), (name, r.text)
        for name in ("x\x01.txt", "a\\b", "", "n" * 256, 5):  # names an HTTP client would escape or refuse
            with pytest.raises(ValueError, match="files\\[2\\]"):
                check_file_name(name, "files[2]")
        r = c.post("/documents", files=[("files", ("a.txt", b"one", "text/plain")),
                                        ("files", ("a.txt", b"two", "text/plain"))])
        assert r.status_code == 422 and "two files are named 'a.txt'" in r.json()["detail"]
        r = c.post("/documents", files=[("files", (f"{i}.txt", b"text", "text/plain")) for i in range(4)])
        assert r.status_code == 422 and "at most 3 files" in r.json()["detail"]
        r = c.post("/documents", files=[("files", ("broken.pdf", b"%PDF-1.7 not really", "application/pdf"))])
        assert r.status_code == 422 and r.json()["documents"][0]["status"] == "failed"
        r = c.post("/documents", files=[("files", ("note.txt", OBSERVATORY_NOTE, "text/plain"))])
        assert r.status_code == 200 and r.json()["added"] == 1
        r = c.post("/documents", files=[("files", ("note.txt", OBSERVATORY_NOTE, "text/plain"))])
        assert r.status_code == 409 and r.json()["documents"][0]["status"] == "present"
        assert c.get("/health").json()["documents"] == 8
        uploads = index_dir.parent / "index.uploads"  # one folder per kept upload (beside the writer's .lock)
        assert len([p for p in uploads.iterdir() if p.is_dir()]) == 1  # failed ones deleted


# -- batching --------------------------------------------------------------------------------------

def test_failure_of_one_query_never_fails_its_batch_neighbours(template):
    """The batcher re-runs a failed batch query by query: only the failing query gets the error."""
    pipe = Pipeline(KnowledgeIndex.open(template, ENC), ENC, PipelineConfig(kd=3))
    calls = []

    def run_batch(cfg, queries):
        calls.append(len(queries))
        if any("poison" in q.question for q in queries):
            raise ValueError("poisoned question")
        return pipe.retrieve_batch(queries)

    async def main():
        b = DynamicBatcher(run_batch, max_batch=8, max_wait_s=0.05, queue_size=8)
        await b.start()
        qs = [Query(QUESTIONS[0]), Query("poison " + QUESTIONS[1]), Query(QUESTIONS[2])]
        futs = b.enqueue([(q, pipe.config) for q in qs])
        out = await asyncio.gather(*futs, return_exceptions=True)
        with pytest.raises(QueueFull):
            b.enqueue([(qs[0], pipe.config)] * 9)
        await b.close()
        with pytest.raises(ShuttingDown):
            b.enqueue([(qs[0], pipe.config)])
        return out

    out = asyncio.run(main())
    assert calls == [3, 1, 1, 1]  # one batch, then each alone
    assert isinstance(out[1], ValueError) and "poisoned" in str(out[1])
    for i in (0, 2):
        assert out[i].batch_size == 3
        want = pipe.retrieve(Query(QUESTIONS[i])).as_dict()
        got = out[i].result.as_dict()
        assert comparable(json.loads(json_bytes(got))) == comparable(json.loads(json_bytes(want)))


def test_concurrent_clients_form_batches_over_real_http(template):
    app = create_app(KnowledgeIndex.open(template, ENC), ENC, service=ServiceConfig(max_batch=16, max_wait_ms=40))
    questions = [f"{QUESTIONS[i % len(QUESTIONS)]} ({i})" for i in range(24)]
    configs = [{"kd": 3} if i % 3 == 0 else {} for i in range(24)]
    with serving(app) as (url, _, _), httpx.Client(base_url=url, timeout=60) as client:
        def ask(i):
            return client.post("/query", json={"question": questions[i], "config": configs[i]})
        with ThreadPoolExecutor(24) as pool:
            responses = list(pool.map(ask, range(24)))
        metrics = client.get("/metrics").text
    assert [r.status_code for r in responses] == [200] * 24
    sizes = [r.json()["batch"]["size"] for r in responses]
    assert max(sizes) > 1, sizes
    assert app.state.batcher.largest_batch > 1 and app.state.batcher.batches_run < 24
    assert re.search(r'^colgraph_requests_total\{route="/query",method="POST",status="200"\} 24$', metrics, re.M)
    for i, r in enumerate(responses):  # batched over HTTP == one at a time in-process
        assert comparable(r.json()) == in_process(template, Query(questions[i]), **configs[i]), i


def test_shutdown_answers_every_request_in_flight(template):
    app = create_app(KnowledgeIndex.open(template, ENC), ENC, service=ServiceConfig(max_batch=64, max_wait_ms=3000))
    n = 12
    with serving(app) as (url, server, thread):
        with httpx.Client(base_url=url, timeout=60) as client, ThreadPoolExecutor(n) as pool:
            futures = [pool.submit(client.post, "/query", json={"question": QUESTIONS[i % 6]}) for i in range(n)]
            deadline = time.monotonic() + 20
            while app.state.batcher.depth < n:  # all queued (the batch window is 3 s)
                assert time.monotonic() < deadline, app.state.batcher.depth
                time.sleep(0.005)
            server.should_exit = True  # as SIGTERM does: stop accepting, finish what is in flight
            responses = [f.result() for f in futures]
        thread.join(30)
        assert not thread.is_alive()
    assert [r.status_code for r in responses] == [200] * n
    assert {r.json()["batch"]["size"] for r in responses} == {n}
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health", timeout=2)


# -- writes ----------------------------------------------------------------------------------------

def test_documents_added_and_removed_over_http_are_seen_by_the_next_query(index_dir):
    app = create_app(KnowledgeIndex.open(index_dir, ENC), ENC)
    question = {"question": "Who built the Zorvandel observatory on Kalimtor?", "config": {"kd": 1}}
    with serving(app) as (url, _, _), httpx.Client(base_url=url, timeout=60) as c:
        g0 = c.get("/health").json()["generation"]
        assert c.post("/query", json=question).json()["documents"][0]["doc_id"] != "zorvandel.txt"
        r = c.post("/documents", files=[("files", ("zorvandel.txt", OBSERVATORY_NOTE, "text/plain"))])
        assert r.status_code == 200, r.text
        assert r.json()["added"] == 1 and r.json()["total_documents"] == 8 and r.json()["generation"] == g0 + 1
        body = c.post("/query", json=question).json()
        assert body["documents"][0]["doc_id"] == "zorvandel.txt"
        assert any("Zorvandel" in e for e in body["seed_entities"])
        r = c.delete("/documents/zorvandel.txt")
        assert r.status_code == 200 and r.json() == {"removed": "zorvandel.txt", "generation": g0 + 2,
                                                       "total_documents": 7}
        assert c.post("/query", json=question).json()["documents"][0]["doc_id"] != "zorvandel.txt"
        assert c.delete("/documents/zorvandel.txt").status_code == 404
    reopened = KnowledgeIndex.open(index_dir, ENC)  # what the service committed is on disk
    assert len(reopened) == 7 and "zorvandel.txt" not in reopened


def test_queries_are_answered_while_a_write_is_in_progress(index_dir):
    """The writer is held inside ingest (its extractor waits on an event): queries keep being
    answered from the previous generation, then see the write once it returns; concurrent
    uploads lose no document."""
    entered, release = threading.Event(), threading.Event()

    def slow_extractor(text: str) -> str:
        entered.set()
        release.wait(30)
        return ""  # a well-formed empty answer: no records

    app = create_app(KnowledgeIndex.open(index_dir, ENC), ENC, ingest_options={"extractor": slow_extractor})
    with serving(app) as (url, _, _), httpx.Client(base_url=url, timeout=60) as c, ThreadPoolExecutor(4) as pool:
        uploads = [pool.submit(c.post, "/documents", files=[("files", (f"d{i}.txt", b"note %d" % i, "text/plain"))])
                   for i in range(3)]
        assert entered.wait(30)
        answered = [c.post("/query", json={"question": q}) for q in QUESTIONS[:4]]  # while the writer is held
        assert [r.status_code for r in answered] == [200] * 4
        assert c.get("/health").json()["documents"] == 7  # the old generation is served meanwhile
        release.set()
        results = [u.result() for u in uploads]
        assert [r.status_code for r in results] == [200] * 3
        assert c.get("/health").json()["documents"] == 10
    assert sorted(d for d in KnowledgeIndex.open(index_dir, ENC).documents if d.startswith("d")) == \
        ["d0.txt", "d1.txt", "d2.txt"]


# -- the command ------------------------------------------------------------------------------------

def test_colgraph_serve_command_serves_and_exits_cleanly_on_sigterm(index_dir):
    port = free_port()
    env = dict(os.environ, SERVE_TOKEN="t0ken")
    proc = subprocess.Popen([sys.executable, "-m", "colgraph_engine", "serve", str(index_dir), "--port", str(port),
                             "--token-env", "SERVE_TOKEN", "--max-wait-ms", "1", "--log-level", "info"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_serving(proc, url, lambda: proc.communicate()[1].decode()[-2000:])
        r = httpx.post(url + "/query", json={"question": QUESTIONS[0], "config": {"kd": 3}},
                       headers={"authorization": "Bearer t0ken"}, timeout=60)
        assert r.status_code == 200 and comparable(r.json()) == in_process(index_dir, Query(QUESTIONS[0]), kd=3)
        assert httpx.post(url + "/query", json={"question": "q"}, timeout=10).status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    # uvicorn shuts down gracefully (lifespan shutdown = the batcher drained), then re-raises the signal
    assert proc.returncode in (0, -signal.SIGTERM), err.decode()[-2000:]
    assert "Application shutdown complete" in err.decode()


def test_colgraph_serve_refuses_bad_settings(index_dir, capsys):
    from colgraph_engine.cli import main
    assert main(["serve", str(index_dir), "--token-env", "COLGRAPH_TEST_UNSET_VARIABLE"]) == 2
    assert "COLGRAPH_TEST_UNSET_VARIABLE" in capsys.readouterr().err
    assert main(["serve", str(index_dir), "--max-batch", "0"]) == 2
    assert "max_batch" in capsys.readouterr().err
    assert main(["serve", str(index_dir), "--port", "70000"]) == 2


def test_answer_runs_the_service_generator(template):
    prompts = []

    def generator(prompt: str, images: list) -> str:
        prompts.append(prompt)
        return f"answer from {len(prompt)} characters of context"

    app = create_app(KnowledgeIndex.open(template, ENC), ENC, generator=generator)
    with TestClient(app) as c:
        r = c.post("/query", json={"question": QUESTIONS[0], "answer": True})
        assert r.status_code == 200 and r.json()["answer"]["error"] is None
        assert r.json()["answer"]["text"] == f"answer from {len(prompts[0])} characters of context"
        assert prompts[0] == r.json()["context"]
        r = c.post("/query", json={"question": QUESTIONS[0]})
        assert r.json()["answer"] is None and len(prompts) == 1  # context only unless asked


def test_finish_runs_in_the_worker_and_its_failure_stays_with_its_query(template):
    pipe = Pipeline(KnowledgeIndex.open(template, ENC), ENC, PipelineConfig(kd=3))
    threads = set()

    def finish(result):
        threads.add(threading.current_thread().name)
        if "cat" in result.query.question:
            raise RuntimeError("cannot serialise this one")
        return json_bytes(result.as_dict())

    async def main():
        b = DynamicBatcher(lambda cfg, qs: pipe.retrieve_batch(qs), max_batch=4,
                           max_wait_s=0.05, queue_size=8, finish=finish)
        await b.start()
        futs = b.enqueue([(Query(q), pipe.config) for q in QUESTIONS[:3]])
        out = await asyncio.gather(*futs, return_exceptions=True)
        await b.close()
        return out

    out = asyncio.run(main())
    assert isinstance(out[2], RuntimeError) and threads and all(t.startswith("colgraph-batch") for t in threads)
    for i in (0, 1):
        assert out[i].batch_size == 3
        assert comparable(json.loads(out[i].payload)) == comparable(json.loads(json_bytes(
            pipe.retrieve(Query(QUESTIONS[i])).as_dict())))


def test_colgraph_serve_model_options_answer_and_extract_through_an_endpoint(index_dir):
    """--generator-model answers 'answer: true' requests; --llm-model extracts uploads (both on a
    real loopback stand-in of an OpenAI-compatible endpoint)."""
    import argparse

    from colgraph_engine.cli import serve as cli_serve
    from colgraph_engine.ingest import prompts
    from colgraph_engine.pipeline import OpenAIGenerator
    from tests.chat_standin import chat_standin

    d = prompts.DELIMITER
    records = "\n".join([d.join(("entity", "Velmora Harbour", "location", "A harbour town.")),
                         d.join(("entity", "Kestrel Dynamics", "organization", "A shipyard company.")),
                         d.join(("relation", "Velmora Harbour", "Kestrel Dynamics", "shipyard",
                                 "Kestrel Dynamics builds ships in Velmora Harbour.")), prompts.COMPLETE])

    def reply(req):
        if req["messages"][0]["content"] == OpenAIGenerator.SYSTEM:
            return "The answer is 42."
        return records if len(req["messages"]) == 2 else prompts.COMPLETE

    with chat_standin(reply) as (url, server):
        ap = argparse.ArgumentParser()
        cli_serve.add_parser(ap.add_subparsers(dest="command"))
        args = ap.parse_args(["serve", str(index_dir), "--generator-model", "gen", "--generator-url", url,
                              "--llm-url", url, "--llm-model", "extract", "--timeout", "5"])
        with TestClient(cli_serve.build_app(args)) as c:
            r = c.post("/documents", files=[("files", ("harbour.txt", b"Ships are built in the harbour town.",
                                                      "text/plain"))])
            assert r.status_code == 200 and r.json()["documents"][0]["entities"] == 2, r.text
            r = c.post("/query", json={"question": "Which company builds ships in Velmora Harbour?", "answer": True,
                                       "config": {"kd": 1}})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["documents"][0]["doc_id"] == "harbour.txt" and "Kestrel Dynamics" in body["context"]
            assert body["answer"] == {"text": "The answer is 42.", "error": None}
        assert {q["model"] for q in server.requests} == {"gen", "extract"}
    assert (index_dir.parent / "index.llm-cache").is_dir()  # the same reply cache as `colgraph index add`


def test_commits_of_another_process_are_served_and_writes_still_go_through(index_dir):
    from colgraph_engine.kg import DocumentInput

    app = create_app(KnowledgeIndex.open(index_dir, ENC), ENC, service=ServiceConfig(reload_interval_s=0.05))
    with TestClient(app) as c:
        assert c.get("/health").json()["documents"] == 7
        other = KnowledgeIndex.open(index_dir, ENC)  # e.g. `colgraph index add` while the service runs
        other.add_documents([DocumentInput("outside.txt", [OBSERVATORY_NOTE.decode()])])
        deadline = time.monotonic() + 20
        while c.get("/health").json()["documents"] != 8:
            assert time.monotonic() < deadline, "the other process's commit was not picked up"
            time.sleep(0.05)
        r = c.post("/query", json={"question": "Who built the Zorvandel observatory?", "config": {"kd": 1}})
        assert r.json()["documents"][0]["doc_id"] == "outside.txt"
        # the service's writer opened the index before that commit: it reopens and retries
        r = c.post("/documents", files=[("files", ("inside.txt", b"A second note about harbours.", "text/plain"))])
        assert r.status_code == 200 and r.json()["total_documents"] == 9
    on_disk = KnowledgeIndex.open(index_dir, ENC).documents
    assert len(on_disk) == 9 and {"inside.txt", "outside.txt"} <= set(on_disk)


def test_writer_queue_full_is_429(index_dir):
    entered, release = threading.Event(), threading.Event()

    def held_extractor(text: str) -> str:
        entered.set()
        release.wait(30)
        return ""

    app = create_app(KnowledgeIndex.open(index_dir, ENC), ENC, ingest_options={"extractor": held_extractor},
                     service=ServiceConfig(max_pending_writes=1, retry_after_s=2))
    with serving(app) as (url, _, _), httpx.Client(base_url=url, timeout=60) as c, ThreadPoolExecutor(1) as pool:
        first = pool.submit(c.post, "/documents", files=[("files", ("a.txt", b"first note", "text/plain"))])
        assert entered.wait(30)
        r = c.post("/documents", files=[("files", ("b.txt", b"second note", "text/plain"))])
        assert r.status_code == 429 and r.headers["retry-after"] == "2" and "limit 1" in r.json()["detail"]
        r = c.delete("/documents/harbour-cafe")
        assert r.status_code == 429
        release.set()
        assert first.result().status_code == 200
        assert c.delete("/documents/harbour-cafe").status_code == 200
