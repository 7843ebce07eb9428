"""Pure numpy implementation of the graph store and its expansion.

It has the same interface as the native ``colgraph_engine._core.Graph`` and computes the same
expansion, node for node and in the same order; it is the oracle in tests and the path taken
when the native module is unavailable (``COLGRAPH_DISABLE_NATIVE=1``). Each hop is vectorised
over the frontier (a CSR frontier expansion, as one would write it with scipy).

The rules, shared with the C++ implementation (csrc/graph.cpp):
  * hop 0 admits the seeds in the order given (a repeat is skipped);
  * hop h gathers, for each frontier node in order, its incident edges (out-edges sorted by
    (target, edge id), then in-edges sorted by (source, edge id)); a neighbour becomes a
    candidate the first time it is seen, if it is unseen, of an allowed kind and in an allowed
    document; the discovering node and edge become its parent;
  * candidates are ranked by (score desc, node asc); those with score > threshold are kept,
    and at least `min_keep` of the best when fewer pass, where the top-up takes only
    candidates with a score > -inf (an unscored node, unlisted in sparse scores or -inf in a
    dense row, is never admitted by it); the budget caps the nodes reached;
  * a candidate not kept is dropped for good (a node is judged once, at its BFS distance);
  * with alias merging, the allowed members of an alias group move together as one unit
    (scored by their best member, admitted right after the member that was found).
"""
from __future__ import annotations

import numpy as np

_UNSEEN, _REACHED, _DROPPED = 0, 1, 2


