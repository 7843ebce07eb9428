"""Documents on the wire between a shard and the driver: a *bundle*, a few concatenated columns
for a whole list of documents instead of one object per document and array.

Why: the gather (and the stage-1 answer that ships the shard's top documents) carries ~10
documents per shard. As per-document objects (a :class:`DocumentGraph` with 14 arrays, and per
store a local-id array and an offsets array) that is ~150 small numpy arrays: pickling them cost
~2 ms per answer here and pushed a 10-document answer past Ray's 100 KiB inline limit (into the
object store: a few ms more). A bundle is ~30 arrays and a few string lists whatever the
document count (measured in ``benchmarks/results/ray_shards.md``).

Layout (``k`` documents, in the order asked for)::

    ids                           [k] str, every document
    refs                          {"paths": [p] str, "sha256": [p], "of": [k] int64 (the part file of
                                   each document sent as a PartRef, -1: its graph is packed below),
                                   "pos": [k] int64 its position in that part}
    titles                        [g] str, the g packed graphs (the rest of the layout: those only)
    n_nodes, n_edges              [g] int64
    node_kind ... node_image      node columns of all documents, concatenated ([sum n] rows)
    node_prov_len, node_prov      per node its provenance count, and the provenance, concatenated
    edge_src ... edge_weight      edge columns, concatenated ([sum m]; ids stay local)
    edge_prov_len, edge_prov      as for nodes
    node_name ... edge_text       per string column (blob [B] uint8, offsets [sum n + 1] int64): UTF-8,
                                  read back as StringColumn views (decoded only when read)
    extras                        {document: (issues, pixels)} for documents that have either
    stores                        {store: {"doc": [s] int64 document of each run (a run: one
                                   document's items in the store, documents ascending), "items": [s]
                                   items per run, "local": [I] int64 local ids, "lengths": [I] int64
                                   rows per item, and "values": [T, d] rows (disk dtype) or "path",
                                   "start": [s] first file row per run, "dim" (rows in the file)}}

:func:`unpack_documents` rebuilds every document exactly (same values and dtypes: the tests
compare each field); vector rows become ``numpy`` slices of the bundle, or :class:`FileRows`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..kg.document import DocumentGraph
from ..kg.strings import StringColumn
from .gather import FileRows

NODE_ARRAYS = ("node_kind", "node_weight", "node_bbox", "node_edge", "node_image")
EDGE_ARRAYS = ("edge_src", "edge_dst", "edge_kind", "edge_weight")
NODE_STRINGS = ("node_name", "node_type", "node_text", "node_source")
EDGE_STRINGS = ("edge_keywords", "edge_text")
PROVENANCE = ("node_prov", "edge_prov")  # CSR: <name>_offsets [n+1] int64 and <name> int32
_CARRIED = {"doc_id", "title", "issues", "pixels", *NODE_ARRAYS, *EDGE_ARRAYS, *NODE_STRINGS, *EDGE_STRINGS,
            *PROVENANCE, *(f"{p}_offsets" for p in PROVENANCE)}
_MISSING = {f.name for f in dataclasses.fields(DocumentGraph)} - _CARRIED
if _MISSING:  # a field added to DocumentGraph must be carried here, not dropped on the way
    raise ImportError(f"colgraph_engine.distributed.bundle: DocumentGraph fields {sorted(_MISSING)} are not carried")


@dataclass(frozen=True)
class PartRef:
    """A document's graph as it lies in a version-3 part file (:class:`~colgraph_engine.kg.parts.MappedPart`):
    the file's path as the shard sees it, its header's sha256 (from the shard's manifest: the
    reader checks it sees the same file) and the document's position in it."""
    path: str
    header_sha256: str | None
    pos: int
    doc_id: str


def pack_documents(docs: list, stores: dict[str, dict]) -> dict:
    """The bundle of `docs` (in that order: each a :class:`DocumentGraph`, packed here, or a
    :class:`PartRef`, sent as that reference) and their `stores` (the ``stores`` entry of the
    layout above, built by the sender: see :meth:`.shard.Shard.gather_documents`)."""
    paths: dict[tuple, int] = {}
    ref_of = np.asarray([paths.setdefault((d.path, d.header_sha256), len(paths)) if isinstance(d, PartRef) else -1
                         for d in docs], np.int64)
    graphs = [d for d in docs if not isinstance(d, PartRef)]
    out: dict = {"ids": [d.doc_id for d in docs], "titles": [g.title for g in graphs],
                 "refs": {"paths": [p for p, _ in paths], "sha256": [h for _, h in paths], "of": ref_of,
                          "pos": np.asarray([d.pos if isinstance(d, PartRef) else -1 for d in docs], np.int64)},
                 "n_nodes": np.asarray([g.n_nodes for g in graphs], np.int64),
                 "n_edges": np.asarray([g.n_edges for g in graphs], np.int64), "stores": stores}
    for name in NODE_ARRAYS + EDGE_ARRAYS + PROVENANCE:
        out[name] = np.concatenate([getattr(g, name) for g in graphs]) if graphs else np.zeros(0)
    for name in PROVENANCE:
        out[f"{name}_len"] = np.concatenate([np.diff(getattr(g, f"{name}_offsets")) for g in graphs]) if graphs \
            else np.zeros(0, np.int64)
    for name in NODE_STRINGS + EDGE_STRINGS:
        out[name] = _pack_strings([getattr(g, name) for g in graphs])
    out["extras"] = {i: (g.issues, g.pixels) for i, g in enumerate(graphs) if g.issues or g.pixels}
    return out


