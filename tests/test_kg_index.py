"""The knowledge index: embedding, round trips, add/remove without dangling items, crash safety
of writes, and clear failures on damaged directories."""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from colgraph_engine.encoders import Encoder, HashingTextEncoder, PixelPatchEncoder
from colgraph_engine.graph import EdgeKind, NodeKind
from colgraph_engine.kg import (
    DocumentInput, Encoders, ImageInput, IndexFormatError, ItemVectors, KnowledgeIndex, TableInput,
    build_document_graph, encode_document, make_uid,
)
from colgraph_engine import _arrayfile
from colgraph_engine.kg import index as index_module
from colgraph_engine.kg.index import commit as index_commit
from colgraph_engine.kg.index import read_documents
from colgraph_engine.kg import parts as parts_module
from colgraph_engine.kg.vectors import image_text_view, region_text_view

from .test_kg_build import fixture, fuji_document

ENC = Encoders.offline(text_dim=32, patch_grid=4, patch_cell=2)


def small_docs():
    return [
        fuji_document(),
        DocumentInput("tokyo", ["Tokyo is the capital of Japan. The Shinkansen starts at Tokyo Station.",
                                "Mount Fuji is visible from Tokyo on clear days."],
                      tables=[TableInput("line | opened\nTokaido | 1964", "Lines", section=0)]),
        DocumentInput("osaka", ["Osaka is served by the Shinkansen. Osaka Castle dates from 1583."]),
    ]


# Vectors encoded on another machine (the stored fixtures) differ from fresh ones by reduction-order
# rounding: 1 ulp seen (6e-8, AMD Zen 4 vs Zen 5). Unit vectors in float32: 1e-6 is ~16 ulp at 0.5.
CROSS_MACHINE_ATOL = 1e-6


def assert_same_index(a: KnowledgeIndex, b: KnowledgeIndex, *, vector_atol: float = 0.0):
    """Same documents, graphs and merged graph; vectors bit-equal (``vector_atol=0``: both indexes
    encoded on this machine, which the encoders promise) or within ``vector_atol`` (one side's
    vectors stored by another machine)."""
    assert a.documents == b.documents and a.counts == b.counts
    for doc_id in a.documents:
        ga, gb = a.document(doc_id), b.document(doc_id)
        for name in ("node_kind", "node_weight", "node_edge", "node_image", "node_prov_offsets", "node_prov",
                     "edge_src", "edge_dst", "edge_kind", "edge_weight", "edge_prov_offsets", "edge_prov"):
            np.testing.assert_array_equal(getattr(ga, name), getattr(gb, name), err_msg=name)
        np.testing.assert_array_equal(ga.node_bbox, gb.node_bbox)
        for name in ("node_name", "node_type", "node_text", "node_source", "edge_keywords", "edge_text"):
            assert getattr(ga, name) == getattr(gb, name), name
    for s in a.stores:
        sa, sb = a.stores[s], b.stores[s]
        ia, ib = sa.ids[sa.alive], sb.ids[sb.alive]
        assert torch.equal(torch.sort(ia).values, torch.sort(ib).values), s
        for uid in ia.tolist():
            x, y = sa.get(uid), sb.get(uid)
            if vector_atol == 0.0:
                assert torch.equal(x, y), (s, uid)
            else:
                torch.testing.assert_close(x, y, rtol=0.0, atol=vector_atol, msg=lambda m: f"{s} {uid}: {m}")
    ga, gb = a.graph, b.graph
    for attr in ("node_kind", "node_doc", "edge_kind", "alias_of"):
        np.testing.assert_array_equal(getattr(ga, attr), getattr(gb, attr))
    np.testing.assert_array_equal(ga.edges()[0], gb.edges()[0])


