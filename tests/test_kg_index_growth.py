"""The index grows without rebuilds: appends equal builds from scratch, the in-place merged graph
equals a full re-assembly, vectors are memory-mapped on open, interrupted appends are harmless,
and version-1 directories still open."""
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from colgraph_engine.graph import KnowledgeGraph, NodeKind
from colgraph_engine.kg import (DocumentInput, Encoders, IndexFormatError, ItemVectors, KnowledgeIndex,
                                 build_document_graph)
from colgraph_engine.kg import CooccurrenceExtractor
from colgraph_engine.kg import index as index_module
from colgraph_engine.kg.index import commit as index_commit
from colgraph_engine.kg.index import read_documents
from colgraph_engine.pipeline import Pipeline

from .test_kg_index import CROSS_MACHINE_ATOL, ENC, assert_same_index, small_docs

FIXTURES = {1: Path(__file__).parent / "fixtures" / "kg_index_v1",
            2: Path(__file__).parent / "fixtures" / "kg_index_v2"}  # written by the format-2 writer (commit e14cad8)
COUNTED = ("nodes", "edges", "segments", "entities", "relations", "images", "regions", "tables")
CITIES = ["Tokyo", "Osaka", "Kyoto", "Nagoya", "Sapporo", "Kobe", "Sendai", "Nara"]


def city_doc(i: int) -> DocumentInput:
    """Small documents whose entity names repeat across documents (alias groups form, grow and
    lose members as documents come and go)."""
    rng = random.Random(i)
    a, b = rng.sample(CITIES, 2)
    return DocumentInput(f"d{i}", [f"{a} is linked to {b} by the Shinkansen. Mount Fuji is near {a}.",
                                   f"{b} has a castle. Document {i} mentions {a} again."])


def graph_arrays(idx: KnowledgeIndex) -> dict:
    g = idx.graph
    src, dst = g.edges()
    return {"node_kind": g.node_kind, "node_doc": g.node_doc, "node_weight": g.node_weight, "src": src, "dst": dst,
            "edge_kind": g.edge_kind, "edge_weight": g.edge_weight, "alias_of": g.alias_of,
            "node_uid": idx.node_uid(), "edge_uid": idx.edge_uid(), "names": np.asarray(g.node_names, object)}


