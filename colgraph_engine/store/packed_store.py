"""Packed multi-vector store: the document side of every MaxSim operation.

Layout (see :mod:`colgraph_engine.packed`): ``values [T, d]``, ``offsets [N+1]``, plus
``ids [N]`` (stable int64 external ids, unique) and ``alive [N]`` (False = deleted). Deletion
is a tombstone; :meth:`PackedStore.compact` drops tombstoned rows. Values are checked for
NaN/inf once, when they enter the store (after the cast to the store's dtype), not on every
query.

Concurrency (the reader/writer contract): the contents live in one immutable
:class:`StoreSnapshot` (values, offsets, ids, alive, id lookup). Writers (:meth:`~PackedStore.add`,
:meth:`~PackedStore.delete`, :meth:`~PackedStore.compact`) are serialised by a lock, build a new
snapshot beside the old one and publish it with a single attribute assignment. Every reader
(:meth:`~PackedStore.search`, :meth:`~PackedStore.score_candidates`, :meth:`~PackedStore.positions`,
:meth:`~PackedStore.get`, :meth:`~PackedStore.ids_between`, ``len``, ...) takes the snapshot once at
entry and uses only it, so a reader running during a write sees the store entirely before or
entirely after that write, never a mix. Code that reads several of ``values``/``offsets``/``ids``/
``alive`` should take :meth:`~PackedStore.snapshot` once instead of reading the properties one by one.

On disk a store is one directory, written atomically (:mod:`colgraph_engine._atomic`)::

    manifest.json   format name and version, dtype, dim, counts, per-file shape/bytes/sha256
    values.bin      [T, d] raw little-endian (bf16 stored as its 16-bit patterns)
    offsets.bin     [N+1] int64
    ids.bin         [N] int64
    alive.bin       [N] uint8

No pickle. :meth:`PackedStore.load` memory-maps the arrays and rejects a truncated, tampered
or inconsistent directory with :class:`StoreFormatError`.
"""
from __future__ import annotations

import numbers
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from .. import _arraydir, _atomic
from .. import backend as _backend
from ..ops import scoring as _ops
from ..packed import FLOAT_DTYPES, check_finite, check_no_grad, check_offsets, check_packed, check_values, pack
from .checks import _MAX_ID, _as_id_tensor, _check_device, _check_id_int, _new_ids
from .snapshot import StoreSnapshot, _Columns, _find_positions, _positions

FORMAT_NAME = "colgraph_engine.packed_store"
FORMAT_VERSION = 1
_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_DTYPES_BY_NAME = {v: k for k, v in _DTYPE_NAMES.items()}
# numpy dtype used to hold each torch dtype's bytes on disk
_DISK_NP = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.int16}


StoreFormatError = _arraydir.FormatError  # a ValueError: missing, truncated, tampered or inconsistent


