"""The result of a batched graph expansion."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class QueryExpansion:
    """One query's subgraph. Arrays over reached nodes share one order: hop ascending; hop 0
    holds the seeds in the order given; within a later hop, discovery order, with or without
    scores: frontier nodes in order, each one's out-edges by (target, edge id), then its
    in-edges by (source, edge id), as `direction` allows; the members of an alias group follow the member that was
    found. Scores decide which candidates are kept (and, under a budget, which fill it first),
    not where they are listed: sort by `score` for a best-first view. The native and reference
    implementations give the same order."""

    nodes: np.ndarray        # [R] int64 node ids
    hop: np.ndarray          # [R] int32 BFS distance from the nearest seed
    seed: np.ndarray         # [R] int64 the seed whose search reached the node
    parent: np.ndarray       # [R] int64 node it was reached from (-1 for seeds)
    parent_edge: np.ndarray  # [R] int64 edge it was reached through (-1: seed, or alias of `parent`)
    score: np.ndarray        # [R] float32 the node's relevance score (NaN without scores)
    edges: np.ndarray        # [E] int64 ids of the edges between reached nodes, ascending


@dataclass(frozen=True)
class Expansion:
    """Expansion of Nq queries, in CSR form: query i owns ``node_offsets[i]:node_offsets[i+1]``
    of the node arrays and ``edge_offsets[i]:edge_offsets[i+1]`` of `edges`."""

    node_offsets: np.ndarray  # [Nq+1] int64
    nodes: np.ndarray
    hop: np.ndarray
    seed: np.ndarray
    parent: np.ndarray
    parent_edge: np.ndarray
    score: np.ndarray
    edge_offsets: np.ndarray  # [Nq+1] int64
    edges: np.ndarray

    @property
    def n_queries(self) -> int:
        return len(self.node_offsets) - 1

    def __len__(self) -> int:
        return self.n_queries

    def __getitem__(self, i: int) -> QueryExpansion:
        if not -self.n_queries <= i < self.n_queries:
            raise IndexError(f"query index {i} out of range for {self.n_queries} queries")
        i %= self.n_queries
        a, b = self.node_offsets[i], self.node_offsets[i + 1]
        c, d = self.edge_offsets[i], self.edge_offsets[i + 1]
        return QueryExpansion(self.nodes[a:b], self.hop[a:b], self.seed[a:b], self.parent[a:b],
                              self.parent_edge[a:b], self.score[a:b], self.edges[c:d])

    def equals(self, other: Expansion) -> bool:
        """Exact equality of every array (NaN scores compare equal)."""
        for name in ("node_offsets", "nodes", "hop", "seed", "parent", "parent_edge", "edge_offsets", "edges"):
            if not np.array_equal(getattr(self, name), getattr(other, name)):
                return False
        return np.array_equal(self.score, other.score, equal_nan=True)
