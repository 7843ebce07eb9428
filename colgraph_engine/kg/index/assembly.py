"""The in-memory assembly (:class:`_Assembler`, a private base of :class:`~.facade.KnowledgeIndex`):
one entry per document, the merged :class:`~colgraph_engine.graph.KnowledgeGraph` over all of them
(documents in insertion order, aliases across documents), grown in place by additions and
re-assembled after removals, and the uid lookups (``uid = doc_number << 32 | local_id``)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...graph.kinds import NodeKind
from ...graph.knowledge_graph import KnowledgeGraph, NodeNames, normalize_name
from ..document import DocumentGraph
from ..parts import MappedPart
from .format import UID_SHIFT


class _Entry:
    """A document in memory: its number, the part that holds it on disk, and its graph: held
    (added by this process, or read from a version-1/2 part) or, for a document of a mapped
    version-3 part (`source`, at position `pos`), cut out of the part's columns on each use, so
    an open index keeps no per-document arrays or strings."""

    __slots__ = ("number", "part", "_graph", "source", "pos")

    def __init__(self, number: int, part: str, graph: DocumentGraph | None = None, source: MappedPart | None = None,
                 pos: int = 0):
        self.number, self.part, self._graph, self.source, self.pos = number, part, graph, source, pos

    @property
    def graph(self) -> DocumentGraph:
        return self._graph if self._graph is not None else self.source.document(self.pos)

    def columns(self) -> tuple[DocumentGraph | MappedPart, int, int]:
        """``(columns, first node row, first edge row)``: where this document's node and edge
        attributes are read without building its graph (the held graph, or its part's
        part-level columns; provenance CSRs are part-level there too, local ids stay local)."""
        if self._graph is not None:
            return self._graph, 0, 0
        p = self.source
        return p, int(p.doc_nodes[self.pos]), int(p.doc_edges[self.pos])


class _Column:
    """A 1-D array that grows by appending, with spare capacity (doubling): a view of its first
    entries (:attr:`array`) stays valid and unchanged after later appends, and appending k
    entries costs O(k) amortised instead of a copy of the whole column."""

    def __init__(self, values: np.ndarray):
        self._buf = np.ascontiguousarray(values)
        self._n = self._buf.size

    def append(self, values: np.ndarray) -> None:
        need = self._n + values.size
        if need > self._buf.size:
            grown = np.empty(max(need, 2 * self._buf.size, 16), self._buf.dtype)
            grown[:self._n] = self._buf[:self._n]
            self._buf = grown
        self._buf[self._n:need] = values
        self._n = need

    @property
    def array(self) -> np.ndarray:
        return self._buf[:self._n]

    def last(self):
        return self._buf[self._n - 1]


@dataclass
class _Assembly:
    graph: KnowledgeGraph
    doc_ids: list[str]           # insertion order
    node_offsets: _Column        # [D+1]
    edge_offsets: _Column        # [D+1]
    node_uid: _Column            # [n] sorted (numbers and local ids both rise)
    edge_uid: _Column            # [m] sorted
    alias_of: _Column            # [n] int64 group (= first member's node id) or -1
    alias_keys: dict             # normalised entity name -> first member's node id


def make_uid(number: int | np.ndarray, local: np.ndarray) -> np.ndarray:
    return (np.asarray(number, np.int64) << UID_SHIFT) | np.asarray(local, np.int64)


_BLOCK_COLUMNS = ("node_kind", "node_weight", "edge_src", "edge_dst", "edge_kind", "edge_weight")


def _column_blocks(entries: list[_Entry]):
    """The columns the merged graph needs, for consecutive documents at a time: a run of one
    mapped part's consecutive documents gives one slice of each of the part's columns; a held
    graph gives its own. Yields dicts with ``n_nodes``/``n_edges``/``numbers`` (``[r]`` per
    document), the columns and ``names`` (node names, a sequence)."""
    i = 0
    while i < len(entries):
        e = entries[i]
        if e._graph is not None:
            g = e._graph
            yield {"n_nodes": [g.n_nodes], "n_edges": [g.n_edges], "numbers": [e.number], "names": g.node_name,
                   **{c: getattr(g, c) for c in _BLOCK_COLUMNS}}
            i += 1
            continue
        j = i + 1
        while j < len(entries) and entries[j]._graph is None and entries[j].source is e.source \
                and entries[j].pos == entries[j - 1].pos + 1:
            j += 1
        p, a, b = e.source, e.pos, entries[j - 1].pos + 1
        na, nb, ea, eb = int(p.doc_nodes[a]), int(p.doc_nodes[b]), int(p.doc_edges[a]), int(p.doc_edges[b])
        yield {"n_nodes": np.diff(p.doc_nodes[a:b + 1]), "n_edges": np.diff(p.doc_edges[a:b + 1]),
               "numbers": p.numbers[a:b], "names": p.node_name[na:nb],
               **{c: getattr(p, c)[na:nb] if c.startswith("node") else getattr(p, c)[ea:eb] for c in _BLOCK_COLUMNS}}
        i = j


def _extend_aliases(alias_of: _Column, keys: dict, node_kind: np.ndarray, names: list[str], first: int,
                    normalize=None) -> bool:
    """Alias entries for nodes ``first, first+1, ...`` (kinds `node_kind`, names `names`):
    entities with equal :func:`normalize_name` share a group whose id is the first member's node
    id (stable as nodes are appended, so a full re-assembly gives the same ids). `keys` maps a
    normalised name to its first member (a group of one has ``alias_of == -1`` there: one int
    per name, no per-group object). `normalize`: the key function (default the uncached
    :func:`normalize_name`). Returns whether any entry changed."""
    normalize = _normalize if normalize is None else normalize
    arr = alias_of._buf  # entries below alias_of's length; older ones change when a key gains its second member
    changed = False
    ent = np.flatnonzero(node_kind == NodeKind.ENTITY)
    # a NodeNames over mapped columns decodes the entity names in one pass per chunk
    ent_names = names.take(ent) if hasattr(names, "take") else [names[i] for i in ent.tolist()]
    for i, name in zip(ent.tolist(), ent_names):
        v = first + i
        key = normalize(name)
        head = keys.get(key)
        if head is None:
            keys[key] = v
            continue
        arr[head] = head  # (again) the group's id: its first member's
        arr[v] = head
        changed = True
    return changed


def _locate(a, offsets: np.ndarray, x, name: str) -> tuple[int, str, int]:
    """``(document position, doc id, local id)`` of graph node or edge `x`, given the merged
    graph's per-document `offsets` ``[D+1]``; ValueError naming `name` when out of range."""
    n = int(offsets[-1]) if offsets.size else 0
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or not 0 <= x < n:
        raise ValueError(f"{name}: expected a {name} id in [0, {n}), got {x!r}")
    d = int(np.searchsorted(offsets, x, side="right") - 1)
    return d, a.doc_ids[d], int(x - offsets[d])