def assert_arrays_equal(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def alias_partition(alias_of: np.ndarray) -> set[frozenset]:
    groups: dict[int, set] = {}
    for v, g in enumerate(alias_of.tolist()):
        if g >= 0:
            groups.setdefault(g, set()).add(v)
    return {frozenset(m) for m in groups.values()}


def store_contents(idx: KnowledgeIndex) -> dict:
    out = {}
    for name, st in idx.stores.items():
        snap = st.snapshot()
        assert bool(snap.alive.all())
        out[name] = (snap.ids.clone(), snap.offsets.clone(), snap.values.clone())
    return out


def retrieval(idx: KnowledgeIndex, questions) -> list:
    pipe = Pipeline(idx, ENC)
    return [{k: v for k, v in r.as_dict().items() if k != "timings"} for r in pipe.retrieve_batch(questions)]


QUESTIONS = ["How is Tokyo linked to Osaka?", "Which castle is in Kyoto?", "Where is Mount Fuji?"]


def test_append_then_remove_equals_build_from_scratch(tmp_path):
    docs = small_docs() + [city_doc(i) for i in range(4)]
    grown = KnowledgeIndex.create(tmp_path / "grown", ENC)
    grown.graph  # noqa: B018 - assemble now, so that every later add appends in place
    for d in docs:
        grown.add_documents([d])
    grown.add_documents([city_doc(99), city_doc(98)])
    grown.remove_document("d99")
    grown.remove_document("d98")
    scratch = KnowledgeIndex.create(tmp_path / "scratch", ENC)
    scratch.add_documents(docs)
    for a in (grown, KnowledgeIndex.open(tmp_path / "grown", ENC)):
        assert_arrays_equal(graph_arrays(a), graph_arrays(scratch))
        assert_same_index(a, scratch)
        sa, sb = store_contents(a), store_contents(scratch)
        for name in sa:
            for x, y in zip(sa[name], sb[name]):
                assert torch.equal(x, y), name
        assert retrieval(a, QUESTIONS) == retrieval(scratch, QUESTIONS)
    # the vector files hold exactly the rows of the documents left (nothing of the removed ones)
    m = json.loads((tmp_path / "grown" / "manifest.json").read_text())
    for name, st in grown.stores.items():
        f = tmp_path / "grown" / "vectors" / m["vectors"][name]["file"]
        assert f.stat().st_size == st.values.numel() * st.values.element_size()
    assert sorted(p.name for p in (tmp_path / "grown" / "vectors").iterdir()) == sorted(
        v["file"] for v in m["vectors"].values())
    text = b"".join(p.read_bytes() for p in (tmp_path / "grown" / "parts").rglob("*.bin"))
    assert b"Document 99" not in text and b"Document 98" not in text


def test_removing_a_middle_document_equals_building_without_it(tmp_path):
    docs = [city_doc(i) for i in range(6)]
    grown = KnowledgeIndex.create(tmp_path / "grown", ENC)
    grown.add_documents(docs[:3])
    grown.add_documents(docs[3:])
    grown.remove_document("d1")   # shares its part with d0 and d2
    grown.remove_document("d4")
    kept = [d for d in docs if d.doc_id not in ("d1", "d4")]
    scratch = KnowledgeIndex(ENC)
    scratch.add_documents(kept)
    # document numbers are never reused: compare after mapping them to ranks
    renumber = {grown.doc_number(d.doc_id): scratch.doc_number(d.doc_id) for d in kept}
    a, b = graph_arrays(KnowledgeIndex.open(tmp_path / "grown", ENC)), graph_arrays(scratch)
    for key in ("node_uid", "edge_uid"):
        a[key] = np.asarray([(renumber[int(u) >> 32] << 32) | (int(u) & 0xFFFFFFFF) for u in a[key]], np.int64)
    a["node_doc"] = np.asarray([renumber[int(x)] for x in a["node_doc"]], np.int64)
    assert_arrays_equal(a, b)
    reopened = KnowledgeIndex.open(tmp_path / "grown", ENC)
    for name, st in reopened.stores.items():
        ref = scratch.stores[name]
        assert torch.equal(st.values, ref.values) and torch.equal(st.offsets, ref.offsets), name


def test_in_place_graph_equals_full_reassembly_after_random_adds_and_removes(tmp_path):
    rng = random.Random(7)
    idx = KnowledgeIndex.create(tmp_path / "idx", ENC)
    idx.graph  # noqa: B018
    present, next_doc = [], 0
    graphs = {}
    for step in range(24):
        if present and rng.random() < 0.35:
            idx.remove_document(present.pop(rng.randrange(len(present))))
        else:
            batch = []
            for _ in range(rng.randint(1, 3)):
                g = graphs.setdefault(next_doc, build_document_graph(city_doc(next_doc)))
                batch.append(g)
                present.append(g.doc_id)
                next_doc += 1
            idx.add_documents(batch)
        live = graph_arrays(idx)
        idx._assembly = idx._reassemble()
        assert_arrays_equal(live, graph_arrays(idx))
        # the groups are exactly those of set_aliases_from_names over every entity name
        ref = KnowledgeGraph.from_arrays(idx.graph.node_kind, idx.graph.node_doc, *idx.graph.edges(),
                                         node_names=idx.graph.node_names)
        ref.set_aliases_from_names((NodeKind.ENTITY,))
        assert alias_partition(live["alias_of"]) == alias_partition(ref.alias_of), step
    assert any(len(g) > 2 for g in alias_partition(idx.graph.alias_of))  # groups did form


def _mapped_files() -> list[tuple[int, int, str]]:
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6:
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                out.append((lo, hi, fields[5]))
    return out


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_open_maps_the_vector_files_instead_of_reading_them(tmp_path):
    idx = KnowledgeIndex.create(tmp_path / "idx", ENC)
    idx.add_documents(small_docs())
    for back in (KnowledgeIndex.open(tmp_path / "idx", ENC), idx):  # opened, and the writer after its add
        m = json.loads((tmp_path / "idx" / "manifest.json").read_text())
        maps = _mapped_files()
        for name, st in back.stores.items():
            if not st.values.numel():
                continue
            ptr = st.values.untyped_storage().data_ptr()
            owner = [path for lo, hi, path in maps if lo <= ptr < hi]
            assert owner == [str(tmp_path / "idx" / "vectors" / m["vectors"][name]["file"])], (name, owner)


_RSS_CHILD = """
import json, sys, torch
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
from colgraph_engine.kg import Encoders, KnowledgeIndex
import colgraph_engine.kg.parts, tqdm.auto  # noqa: F401 - imports are not what is measured
enc = Encoders.offline(text_dim=512, patch_grid=4, patch_cell=2)
before = rss()
idx = KnowledgeIndex.open(sys.argv[1], enc, verify=True)
opened = rss()
vec = sum(st.values.numel() * st.values.element_size() for st in idx.stores.values())
st = idx.stores["segment"]
st.search([torch.ones(1, 512)], k=1)  # touches every row: the pages come in now
print(json.dumps({"growth": opened - before, "vector_bytes": vec, "after_search": rss() - before}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc/self/status")
def test_opening_does_not_load_the_vectors_into_memory(tmp_path):
    enc = Encoders.offline(text_dim=512, patch_grid=4, patch_cell=2)
    idx = KnowledgeIndex.create(tmp_path / "idx", enc)
    words = " ".join(f"w{i}" for i in range(400))
    idx.add_documents([DocumentInput(f"long{i}", [f"Kyoto {words} {i}."] * 12) for i in range(12)])
    out = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(tmp_path / "idx")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["vector_bytes"] > 64 << 20
    # read whole, growth would exceed the vector bytes; the margin leaves room for the part
    # tables, the native graph and allocator noise (a clean-clone run measured 18.7 of 75.5 MB)
    assert r["growth"] < r["vector_bytes"] / 2, r
    assert r["after_search"] > r["vector_bytes"] / 2, r  # the measure sees pages once they are touched


class Crash(Exception):
    pass


def test_a_failed_commit_keeps_the_previous_generation_and_the_next_writer_cleans_up(tmp_path, monkeypatch):
    path = tmp_path / "idx"
    idx = KnowledgeIndex.create(path, ENC)
    idx.add_documents(small_docs()[:2])
    sizes = {p.name: p.stat().st_size for p in (path / "vectors").iterdir()}

    def crash(*a, **k):
        raise Crash("power cut before the manifest")

    monkeypatch.setattr(index_commit, "_replace_file", crash)
    with pytest.raises(Crash):
        idx.add_documents(small_docs()[2:])
    with pytest.raises(Crash):
        idx.remove_document("fuji")
    monkeypatch.undo()
    assert idx.documents == ["fuji", "tokyo"]
    assert {p.name: p.stat().st_size for p in (path / "vectors").iterdir()} == sizes  # cut back, no new files
    assert_same_index(idx, KnowledgeIndex.open(path, ENC))
    # a writer killed mid-append leaves rows past the committed ones and an unlisted part
    for f in (path / "vectors").iterdir():
        with open(f, "ab") as fh:
            fh.write(os.urandom(4 * 32 * 3))
    shutil.copyfile(next((path / "parts").iterdir()), path / "parts" / "p999999-0badc0de.part")
    back = KnowledgeIndex.open(path, ENC)             # readers ignore both
    assert_same_index(back, idx)
    back.add_documents(small_docs()[2:])               # the next writer cuts the tails and removes the part
    m = json.loads((path / "manifest.json").read_text())
    for name, v in m["vectors"].items():
        st = back.stores[name]
        assert (path / "vectors" / v["file"]).stat().st_size == st.values.numel() * st.values.element_size()
    assert sorted(p.name for p in (path / "parts").iterdir()) == sorted(back._parts)
    scratch = KnowledgeIndex(ENC)
    scratch.add_documents(small_docs())
    assert_same_index(KnowledgeIndex.open(path, ENC), scratch)


def test_tampered_vector_rows_are_caught_by_verify(tmp_path):
    path = tmp_path / "idx"
    KnowledgeIndex.create(path, ENC).add_documents(small_docs())
    m = json.loads((path / "manifest.json").read_text())
    f = path / "vectors" / m["vectors"]["entity"]["file"]
    data = bytearray(f.read_bytes())
    data[5] ^= 0x40
    f.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match="checksum mismatch"):
        KnowledgeIndex.open(path)
    assert KnowledgeIndex.open(path, verify=False).documents == ["fuji", "tokyo", "osaka"]  # sizes still checked


@pytest.mark.parametrize("edit", [
    lambda m: m["vectors"]["entity"].update(file="../../etc/passwd"),
    lambda m: m["vectors"]["entity"].update(file="segment.0123456789abcdef.bin"),
    lambda m: m["vectors"].pop("entity"),
    lambda m: m["vectors"]["entity"].update(rows=-1),
    lambda m: m["vectors"]["entity"].update(rows=10**6),
], ids=["path", "other-store", "missing", "negative", "beyond-file"])
def test_crafted_vector_entries_are_format_errors(tmp_path, edit):
    path = tmp_path / "idx"
    KnowledgeIndex.create(path, ENC).add_documents(small_docs())
    mf = path / "manifest.json"
    m = json.loads(mf.read_text())
    edit(m)
    mf.write_text(json.dumps(m))
    with pytest.raises(IndexFormatError):
        KnowledgeIndex.open(path)


def stored_vectors(idx: KnowledgeIndex, doc_id: str) -> dict[str, ItemVectors]:
    """The vectors `idx` holds for one document, per store, as :func:`encode_document` returns them."""
    number, out = idx.doc_number(doc_id), {}
    for name, st in idx.stores.items():
        uids = sorted(u for u in st.ids[st.alive].tolist() if u >> 32 == number)
        rows = [st.get(u) for u in uids]
        offsets = torch.zeros(len(rows) + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(torch.tensor([r.shape[0] for r in rows], dtype=torch.int64), 0)
        values = torch.cat(rows) if rows else torch.zeros(0, st.dim)
        out[name] = ItemVectors(np.asarray([u & 0xFFFFFFFF for u in uids], np.int64), values, offsets)
    return out


@pytest.mark.parametrize("version", [1, 2])
def test_older_directories_open_and_their_first_change_upgrades_them(tmp_path, version):
    path = tmp_path / f"v{version}"
    shutil.copytree(FIXTURES[version], path)
    assert json.loads((path / "manifest.json").read_text())["version"] == version
    old = KnowledgeIndex.open(path, ENC)
    # against a fresh build: graphs exact, vectors within the cross-machine tolerance (the
    # fixture's vectors were encoded on another machine)
    scratch = KnowledgeIndex(ENC)
    # the fixtures were written when CooccurrenceExtractor was the default extractor
    scratch.add_documents([build_document_graph(d, extractor=CooccurrenceExtractor()) for d in small_docs()])
    assert_same_index(old, scratch, vector_atol=CROSS_MACHINE_ATOL)
    assert read_documents(path) == [{"doc_id": d, "number": old.doc_number(d), "part": p,
                                     "nodes": old.document(d).n_nodes, "edges": old.document(d).n_edges,
                                     "counts": {k: old.document(d).counts[k] for k in COUNTED}}
                                    for d, p in zip(old.documents, [e.part for e in old._docs.values()])]
    # against an in-memory index holding the fixture's own vectors: everything bit-exact
    same = KnowledgeIndex(ENC)
    same.add_documents([old.document(d) for d in old.documents], [stored_vectors(old, d) for d in old.documents])
    assert_same_index(old, same)
    old.add_documents([city_doc(0)])
    assert json.loads((path / "manifest.json").read_text())["version"] == 3
    assert all(p.is_file() and p.suffix == ".part" for p in (path / "parts").iterdir())  # no part folder left
    scratch.add_documents([city_doc(0)])
    same.add_documents([city_doc(0)])
    for a in (old, KnowledgeIndex.open(path, ENC)):
        assert_same_index(a, same)
        assert retrieval(a, QUESTIONS) == retrieval(same, QUESTIONS)
        assert_same_index(a, scratch, vector_atol=CROSS_MACHINE_ATOL)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_after_a_commit_can_commit(tmp_path):
    """The fsync thread pool is per process: a child forked after its parent committed (its pool
    started) starts a pool of its own and commits, instead of queueing its fsyncs for the parent's
    idle threads, which do not exist in it (a hang whenever it has fewer files than those threads)."""
    index = KnowledgeIndex.create(tmp_path / "idx", ENC)
    index.add_documents([city_doc(0)])  # starts the parent's fsync pool
    assert index_commit._fsync_pool.cache_info().currsize == 1
    pid = os.fork()
    if pid == 0:  # the child: exit 0 once its own commit is done
        code = 1
        try:
            assert index_commit._fsync_pool.cache_info().currsize == 0, "the child kept its parent's pool"
            KnowledgeIndex.open(tmp_path / "idx", ENC).add_documents([city_doc(1)])
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's commit did not finish in 120 s")
    assert os.waitstatus_to_exitcode(status) == 0
    assert KnowledgeIndex.open(tmp_path / "idx", ENC).documents == ["d0", "d1"]
