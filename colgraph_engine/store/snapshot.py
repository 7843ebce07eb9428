"""One immutable version of a store's contents, and the growing columns new versions are cut from.

A :class:`StoreSnapshot` is what every reader of a :class:`~colgraph_engine.store.PackedStore` works
on: writers build a new snapshot beside the published one and swap it in with one assignment, so a
reader sees a store entirely before or entirely after a write. :class:`_Columns` lets an append
publish ``offsets``/``ids``/``alive`` and the id lookup as prefixes of buffers with spare capacity
(O(k) amortised per append of k items) without ever changing a view an older snapshot holds.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class HostCopy(NamedTuple):
    """Host (CPU) copies of one snapshot's offsets ``[N+1]``, alive ``[N]`` and id lookup
    (sorted ids ``[N]``, their positions ``[N]``)."""
    offsets: torch.Tensor
    alive: torch.Tensor
    sorted_ids: torch.Tensor
    order: torch.Tensor


class StoreSnapshot:
    """One immutable version of a store's contents; what every reader works on.

    Attributes (read-only by contract; a writer never modifies a published snapshot's tensors):
        values: ``[T, d]`` all stored vectors (tombstoned items included until compact).
        offsets: ``[N+1]`` int64 item offsets into `values`.
        ids: ``[N]`` int64 external ids by position.
        alive: ``[N]`` bool, False for deleted items.
        n_live: number of True entries in `alive`.
        next_id: the first id :meth:`PackedStore.add` hands out without explicit ids.
    """

    __slots__ = ("values", "offsets", "ids", "alive", "n_live", "next_id", "_lookup", "_host")

    def __init__(self, values, offsets, ids, alive, next_id: int, n_live: int | None = None, lookup=None,
                 host: HostCopy | None = None):
        self.values, self.offsets, self.ids, self.alive = values, offsets, ids, alive
        self.next_id = next_id
        self.n_live = int(alive.sum()) if n_live is None else n_live
        self._lookup = lookup
        self._host = host

    def host(self) -> HostCopy:
        """Host (CPU) copies of what the query path validates and plans with, made on first use
        (one transfer per snapshot; none for a CPU store). With them a query reads nothing back
        from the device."""
        h = self._host
        if h is None:
            sorted_ids, order = self.lookup()
            h = HostCopy(self.offsets.cpu(), self.alive.cpu(), sorted_ids.cpu(), order.cpu())
            self._host = h
        return h

    @property
    def n_slots(self) -> int:
        return self.ids.numel()

    def lookup(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sorted ids, positions)``, computed on first use. Derived from `ids` only, so two
        readers racing to fill it compute the same thing."""
        lk = self._lookup
        if lk is None:
            lk = torch.sort(self.ids)
            lk = (lk.values, lk.indices)
            self._lookup = lk
        return lk

    def replace(self, **fields) -> StoreSnapshot:
        cur = dict(values=self.values, offsets=self.offsets, ids=self.ids, alive=self.alive, next_id=self.next_id,
                   n_live=self.n_live, lookup=self._lookup,
                   host=None if {"offsets", "ids", "alive", "lookup"} & set(fields) else self._host)
        if "alive" in fields and "n_live" not in fields:
            cur["n_live"] = None
        if "ids" in fields and "lookup" not in fields:
            cur["lookup"] = None
        cur.update(fields)
        return StoreSnapshot(**cur)


class _Column:
    """A 1-D tensor that grows at its end inside a buffer with spare capacity (doubling): the
    published tensor is a view of the buffer's first entries, and appending writes only past
    them, so every published view stays unchanged (snapshots stay immutable) and appending k
    entries costs O(k) amortised. A published tensor that is not this buffer's prefix (a store
    that was compacted, wrapped or loaded) is copied into a new buffer once."""

    __slots__ = ("buf", "copied")

    def __init__(self):
        self.buf: torch.Tensor | None = None
        self.copied = 0  # entries copied into new buffers so far (tests count them)

    def extend(self, current: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """``current`` followed by ``new`` (both 1-D, same dtype and device)."""
        n, k = current.numel(), new.numel()
        buf = self.buf
        if buf is None or buf.data_ptr() != current.data_ptr() or buf.device != current.device \
                or buf.dtype != current.dtype or n + k > buf.numel() or n and not current.is_contiguous():
            grown = torch.empty(max(2 * (n + k), 16), dtype=current.dtype, device=current.device)
            grown[:n] = current
            self.copied += n
            buf = self.buf = grown
        buf[n:n + k] = new  # entries no published view covers
        return buf[:n + k]


class _Columns:
    """The growing columns behind a store's snapshots: offsets, ids, alive and the sorted-id
    lookup (sorted ids and their positions)."""

    __slots__ = ("offsets", "ids", "alive", "sorted_ids", "order")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, _Column())

    @property
    def copied(self) -> int:
        return sum(getattr(self, name).copied for name in self.__slots__)

    def extend(self, snap: StoreSnapshot, values: torch.Tensor, new_offsets: torch.Tensor,
               new_ids: torch.Tensor) -> StoreSnapshot:
        """The snapshot after appending items with end offsets `new_offsets` ``[k]`` (into
        `values`) and ids `new_ids` ``[k]`` (checked: unique, not in the store) to `snap`.

        The id lookup is carried over when `snap` has one: ids larger than every stored id (how
        the knowledge index numbers a new document's items) are appended, in O(k log k); other ids
        are merged into it in O(N + k). Without one it stays lazy (sorted on first use)."""
        k = new_ids.numel()
        device = new_ids.device
        lookup = snap._lookup
        if lookup is not None and k:
            s_new, o_new = torch.sort(new_ids)
            o_new = o_new + snap.n_slots
            s_old, o_old = lookup
            if s_old.numel() == 0 or bool(s_new[0] > s_old[-1]):
                lookup = (self.sorted_ids.extend(s_old, s_new), self.order.extend(o_old, o_new))
            else:  # general path: a merge of two sorted runs
                at = torch.searchsorted(s_old, s_new) + torch.arange(k, device=device)
                keep = torch.ones(s_old.numel() + k, dtype=torch.bool, device=device)
                keep[at] = False
                s = torch.empty(s_old.numel() + k, dtype=torch.int64, device=device)
                o = torch.empty_like(s)
                s[at], o[at] = s_new, o_new
                s[keep], o[keep] = s_old, o_old
                lookup = (s, o)
        return StoreSnapshot(values, self.offsets.extend(snap.offsets, new_offsets), self.ids.extend(snap.ids, new_ids),
                             self.alive.extend(snap.alive, torch.ones(k, dtype=torch.bool, device=device)),
                             max(snap.next_id, int(new_ids.max()) + 1) if k else snap.next_id, snap.n_live + k,
                             lookup=lookup)


def _positions(snap: StoreSnapshot, q: torch.Tensor, allow_deleted: bool, name: str) -> torch.Tensor:
    """Positions of ids `q` in one snapshot; ValueError naming `name` for unknown/deleted ids."""
    s, order = snap.lookup()
    return _find_positions(s, order, snap.alive, q, allow_deleted, name)


def _find_positions(s: torch.Tensor, order: torch.Tensor, alive: torch.Tensor, q: torch.Tensor,
                    allow_deleted: bool, name: str) -> torch.Tensor:
    """Positions of ids `q` given the sorted ids `s`, their positions `order` and `alive`
    (all on `q`'s device)."""
    if q.numel() == 0:
        return torch.empty(0, dtype=torch.int64, device=q.device)
    if s.numel() == 0:
        raise ValueError(f"{name}: id {int(q[0])} is not in the store (the store is empty)")
    at = torch.searchsorted(s, q).clamp(max=s.numel() - 1)
    found = s[at] == q
    if not bool(found.all()):
        raise ValueError(f"{name}: id {int(q[~found][0])} is not in the store")
    pos = order[at]
    if not allow_deleted:
        live = alive[pos]
        if not bool(live.all()):
            raise ValueError(f"{name}: id {int(q[~live][0])} was deleted")
    return pos
