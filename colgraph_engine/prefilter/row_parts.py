"""Packed token rows held in several tensors, read as one ``[T, d]`` without concatenating them.

A carried prefilter is rebuilt over a store's live rows plus the rows a commit adds. Joining the
two with ``torch.cat`` copied the whole store (2 bytes x d a token in float16: 5.4 GB at 21M
tokens of d = 128) next to its memory-mapped file, the largest allocation of a 100k-document
ingest. A build reads its input only as a sample of rows (k-means) and as consecutive blocks
(encoding), so both are served from the parts directly: the only copies are one block or the
sample.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from ..packed import check_finite

BLOCK = 1 << 16  # rows per step when a non-finite row is looked for


class RowParts:
    """Rows ``parts[0]``, then ``parts[1]``, ... as one ``[T, d]`` packed tensor (read-only).

    Args:
        parts: 2-D tensors of one dtype, device and width d (empty parts are dropped).
    """

    def __init__(self, parts: Sequence[torch.Tensor]):
        if isinstance(parts, torch.Tensor) or not isinstance(parts, Sequence) or not parts:
            raise TypeError("parts: expected a non-empty sequence of 2-D tensors")
        for i, p in enumerate(parts):
            if not isinstance(p, torch.Tensor) or p.dim() != 2:
                raise TypeError(f"parts[{i}]: expected a 2-D tensor, got "
                                f"{type(p).__name__ if not isinstance(p, torch.Tensor) else f'{p.dim()}-D'}")
            if (p.shape[1], p.dtype, p.device) != (parts[0].shape[1], parts[0].dtype, parts[0].device):
                raise ValueError(f"parts[{i}]: expected width {parts[0].shape[1]}, {parts[0].dtype} on "
                                 f"{parts[0].device} like parts[0], got {p.shape[1]}, {p.dtype} on {p.device}")
        kept = [p for p in parts if p.shape[0]] or [parts[0]]
        self.parts = kept
        starts = [0]
        for p in kept:
            starts.append(starts[-1] + p.shape[0])
        self.starts = torch.tensor(starts, dtype=torch.int64)  # [P+1] first row of each part
        self.shape = torch.Size((starts[-1], kept[0].shape[1]))
        self.dtype, self.device = kept[0].dtype, kept[0].device

    def __len__(self) -> int:
        return self.shape[0]

    def rows(self, a: int, b: int) -> torch.Tensor:
        """Rows ``a..b-1`` (a view when they lie in one part, else a copy of just those rows)."""
        a, b = max(0, a), min(b, self.shape[0])
        pieces = []
        for p, lo in zip(self.parts, self.starts[:-1].tolist()):
            hi = lo + p.shape[0]
            if hi > a and lo < b:
                pieces.append(p[max(a, lo) - lo:min(b, hi) - lo])
        if not pieces:
            return self.parts[0][:0]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def take(self, index: torch.Tensor) -> torch.Tensor:
        """``[len(index), d]`` rows at `index` (int64, in ``[0, T)``), in the order given."""
        index = index.to(torch.int64).cpu()
        which = torch.searchsorted(self.starts, index, right=True) - 1
        out = torch.empty((index.numel(), self.shape[1]), dtype=self.dtype, device=self.device)
        for j, p in enumerate(self.parts):
            at = torch.nonzero(which == j).squeeze(1)
            if at.numel():
                out[at.to(self.device)] = p[(index[at] - self.starts[j]).to(self.device)]
        return out

    def check_finite(self, name: str) -> None:
        """ValueError naming `name` and the row (counted over all parts) when a value is NaN or
        inf; checked part by part, so the scratch is one part's min and max."""
        for j, p in enumerate(self.parts):
            try:
                check_finite(p, name)
            except ValueError:
                bad = next(a + int(torch.nonzero(~torch.isfinite(p[a:a + BLOCK]).all(1))[0])
                           for a in range(0, p.shape[0], BLOCK) if not bool(torch.isfinite(p[a:a + BLOCK]).all()))
                raise ValueError(f"{name}: expected finite values, found NaN or inf in row "
                                 f"{int(self.starts[j]) + bad}") from None


def rows(values, a: int, b: int) -> torch.Tensor:
    """Rows ``a..b-1`` of a ``[T, d]`` tensor or :class:`RowParts`."""
    return values.rows(a, b) if isinstance(values, RowParts) else values[a:b]


def take(values, index: torch.Tensor) -> torch.Tensor:
    """Rows at `index` of a ``[T, d]`` tensor or :class:`RowParts`."""
    return values.take(index) if isinstance(values, RowParts) else values[index.to(values.device)]