class PackedStore:
    """A growable collection of variable-length vector sets with stable ids.

    Safe to share between threads: writers are serialised, readers never block and always see
    one consistent version (see the module docstring for the contract).

    Args:
        dim: vector dimension d (>= 1).
        dtype: storage dtype: torch.float32, torch.float16 or torch.bfloat16.
        device: where values live ("cpu" or a CUDA device).
        normalize: L2-normalise every vector on entry (queries are normalised at search time).
    """

    def __init__(self, dim: int, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 normalize: bool = False):
        if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
            raise TypeError(f"dim: expected a positive int, got {type(dim).__name__} {dim!r}")
        if dim < 1:
            raise ValueError(f"dim: expected a positive int, got {dim!r}")
        if dtype not in FLOAT_DTYPES:
            raise TypeError(f"dtype: expected one of {FLOAT_DTYPES}, got {dtype}")
        if not isinstance(normalize, bool):
            raise TypeError(f"normalize: expected a bool, got {type(normalize).__name__}")
        self.dim, self.dtype, self.normalize = int(dim), dtype, normalize
        self.device = _check_device(device)
        self._write_lock = threading.Lock()
        # Capacity buffer behind the current snapshot's values (writers only): rows past the
        # snapshot's T are unused, so appending there never touches rows a reader can see.
        self._buf = torch.empty((0, self.dim), dtype=dtype, device=self.device)
        # The same for offsets, ids, alive and the sorted-id lookup (see _Columns).
        self._cols = _Columns()
        self._snap = StoreSnapshot(self._buf[:0], torch.zeros(1, dtype=torch.int64, device=self.device),
                                   torch.empty(0, dtype=torch.int64, device=self.device),
                                   torch.empty(0, dtype=torch.bool, device=self.device), 0, 0)

    # -- snapshot ------------------------------------------------------------------------
    def snapshot(self) -> StoreSnapshot:
        """The current immutable version of the contents (one consistent values/offsets/ids/alive)."""
        return self._snap

    # Field-wise access kept for code that assembles a store (load) or writes one out (save):
    # each read takes the current snapshot; each assignment publishes a new one. Not for
    # concurrent use; readers use snapshot().
    @property
    def _values(self) -> torch.Tensor:
        return self._snap.values

    @_values.setter
    def _values(self, v: torch.Tensor) -> None:
        self._buf = v
        self._snap = self._snap.replace(values=v[: self._snap.values.shape[0]])

    @property
    def _n_tokens(self) -> int:
        return self._snap.values.shape[0]

    @_n_tokens.setter
    def _n_tokens(self, t: int) -> None:
        self._snap = self._snap.replace(values=self._buf[:t])

    @property
    def _offsets(self) -> torch.Tensor:
        return self._snap.offsets

    @_offsets.setter
    def _offsets(self, o: torch.Tensor) -> None:
        self._snap = self._snap.replace(offsets=o)

    @property
    def _ids(self) -> torch.Tensor:
        return self._snap.ids

    @_ids.setter
    def _ids(self, ids: torch.Tensor) -> None:
        self._snap = self._snap.replace(ids=ids)

    @property
    def _alive(self) -> torch.Tensor:
        return self._snap.alive

    @_alive.setter
    def _alive(self, alive: torch.Tensor) -> None:
        self._snap = self._snap.replace(alive=alive)

    @property
    def _next_id(self) -> int:
        return self._snap.next_id

    @_next_id.setter
    def _next_id(self, n: int) -> None:
        self._snap = self._snap.replace(next_id=int(n))

    # -- views ---------------------------------------------------------------------------
    @property
    def values(self) -> torch.Tensor:
        """``[T, d]`` all stored vectors (tombstoned items included until compact). Read-only."""
        return self._snap.values

    @property
    def offsets(self) -> torch.Tensor:
        """``[N+1]`` int64 item offsets into :attr:`values`."""
        return self._snap.offsets

    @property
    def ids(self) -> torch.Tensor:
        """``[N]`` int64 external ids by position."""
        return self._snap.ids

    @property
    def alive(self) -> torch.Tensor:
        """``[N]`` bool: False for deleted items."""
        return self._snap.alive

    @property
    def n_slots(self) -> int:
        """Items stored, deleted ones included."""
        return self._snap.n_slots

    def __len__(self) -> int:
        return self._snap.n_live

    def __repr__(self) -> str:
        s = self._snap
        return (f"PackedStore(items={s.n_live}, deleted={s.n_slots - s.n_live}, tokens={s.values.shape[0]}, "
                f"dim={self.dim}, dtype={self.dtype}, device={self.device})")

    # -- ids -----------------------------------------------------------------------------
    def _sorted_ids(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._snap.lookup()

    def ids_between(self, low: int, high: int) -> torch.Tensor:
        """Live ids in ``[low, high)``, ascending (a range lookup in the sorted id cache)."""
        low, high = _check_id_int(low, "low"), _check_id_int(high, "high")
        snap = self._snap
        s, order = snap.lookup()
        a, b = (int(torch.searchsorted(s, torch.tensor(min(max(x, 0), _MAX_ID), dtype=torch.int64, device=s.device)))
                if x <= _MAX_ID else s.numel() for x in (low, high))
        b = max(a, b)
        return s[a:b][snap.alive[order[a:b]]]

    def live_ids(self) -> np.ndarray:
        """Every live id, ascending, as one host int64 array (for bookkeeping over many id ranges
        at once: ``np.searchsorted`` on it replaces one :meth:`ids_between` call per range)."""
        snap = self._snap
        s, order = snap.lookup()
        return s[snap.alive[order]].cpu().numpy()

    def positions(self, ids: torch.Tensor | Sequence[int], *, allow_deleted: bool = False,
                  name: str = "ids") -> torch.Tensor:
        """``[K]`` int64 positions of external `ids`; ValueError for unknown (or deleted) ids.
        `name` is the argument named in error messages."""
        return _positions(self._snap, _as_id_tensor(ids, name).to(self.device), allow_deleted, name)

    def get(self, item_id: int) -> torch.Tensor:
        """``[L, d]`` vectors of one live item (a read-only view)."""
        item_id = _check_id_int(item_id, "item_id")
        snap = self._snap
        if not 0 <= item_id <= _MAX_ID:
            raise ValueError(f"item_id: id {item_id} is not in the store")
        p = int(_positions(snap, torch.tensor([item_id], dtype=torch.int64, device=self.device), False, "item_id")[0])
        lo, hi = snap.offsets[p: p + 2].tolist()
        return snap.values[lo:hi]

    # -- mutation ------------------------------------------------------------------------
    def add(self, items: Sequence[torch.Tensor] | tuple[torch.Tensor, torch.Tensor],
            ids: torch.Tensor | Sequence[int] | None = None) -> torch.Tensor:
        """Appends items; returns their ``[K]`` int64 ids.

        Args:
            items: a sequence of ``[L_i, d]`` tensors, or a packed ``(values [T, d], offsets [K+1])``.
            ids: optional unique non-negative ids not already in the store; default: next free ids.

        Nothing changes if any check fails. Concurrent readers see the store before or after
        the whole batch, never part of it.
        """
        if isinstance(items, tuple) and len(items) == 2 and all(isinstance(t, torch.Tensor) for t in items) \
                and items[1].dim() == 1:
            values, offsets = check_packed(items[0], items[1], "items")
        else:
            values, offsets = pack(items)
        if values.shape[1] != self.dim:
            raise ValueError(f"items: expected dimension d={self.dim}, got {values.shape[1]}")
        check_no_grad(values, "items", "the store keeps values, not autograd graphs")
        source = values.to(self.device)
        values = source
        if self.normalize:
            values = torch.nn.functional.normalize(values.float(), dim=-1)
        values = values.to(self.dtype)
        check_finite(values, "items", source=source)  # after the cast: overflow to inf is caught too
        offsets = offsets.to(self.device)
        k = offsets.numel() - 1
        with self._write_lock:
            snap = self._snap
            new_ids = _new_ids(snap, ids, k, self.device)
            # All checks passed: build the next version beside the current one.
            t_old = snap.values.shape[0]
            need = t_old + values.shape[0]
            buf = self._buf
            if need > buf.shape[0] or buf.data_ptr() != snap.values.data_ptr() and t_old:
                grown = torch.empty((max(need, 2 * buf.shape[0], 1024), self.dim), dtype=self.dtype, device=self.device)
                grown[:t_old] = snap.values
                buf = grown
            buf[t_old:need] = values  # rows no published snapshot covers
            new = self._cols.extend(snap, buf[:need], offsets[1:] + t_old, new_ids)
            self._buf = buf
            self._snap = new  # publish
        return new_ids

    def delete(self, ids: torch.Tensor | Sequence[int]) -> int:
        """Tombstones items by id; returns how many were deleted. Unknown, already deleted or
        repeated ids raise ValueError and nothing is deleted."""
        q = _as_id_tensor(ids, "ids").to(self.device)
        with self._write_lock:
            snap = self._snap
            pos = _positions(snap, q, False, "ids")
            if pos.numel() > 1:
                u, counts = torch.unique(q, return_counts=True)
                if bool((counts > 1).any()):
                    raise ValueError(f"ids: expected each id once, got id {int(u[counts > 1][0])} "
                                     f"{int(counts.max())} times")
            alive = snap.alive.clone()
            alive[pos] = False
            self._snap = snap.replace(alive=alive, n_live=snap.n_live - pos.numel())  # ids unchanged: keep lookup
        return int(pos.numel())

    def compact(self) -> None:
        """Removes tombstoned items and their vectors; ids of live items are kept. Readers that
        started before keep using the old version until they finish."""
        with self._write_lock:
            snap = self._snap
            if snap.n_live == snap.n_slots:
                return
            keep = torch.nonzero(snap.alive).squeeze(1)
            lengths = snap.offsets.diff()[keep]
            starts = snap.offsets[keep]
            rows = torch.repeat_interleave(starts, lengths) + (
                torch.arange(int(lengths.sum()), device=self.device)
                - torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths))
            values = snap.values[rows].clone()
            new = StoreSnapshot(values, torch.cat([torch.zeros(1, dtype=torch.int64, device=self.device),
                                                   torch.cumsum(lengths, 0)]),
                                snap.ids[keep].clone(), torch.ones(keep.numel(), dtype=torch.bool, device=self.device),
                                snap.next_id, keep.numel())
            self._buf = values
            self._snap = new

    def to(self, device: str | torch.device) -> PackedStore:
        """A copy of this store on `device` (self when already there)."""
        device = _check_device(device)
        if device == self.device:
            return self
        snap = self._snap
        out = PackedStore(self.dim, self.dtype, device, self.normalize)
        values = snap.values.to(device)
        out._buf = values
        out._snap = StoreSnapshot(values, snap.offsets.to(device), snap.ids.to(device), snap.alive.to(device),
                                  snap.next_id, snap.n_live)
        return out

    # -- search --------------------------------------------------------------------------
    def _queries(self, queries, q_offsets, assume_finite: bool = False):
        """Validated queries on the store's device: ``(values [Tq, d], offsets [Nq+1], lengths)``,
        the lengths a list of Nq ints (on the host).

        Nothing is read back from the device when the queries come as a list of tensors, or as
        packed values with CPU `q_offsets`, and either they are on the host (checked there,
        before the copy) or ``assume_finite=True`` (no check). Device-resident offsets cost one read."""
        if q_offsets is None:
            qv, qo = pack(queries, name="queries")  # validates: after it, queries is a sequence of [L_i, d]
            ql = [x.shape[0] for x in queries]
        else:
            qv = check_values(queries, "queries")
            host_offsets = isinstance(q_offsets, torch.Tensor) and q_offsets.device.type == "cpu"
            qo = check_offsets(q_offsets, qv.shape[0], q_offsets.device if host_offsets else qv.device, "q_offsets")
            ql = _ops.host_lengths(qo)
        if qv.shape[1] != self.dim:
            raise ValueError(f"queries: expected dimension d={self.dim}, got {qv.shape[1]}")
        check_no_grad(qv, "queries", "search results carry no gradients")
        if not assume_finite:  # free for queries on the host; one read for queries on the device
            # Normalising finite vectors keeps them finite, so the source decides; without
            # normalisation the cast to the store's dtype may overflow, so the cast decides.
            check_finite(qv if self.normalize else qv.to(self.dtype), "queries", source=qv)
        qv = _ops.to_device(qv, self.device)
        if self.normalize:
            qv = torch.nn.functional.normalize(qv.float(), dim=-1)
        return qv.to(self.dtype), _ops.to_device(qo, self.device), ql

    def search(self, queries, q_offsets: torch.Tensor | None = None, k: int = 10, *,
               backend: str | None = None, chunk_docs: int | None = None,
               assume_finite: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact MaxSim top-k over live items (of the snapshot current when the call starts).

        Args:
            queries: a sequence of ``[L_i, d]`` tensors, or packed values ``[Tq, d]`` with `q_offsets`.
            q_offsets: ``[Nq+1]`` int64 when `queries` is packed; on the CPU (or on the store's
                device, which costs a read back to validate it).
            k: results per query (clipped to the number of live items).
            chunk_docs: items scored per step (positive int; default: about 16M scores per block).
            assume_finite: skip the NaN/inf check of the queries (the caller vouches for them).
                The check is free for queries on the host (done before the copy); for queries
                already on the device it is one read back, which this skips.

        Returns:
            ``(scores [Nq, k'], ids [Nq, k'])``: float32 MaxSim scores and external int64 ids.

        Waits on the device: none after the first call on a snapshot (which copies its offsets
        to the host), when the queries are on the host or `assume_finite` is set, and their
        offsets are known on the host (a list of tensors, or CPU `q_offsets`).
        """
        qv, qo, ql = self._queries(queries, q_offsets, assume_finite)
        k = _ops.check_positive_int(k, "k")
        chunk_docs = _ops.check_positive_int(chunk_docs, "chunk_docs", allow_none=True)
        name = _backend.resolve("store.search", self.device, backend)
        return self._scan(self._snap, qv, qo, ql, k, name, chunk_docs)

    @staticmethod
    def _scan(snap: StoreSnapshot, qv, qo, ql, k: int, name: str, chunk_docs: int | None):
        """The device work of :meth:`search` on validated queries (``qv``, ``qo`` on the device,
        lengths ``ql`` on the host): device ops and launches only, so it can be captured in a
        CUDA graph (:mod:`colgraph_engine.store.graphed_search`)."""
        alive = None if snap.n_live == snap.n_slots else snap.alive
        scores, pos = _ops.topk_scan(qv, qo, snap.values, snap.offsets, k, name, alive, chunk_docs,
                                     q_lengths=ql, host_offsets=snap.host().offsets, n_live=snap.n_live)
        return scores, snap.ids[pos]

    def score_candidates(self, queries, q_offsets: torch.Tensor | None, cand_offsets: torch.Tensor,
                         cand_ids: torch.Tensor, *, backend: str | None = None,
                         assume_finite: bool = False) -> torch.Tensor:
        """``[C]`` float32 MaxSim of each query against its listed items (external ids, CSR).

        Candidate ids and offsets given on the host (CPU tensors or, for ids, a sequence) are
        validated there against the snapshot's host copies and then copied to the device: no
        wait on the device (see :meth:`search` for the queries). On the device they cost reads.
        """
        _ops._check_bool(assume_finite, "assume_finite")
        qv, qo, ql = self._queries(queries, q_offsets, assume_finite)
        snap = self._snap
        ids = _as_id_tensor(cand_ids, "cand_ids")
        nq = qo.shape[0] - 1
        counts = None
        if ids.device.type == "cpu" and isinstance(cand_offsets, torch.Tensor) and cand_offsets.device.type == "cpu":
            h = snap.host()
            pos = _find_positions(h.sorted_ids, h.order, h.alive, ids, False, "cand_ids")
            co, pos = _ops.check_candidates(cand_offsets, pos, nq, snap.n_slots, pos.device)
            counts = co.diff()
            co, pos = _ops.to_device(co, self.device), _ops.to_device(pos, self.device)
        else:
            pos = _positions(snap, ids.to(self.device), False, "cand_ids")
            co, pos = _ops.check_candidates(cand_offsets.to(self.device) if isinstance(cand_offsets, torch.Tensor)
                                            else cand_offsets, pos, nq, snap.n_slots, self.device)
        name = _backend.resolve("store.score_candidates", self.device, backend)
        return _ops._candidates_impl(name, qv, qo, snap.values, snap.offsets, co, pos, q_lengths=ql,
                                     cand_counts=counts)

    def warmup(self, query_lengths: Sequence[int] = (32,), n_queries: Sequence[int] = (1, 32), *,
               candidates_per_query: int | None = 64, backend: str | None = None) -> dict[str, float]:
        """Compiles and tunes the kernels for this store's shapes before the first timed query.

        Runs one search per (query length, query count) pair, and one candidate scoring per
        query length with `candidates_per_query` candidates each (None: skip), on random unit
        queries; makes the snapshot's host copies. Triton keeps compiled kernels and autotune
        choices in its on-disk cache, so a later process warms up from there.

        Returns:
            ``{"search_s": ..., "candidates_s": ...}`` wall seconds spent (synchronised).
        """
        for n in (*query_lengths, *n_queries):
            _ops.check_positive_int(n, "query_lengths/n_queries")
        import time
        g = torch.Generator().manual_seed(0)
        snap = self._snap
        snap.host()
        spent = {"search_s": 0.0, "candidates_s": 0.0}
        if snap.n_live == 0:
            return spent
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        for lq in query_lengths:
            for nq in n_queries:
                qs = [torch.nn.functional.normalize(torch.randn(lq, self.dim, generator=g), dim=-1) for _ in range(nq)]
                t = time.perf_counter()
                self.search(qs, k=min(10, snap.n_live), backend=backend)
                sync()
                spent["search_s"] += time.perf_counter() - t
                if candidates_per_query:
                    live = snap.ids[snap.alive].cpu() if snap.n_live < snap.n_slots else snap.ids.cpu()
                    pick = torch.randint(0, live.numel(), (nq * candidates_per_query,), generator=g)
                    t = time.perf_counter()
                    self.score_candidates(qs, None, torch.arange(nq + 1) * candidates_per_query, live[pick],
                                          backend=backend)
                    sync()
                    spent["candidates_s"] += time.perf_counter() - t
        return spent

    # -- persistence ---------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Writes the store to directory `path` atomically (replacing any previous version).

        Raises ValueError naming `path` when it is a non-empty folder that holds no store:
        nothing else is ever deleted. Concurrent saves of one path all succeed (the last wins).
        """
        arrays = {
            "values": _to_disk(self.values),
            "offsets": self._offsets.cpu().numpy(),
            "ids": self._ids.cpu().numpy(),
            "alive": self._alive.cpu().numpy().astype(np.uint8),
        }
        meta = {"dtype": _DTYPE_NAMES[self.dtype], "dim": self.dim, "n_items": self.n_slots, "n_live": len(self),
                "n_tokens": self._n_tokens, "normalize": self.normalize, "next_id": self._next_id}
        return _arraydir.write(path, FORMAT_NAME, FORMAT_VERSION, meta, arrays)

    @classmethod
    def load(cls, path: str | os.PathLike, *, device: str | torch.device = "cpu", mmap: bool = True,
             verify: bool = True) -> PackedStore:
        """Reads a store written by :meth:`save`.

        Args:
            mmap: memory-map the vectors (pages load on first touch).
            verify: check every file's sha256 (reads each file once); shapes, sizes and offsets
                are always checked.
        """
        path = Path(path)
        with _atomic.reading(path):  # finishes an interrupted save; no save swaps the folder meanwhile
            m = _arraydir.read_manifest(path, FORMAT_NAME, FORMAT_VERSION)
            n, t, d = (_arraydir.meta_int(m, key, path) for key in ("n_items", "n_tokens", "dim"))
            if m.get("dtype") not in _DTYPES_BY_NAME or not isinstance(m.get("normalize"), bool) or d < 1:
                raise StoreFormatError(f"{path / 'manifest.json'}: dtype, dim or normalize invalid")
            dtype = _DTYPES_BY_NAME[m["dtype"]]
            read = lambda name, dt, shape, **kw: _arraydir.read_array(path, m, name, dt, shape, verify=verify, **kw)  # noqa: E731
            values = read("values", _DISK_NP[dtype], (t, d), mmap=mmap)
            offsets = torch.from_numpy(read("offsets", np.int64, (n + 1,)))
            ids = torch.from_numpy(read("ids", np.int64, (n,)))
            alive_u8 = read("alive", np.uint8, (n,))
        if not np.isin(alive_u8, (0, 1)).all():
            raise StoreFormatError(f"{path / 'alive.bin'}: expected only 0/1 bytes")
        try:
            check_offsets(offsets, t, offsets.device, "offsets.bin")
        except ValueError as exc:
            raise StoreFormatError(f"{path}: {exc}") from None
        if torch.unique(ids).numel() != n or (n and int(ids.min()) < 0):
            raise StoreFormatError(f"{path / 'ids.bin'}: ids must be unique and non-negative")
        store = cls(d, dtype, "cpu", m["normalize"])
        values = torch.from_numpy(values)
        store._values = values.view(dtype) if dtype == torch.bfloat16 else values
        store._n_tokens = t
        store._offsets, store._ids = offsets, ids
        store._alive = torch.from_numpy(alive_u8.astype(bool))
        next_id = m.get("next_id", 0)
        store._next_id = max(next_id if isinstance(next_id, int) else 0, int(ids.max()) + 1 if n else 0)
        return store.to(device)

    # -- stores over tensors that already hold the values (e.g. memory-mapped files) -------
    @classmethod
    def wrap(cls, values: torch.Tensor, offsets: torch.Tensor, ids: torch.Tensor, *,
             normalize: bool = False) -> PackedStore:
        """A store whose ``values [T, d]`` are `values` itself, not a copy (e.g. a tensor over a
        memory-mapped file: pages load on first touch). `offsets` ``[N+1]`` int64, `ids` ``[N]``
        unique non-negative int64; every item is alive. The caller must not change `values`
        afterwards. Values are not checked for NaN/inf here (as in :meth:`load`, they come from
        a checked source). A later :meth:`add` copies into a buffer of its own."""
        if not isinstance(values, torch.Tensor) or values.dim() != 2:
            raise TypeError("values: expected a [T, d] tensor")
        store = cls(int(values.shape[1]), values.dtype, values.device, normalize)
        offsets = check_offsets(offsets, values.shape[0], values.device, "offsets")
        ids = _as_id_tensor(ids, "ids").to(values.device)
        if ids.numel() != offsets.numel() - 1:
            raise ValueError(f"ids: expected {offsets.numel() - 1} ids (one per item), got {ids.numel()}")
        # ascending ids (the knowledge index's) are unique and their own sorted lookup: no sort
        rising = ids.numel() < 2 or bool((ids[1:] > ids[:-1]).all())
        if ids.numel() and (int(ids.min()) < 0 or not rising and torch.unique(ids).numel() != ids.numel()):
            raise ValueError("ids: expected unique non-negative ids")
        store._buf = values
        lookup = (ids, torch.arange(ids.numel(), device=values.device)) if rising else None
        store._snap = StoreSnapshot(values, offsets, ids, torch.ones(ids.numel(), dtype=torch.bool, device=values.device),
                                    int(ids.max()) + 1 if ids.numel() else 0, ids.numel(), lookup=lookup)
        return store

    @classmethod
    def _wrap_trusted(cls, values: torch.Tensor, offsets: np.ndarray, ids: np.ndarray) -> PackedStore:
        """:meth:`wrap` without its checks, for arrays built from a checked store by our own
        code (the distributed gather's per-query index): CPU ``values [T, d]``, ``offsets [N+1]``
        int64 from 0 to T, ``ids [N]`` strictly ascending non-negative int64, both numpy. The
        checks and the empty store :meth:`wrap` starts from cost ~60 us per store, which that
        path pays for every store of every query; this costs a few."""
        store = cls.__new__(cls)
        store.dim, store.dtype, store.normalize = int(values.shape[1]), values.dtype, False
        store.device = values.device
        store._write_lock = threading.Lock()
        store._buf = values
        store._cols = _Columns()
        n = ids.size
        ids_t = torch.from_numpy(ids)
        store._snap = StoreSnapshot(values, torch.from_numpy(offsets), ids_t, torch.from_numpy(np.ones(n, bool)),
                                    int(ids[-1]) + 1 if n else 0, n,
                                    lookup=(ids_t, torch.from_numpy(np.arange(n, dtype=np.int64))))
        return store

    def extend_wrapped(self, values: torch.Tensor, offsets: torch.Tensor, ids: torch.Tensor) -> None:
        """Appends items whose rows already follow the current ``T`` rows in `values`, without
        copying: `values` ``[T + t, d]`` must begin with the current rows, unchanged (e.g. a
        longer mapping of the same append-only file), `offsets` ``[k+1]`` are the new items'
        offsets into the ``t`` new rows (from 0 to t), `ids` ``[k]`` new unique ids. Nothing
        changes when a check fails; readers see the store before or after the whole batch."""
        if not isinstance(values, torch.Tensor) or values.dim() != 2 or values.shape[1] != self.dim \
                or values.dtype != self.dtype or values.device != self.device:
            raise ValueError(f"values: expected a [T, {self.dim}] {self.dtype} tensor on {self.device}")
        with self._write_lock:
            snap = self._snap
            t_old = snap.values.shape[0]
            if values.shape[0] < t_old:
                raise ValueError(f"values: expected at least the store's {t_old} rows, got {values.shape[0]}")
            offsets = check_offsets(offsets, values.shape[0] - t_old, self.device, "offsets")
            k = offsets.numel() - 1
            new_ids = _new_ids(snap, ids, k, self.device)
            self._buf = values
            self._snap = self._cols.extend(snap, values, offsets[1:] + t_old, new_ids)


def _to_disk(values: torch.Tensor) -> np.ndarray:
    v = values.detach().cpu().contiguous()
    return v.view(torch.int16).numpy() if v.dtype == torch.bfloat16 else v.numpy()
