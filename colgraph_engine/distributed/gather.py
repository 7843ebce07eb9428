"""Stages 2-7 on the gathered documents, and their results in global ids.

After the global stage 1, the recalled documents of a batch (the union over its queries) are
gathered in one place (graphs and vectors, from the shards that hold them) and added, **in the
global order**, to an in-memory :class:`~colgraph_engine.kg.KnowledgeIndex`: the *gathered
index*. The single-process pipeline then runs stages 2-7 on it with stage 1 given
(``Pipeline.retrieve_batch(encoded=, recall=)``). This is identical to running them on the whole
index because:

* stages 2-7 only read the Kd documents of each query (every graph call is restricted to them;
  visual candidates follow edges, and edges never leave a document);
* the gathered index numbers nodes and edges in the same relative order as the global index
  (documents in global order, each document's local ids kept), so every tie broken by node or
  edge id breaks the same way;
* alias groups are the same partition restricted to the gathered documents (equal normalised
  entity names), which is all the query-time merge uses (the native expansion admits only the
  members inside the query's documents; group ids serve as keys only);
* item vectors arrive in the index dtype unchanged, and every score of stages 2-7 is computed per
  (query, item) pair.

:func:`to_global` then maps every node and edge id of a result to the global index's id:
``global = node_first[document's global position] + local id`` (same for edges), from the shard
map's per-document counts. Document ids, names, scores and texts need no mapping; the context's
source ids are mapped in place (an id's digits count as one token, so budgets are unchanged).
"""
from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from ..graph.knowledge_graph import normalize_name
from ..kg.index import KnowledgeIndex, make_uid
from ..kg.parts import StoredDocument
from ..kg.vectors import STORES, Encoders, ItemVectors
from ..pipeline.pipeline import Result
from ..store.packed_store import _DISK_NP, PackedStore


@dataclass(frozen=True)
class FileRows:
    """Rows ``[start, stop)`` of a shard's vector file: raw ``[T, dim]`` rows in the index's
    disk dtype (float32, float16, or bfloat16 as int16 bits), at `path` as the shard sees it.
    A vector file is append-only and its name carries a random tag (see :mod:`colgraph_engine.kg.index`):
    its committed rows never change under one name, so a reference stays valid for the file's life."""
    path: str
    start: int
    stop: int
    dim: int


class RowFiles:
    """The driver's read-only mappings of shard vector files, the `capacity` most recently used
    kept open, and one per store of a shard: a removal on a shard writes the store's rows to a new
    file and deletes the old one, whose disk space a mapping would hold, so mapping the new file
    drops the old one (slices handed out keep theirs alive until dropped). :meth:`rows` raises
    ``OSError`` (file missing or unreadable here) or ``ValueError`` (shorter than the rows asked
    for): the caller then fetches the bytes instead."""

    def __init__(self, capacity: int = 64):
        self.capacity = capacity
        self._maps: OrderedDict[str, np.ndarray] = OrderedDict()

    def rows(self, ref: FileRows, dtype: torch.dtype) -> np.ndarray:
        """``[stop - start, dim]`` rows of `ref` (a read-only view of the mapping, in the disk dtype)."""
        if ref.stop == ref.start:  # nothing to read (an empty file cannot be mapped)
            return np.zeros((0, ref.dim), _DISK_NP[dtype])
        m = self._maps.get(ref.path)
        if m is None or m.shape[0] < ref.stop:  # unseen, or appended to since it was mapped
            disk = np.dtype(_DISK_NP[dtype])
            n = os.stat(ref.path).st_size // (ref.dim * disk.itemsize)
            if n < ref.stop:
                raise ValueError(f"{ref.path}: holds {n} rows here, the shard named rows up to {ref.stop}")
            # a plain ndarray over the mapping (it keeps the memmap alive): slicing a np.memmap
            # runs its Python __array_finalize__, ~3 us per slice, and a query slices ~70 runs
            m = np.asarray(np.memmap(ref.path, dtype=disk, mode="r", shape=(n, ref.dim)))
            folder, store = os.path.split(ref.path)
            store = store.split(".", 1)[0]
            for old in [p for p in self._maps if p != ref.path and os.path.split(p)[0] == folder
                        and os.path.split(p)[1].split(".", 1)[0] == store]:
                del self._maps[old]
            self._maps[ref.path] = m
        self._maps.move_to_end(ref.path)
        while len(self._maps) > self.capacity:
            self._maps.popitem(last=False)  # slices handed out keep their mapping alive
        return m[ref.start:ref.stop]


    def rows_many(self, refs: list[FileRows], dtype: torch.dtype, copy: bool = True) -> list[np.ndarray]:
        """The rows of every ref (in order). `copy`: as arrays of their own (the runs of one file
        read with one concatenation and handed out as slices of it), else as views of the
        mappings (for a caller that copies them at once anyway)."""
        if not copy:
            return [self.rows(r, dtype) for r in refs]
        out: list = [None] * len(refs)
        by_path: dict[str, list[int]] = {}
        for i, r in enumerate(refs):
            by_path.setdefault(r.path, []).append(i)
        for path, at in by_path.items():
            parts = [self.rows(refs[i], dtype) for i in at]
            block = np.concatenate(parts) if len(parts) > 1 else np.array(parts[0])
            ends = np.cumsum([p.shape[0] for p in parts]).tolist()
            for i, a, b in zip(at, [0] + ends[:-1], ends):
                out[i] = block[a:b]
        return out