def test_encode_document_fills_every_store_with_the_right_items():
    g = build_document_graph(fuji_document(tables=[TableInput("a | b", "T", section=1)]))
    vecs = encode_document(g, ENC)
    assert set(vecs) == {"entity", "relation", "segment", "table", "image", "region", "image_text", "region_text"}
    # text views: every image and region has one, encoded by the token encoder
    np.testing.assert_array_equal(vecs["image_text"].local, g.nodes_of(NodeKind.IMAGE))
    np.testing.assert_array_equal(vecs["region_text"].local, g.nodes_of(NodeKind.REGION))
    img = int(g.nodes_of(NodeKind.IMAGE)[0])
    view = image_text_view(g, img)
    assert view.splitlines()[0] == g.node_text[img]
    assert all(region_text_view(g, int(r)) in view for r in np.flatnonzero(g.node_image == img))
    o = vecs["image_text"].offsets
    assert torch.equal(vecs["image_text"].values[o[0]:o[1]], ENC.tokens([view])[0])
    np.testing.assert_array_equal(vecs["entity"].local, g.nodes_of(NodeKind.ENTITY))
    np.testing.assert_array_equal(vecs["relation"].local, g.edges_of(EdgeKind.RELATION))
    assert vecs["entity"].values.shape == (4, 32)
    # segment token vectors: one per word (hashing encoder), the same as encoding the text directly
    seg = g.nodes_of(NodeKind.SEGMENT)[0]
    direct = ENC.tokens([g.node_text[seg]])[0]
    o = vecs["segment"].offsets
    assert torch.equal(vecs["segment"].values[o[0]:o[1]], direct)
    # a region's vectors are the patch encoder applied to the image cropped to its bbox
    from PIL import Image
    image = Image.fromarray(fuji_document().images[0].pixels)
    regions = vecs["region"]
    r0 = int(regions.local[0])
    x1, y1, x2, y2 = g.node_bbox[r0]
    crop = image.crop((int(np.floor(x1 * 200)), int(np.floor(y1 * 100)), int(np.ceil(x2 * 200)), int(np.ceil(y2 * 100))))
    assert torch.equal(regions.values[: 16], ENC.patches([crop])[0])
    assert regions.values.shape == (3 * 16, 12)


def test_images_without_pixels_get_nodes_but_no_vectors():
    g = build_document_graph(fuji_document(images=[ImageInput("photo", None, fixture("fuji_scene.txt"))]))
    vecs = encode_document(g, ENC)
    assert "image" not in vecs and "region" not in vecs
    assert len(g.nodes_of(NodeKind.REGION)) == 2


def test_pixels_from_a_file_path(tmp_path):
    from PIL import Image
    Image.fromarray(fuji_document().images[0].pixels).save(tmp_path / "photo.png")
    a = encode_document(build_document_graph(fuji_document(images=[ImageInput("photo", tmp_path / "photo.png")])), ENC)
    b = encode_document(build_document_graph(fuji_document(images=[ImageInput("photo", str(tmp_path / "photo.png"))])), ENC)
    c = encode_document(build_document_graph(fuji_document()), ENC)
    assert torch.equal(a["image"].values, c["image"].values) and torch.equal(b["image"].values, c["image"].values)
    g = build_document_graph(fuji_document(images=[ImageInput("photo", tmp_path / "photo.png")]))
    assert g.node_source[g.nodes_of(NodeKind.IMAGE)[0]].endswith("photo.png")


def test_encoder_outputs_are_checked():
    bad_shape = Encoder(lambda texts: torch.zeros(len(texts), 3), "bad", 4, "text")
    with pytest.raises(ValueError, match=r"encoder 'bad': expected a \[4, 4\] tensor"):
        encode_document(build_document_graph(fuji_document()), Encoders(text=bad_shape))
    nan = Encoder(lambda texts: torch.full((len(texts), 4), float("nan")), "nan", 4, "text")
    with pytest.raises(ValueError, match="NaN"):
        encode_document(build_document_graph(fuji_document()), Encoders(text=nan))
    short = Encoder(lambda texts: [torch.zeros(2, 4)], "short", 4, "tokens")
    with pytest.raises(ValueError, match="expected 2 tensors"):
        encode_document(build_document_graph(fuji_document()), Encoders(tokens=short))
    with pytest.raises(TypeError, match="role 'text'"):
        Encoders(text=short)
    with pytest.raises(ValueError, match="dim"):
        Encoder(len, "x", 0, "text")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_through_the_directory(tmp_path, dtype):
    idx = KnowledgeIndex.create(tmp_path / "idx", ENC, dtype=dtype)
    idx.add_documents(small_docs()[:2])
    idx.add_document(small_docs()[2])
    back = KnowledgeIndex.open(tmp_path / "idx", ENC)
    assert back.dtype == dtype
    assert_same_index(idx, back)
    assert back.counts["documents"] == 3 and back.counts["image_vectors"] == 1
    # an in-memory index saved to a directory reads back the same
    mem = KnowledgeIndex(ENC, dtype=dtype)
    mem.add_documents(small_docs())
    mem.save(tmp_path / "saved")
    assert_same_index(mem, KnowledgeIndex.open(tmp_path / "saved"))


