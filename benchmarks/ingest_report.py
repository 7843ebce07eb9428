"""Ingest benchmark: extraction records -> per-document graphs -> committed index, encoders excluded.

Usage (from the repository root)::

    .venv/bin/python benchmarks/ingest_report.py                 # 100 documents x 20 segments
    .venv/bin/python benchmarks/ingest_report.py --docs 20 --segments 10 --repeats 1

Inputs (``_ingest_impls.corpus``): documents with pre-extracted records (LightRAG's line format,
as a model would return them), one image per document with a scene graph and region matches,
and vectors precomputed by the offline encoders (text d=128, one token vector per word, pixel
patches not needed: images come without pixels). Rows, each over the whole corpus:

* ours, committed: parse + build every document graph, ``KnowledgeIndex.create`` in a fresh
  folder, ``add_documents`` (stores filled, one part written with checksums and fsync, manifest
  committed), then the merged graph assembled (``index.graph``: igraph topology and aliases);
* ours, in memory: the same without a directory;
* stage rows: parse + build alone, and add + commit + assemble alone;
* peer: LightRAG-style upsert of the same records into one NetworkX graph, and the same followed
  by a GraphML write (what LightRAG persists after an insert).

Before timing, the built graphs are checked: entity and relation counts per document equal the
distinct normalised names / unordered pairs in the records. Each row runs ``--repeats`` times;
the rows are timed interleaved (``_harness.paired``) and the median is reported as segments per
second, with ratio = row rate / peer rate. ``--quick``: 10 documents, 1 call per row.
Writes ``results/ingest.md``, ``.json`` and ``.png`` beside this file (or under ``--out``).
"""
from __future__ import annotations

import pathlib
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import networkx as nx  # noqa: E402
from tqdm import tqdm  # noqa: E402

import _harness as h  # noqa: E402
import _ingest_impls as ii  # noqa: E402
from colgraph_engine.graph import EdgeKind, NodeKind  # noqa: E402
from colgraph_engine.kg import (  # noqa: E402
    Encoders, KnowledgeIndex, build_document_graph, encode_document, parse_extraction,
)

HERE = pathlib.Path(__file__).resolve().parent
PEER = "NetworkX upsert (LightRAG-style), memory"


def parse_args(argv=None):
    ap = h.parser(__doc__)
    ap.add_argument("--docs", type=int, default=100)
    ap.add_argument("--segments", type=int, default=20)
    ap.add_argument("--words", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    if args.quick:
        args.docs, args.repeats = 10, 1
    return args


def check_graphs(docs, graphs) -> None:
    for doc, g in zip(docs, graphs):
        keys, pairs = set(), set()
        for text in doc.extractions:
            p = parse_extraction(text)
            keys |= {e.key for e in p.entities} | {r.source_key for r in p.relations} | {r.target_key for r in p.relations}
            pairs |= {frozenset((r.source_key, r.target_key)) for r in p.relations}
        got = (len(g.nodes_of(NodeKind.ENTITY)), len(g.edges_of(EdgeKind.RELATION)))
        if got != (len(keys), len(pairs)):
            raise SystemExit(f"{doc.doc_id}: built {got} entities/relations, records have {(len(keys), len(pairs))}")


def main(argv=None) -> int:
    args = parse_args(argv)
    print("generating corpus and extraction records ...", flush=True)
    docs = ii.corpus(args.docs, args.segments, args.words)
    n_segments = args.docs * args.segments
    encoders = Encoders.offline(text_dim=128)
    graphs = [build_document_graph(d) for d in tqdm(docs, desc="reference build")]
    check_graphs(docs, graphs)
    vectors = [encode_document(g, encoders) for g in tqdm(graphs, desc="precomputing vectors (not timed)")]
    records = sum(len(parse_extraction(t).entities) + len(parse_extraction(t).relations)
                  for d in docs for t in d.extractions)
    work = pathlib.Path(tempfile.mkdtemp(prefix="colgraph-ingest-"))

    def ours(committed: bool):
        def run():
            built = [build_document_graph(d) for d in docs]
            if committed:
                shutil.rmtree(work / "idx", ignore_errors=True)
                idx = KnowledgeIndex.create(work / "idx", encoders)
            else:
                idx = KnowledgeIndex(encoders)
            idx.add_documents(built, vectors)
            return idx.graph
        return run

    def add_only():
        shutil.rmtree(work / "idx", ignore_errors=True)
        idx = KnowledgeIndex.create(work / "idx", encoders)
        idx.add_documents(graphs, vectors)
        return idx.graph

    def peer_graphml():
        g = ii.networkx_upsert(docs)
        nx.write_graphml(g, work / "graph.graphml")
        return g

    rows = {
        "ours: parse + build + index (committed to disk)": ours(True),
        "ours: parse + build + index (in memory)": ours(False),
        "ours stage: parse + build": lambda: [build_document_graph(d) for d in docs],
        "ours stage: index add + commit + assemble": add_only,
        PEER: lambda: ii.networkx_upsert(docs),
        "NetworkX upsert + GraphML write": peer_graphml,
    }
    times = {name: statistics.median(s) for name, s in h.paired(rows, args.repeats, warmup=0).items()}
    final = KnowledgeIndex.open(work / "idx")
    disk = sum(f.stat().st_size for f in (work / "idx").rglob("*") if f.is_file())
    shutil.rmtree(work, ignore_errors=True)

    peer_rate = n_segments / times[PEER]
    table = [{"row": name, "seconds": t, "segments_per_s": n_segments / t, "ratio_vs_peer": n_segments / t / peer_rate}
             for name, t in times.items()]
    counts = final.counts
    body = [
        f"Corpus: {args.docs} documents x {args.segments} segments x ~{args.words} words = {n_segments} segments, "
        f"{records} extraction records, {args.docs} images with 4-object scene graphs and matches. "
        f"Index: {counts['entities']} entities, {counts['relations']} relations, {counts['regions']} regions, "
        f"{counts['nodes']} nodes, {counts['edges']} edges, {disk / 2**20:.1f} MiB on disk "
        f"(fp32 vectors: {counts['segment_vectors']} segment multi-vectors, d 128). Median of {args.repeats}.", "",
        *h.table([("row", "row"), ("seconds:", lambda r: f"{r['seconds']:.3f}"),
                  ("segments/s:", lambda r: f"{r['segments_per_s']:,.0f}"),
                  ("vs NetworkX upsert:", lambda r: f"{r['ratio_vs_peer']:.2f}x")], table),
        "", "Target: >= 1,000 segments/s for ours, committed (issue 4). The peer builds one merged graph in "
        "memory and stores no vectors; ours keeps documents apart, fills six stores, writes checksummed "
        "files with fsync and assembles the igraph topology."]
    stem = h.stem("ingest", args)
    out = h.write(stem, "Ingest: extraction records -> per-document graphs -> index (encoders excluded)", body,
                  {"args": {k: str(v) for k, v in vars(args).items()}, "counts": counts, "disk_bytes": disk,
                   "rows": table}, args.out)
    if out is not None:
        h.bar_plot(out / f"{stem}.png", ["segments per second (higher is better; target 1,000)"],
                   {r["row"]: {"segments per second (higher is better; target 1,000)": r["segments_per_s"]} for r in table},
                   ylabel="segments / s", title=f"Ingest, {n_segments} segments", labels="{:,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
