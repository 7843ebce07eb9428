"""Compact token vectors (a half-precision index: bytes, manifest, damage refused, scores) and
prefilters carried without a user step (the service's writer, `colgraph index add/remove`)."""
import asyncio
import json

import numpy as np
import pytest
import torch

from colgraph_engine.cli import main
from colgraph_engine.kg import Encoders, KnowledgeIndex
from colgraph_engine.kg.document import DocumentInput
from colgraph_engine.pipeline import Pipeline, PipelineConfig

TEXTS = ["The Rhine flows past Basel and Cologne into the North Sea.",
         "Mount Fuji is visible from Tokyo on clear winter days.",
         "The Danube crosses Vienna, Bratislava and Budapest.",
         "Kilimanjaro rises above the plains of Tanzania.",
         "The Nile passes Khartoum and Cairo before the delta."]


@pytest.fixture(scope="module")
def enc():
    return Encoders.offline()


def _docs(n=len(TEXTS), prefix="d"):
    return [DocumentInput(f"{prefix}{i}", [TEXTS[i % len(TEXTS)] + f" Note {i}."]) for i in range(n)]


def _segment_file(path):
    m = json.loads((path / "manifest.json").read_text())
    return path / "vectors" / m["vectors"]["segment"]["file"], m


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_index_halves_the_bytes_and_keeps_the_ranking(tmp_path, enc, dtype):
    full = KnowledgeIndex.create(tmp_path / "f32", enc)
    half = KnowledgeIndex.create(tmp_path / "half", enc, dtype=dtype)
    for ix in (full, half):
        ix.add_documents(_docs())
    f32_file, _ = _segment_file(tmp_path / "f32")
    half_file, m = _segment_file(tmp_path / "half")
    assert m["dtype"] == str(dtype).replace("torch.", "")
    tokens = int(half.stores["segment"].offsets[-1])
    assert f32_file.stat().st_size == tokens * 128 * 4 and half_file.stat().st_size == tokens * 128 * 2
    opened = KnowledgeIndex.open(tmp_path / "half", enc)
    assert opened.dtype == dtype and opened.stores["segment"].values.dtype == dtype
    # the mapped rows are the fp32 vectors rounded once, nothing else
    want = full.stores["segment"].values.to(dtype)
    assert torch.equal(opened.stores["segment"].values.view(torch.int16), want.view(torch.int16))
    cfg = PipelineConfig(recall_ranker="maxsim")
    for q in ("Which river flows past Basel?", "What can be seen from Tokyo?"):
        a = Pipeline(KnowledgeIndex.open(tmp_path / "f32", enc), enc, cfg).retrieve(q).documents
        b = Pipeline(opened, enc, cfg).retrieve(q).documents
        assert a[0][0] == b[0][0]
        assert abs(a[0][1] - b[0][1]) < 0.05