def _pack_strings(columns: list) -> tuple[np.ndarray, np.ndarray]:
    """``(blob [B] uint8, offsets [k+1] int64)``: the columns' strings one after another. A
    :class:`StringColumn` (a graph cut out of a mapped part) gives its UTF-8 bytes as they are,
    never decoded here."""
    blobs, lengths = [], []
    for col in columns:
        if isinstance(col, StringColumn):
            o = col._offsets  # noqa: SLF001 - the column's own bytes, no decode
            blobs.append(col._blob[int(o[0]):int(o[-1])] if o.size else np.zeros(0, np.uint8))  # noqa: SLF001
            lengths.append(np.diff(o))
        else:
            encoded = [s.encode("utf-8") for s in col]
            blobs.append(np.frombuffer(b"".join(encoded), np.uint8))
            lengths.append(np.asarray([len(b) for b in encoded], np.int64))
    offsets = np.zeros(sum(x.size for x in lengths) + 1, np.int64)
    if lengths:
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
    return (np.concatenate(blobs) if blobs else np.zeros(0, np.uint8)), offsets


def unpack_documents(bundle: dict, select: list[int] | None = None) -> list[tuple[DocumentGraph | PartRef, dict]]:
    """``[(graph, {store: (local [k] int64, rows, offsets [k+1] int64)})]`` from a bundle, in
    its order, or only its documents at positions `select` (in that order); graph a
    :class:`DocumentGraph` or a :class:`PartRef`; rows a ``[T, d]`` slice of the bundle's
    values or a :class:`FileRows`."""
    k = len(bundle["ids"])
    select = list(range(k)) if select is None else list(select)
    refs = bundle["refs"]
    packed_at = (np.cumsum(refs["of"] < 0) - 1).tolist()  # position among the packed graphs
    n, m = bundle["n_nodes"], bundle["n_edges"]
    node_at = np.concatenate([[0], np.cumsum(n)]).tolist()
    edge_at = np.concatenate([[0], np.cumsum(m)]).tolist()
    prov = {}
    for name, at in (("node_prov", node_at), ("edge_prov", edge_at)):
        lengths = bundle[f"{name}_len"]
        ends = np.concatenate([[0], np.cumsum(lengths)])
        prov[name] = (lengths, ends[at].tolist())
    strings = {name: bundle[name] for name in NODE_STRINGS + EDGE_STRINGS}
    graphs = []
    for at in select:
        if refs["of"][at] >= 0:
            j = int(refs["of"][at])
            graphs.append(PartRef(refs["paths"][j], refs["sha256"][j], int(refs["pos"][at]), bundle["ids"][at]))
            continue
        i = packed_at[at]
        a, b, c, d = node_at[i], node_at[i + 1], edge_at[i], edge_at[i + 1]
        cols = {name: bundle[name][a:b] for name in NODE_ARRAYS}
        cols.update({name: bundle[name][c:d] for name in EDGE_ARRAYS})
        cols.update({name: StringColumn(strings[name][0], strings[name][1][a:b + 1]) for name in NODE_STRINGS})
        cols.update({name: StringColumn(strings[name][0], strings[name][1][c:d + 1]) for name in EDGE_STRINGS})
        for name, (lo, hi) in (("node_prov", (a, b)), ("edge_prov", (c, d))):
            lengths, starts = prov[name]
            offsets = np.zeros(hi - lo + 1, np.int64)
            np.cumsum(lengths[lo:hi], out=offsets[1:])
            cols[f"{name}_offsets"] = offsets
            cols[name] = bundle[name][starts[i]:starts[i + 1]]
        issues, pixels = bundle["extras"].get(i, ([], {}))
        graphs.append(DocumentGraph(doc_id=bundle["ids"][at], title=bundle["titles"][i], issues=list(issues),
                                    pixels=dict(pixels), **cols))
    vectors: dict[int, dict] = {i: {} for i in select}
    for store, st in bundle["stores"].items():
        item_at = np.concatenate([[0], np.cumsum(st["items"])]).tolist()
        row_ends = np.concatenate([[0], np.cumsum(st["lengths"])])
        row_at = row_ends[item_at].tolist()
        for j, i in enumerate(st["doc"].tolist()):
            if i not in vectors:
                continue
            lo, hi = item_at[j], item_at[j + 1]
            offsets = row_ends[lo:hi + 1] - row_ends[lo]
            t = row_at[j + 1] - row_at[j]
            if "path" in st:
                start = int(st["start"][j])
                rows = FileRows(st["path"], start, start + t, int(st["dim"]))
            else:
                rows = st["values"][row_at[j]:row_at[j + 1]]
            vectors[i][store] = (st["local"][lo:hi], rows, offsets)
    return [(g, vectors[i]) for g, i in zip(graphs, select)]


def own_bundle(bundle: dict) -> dict:
    """`bundle` with private copies of its arrays: a view into Ray's answer buffer keeps the
    whole answer alive, so documents kept in a cache must not hold one."""
    def own(x):
        if isinstance(x, np.ndarray):
            return np.array(x)
        if isinstance(x, dict):
            return {k: own(v) for k, v in x.items()}
        if isinstance(x, tuple):
            return tuple(own(v) for v in x)
        return x
    return own(bundle)


__all__ = ["PartRef", "own_bundle", "pack_documents", "unpack_documents"]
