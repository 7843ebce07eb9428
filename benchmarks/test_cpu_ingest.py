"""Ingest of extraction records into a committed knowledge index vs the LightRAG-style NetworkX
upsert, same records, encoders excluded (vectors precomputed).

Run::

    .venv/bin/python -m pytest benchmarks/test_cpu_ingest.py --benchmark-only -q

Corpus: 40 documents x 10 segments (``_ingest_impls.corpus``). One benchmark group, so
pytest-benchmark's table shows each row relative to the fastest. Before timing, our built
graph's entity and relation counts are checked against the records. The full report with
segments per second and a plot is ``ingest_report.py``.
"""
import functools
import shutil

import pytest

import _ingest_impls as ii
from colgraph_engine.graph import EdgeKind, NodeKind
from colgraph_engine.kg import Encoders, KnowledgeIndex, build_document_graph, encode_document, parse_extraction

N_DOCS, N_SEGMENTS = 40, 10


@functools.lru_cache(maxsize=1)
def _inputs():
    docs = ii.corpus(N_DOCS, N_SEGMENTS)
    enc = Encoders.offline()
    graphs = [build_document_graph(d) for d in docs]
    for doc, g in zip(docs, graphs):
        parsed = [parse_extraction(t) for t in doc.extractions]
        pairs = {frozenset((r.source_key, r.target_key)) for p in parsed for r in p.relations}
        assert len(g.edges_of(EdgeKind.RELATION)) == len(pairs)
        assert len(g.nodes_of(NodeKind.ENTITY)) > 0
    return docs, enc, [encode_document(g, enc) for g in graphs]


@pytest.mark.benchmark(group="ingest 400 segments")
def test_ours_committed(benchmark, tmp_path):
    docs, enc, vectors = _inputs()

    def run():
        shutil.rmtree(tmp_path / "idx", ignore_errors=True)
        idx = KnowledgeIndex.create(tmp_path / "idx", enc)
        idx.add_documents([build_document_graph(d) for d in docs], vectors)
        return idx.graph

    g = benchmark(run)
    assert g.n_nodes == sum(KnowledgeIndex.open(tmp_path / "idx").document(d.doc_id).n_nodes for d in docs)


@pytest.mark.benchmark(group="ingest 400 segments")
def test_networkx_upsert(benchmark):
    docs, _, _ = _inputs()
    g = benchmark(ii.networkx_upsert, docs)
    assert g.number_of_nodes() > 0
