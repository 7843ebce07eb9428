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
import signal
import sys
import tempfile
import threading
import time

import httpx
from PIL import Image

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.append(str(pathlib.Path(__file__).resolve().parents[1]))  # tests/; a checkout on PYTHONPATH still wins
import _harness as h  # noqa: E402
from tests.chat_standin import chat_standin  # noqa: E402

MARKER = "Zorvandel"  # the upload whose extraction is held until the kill


class Held:
    """The stand-in model endpoint's replies: "no records" at once, except for the marked upload,
    which it holds until ``release`` is set."""

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, request: dict) -> str:
        from colgraph_engine.ingest import prompts
        if MARKER in json.dumps(request):
            self.entered.set()
            self.release.wait(120)
        return prompts.COMPLETE


def _folders(index: pathlib.Path) -> int:
    """Upload folders (32 hex digits) under ``INDEX.uploads/``."""
    uploads = index.with_name(index.name + ".uploads")
    return sum(1 for p in uploads.iterdir() if p.is_dir() and re.fullmatch("[0-9a-f]{32}", p.name)) \
        if uploads.is_dir() else 0


def _upload(url: str, name: str, data: bytes, mime: str = "text/plain") -> httpx.Response:
    return httpx.post(url + "/documents", files=[("files", (name, data, mime))], timeout=120)


def pixels(url: str, pid: int, images: int) -> dict:
    buf = io.BytesIO()
    Image.new("L", (5000, 5000)).save(buf, "PNG")
    png = buf.getvalue()
    body = json.dumps({"queries": [{"question": "what is in the picture?",
                                    "image_base64": base64.b64encode(png).decode()}] * images}).encode()
    status = f"/proc/{pid}/status"
    before = h.proc_bytes("VmRSS", status)
    h.reset_peak(pid)  # VmHWM = the RSS now
    r, seconds = h.timed(httpx.post, url + "/query/batch", content=body,
                         headers={"content-type": "application/json"}, timeout=600)
    return {"images": images, "png_bytes": len(png), "request_bytes": len(body), "status": r.status_code,
            "detail": r.json().get("detail") if r.status_code != 200 else None, "seconds": round(seconds, 3),
            "peak_rss_growth_mb": round((h.proc_bytes("VmHWM", status) - before) / 1e6, 1),
            "retained_rss_growth_mb": round((h.proc_bytes("VmRSS", status) - before) / 1e6, 1)}


def uploads(index: pathlib.Path, url: str, proc, held: Held, n: int, keep: int) -> dict:
    for i in range(n):
        r = _upload(url, f"note-{i}.txt", f"Note {i} about harbour {i}.".encode())
        assert r.status_code == 200, r.text
    for i in range(n - keep):
        assert httpx.delete(url + f"/documents/note-{i}.txt", timeout=120).status_code == 200
    for i in range(3):  # uploads that add nothing: a file no reader can read
        r = _upload(url, f"broken-{i}.pdf", b"%PDF-1.7 broken", "application/pdf")
        assert r.status_code == 422, r.text
    out = {"uploaded": n, "kept": keep, "documents": httpx.get(url + "/health").json()["documents"],
           "folders_after_churn": _folders(index)}

    def slow():
        try:
            _upload(url, "slow.txt", f"The {MARKER} observatory.".encode())
        except httpx.TransportError:
            pass
    threading.Thread(target=slow, daemon=True).start()
    if not held.entered.wait(120):
        raise RuntimeError("the held upload did not reach its extraction")
    h.stop(proc, signal.SIGKILL, 30)
    held.release.set()
    out["folders_after_kill_9"] = _folders(index)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uploads", type=int, default=24)
    ap.add_argument("--keep", type=int, default=6)
    ap.add_argument("--json", default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    import colgraph_engine
    from colgraph_engine.demos import kg_data as kg_demo
    from colgraph_engine.demos.corpus import demo_documents
    from colgraph_engine.kg import Encoders, KnowledgeIndex

    held = Held()
    rep = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "package": str(pathlib.Path(colgraph_engine.__file__).parent), "cpus": os.cpu_count(), "pixels": []}
    with tempfile.TemporaryDirectory(prefix="reliability_service-", ignore_cleanup_errors=True) as tmp, \
            chat_standin(held) as (llm, _):
        index = pathlib.Path(tmp) / "index"
        KnowledgeIndex.create(index, Encoders.offline()).add_documents(demo_documents() + kg_demo.demo_documents())
        flags = ("--max-wait-ms", "1", "--llm-url", llm, "--llm-model", "extract", "--timeout", "120")
        try:
            for images in (8, 2):  # a server of its own each
                with h.served(index, *flags) as (proc, url):
                    rep["pixels"].append(pixels(url, proc.pid, images))
            with h.served(index, *flags) as (proc, url):
                rep["uploads"] = uploads(index, url, proc, held, args.uploads, args.keep)
            with h.served(index, *flags) as (proc, url):  # the next start
                rep["uploads"]["folders_after_restart"] = _folders(index)
                rep["uploads"]["documents_after_restart"] = httpx.get(url + "/health").json()["documents"]
        finally:
            held.release.set()
    text = json.dumps(rep, indent=2)
    print(text)
    if args.json:
        pathlib.Path(args.json).write_text(text + "\n")
    return rep


if __name__ == "__main__":
    main()
