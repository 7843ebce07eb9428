"""Packed multi-vector store: the document side of every MaxSim operation.

Layout (see :mod:`colgraph_engine.packed`): ``values [T, d]``, ``offsets [N+1]``, plus
``ids [N]`` (stable int64 external ids, unique) and ``alive [N]`` (False = deleted). Deletion
is a tombstone; :meth:`PackedStore.compact` drops tombstoned rows. Values are checked for
NaN/inf once, when they enter the store, not on every query.

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

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from . import _arraydir, _atomic
from . import backend as _backend
from .ops import scoring as _ops
from .packed import FLOAT_DTYPES, check_finite, check_offsets, check_packed, pack

FORMAT_NAME = "colgraph_engine.packed_store"
FORMAT_VERSION = 1
_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_DTYPES_BY_NAME = {v: k for k, v in _DTYPE_NAMES.items()}
# numpy dtype used to hold each torch dtype's bytes on disk
_DISK_NP = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.int16}


StoreFormatError = _arraydir.FormatError  # a ValueError: missing, truncated, tampered or inconsistent


class PackedStore:
    """A growable collection of variable-length vector sets with stable ids.

    Args:
        dim: vector dimension d (>= 1).
        dtype: storage dtype: torch.float32, torch.float16 or torch.bfloat16.
        device: where values live ("cpu" or a CUDA device).
        normalize: L2-normalise every vector on entry (queries are normalised at search time).
    """

    def __init__(self, dim: int, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 normalize: bool = False):
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim: expected a positive int, got {dim!r}")
        if dtype not in FLOAT_DTYPES:
            raise TypeError(f"dtype: expected one of {FLOAT_DTYPES}, got {dtype}")
        if not isinstance(normalize, bool):
            raise TypeError(f"normalize: expected a bool, got {type(normalize).__name__}")
        self.dim, self.dtype, self.normalize = dim, dtype, normalize
        self.device = torch.device(device)
        self._values = torch.empty((0, dim), dtype=dtype, device=self.device)  # capacity rows
        self._n_tokens = 0
        self._offsets = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._ids = torch.empty(0, dtype=torch.int64, device=self.device)
        self._alive = torch.empty(0, dtype=torch.bool, device=self.device)
        self._next_id = 0
        self._lookup: tuple[torch.Tensor, torch.Tensor] | None = None  # (sorted ids, positions)

    # -- views ---------------------------------------------------------------------------
    @property
    def values(self) -> torch.Tensor:
        """``[T, d]`` all stored vectors (tombstoned items included until compact)."""
        return self._values[: self._n_tokens]

    @property
    def offsets(self) -> torch.Tensor:
        """``[N+1]`` int64 item offsets into :attr:`values`."""
        return self._offsets

    @property
    def ids(self) -> torch.Tensor:
        """``[N]`` int64 external ids by position."""
        return self._ids

    @property
    def alive(self) -> torch.Tensor:
        """``[N]`` bool: False for deleted items."""
        return self._alive

    @property
    def n_slots(self) -> int:
        """Items stored, deleted ones included."""
        return self._ids.numel()

    def __len__(self) -> int:
        return int(self._alive.sum())

    def __repr__(self) -> str:
        return (f"PackedStore(items={len(self)}, deleted={self.n_slots - len(self)}, tokens={self._n_tokens}, "
                f"dim={self.dim}, dtype={self.dtype}, device={self.device})")

    # -- ids -----------------------------------------------------------------------------
    def _sorted_ids(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._lookup is None:
            s, order = torch.sort(self._ids)
            self._lookup = (s, order)
        return self._lookup

    def ids_between(self, low: int, high: int) -> torch.Tensor:
        """Live ids in ``[low, high)``, ascending (a range lookup in the sorted id cache)."""
        s, order = self._sorted_ids()
        a, b = (int(torch.searchsorted(s, torch.tensor(x, dtype=torch.int64, device=s.device))) for x in (low, high))
        return s[a:b][self._alive[order[a:b]]]

    def positions(self, ids: torch.Tensor | Sequence[int], *, allow_deleted: bool = False,
                  name: str = "ids") -> torch.Tensor:
        """``[K]`` int64 positions of external `ids`; ValueError for unknown (or deleted) ids.
        `name` is the argument named in error messages."""
        q = _as_id_tensor(ids, name).to(self.device)
        s, order = self._sorted_ids()
        if q.numel() == 0:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        if s.numel() == 0:
            raise ValueError(f"{name}: id {int(q[0])} is not in the store (the store is empty)")
        at = torch.searchsorted(s, q).clamp(max=s.numel() - 1)
        found = s[at] == q
        if not bool(found.all()):
            bad = int(q[~found][0])
            raise ValueError(f"{name}: id {bad} is not in the store")
        pos = order[at]
        if not allow_deleted and not bool(self._alive[pos].all()):
            bad = int(q[~self._alive[pos]][0])
            raise ValueError(f"{name}: id {bad} was deleted")
        return pos

    def get(self, item_id: int) -> torch.Tensor:
        """``[L, d]`` vectors of one live item (a view)."""
        p = int(self.positions([item_id])[0])
        return self.values[int(self._offsets[p]): int(self._offsets[p + 1])]

    # -- mutation ------------------------------------------------------------------------
    def add(self, items: Sequence[torch.Tensor] | tuple[torch.Tensor, torch.Tensor],
            ids: torch.Tensor | Sequence[int] | None = None) -> torch.Tensor:
        """Appends items; returns their ``[K]`` int64 ids.

        Args:
            items: a sequence of ``[L_i, d]`` tensors, or a packed ``(values [T, d], offsets [K+1])``.
            ids: optional unique non-negative ids not already in the store; default: next free ids.

        Nothing changes if any check fails.
        """
        if isinstance(items, tuple) and len(items) == 2 and all(isinstance(t, torch.Tensor) for t in items) \
                and items[1].dtype == torch.int64:
            values, offsets = check_packed(items[0], items[1], "items")
        else:
            values, offsets = pack(items)
        if values.shape[1] != self.dim:
            raise ValueError(f"items: expected dimension d={self.dim}, got {values.shape[1]}")
        check_finite(values, "items")
        k = offsets.numel() - 1
        new_ids = self._new_ids(ids, k)
        values = values.to(self.device)
        if self.normalize:
            values = torch.nn.functional.normalize(values.float(), dim=-1)
        values = values.to(self.dtype)
        offsets = offsets.to(self.device)
        # All checks passed: now mutate.
        need = self._n_tokens + values.shape[0]
        if need > self._values.shape[0]:
            grown = torch.empty((max(need, 2 * self._values.shape[0], 1024), self.dim), dtype=self.dtype, device=self.device)
            grown[: self._n_tokens] = self._values[: self._n_tokens]
            self._values = grown
        self._values[self._n_tokens: need] = values
        self._offsets = torch.cat([self._offsets, offsets[1:] + self._n_tokens])
        self._n_tokens = need
        self._ids = torch.cat([self._ids, new_ids])
        self._alive = torch.cat([self._alive, torch.ones(k, dtype=torch.bool, device=self.device)])
        self._next_id = max(self._next_id, int(new_ids.max()) + 1) if k else self._next_id
        self._lookup = None
        return new_ids

    def _new_ids(self, ids, k: int) -> torch.Tensor:
        if ids is None:
            return torch.arange(self._next_id, self._next_id + k, dtype=torch.int64, device=self.device)
        t = _as_id_tensor(ids, "ids").to(self.device)
        if t.numel() != k:
            raise ValueError(f"ids: expected {k} ids (one per item), got {t.numel()}")
        if k and int(t.min()) < 0:
            raise ValueError(f"ids: expected non-negative ids, got {int(t.min())}")
        if torch.unique(t).numel() != k:
            raise ValueError("ids: expected unique ids, got duplicates")
        if k and self.n_slots:
            s, _ = self._sorted_ids()
            at = torch.searchsorted(s, t).clamp(max=s.numel() - 1)
            clash = s[at] == t
            if bool(clash.any()):
                raise ValueError(f"ids: id {int(t[clash][0])} is already in the store (deleted ids stay reserved until compact)")
        return t

    def delete(self, ids: torch.Tensor | Sequence[int]) -> int:
        """Tombstones items by id; returns how many were deleted. Unknown or already deleted ids
        raise ValueError and nothing is deleted."""
        pos = self.positions(ids)
        self._alive[pos] = False
        return int(pos.numel())

    def compact(self) -> None:
        """Removes tombstoned items and their vectors; ids of live items are kept."""
        keep = torch.nonzero(self._alive).squeeze(1)
        if keep.numel() == self.n_slots:
            return
        lengths = self._offsets.diff()[keep]
        starts = self._offsets[keep]
        rows = torch.repeat_interleave(starts, lengths) + (
            torch.arange(int(lengths.sum()), device=self.device)
            - torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths))
        self._values = self.values[rows].clone()
        self._n_tokens = self._values.shape[0]
        self._offsets = torch.cat([torch.zeros(1, dtype=torch.int64, device=self.device), torch.cumsum(lengths, 0)])
        self._ids = self._ids[keep].clone()
        self._alive = torch.ones(keep.numel(), dtype=torch.bool, device=self.device)
        self._lookup = None

    def to(self, device: str | torch.device) -> PackedStore:
        """A copy of this store on `device` (self when already there)."""
        device = torch.device(device)
        if device == self.device:
            return self
        out = PackedStore(self.dim, self.dtype, device, self.normalize)
        out._values = self.values.to(device)
        out._n_tokens = self._n_tokens
        out._offsets, out._ids, out._alive = (t.to(device) for t in (self._offsets, self._ids, self._alive))
        out._next_id = self._next_id
        return out

    # -- search --------------------------------------------------------------------------
    def _queries(self, queries, q_offsets):
        if q_offsets is None:
            qv, qo = pack(queries)
        else:
            qv, qo = check_packed(queries, q_offsets, "queries")
        if qv.shape[1] != self.dim:
            raise ValueError(f"queries: expected dimension d={self.dim}, got {qv.shape[1]}")
        qv = qv.to(self.device)
        if self.normalize:
            qv = torch.nn.functional.normalize(qv.float(), dim=-1)
        return qv.to(self.dtype), qo.to(self.device)

    def search(self, queries, q_offsets: torch.Tensor | None = None, k: int = 10, *,
               backend: str | None = None, chunk_docs: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact MaxSim top-k over live items.

        Args:
            queries: a sequence of ``[L_i, d]`` tensors, or packed values ``[Tq, d]`` with `q_offsets`.
            q_offsets: ``[Nq+1]`` int64 when `queries` is packed.
            k: results per query (clipped to the number of live items).

        Returns:
            ``(scores [Nq, k'], ids [Nq, k'])``: float32 MaxSim scores and external int64 ids.
        """
        qv, qo = self._queries(queries, q_offsets)
        if isinstance(k, bool) or not isinstance(k, int):
            raise TypeError(f"k: expected an int, got {type(k).__name__}")
        if k <= 0:
            raise ValueError(f"k: expected k >= 1, got {k}")
        name = _backend.resolve("store.search", self.device, backend)
        alive = None if bool(self._alive.all()) else self._alive
        scores, pos = _ops.topk_scan(qv, qo, self.values, self._offsets, k, name, alive, chunk_docs)
        return scores, self._ids[pos]

    def score_candidates(self, queries, q_offsets: torch.Tensor | None, cand_offsets: torch.Tensor,
                         cand_ids: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
        """``[C]`` float32 MaxSim of each query against its listed items (external ids, CSR)."""
        qv, qo = self._queries(queries, q_offsets)
        pos = self.positions(cand_ids, name="cand_ids")
        co, pos = _ops.check_candidates(cand_offsets.to(self.device) if isinstance(cand_offsets, torch.Tensor) else cand_offsets,
                                        pos, qo.numel() - 1, self.n_slots, self.device)
        name = _backend.resolve("store.score_candidates", self.device, backend)
        return _ops._candidates_impl(name, qv, qo, self.values, self._offsets, co, pos)

    # -- persistence ---------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Writes the store to directory `path` atomically (replacing any previous version)."""
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
        _atomic.recover(path)
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


def _as_id_tensor(ids, name: str) -> torch.Tensor:
    if isinstance(ids, torch.Tensor):
        if ids.dtype != torch.int64:
            raise TypeError(f"{name}: expected dtype torch.int64, got {ids.dtype}")
        if ids.dim() != 1:
            raise ValueError(f"{name}: expected shape [K], got {tuple(ids.shape)}")
        return ids
    if isinstance(ids, (list, tuple, range, np.ndarray)):
        try:
            arr = np.asarray(ids)
        except Exception as exc:
            raise TypeError(f"{name}: expected a sequence of ints ({exc})") from None
        if arr.size and arr.dtype.kind not in "iu":
            raise TypeError(f"{name}: expected integers, got dtype {arr.dtype}")
        if arr.ndim > 1:
            raise ValueError(f"{name}: expected a flat sequence, got shape {arr.shape}")
        return torch.as_tensor(arr.astype(np.int64).reshape(-1))
    raise TypeError(f"{name}: expected a torch.int64 tensor or a sequence of ints, got {type(ids).__name__}")


def _to_disk(values: torch.Tensor) -> np.ndarray:
    v = values.detach().cpu().contiguous()
    return v.view(torch.int16).numpy() if v.dtype == torch.bfloat16 else v.numpy()