def test_merged_graph_keeps_documents_apart_and_aliases_equal_names(tmp_path):
    idx = KnowledgeIndex(ENC)
    idx.add_documents(small_docs())
    g = idx.graph
    numbers = {d: idx.doc_number(d) for d in idx.documents}
    assert sorted(np.unique(g.node_doc).tolist()) == sorted(numbers.values())
    names = g.node_names
    tokyo = [v for v in range(g.n_nodes) if names[v].lower() == "tokyo" and g.node_kind[v] == NodeKind.ENTITY]
    assert len(tokyo) == 2                                   # one node per document
    assert g.node_doc[tokyo[0]] != g.node_doc[tokyo[1]]
    assert g.alias_of[tokyo[0]] == g.alias_of[tokyo[1]] >= 0  # one alias group across documents
    # restricted to one document, expansion from its Tokyo never reaches the other's nodes
    out = g.expand([[tokyo[1]]], hops=2, docs=[[int(g.node_doc[tokyo[1]])]], merge_aliases=True, min_keep=100)
    assert set(g.node_doc[out[0].nodes].tolist()) == {int(g.node_doc[tokyo[1]])}
    # store ids map to graph nodes and back
    st = idx.stores["entity"]
    nodes = idx.nodes_of_uids(st.ids)
    np.testing.assert_array_equal(idx.node_uid()[nodes], st.ids.numpy())
    assert all(g.node_kind[v] == NodeKind.ENTITY for v in nodes)
    info = idx.describe_node(int(nodes[0]))
    assert info["kind"] == "entity" and info["doc_id"] == "fuji" and info["name"] == "Mount Fuji"
    rel_edges = idx.edges_of_uids(idx.stores["relation"].ids)
    assert (g.edge_kind[rel_edges] == EdgeKind.RELATION).all()
    with pytest.raises(ValueError, match="names no item"):
        idx.nodes_of_uids([make_uid(99, 0)])


def test_remove_document_leaves_nothing_dangling(tmp_path):
    idx = KnowledgeIndex.create(tmp_path / "idx", ENC)
    idx.add_documents(small_docs())              # one part with three documents
    before = {d: idx._stored(d) for d in ("fuji", "osaka")}
    gone = idx.doc_number("tokyo")
    idx.remove_document("tokyo")
    for view in (idx, KnowledgeIndex.open(tmp_path / "idx", ENC)):
        assert view.documents == ["fuji", "osaka"]
        g = view.graph
        assert gone not in g.node_doc.tolist()
        src, dst = g.edges()
        assert src.max() < g.n_nodes and dst.max() < g.n_nodes
        # no alias group with a single member is left behind (Tokyo was shared with the removed doc)
        _, sizes = np.unique(g.alias_of[g.alias_of >= 0], return_counts=True)
        assert (sizes >= 2).all()
        names = [g.node_names[v].lower() for v in np.flatnonzero(g.alias_of >= 0)]
        assert "tokyo" not in names
        for s, store in view.stores.items():
            assert ((store.ids >> 32) != gone).all(), s
            assert store.n_slots == len(store)  # compacted: no tombstoned vectors kept
            view.nodes_of_uids(store.ids) if s != "relation" else view.edges_of_uids(store.ids)
        # the documents that stay are byte-for-byte what they were
        for doc_id, old in before.items():
            new = view._stored(doc_id)
            assert new.number == old.number
            for s in old.vectors:
                np.testing.assert_array_equal(new.vectors[s].local, old.vectors[s].local)
                assert torch.equal(new.vectors[s].values, old.vectors[s].values)
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert [d["doc_id"] for d in read_documents(tmp_path / "idx")] == ["fuji", "osaka"]
    assert sorted(os.listdir(tmp_path / "idx" / "parts")) == sorted(p["name"] for p in manifest["parts"])
    # the id can be used again; it gets a new number
    idx.add_document(small_docs()[1])
    assert idx.doc_number("tokyo") > gone
    idx.remove_document("fuji")
    idx.remove_document("osaka")
    idx.remove_document("tokyo")
    assert idx.graph.n_nodes == 0 and all(len(s) == 0 for s in idx.stores.values())
    assert os.listdir(tmp_path / "idx" / "parts") == []
    assert KnowledgeIndex.open(tmp_path / "idx").documents == []


