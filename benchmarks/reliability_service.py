"""Reliability reproducer for ``colgraph serve`` (issue 22, items 5 and 6); prints JSON.

Runs a real ``colgraph serve`` process over a fresh copy of the demo index (offline encoders)
and measures:

* ``pixels``: the server's RSS growth for one ``POST /query/batch`` of 8 blank 5000x5000 PNGs
  (24 KB each, at the 25M-pixel per-image cap), and of 2 (50M pixels: the default
  ``max_request_pixels``), each on a server of its own: peak (VmHWM, reset through
  ``/proc/PID/clear_refs`` before the request) and retained (VmRSS after) minus VmRSS before;
* ``uploads``: upload folders under ``INDEX.uploads/`` after a churn (``--uploads`` documents
  uploaded one by one, all but ``--keep`` deleted, plus uploads that add nothing), after a
  ``kill -9`` during an upload (held on its extraction by a loopback stand-in of the model
  endpoint), and after the next start of the service.

Usage: ``python benchmarks/reliability_service.py [--uploads 24] [--keep 6] [--json PATH]``. To
measure another checkout, run this file with that checkout first on ``PYTHONPATH`` (and
``SKBUILD_EDITABLE_SKIP`` set to the editable build folder so the editable install does not win).
"""
from __future__ import annotations

import argparse
import base64
import io
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
from PIL import Image

MARKER = "Zorvandel"  # the upload whose extraction is held until the kill


def _status(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    return out


class _Standin(ThreadingHTTPServer):
    """An OpenAI-compatible chat endpoint that answers "no records" at once, except for the
    marked upload, which it holds until ``release`` is set."""
    daemon_threads = True
    block_on_close = False

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.entered, self.release = threading.Event(), threading.Event()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if MARKER in json.dumps(req):
            self.server.entered.set()
            self.server.release.wait(120)
        from colgraph_engine.ingest import prompts
        body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": req.get("model", ""),
                           "choices": [{"index": 0, "message": {"role": "assistant", "content": prompts.COMPLETE},
                                        "finish_reason": "stop"}]}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass


def _serve(index: pathlib.Path, llm: str) -> tuple[subprocess.Popen, str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    proc = subprocess.Popen([sys.executable, "-m", "colgraph_engine", "serve", str(index), "--port", str(port),
                             "--max-wait-ms", "1", "--llm-url", llm, "--llm-model", "extract", "--timeout", "120"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError("colgraph serve exited at start")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("colgraph serve did not come up")
        time.sleep(0.1)


def _folders(index: pathlib.Path) -> int:
    uploads = index.with_name(index.name + ".uploads")
    return sum(1 for p in uploads.iterdir() if p.is_dir() and re.fullmatch("[0-9a-f]{32}", p.name)) \
        if uploads.is_dir() else 0


def pixels(url: str, pid: int, images: int) -> dict:
    buf = io.BytesIO()
    Image.new("L", (5000, 5000)).save(buf, "PNG")
    png = buf.getvalue()
    body = json.dumps({"queries": [{"question": "what is in the picture?",
                                    "image_base64": base64.b64encode(png).decode()}] * images}).encode()
    before = _status(pid)["VmRSS"]
    with open(f"/proc/{pid}/clear_refs", "w") as f:  # resets VmHWM to the current RSS
        f.write("5")
    t0 = time.perf_counter()
    r = httpx.post(url + "/query/batch", content=body, headers={"content-type": "application/json"}, timeout=600)
    seconds = time.perf_counter() - t0
    after = _status(pid)
    detail = r.json().get("detail") if r.status_code != 200 else None
    return {"images": images, "png_bytes": len(png), "request_bytes": len(body), "status": r.status_code,
            "detail": detail, "seconds": round(seconds, 3),
            "peak_rss_growth_mb": round((after["VmHWM"] - before) / 1e6, 1),
            "retained_rss_growth_mb": round((after["VmRSS"] - before) / 1e6, 1)}


def uploads(index: pathlib.Path, url: str, proc: subprocess.Popen, standin: _Standin, n: int, keep: int) -> dict:
    out = {"uploaded": n, "kept": keep}
    for i in range(n):
        r = httpx.post(url + "/documents", files=[("files", (f"note-{i}.txt", f"Note {i} about harbour {i}.".encode(),
                                                             "text/plain"))], timeout=120)
        assert r.status_code == 200, r.text
    for i in range(n - keep):
        assert httpx.delete(url + f"/documents/note-{i}.txt", timeout=120).status_code == 200
    for i in range(3):  # uploads that add nothing: a file no reader can read
        broken = [("files", (f"broken-{i}.pdf", b"%PDF-1.7 broken", "application/pdf"))]
        r = httpx.post(url + "/documents", files=broken, timeout=120)
        assert r.status_code == 422, r.text
    out["documents"] = httpx.get(url + "/health").json()["documents"]
    out["folders_after_churn"] = _folders(index)

    def slow():
        try:
            httpx.post(url + "/documents", files=[("files", ("slow.txt", f"The {MARKER} observatory.".encode(),
                                                             "text/plain"))], timeout=120)
        except httpx.TransportError:
            pass
    threading.Thread(target=slow, daemon=True).start()
    if not standin.entered.wait(120):
        raise RuntimeError("the held upload did not reach its extraction")
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    standin.release.set()
    out["folders_after_kill_9"] = _folders(index)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uploads", type=int, default=24)
    ap.add_argument("--keep", type=int, default=6)
    ap.add_argument("--json", default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    import colgraph_engine
    from colgraph_engine.demos.corpus import demo_documents
    from colgraph_engine.kg import Encoders, KnowledgeIndex
    from colgraph_engine.demos import kg_data as kg_demo

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="reliability_service-"))
    standin = _Standin()
    threading.Thread(target=standin.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    llm = f"http://127.0.0.1:{standin.server_address[1]}/v1"
    try:
        index = tmp / "index"
        KnowledgeIndex.create(index, Encoders.offline()).add_documents(demo_documents() + kg_demo.demo_documents())
        rep = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "package": str(pathlib.Path(colgraph_engine.__file__).parent), "cpus": os.cpu_count()}
        rep["pixels"] = []
        for images in (8, 2):
            proc, url = _serve(index, llm)
            try:
                rep["pixels"].append(pixels(url, proc.pid, images))
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
        proc, url = _serve(index, llm)
        try:
            rep["uploads"] = uploads(index, url, proc, standin, args.uploads, args.keep)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
        proc, url = _serve(index, llm)  # the next start
        try:
            rep["uploads"]["folders_after_restart"] = _folders(index)
            rep["uploads"]["documents_after_restart"] = httpx.get(url + "/health").json()["documents"]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    finally:
        standin.release.set()
        standin.shutdown()
        standin.server_close()
        shutil.rmtree(tmp, ignore_errors=True)
    text = json.dumps(rep, indent=2)
    print(text)
    if args.json:
        pathlib.Path(args.json).write_text(text + "\n")
    return rep


if __name__ == "__main__":
    main()
