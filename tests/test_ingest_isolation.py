"""Isolated ingest: a file whose processing aborts, segfaults, runs out of memory or hangs fails
alone (its worker dies or is killed and is replaced) and the rest of the folder is indexed; the
per-file limits of ``colgraph index build``; isolated and in-process builds give one index.

The crashes come from user code that ingest runs on every file: the ``extractor`` hook (an LLM
binding that aborts in native code is the real-world case) and the ``count_tokens`` build option
(a tokenizer): ``os.abort()`` and a read of address 0 through ctypes are the real SIGABRT and
SIGSEGV, ``bytearray`` past the worker's ``RLIMIT_AS`` is a real MemoryError. (A MemoryError
inside the extractor would be caught per segment, which falls back to offline extraction; the
tokenizer runs outside that net.) Both are module-level functions so that they pickle.
"""
from __future__ import annotations

import ctypes
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from colgraph_engine.cli import main as colgraph
from colgraph_engine.ingest.folder import ingest
from colgraph_engine.ingest.isolate import FileWorker, Isolation
from colgraph_engine.kg import Encoders, KnowledgeIndex
from colgraph_engine.kg.extract import CooccurrenceExtractor

sys.path.insert(0, str(Path(__file__).parent))
from chat_standin import chat_standin, last_user_text  # noqa: E402

GOOD = "# Good\n\nThe Matterhorn stands above Zermatt in Switzerland.\n"


def misbehaving_extractor(text: str) -> str:
    """Offline extraction, except for segments asking to crash."""
    if "ABORT-HERE" in text:
        os.abort()
    if "SEGFAULT-HERE" in text:
        ctypes.string_at(0)
    if "HANG-HERE" in text:
        time.sleep(3600)
    return CooccurrenceExtractor()(text)


def greedy_tokenizer(text: str) -> int:
    """Words, except for a text asking for memory it cannot have."""
    if "EAT-MEMORY" in text:
        bytearray(8 << 30)  # 8 GiB: past a 1 GiB cap at once
    return len(text.split())


def blank_pdf(path: Path, pages: int) -> None:
    import pypdfium2 as pdfium

    doc = pdfium.PdfDocument.new()
    for _ in range(pages):
        doc.new_page(612, 792)
    doc.save(path)
    doc.close()


