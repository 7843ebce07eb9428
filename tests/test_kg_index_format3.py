"""Index format 3: one file per part, a constant number of fsyncs per commit, a manifest that lists
parts rather than documents, and lazily decoded strings that equal the eager ones."""
import json
import os
import pickle

import numpy as np
import pytest

from colgraph_engine.kg import DocumentInput, KnowledgeIndex, build_document_graph, encode_document
from colgraph_engine.kg.index import read_documents
from colgraph_engine.kg.strings import StringColumn

from .test_kg_index import ENC, assert_same_index, small_docs
from .test_kg_index_growth import city_doc

STRING_COLUMNS = ("node_name", "node_type", "node_text", "node_source", "edge_keywords", "edge_text")


def unicode_doc() -> DocumentInput:
    return DocumentInput("unicode", ["Zürich liegt am Zürichsee. 東京 is linked to Zürich by air.",
                                     "Café Ørsted 🚄 serves Zürich and 東京 travellers."])


def docs():
    return small_docs() + [unicode_doc()] + [city_doc(i) for i in range(4)]


# -- StringColumn --------------------------------------------------------------------------------

def test_string_column_behaves_as_a_read_only_list():
    words = ["", "a", "Zürich", "東京", "🚄x", ""]
    col = StringColumn.from_strings(words)
    assert len(col) == 6 and list(col) == words and col == words and words == col and col == tuple(words)
    assert col != words[:-1] and col != ["x"] * 6 and col != "abc"
    assert [col[i] for i in range(-6, 6)] == words + words
    with pytest.raises(IndexError):
        col[6]
    with pytest.raises(TypeError, match="integers or slices"):
        col["a"]
    assert isinstance(col[1:4], StringColumn) and col[1:4] == words[1:4] and col[4:1] == []
    assert col[::2] == words[::2] and col[::-1] == words[::-1]
    assert "東京" in col and "Tokyo" not in col and col.index("Zürich") == 2 and col.count("") == 2
    assert col[2:4][1] == "東京" and list(col[2:4]) == ["Zürich", "東京"]  # a slice shares the blob
    assert col.nbytes == sum(len(w.encode()) for w in words)
    back = pickle.loads(pickle.dumps(col))
    assert type(back) is list and back == words
    assert "Zürich" in repr(col) and "n=6" in repr(col)
    with pytest.raises(TypeError):
        hash(col)
    empty = StringColumn.from_strings([])
    assert len(empty) == 0 and list(empty) == [] and empty == []


# -- lazy documents -------------------------------------------------------------------------------

