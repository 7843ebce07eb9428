"""`colgraph serve` ingests uploads in a supervised worker process: an upload that hangs the
reader fails alone (its worker is killed and replaced) and the server goes on answering and
ingesting."""
from __future__ import annotations

import subprocess
import sys

import httpx

from tests.test_ingest_isolation import blank_pdf
from tests.test_service import free_port, index_dir, template, wait_until_serving  # noqa: F401 (fixtures)


def test_a_hanging_upload_fails_alone_and_the_server_goes_on(index_dir, tmp_path):  # noqa: F811
    big = tmp_path / "big.pdf"
    blank_pdf(big, 10_000)  # reading every page takes far longer than the 1 s allowed
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "colgraph_engine", "serve", str(index_dir), "--port", str(port),
                             "--max-wait-ms", "1", "--max-pages", "0", "--file-timeout", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until_serving(proc, url, lambda: proc.communicate()[1].decode()[-2000:], timeout=90)
        before = httpx.get(url + "/health", timeout=10).json()["documents"]
        r = httpx.post(url + "/documents", files=[("files", ("big.pdf", big.read_bytes(), "application/pdf"))],
                       timeout=180)
        assert r.status_code == 422, r.text
        [doc] = r.json()["documents"]
        assert doc["status"] == "failed" and doc["failures"][0].startswith("timed out after 1 s"), doc
        good = httpx.post(url + "/documents", timeout=180, files=[
            ("files", ("good.txt", b"The lighthouse keeper logs every ship that passes the cape.", "text/plain"))])
        assert good.status_code == 200 and good.json()["added"] == 1, good.text
        assert httpx.get(url + "/health", timeout=10).json()["documents"] == before + 1
        q = httpx.post(url + "/query", json={"question": "Who logs the ships passing the cape?"}, timeout=60)
        assert q.status_code == 200 and q.json()["documents"][0]["doc_id"] == "good.txt", q.text
        assert proc.poll() is None  # the server itself never went down
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        proc.stderr.close()