def test_add_rejects_duplicates_and_changes_nothing(tmp_path):
    idx = KnowledgeIndex.create(tmp_path / "idx", ENC)
    idx.add_documents(small_docs()[:1])
    manifest = (tmp_path / "idx" / "manifest.json").read_bytes()
    with pytest.raises(ValueError, match="'fuji' is already in the index"):
        idx.add_documents(small_docs())
    with pytest.raises(ValueError, match="docs\\[1\\]: document id 'x'"):
        idx.add_documents([DocumentInput("x", ["a"]), DocumentInput("x", ["b"])])
    with pytest.raises(ValueError, match="doc_id: no document 'nope'"):
        idx.remove_document("nope")
    with pytest.raises(TypeError, match="docs: expected a sequence"):
        idx.add_documents(DocumentInput("y", ["a"]))
    assert idx.documents == ["fuji"]
    assert (tmp_path / "idx" / "manifest.json").read_bytes() == manifest


def test_precomputed_vectors_and_their_checks(tmp_path):
    idx = KnowledgeIndex(None, dims={"entity": 32, "segment": 32})
    g = build_document_graph(small_docs()[2])
    full = encode_document(g, ENC)
    vectors = {"entity": full["entity"], "segment": full["segment"]}
    idx.add_document(g, vectors)
    assert len(idx.stores["entity"]) == len(g.nodes_of(NodeKind.ENTITY))
    g2 = build_document_graph(small_docs()[1])
    with pytest.raises(ValueError, match="store 'relation' is not one of"):
        idx.add_document(g2, encode_document(g2, ENC))
    bad = ItemVectors(np.array([0]), torch.zeros(1, 16), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"vectors\[0\]\['entity'\]: expected 1 items of dimension 32"):
        idx.add_document(g2, {"entity": bad})
    bad = ItemVectors(np.array([10**6]), torch.zeros(1, 32), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="local ids must be unique"):
        idx.add_document(g2, {"entity": bad})
    with pytest.raises(ValueError, match="has no encoders"):
        idx.add_document(g2)
    assert idx.documents == ["osaka"]


def test_open_checks_the_encoders(tmp_path):
    KnowledgeIndex.create(tmp_path / "idx", ENC).add_documents(small_docs()[:1])
    other = Encoders.offline(text_dim=64, patch_grid=4, patch_cell=2)
    with pytest.raises(ValueError, match="encoders: the index was built with"):
        KnowledgeIndex.open(tmp_path / "idx", other)
    with pytest.raises(ValueError, match="already holds an index"):
        KnowledgeIndex.create(tmp_path / "idx", ENC)
    assert KnowledgeIndex.create(tmp_path / "idx", ENC, overwrite=True).documents == []


# -- crash safety -----------------------------------------------------------------------------------

class Crash(RuntimeError):
    pass


def crash(*args, **kwargs):
    raise Crash("simulated failure")


def test_failure_between_part_write_and_commit_keeps_the_previous_index(tmp_path, monkeypatch):
    idx = KnowledgeIndex.create(tmp_path / "idx", ENC)
    idx.add_documents(small_docs()[:1])
    monkeypatch.setattr(index_commit, "_replace_file", crash)      # the part is written, the manifest is not
    with pytest.raises(Crash):
        idx.add_documents(small_docs()[1:])
    with pytest.raises(Crash):
        idx.remove_document("fuji")
    monkeypatch.undo()
    assert idx.documents == ["fuji"]                                 # memory unchanged
    assert KnowledgeIndex.open(tmp_path / "idx", ENC).documents == ["fuji"]
    assert len(os.listdir(tmp_path / "idx" / "parts")) == 1          # the failed call removed its own part
    idx.add_documents(small_docs()[1:])
    assert_same_index(idx, KnowledgeIndex.open(tmp_path / "idx", ENC))


