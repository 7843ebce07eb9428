"""Knowledge-graph demo: build a persisted multimodal index from the bundled demo documents,
list its directory, reopen it, and answer a question by entity retrieval plus graph expansion.

    colgraph-kg-demo [--out DIR] [--question "Where can you see Mount Fuji from the train?"]

Runs offline: records for the first document were extracted beforehand; the others go through
the default co-occurrence extractor; vectors come from the offline hashing and pixel encoders.
"""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch

from ..graph import NodeKind
from ..kg import Encoders, KnowledgeIndex
from .kg_data import demo_documents


def listing(root: Path) -> list[str]:
    """``ls -R``-style lines with sizes, sorted, relative to `root`."""
    lines = []
    for folder, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        rel = Path(folder).relative_to(root)
        depth = 0 if str(rel) == "." else len(rel.parts)
        if depth:
            lines.append(f"{'  ' * (depth - 1)}{rel.name}/")
        for f in sorted(files):
            lines.append(f"{'  ' * depth}{f}  {Path(folder, f).stat().st_size:,} B")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="index directory (default: a temporary one)")
    ap.add_argument("--question", default="Where can you see Mount Fuji from the Shinkansen?")
    ap.add_argument("--k", type=int, default=3)
    args = ap.parse_args(argv)
    tmp = None
    if args.out is None:
        tmp = tempfile.TemporaryDirectory()
        args.out = Path(tmp.name) / "demo-index"
    encoders = Encoders.offline()
    print("encoders: hashing (feature hashing text, raw pixel patches; no model): "
          + ", ".join(f"{r}={e['name']}" for r, e in encoders.describe().items() if e))
    index = KnowledgeIndex.create(args.out, encoders, overwrite=True)
    graphs = index.add_documents(demo_documents(), progress=True)
    for g in graphs:
        c = g.counts
        print(f"{g.doc_id:<14} segments {c['segments']}  entities {c['entities']:>2}  relations {c['relations']:>2}  "
              f"images {c['images']}  regions {c['regions']}  tables {c['tables']}  nodes {c['nodes']:>2}  "
              f"edges {c['edges']:>2}  errors {c['errors']}  warnings {c['warnings']}")
        for issue in g.issues:
            print(f"    {issue}")
    print(f"\nindex directory {args.out}:")
    print("\n".join("  " + line for line in listing(args.out)))

    index = KnowledgeIndex.open(args.out, encoders)
    print(f"\nreopened: {index}, counts {index.counts}")
    graph = index.graph
    q = encoders.text([args.question])
    scores, uids = index.stores["entity"].search(q, torch.tensor([0, 1]), k=args.k)
    seeds = index.nodes_of_uids(uids[0])
    print(f"\nquestion: {args.question}")
    for s, v in zip(scores[0].tolist(), seeds.tolist()):
        d = index.describe_node(v)
        print(f"  seed {d['name']!r} ({d['doc_id']}), score {s:.3f}")
    out = graph.expand([seeds.tolist()], hops=1, merge_aliases=True, min_keep=0, threshold=-1.0)[0]
    kinds = graph.node_kind[out.nodes]
    print(f"1-hop expansion: {out.nodes.size} nodes, {out.edges.size} induced edges")
    for v, hop in zip(out.nodes.tolist(), out.hop.tolist()):
        d = index.describe_node(v)
        if d["kind"] in ("image", "region"):
            box = tuple(round(x, 3) for x in d["bbox"])
            print(f"  hop {hop}: {d['kind']} {d['name']!r} of {d['doc_id']} bbox {box}: {d['text']!r}")
    print(f"  (+ {int((kinds == NodeKind.ENTITY).sum())} entities, {int((kinds == NodeKind.SEGMENT).sum())} segments)")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
