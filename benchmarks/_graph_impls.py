"""Synthetic power-law graph, query inputs and the peer expansions for the graph benchmarks.

Shared by ``graph_report.py`` (plain script) and ``test_cpu_graph.py`` (pytest-benchmark), so
both time exactly the same callables on the same inputs.

The rule every filtered implementation applies (our ``KnowledgeGraph.expand`` with
``min_keep=0`` and ``direction="both"``): BFS from all of a query's seeds at once, edges taken
as undirected; at each hop the neighbours of the frontier not seen before are judged once, and
those with ``score > threshold`` (strict, in float32) are kept and form the next frontier.
Seeds are always kept. Unfiltered means every new neighbour is kept (plain l-hop neighbourhood).

Each peer returns, per query, the ``[R]`` int64 ids of the reached nodes (seeds included, any
order); :func:`check_same_sets` compares them as sets.
"""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from _harness import CorrectnessError  # an implementation reached a different node set: it must not be timed

SEED = 20240611
N_KINDS = 6      # node kinds 0..5 (document, segment, entity, image, region, table)
N_DOCS = 1000
THRESHOLD = 0.7  # scores uniform in [0, 1): 30% of nodes pass ``score > 0.7``


# ------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------

@dataclasses.dataclass
class GraphArrays:
    """A directed multigraph without self-loops.

    Attributes:
        n: number of nodes.
        src, dst: ``[m]`` int64 edge endpoints.
        node_kind: ``[n]`` int64 in ``[0, N_KINDS)``.
        node_doc: ``[n]`` int64 in ``[0, N_DOCS)``.
    """

    n: int
    src: np.ndarray
    dst: np.ndarray
    node_kind: np.ndarray
    node_doc: np.ndarray

    @property
    def m(self) -> int:
        return int(self.src.size)


@dataclasses.dataclass
class Queries:
    """Per-query inputs.

    Attributes:
        seeds: ``[Nq, S]`` int64, distinct seeds per query.
        scores: ``[Nq, n]`` float32 relevance, uniform in [0, 1).
        threshold: the float32 threshold every implementation compares against.
    """

    seeds: np.ndarray
    scores: np.ndarray
    threshold: np.float32

    @property
    def nq(self) -> int:
        return int(self.seeds.shape[0])


def power_law_graph(n: int, m: int, alpha: float = 0.8, seed: int = SEED) -> GraphArrays:
    """``m`` directed edges whose endpoints are drawn with probability ``∝ (rank + 1) ** -alpha``.

    Ranks are a random permutation of the nodes, so hubs are spread over the id range rather
    than packed at id 0 (which would flatter cache locality). alpha = 0.8 over 1M nodes gives a
    top hub of about 1.3% of all endpoints (degree ~130k at m = 5M) and a mean degree of 2m/n.
    Self-loops are redrawn; multi-edges stay (every implementation gets the same edges).
    """
    rng = np.random.default_rng(seed)
    cdf = np.cumsum((np.arange(n, dtype=np.float64) + 1.0) ** -alpha)
    cdf /= cdf[-1]
    node_of_rank = rng.permutation(n)

    def draw(k: int) -> np.ndarray:
        # inverse-CDF sampling; the min() guards the u -> 1.0 rounding edge
        ranks = np.minimum(np.searchsorted(cdf, rng.random(k), side="right"), n - 1)
        return node_of_rank[ranks].astype(np.int64)

    src, dst = draw(m), draw(m)
    loops = np.flatnonzero(src == dst)
    while loops.size:
        dst[loops] = draw(loops.size)
        loops = loops[src[loops] == dst[loops]]
    node_kind = rng.integers(0, N_KINDS, n, dtype=np.int64)
    node_doc = rng.integers(0, N_DOCS, n, dtype=np.int64)
    return GraphArrays(n, src, dst, node_kind, node_doc)