def test_failure_inside_a_part_write_leaves_no_trace(tmp_path, monkeypatch):
    idx = KnowledgeIndex.create(tmp_path / "idx", ENC)
    idx.add_documents(small_docs()[:1])
    calls = {"n": 0}
    real = parts_module._arrayfile.hashlib.sha256

    def fail_on_fifth(*a, **k):  # the part file is half written when its fifth array is hashed
        calls["n"] += 1
        if calls["n"] == 5:
            raise Crash("disk full")
        return real(*a, **k)

    monkeypatch.setattr(parts_module._arrayfile.hashlib, "sha256", fail_on_fifth)
    with pytest.raises(Crash):
        idx.add_documents(small_docs()[1:])
    monkeypatch.undo()
    assert idx.documents == ["fuji"]
    assert [p.name for p in (tmp_path / "idx" / "parts").iterdir()] == list(idx._parts)
    assert not list((tmp_path / "idx" / "parts").glob(".*"))
    assert KnowledgeIndex.open(tmp_path / "idx").documents == ["fuji"]


def test_a_killed_writer_leaves_an_orphan_part_that_is_ignored_then_removed(tmp_path):
    idx = KnowledgeIndex.create(tmp_path / "idx", ENC)
    idx.add_documents(small_docs()[:1])
    parts = tmp_path / "idx" / "parts"
    (only,) = list(parts.iterdir())
    shutil.copyfile(only, parts / "p999999-0badc0de.part")             # written, never committed
    (tmp_path / "idx" / ".manifest.json.tmp-dead").write_text("{")   # a half-written manifest
    back = KnowledgeIndex.open(tmp_path / "idx", ENC)
    assert back.documents == ["fuji"]
    back.add_documents(small_docs()[1:2])
    assert sorted(p.name for p in parts.iterdir()) == sorted(back._parts)
    assert not (tmp_path / "idx" / ".manifest.json.tmp-dead").exists()


# -- damaged directories ----------------------------------------------------------------------------

@pytest.fixture
def built(tmp_path):
    idx = KnowledgeIndex.create(tmp_path / "idx", ENC)
    idx.add_documents(small_docs())
    return tmp_path / "idx"


def only_part(path: Path) -> Path:
    (part,) = list((path / "parts").iterdir())
    return part


def array_span(part: Path, name: str) -> tuple[int, int]:
    """Byte range of array `name` inside a part file."""
    f = _arrayfile.ArrayFile(part, parts_module.PART_FORMAT, (parts_module.PART_VERSION,))
    info = f._table[name]
    return f._start + info["offset"], f._start + info["offset"] + info["bytes"]


@pytest.mark.parametrize("which", ["part file", "vector file"])
def test_truncated_part_file_fails_clearly(built, which):
    if which == "part file":  # format 3: a part is one file
        f = only_part(built)
    else:  # format 2: the vectors live in one append-only file per store
        f = built / "vectors" / json.loads((built / "manifest.json").read_text())["vectors"]["segment"]["file"]
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(IndexFormatError, match="truncated"):
        KnowledgeIndex.open(built)
    with pytest.raises(IndexFormatError, match="truncated"):
        KnowledgeIndex.open(built, verify=False)


def test_tampered_part_file_fails_clearly(built):
    f = only_part(built)
    lo, _ = array_span(f, "node_text.bytes")
    data = bytearray(f.read_bytes())
    data[lo + 3] ^= 0x20  # ASCII letter case: still UTF-8, only the checksum can tell
    f.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match="'node_text.bytes' checksum mismatch"):
        KnowledgeIndex.open(built)
    KnowledgeIndex.open(built, verify=False)  # structure intact: only verify reads every byte


def test_tampered_part_header_fails_clearly(built):
    f = only_part(built)
    data = f.read_bytes()
    assert data.count(b'"n_docs":3') == 1
    f.write_bytes(data.replace(b'"n_docs":3', b'"n_docs":2'))
    for verify in (True, False):
        with pytest.raises(IndexFormatError, match="header checksum mismatch"):
            KnowledgeIndex.open(built, verify=verify)


def test_part_string_that_is_not_utf8_fails_even_without_verify(built):
    f = only_part(built)
    lo, _ = array_span(f, "node_name.bytes")
    data = bytearray(f.read_bytes())
    data[lo] = 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match="'node_name.bytes' is not UTF-8"):
        KnowledgeIndex.open(built, verify=False)


