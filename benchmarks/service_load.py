"""Load test of ``colgraph serve`` on the loopback interface: throughput and p50/p99 latency vs
concurrency, with and without dynamic batching, against the pipeline called in-process in the
same run.

Usage (from the repository root)::

    .venv/bin/python benchmarks/service_load.py            # about 1-2 minutes on 2 cores
    .venv/bin/python benchmarks/service_load.py --quick    # 200 documents, few requests

Index: ``pipeline_report.py``'s generated corpus (1,000 documents: 5k segments, 10k entities,
offline encoders), opened from its cache folder ``benchmarks/.cache/`` (built and saved there
when missing). Questions: ``pipeline_report.make_questions`` (text only).

Server: this script started again with ``--serve`` in a subprocess (the app of
``colgraph_engine.service.create_app`` on uvicorn, 127.0.0.1, an ephemeral port), once per mode:

* ``unbatched``: ``max_batch=1`` (every request runs alone through the same queue and worker);
* ``batched``: ``max_batch=32``, ``max_wait_ms=0`` (the service's defaults: a batch is what
  queued up while the previous one ran; nothing waits on purpose);
* ``batched, 5 ms window``: ``max_batch=32``, ``max_wait_ms=5`` (the oldest queued query waits up
  to 5 ms for company; the default before 2026-11-30).

Clients: ``c`` closed-loop clients (asyncio, one kept-alive connection each: ``--client raw``, the
default, writes the request bytes itself and reads the answer by its length,
``benchmarks/_http_client.py``; ``--client httpx`` uses httpx, which spent about 3 ms of CPU per
request on these 2 shared cores; the other client is also measured at the top concurrency and for
the HTTP overhead, same servers, same run) in this process send
a fixed number of requests per cell (``max(64, 6c)``, after ``c`` warm-up requests); latency is
the client's wall time per request; throughput = requests / cell wall time. Every request must
be answered 200 (the queue, 1,024, is above every concurrency), and the answers of a sample are
checked against the in-process pipeline (recalled documents and ranked image nodes equal).

In-process rows (same index, same questions, same thread settings): ``retrieve`` one at a time
(p50/p99, QPS), and ``retrieve_batch`` of c questions (latency = the batch's wall time; QPS = c /
that). Both include query encoding, as the server's do. The machine is shared, so the run is
interleaved: all three servers start first (idle ones cost nothing), then per concurrency the
in-process row and the three modes are measured back to back.

Ingest under load: one more batched server over a copy of the index (``shutil.copytree``: the
cached index is never written) answers the top concurrency's closed-loop clients while another
client uploads ``--uploads`` text documents one at a time; the run counts failed queries, uploads
not answered 200, and lost documents (``/health``'s count before and after, and every uploaded
name in the index reopened from disk).

Ratios reported: batched / unbatched throughput at each concurrency (target >= 3x at 32), p99
at 32 clients batched / in-process single-request p50 (target <= 2x), and HTTP overhead = p50 of
one client unbatched minus p50 of in-process ``retrieve`` (target <= 2 ms).

Threads: torch's intra-op pool is 1 in both processes; native kernels and graph calls use
``COLGRAPH_NUM_THREADS`` (default: every usable core). Writes ``results/service_load.md``,
``.json`` and ``.png``.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import pathlib
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _harness as h  # noqa: E402

os.environ.setdefault("COLGRAPH_NUM_THREADS", str(h.usable_cores()))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

try:
    from orjson import dumps, loads
except ImportError:
    from json import loads

    def dumps(obj) -> bytes:
        return json.dumps(obj).encode()

MODES = {"unbatched": (1, 0.0), "batched": (32, 0.0), "batched, 5 ms window": (32, 5.0)}  # max_batch, max_wait_ms


def requests_for(c: int) -> int:
    return max(64, 6 * c)


# ------------------------------------------------------------------------------------------
# the server side (this file run with --serve)
# ------------------------------------------------------------------------------------------

def serve(args) -> int:
    import uvicorn

    from colgraph_engine.kg import Encoders, KnowledgeIndex
    from colgraph_engine.service import ServiceConfig, create_app

    torch.set_num_threads(args.torch_threads)
    enc = Encoders.offline(text_dim=128)
    app = create_app(KnowledgeIndex.open(args.index, enc, verify=False), enc,
                     service=ServiceConfig(max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, queue_size=1024))
    app.state.colgraph.snapshot.warm()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
    return 0


class Server:
    """This script with --serve in a subprocess, on an ephemeral port; waits until /health answers."""

    def __init__(self, index: pathlib.Path, max_batch: int, max_wait_ms: float, torch_threads: int):
        import httpx
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", "--index", str(index), "--port",
                                      str(self.port), "--max-batch", str(max_batch), "--max-wait-ms", str(max_wait_ms),
                                      "--torch-threads", str(torch_threads)], stderr=subprocess.PIPE)
        deadline = time.monotonic() + 180
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError("the server did not come up in 180 s")
            time.sleep(0.2)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ------------------------------------------------------------------------------------------
# the client side
# ------------------------------------------------------------------------------------------

def summary(latencies: list[float], wall: float, n: int) -> dict:
    lat = sorted(latencies)
    q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else lat * 99
    return {"requests": n, "wall_s": wall, "qps": n / wall, "p50_ms": statistics.median(lat) * 1e3,
            "p99_ms": q[98] * 1e3, "mean_ms": statistics.fmean(lat) * 1e3, "max_ms": lat[-1] * 1e3}


def signature(body: dict) -> tuple:
    """An HTTP answer's recalled documents and ranked image nodes (``pipeline_report.signature``
    of the in-process result must equal it)."""
    return tuple(d["doc_id"] for d in body["documents"]), tuple(im["node"] for im in body["images"])


def host_port(url: str) -> tuple[str, int]:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    return host, int(port)


class _HttpxPoster:
    """httpx behind the raw client's ``post(path, body) -> (status, bytes)``."""

    def __init__(self, client):
        self.client = client

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        r = await self.client.post(path, content=body, headers={"Content-Type": "application/json"})
        return r.status_code, r.content

    async def close(self) -> None:
        """Nothing to close: the AsyncClient is its owner's."""


