"""KnowledgeGraph: the typed multimodal graph and its batched, relevance-filtered expansion.

Nodes have a kind (:class:`NodeKind` or any int in [0, 64)), a document id and a weight; edges
are directed and have a kind (int in [0, 64)) and a weight. Node and edge ids are dense and
assigned in insertion order. Each document's nodes stay separate; an *alias table* groups
nodes whose normalised names are equal, and an expansion with ``merge_aliases=True`` treats the
allowed members of a group as one node (mKG-RAG's per-query merged graph, as a view).

The storage and traversal run in the native module (igraph C library, C++ threads) when it is
available, else in the numpy reference (:mod:`colgraph_engine.graph.reference`); both give the
same result, node for node.
"""
from __future__ import annotations

import bisect
import functools
import os
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .. import _arraydir, _atomic, _native
from .expansion import Expansion
from .kinds import MAX_KIND, NodeKind, kind_mask
from .reference import ReferenceGraph

FORMAT_NAME = "colgraph_engine.graph"
FORMAT_VERSION = 1
_DIRECTIONS = {"both": 0, "out": 1, "in": 2}


class Csr(NamedTuple):
    """Per-query lists in CSR form: list i is ``values[offsets[i]:offsets[i+1]]``."""
    offsets: np.ndarray
    values: np.ndarray


class SparseScores(NamedTuple):
    """Per-query node scores in CSR form; nodes a query does not list score -inf."""
    offsets: np.ndarray
    nodes: np.ndarray
    values: np.ndarray


class NodeNames(Sequence):
    """Node names as a read-only sequence of chunks, each any sequence of ``str`` (a list, or a
    column that decodes its strings when read): appending a batch of names adds one chunk (no
    copy of the names already held, and a lazily decoded column stays lazy); reading name ``v``
    finds its chunk by bisection. Compares equal to a list of the same names."""

    __slots__ = ("_chunks", "_ends")

    def __init__(self):
        self._chunks: list[Sequence[str]] = []
        self._ends: list[int] = []

    def extend(self, names: Sequence[str]) -> None:
        """Appends `names` (a list is copied; other sequences are kept as they are: they must not change)."""
        if isinstance(names, NodeNames):
            for c in names._chunks:
                self.extend(c)
            return
        if len(names):
            self._chunks.append(list(names) if isinstance(names, list) else names)
            self._ends.append(len(self) + len(names))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        j = i.__index__()
        n = len(self)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError("NodeNames index out of range")
        c = bisect.bisect_right(self._ends, j)
        return self._chunks[c][j - (self._ends[c - 1] if c else 0)]

    def __iter__(self):
        for c in self._chunks:
            yield from c

    def take(self, positions) -> list[str]:
        """The names at ``positions`` (ascending ints in ``[0, len)``): per chunk one ``take``
        where the chunk has it (a lazily decoded column), else indexing."""
        at = np.asarray(positions, np.int64)
        if at.size and (int(at[0]) < 0 or int(at[-1]) >= len(self)):
            raise IndexError("NodeNames index out of range")
        out: list[str] = []
        start = 0
        for c, end in zip(self._chunks, self._ends):
            a, b = np.searchsorted(at, [start, end])
            if b > a:
                local = at[a:b] - start
                out.extend(c.take(local) if hasattr(c, "take") else [c[i] for i in local.tolist()])
            start = end
        return out

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None

    def __reduce__(self):
        return list, (list(self),)

    def __repr__(self) -> str:
        return f"NodeNames(n={len(self)}, chunks={len(self._chunks)})"


@functools.lru_cache(maxsize=1 << 17)  # names repeat across records; the key is a pure function
def normalize_name(name: str) -> str:
    """Alias key: Unicode NFKC, case-folded, whitespace collapsed, and outer quotes, brackets and
    punctuation removed (repeatedly, so ``'"Fuji."'`` -> ``fuji``). The one key used for merging
    entities inside a document and for grouping aliases across documents."""
    text = " ".join(unicodedata.normalize("NFKC", name).casefold().split())
    previous = None
    while previous != text:
        previous = text
        text = text.strip(_NAME_EDGE_CHARS)
    return text


