"""Service reliability (issue 22, items 5, 6, 8 and 10), all over HTTP (starlette's TestClient, or
a real ``colgraph serve`` process on 127.0.0.1):

* the images of one request have a total pixel budget, checked from their headers before any
  pixel is decoded (``max_request_pixels``);
* upload folders go with their documents: removed on delete, on a failed ingest, and swept at
  start when no document refers to them (a ``kill -9`` during an upload), never anything else;
* a full disk (a real, small tmpfs) is a 507 with a JSON detail, the index unchanged;
* ``/info`` shows the index folder's name, never an absolute server path.
"""
from __future__ import annotations

import base64
import fcntl
import gc
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from colgraph_engine.demos.corpus import _photo
from colgraph_engine.kg import KnowledgeIndex
from colgraph_engine.pipeline import Query
from colgraph_engine.service import ServiceConfig, create_app
from tests.test_service import (ENC, OBSERVATORY_NOTE, comparable, free_port, in_process, index_dir,  # noqa: F401 (fixtures)
                                png_bytes, template, wait_until_serving)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def blank_png(w: int, h: int) -> bytes:
    """A blank greyscale PNG: 5000x5000 is 24 KB encoded, 25M pixels (75 MB as RGB) decoded."""
    buf = io.BytesIO()
    Image.new("L", (w, h)).save(buf, "PNG")
    return buf.getvalue()


def read_record(folder: Path) -> dict | None:
    """The documents ``{doc_id: number}`` an upload folder's ``upload.json`` names (None: none)."""
    try:
        return json.loads((folder / "upload.json").read_text())["documents"]
    except FileNotFoundError:
        return None


def upload_folders(index_dir: Path) -> list[Path]:
    uploads = index_dir.parent / f"{index_dir.name}.uploads"
    """The upload folders the writer made there (32 hex digits; real folders, not links)."""
    return sorted(p for p in uploads.iterdir() if re.fullmatch("[0-9a-f]{32}", p.name) and p.is_dir()
                  and not p.is_symlink()) if uploads.is_dir() else []


# -- item 5: a pixel budget per request -----------------------------------------------------------

def test_request_pixel_budget_is_checked_from_the_headers_before_decoding(template):
    assert ServiceConfig().max_request_pixels == 50_000_000
    with pytest.raises(ValueError, match="max_request_pixels"):
        ServiceConfig(max_request_pixels=0)
    # the request: 8 blank 5000x5000 PNGs, each at the per-image cap. Cut after the header
    # (PIL can read the size, not the pixels): the refusal can only come from the headers
    header = blank_png(5000, 5000)[:120]
    with pytest.raises(OSError):
        Image.open(io.BytesIO(header)).load()
    with TestClient(create_app(KnowledgeIndex.open(template, ENC), ENC)) as c:
        assert c.get("/info").json()["service"]["max_request_pixels"] == 50_000_000
        r = c.post("/query/batch", json={"queries": [{"question": "q", "image_base64": b64(header)}] * 8})
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert detail.startswith("queries[2].image_base64: ") and "max_request_pixels" in detail, detail
        assert "at most 50000000" in detail and "75000000" in detail
        # two of them are exactly the budget: not refused for it (decoding the first one fails)
        r = c.post("/query/batch", json={"queries": [{"question": "q", "image_base64": b64(header)}] * 2})
        assert r.status_code == 422 and r.json()["detail"].startswith("queries[0].image_base64: cannot read")