def item_vectors(vectors: dict, dtype: torch.dtype) -> dict[str, ItemVectors]:
    """``{store: ItemVectors}`` from a shard's ``{store: (local, values, offsets)}`` numpy arrays
    (:meth:`.shard.Shard.stored_documents`); bfloat16 values arrive as their int16 bits."""
    out = {}
    for store, (local, values, offsets) in vectors.items():
        v = torch.from_numpy(np.require(values, requirements="W"))  # a private copy when Ray handed a read-only view
        out[store] = ItemVectors(local, v.view(torch.bfloat16) if dtype == torch.bfloat16 else v,
                                 torch.from_numpy(np.require(offsets, requirements="W")))
    return out


class _GatheredIndex(KnowledgeIndex):
    """An in-memory index of documents taken from committed shard indexes, filled once
    (:func:`gathered_index`): their vectors were validated (shapes, ids, finite values) when
    first added to a shard, so they are not checked again, and each store is one concatenation
    of the documents' rows wrapped as it is (``PackedStore._wrap_trusted``) rather than appended
    per document. Built for every query whose document set is new, so its fixed costs count:
    no empty store is made only to be replaced, and entity names are normalised through the
    cached :func:`normalize_name` (the same documents come back query after query)."""

    _alias_key = staticmethod(normalize_name)

    def __init__(self, encoders: Encoders, dtype: torch.dtype):
        super().__init__(None, dtype=dtype, dims={})
        self._layouts: dict[str, tuple] = {}  # store -> (doc, local, graph id) per slot, from the fill
        self._filled_at = -1
        described = encoders.describe()
        self.encoders, self.encoder_info = encoders, described
        self.dims = {s: described[role]["dim"] for s, (role, _) in STORES.items() if described[role] is not None}

    def store_layout(self, store: str):
        """The slots' documents, local ids and graph ids, known from the fill: a gathered
        document ``i`` has number ``i`` and its nodes (edges) follow those of documents ``< i``
        with their local ids kept, so a slot's graph id is ``first[doc] + local``."""
        return self._layouts.get(store) if self.version == self._filled_at else None

    def _fill(self, docs: list[tuple]) -> None:
        # graphs, entries and counts as add_documents puts them (no stores yet), then the stores
        self._apply_add([StoredDocument(i, g, {}) for i, (g, _) in enumerate(docs)], [""] * len(docs), {})
        disk = _DISK_NP[self.dtype]
        first = {kind: np.concatenate([[0], np.cumsum([getattr(g, kind) for g, _ in docs])]).astype(np.int64)
                 for kind in ("n_nodes", "n_edges")}
        self._layouts, self._filled_at = {}, self.version
        for store, dim in self.dims.items():
            pieces = [(i, v[store]) for i, (_, v) in enumerate(docs) if store in v]
            if not pieces:
                values, offsets, uids = np.zeros((0, dim), disk), np.zeros(1, np.int64), np.zeros(0, np.int64)
                self._layouts[store] = (uids, uids, uids)
            else:
                values = np.concatenate([rows for _, (_, rows, _) in pieces])  # one copy: its own rows
                # every document's offsets [k+1] end to end: one diff, less the steps between documents
                ends = np.concatenate([off for _, (_, _, off) in pieces])
                sizes = np.asarray([off.size for _, (_, _, off) in pieces])
                lengths = np.delete(np.diff(ends), np.cumsum(sizes)[:-1] - 1)
                offsets = np.zeros(lengths.size + 1, np.int64)
                np.cumsum(lengths, out=offsets[1:])
                doc = np.repeat(np.asarray([i for i, _ in pieces], np.int64), sizes - 1)
                local = np.concatenate([local for _, (local, _, _) in pieces]).astype(np.int64, copy=False)
                uids = make_uid(doc, local)
                firsts = first["n_edges" if store == "relation" else "n_nodes"]
                self._layouts[store] = (doc, local, firsts[doc] + local)
            values = torch.from_numpy(values)
            if self.dtype == torch.bfloat16:
                values = values.view(torch.bfloat16)
            if uids.size > 1 and not bool((uids[1:] > uids[:-1]).all()):  # a shard keeps local ids ascending
                self.stores[store] = PackedStore.wrap(values, torch.from_numpy(offsets), torch.from_numpy(uids))
            else:
                self.stores[store] = PackedStore._wrap_trusted(values, offsets, uids)