def test_opened_documents_are_views_whose_strings_equal_the_eager_ones(tmp_path):
    eager = KnowledgeIndex(ENC)
    eager.add_documents(docs())
    eager.save(tmp_path / "idx")
    opened = KnowledgeIndex.open(tmp_path / "idx", ENC)
    assert all(e._graph is None for e in opened._docs.values())  # nothing per document is kept
    assert_same_index(opened, eager)
    for doc_id in eager.documents:
        a, b = eager.document(doc_id), opened.document(doc_id)
        assert a.title == b.title
        for col in STRING_COLUMNS:
            got = getattr(b, col)
            assert isinstance(got, StringColumn), col
            assert got == getattr(a, col) and list(got) == list(getattr(a, col)), (doc_id, col)
            assert [got[i] for i in range(len(got))] == list(getattr(a, col))
        for name in ("node_kind", "node_weight", "node_bbox", "node_edge", "node_image", "node_prov_offsets",
                     "node_prov", "edge_src", "edge_dst", "edge_kind", "edge_weight", "edge_prov_offsets", "edge_prov"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
        assert a.counts == {**b.counts, "errors": a.counts["errors"], "warnings": a.counts["warnings"]}
        # picklable: string columns travel as lists, arrays as copies
        c = pickle.loads(pickle.dumps(b))
        assert type(c.node_name) is list and c.node_name == a.node_name and c.edge_text == a.edge_text
        np.testing.assert_array_equal(c.edge_src, a.edge_src)
    # what consumers read through the index: descriptions, names in the merged graph, text views
    for v in range(opened.graph.n_nodes):
        assert opened.describe_node(v) == eager.describe_node(v)
    for e in range(opened.graph.n_edges):
        assert opened.describe_edge(e) == eager.describe_edge(e)
    assert list(opened.graph.node_names) == list(eager.graph.node_names)
    g = opened.document("unicode")
    assert "Zürich" in g.node_name and any("東京" in t for t in g.node_text)
    v = encode_document(g, ENC)
    w = encode_document(eager.document("unicode"), ENC)
    for store in w:
        np.testing.assert_array_equal(v[store].values.numpy(), w[store].values.numpy())


def test_read_documents_lists_what_the_parts_hold(tmp_path):
    idx = KnowledgeIndex.create(tmp_path / "idx", ENC)
    idx.add_documents(docs()[:3])
    idx.add_documents(docs()[3:])
    idx.remove_document("tokyo")
    listed = read_documents(tmp_path / "idx")
    assert [d["doc_id"] for d in listed] == idx.documents
    for d in listed:
        g = idx.document(d["doc_id"])
        assert d["number"] == idx.doc_number(d["doc_id"]) and d["part"] == idx._docs[d["doc_id"]].part
        assert (d["nodes"], d["edges"]) == (g.n_nodes, g.n_edges)
        assert d["counts"] == {k: g.counts[k] for k in d["counts"]}
    m = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert m["version"] == 3 and "documents" not in m
    assert m["totals"] == {"documents": len(idx), **{k: v for k, v in idx.counts.items() if not k.endswith("_vectors")
                                                     and k != "documents"}}


# -- commits ----------------------------------------------------------------------------------------

class FsyncCounter:
    """Counts os.fsync calls (instrumentation around the real call)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = os.fsync

        def counting(fd):
            self.calls += 1
            return real(fd)
        monkeypatch.setattr(os, "fsync", counting)


def test_an_add_fsyncs_a_constant_number_of_files(tmp_path, monkeypatch):
    idx = KnowledgeIndex.create(tmp_path / "idx", ENC)
    idx.add_documents(docs()[:2])
    counter = FsyncCounter(monkeypatch)
    seen = []
    for batch in ([city_doc(10)], [city_doc(i) for i in range(11, 31)], [unicode_doc()]):
        graphs = [build_document_graph(d) for d in batch]
        vectors = [encode_document(g, ENC) for g in graphs]
        stores_with_rows = {s for v in vectors for s, iv in v.items() if iv.values.shape[0]}
        before = counter.calls
        idx.add_documents(graphs, vectors)
        seen.append(counter.calls - before)
        # one per vector file that got rows, the part file, the parts folder, the manifest, the index folder
        assert seen[-1] == len(stores_with_rows) + 4, (seen, stores_with_rows)
    assert seen[0] == seen[1]  # 1 or 20 documents: the same fsyncs (format 2: one per array file, ~60)
    assert_same_index(KnowledgeIndex.open(tmp_path / "idx", ENC), idx)


def test_the_manifest_lists_parts_not_documents(tmp_path):
    one, many = tmp_path / "one", tmp_path / "many"
    KnowledgeIndex.create(one, ENC).add_documents([city_doc(0)])
    KnowledgeIndex.create(many, ENC).add_documents([city_doc(i) for i in range(40)])
    size_one, size_many = ((p / "manifest.json").stat().st_size for p in (one, many))
    assert abs(size_many - size_one) < 64  # only the counts' digits differ


def test_single_adds_keep_a_logarithmic_number_of_parts(tmp_path):
    path = tmp_path / "idx"
    idx = KnowledgeIndex.create(path, ENC)
    scratch = KnowledgeIndex(ENC)
    sizes = []
    for i in range(37):
        idx.add_document(city_doc(i))
        scratch.add_document(city_doc(i))
        docs_per_part = [e["documents"] for e in idx._parts.values()]
        assert sum(docs_per_part) == i + 1
        assert all(a > b for a, b in zip(docs_per_part, docs_per_part[1:]))  # a binary counter: sizes fall
        assert len(docs_per_part) <= (i + 1).bit_length()
        sizes.append((path / "manifest.json").stat().st_size)
        assert sorted(p.name for p in (path / "parts").iterdir()) == sorted(idx._parts)
    assert max(sizes) < 3 * min(sizes)  # bounded by the parts, not growing with 37 documents
    idx.remove_document("d5")
    scratch.remove_document("d5")
    idx.add_document(city_doc(99))
    scratch.add_document(city_doc(99))
    back = KnowledgeIndex.open(path, ENC, verify=True)  # merged parts' row checksums hold
    assert_same_index(back, scratch)
    assert_same_index(idx, scratch)
    assert [d["doc_id"] for d in read_documents(path)] == scratch.documents


def test_removal_and_growth_on_an_opened_index_whose_documents_are_mapped(tmp_path):
    path = tmp_path / "idx"
    KnowledgeIndex.create(path, ENC).add_documents(docs())
    scratch = KnowledgeIndex(ENC)
    scratch.add_documents(docs())
    back = KnowledgeIndex.open(path, ENC)
    assert all(e.source is not None for e in back._docs.values())
    back.remove_document("tokyo")       # its part's other documents are rewritten from the mapped part
    scratch.remove_document("tokyo")
    back.add_documents([city_doc(50), city_doc(51)])
    scratch.add_documents([city_doc(50), city_doc(51)])
    for idx in (back, KnowledgeIndex.open(path, ENC, verify=True)):
        assert_same_index(idx, scratch)


class Crash(Exception):
    pass


def test_a_crash_before_the_manifest_of_a_merging_add_keeps_the_previous_parts(tmp_path, monkeypatch):
    from colgraph_engine.kg.index import commit as index_commit
    path = tmp_path / "idx"
    idx = KnowledgeIndex.create(path, ENC)
    idx.add_document(city_doc(0))
    before = dict(idx._parts)

    def crash(*a, **k):
        raise Crash("power cut before the manifest")
    monkeypatch.setattr(index_commit, "_replace_file", crash)
    with pytest.raises(Crash):
        idx.add_document(city_doc(1))  # would absorb the one-document part
    monkeypatch.undo()
    assert idx._parts == before and {e.part for e in idx._docs.values()} == set(before)
    assert sorted(p.name for p in (path / "parts").iterdir()) == sorted(before)  # the merged part was removed
    idx.add_document(city_doc(1))
    scratch = KnowledgeIndex(ENC)
    scratch.add_documents([city_doc(0), city_doc(1)])
    assert [e["documents"] for e in idx._parts.values()] == [2]
    assert_same_index(KnowledgeIndex.open(path, ENC, verify=True), scratch)