def make_queries(n: int, nq: int, n_seeds: int = 10, seed: int = SEED + 1) -> Queries:
    """``nq`` queries of ``n_seeds`` distinct uniform seeds and uniform float32 scores ``[nq, n]``."""
    rng = np.random.default_rng(seed)
    seeds = np.stack([rng.choice(n, n_seeds, replace=False) for _ in range(nq)]).astype(np.int64)
    scores = rng.random((nq, n), dtype=np.float32)
    return Queries(seeds, scores, np.float32(THRESHOLD))


def degree_stats(g: GraphArrays) -> dict:
    """Undirected degree summary (multi-edges counted): max, mean, median, share of isolated nodes."""
    deg = np.bincount(g.src, minlength=g.n) + np.bincount(g.dst, minlength=g.n)
    return {"max": int(deg.max()), "mean": float(deg.mean()), "median": float(np.median(deg)),
            "p99": float(np.percentile(deg, 99)), "isolated_share": float((deg == 0).mean())}


# ------------------------------------------------------------------------------------------
# Peer (a): scipy CSR frontier expansion, vectorised with numpy
# ------------------------------------------------------------------------------------------

def symmetric_csr(g: GraphArrays):
    """``scipy.sparse.csr_matrix [n, n]`` float32 with an entry for each edge in both directions.

    Duplicate edges are summed into one entry by the COO -> CSR conversion, so a row lists each
    neighbour once (indices int32 while nnz < 2**31).
    """
    import scipy.sparse as sp
    rows = np.concatenate([g.src, g.dst])
    cols = np.concatenate([g.dst, g.src])
    return sp.csr_matrix((np.ones(rows.size, np.float32), (rows, cols)), shape=(g.n, g.n))


def csr_nbytes(a) -> int:
    """Bytes of the three arrays of a CSR matrix (data + indices + indptr)."""
    return int(a.data.nbytes + a.indices.nbytes + a.indptr.nbytes)


class ScipyExpander:
    """Frontier BFS over a symmetric CSR matrix, no Python loop over nodes.

    Per hop: gather the neighbour rows of the whole frontier with one fancy index, drop the
    visited ones, dedupe in O(k) with a scratch "last writer" array (cheaper than np.unique's
    sort on large frontiers), mark them visited (judged once), keep those passing the filter.
    """

    def __init__(self, a):
        self.indptr = a.indptr.astype(np.int64)  # int64: row starts can exceed 2**31 in the gather arithmetic
        self.indices = a.indices
        self.n = a.shape[0]
        self._owner = np.empty(self.n, np.int64)  # scratch, only entries just written are read

    def _neighbours(self, frontier: np.ndarray) -> np.ndarray:
        """``[sum of degrees]`` neighbour ids of `frontier` (with repeats)."""
        starts = self.indptr[frontier]
        lens = self.indptr[frontier + 1] - starts
        out_start = np.cumsum(lens) - lens
        # output slot j of row k reads indices[starts[k] + (j - out_start[k])]
        idx = np.arange(int(lens.sum()), dtype=np.int64) + np.repeat(starts - out_start, lens)
        return self.indices[idx]

    def _dedupe(self, ids: np.ndarray) -> np.ndarray:
        pos = np.arange(ids.size, dtype=np.int64)
        self._owner[ids] = pos
        return ids[self._owner[ids] == pos]

    def expand_one(self, seeds: np.ndarray, hops: int, scores: np.ndarray | None, threshold,
                   judged: list | None = None) -> np.ndarray:
        """Reached ``[R]`` node ids of one query; `scores` ``[n]`` float32 or None (no filter).
        `judged`, when given, receives each hop's newly seen neighbours (see judged_nodes)."""
        visited = np.zeros(self.n, bool)
        frontier = self._dedupe(np.asarray(seeds, np.int64))
        visited[frontier] = True
        parts = [frontier]
        for _ in range(hops):
            if not frontier.size:
                break
            nb = self._neighbours(frontier).astype(np.int64, copy=False)
            nb = self._dedupe(nb[~visited[nb]])
            visited[nb] = True
            if judged is not None:
                judged.append(nb)
            if scores is not None:
                nb = nb[scores[nb] > threshold]
            parts.append(nb)
            frontier = nb
        return np.concatenate(parts)

    def expand(self, q: Queries, hops: int, filtered: bool = True, nq: int | None = None) -> list[np.ndarray]:
        """Reached ids for the first `nq` queries (all by default)."""
        return [self.expand_one(q.seeds[i], hops, q.scores[i] if filtered else None, q.threshold)
                for i in range(q.nq if nq is None else nq)]