def test_request_pixel_budget_on_real_images_and_results_unchanged_under_it(template):
    cat = _photo("chelsea")[30:130, 60:160]  # 100x100
    small = png_bytes(np.ascontiguousarray(cat))
    big = png_bytes(np.zeros((160, 160, 3), np.uint8))  # 25,600 pixels
    app = create_app(KnowledgeIndex.open(template, ENC), ENC,
                     service=ServiceConfig(max_image_pixels=30_000, max_request_pixels=25_000))
    with TestClient(app) as c:
        q = {"question": "Where does this animal live?", "caption": "a tabby cat", "image_base64": b64(small),
             "config": {"kd": 2}}
        r = c.post("/query/batch", json={"queries": [q, q]})  # 20,000 pixels in all
        assert r.status_code == 200, r.text
        want = in_process(template, Query(q["question"], image=np.asarray(Image.open(io.BytesIO(small))),
                                          caption=q["caption"]), kd=2)
        assert [comparable(i["result"]) for i in r.json()["results"]] == [want, want]  # decoded as before
        r = c.post("/query/batch", json={"queries": [q, {"question": "no image"}, q, q]})  # 30,000
        assert r.status_code == 422
        assert r.json()["detail"].startswith("queries[3].image_base64: the request's images hold 30000 pixels")
        r = c.post("/query", json={"question": "q", "image_base64": b64(big)})
        assert r.status_code == 422 and "(max_request_pixels)" in r.json()["detail"]
        r = c.post("/query/form", data={"question": "q"}, files={"image": ("big.png", big, "image/png")})
        assert r.status_code == 422 and r.json()["detail"].startswith("image: ") \
            and "at most 25000 in all (max_request_pixels)" in r.json()["detail"]
        assert c.post("/query", json=q).status_code == 200


# -- item 10: /info names no absolute server path -----------------------------------------------

@pytest.mark.parametrize("token", [None, "s3cret"])
def test_info_shows_the_index_folder_name_not_its_path(template, token):
    app = create_app(KnowledgeIndex.open(template, ENC), ENC, service=ServiceConfig(token=token))
    with TestClient(app) as c:
        r = c.get("/info", headers={"authorization": f"Bearer {token}"} if token else {})
        assert r.status_code == 200
        index = r.json()["index"]
        assert index["name"] == template.name and "path" not in index
        assert str(template.parent) not in r.text and "/tmp" not in r.text  # no server path anywhere
        if token:
            assert c.get("/info").status_code == 401


# -- item 6: upload folders go with their documents ---------------------------------------------

def test_upload_folders_are_removed_with_their_documents(index_dir):
    app = create_app(KnowledgeIndex.open(index_dir, ENC), ENC)
    with TestClient(app) as c:
        r = c.post("/documents", files=[("files", ("a.txt", OBSERVATORY_NOTE, "text/plain"))])
        assert r.status_code == 200
        [fa] = upload_folders(index_dir)
        number_a = KnowledgeIndex.open(index_dir, ENC).doc_number("a.txt")
        assert read_record(fa) == {"a.txt": number_a} and (fa / "files" / "a.txt").read_bytes() == OBSERVATORY_NOTE
        r = c.post("/documents", files=[("files", ("b.txt", b"A note on harbours.", "text/plain")),
                                        ("files", ("c.txt", b"A note on ferries.", "text/plain"))])
        assert r.status_code == 200 and r.json()["added"] == 2
        fbc = next(f for f in upload_folders(index_dir) if f != fa)
        assert set(read_record(fbc)) == {"b.txt", "c.txt"}
        # refused uploads leave no folder: nothing added (a broken file), or already present
        assert c.post("/documents", files=[("files", ("x.pdf", b"%PDF-1.7 broken", "application/pdf"))]) \
            .status_code == 422
        assert c.post("/documents", files=[("files", ("a.txt", OBSERVATORY_NOTE, "text/plain"))]).status_code == 409
        assert upload_folders(index_dir) == sorted([fa, fbc])

        assert c.delete("/documents/a.txt").status_code == 200
        assert upload_folders(index_dir) == [fbc]
        assert c.delete("/documents/b.txt").status_code == 200  # c.txt still needs the folder
        assert upload_folders(index_dir) == [fbc] and set(read_record(fbc)) == {"c.txt"}
        assert c.delete("/documents/c.txt").status_code == 200
        assert upload_folders(index_dir) == []
        assert c.delete("/documents/harbour-cafe").status_code == 200  # not uploaded: no folder, no error

        for i in range(6):  # the churn: upload, delete, again
            assert c.post("/documents", files=[("files", ("churn.txt", b"churn %d" % i, "text/plain"))]) \
                .status_code == 200
            assert len(upload_folders(index_dir)) == 1
            assert c.delete("/documents/churn.txt").status_code == 200
        assert upload_folders(index_dir) == []
        r = c.post("/documents", files=[("files", ("a.txt", OBSERVATORY_NOTE, "text/plain"))])
        assert r.status_code == 200 and read_record(upload_folders(index_dir)[0])["a.txt"] > number_a  # not reused
        assert c.get("/health").json()["documents"] == 7