def _lookup(sorted_uids: np.ndarray, uids, name: str) -> np.ndarray:
    if isinstance(uids, torch.Tensor):
        uids = uids.cpu().numpy()
    q = np.asarray(uids)
    if q.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integer ids, got dtype {q.dtype}")
    q = q.astype(np.int64).reshape(-1)
    pos = np.searchsorted(sorted_uids, q)
    pos_c = np.minimum(pos, max(sorted_uids.size - 1, 0))
    bad = (pos >= sorted_uids.size) | (sorted_uids[pos_c] != q) if sorted_uids.size else np.ones(q.size, bool)
    if bad.any():
        raise ValueError(f"{name}: id {int(q[bad][0])} names no item of the index")
    return pos.astype(np.int64)


class _Assembler:
    def _uids_of(self, entry: _Entry) -> dict[str, np.ndarray]:
        """Item ids this document holds in each store, ascending."""
        lo, hi = entry.number << UID_SHIFT, (entry.number + 1) << UID_SHIFT
        return {store: st.ids_between(lo, hi).cpu().numpy() for store, st in self.stores.items()}

    def _uids_of_many(self, entries: list[_Entry]) -> list[dict[str, np.ndarray]]:
        """:meth:`_uids_of` for many documents: one host copy of each store's live ids and two
        searches per store, instead of a range lookup per document and store."""
        lows = np.fromiter((e.number for e in entries), np.int64, len(entries)) << UID_SHIFT
        out = [{} for _ in entries]
        for store, st in self.stores.items():
            ids = st.live_ids()
            a, b = np.searchsorted(ids, lows).tolist(), np.searchsorted(ids, lows + (1 << UID_SHIFT)).tolist()
            for row, lo, hi in zip(out, a, b):
                row[store] = ids[lo:hi]
        return out

    def _item_ranges(self, store: str, uids: list[np.ndarray]) -> list[tuple[int, int] | None]:
        """:meth:`_item_range` of many documents' items in `store` (None for a document without
        items there), with one position lookup."""
        sizes = np.fromiter((u.size for u in uids), np.int64, len(uids))
        if not sizes.sum():
            return [None] * len(uids)
        pos = self.stores[store].positions(torch.from_numpy(np.concatenate(uids))).cpu().numpy()
        ends = np.cumsum(sizes)
        starts = ends - sizes
        out = []
        for lo, hi in zip(starts.tolist(), ends.tolist()):
            if lo == hi:
                out.append(None)
                continue
            first, last = int(pos[lo:hi].min()), int(pos[lo:hi].max()) + 1
            if last - first != hi - lo:
                raise RuntimeError(f"store {store!r}: a document's items are not contiguous")  # our invariant broke
            out.append((first, last))
        return out

    def _item_range(self, store: str, uids: np.ndarray) -> tuple[int, int]:
        """``[first, last)`` positions of a document's items in `store` (they are contiguous:
        items are appended and compacted by whole documents, in document order)."""
        pos = self.stores[store].positions(torch.from_numpy(uids))
        first, last = int(pos.min()), int(pos.max()) + 1
        if last - first != uids.size:
            raise RuntimeError(f"store {store!r}: a document's items are not contiguous")  # our invariant broke
        return first, last

    def _assemble(self) -> _Assembly:
        if self._assembly is None:
            self._assembly = self._reassemble()
        return self._assembly

    def _reassemble(self) -> _Assembly:
        """The merged graph built from every document at once (concatenated columns, one
        ``from_arrays``, aliases from every entity name): what each change cost before the
        graph grew in place, kept for removals and as the benchmark's baseline. Consecutive
        documents of one mapped part contribute the part's columns in one slice each."""
        blocks = list(_column_blocks(list(self._docs.values())))

        def cat(name, dtype):
            return np.concatenate([b[name] for b in blocks]).astype(dtype) if blocks else np.zeros(0, dtype)

        n_nodes, n_edges, numbers = cat("n_nodes", np.int64), cat("n_edges", np.int64), cat("numbers", np.int64)
        node_offsets = np.zeros(n_nodes.size + 1, np.int64)
        np.cumsum(n_nodes, out=node_offsets[1:])
        edge_offsets = np.zeros(n_edges.size + 1, np.int64)
        np.cumsum(n_edges, out=edge_offsets[1:])
        shift_nodes = np.repeat(node_offsets[:-1], n_edges)
        node_doc = np.repeat(numbers, n_nodes)
        local_nodes = np.arange(node_offsets[-1], dtype=np.int64) - np.repeat(node_offsets[:-1], n_nodes)
        local_edges = np.arange(edge_offsets[-1], dtype=np.int64) - np.repeat(edge_offsets[:-1], n_edges)
        names = NodeNames()  # the blocks' name columns as chunks: a mapped part's stay undecoded
        for b in blocks:
            names.extend(b["names"])
        node_kind = cat("node_kind", np.uint8)
        graph = KnowledgeGraph.from_arrays(
            node_kind, node_doc, cat("edge_src", np.int64) + shift_nodes,
            cat("edge_dst", np.int64) + shift_nodes, node_weight=cat("node_weight", np.float32),
            edge_kind=cat("edge_kind", np.uint8), edge_weight=cat("edge_weight", np.float32), node_names=names)
        alias_of, keys = _Column(np.full(len(names), -1, np.int64)), {}
        _extend_aliases(alias_of, keys, node_kind, names, 0, self._alias_key)
        graph.set_aliases(alias_of.array)
        return _Assembly(graph, list(self._docs), _Column(node_offsets), _Column(edge_offsets),
                         _Column(make_uid(node_doc, local_nodes)),
                         _Column(make_uid(np.repeat(numbers, n_edges), local_edges)),
                         alias_of, keys)

    @staticmethod
    def _append_to_assembly(a: _Assembly, docs: list[tuple[int, DocumentGraph]]) -> None:
        """Appends documents ``(number, graph)`` to an assembled merged graph in place: their
        nodes and edges (the native append: all their edges lie among their own new nodes),
        offsets, uids and alias entries for their entities only. The result equals
        :meth:`_reassemble` over all documents, array for array."""
        graph = a.graph
        first = graph.n_nodes
        graphs = [g for _, g in docs]
        n_nodes = np.asarray([g.n_nodes for g in graphs], np.int64)
        n_edges = np.asarray([g.n_edges for g in graphs], np.int64)
        numbers = np.asarray([number for number, _ in docs], np.int64)
        node_base = first + np.concatenate([[0], np.cumsum(n_nodes)[:-1]]).astype(np.int64)
        node_kind = np.concatenate([g.node_kind for g in graphs]).astype(np.uint8)
        names = [s for g in graphs for s in g.node_name]
        graph.add_nodes(node_kind, np.repeat(numbers, n_nodes), np.concatenate([g.node_weight for g in graphs]),
                        names=names)
        shift = np.repeat(node_base, n_edges)
        graph.add_edges(np.concatenate([g.edge_src for g in graphs]).astype(np.int64) + shift,
                        np.concatenate([g.edge_dst for g in graphs]).astype(np.int64) + shift,
                        np.concatenate([g.edge_kind for g in graphs]).astype(np.uint8),
                        np.concatenate([g.edge_weight for g in graphs]).astype(np.float32))
        a.doc_ids.extend(g.doc_id for g in graphs)
        a.node_offsets.append(a.node_offsets.last() + np.cumsum(n_nodes))
        a.edge_offsets.append(a.edge_offsets.last() + np.cumsum(n_edges))
        a.node_uid.append(make_uid(np.repeat(numbers, n_nodes), np.concatenate([np.arange(k) for k in n_nodes])))
        a.edge_uid.append(make_uid(np.repeat(numbers, n_edges), np.concatenate([np.arange(k) for k in n_edges])))
        a.alias_of.append(np.full(len(names), -1, np.int64))
        if _extend_aliases(a.alias_of, a.alias_keys, node_kind, names, first):
            graph.set_aliases(a.alias_of.array)


# normalize_name without its cache: the index normalises every entity name once per assembly, and
# a cache of up to 2^17 names would hold tens of MiB in a process that only serves the index
_normalize = getattr(normalize_name, "__wrapped__", normalize_name)
