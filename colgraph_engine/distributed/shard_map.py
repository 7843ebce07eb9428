"""Which shard holds which document, and the global document order.

Sharding is by whole document: a document's graph, items and vectors live on exactly one shard,
so no edge ever crosses shards (the index never links documents by edges; alias groups are a
query-time view, merged after gathering, see :mod:`.gather`).

Every document gets a *sequence number* when it is first added (rising, never reused, kept when
the document moves between shards). Sorting the documents by it gives the **global order**: the
order a single :class:`~colgraph_engine.kg.KnowledgeIndex` fed the same adds and removals holds
them in, hence its document numbers' order, node ids and edge ids (a document's nodes and edges
are contiguous in that order). The map keeps each document's node and edge counts so the global
node and edge ids of any document are known without asking a shard.

**Placement** (ours): a new document goes to the shard with the least load (ties: the lowest
shard), load = the document's vector rows over all stores (the bulk of a shard's memory).
**Rebalancing** (ours): after a change, while the heaviest and lightest shards differ by more than
``tolerance`` x the mean load, a whole document moves to the lightest shard: from the heaviest
shard that holds a document lighter than its gap to the lightest, the one closest to half that
gap. Every move lowers the sum of squared shard loads, so planning ends; it stops when no such
document exists.

The map is persisted as ``shards.json`` (temporary file, fsync, rename, fsync of the folder): it
is the commit point of every change of a sharded index (see :mod:`.corpus`).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._atomic import fsync_dir, fsync_file

MAP_FORMAT = "colgraph-shard-map"
MAP_VERSION = 1
MAP_FILE = "shards.json"


@dataclass(frozen=True)
class Placement:
    """One document's place: ``seq`` (global order), ``shard``, ``load`` (vector rows),
    ``n_nodes`` and ``n_edges`` (of its graph)."""
    seq: int
    shard: int
    load: int
    n_nodes: int
    n_edges: int


@dataclass(frozen=True)
class Move:
    """Document `doc_id` moves from shard `src` to shard `dst`."""
    doc_id: str
    src: int
    dst: int


class ShardMap:
    """Documents -> shards, with the global order and per-document graph sizes.

    Args:
        n_shards: number of shards (>= 1).
    """

    def __init__(self, n_shards: int):
        if isinstance(n_shards, bool) or not isinstance(n_shards, int) or n_shards < 1:
            raise ValueError(f"n_shards: expected an int >= 1, got {n_shards!r}")
        self.n_shards = n_shards
        self.docs: dict[str, Placement] = {}
        self.next_seq = 0
        self.version = 0  # bumped by every change; caches of the order follow it
        self._cache: tuple[int, dict] | None = None

    # -- reading --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.docs)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self.docs

    def shard_of(self, doc_id: str) -> int:
        if doc_id not in self.docs:
            raise ValueError(f"doc_id: no document {doc_id!r} in the sharded index")
        return self.docs[doc_id].shard

    def loads(self) -> list[int]:
        """Load (vector rows) per shard."""
        out = [0] * self.n_shards
        for p in self.docs.values():
            out[p.shard] += p.load
        return out

    def documents_of(self, shard: int) -> list[str]:
        """Document ids on `shard`, in global order."""
        return [d for d in self.order()["ids"] if self.docs[d].shard == shard]

    def order(self) -> dict:
        """The global order, cached per version: ``ids`` (doc ids by sequence number),
        ``position`` (doc id -> index in ids), ``node_first [D+1]`` and ``edge_first [D+1]``
        (global node / edge id of each document's first node / edge, int64)."""
        if self._cache is None or self._cache[0] != self.version:
            ids = sorted(self.docs, key=lambda d: self.docs[d].seq)
            nodes = np.fromiter((self.docs[d].n_nodes for d in ids), np.int64, len(ids))
            edges = np.fromiter((self.docs[d].n_edges for d in ids), np.int64, len(ids))
            node_first, edge_first = np.zeros(len(ids) + 1, np.int64), np.zeros(len(ids) + 1, np.int64)
            np.cumsum(nodes, out=node_first[1:])
            np.cumsum(edges, out=edge_first[1:])
            self._cache = (self.version, {"ids": ids, "position": {d: i for i, d in enumerate(ids)},
                                          "node_first": node_first, "edge_first": edge_first})
        return self._cache[1]

    # -- changes ----------------------------------------------------------------------------------
    def place(self, doc_id: str, *, load: int, n_nodes: int, n_edges: int) -> int:
        """Records a new document on the least-loaded shard; returns that shard."""
        if not isinstance(doc_id, str) or not doc_id:
            raise ValueError(f"doc_id: expected a non-empty str, got {doc_id!r}")
        if doc_id in self.docs:
            raise ValueError(f"doc_id: document {doc_id!r} is already in the sharded index")
        for name, v in (("load", load), ("n_nodes", n_nodes), ("n_edges", n_edges)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {v!r}")
        loads = self.loads()
        shard = loads.index(min(loads))
        self.docs[doc_id] = Placement(self.next_seq, shard, load, n_nodes, n_edges)
        self.next_seq += 1
        self.version += 1
        return shard

    def remove(self, doc_id: str) -> int:
        """Forgets a document; returns the shard that held it."""
        shard = self.shard_of(doc_id)
        del self.docs[doc_id]
        self.version += 1
        return shard

    def move(self, doc_id: str, dst: int) -> None:
        p = self.docs[doc_id]
        if not 0 <= dst < self.n_shards:
            raise ValueError(f"dst: expected a shard in [0, {self.n_shards}), got {dst}")
        self.docs[doc_id] = Placement(p.seq, dst, p.load, p.n_nodes, p.n_edges)
        self.version += 1

    def plan_rebalance(self, tolerance: float = 0.1, max_moves: int = 1000) -> list[Move]:
        """The moves that bring the shards within `tolerance` x mean load (see the module
        docstring); the map itself is not changed."""
        loads = self.loads()
        where = {d: p.shard for d, p in self.docs.items()}
        moves: list[Move] = []
        mean = sum(loads) / self.n_shards
        while len(moves) < max_moves:
            lo = loads.index(min(loads))
            if max(loads) - loads[lo] <= tolerance * mean or max(loads) == loads[lo]:
                break
            # from the heaviest shard that has one: the document closest to half its gap to the
            # lightest; a move of load x from a to b with 0 < x < gap lowers the sum of squared
            # loads, so planning ends
            best = None
            for src in sorted(range(self.n_shards), key=lambda s: (-loads[s], s)):
                gap = loads[src] - loads[lo]
                if gap <= 0:
                    break
                for d, s in where.items():
                    load = self.docs[d].load
                    if s != src or not 0 < load < gap:
                        continue
                    err = (abs(2 * load - gap), self.docs[d].seq)
                    if best is None or err < best[0]:
                        best = (err, d, src)
                if best is not None:
                    break
            if best is None:
                break
            _, d, src = best
            moves.append(Move(d, src, lo))
            where[d] = lo
            loads[src] -= self.docs[d].load
            loads[lo] += self.docs[d].load
        return moves

    # -- persistence ------------------------------------------------------------------------------
    def as_json(self) -> dict:
        return {"format": MAP_FORMAT, "version": MAP_VERSION, "n_shards": self.n_shards, "next_seq": self.next_seq,
                "documents": [[d, p.seq, p.shard, p.load, p.n_nodes, p.n_edges]
                              for d, p in sorted(self.docs.items(), key=lambda kv: kv[1].seq)]}

    @classmethod
    def from_json(cls, m: object, where: str = MAP_FILE) -> ShardMap:
        """The map of a ``shards.json`` document; ValueError naming `where` when malformed."""
        def bad(why):
            return ValueError(f"{where}: {why}")
        if not isinstance(m, dict) or m.get("format") != MAP_FORMAT:
            raise bad(f"expected a {MAP_FORMAT!r} document")
        if m.get("version") != MAP_VERSION:
            raise bad(f"expected version {MAP_VERSION}, got {m.get('version')!r}")
        n, nxt, rows = m.get("n_shards"), m.get("next_seq"), m.get("documents")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise bad(f"n_shards: expected an int >= 1, got {n!r}")
        if isinstance(nxt, bool) or not isinstance(nxt, int) or nxt < 0 or not isinstance(rows, list):
            raise bad("next_seq / documents: expected an int >= 0 and a list")
        out = cls(n)
        seqs = set()
        for i, row in enumerate(rows):
            ok = isinstance(row, list) and len(row) == 6 and isinstance(row[0], str) and row[0] and all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in row[1:])
            if not ok or row[2] >= n or row[1] >= nxt or row[0] in out.docs or row[1] in seqs:
                raise bad(f"documents[{i}]: expected [doc_id, seq < next_seq, shard < n_shards, load, nodes, edges] "
                          f"with unique ids and seqs, got {row!r}")
            seqs.add(row[1])
            out.docs[row[0]] = Placement(*row[1:])
        out.next_seq = nxt
        return out

    def save(self, folder: Path) -> None:
        """Writes ``folder/shards.json`` atomically (temporary file, fsync, rename, fsync folder)."""
        target = Path(folder) / MAP_FILE
        tmp = target.with_name(f".{MAP_FILE}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(self.as_json(), separators=(",", ":")))
        fsync_file(tmp)
        os.replace(tmp, target)
        fsync_dir(target.parent)

    @classmethod
    def load(cls, folder: Path) -> ShardMap:
        path = Path(folder) / MAP_FILE
        if not path.is_file():
            raise ValueError(f"path: no {MAP_FILE} in {folder} (not a sharded index)")
        try:
            m = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: cannot read the shard map ({exc})") from None
        return cls.from_json(m, str(path))


__all__ = ["MAP_FILE", "Move", "Placement", "ShardMap"]