def test_dtype_mismatch_and_damaged_vectors_are_refused(tmp_path, enc):
    ix = KnowledgeIndex.create(tmp_path / "ix", enc, dtype=torch.float16)
    ix.add_documents(_docs())
    seg, m = _segment_file(tmp_path / "ix")
    # a manifest that claims another dtype: the parts (whose header sha256 the manifest lists) disagree
    bad = dict(m, dtype="float32")
    (tmp_path / "ix" / "manifest.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="dtype"):
        KnowledgeIndex.open(tmp_path / "ix", enc)
    (tmp_path / "ix" / "manifest.json").write_text(json.dumps(m))
    # a flipped byte in the half-precision rows: the rows' sha256 in the part header
    data = bytearray(seg.read_bytes())
    data[100] ^= 0x40
    seg.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum|sha256"):
        KnowledgeIndex.open(tmp_path / "ix", enc, verify=True)
    # a truncated file: refused even without the checksum pass
    seg.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(ValueError, match="truncated"):
        KnowledgeIndex.open(tmp_path / "ix", enc, verify=False)


def test_cli_build_defaults_to_float16_and_takes_dtype(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text(TEXTS[0] + "\n")
    (docs / "b.txt").write_text(TEXTS[1] + "\n")
    for args, want in (([], "float16"), (["--dtype", "float32"], "float32"), (["--dtype", "bfloat16"], "bfloat16")):
        out = tmp_path / f"ix-{want}"
        assert main(["index", "build", "--encoders", "hashing", str(docs), "--out", str(out), "--no-isolate", *args]) == 0
        assert json.loads((out / "manifest.json").read_text())["dtype"] == want
    with pytest.raises(SystemExit):
        main(["index", "build", "--encoders", "hashing", str(docs), "--out", str(tmp_path / "x"), "--dtype", "int8"])


def _writer(path, enc):
    from colgraph_engine.service.state import IndexState
    from colgraph_engine.service.writer import IndexWriter
    state = IndexState(KnowledgeIndex.open(path, enc), enc)
    return state, IndexWriter(state)


def test_service_writer_makes_an_index_carry_prefilters_before_its_first_change(tmp_path, enc):
    path = tmp_path / "ix"
    KnowledgeIndex.create(path, enc, prefilters=False).add_documents(_docs(3))
    assert KnowledgeIndex.open(path, enc).prefilter_info() is None  # asked to carry none
    generation = json.loads((path / "manifest.json").read_text())["generation"]
    state, writer = _writer(path, enc)
    try:
        report = asyncio.run(writer.add_files([("new.txt", (TEXTS[3] + "\n").encode())]))
        assert [d.status for d in report.documents] == ["added"]
    finally:
        writer.close()
    # one commit: the added document and the prefilters it starts carrying together
    assert json.loads((path / "manifest.json").read_text())["generation"] == generation + 1
    index = KnowledgeIndex.open(path, enc)
    assert "new.txt" in index
    info = index.prefilter_info()
    assert info is not None and "segment" in info["stores"]
    assert info["min_tokens"] >= 4096 and info["stores"]["segment"]["state"] == "deferred"
    assert state.snapshot.index.prefilter_info() is not None  # the published snapshot carries them too


def test_deferred_commit_builds_a_large_store_s_prefilter_in_the_next_change(tmp_path, enc):
    path = tmp_path / "ix"
    ix = KnowledgeIndex.create(path, enc, prefilters=False)
    ix.add_documents(_docs(3))
    events = ix.enable_prefilter(min_tokens=1, commit=False)
    assert set(events.values()) == {"carried from the next commit"}
    assert KnowledgeIndex.open(path, enc).prefilter_info() is None  # nothing written yet
    ix.add_documents(_docs(2, prefix="e"))
    opened = KnowledgeIndex.open(path, enc)
    pf = opened.prefilter("segment")
    assert pf is not None and pf.snapshot().n_live == len(opened.stores["segment"])
    with pytest.raises(TypeError, match="commit"):
        ix.enable_prefilter(commit="no")


def test_service_writer_leaves_a_declined_index_alone(tmp_path, enc):
    path = tmp_path / "ix"
    ix = KnowledgeIndex.create(path, enc)
    ix.add_documents(_docs(3))
    ix.disable_prefilter()
    assert ix.prefilter_declined
    assert KnowledgeIndex.open(path, enc).prefilter_declined  # recorded in the manifest
    state, writer = _writer(path, enc)
    try:
        asyncio.run(writer.add_files([("new.txt", (TEXTS[3] + "\n").encode())]))
    finally:
        writer.close()
    index = KnowledgeIndex.open(path, enc)
    assert "new.txt" in index and index.prefilter_info() is None and index.prefilter_declined
    index.enable_prefilter(min_tokens=1)
    assert not KnowledgeIndex.open(path, enc).prefilter_declined


def test_cli_add_and_remove_maintain_carried_prefilters(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i, t in enumerate(TEXTS[:3]):
        (docs / f"{i}.txt").write_text(t + "\n")
    out = tmp_path / "ix"
    assert main(["index", "build", "--encoders", "hashing", str(docs), "--out", str(out), "--no-isolate"]) == 0
    ix = KnowledgeIndex.open(out)
    ix.enable_prefilter(min_tokens=1)  # built now (a real index reaches min_tokens by growing)

    def carried():
        index = KnowledgeIndex.open(out)
        pf = index.prefilter("segment")
        assert pf is not None
        uids = np.sort(pf.snapshot().ids[pf.snapshot().alive].numpy())
        store = index.stores["segment"]
        assert np.array_equal(uids, np.sort(store.ids[store.alive].numpy()))
        return index, uids

    _, before = carried()
    extra = tmp_path / "more"
    extra.mkdir()
    (extra / "x.txt").write_text(TEXTS[4] + "\n")
    assert main(["index", "add", str(out), str(extra), "--encoders", "hashing", "--no-isolate"]) == 0
    index, grown = carried()
    assert "x.txt" in index and grown.size > before.size
    assert main(["index", "remove", str(out), "0.txt", "--encoders", "hashing"]) == 0
    index, shrunk = carried()
    assert "0.txt" not in index and shrunk.size < grown.size