def _ranges(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated ``arange(s, e)`` for each pair, and the index of the pair each came from."""
    lens = ends - starts
    owner = np.repeat(np.arange(len(starts)), lens)
    if owner.size == 0:
        return np.zeros(0, np.int64), owner
    first = np.repeat(starts - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
    return first + np.arange(owner.size), owner


class ReferenceGraph:
    """Directed multigraph in numpy arrays with node/edge attributes (see the native Graph)."""

    def __init__(self):
        self._node_kind = np.zeros(0, np.uint8)
        self._node_doc = np.zeros(0, np.int64)
        self._node_weight = np.zeros(0, np.float32)
        self._src = np.zeros(0, np.int64)
        self._dst = np.zeros(0, np.int64)
        self._edge_kind = np.zeros(0, np.uint8)
        self._edge_weight = np.zeros(0, np.float32)
        self._alias_of = np.zeros(0, np.int64)
        self._index = None

    # -- storage -----------------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        return int(self._node_kind.size)

    @property
    def n_edges(self) -> int:
        return int(self._src.size)

    def add_nodes(self, kind, doc, weight):
        self._node_kind = np.concatenate([self._node_kind, kind])
        self._node_doc = np.concatenate([self._node_doc, doc])
        self._node_weight = np.concatenate([self._node_weight, weight])
        self._alias_of = np.concatenate([self._alias_of, np.full(len(kind), -1, np.int64)])
        self._index = None

    def add_edges(self, src, dst, kind, weight):
        self._src = np.concatenate([self._src, src])
        self._dst = np.concatenate([self._dst, dst])
        self._edge_kind = np.concatenate([self._edge_kind, kind])
        self._edge_weight = np.concatenate([self._edge_weight, weight])
        self._index = None

    def set_copy_budget(self, bytes_per_edge):
        """Native-only tuning (sequential adjacency copies); this layout has none."""

    def set_aliases(self, group_of):
        self._alias_of = np.array(group_of, np.int64)
        self._index = None

    def edge_list(self):
        return self._src.copy(), self._dst.copy()

    def node_kind(self):
        return self._node_kind.copy()

    def node_doc(self):
        return self._node_doc.copy()

    def node_weight(self):
        return self._node_weight.copy()

    def edge_kind(self):
        return self._edge_kind.copy()

    def edge_weight(self):
        return self._edge_weight.copy()

    def alias_of(self):
        return self._alias_of.copy()

    def memory_bytes(self) -> int:
        arrays = [self._node_kind, self._node_doc, self._node_weight, self._src, self._dst, self._edge_kind,
                  self._edge_weight, self._alias_of]
        if self._index is not None:
            arrays += [a for a in self._index.values() if isinstance(a, np.ndarray)]
        return int(sum(a.nbytes for a in arrays))

    def _csr(self):
        """Out- and in-adjacency in igraph's order: (src, dst, id) and (dst, src, id)."""
        if self._index is None:
            n, ids = self.n_nodes, np.arange(self.n_edges)
            out_order = np.lexsort((ids, self._dst, self._src))
            in_order = np.lexsort((ids, self._src, self._dst))
            os_ = np.zeros(n + 1, np.int64)
            is_ = np.zeros(n + 1, np.int64)
            np.cumsum(np.bincount(self._src, minlength=n), out=os_[1:])
            np.cumsum(np.bincount(self._dst, minlength=n), out=is_[1:])
            groups = self._alias_of[self._alias_of >= 0]
            n_groups = int(groups.max()) + 1 if groups.size else 0
            members = np.nonzero(self._alias_of >= 0)[0]
            members = members[np.argsort(self._alias_of[members], kind="stable")]
            g_off = np.zeros(n_groups + 1, np.int64)
            np.cumsum(np.bincount(groups, minlength=n_groups), out=g_off[1:])
            self._index = dict(out_order=out_order, in_order=in_order, os=os_, is_=is_, g_off=g_off, members=members)
        return self._index

    # -- expansion ---------------------------------------------------------------------------
    def expand(self, seed_offsets, seeds, hops, dense_scores=None, score_offsets=None, score_nodes=None,
               score_values=None, threshold=0.0, min_keep=0, budget=-1, node_kind_mask=(1 << 64) - 1,
               edge_kind_mask=(1 << 64) - 1, direction=0, merge_aliases=False, doc_offsets=None, docs=None,
               num_threads=1, with_edges=True):
        n = self.n_nodes
        nq = len(seed_offsets) - 1
        if hops < 0:
            raise ValueError("hops: expected >= 0")
        if min_keep < 0:
            raise ValueError("min_keep: expected >= 0")
        if seeds.size and (seeds.min() < 0 or seeds.max() >= n):
            bad = int(seeds[(seeds < 0) | (seeds >= n)][0])
            raise ValueError(f"seeds: {bad}: expected a node id in [0, {n})")
        idx = self._csr()
        edge_ok = ((np.uint64(edge_kind_mask) >> self._edge_kind.astype(np.uint64)) & np.uint64(1)).astype(bool)
        merge = bool(merge_aliases) and idx["members"].size > 0
        kind_ok = ((np.uint64(node_kind_mask) >> self._node_kind.astype(np.uint64)) & np.uint64(1)).astype(bool)
        state = np.zeros(n, np.int8)  # shared by the queries, reset after each: O(touched) per query
        results = []
        for q in range(nq):
            score_of = self._score_lookup(q, dense_scores, score_offsets, score_nodes, score_values)
            if docs is not None:
                allowed_docs = np.asarray(docs[doc_offsets[q]:doc_offsets[q + 1]])
                allowed = lambda nodes, d=allowed_docs: kind_ok[nodes] & np.isin(self._node_doc[nodes], d)  # noqa: E731
            else:
                allowed = lambda nodes: kind_ok[nodes]  # noqa: E731
            results.append(self._expand_one(q, seeds[seed_offsets[q]:seed_offsets[q + 1]], hops, score_of, threshold,
                                            min_keep, budget, allowed, edge_ok, direction, merge, idx, with_edges,
                                            state))
        return _concatenate(results)

    @staticmethod
    def _score_lookup(q, dense_scores, score_offsets, score_nodes, score_values):
        """``nodes [k] -> [k] float32`` scores of query q (unlisted sparse nodes: -inf), or None."""
        if dense_scores is not None:
            row = np.asarray(dense_scores[q], np.float32)
            return lambda nodes: row[nodes]
        if score_offsets is None:
            return None
        lo, hi = score_offsets[q], score_offsets[q + 1]
        listed, values = np.asarray(score_nodes[lo:hi]), np.asarray(score_values[lo:hi], np.float32)
        last = {int(v): i for i, v in enumerate(listed.tolist())}  # a node listed twice: the last value
        keys = np.array(sorted(last), np.int64)
        vals = values[[last[k] for k in keys.tolist()]] if keys.size else np.zeros(0, np.float32)

        def lookup(nodes):
            nodes = np.atleast_1d(nodes)
            at = np.searchsorted(keys, nodes).clip(max=max(keys.size - 1, 0))
            hit = (keys[at] == nodes) if keys.size else np.zeros(nodes.shape, bool)
            return np.where(hit, vals[at] if keys.size else 0, -np.inf).astype(np.float32)
        return lookup

    def _group_members(self, v, idx):
        g = self._alias_of[v]
        return idx["members"][idx["g_off"][g]:idx["g_off"][g + 1]]

    def _expand_one(self, q, seeds, hops, score_of, threshold, min_keep, budget, allowed, edge_ok, direction, merge,
                    idx, with_edges, state):
        cols = ([], [], [], [], [])  # chunks of nodes, hop, seed, parent, parent_edge
        n_rows = 0
        dropped = []  # arrays of nodes judged and not kept, to reset `state` afterwards

        def push(nodes, hop, seed, parent, edge):
            nonlocal n_rows
            state[nodes] = _REACHED
            for col, x in zip(cols, (nodes, np.full(nodes.size, hop), seed, parent, edge)):
                col.append(np.asarray(x, np.int64))
            n_rows += nodes.size

        def admit_unit(v, hop, seed, parent, edge):
            push(np.array([v]), hop, [seed], [parent], [edge])
            if merge and self._alias_of[v] >= 0:
                ms = self._group_members(v, idx)
                ms = ms[allowed(ms) & (ms != v) & (state[ms] != _REACHED)]
                push(ms, hop, np.full(ms.size, seed), np.full(ms.size, v), np.full(ms.size, -1))

        for v in seeds.tolist():
            if state[v] != _REACHED:
                admit_unit(v, 0, v, -1, -1)
        frontier = np.concatenate(cols[0]) if cols[0] else np.zeros(0, np.int64)
        frontier_seed = np.concatenate(cols[2]) if cols[2] else np.zeros(0, np.int64)
        for hop in range(1, hops + 1):
            if frontier.size == 0:
                break
            e, v, u, block = self._incident(frontier, direction, idx)
            ok = edge_ok[e] & (state[v] == _UNSEEN)
            ok[ok] = allowed(v[ok])
            e, v, u, block = e[ok], v[ok], u[ok], block[ok]
            unit = np.where(merge & (self._alias_of[v] >= 0), self._alias_of[v], -1 - v) if merge else v
            _, first = np.unique(unit, return_index=True)
            first = np.sort(first)
            e = self._lowest_edge(e, v, u, block, first)
            v, u = v[first], u[first]
            by_node = np.argsort(frontier)  # the seed of each discovering frontier node
            seed = frontier_seed[by_node[np.searchsorted(frontier[by_node], u)]]
            sizes = np.ones(v.size, np.int64)
            unit_score = score_of(v).astype(np.float64) if score_of is not None else None
            unit_members = [None] * v.size
            if merge:
                for i, node in enumerate(v.tolist()):
                    if self._alias_of[node] >= 0:
                        ms = self._group_members(node, idx)
                        ms = ms[allowed(ms) & (state[ms] == _UNSEEN)]
                        unit_members[i] = ms
                        sizes[i] = ms.size
                        if score_of is not None:
                            unit_score[i] = np.nanmax(score_of(ms))
            self._check_nan(score_of, v, unit_members, q)
            keep, full = self._select(v, unit_score, sizes, threshold, min_keep, budget, n_rows)
            first_chunk = len(cols[0])
            if all(m is None for m in unit_members):  # no alias units: admit and drop in bulk
                push(v[keep], hop, seed[keep], u[keep], e[keep])
                state[v[~keep]] = _DROPPED
                dropped.append(v[~keep])
            else:
                for i in range(v.size):
                    if keep[i]:
                        admit_unit(int(v[i]), hop, int(seed[i]), int(u[i]), int(e[i]))
                    else:
                        members = np.atleast_1d(unit_members[i] if unit_members[i] is not None else v[i])
                        members = members[state[members] != _REACHED]
                        state[members] = _DROPPED
                        dropped.append(members)
            frontier = np.concatenate(cols[0][first_chunk:]) if len(cols[0]) > first_chunk else np.zeros(0, np.int64)
            frontier_seed = np.concatenate(cols[2][first_chunk:]) if len(cols[2]) > first_chunk else np.zeros(0, np.int64)
            if full:
                break
        nodes, hop_col, seed_col, parent_col, edge_col = (
            np.concatenate(c) if c else np.zeros(0, np.int64) for c in cols)
        node_scores = score_of(nodes) if score_of is not None else np.full(nodes.size, np.nan, np.float32)
        induced = np.zeros(0, np.int64)
        if with_edges and nodes.size:  # out-edges of reached nodes whose target was reached too
            pos, _ = _ranges(idx["os"][nodes], idx["os"][nodes + 1])
            out = idx["out_order"][pos]
            induced = np.sort(out[(state[self._dst[out]] == _REACHED) & edge_ok[out]])
        state[nodes] = _UNSEEN
        for d in dropped:
            state[d] = _UNSEEN
        if score_of is not None and np.isnan(node_scores).any():
            raise ValueError(f"scores: NaN for node {int(nodes[np.isnan(node_scores)][0])} in query {q}")
        return dict(
            nodes=nodes,
            hop=hop_col.astype(np.int32),
            seed=seed_col,
            parent=parent_col,
            parent_edge=edge_col,
            score=node_scores.astype(np.float32),
            edges=induced.astype(np.int64),
        )

    def _lowest_edge(self, e, v, u, block, first):
        """For each first discovery of v by u, the lowest id among u's allowed edges to v in the
        block (out- or in-edges) where it was found."""
        n = self.n_nodes
        key = (u * n + v) * 2 + block
        by_edge = np.argsort(e, kind="stable")
        keys, at = np.unique(key[by_edge], return_index=True)
        lowest = e[by_edge][at]
        return lowest[np.searchsorted(keys, key[first])]

    @staticmethod
    def _select(v, unit_score, sizes, threshold, min_keep, budget, n_reached):
        """``(kept [C] bool, full)``: the relevance rule, then the budget (see the module rules)."""
        c = v.size
        if unit_score is None:
            keep = np.ones(c, bool)
        else:
            keep = unit_score > np.float32(threshold)
            scored = unit_score > -np.inf  # the top-up never admits an unscored (-inf) candidate
            top_up = min(min_keep, int(scored.sum())) - int(keep.sum())
            if top_up > 0:
                rest = np.nonzero(~keep & scored)[0]
                keep[rest[np.lexsort((v[rest], -unit_score[rest]))][:top_up]] = True
        full = False
        if budget >= 0 and int(sizes[keep].sum()) > budget - n_reached:
            full, room = True, budget - n_reached
            kept = np.nonzero(keep)[0]
            if unit_score is not None:
                kept = kept[np.lexsort((v[kept], -unit_score[kept]))]
            keep[:] = False
            for i in kept.tolist():
                if sizes[i] > room:
                    break
                room -= sizes[i]
                keep[i] = True
        return keep, full

    @staticmethod
    def _check_nan(score_of, v, unit_members, q):
        if score_of is None:
            return
        judged = np.concatenate([np.atleast_1d(m if m is not None else node) for node, m in zip(v.tolist(), unit_members)]) \
            if v.size else np.zeros(0, np.int64)
        bad = judged[np.isnan(score_of(judged))] if judged.size else judged
        if bad.size:
            raise ValueError(f"scores: NaN for node {int(bad[0])} in query {q}")

    def _incident(self, frontier, direction, idx):
        """(edge, other end, frontier node, block: 0 out / 1 in) per incident edge, in traversal order."""
        parts = []
        if direction != 2:  # out-edges
            pos, owner = _ranges(idx["os"][frontier], idx["os"][frontier + 1])
            e = idx["out_order"][pos]
            parts.append((owner * 2, e, self._dst[e]))
        if direction != 1:  # in-edges
            pos, owner = _ranges(idx["is_"][frontier], idx["is_"][frontier + 1])
            e = idx["in_order"][pos]
            parts.append((owner * 2 + 1, e, self._src[e]))
        key = np.concatenate([p[0] for p in parts])
        order = np.argsort(key, kind="stable")
        e = np.concatenate([p[1] for p in parts])[order]
        v = np.concatenate([p[2] for p in parts])[order]
        u = frontier[key[order] // 2]
        return e, v, u, key[order] % 2


def _concatenate(results):
    out = {}
    for key in ("nodes", "hop", "seed", "parent", "parent_edge", "score", "edges"):
        dtype = {"hop": np.int32, "score": np.float32}.get(key, np.int64)
        out[key] = np.concatenate([r[key] for r in results]).astype(dtype) if results else np.zeros(0, dtype)
    out["node_offsets"] = np.concatenate([[0], np.cumsum([r["nodes"].size for r in results])]).astype(np.int64)
    out["edge_offsets"] = np.concatenate([[0], np.cumsum([r["edges"].size for r in results])]).astype(np.int64)
    return out