_NAME_EDGE_CHARS = "\"'`\u201c\u201d\u2018\u2019.,;:!?()[]{}<> \t\n"


# -- argument checking ------------------------------------------------------------------------

def _only_strings(names: Sequence) -> bool:
    """Whether every name is a ``str``; a chunk that declares ``only_str`` (a string column,
    which decodes every item to ``str``) is taken at its word instead of being decoded here."""
    chunks = names._chunks if isinstance(names, NodeNames) else (names,)
    return all(getattr(c, "only_str", False) or all(isinstance(s, str) for s in c) for c in chunks)


def _as_int_array(x, name: str, length: int | None = None) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "numpy"):  # torch tensor
        x = x.detach().cpu().numpy()
    if isinstance(x, (list, tuple, range)):
        x = np.asarray(x) if len(x) else np.zeros(0, np.int64)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected an integer array or sequence, got {type(x).__name__}")
    if x.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integers, got dtype {x.dtype}")
    if x.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array, got shape {x.shape}")
    if length is not None and x.size != length:
        raise ValueError(f"{name}: expected length {length}, got {x.size}")
    return np.ascontiguousarray(x, np.int64)


def _as_float_array(x, name: str, length: int, default: float) -> np.ndarray:
    if x is None:
        return np.full(length, default, np.float32)
    if hasattr(x, "detach") and hasattr(x, "numpy"):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name}: expected numbers, got dtype {arr.dtype}")
    if arr.ndim != 1 or arr.size != length:
        raise ValueError(f"{name}: expected shape [{length}], got {arr.shape}")
    arr = arr.astype(np.float32)
    if not np.isfinite(arr).all():
        raise ValueError(f"{name}: expected finite values, found NaN or inf at {int(np.nonzero(~np.isfinite(arr))[0][0])}")
    return arr


def _as_kinds(x, name: str, length: int, default: int) -> np.ndarray:
    if x is None:
        return np.full(length, default, np.uint8)
    arr = _as_int_array(x, name, length)
    if arr.size and (arr.min() < 0 or arr.max() >= MAX_KIND):
        raise ValueError(f"{name}: expected kinds in [0, {MAX_KIND}), got {int(arr[(arr < 0) | (arr >= MAX_KIND)][0])}")
    return arr.astype(np.uint8)


def _as_csr(x, name: str, n_queries: int | None = None) -> Csr:
    if isinstance(x, Csr):
        offsets, values = _as_int_array(x.offsets, f"{name}.offsets"), _as_int_array(x.values, f"{name}.values")
        if offsets.size < 1 or offsets[0] != 0 or offsets[-1] != values.size or (np.diff(offsets) < 0).any():
            raise ValueError(f"{name}: offsets must start at 0, be non-decreasing and end at len(values)")
    elif isinstance(x, Sequence) and not isinstance(x, (str, bytes)):
        lists = [_as_int_array(v, f"{name}[{i}]") for i, v in enumerate(x)]
        offsets = np.zeros(len(lists) + 1, np.int64)
        np.cumsum([v.size for v in lists], out=offsets[1:])
        values = np.concatenate(lists) if lists else np.zeros(0, np.int64)
    else:
        raise TypeError(f"{name}: expected one sequence of ints per query, or a Csr, got {type(x).__name__}")
    if n_queries is not None and offsets.size - 1 != n_queries:
        raise ValueError(f"{name}: expected {n_queries} lists (one per query), got {offsets.size - 1}")
    return Csr(offsets, values)


# -- the graph --------------------------------------------------------------------------------