def gathered_index(encoders: Encoders, dtype: torch.dtype, docs: list[tuple]) -> KnowledgeIndex:
    """An in-memory index of ``docs = [(graph, {store: (local [k] int64, rows [T, d], offsets
    [k+1] int64)})]``, already in global order; ``rows`` numpy in the index's disk dtype
    (bfloat16 as int16 bits), as a bundle carries them (:func:`.bundle.unpack_documents`) or
    :class:`RowFiles` reads them. Document ``i`` gets number ``i``, its items the uids
    ``(i, local)``: the stores and graph ``add_documents`` would build from the same documents."""
    index = _GatheredIndex(encoders, dtype=dtype)
    if docs:
        index._fill(docs)
    return index


class IdMap:
    """Gathered-index node and edge ids -> global ids.

    Args:
        index: the gathered index.
        positions: ``[k]`` global position of each gathered document, in the gathered order
            (ascending).
        node_first, edge_first: the global order's first node / edge id per position.
    """

    def __init__(self, index: KnowledgeIndex, positions: np.ndarray, node_first: np.ndarray, edge_first: np.ndarray):
        g = index.graph
        node_doc = g.node_doc  # gathered document numbers are 0..k-1 in gathered order
        n_nodes = np.bincount(node_doc, minlength=positions.size).astype(np.int64)
        local_first = np.concatenate([[0], np.cumsum(n_nodes)[:-1]]).astype(np.int64)
        self.node_delta = node_first[positions] - local_first  # [k]
        self.node_doc = node_doc
        src, _ = g.edges()
        edge_doc = node_doc[src]
        n_edges = np.bincount(edge_doc, minlength=positions.size).astype(np.int64)
        edge_local_first = np.concatenate([[0], np.cumsum(n_edges)[:-1]]).astype(np.int64)
        self.edge_delta = edge_first[positions] - edge_local_first
        self.edge_doc = edge_doc

    def nodes(self, v):
        a = np.asarray(v, np.int64)
        return a + self.node_delta[self.node_doc[a]] if a.size else a.copy()

    def edges(self, e):
        a = np.asarray(e, np.int64)
        return a + self.edge_delta[self.edge_doc[a]] if a.size else a.copy()

    def node(self, v: int) -> int:
        return int(v) + int(self.node_delta[self.node_doc[int(v)]])

    def edge(self, e: int) -> int:
        return int(e) if e < 0 else int(e) + int(self.edge_delta[self.edge_doc[int(e)]])


def to_global(r: Result, ids: IdMap) -> Result:
    """Rewrites `r`'s node and edge ids (in place) from the gathered index's to the global ones."""
    r.subgraph_nodes = ids.nodes(r.subgraph_nodes)
    for h in r.images:
        h.node = ids.node(h.node)
    ev = r.evidence
    for e in ev.entities:
        e["node"] = ids.node(e["node"])
    for rel in ev.relations:
        rel["edge"], rel["src"], rel["dst"] = ids.edge(rel["edge"]), ids.node(rel["src"]), ids.node(rel["dst"])
    for s in ev.sources:
        s["node"] = ids.node(s["node"])
    ev.records = [type(rec)(**{**rec.__dict__, "nodes": tuple(ids.node(v) for v in rec.nodes),
                               "edge": ids.edge(rec.edge)}) for rec in ev.records]
    ev.ge_nodes, ev.ge_edges = ids.nodes(ev.ge_nodes), ids.edges(ev.ge_edges)
    ev.gstar_nodes, ev.gstar_edges = ids.nodes(ev.gstar_nodes), ids.edges(ev.gstar_edges)
    for row in r.context.sources:
        row["id"] = ids.node(row["id"])
    return r


__all__ = ["FileRows", "IdMap", "RowFiles", "gathered_index", "item_vectors", "to_global"]