# ------------------------------------------------------------------------------------------
# Floor: the score reads every filtered expansion must make
# ------------------------------------------------------------------------------------------

def judged_nodes(sc: ScipyExpander, q: Queries, hops: int) -> list[np.ndarray]:
    """Per query, the ``[C]`` ids whose score a filtered expansion reads: at each hop, the
    frontier's neighbours not seen before, in discovery order. Any implementation of the rule
    must read each of these scores once to decide it, and none other."""
    out = []
    for i in range(q.nq):
        parts: list[np.ndarray] = []
        sc.expand_one(q.seeds[i], hops, q.scores[i], q.threshold, judged=parts)
        out.append(np.concatenate(parts) if parts else np.zeros(0, np.int64))
    return out


def read_scores(q: Queries, judged: list[np.ndarray], pool=None) -> int:
    """Reads (and tests) each judged node's score, queries spread over the threads of `pool`
    (a ``ThreadPoolExecutor``; numpy's gather releases the GIL) or on this thread; returns how
    many pass, so the reads cannot be skipped."""
    def one(i: int) -> int:
        return int(np.count_nonzero(np.take(q.scores[i], judged[i]) > q.threshold))
    if pool is None:
        return sum(one(i) for i in range(len(judged)))
    return sum(pool.map(one, range(len(judged))))


# ------------------------------------------------------------------------------------------
# Peer (b): python-igraph neighborhood (unfiltered only)
# ------------------------------------------------------------------------------------------

def igraph_graph(g: GraphArrays):
    """python-igraph directed ``Graph`` with the same edges (edge ids equal ours)."""
    import igraph as ig
    return ig.Graph(n=g.n, edges=np.stack([g.src, g.dst], 1).tolist(), directed=True)


def igraph_expand(gi, q: Queries, hops: int, nq: int | None = None) -> list[np.ndarray]:
    """Per query, the union of ``neighborhood(seed, order=hops, mode='all')`` over its seeds.

    igraph has no per-hop filter, so this is the unfiltered l-hop neighbourhood; the union is
    part of the cost because the caller needs one node set per query.
    """
    out = []
    for i in range(q.nq if nq is None else nq):
        lists = gi.neighborhood(vertices=q.seeds[i].tolist(), order=hops, mode="all")
        out.append(np.unique(np.fromiter(itertools.chain.from_iterable(lists), np.int64)))
    return out


# ------------------------------------------------------------------------------------------
# Peer (c): NetworkX adjacency, Python BFS with the same filter
# ------------------------------------------------------------------------------------------

def networkx_graph(g: GraphArrays):
    """``nx.Graph`` (undirected, multi-edges collapsed) over all n nodes."""
    import networkx as nx
    G = nx.Graph()
    G.add_nodes_from(range(g.n))
    G.add_edges_from(zip(g.src.tolist(), g.dst.tolist()))
    return G


def networkx_expand_one(adj, seeds: list[int], hops: int, scores: list[float] | None, threshold: float) -> list[int]:
    """Reached node ids of one query. `adj` is ``G._adj`` (dict of dicts; skipping the
    AdjacencyView wrapper is the fastest pure-Python read); `scores` a Python list ``[n]``."""
    visited = set(seeds)
    frontier = list(visited)
    reached = list(frontier)
    for _ in range(hops):
        nxt = []
        for u in frontier:
            for v in adj[u]:
                if v not in visited:
                    visited.add(v)
                    if scores is None or scores[v] > threshold:
                        nxt.append(v)
        reached.extend(nxt)
        frontier = nxt
        if not frontier:
            break
    return reached


