"""Reproducer for issue 22 item 2 through the service: the 14400 x 14400 pt page-size bomb PDF
uploaded to a real `colgraph serve` on loopback (uploads in the worker, the default, and
`--no-isolate`). Prints one JSON line per mode: the upload's status and seconds (after a small
warm-up upload, so the worker's start is not counted) and the peak RSS (VmHWM) of the server and
of its worker, whichever is larger.

    python benchmarks/reliability_upload_bomb.py [--root /tmp/bombsrv]
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from colgraph_engine.demos.corpus import demo_documents  # noqa: E402
from colgraph_engine.kg import Encoders, KnowledgeIndex  # noqa: E402
from tests.test_ingest_bounded import bomb_pdf  # noqa: E402

def tree_hwm(pid):
    """Peak RSS (VmHWM) of pid and its live children, MB."""
    out = 0
    pids = [pid] + [int(p) for p in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    for p in pids:
        try:
            for line in open(f"/proc/{p}/status"):
                if line.startswith("VmHWM"):
                    out = max(out, int(line.split()[1]) // 1024)
        except OSError:
            pass
    return out

ap = argparse.ArgumentParser()
ap.add_argument("--root", default="/tmp/bombsrv")
root = ap.parse_args().root
os.makedirs(root, exist_ok=True)
bomb = bomb_pdf(f"{root}/bomb.pdf", pages=1)
for flags in ([], ["--no-isolate"]):
    idx = f"{root}/idx"
    shutil.rmtree(idx, ignore_errors=True); shutil.rmtree(idx + ".uploads", ignore_errors=True)
    KnowledgeIndex.create(idx, Encoders.offline()).add_documents(demo_documents())
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    proc = subprocess.Popen([sys.executable, "-m", "colgraph_engine", "serve", idx, "--port", str(port), *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200: break
        except httpx.TransportError: time.sleep(0.2)
    # warm the worker on a small upload first so the bomb's time is its own
    httpx.post(url + "/documents", files=[("files", ("warm.txt", b"warm up text", "text/plain"))], timeout=120)
    t = time.perf_counter()
    r = httpx.post(url + "/documents", files=[("files", ("bomb.pdf", open(bomb, "rb").read(), "application/pdf"))], timeout=300)
    dt = time.perf_counter() - t
    d = r.json()["documents"][0]
    print(json.dumps({"flags": flags, "bytes": os.path.getsize(bomb), "status": r.status_code, "doc": d["status"],
                      "seconds": round(dt, 2), "peak_mb": tree_hwm(proc.pid)}))
    proc.terminate(); proc.wait(30)
