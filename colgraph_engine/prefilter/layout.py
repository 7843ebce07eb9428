"""The prefilter's data: one immutable :class:`IndexState` per version.

Arrays (N documents by position, T tokens, C centroids, P distinct (document, centroid) pairs)::

    centroids      [C, d]      float32 unit centroids
    cutoffs        [2^b - 1]   float32 bucket cutoffs          (b = nbits; see codec)
    weights        [2^b]       float32 bucket values
    codes          [T]         int16 (C <= 32768) or int32 centroid id per token
    residuals      [T, d*b/8]  uint8 packed residual buckets
    offsets        [N+1]       int64 token offsets per document (packed, no padding)
    ids            [N]         int64 stable external ids (unique)
    alive          [N]         bool, False once deleted (positions are never renumbered)
    cells_offsets  [N+1]       int64 CSR: document -> its distinct centroids
    cells          [P]         int32 distinct centroid ids per document, ascending
    ivf_offsets    [C+1]       int64 CSR: centroid -> documents (the inverted lists)
    ivf_docs       [P]         int32 document positions per centroid, ascending

`cells` and `ivf_docs` hold the same pairs in two orders: stage 2 walks the inverted lists of
the few centroids a query keeps, stage 3 walks a shortlisted document's own centroids.
Both are derived from ``codes`` and ``offsets`` (:func:`derive_lists`), never stored on disk.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..packed import segment_ids


@dataclass(frozen=True)
class IndexState:
    nbits: int
    centroids: torch.Tensor
    cutoffs: torch.Tensor
    weights: torch.Tensor
    codes: torch.Tensor
    residuals: torch.Tensor
    offsets: torch.Tensor
    ids: torch.Tensor
    alive: torch.Tensor
    cells_offsets: torch.Tensor
    cells: torch.Tensor
    ivf_offsets: torch.Tensor
    ivf_docs: torch.Tensor
    # decoded vectors are L2-normalised before exact scoring (ColBERT normalises its
    # decompressed embeddings); on for unit-norm inputs (see build.build_state)
    unit: bool = False
    # drift bookkeeping: mean squared residual norm of the tokens the centroids were trained
    # for, and the running sum / count over tokens added since
    build_mse: float = 0.0
    added_sq_sum: float = 0.0
    added_tokens: int = 0
    next_id: int = 0
    _sorted: tuple | None = field(default=None, compare=False, repr=False)
    _cell_owner: torch.Tensor | None = field(default=None, compare=False, repr=False)  # see dense.cell_owner

    @property
    def dim(self) -> int:
        return int(self.centroids.shape[1])

    @property
    def n_centroids(self) -> int:
        return int(self.centroids.shape[0])

    @property
    def n_slots(self) -> int:
        return int(self.ids.numel())

    @property
    def n_live(self) -> int:
        return int(self.alive.sum())

    @property
    def n_tokens(self) -> int:
        return int(self.codes.numel())

    def id_lookup(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sorted ids [N], positions [N])`` (cached per state)."""
        if self._sorted is None:
            s = torch.sort(self.ids)
            object.__setattr__(self, "_sorted", (s.values, s.indices))
        return self._sorted

    def positions(self, ids: torch.Tensor, name: str, allow_deleted: bool = False) -> torch.Tensor:
        """``[K]`` int64 positions of external `ids`; ValueError naming `name` for an unknown or
        deleted id."""
        s, order = self.id_lookup()
        ids = ids.to(s.device)
        where = torch.searchsorted(s, ids).clamp(max=max(s.numel() - 1, 0))
        ok = (s[where] == ids) if s.numel() else torch.zeros_like(ids, dtype=torch.bool)
        if not bool(ok.all()):
            bad = int(ids[~ok][0])
            raise ValueError(f"{name}: id {bad} is not in the prefilter index")
        pos = order[where]
        if not allow_deleted and not bool(self.alive[pos].all()):
            raise ValueError(f"{name}: id {int(ids[~self.alive[pos]][0])} was deleted")
        return pos

    def with_(self, **changes) -> IndexState:
        if "ids" in changes:
            changes.setdefault("_sorted", None)
        if "cells_offsets" in changes or "cells" in changes:
            changes.setdefault("_cell_owner", None)
        return replace(self, **changes)

    def nbytes(self) -> dict[str, int]:
        """Bytes held per array group: ``codes``, ``residuals`` (the compressed tokens),
        ``lists`` (cells + inverted lists), ``docs`` (offsets, ids, alive) and ``centroids``."""
        t = lambda x: x.numel() * x.element_size()  # noqa: E731
        return {"codes": t(self.codes), "residuals": t(self.residuals),
                "lists": t(self.cells_offsets) + t(self.cells) + t(self.ivf_offsets) + t(self.ivf_docs),
                "docs": t(self.offsets) + t(self.ids) + t(self.alive),
                "centroids": t(self.centroids) + t(self.cutoffs) + t(self.weights)}


def derive_lists(codes: torch.Tensor, offsets: torch.Tensor, n_centroids: int):
    """``(cells_offsets [N+1], cells [P], ivf_offsets [C+1], ivf_docs [P])`` from token codes."""
    dev = codes.device
    n = offsets.numel() - 1
    doc = segment_ids(offsets)                                          # [T]
    key = torch.unique(doc * n_centroids + codes.long())                # sorted by (doc, cell)
    pair_doc, pair_cell = key // n_centroids, key % n_centroids
    cells_offsets = torch.zeros(n + 1, dtype=torch.int64, device=dev)
    torch.cumsum(torch.bincount(pair_doc, minlength=n), 0, out=cells_offsets[1:])
    perm = torch.sort(pair_cell, stable=True).indices                   # by cell, then doc
    ivf_offsets = torch.zeros(n_centroids + 1, dtype=torch.int64, device=dev)
    torch.cumsum(torch.bincount(pair_cell, minlength=n_centroids), 0, out=ivf_offsets[1:])
    return cells_offsets, pair_cell.to(torch.int32), ivf_offsets, pair_doc[perm].to(torch.int32)