def networkx_inputs(q: Queries, nq: int) -> tuple[list[list[int]], list[list[float]]]:
    """Seeds and scores as Python lists for the first `nq` queries (made outside the timing:
    a NetworkX pipeline would hold scores in Python objects already)."""
    return [q.seeds[i].tolist() for i in range(nq)], [q.scores[i].tolist() for i in range(nq)]


def networkx_expand(G, seeds: list[list[int]], scores: list[list[float]], hops: int, threshold) -> list[np.ndarray]:
    """Reached ids for each query of `seeds` (filtered with `scores`)."""
    t = float(threshold)  # the float32 value exactly, so ``>`` matches the float32 comparison
    return [np.asarray(networkx_expand_one(G._adj, s, hops, sc, t), np.int64) for s, sc in zip(seeds, scores)]


# ------------------------------------------------------------------------------------------
# Ours
# ------------------------------------------------------------------------------------------

def ours_graph(g: GraphArrays, backend: str = "native", copy_budget: float | None = None):
    """``KnowledgeGraph.from_arrays`` over the same arrays; `copy_budget` (bytes per edge for
    sequential adjacency copies) replaces the default when given."""
    from colgraph_engine.graph import KnowledgeGraph
    kg = KnowledgeGraph.from_arrays(g.node_kind, g.node_doc, g.src, g.dst, backend=backend)
    if copy_budget is not None:
        kg.set_copy_budget(copy_budget)
    return kg


def ours_batched(kg, q: Queries, hops: int, filtered: bool = True, nq: int | None = None, num_threads=None,
                 with_edges: bool | None = None):
    """All (first `nq`) queries in one ``expand`` call -> :class:`Expansion`. `with_edges` None
    keeps the API default (induced edges listed)."""
    k = q.nq if nq is None else nq
    extra = {} if with_edges is None else {"with_edges": with_edges}
    return kg.expand(list(q.seeds[:k]), hops, scores=q.scores[:k] if filtered else None,
                     threshold=float(q.threshold), min_keep=0, num_threads=num_threads, **extra)


def ours_per_query(kg, q: Queries, hops: int, filtered: bool = True, nq: int | None = None) -> list:
    """One ``expand`` call per query (the latency of a single query) -> list of Expansion."""
    return [kg.expand([q.seeds[i]], hops, scores=q.scores[i:i + 1] if filtered else None,
                      threshold=float(q.threshold), min_keep=0)
            for i in range(q.nq if nq is None else nq)]


def expansion_sets(ex) -> list[np.ndarray]:
    """Per query, the ``[R]`` reached node ids of an Expansion."""
    return [ex[i].nodes for i in range(len(ex))]


# ------------------------------------------------------------------------------------------
# Checks
# ------------------------------------------------------------------------------------------

def check_same_sets(name: str, got: list[np.ndarray], want: list[np.ndarray], want_name: str) -> None:
    """Raises CorrectnessError unless ``set(got[i]) == set(want[i])`` for every query i
    (and neither lists a node twice)."""
    if len(got) != len(want):
        raise CorrectnessError(f"{name}: {len(got)} queries, {want_name} has {len(want)}")
    for i, (a, b) in enumerate(zip(got, want)):
        sa, sb = np.sort(a), np.sort(b)
        if sa.size != np.unique(sa).size:
            raise CorrectnessError(f"{name}: query {i} lists a node twice")
        if not np.array_equal(sa, sb):
            only_a = np.setdiff1d(sa, sb)[:5].tolist()
            only_b = np.setdiff1d(sb, sa)[:5].tolist()
            raise CorrectnessError(f"{name} != {want_name} at query {i}: {sa.size} vs {sb.size} nodes; "
                                   f"only in {name}: {only_a}, only in {want_name}: {only_b}")


def native_available() -> bool:
    """True when colgraph_engine's C++ module loads (the ``native`` backend can run)."""
    import colgraph_engine as cg
    return bool(cg.backends().get("native"))
