"""A read-only view of a :class:`~colgraph_engine.kg.KnowledgeIndex` shaped for the query path:
per-node and per-edge arrays of the merged graph, document number lookups, and the positions of
each document's items in every store. Built once per change of the index (``index.version``:
the merged graph grows in place when documents are added, and is re-assembled after a removal;
the view follows)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from ..graph.kinds import EDGE, NodeKind
from ..kg.index import UID_SHIFT, KnowledgeIndex


@dataclass
class StoreView:
    """One store's items: ``doc [N]`` document number of each slot, ``local [N]`` its local node
    (or edge) id, ``node [N]`` its graph node (or edge) id, and the slots of each document as
    ``first_slot [D+1]`` over the sorted document numbers ``numbers [D]`` (a document's items
    are contiguous in a store: the index appends and compacts them together)."""
    name: str
    doc: np.ndarray
    local: np.ndarray
    node: np.ndarray
    numbers: np.ndarray
    first_slot: np.ndarray

    def slots_of(self, numbers: np.ndarray) -> np.ndarray:
        """Store slots ``[k]`` of the documents `numbers` (ascending per document, in the given
        document order)."""
        at = np.searchsorted(self.numbers, numbers)
        at = at[(at < self.numbers.size) & (self.numbers[np.minimum(at, max(self.numbers.size - 1, 0))] == numbers)] \
            if self.numbers.size else np.zeros(0, np.int64)
        lo, hi = self.first_slot[at], self.first_slot[at + 1]
        if not lo.size:
            return np.zeros(0, np.int64)
        lens = hi - lo
        return np.repeat(lo - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens) + np.arange(int(lens.sum()))


@dataclass(frozen=True)
class Vectors:
    """One store's contents as the query path reads them: a single snapshot (values, offsets,
    ids, alive taken together, so a concurrent writer can never mix versions), on one device."""
    values: torch.Tensor   # [T, d]
    offsets: torch.Tensor  # [N+1] int64
    ids: torch.Tensor      # [N] int64
    alive: torch.Tensor    # [N] bool

    @classmethod
    def of(cls, store, device) -> Vectors:
        snap = store.snapshot()
        return cls(*(t.to(device) for t in (snap.values, snap.offsets, snap.ids, snap.alive)))

    n_slots = property(lambda self: int(self.ids.numel()))

    @cached_property
    def pooled(self) -> torch.Tensor:
        """``[N, d]`` float32 pooled vector of every slot (``normalize(mean_j normalize(x_j))``,
        :func:`~colgraph_engine.ops.reference.pooled_vectors`), on the store's device. Pooled once
        per snapshot: the pooled ranker scores against these rather than re-pooling the store's
        tokens on every call."""
        from ..ops import reference
        return reference.pooled_vectors(self.values, self.offsets)

    @cached_property
    def norms(self) -> np.ndarray:
        """``[N]`` float32 mean L2 norm of each slot's vectors (:func:`item_norms`: the
        norm of a one-vector item), computed once per snapshot: the seeds stage's cosines divide by
        these rather than recomputing them over the whole store for every batch."""
        return item_norms(self)

    dtype = property(lambda self: self.values.dtype)
    device = property(lambda self: self.values.device)
    dim = property(lambda self: int(self.values.shape[1]))


def item_norms(store: Vectors) -> np.ndarray:
    """``[N]`` L2 norm of each item of a one-vector-per-item store (0 for an empty item)."""
    v = store.values.float()
    norms = torch.zeros(store.n_slots)
    if v.shape[0]:
        lengths = store.offsets.diff()
        owner = torch.repeat_interleave(torch.arange(store.n_slots), lengths.cpu())
        norms.index_add_(0, owner, v.norm(dim=1).cpu())
        norms = norms / lengths.clamp(min=1).cpu()
    return norms.numpy()


class IndexView:
    """Arrays of the merged graph and its stores, for one assembled graph of `index`.
    ``vectors`` are one snapshot of each of the index's stores on `device`."""

    def __init__(self, index: KnowledgeIndex, device: str | torch.device = "cpu"):
        self.index = index
        self.version = index.version  # the index's change count this view was built at
        self.vectors = {name: Vectors.of(st, device) for name, st in index.stores.items()}
        self.graph = index.graph
        g = self.graph
        self.node_kind = g.node_kind
        self.node_doc = g.node_doc
        self.edge_src, self.edge_dst = g.edges()
        self.edge_kind = g.edge_kind
        self.edge_weight = g.edge_weight
        self.alias_of = g.alias_of
        self.node_uid = index.node_uid()
        self.doc_ids = index.documents
        self.numbers = np.asarray([index.doc_number(d) for d in self.doc_ids], np.int64)  # ascending
        self.doc_id_of = dict(zip(self.numbers.tolist(), self.doc_ids))
        self.node_first = np.searchsorted(self.node_doc, np.append(self.numbers, np.iinfo(np.int64).max))
        self.stores = {name: self._store_view(name, v) for name, v in self.vectors.items()}

    def _store_view(self, name, store: Vectors) -> StoreView:
        known = self.index.store_layout(name)
        if known is not None:  # doc ascending, every item alive and in the graph (see store_layout)
            doc, local, node = known
            first = np.flatnonzero(np.diff(doc, prepend=-1)) if doc.size else np.zeros(0, np.int64)
            return StoreView(name, doc, local, node, doc[first], np.append(first, doc.size).astype(np.int64))
        uids = store.ids.cpu().numpy()
        if not bool(store.alive.all()):
            raise ValueError(f"index store {name!r}: has deleted items (compact it first)")
        doc = uids >> UID_SHIFT
        local = uids & ((1 << UID_SHIFT) - 1)
        if doc.size and (np.diff(doc) < 0).any():
            raise ValueError(f"index store {name!r}: documents are not stored in order")
        node = np.full(uids.size, -1, np.int64)
        if uids.size:
            node = self.index.edges_of_uids(uids) if name == "relation" else self.index.nodes_of_uids(uids)
        # doc is ascending (checked above): each document's first slot is where its number changes
        first = np.flatnonzero(np.diff(doc, prepend=-1)) if doc.size else np.zeros(0, np.int64)
        return StoreView(name, doc, local, node, doc[first], np.append(first, doc.size).astype(np.int64))

    @cached_property
    def degree(self) -> np.ndarray:
        """``[n]`` int64 edges incident to each node (either direction): the rank of context entries."""
        n = self.node_kind.size
        return np.bincount(self.edge_src, minlength=n) + np.bincount(self.edge_dst, minlength=n)

    @cached_property
    def alias_members(self) -> tuple[np.ndarray, np.ndarray]:
        """``(offsets [G+1], nodes)``: the nodes of each alias group (``alias_of`` value g, ascending
        nodes), so a query reads its groups' members without scanning every node."""
        a = np.asarray(self.alias_of)
        members = np.flatnonzero(a >= 0)
        order = np.argsort(a[members], kind="stable")
        members = members[order]
        n_groups = int(a.max()) + 1 if a.size and a.max() >= 0 else 0
        offsets = np.zeros(n_groups + 1, np.int64)
        np.cumsum(np.bincount(a[members], minlength=n_groups), out=offsets[1:])
        return offsets, members

    def document_node_ranges(self, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(starts [k], ends [k])``: the node ranges ``[start, end)`` of the documents `docs`
        (document numbers; unknown numbers left out), ascending. Nodes are numbered document by
        document, so a document's nodes are one range."""
        docs = np.unique(np.asarray(docs, np.int64))
        at = np.searchsorted(self.numbers, docs)
        ok = at < self.numbers.size
        at = at[ok][self.numbers[at[ok]] == docs[ok]]
        # the end from node_doc itself: exact even if the graph held nodes of a number not listed
        return self.node_first[at], np.searchsorted(self.node_doc, self.numbers[at], side="right")

    def alias_members_in(self, group: int, ranges: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """The members of alias group `group` inside the node `ranges` (from
        :meth:`document_node_ranges`), ascending. A group's members are ascending nodes, so each
        document's members are one ``searchsorted`` range: O(k log |group|) for k documents,
        never a walk over a group that spans the corpus (a name in most documents)."""
        offsets, members = self.alias_members
        m = members[offsets[group]:offsets[group + 1]]
        starts, ends = ranges
        lo, hi = np.searchsorted(m, starts), np.searchsorted(m, ends)
        parts = [m[a:b] for a, b in zip(lo.tolist(), hi.tolist()) if b > a]
        return np.concatenate(parts) if parts else m[:0]

    @cached_property
    def relation_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """``(offsets [n+1], edges)``: the relation edges incident to each node (either end)."""
        rel = np.flatnonzero(self.edge_kind == EDGE.RELATION)
        ends = np.concatenate([self.edge_src[rel], self.edge_dst[rel]])
        edges = np.concatenate([rel, rel])
        order = np.lexsort((edges, ends))
        n = self.node_kind.size
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(ends, minlength=n), out=offsets[1:])
        return offsets, edges[order]

    @property
    def n_documents(self) -> int:
        return int(self.numbers.size)

    def nodes_of_docs(self, numbers: np.ndarray, kind: NodeKind | None = None) -> np.ndarray:
        """Graph nodes ``[k]`` of the documents `numbers` (optionally of one kind)."""
        at = np.searchsorted(self.numbers, numbers)
        out = [np.arange(self.node_first[i], self.node_first[i + 1]) for i in at.tolist()]
        nodes = np.concatenate(out) if out else np.zeros(0, np.int64)
        return nodes if kind is None else nodes[self.node_kind[nodes] == int(kind)]  # int: numpy's fast path

    def store_slots(self, store: str, nodes: np.ndarray) -> np.ndarray:
        """Slots ``[k]`` of `store` holding the graph nodes (or relation edges) `nodes`; -1 where
        the store has no vectors for that node."""
        sv = self.stores.get(store)
        if sv is None or not sv.node.size:
            return np.full(len(nodes), -1, np.int64)
        pos = np.searchsorted(sv.node, nodes)  # graph ids rise with (document, local id) as slots do
        pos_c = np.minimum(pos, sv.node.size - 1)
        return np.where(sv.node[pos_c] == nodes, pos_c, -1)


__all__ = ["IndexView", "StoreView"]