def _edit_part(i, **fields):
    """A manifest edit of part entry `i` that keeps 'totals' the sums (so the part check runs)."""
    def edit(m):
        m["parts"][i].update(fields)
        resum(m)
    return edit


def resum(m):
    m["totals"] = {"documents": sum(p["documents"] for p in m["parts"]),
                   **{k: sum(p["counts"][k] for p in m["parts"]) for k in m["parts"][0]["counts"]}}


@pytest.mark.parametrize("edit, match", [
    (lambda m: m.update(version=99), "format version 99"),
    (lambda m: m.update(format="other"), "not a colgraph-kg-index manifest"),
    (_edit_part(0, name="p-missing.part"), "part is missing"),
    (_edit_part(0, name="../outside.part"), "not a plain file or folder name"),
    (lambda m: (m["parts"].append(dict(m["parts"][0])), resum(m)), "a part is listed twice"),
    (_edit_part(0, counts={**{k: 0 for k in ("nodes", "edges", "segments", "entities", "relations", "images",
                                              "regions", "tables")}, "nodes": 1}), "other documents or counts"),
    (_edit_part(0, documents=2), "other documents or counts"),
    (_edit_part(0, sha256="0" * 64), "header checksum mismatch"),
    (lambda m: m["parts"][0]["counts"].update(nodes=1), "'totals' are not the sums"),
    (lambda m: m.update(parts={}), "field 'parts' missing or invalid"),
    (lambda m: m.update(parts=[], totals={"documents": 0, **dict.fromkeys(m["totals"], 0)}),
     "the manifest commits"),  # no parts, but committed vector rows nobody owns
    (lambda m: m.update(dims={"entity": "32"}), "fields missing or inconsistent"),
])
def test_inconsistent_manifest_fails_clearly(built, edit, match):
    mf = built / "manifest.json"
    m = json.loads(mf.read_text())
    edit(m)
    mf.write_text(json.dumps(m))
    with pytest.raises(IndexFormatError, match=match):
        KnowledgeIndex.open(built)


def test_garbage_or_missing_manifest_fails_clearly(built, tmp_path):
    (built / "manifest.json").write_text("{not json")
    with pytest.raises(IndexFormatError, match="not valid JSON"):
        KnowledgeIndex.open(built)
    with pytest.raises(IndexFormatError, match="no manifest.json"):
        KnowledgeIndex.open(tmp_path / "nowhere")


def test_missing_part_fails_clearly(built):
    only_part(built).unlink()
    with pytest.raises(IndexFormatError, match="part is missing"):
        KnowledgeIndex.open(built)


def test_hashing_encoder_is_stable_across_processes():
    # crc32 features: the same vector in every process (Python's hash() would be salted)
    v = HashingTextEncoder(16).text_vectors(["Mount Fuji"])[0]
    assert v.shape == (16,) and abs(float(v.norm()) - 1.0) < 1e-6
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "from colgraph_engine.encoders import HashingTextEncoder as H;"
                          "print(H(16).text_vectors(['Mount Fuji'])[0].tolist())"], capture_output=True, text=True,
                         check=True)
    assert torch.allclose(torch.tensor(json.loads(out.stdout)), v)


def test_pixel_encoder_shapes_and_checks():
    enc = PixelPatchEncoder(grid=3, cell=2)
    (v,) = enc.patch_vectors([np.full((7, 5, 3), 9, np.uint8)])
    assert v.shape == (9, 12)
    with pytest.raises(TypeError, match="images"):
        enc.patch_vectors([np.zeros((4, 4, 3), np.float32)])
    with pytest.raises(ValueError, match="grid"):
        PixelPatchEncoder(grid=0)


# -- concurrent writers ----------------------------------------------------------------------------

def test_a_stale_index_object_cannot_overwrite_a_newer_commit(tmp_path):
    from colgraph_engine.kg import IndexConflictError
    a = KnowledgeIndex.create(tmp_path / "idx", ENC)
    b = KnowledgeIndex.open(tmp_path / "idx", ENC)      # reads generation 1
    a.add_documents(small_docs()[:1])                     # commits generation 2
    with pytest.raises(IndexConflictError, match="changed on disk since it was read"):
        b.add_documents(small_docs()[1:2])
    assert b.documents == [] and KnowledgeIndex.open(tmp_path / "idx").documents == ["fuji"]
    a.remove_document("fuji")
    b = KnowledgeIndex.open(tmp_path / "idx", ENC)
    b.add_documents(small_docs()[1:2])
    assert KnowledgeIndex.open(tmp_path / "idx").documents == ["tokyo"]


