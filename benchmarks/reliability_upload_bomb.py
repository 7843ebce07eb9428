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
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as h  # noqa: E402
from colgraph_engine.demos.corpus import demo_documents  # noqa: E402
from colgraph_engine.kg import Encoders, KnowledgeIndex  # noqa: E402
from tests.test_ingest_bounded import bomb_pdf  # noqa: E402


def tree_hwm_mb(pid: int) -> int:
    """Peak RSS (VmHWM) of `pid` and its live children, whichever is largest, MB."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return max(h.proc_bytes("VmHWM", f"/proc/{p}/status") for p in [pid, *children]) // 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="/tmp/bombsrv")
    root = Path(ap.parse_args().root)
    root.mkdir(parents=True, exist_ok=True)
    bomb = bomb_pdf(root / "bomb.pdf", pages=1)
    idx = root / "idx"
    for flags in ([], ["--no-isolate"]):
        shutil.rmtree(idx, ignore_errors=True)
        shutil.rmtree(f"{idx}.uploads", ignore_errors=True)
        KnowledgeIndex.create(idx, Encoders.offline()).add_documents(demo_documents())
        with h.served(idx, *flags) as (proc, url):
            # warm the worker on a small upload first so the bomb's time is its own
            httpx.post(url + "/documents", files=[("files", ("warm.txt", b"warm up text", "text/plain"))], timeout=120)
            r, seconds = h.timed(httpx.post, url + "/documents", timeout=300,
                                 files=[("files", ("bomb.pdf", Path(bomb).read_bytes(), "application/pdf"))])
            print(json.dumps({"flags": flags, "bytes": os.path.getsize(bomb), "status": r.status_code,
                              "doc": r.json()["documents"][0]["status"], "seconds": round(seconds, 2),
                              "peak_mb": tree_hwm_mb(proc.pid)}))


if __name__ == "__main__":
    main()