async def load(url: str, questions: list[str], concurrency: int, n: int, warmup: int, client: str = "raw") -> dict:
    """`concurrency` closed-loop clients send `n` requests (after `warmup`); ``(summary, answers)``
    with answers ``{question number: signature}``. `client`: ``"raw"`` (``_http_client.AsyncConnection``,
    one per client) or ``"httpx"`` (one ``AsyncClient`` with a connection per client)."""
    import httpx

    from _http_client import AsyncConnection

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as hx:
        conns = ([AsyncConnection(*host_port(url)) for _ in range(concurrency)] if client == "raw"
                 else [_HttpxPoster(hx)] * concurrency)

        async def run(count: int):
            todo = iter(range(count))
            lat, statuses, sizes, answers = [], [], [], {}

            async def worker(conn):
                for i in todo:  # shared: each request number is sent once
                    body = dumps({"question": questions[i % len(questions)]})
                    t0 = time.perf_counter()
                    status, content = await conn.post("/query", body)
                    lat.append(time.perf_counter() - t0)
                    statuses.append(status)
                    if status == 200:
                        got = loads(content)  # orjson when installed: the client's parse stays small
                        sizes.append(got["batch"]["size"])
                        answers.setdefault(i % len(questions), signature(got))
            t0 = time.perf_counter()
            await asyncio.gather(*(worker(c) for c in conns))
            return time.perf_counter() - t0, lat, statuses, sizes, answers

        try:
            await run(warmup)
            wall, lat, statuses, sizes, answers = await run(n)
        finally:
            for c in conns:
                await c.close()
    return {**summary(lat, wall, n), "failed": sum(s != 200 for s in statuses), "statuses": sorted(set(statuses)),
            "mean_batch": statistics.fmean(sizes) if sizes else 0.0, "max_batch": max(sizes, default=0)}, answers