def test_a_kill_9_during_an_upload_leaves_a_folder_that_the_next_start_sweeps(index_dir, tmp_path):
    """A real ``colgraph serve`` is killed (SIGKILL) while an upload waits on its extraction model
    (a loopback stand-in); the next start removes that folder and the writer's other orphans, and
    keeps what a document refers to and everything it did not make."""
    from colgraph_engine.ingest import prompts
    from tests.chat_standin import chat_standin

    entered, release = threading.Event(), threading.Event()

    def reply(req):
        text = req["messages"][-1]["content"]
        if "Kalimtor" in str(text):  # the upload to be killed: hold it until the kill
            entered.set()
            release.wait(60)
        return prompts.COMPLETE

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with chat_standin(reply) as (llm, _):
        proc = subprocess.Popen([sys.executable, "-m", "colgraph_engine", "serve", str(index_dir), "--port", str(port),
                                 "--llm-url", llm, "--llm-model", "extract", "--timeout", "60", "--max-wait-ms", "1"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_until_serving(proc, url, lambda: proc.communicate()[1].decode()[-2000:])
            r = httpx.post(url + "/documents", files=[("files", ("kept.txt", b"Ships are built in the harbour town.",
                                                                 "text/plain"))], timeout=60)
            assert r.status_code == 200, r.text
            [kept] = upload_folders(index_dir)
            killed = threading.Thread(target=lambda: _post_quietly(url, "slow.txt", OBSERVATORY_NOTE), daemon=True)
            killed.start()
            assert entered.wait(60), "the upload did not reach its extraction"
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        finally:
            release.set()
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
            proc.stderr.close()
    [left] = [f for f in upload_folders(index_dir) if f != kept]  # what the kill left behind
    assert [p.name for p in left.rglob("*.txt")] == ["slow.txt"] and read_record(left) is None

    uploads = index_dir.parent / "index.uploads"
    legacy_orphan = uploads / uuid.uuid4().hex  # the layout before records: files in the folder itself
    legacy_orphan.mkdir()
    (legacy_orphan / "gone.txt").write_text("a document deleted long ago")
    legacy_live = uploads / uuid.uuid4().hex  # its file name is a document of the index: kept
    legacy_live.mkdir()
    (legacy_live / "harbour-cafe").write_text("the cafe")
    foreign = uploads / "not-ours"
    foreign.mkdir()
    (foreign / "x.txt").write_text("x")
    (uploads / "README").write_text("someone's note")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("never deleted")
    link = uploads / uuid.uuid4().hex
    link.symlink_to(outside, target_is_directory=True)
    hex_file = uploads / uuid.uuid4().hex
    hex_file.write_text("a file, not a folder")

    app = create_app(KnowledgeIndex.open(index_dir, ENC), ENC)
    with TestClient(app) as c:  # the writer sweeps at start
        assert sorted(upload_folders(index_dir)) == sorted([kept, legacy_live])
        assert (foreign / "x.txt").is_file() and (uploads / "README").is_file() and hex_file.is_file()
        assert link.is_symlink() and (outside / "precious.txt").read_text() == "never deleted"
        assert c.get("/health").json()["documents"] == 8
        assert c.delete("/documents/kept.txt").status_code == 200
        assert upload_folders(index_dir) == [legacy_live]


def _post_quietly(url: str, name: str, content: bytes) -> None:
    try:
        httpx.post(url + "/documents", files=[("files", (name, content, "text/plain"))], timeout=60)
    except httpx.TransportError:  # the server was killed under it
        pass


def test_the_sweep_waits_for_uploads_in_progress_elsewhere(index_dir):
    """An upload in progress in another service over the same index holds the uploads lock
    (shared): the sweep at start skips everything then, and runs at the next start."""
    uploads = index_dir.parent / "index.uploads"
    orphan = uploads / uuid.uuid4().hex / "files"
    orphan.mkdir(parents=True)
    (orphan / "in-progress.txt").write_text("being uploaded by another service")
    fd = os.open(uploads / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        with TestClient(create_app(KnowledgeIndex.open(index_dir, ENC), ENC)) as c:
            assert c.get("/health").status_code == 200 and upload_folders(index_dir) == [orphan.parent]
    finally:
        os.close(fd)
    with TestClient(create_app(KnowledgeIndex.open(index_dir, ENC), ENC)) as c:
        assert c.get("/health").status_code == 200 and upload_folders(index_dir) == []


# -- item 8: disk full ---------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A real 2 MiB tmpfs (needs root: skipped otherwise); unmounted afterwards."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs for a real full disk (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        gc.collect()  # the index's mapped files keep the mount busy until their objects are gone
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], check=True)


def fill(disk: Path, leave: int) -> Path:
    """Fills `disk` up to `leave` bytes free (a filler file, written until ENOSPC, then cut)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        while True:
            os.write(fd, b"\1" * 65536)
    except OSError as exc:
        assert exc.errno == 28  # ENOSPC
    finally:
        os.close(fd)
    size = filler.stat().st_size
    os.truncate(filler, max(0, size - leave))
    return filler


def test_a_full_disk_is_507_with_a_json_detail_and_the_index_unchanged(template, small_disk):
    path = small_disk / "index"
    shutil.copytree(template, path)
    generation = json.loads((path / "manifest.json").read_text())["generation"]
    app = create_app(KnowledgeIndex.open(path, ENC), ENC)
    with TestClient(app, raise_server_exceptions=False) as c:
        # the upload's own files do not fit
        r = c.post("/documents", files=[("files", ("big.txt", b"word " * ((3 << 20) // 5), "text/plain"))])
        assert r.status_code == 507 and r.headers["content-type"] == "application/json", r.text
        detail = r.json()["detail"]
        assert detail.startswith("the disk is full: no space left writing the upload file 'index.uploads/"), detail
        assert re.search(r"big\.txt' \(1\.[0-9] MiB free, the upload needs 3\.0 MiB\)", detail), detail
        assert detail.endswith("the index is unchanged") and str(small_disk) not in detail
        assert upload_folders(path) == []

        # the upload fits, the index's commit does not
        filler = fill(small_disk, 16 << 10)
        r = c.post("/documents", files=[("files", ("note.txt", OBSERVATORY_NOTE, "text/plain"))])
        assert r.status_code == 507, r.text
        assert r.json()["detail"].startswith("the disk is full: no space left committing to the index 'index' (")
        assert upload_folders(path) == []
        fill(small_disk, 0)
        r = c.delete("/documents/harbour-cafe")  # a removal rewrites the part's other documents
        assert r.status_code == 507 and "committing to the index 'index'" in r.json()["detail"], r.text
        assert c.get("/health").json() == {"status": "ok", "generation": generation, "documents": 7}
        on_disk = KnowledgeIndex.open(path, ENC)
        assert len(on_disk) == 7 and "harbour-cafe" in on_disk and "note.txt" not in on_disk
        assert json.loads((path / "manifest.json").read_text())["generation"] == generation
        del on_disk
        metrics = c.get("/metrics").text
        assert re.search(r'^colgraph_writes_total\{operation="add",outcome="disk_full"\} 2$', metrics, re.M)
        assert re.search(r'^colgraph_requests_total\{route="/documents",method="POST",status="507"\} 2$',
                         metrics, re.M)

        filler.unlink()  # space again: the same service writes
        r = c.post("/documents", files=[("files", ("note.txt", OBSERVATORY_NOTE, "text/plain"))])
        assert r.status_code == 200 and r.json()["total_documents"] == 8, r.text
        assert c.delete("/documents/harbour-cafe").status_code == 200
        assert c.get("/health").json()["documents"] == 7
    del app, c