def text_pdf(path: Path, pages: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_pdf import PdfPages

    with PdfPages(path) as pdf:
        for i in range(pages):
            fig = plt.figure(figsize=(6, 8))
            fig.text(0.1, 0.9, f"Chapter {i + 1}: Kyoto temples", fontsize=18)
            fig.text(0.1, 0.8, f"Kinkaku-ji is temple number {i + 1} in Kyoto, Japan.", fontsize=10)
            pdf.savefig(fig)
            plt.close(fig)


def test_crashes_memory_errors_and_hangs_fail_their_files_and_the_rest_is_indexed(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a_abort.md").write_text("# A\n\nThis one says ABORT-HERE in Basel.\n")
    (folder / "b_segfault.md").write_text("# B\n\nThis one says SEGFAULT-HERE in Bern.\n")
    (folder / "c_memory.md").write_text("# C\n\nThis one says EAT-MEMORY in Chur.\n")
    (folder / "d_hang.md").write_text("# D\n\nThis one says HANG-HERE in Davos.\n")
    (folder / "good.md").write_text(GOOD)
    index = KnowledgeIndex.create(tmp_path / "ix", Encoders.offline())
    with FileWorker(Isolation(timeout=20, memory_gb=1), index.encoders) as worker:
        report = ingest(index, folder, extractor=misbehaving_extractor, isolate=worker, progress=False,
                        build_options={"count_tokens": greedy_tokenizer})
        # one worker per crash, one after the memory error (not trusted again), one after the kill
        assert worker.starts == 5
    status = {d.doc_id: d.status for d in report.documents}
    assert status == {"a_abort.md": "failed", "b_segfault.md": "failed", "c_memory.md": "failed",
                      "d_hang.md": "failed", "good.md": "added"}
    why = {d.doc_id: " ".join(d.failures) for d in report.documents}
    assert "crashed" in why["a_abort.md"] and "SIGABRT" in why["a_abort.md"]
    assert "crashed" in why["b_segfault.md"] and "SIGSEGV" in why["b_segfault.md"]
    assert why["c_memory.md"].startswith("build: MemoryError") and "cap is 1 GiB" in why["c_memory.md"]
    assert "timed out after 20 s" in why["d_hang.md"]
    assert KnowledgeIndex.open(tmp_path / "ix", Encoders.offline()).documents == ["good.md"]
    table = report.table()
    assert "SIGABRT" in table and "timed out" in table


def assert_same_index(a: KnowledgeIndex, b: KnowledgeIndex) -> None:
    assert a.documents == b.documents and a.counts == b.counts
    for doc_id in a.documents:
        ga, gb = a.document(doc_id), b.document(doc_id)
        for name in ("node_kind", "node_weight", "node_bbox", "node_edge", "node_image", "node_prov",
                     "edge_src", "edge_dst", "edge_kind", "edge_weight", "edge_prov"):
            np.testing.assert_array_equal(getattr(ga, name), getattr(gb, name), err_msg=name)
        for name in ("node_name", "node_type", "node_text", "node_source", "edge_keywords", "edge_text"):
            assert getattr(ga, name) == getattr(gb, name), name
    for s in a.stores:
        sa, sb = a.stores[s], b.stores[s]
        assert torch.equal(sa.ids[sa.alive], sb.ids[sb.alive]), s
        for uid in sa.ids[sa.alive].tolist():
            assert torch.equal(sa.get(uid), sb.get(uid)), (s, uid)


def test_isolated_and_in_process_builds_give_the_same_index(tmp_path):
    from PIL import Image
    from skimage import data

    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "good.md").write_text(GOOD)
    (folder / "moon.txt").write_text("Apollo 11 landed on the Moon in 1969. Neil Armstrong walked there.\n")
    Image.fromarray(data.astronaut()[::4, ::4]).save(folder / "astronaut.png")
    (folder / "astronaut.caption.txt").write_text("Astronaut Eileen Collins in a NASA portrait")
    text_pdf(folder / "kyoto.pdf", 3)
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4 not a PDF body")
    reports = {}
    for name, isolate in (("in_process", False), ("isolated", True)):
        index = KnowledgeIndex.create(tmp_path / name, Encoders.offline())
        reports[name] = ingest(index, folder, isolate=isolate, progress=False, batch_size=2)
    for name in reports:
        assert {d.doc_id: d.status for d in reports[name].documents} == {
            "astronaut.caption.txt": "skipped", "astronaut.png": "added", "broken.pdf": "failed",
            "good.md": "added", "kyoto.pdf": "added", "moon.txt": "added"}
    a, b = (KnowledgeIndex.open(tmp_path / name, Encoders.offline()) for name in reports)
    assert a.counts["image_vectors"] > 0 and a.counts["segment_vectors"] > 0
    assert_same_index(a, b)
    assert [d.failures for d in reports["isolated"].documents] == [d.failures for d in reports["in_process"].documents]


def test_build_limits_file_size_and_pages_and_keeps_the_rest(tmp_path, capsys):
    folder = tmp_path / "docs"
    folder.mkdir()
    text_pdf(folder / "long.pdf", 8)
    (folder / "huge.txt").write_text("Zermatt lies below the Matterhorn. " * 4000)  # ~137 KiB
    (folder / "good.md").write_text(GOOD)
    out = tmp_path / "ix"
    assert colgraph(["index", "build", "--encoders", "hashing", str(folder), "--out", str(out), "--max-file-mb", "0.1",
                     "--max-pages", "3", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    docs = {d["doc_id"]: d for d in rep["documents"]}
    assert docs["huge.txt"]["status"] == "failed"
    assert docs["huge.txt"]["failures"] == [
        f"not read: the file is 0.13 MiB ({(folder / 'huge.txt').stat().st_size:,} bytes), over the limit of "
        "0.1 MiB (max_file_mb / --max-file-mb)"]
    assert docs["long.pdf"]["status"] == "added" and docs["long.pdf"]["pages"] == 3
    assert "read only the first 3 of 8 pages (max_pages); pages 4-8 were not read" in docs["long.pdf"]["notes"]
    assert docs["good.md"]["status"] == "added"
    index = KnowledgeIndex.open(out, Encoders.offline())
    assert sorted(index.documents) == ["good.md", "long.pdf"]
    assert "Chapter 3" in " ".join(index.document("long.pdf").node_text)
    assert "Chapter 4" not in " ".join(index.document("long.pdf").node_text)
    # the pixel budget of page renders reaches the PDF reader (in the worker)
    assert colgraph(["index", "build", "--encoders", "hashing", str(folder), "--out", str(tmp_path / "ix3"), "--max-pages", "1",
                     "--max-page-pixels", "20000", "--json"]) == 0
    docs = {d["doc_id"]: d for d in json.loads(capsys.readouterr().out)["documents"]}
    assert any("pixel budget" in n and "max_page_pixels" in n for n in docs["long.pdf"]["notes"])
    assert colgraph(["index", "build", "--encoders", "hashing", str(folder), "--out", str(tmp_path / "ix4"), "--max-page-pixels", "0"]) == 2
    assert "max_page_pixels" in capsys.readouterr().err
    # the table says it too
    assert colgraph(["index", "build", "--encoders", "hashing", str(folder), "--out", str(tmp_path / "ix2"), "--max-file-mb", "0.1",
                     "--max-pages", "3", "--no-isolate"]) == 0
    text = capsys.readouterr().out
    assert "huge.txt: not read: the file is 0.13 MiB" in text
    assert "long.pdf: read only the first 3 of 8 pages" in text


def test_build_kills_a_worker_stuck_on_a_long_pdf_and_indexes_the_rest(tmp_path, capsys, monkeypatch):
    scratch = tmp_path / "tmp"  # the temporary folder of this process and of the workers it starts
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    folder = tmp_path / "docs"
    folder.mkdir()
    blank_pdf(folder / "big.pdf", 10_000)  # reading all pages takes far longer than 1 s
    (folder / "good.md").write_text(GOOD)
    out = tmp_path / "ix"
    assert colgraph(["index", "build", "--encoders", "hashing", str(folder), "--out", str(out), "--max-pages", "0", "--file-timeout", "1",
                     "--json"]) == 0
    docs = {d["doc_id"]: d for d in json.loads(capsys.readouterr().out)["documents"]}
    assert docs["big.pdf"]["status"] == "failed"
    assert docs["big.pdf"]["failures"][0].startswith("timed out after 1 s (file_timeout / --file-timeout)")
    assert docs["good.md"]["status"] == "added"
    assert KnowledgeIndex.open(out, Encoders.offline()).documents == ["good.md"]
    # the killed worker's page images (spooled to its temporary folder) are gone with it
    assert list(scratch.iterdir()) == []


def test_arguments_are_checked_and_lambdas_need_the_in_process_path(tmp_path, capsys):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "good.md").write_text(GOOD)
    index = KnowledgeIndex.create(tmp_path / "ix", Encoders.offline())
    with pytest.raises(TypeError, match="extractor: cannot be sent to the worker process"):
        ingest(index, folder, extractor=lambda t: "<|COMPLETE|>", isolate=True, progress=False)
    with pytest.raises(TypeError, match="isolate"):
        ingest(index, folder, isolate="yes", progress=False)
    with pytest.raises(ValueError, match="max_file_mb"):
        ingest(index, folder, max_file_mb=0, progress=False)
    with pytest.raises(ValueError, match="max_pages"):
        ingest(index, folder, reader_options={"max_pages": 0}, progress=False)
    with pytest.raises(ValueError, match="timeout"):
        Isolation(timeout=-1)
    with pytest.raises(ValueError, match="memory_gb"):
        Isolation(memory_gb=float("nan"))
    with pytest.raises(TypeError, match="setup"):
        Isolation(setup=lambda: {})
    # the in-process path takes any callable
    report = ingest(index, folder, extractor=lambda t: CooccurrenceExtractor()(t), progress=False)
    assert report.by_status("added")[0].doc_id == "good.md"
    assert colgraph(["index", "build", "--encoders", "hashing", str(folder), "--out", str(tmp_path / "o"), "--no-isolate",
                     "--file-timeout", "5"]) == 2
    assert "--file-timeout: needs the worker process" in capsys.readouterr().err
    assert colgraph(["index", "build", "--encoders", "hashing", str(folder), "--out", str(tmp_path / "o"), "--max-pages", "-1"]) == 2
    assert "--max-pages" in capsys.readouterr().err


def test_build_with_a_model_endpoint_builds_the_hooks_in_the_worker_and_reports_their_calls(tmp_path, capsys):
    def script(request):
        text = last_user_text(request)
        if "Bern" in text:
            return 500, {"error": {"message": "model overloaded"}}, {}
        if len(request["messages"]) > 2:  # gleaning round: nothing new
            return "<|COMPLETE|>"
        return "entity<|#|>Zermatt<|#|>location<|#|>a village below the Matterhorn\n<|COMPLETE|>"

    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "bern.md").write_text("# Bern\n\nBern is the Swiss capital on the Aare.\n")
    (folder / "good.md").write_text(GOOD)
    with chat_standin(script) as (url, server):
        assert colgraph(["index", "build", "--encoders", "hashing", str(folder), "--out", str(tmp_path / "ix"), "--llm-url", url,
                         "--llm-model", "standin", "--timeout", "10", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    docs = {d["doc_id"]: d for d in rep["documents"]}
    assert docs["good.md"]["status"] == "added" and docs["good.md"]["entities"] >= 1
    assert docs["bern.md"]["status"] == "added"  # the failed call fell back to the offline extractor
    assert any("offline extractor used" in f for f in docs["bern.md"]["failures"])
    assert [f["where"] for f in rep["failed_model_calls"]] == ["bern.md segment 0"]
    index = KnowledgeIndex.open(tmp_path / "ix", Encoders.offline())
    assert "Zermatt" in index.document("good.md").node_name
    assert server.requests  # the worker called the endpoint
    # the text report prints the worker's model counters
    with chat_standin(script) as (url, server):
        assert colgraph(["index", "build", "--encoders", "hashing", str(folder), "--out", str(tmp_path / "ix2"), "--llm-url", url,
                         "--llm-model", "standin", "--timeout", "10", "--cache", str(tmp_path / "c2")]) == 0
    out = capsys.readouterr().out
    assert "model standin: " in out and "1 failed" in out


def test_the_cli_default_timeout_is_the_workers():
    from colgraph_engine.cli import ingest_options as cli_ingest_options
    from colgraph_engine.ingest import isolate

    assert cli_ingest_options.DEFAULT_FILE_TIMEOUT == isolate.DEFAULT_FILE_TIMEOUT == Isolation().timeout