def paired_overhead(url: str, pipe, questions: list[str], n: int, client: str = "raw") -> dict:
    """HTTP overhead measured in pairs (``_harness.paired``: the machine's background load hits
    both sides alike): per round, ``pipe.retrieve(q)`` in this process and the same question over
    HTTP (one client, the unbatched server, idle otherwise). Also splits the HTTP latency with the
    server's own figures: queue + run (the ``retrieve_batch`` call) vs the rest (HTTP parsing,
    validation, JSON out, the loopback round trip, the client's parsing). `client`: ``"raw"``
    (``_http_client.Connection``) or ``"httpx"`` (``httpx.Client``)."""
    import httpx

    from _http_client import Connection

    warmup, answers = 4, []
    in_q, http_q = itertools.cycle(questions), itertools.cycle(questions)  # both sides: the same question per round
    with httpx.Client(base_url=url, timeout=300) as hx:
        conn = Connection(*host_port(url)) if client == "raw" else None

        def over_http():
            body = dumps({"question": next(http_q)})
            answers.append(conn.post("/query", body)[1] if conn is not None else
                           hx.post("/query", content=body, headers={"Content-Type": "application/json"}).content)
        try:
            secs = h.paired({"in_process": lambda: pipe.retrieve(next(in_q)), "http": over_http}, n, warmup=warmup)
        finally:
            if conn is not None:
                conn.close()
    inproc, http = secs["in_process"], secs["http"]
    batches = [loads(a)["batch"] for a in answers[warmup:]]
    rest = [t - (b["run_ms"] + b["queue_ms"]) / 1e3 for t, b in zip(http, batches)]
    return {"client": client, "pairs": n, "in_process_p50_ms": statistics.median(inproc) * 1e3,
            "http_p50_ms": statistics.median(http) * 1e3,
            "overhead_p50_ms": (statistics.median(http) - statistics.median(inproc)) * 1e3,
            "median_pair_difference_ms": statistics.median(a - b for a, b in zip(http, inproc)) * 1e3,
            "outside_the_batch_call_p50_ms": statistics.median(rest) * 1e3}


def ingest_under_load(path: pathlib.Path, enc, questions: list[str], concurrency: int, n: int, uploads: int,
                      torch_threads: int, client: str) -> dict:
    """The batched server over a copy of the index (the cached one stays as it is): `concurrency`
    closed-loop query clients send `n` requests while one more client uploads `uploads` text
    documents one after another (``POST /documents``, multipart). Counts the queries that
    failed, the uploads not answered 200, and the documents lost: uploaded names missing from
    ``/health``'s count afterwards or from the index reopened from disk."""
    import httpx

    from colgraph_engine.kg import KnowledgeIndex

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="service_ingest-"))
    copy = tmp / "index"
    names = [f"ingest-{i:03d}.txt" for i in range(uploads)]
    statuses, seconds = [], []
    try:
        shutil.copytree(path, copy)
        server = Server(copy, 32, 0.0, torch_threads)

        async def uploader(hx):
            for i, name in enumerate(names):
                text = f"Ledger {i} of the Osterholt mill is kept in the Varnel archive, shelf {i % 7}."
                t0 = time.perf_counter()
                r = await hx.post("/documents", files=[("files", (name, text.encode(), "text/plain"))])
                seconds.append(time.perf_counter() - t0)
                statuses.append(r.status_code)

        async def main():
            async with httpx.AsyncClient(base_url=server.url, timeout=300) as hx:
                before = (await hx.get("/health")).json()["documents"]
                (cell, _), _ = await asyncio.gather(
                    load(server.url, questions, concurrency, n, warmup=concurrency, client=client), uploader(hx))
                return before, (await hx.get("/health")).json()["documents"], cell
        try:
            before, after, cell = asyncio.run(main())
        finally:
            server.close()
        on_disk = set(KnowledgeIndex.open(copy, enc, verify=False).documents)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"clients": concurrency, "queries": cell, "uploads": uploads,
            "uploads_not_ok": sum(s != 200 for s in statuses), "upload_p50_ms": statistics.median(seconds) * 1e3,
            "documents_before": before, "documents_after": after,
            "lost": uploads - (after - before), "missing_on_disk": sum(nm not in on_disk for nm in names)}