class KnowledgeGraph:
    """Typed directed multigraph with batched expansion.

    Args:
        backend: ``"native"`` (igraph C library), ``"reference"`` (numpy) or None (native when
            the module is available, else reference).
    """

    def __init__(self, backend: str | None = None):
        if backend not in (None, "native", "reference"):
            raise ValueError(f"backend: expected 'native', 'reference' or None, got {backend!r}")
        if backend == "native" and not _native.available():
            raise ValueError(f"backend 'native' cannot run: {_native.reason_unavailable}")
        use_native = backend == "native" or (backend is None and _native.available())
        self._impl = _native.core.Graph() if use_native else ReferenceGraph()
        self.backend = "native" if use_native else "reference"
        self.node_names: NodeNames | None = None

    # -- building -------------------------------------------------------------------------
    @classmethod
    def from_arrays(cls, node_kind, node_doc, src, dst, *, node_weight=None, edge_kind=None, edge_weight=None,
                    node_names: Sequence[str] | None = None, backend: str | None = None) -> KnowledgeGraph:
        """Builds a graph in one call from ``[n]`` node arrays and ``[m]`` edge arrays."""
        g = cls(backend)
        g.add_nodes(node_kind, node_doc, node_weight, names=node_names)
        g.add_edges(src, dst, edge_kind, edge_weight)
        return g

    def add_nodes(self, kind, doc, weight=None, *, names: Sequence[str] | None = None) -> np.ndarray:
        """Appends nodes; returns their ``[k]`` ids. `kind` and `doc` are ``[k]`` ints, `weight`
        ``[k]`` floats (default 1), `names` k strings (kept for aliases and export)."""
        doc_arr = _as_int_array(doc, "doc")
        k = doc_arr.size
        kind_arr = _as_kinds(kind, "kind", k, NodeKind.ENTITY)
        if doc_arr.size and (doc_arr.min() < 0 or doc_arr.max() >= 2**31):
            bad = int(doc_arr[(doc_arr < 0) | (doc_arr >= 2**31)][0])
            raise ValueError(f"doc: expected document ids in [0, 2^31), got {bad}")
        weight_arr = _as_float_array(weight, "weight", k, 1.0)
        if names is not None:
            if not isinstance(names, Sequence) or isinstance(names, (str, bytes)):
                names = list(names)
            if len(names) != k or not _only_strings(names):
                raise ValueError(f"names: expected {k} strings")
        if self.node_names is None and names is not None and self.n_nodes:
            raise ValueError("names: the graph already has unnamed nodes; name every node or none")
        if self.node_names is not None and names is None and k:
            raise ValueError("names: the graph's nodes are named; give names for the new nodes too")
        first = self.n_nodes
        self._impl.add_nodes(kind_arr, doc_arr, weight_arr)
        if names is not None:
            if self.node_names is None:
                self.node_names = NodeNames()
            self.node_names.extend(names)  # one chunk: appending a few names must not copy them all
        return np.arange(first, first + k, dtype=np.int64)

    def add_edges(self, src, dst, kind=None, weight=None) -> np.ndarray:
        """Appends directed edges ``src[i] -> dst[i]``; returns their ``[m]`` ids. Ids must name
        existing nodes (igraph would silently add nodes for larger ids)."""
        src_arr = _as_int_array(src, "src")
        m = src_arr.size
        dst_arr = _as_int_array(dst, "dst", m)
        n = self.n_nodes
        for name, arr in (("src", src_arr), ("dst", dst_arr)):
            if arr.size and (arr.min() < 0 or arr.max() >= n):
                bad = int(arr[(arr < 0) | (arr >= n)][0])
                raise ValueError(f"{name}: node id {bad} out of range; expected ids in [0, {n})")
        kind_arr = _as_kinds(kind, "kind", m, 0)
        weight_arr = _as_float_array(weight, "weight", m, 1.0)
        first = self.n_edges
        self._impl.add_edges(src_arr, dst_arr, kind_arr, weight_arr)
        return np.arange(first, first + m, dtype=np.int64)

    # -- aliases --------------------------------------------------------------------------
    def set_aliases(self, group_of) -> None:
        """Sets the alias table: ``group_of[v] >= 0`` is v's group, -1 means no alias.

        Group ids are labels: they are renumbered densely in ascending order (0, 1, ... for the
        distinct ids given), so :attr:`alias_of` holds ids below ``n_nodes`` and the group table
        never grows with the size of an id (identity for ids that are already dense)."""
        groups = _as_int_array(group_of, "group_of", self.n_nodes)
        if groups.size and (groups.min() < -1 or groups.max() >= 2**31 - 1):
            raise ValueError(f"group_of: expected group ids in [0, 2^31 - 1) or -1, got {int(groups[(groups < -1) | (groups >= 2**31 - 1)][0])}")
        member = groups >= 0
        if member.any() and int(groups.max()) >= self.n_nodes:
            dense = groups.copy()
            dense[member] = np.unique(groups[member], return_inverse=True)[1]
            groups = dense
        self._impl.set_aliases(groups)

    def set_aliases_from_names(self, kinds: Iterable[int] | None = (NodeKind.ENTITY,)) -> int:
        """Groups nodes of `kinds` whose :func:`normalize_name` is equal (across documents).
        Returns the number of groups with two or more members."""
        if self.node_names is None:
            raise ValueError("node names: the graph has none; pass names= to add_nodes")
        mask = kind_mask(kinds)
        node_kind = self.node_kind
        keys: dict[str, list[int]] = {}
        for v, name in enumerate(self.node_names):
            if (mask >> int(node_kind[v])) & 1:
                keys.setdefault(normalize_name(name), []).append(v)
        group_of = np.full(self.n_nodes, -1, np.int64)
        n_groups = 0
        for members in keys.values():
            if len(members) > 1:
                group_of[members] = n_groups
                n_groups += 1
        self._impl.set_aliases(group_of)
        return n_groups

    # -- reading --------------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        return int(self._impl.n_nodes)

    @property
    def n_edges(self) -> int:
        return int(self._impl.n_edges)

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """``(src [m], dst [m])`` int64."""
        return self._impl.edge_list()

    node_kind = property(lambda self: self._impl.node_kind(), doc="[n] uint8")
    node_doc = property(lambda self: self._impl.node_doc(), doc="[n] int64")
    node_weight = property(lambda self: self._impl.node_weight(), doc="[n] float32")
    edge_kind = property(lambda self: self._impl.edge_kind(), doc="[m] uint8")
    edge_weight = property(lambda self: self._impl.edge_weight(), doc="[m] float32")
    alias_of = property(lambda self: self._impl.alias_of(), doc="[n] int64 alias group or -1")

    def memory_bytes(self) -> int:
        """Bytes held by topology and attributes (names excluded)."""
        return int(self._impl.memory_bytes())

    def set_copy_budget(self, bytes_per_edge: float) -> None:
        """Memory the native backend may spend on sequential int32 copies of the longest
        adjacency lists, in bytes per edge (default 2.0, longest lists first; each edge sits in
        two lists, so copying every list takes a little over 8). Expansion reads a copied list sequentially and any other
        at random, so a larger budget speeds up deep expansions (l >= 3, where short lists carry
        much of the scan) at that memory cost. Not saved with the graph; the numpy reference
        has its own layout and only checks the value."""
        if isinstance(bytes_per_edge, bool) or not isinstance(bytes_per_edge, (int, float, np.integer, np.floating)):
            raise TypeError(f"bytes_per_edge: expected a number, got {type(bytes_per_edge).__name__}")
        if not np.isfinite(bytes_per_edge) or bytes_per_edge < 0:
            raise ValueError(f"bytes_per_edge: expected a finite number >= 0, got {bytes_per_edge!r}")
        self._impl.set_copy_budget(float(bytes_per_edge))

    def __repr__(self) -> str:
        return f"KnowledgeGraph(nodes={self.n_nodes}, edges={self.n_edges}, backend={self.backend!r})"

    # -- expansion ------------------------------------------------------------------------
    def expand(self, seeds, hops: int = 1, *, scores=None, threshold: float = 0.5, min_keep: int = 3,
               node_kinds: Iterable[int] | None = None, edge_kinds: Iterable[int] | None = None,
               docs=None, budget: int | None = None, direction: str = "both", merge_aliases: bool = True,
               with_edges: bool = True, num_threads: int | None = None) -> Expansion:
        """Batched multi-source BFS from each query's seeds, keeping query-relevant neighbours.

        Args:
            seeds: per query, the seed node ids (a sequence of sequences, or a :class:`Csr`).
            hops: BFS depth l >= 0 (0 returns the seeds).
            scores: relevance of nodes per query: a dense ``[Nq, n_nodes]`` float array, a
                :class:`SparseScores`, a list of ``{node: score}`` dicts, or None (no filter).
            threshold, min_keep: per hop, neighbours with score > threshold are kept, and at
                least the `min_keep` best when fewer pass (mKG-RAG's rule: 0.5 and 3). The
                top-up draws only from candidates with a score > -inf (ties by lower node id):
                a node unlisted in sparse scores, or -inf in a dense matrix, is never admitted
                by it, so fewer than `min_keep` may be kept. With ``scores=None`` every
                neighbour is kept.
            node_kinds, edge_kinds: kinds that may be reached / traversed (None: all).
            docs: per query, the document ids the expansion may enter (None: all).
            budget: most nodes per query, seeds included (seeds are always kept).
            direction: follow edges ``"out"``, ``"in"`` or ``"both"`` ways.
            merge_aliases: treat each alias group (within the allowed documents) as one node.
            with_edges: also list the edges of each query's induced subgraph.
            num_threads: worker threads (default: COLGRAPH_NUM_THREADS or torch's count).

        Returns:
            :class:`Expansion`, CSR over queries; ``expansion[i]`` is query i's subgraph.
        """
        seed_csr = _as_csr(seeds, "seeds")
        nq, n = seed_csr.offsets.size - 1, self.n_nodes
        if seed_csr.values.size and (seed_csr.values.min() < 0 or seed_csr.values.max() >= n):
            bad = int(seed_csr.values[(seed_csr.values < 0) | (seed_csr.values >= n)][0])
            raise ValueError(f"seeds: node id {bad} out of range; expected ids in [0, {n})")
        if isinstance(hops, bool) or not isinstance(hops, (int, np.integer)) or hops < 0:
            raise ValueError(f"hops: expected an int >= 0, got {hops!r}")
        if isinstance(min_keep, bool) or not isinstance(min_keep, (int, np.integer)) or min_keep < 0:
            raise ValueError(f"min_keep: expected an int >= 0, got {min_keep!r}")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 0):
            raise ValueError(f"budget: expected None or an int >= 0, got {budget!r}")
        if not isinstance(threshold, (int, float, np.floating, np.integer)) or np.isnan(threshold):
            raise ValueError(f"threshold: expected a number, got {threshold!r}")
        if direction not in _DIRECTIONS:
            raise ValueError(f"direction: expected one of {sorted(_DIRECTIONS)}, got {direction!r}")
        for flag, value in (("merge_aliases", merge_aliases), ("with_edges", with_edges)):
            if not isinstance(value, bool):
                raise TypeError(f"{flag}: expected a bool, got {type(value).__name__}")
        kw = dict(threshold=float(np.float32(threshold)), min_keep=int(min_keep),
                  budget=-1 if budget is None else int(budget), node_kind_mask=kind_mask(node_kinds),
                  edge_kind_mask=kind_mask(edge_kinds), direction=_DIRECTIONS[direction], merge_aliases=merge_aliases,
                  with_edges=with_edges)
        kw.update(self._scores_args(scores, nq, n))
        if docs is not None:
            doc_csr = _as_csr(docs, "docs", nq)
            kw.update(doc_offsets=doc_csr.offsets, docs=doc_csr.values)
        if num_threads is None:
            from ..ops._native_impl import num_threads as default_threads
            num_threads = default_threads()
        raw = self._impl.expand(seed_csr.offsets, seed_csr.values, int(hops), num_threads=int(num_threads), **kw)
        return Expansion(**{k: np.asarray(v) for k, v in raw.items()})

    @staticmethod
    def _scores_args(scores, nq: int, n: int) -> dict:
        if scores is None:
            return {}
        if hasattr(scores, "detach") and hasattr(scores, "numpy"):
            scores = scores.detach().cpu().numpy()
        if isinstance(scores, np.ndarray):
            if scores.dtype.kind not in "fiu":
                raise TypeError(f"scores: expected a float array, got dtype {scores.dtype}")
            if scores.shape != (nq, n):
                raise ValueError(f"scores: expected shape [{nq}, {n}] (queries x nodes), got {scores.shape}")
            return {"dense_scores": np.ascontiguousarray(scores, np.float32)}
        if isinstance(scores, SparseScores):
            offsets, nodes = _as_csr(Csr(scores.offsets, scores.nodes), "scores", nq)
            values = np.asarray(scores.values, np.float32)
        elif isinstance(scores, Sequence) and all(isinstance(d, Mapping) for d in scores):
            if len(scores) != nq:
                raise ValueError(f"scores: expected {nq} dicts (one per query), got {len(scores)}")
            offsets = np.zeros(nq + 1, np.int64)
            np.cumsum([len(d) for d in scores], out=offsets[1:])
            nodes = np.fromiter((k for d in scores for k in d.keys()), np.int64, int(offsets[-1]))
            values = np.fromiter((v for d in scores for v in d.values()), np.float32, int(offsets[-1]))
        else:
            raise TypeError(f"scores: expected a [Nq, n_nodes] array, SparseScores or a list of dicts, got {type(scores).__name__}")
        if values.shape != nodes.shape:
            raise ValueError(f"scores: expected one value per listed node, got {values.size} values for {nodes.size} nodes")
        if nodes.size and (nodes.min() < 0 or nodes.max() >= n):
            raise ValueError(f"scores: node id {int(nodes[(nodes < 0) | (nodes >= n)][0])} out of range [0, {n})")
        if np.isnan(values).any():
            raise ValueError(f"scores: NaN for node {int(nodes[np.isnan(values)][0])}")
        return {"score_offsets": offsets, "score_nodes": nodes, "score_values": values}

    # -- conversion -----------------------------------------------------------------------
    def to_igraph(self):
        """A python-igraph ``Graph`` (directed) with vertex attributes kind/doc/weight(/name)
        and edge attributes kind/weight."""
        import igraph as ig
        src, dst = self.edges()
        g = ig.Graph(n=self.n_nodes, edges=np.stack([src, dst], 1).tolist(), directed=True)
        g.vs["kind"], g.vs["doc"], g.vs["weight"] = self.node_kind.tolist(), self.node_doc.tolist(), self.node_weight.tolist()
        g.es["kind"], g.es["weight"] = self.edge_kind.tolist(), self.edge_weight.tolist()
        if self.node_names is not None:
            g.vs["name"] = list(self.node_names)
        return g

    @classmethod
    def from_igraph(cls, g, *, backend: str | None = None) -> KnowledgeGraph:
        """From a python-igraph ``Graph``; missing attributes default to kind ENTITY / doc 0 /
        weight 1 (edges: kind 0 / weight 1). An undirected graph's edges keep igraph's order."""
        vattrs, eattrs = set(g.vs.attributes()), set(g.es.attributes())
        n = g.vcount()
        edges = np.array(g.get_edgelist(), np.int64).reshape(-1, 2)
        return cls.from_arrays(
            g.vs["kind"] if "kind" in vattrs else None,
            g.vs["doc"] if "doc" in vattrs else np.zeros(n, np.int64),
            edges[:, 0], edges[:, 1],
            node_weight=g.vs["weight"] if "weight" in vattrs else None,
            edge_kind=g.es["kind"] if "kind" in eattrs else None,
            edge_weight=g.es["weight"] if "weight" in eattrs else None,
            node_names=g.vs["name"] if "name" in vattrs else None,
            backend=backend)

    def to_edge_list(self) -> list[tuple[int, int, int, float]]:
        """``[(src, dst, kind, weight), ...]`` in edge id order."""
        src, dst = self.edges()
        return list(zip(src.tolist(), dst.tolist(), self.edge_kind.tolist(), self.edge_weight.tolist()))

    @classmethod
    def from_edge_list(cls, edges: Iterable[Sequence], n_nodes: int | None = None, *, node_kind=None, node_doc=None,
                       backend: str | None = None) -> KnowledgeGraph:
        """From ``(src, dst)``, ``(src, dst, kind)`` or ``(src, dst, kind, weight)`` tuples.
        `n_nodes` defaults to the largest id + 1; nodes default to kind ENTITY in document 0."""
        rows = [tuple(e) for e in edges]
        if any(not 2 <= len(r) <= 4 for r in rows):
            raise ValueError("edges: expected (src, dst[, kind[, weight]]) tuples")
        width = max((len(r) for r in rows), default=2)
        if any(len(r) != width for r in rows):
            raise ValueError("edges: expected every tuple to have the same length")
        cols = list(zip(*rows)) if rows else [(), ()]
        src, dst = _as_int_array(list(cols[0]), "src"), _as_int_array(list(cols[1]), "dst")
        if n_nodes is None:
            n_nodes = int(max(src.max(initial=-1), dst.max(initial=-1))) + 1
        return cls.from_arrays(node_kind, np.zeros(n_nodes, np.int64) if node_doc is None else node_doc, src, dst,
                               edge_kind=list(cols[2]) if width > 2 else None,
                               edge_weight=list(cols[3]) if width > 3 else None, backend=backend)

    # -- persistence ----------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Writes topology, attributes, aliases and names to directory `path`, atomically.
        Raises ValueError naming `path` when it is a non-empty folder that holds no graph."""
        src, dst = self.edges()
        arrays = {"node_kind": self.node_kind, "node_doc": self.node_doc, "node_weight": self.node_weight,
                  "src": src, "dst": dst, "edge_kind": self.edge_kind, "edge_weight": self.edge_weight,
                  "alias_of": self.alias_of}
        if self.node_names is not None:
            encoded = [s.encode("utf-8") for s in self.node_names]
            arrays["name_bytes"] = np.frombuffer(b"".join(encoded), np.uint8)
            arrays["name_offsets"] = np.concatenate([[0], np.cumsum([len(b) for b in encoded])]).astype(np.int64)
        meta = {"n_nodes": self.n_nodes, "n_edges": self.n_edges, "named": self.node_names is not None}
        return _arraydir.write(path, FORMAT_NAME, FORMAT_VERSION, meta, arrays)

    @classmethod
    def load(cls, path: str | os.PathLike, *, verify: bool = True, backend: str | None = None) -> KnowledgeGraph:
        """Reads a graph written by :meth:`save`; a damaged directory raises FormatError."""
        path = Path(path)
        with _atomic.reading(path):  # finishes an interrupted save; no save swaps the folder meanwhile
            return cls._load(path, verify=verify, backend=backend)

    @classmethod
    def _load(cls, path: Path, *, verify: bool, backend: str | None) -> KnowledgeGraph:
        m = _arraydir.read_manifest(path, FORMAT_NAME, FORMAT_VERSION)
        n, e = _arraydir.meta_int(m, "n_nodes", path), _arraydir.meta_int(m, "n_edges", path)
        read = lambda name, dt, shape: _arraydir.read_array(path, m, name, dt, shape, verify=verify)  # noqa: E731
        names = None
        if m.get("named") is True:
            offsets = read("name_offsets", np.int64, (n + 1,))
            blob = read("name_bytes", np.uint8, (int(offsets[-1]) if offsets.size else 0,)).tobytes()
            if offsets[0] != 0 or (np.diff(offsets) < 0).any():
                raise _arraydir.FormatError(f"{path / 'name_offsets.bin'}: offsets must be non-decreasing from 0")
            try:
                names = [blob[offsets[i]:offsets[i + 1]].decode("utf-8") for i in range(n)]
            except UnicodeDecodeError as exc:
                raise _arraydir.FormatError(f"{path / 'name_bytes.bin'}: not UTF-8 ({exc})") from None
        try:
            g = cls.from_arrays(read("node_kind", np.uint8, (n,)), read("node_doc", np.int64, (n,)),
                                read("src", np.int64, (e,)), read("dst", np.int64, (e,)),
                                node_weight=read("node_weight", np.float32, (n,)),
                                edge_kind=read("edge_kind", np.uint8, (e,)),
                                edge_weight=read("edge_weight", np.float32, (e,)), node_names=names, backend=backend)
            alias_of = read("alias_of", np.int64, (n,))
            if n and int(alias_of.max()) >= n:  # save() writes dense ids; a larger one is crafted
                raise _arraydir.FormatError(f"{path / 'alias_of.bin'}: alias group id {int(alias_of.max())} "
                                            f"is not below the node count {n}")
            g.set_aliases(alias_of)
        except _arraydir.FormatError:
            raise
        except (ValueError, TypeError) as exc:
            raise _arraydir.FormatError(f"{path}: inconsistent graph data ({exc})") from None
        return g