def test_a_held_writer_lock_refuses_changes(tmp_path):
    import fcntl

    from colgraph_engine.kg import IndexConflictError
    idx = KnowledgeIndex.create(tmp_path / "idx", ENC)
    fd = os.open(tmp_path / "idx" / ".lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)                        # another writer at work
    try:
        with pytest.raises(IndexConflictError, match="another writer"):
            idx.add_documents(small_docs()[:1])
        parts = tmp_path / "idx" / "parts"
        assert idx.documents == [] and (not parts.exists() or not os.listdir(parts))
    finally:
        os.close(fd)
    idx.add_documents(small_docs()[:1])
    assert KnowledgeIndex.open(tmp_path / "idx").documents == ["fuji"]


def test_bad_arguments_are_named():
    idx = KnowledgeIndex(ENC)
    idx.add_documents(small_docs()[2:])
    with pytest.raises(ValueError, match="node: expected a node id"):
        idx.describe_node(-1)
    with pytest.raises(ValueError, match="node: expected a node id"):
        idx.describe_node(idx.graph.n_nodes)
    with pytest.raises(TypeError, match="uids: expected integer ids"):
        idx.nodes_of_uids([1.5])
    with pytest.raises(TypeError, match="doc_id: expected str"):
        idx.remove_document(3)
    with pytest.raises(ValueError, match=r"vectors: expected one dict per document \(1\)"):
        idx.add_documents(small_docs()[:1], vectors=[])
    with pytest.raises(TypeError, match=r"docs\[0\]: expected a DocumentInput"):
        idx.add_documents(["text"])
    with pytest.raises(ValueError, match="dims"):
        KnowledgeIndex(None, dims={"bogus": 3})
    with pytest.raises(TypeError, match="dtype"):
        KnowledgeIndex(ENC, dtype=torch.int32)
    with pytest.raises(TypeError, match="encoders"):
        KnowledgeIndex("offline")
    assert idx.documents == ["osaka"]


def test_folder_arguments_are_checked():
    with pytest.raises(TypeError, match="path: expected a str or os.PathLike"):
        KnowledgeIndex.open(3)
    with pytest.raises(TypeError, match="path: expected a str or os.PathLike"):
        KnowledgeIndex.create(None, ENC)
    with pytest.raises(TypeError, match="path: expected a str or os.PathLike"):
        KnowledgeIndex(ENC).save(["x"])


def test_node_place_and_document_node_segments_agree_with_describe_node(tmp_path):
    """The light look-ups the query stages use give what describe_node gives, in memory and
    reopened from disk, and refuse what they cannot answer."""
    mem = KnowledgeIndex(ENC)
    mem.add_documents(small_docs())
    disk = KnowledgeIndex.create(tmp_path / "idx", ENC)
    disk.add_documents(small_docs())
    for idx in (mem, KnowledgeIndex.open(tmp_path / "idx", ENC)):
        for doc_id in idx.documents:
            nodes = np.asarray([v for v in range(idx.graph.n_nodes) if idx.describe_node(v)["doc_id"] == doc_id])
            got = idx.document_node_segments(nodes)
            assert len(got) == nodes.size > 0
            for v, segs in zip(nodes.tolist(), got):
                d = idx.describe_node(v)
                assert idx.node_place(v) == (d["doc_id"], d["local"], d["kind"])
                assert segs.tolist() == d["segments"] == idx.node_segments(v)
        assert idx.document_node_segments(np.zeros(0, np.int64)) == []
        with pytest.raises(ValueError, match="nodes: expected nodes of one document"):
            idx.document_node_segments(np.asarray([0, idx.graph.n_nodes - 1]))
        with pytest.raises(TypeError, match="nodes: expected a 1-D integer array"):
            idx.document_node_segments(np.asarray([0.5]))
        with pytest.raises(ValueError, match="node: expected a node id"):
            idx.node_place(idx.graph.n_nodes)