def in_process_single(pipe, questions: list[str], n: int, warmup: int) -> dict:
    """``retrieve`` one at a time over `n` questions: latency summary and each answer's signature."""
    from pipeline_report import signature as result_signature
    for q in questions[:warmup]:
        pipe.retrieve(q)
    lat, sigs = [], {}
    t_all = time.perf_counter()
    for i in tqdm(range(n), desc="in-process retrieve", leave=False):
        t0 = time.perf_counter()
        r = pipe.retrieve(questions[i % len(questions)])
        lat.append(time.perf_counter() - t0)
        sigs[i % len(questions)] = result_signature(r)
    return {**summary(lat, time.perf_counter() - t_all, n), "signatures": sigs}


def in_process_batch(pipe, questions: list[str], c: int) -> dict:
    """``retrieve_batch`` of `c` questions, ``max(2, 64 // c)`` times."""
    n_batches = max(2, 64 // c)
    batches = iter([[questions[(b * c + j) % len(questions)] for j in range(c)] for b in range(n_batches)])
    times = h.time_calls(lambda: pipe.retrieve_batch(next(batches)), n_batches, warmup=0)
    return {"batch": c, "batches": n_batches, "p50_ms": statistics.median(times) * 1e3, "max_ms": max(times) * 1e3,
            "qps": c * n_batches / sum(times)}


# ------------------------------------------------------------------------------------------
# measuring and reading
# ------------------------------------------------------------------------------------------

def measure(args, path: pathlib.Path, pipe, enc, questions: list[str], concurrencies: list[int]) -> dict:
    """Every server runs from the start, and each concurrency measures in-process, then every mode,
    back to back: the machine is shared, so a ratio compares figures taken minutes apart at most."""
    tqdm.write(f"starting {len(MODES)} servers over {path} ...")
    servers, http = {}, {m: {} for m in MODES}
    inp, checked, mismatches = {"single": None, "batch": {}}, 0, 0
    try:
        for mode, (max_batch, wait) in MODES.items():
            servers[mode] = Server(path, max_batch, wait, args.torch_threads)
        for c in concurrencies:
            if c == 1:
                inp["single"] = in_process_single(pipe, questions, 64, warmup=4)
                sigs = inp["single"].pop("signatures")
            else:
                inp["batch"][c] = in_process_batch(pipe, questions, c)
            for mode, server in servers.items():
                tqdm.write(f"{mode}: {c} clients, {requests_for(c)} requests ...")
                cell, answers = asyncio.run(load(server.url, questions, c, requests_for(c), warmup=c,
                                                 client=args.client))
                checked += sum(i in sigs for i in answers)  # answers checked against the in-process ones
                mismatches += sum(sig != sigs[i] for i, sig in answers.items() if i in sigs)
                http[mode][str(c)] = cell
        tqdm.write("unbatched: paired in-process / HTTP requests ...")
        paired = paired_overhead(servers["unbatched"].url, pipe, questions, 64, client=args.client)
        # the other client on the same servers: what the load generator's own cost changes
        other, top_c = "httpx" if args.client == "raw" else "raw", max(concurrencies)
        oc = {"client": other, "paired": paired_overhead(servers["unbatched"].url, pipe, questions, 64, client=other)}
        for mode in ("unbatched", "batched"):
            tqdm.write(f"{mode}, {other} client: {top_c} clients ...")
            oc[mode] = asyncio.run(load(servers[mode].url, questions, top_c, requests_for(top_c), warmup=top_c,
                                        client=other))[0]
    finally:
        for server in servers.values():
            server.close()
    tqdm.write(f"batched, {top_c} clients while documents are uploaded ...")
    ingest = ingest_under_load(path, enc, questions, top_c, requests_for(top_c), args.uploads, args.torch_threads,
                               args.client)
    return {"client": args.client, "other_client": oc, "ingest": ingest,
            "in_process": {"single": inp["single"], "batch": {str(k): v for k, v in inp["batch"].items()}},
            "http": http, "paired_overhead": paired, "checked": checked, "mismatches": mismatches}


def targets(rep: dict, top: str) -> list[dict]:
    """The issue's targets, each ``{target, measured, met}``."""
    http, single, ing = rep["http"], rep["in_process"]["single"], rep["ingest"]
    ratio = http["batched"][top]["qps"] / http["unbatched"][top]["qps"]
    p99_ratio = http["batched"][top]["p99_ms"] / single["p50_ms"]
    overhead = rep["paired_overhead"]["overhead_p50_ms"]
    failed = sum(cell["failed"] for cells in http.values() for cell in cells.values())
    lost = (ing["lost"], ing["missing_on_disk"], ing["uploads_not_ok"], ing["queries"]["failed"])
    return [
        {"target": f"throughput, batched / unbatched at {top} clients >= 3x", "measured": f"{ratio:.2f}x",
         "met": ratio >= 3},
        {"target": f"p99 at {top} clients (batched) <= 2x single-request latency (in-process p50 "
                   f"{single['p50_ms']:.1f} ms)", "measured": f"{p99_ratio:.2f}x", "met": p99_ratio <= 2},
        {"target": "HTTP overhead on p50 (paired: in-process retrieve and the same question over HTTP, in "
                   "alternating order, 1 client, unbatched server) <= 2 ms", "measured": f"{overhead:+.2f} ms",
         "met": overhead <= 2},
        {"target": "0 failed requests below the back-pressure limit", "measured": str(failed), "met": failed == 0},
        {"target": f"0 lost documents across concurrent ingest and queries ({ing['uploads']} uploads while "
                   f"{ing['clients']} clients query)",
         "measured": "{} lost, {} missing on disk, {} uploads and {} queries failed".format(*lost),
         "met": not any(lost)},
    ]


def findings(rep: dict, top: str) -> list[str]:
    """The report's reading, from the figures of this run."""
    http, inp, paired, oc = rep["http"], rep["in_process"], rep["paired_overhead"], rep["other_client"]
    b, u, w = http["batched"], http["unbatched"], http["batched, 5 ms window"]
    ratio = b[top]["qps"] / u[top]["qps"]
    best = max(("batched", "batched, 5 ms window"), key=lambda m: http[m][top]["qps"])
    inproc_top = inp["batch"].get(top, {}).get("qps")
    out = [
        f"At {top} clients the batched server answers {b[top]['qps']:.1f} q/s against {u[top]['qps']:.1f} unbatched "
        f"({ratio:.2f}x); in-process retrieve_batch of {top} gives {inproc_top:.1f} q/s, so HTTP + batching keeps "
        f"{http[best][top]['qps'] / inproc_top:.0%} of the in-process batched rate ({best})."
        if inproc_top else f"Batched / unbatched at {top} clients: {ratio:.2f}x.",
        f"A closed loop of {top} clients queues {top} requests at a time: each waits for the batch in front of it "
        f"and its own, so p99 is bounded below by about two batch times ({2 * inp['batch'][top]['p50_ms']:.0f} "
        f"ms in-process at batch {top}), not by one query's latency; the p99 target (<= 2x a single query, "
        f"{2 * inp['single']['p50_ms']:.0f} ms) would need a batch of {top} to cost no more than one query."
        if top in inp["batch"] else "",
        f"HTTP overhead, {paired['pairs']} pairs: p50 {paired['http_p50_ms']:.2f} ms over HTTP vs "
        f"{paired['in_process_p50_ms']:.2f} ms in-process ({paired['overhead_p50_ms']:+.2f} ms; median pair difference "
        f"{paired['median_pair_difference_ms']:+.2f} ms); outside the retrieve_batch call a request spends "
        f"{paired['outside_the_batch_call_p50_ms']:.2f} ms (p50: HTTP parsing, validation, the hand-off to the worker "
        "thread, JSON out, the loopback round trip and the client's own parsing).",
        f"At one client a 5 ms batch window costs its wait: p50 {w['1']['p50_ms']:.2f} ms (5 ms window) vs "
        f"{b['1']['p50_ms']:.2f} ms (batched, no wait); mean batch at {top} clients: {b[top]['mean_batch']:.1f} (no "
        f"wait) / {w[top]['mean_batch']:.1f} (window); at {top} clients the window gives {w[top]['qps']:.1f} q/s."
        if "1" in b else "",
        f"The load generator shares the 2 cores with the server. With {oc['client']} as the client instead of "
        f"{rep['client']} (same servers, same run): {top} clients unbatched {oc['unbatched']['qps']:.1f} q/s, batched "
        f"{oc['batched']['qps']:.1f} q/s ({oc['batched']['qps'] / oc['unbatched']['qps']:.2f}x, mean batch "
        f"{oc['batched']['mean_batch']:.1f}); HTTP overhead {oc['paired']['overhead_p50_ms']:+.2f} ms (p50 "
        f"{oc['paired']['http_p50_ms']:.2f} vs {oc['paired']['in_process_p50_ms']:.2f} ms in-process)."]
    return [f for f in out if f]


def _f(x: float) -> str:
    return f"{x:,.1f}" if abs(x) >= 10 else f"{x:.2f}"


def to_markdown(rep: dict) -> list[str]:
    """The report's body (``_harness.write`` adds title and environment header)."""
    s, inp, counts, ing = rep["settings"], rep["in_process"], rep["index_counts"], rep.get("ingest")
    calls = [{"call": f"`retrieve`, one at a time ({inp['single']['requests']} questions)", **inp["single"]}]
    calls += [{"call": f"`retrieve_batch` of {c} (latency = batch time)", **b, "p99": f"{_f(b['max_ms'])} (max)"}
              for c, b in sorted(inp["batch"].items(), key=lambda kv: int(kv[0]))]
    cells = [{"mode": mode, "clients": c, **cell, "vs": cell["qps"] / rep["http"]["unbatched"][c]["qps"]}
             for mode, by_c in rep["http"].items() for c, cell in sorted(by_c.items(), key=lambda kv: int(kv[0]))]
    lines = [
        f"Run in {rep['seconds']:.0f} s; torch 1 intra-op thread. Load generator: {rep.get('client', 'httpx')} "
        "HTTP client in this process (see the last reading for the other one).", "",
        f"Index: {s['documents']:,} generated documents ({counts.get('segments', 0):,} segments, "
        f"{counts.get('entities', 0):,} entities, {counts.get('relations', 0):,} relations), "
        "offline encoders; default pipeline config (Kd 10, Kg 10, l 1). Text questions; every latency includes "
        "query encoding. Requests per cell: max(64, 6 x clients), after a warm-up of one request per client; "
        "p99 of 64-192 samples is close to the slowest request.", "",
        "## In-process (same run, interleaved with the HTTP cells of the same concurrency)", "",
        *h.table([("call", "call"), ("p50 ms:", lambda r: _f(r["p50_ms"])),
                  ("p99 ms:", lambda r: r.get("p99") or _f(r["p99_ms"])), ("QPS:", lambda r: _f(r["qps"]))], calls),
        "", "## Over HTTP", "",
        *h.table([("mode", "mode"), ("clients:", "clients"), ("requests:", "requests"), ("failed:", "failed"),
                  ("QPS:", lambda r: _f(r["qps"])), ("p50 ms:", lambda r: _f(r["p50_ms"])),
                  ("p99 ms:", lambda r: _f(r["p99_ms"])), ("mean batch:", lambda r: f"{r['mean_batch']:.1f}"),
                  ("QPS vs unbatched:", lambda r: f"{r['vs']:.2f}x")], cells),
        "", "## Targets", "", *h.table([("target", "target"), ("measured:", "measured"),
                                        ("met^", lambda r: "yes" if r["met"] else "no")], rep["targets"]),
        "", f"Answers checked against the in-process pipeline: {rep['checked']} questions, "
        f"{rep['mismatches']} mismatches (recalled documents and ranked image nodes).", ""]
    if ing:
        q = ing["queries"]
        lines += ["## Ingest under load", "",
                  f"The batched server over a copy of the index: {ing['clients']} query clients sent {q['requests']} "
                  f"requests ({_f(q['qps'])} q/s, p50 {_f(q['p50_ms'])} ms, p99 {_f(q['p99_ms'])} ms, {q['failed']} "
                  f"failed, mean batch {q['mean_batch']:.1f}) while one more client uploaded {ing['uploads']} text "
                  f"documents one after another (p50 {_f(ing['upload_p50_ms'])} ms per upload, {ing['uploads_not_ok']} "
                  f"not answered 200): documents {ing['documents_before']:,} before, {ing['documents_after']:,} after "
                  f"({ing['lost']} lost), {ing['missing_on_disk']} of the uploaded names missing from the index "
                  "reopened from disk.", ""]
    return lines + ["## Reading", ""] + [f"* {x}" for x in rep["findings"]]


def plot(rep: dict, path: pathlib.Path) -> None:
    """Throughput and p50 / p99 against clients, per mode, beside the in-process calls."""
    plt, note = h.matplotlib_or_note()
    if plt is None:
        print(note)
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for mode, cells in rep["http"].items():
        cs = sorted(int(c) for c in cells)
        ax1.plot(cs, [cells[str(c)]["qps"] for c in cs], marker="o", label=f"HTTP, {mode}")
        line = ax2.plot(cs, [cells[str(c)]["p50_ms"] for c in cs], marker="o", label=f"{mode} p50")[0]
        ax2.plot(cs, [cells[str(c)]["p99_ms"] for c in cs], marker="x", ls="--", color=line.get_color(),
                 label=f"{mode} p99")
    inp = rep["in_process"]
    bc = sorted(int(c) for c in inp["batch"])
    ax1.plot([1] + bc, [inp["single"]["qps"]] + [inp["batch"][str(c)]["qps"] for c in bc], marker="s", ls=":",
             color="black", label="in-process retrieve_batch of c")
    ax2.axhline(inp["single"]["p50_ms"], color="black", ls=":", label="in-process retrieve p50")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.grid(alpha=0.3)
    ax1.set(ylabel="queries / s", title="throughput")
    ax2.set(yscale="log", ylabel="latency, ms", title="latency per request")
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=7, ncol=2)
    fig.suptitle(f"colgraph serve, {rep['settings']['documents']:,} documents, loopback, "
                 f"{rep['machine']['cpus_usable']} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _index(n_docs: int, cache: pathlib.Path, torch_threads: int = 1):
    """``pipeline_report``'s corpus of `n_docs` (opened from `cache`, built there when missing):
    ``(encoders, index, how, 256 of its questions)``; torch's intra-op pool set first."""
    import pipeline_report as pr
    from colgraph_engine.kg import Encoders

    torch.set_num_threads(torch_threads)
    enc = Encoders.offline(text_dim=128)
    index, how = pr.load_or_build(n_docs, enc, cache, seed=0, dtype=torch.float32)
    return enc, index, how, pr.make_questions(256, n_docs, seed=0)


def headline(quick: bool = True):
    """HTTP overhead on p50 (headline suite): one unbatched server over ``pipeline_report``'s
    corpus (200 documents quick, 1,000 otherwise, cached in ``benchmarks/.cache``); the answers of
    the first 8 questions over HTTP must equal the in-process ones before the paired timing."""
    import httpx

    from colgraph_engine.pipeline import Pipeline
    from pipeline_report import signature as result_signature

    n_docs = 200 if quick else 1000
    enc, index, how, questions = _index(n_docs, HERE / ".cache")
    questions, pipe = questions[:64], Pipeline(index, enc)
    server = Server(pathlib.Path(how["path"]), 1, 0.0, 1)
    try:
        for q in questions[:8]:
            if signature(httpx.post(server.url + "/query", json={"question": q}, timeout=300).json()) \
                    != result_signature(pipe.retrieve(q)):
                raise h.CorrectnessError(f"HTTP answer differs from the in-process one for {q!r}")
        paired = paired_overhead(server.url, pipe, questions, 32 if quick else 64)
    finally:
        server.close()
    return h.Headline(f"HTTP overhead, p50, {n_docs:,} documents, 1 client, unbatched server",
                      f"HTTP {paired['http_p50_ms']:.2f} ms", f"in-process {paired['in_process_p50_ms']:.2f} ms",
                      paired["in_process_p50_ms"] / paired["http_p50_ms"],
                      f"in-process / HTTP; overhead {paired['overhead_p50_ms']:+.2f} ms (target <= 2 ms)")


def main(argv=None) -> int:
    p = h.parser(__doc__)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--index", type=pathlib.Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--max-batch", type=int, default=32, help=argparse.SUPPRESS)
    p.add_argument("--max-wait-ms", type=float, default=5.0, help=argparse.SUPPRESS)
    p.add_argument("--client", choices=("raw", "httpx"), default="raw",
                   help="the load generator's HTTP client (the other one is measured at the top concurrency too)")
    p.add_argument("--documents", type=int, default=1000)
    p.add_argument("--uploads", type=int, default=24, help="documents uploaded during the ingest-under-load cell")
    p.add_argument("--concurrency", default="1,4,16,32")
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--cache", type=pathlib.Path, default=HERE / ".cache")
    args = p.parse_args(argv)
    if args.serve:
        return serve(args)
    from colgraph_engine.pipeline import Pipeline
    from pipeline_report import machine_info

    if args.quick:  # 200 documents, 1/4 clients (a smoke run)
        args.documents, args.concurrency = 200, "1,4"
    concurrencies = sorted({1} | {int(c) for c in args.concurrency.split(",")})  # 1: the single-query baseline
    t_start = time.perf_counter()
    enc, index, how, questions = _index(args.documents, args.cache, args.torch_threads)
    rep = {"machine": machine_info(), **measure(args, pathlib.Path(how["path"]), Pipeline(index, enc), enc,
                                                questions, concurrencies)}
    rep["settings"] = {"documents": args.documents, "concurrency": concurrencies, "quick": args.quick,
                       "modes": {k: {"max_batch": b, "max_wait_ms": w} for k, (b, w) in MODES.items()},
                       "requests_per_cell": {c: requests_for(c) for c in concurrencies}, "index": how}
    rep["index_counts"] = index.counts
    top = str(max(concurrencies))
    rep["targets"], rep["findings"] = targets(rep, top), findings(rep, top)
    rep["seconds"] = time.perf_counter() - t_start
    stem = h.stem("service_load", args)
    if h.write(stem, "Service load test: colgraph serve on the loopback interface", to_markdown(rep), rep,
               args.out, e=rep["machine"]) is not None:
        plot(rep, args.out / f"{stem}.png")
    failed = sum(cell["failed"] for cells in rep["http"].values() for cell in cells.values())
    return 1 if rep["mismatches"] or failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
