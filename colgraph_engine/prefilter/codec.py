"""Residual compression: a token is a centroid id plus `nbits` bits per dimension.

For a token ``x`` assigned to centroid ``c``, the residual ``r = x - c`` is quantised per
dimension into ``2^nbits`` buckets:

* cutoffs ``[2^nbits - 1]``: quantiles ``j / 2^nbits`` (j = 1 .. 2^nbits - 1) of all residual
  components of the training tokens; a component's bucket is the number of cutoffs it is >= to
  (``torch.bucketize(..., right=True)``);
* weights ``[2^nbits]``: quantiles ``(j + 0.5) / 2^nbits`` (j = 0 .. 2^nbits - 1), the value a
  bucket decodes to.

These two rules are ColBERT's (``collection_indexer.py``, ``_compute_avg_residual``).
Decoding: ``x' = c + weights[bucket]`` per dimension. As in ColBERT, an index of unit inputs
then re-normalises ``x'`` (``IndexState.unit``, applied by the exact stage, :mod:`.rescore`);
for other inputs ``x'`` is scored as decoded (our choice: there is no norm to restore).

Packing: ``8 / nbits`` dimensions per byte, dimension ``j`` in byte ``j // (8 / nbits)`` at bit
``(j % (8 / nbits)) * nbits`` (lowest bits first): ``[T, d * nbits / 8]`` uint8. d must be a
multiple of ``8 / nbits``.
"""
from __future__ import annotations

import torch

NBITS = (1, 2, 4)
QUANTILE_LIMIT = 1 << 24  # torch.quantile accepts at most 2^24 values


def check_nbits(nbits) -> int:
    if isinstance(nbits, bool) or not isinstance(nbits, int):
        raise TypeError(f"nbits: expected an int in {NBITS}, got {type(nbits).__name__}")
    if nbits not in NBITS:
        raise ValueError(f"nbits: expected one of {NBITS}, got {nbits}")
    return nbits


def packed_width(dim: int, nbits: int) -> int:
    """Bytes per token for the residual of a `dim`-dimensional vector."""
    per = 8 // nbits
    if dim % per:
        raise ValueError(f"dim: expected a multiple of {per} for nbits={nbits}, got {dim}")
    return dim // per


def fit_buckets(residuals: torch.Tensor, nbits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cutoffs [2^nbits - 1], weights [2^nbits])`` float32 from training residuals ``[P, d]``."""
    n = 1 << nbits
    flat = residuals.float().reshape(-1)
    if flat.numel() > QUANTILE_LIMIT:  # torch.quantile's input limit: an evenly strided subsample (ours)
        pick = torch.arange(QUANTILE_LIMIT, dtype=torch.int64, device=flat.device) * flat.numel() // QUANTILE_LIMIT
        flat = flat[pick]
    q = torch.arange(n, dtype=torch.float32, device=flat.device) / n
    both = torch.quantile(flat, torch.cat([q[1:], q + 0.5 / n]))  # one sort for both sets
    return both[:n - 1].cpu(), both[n - 1:].cpu()


def byte_table(weights: torch.Tensor, nbits: int) -> torch.Tensor:
    """``[256, 8 / nbits]`` float32: the decoded residual components held in each byte value."""
    per = 8 // nbits
    v = torch.arange(256, dtype=torch.int64)
    shifts = torch.arange(per, dtype=torch.int64) * nbits
    buckets = (v[:, None] >> shifts[None, :]) & ((1 << nbits) - 1)
    return weights.float()[buckets]


def encode_residuals(residuals: torch.Tensor, cutoffs: torch.Tensor, nbits: int) -> torch.Tensor:
    """``[T, d]`` residuals -> ``[T, d * nbits / 8]`` uint8 packed bucket indices."""
    t, d = residuals.shape
    per = 8 // nbits
    b = torch.bucketize(residuals.float(), cutoffs.to(residuals.device), right=True)  # [T, d] in [0, 2^nbits)
    b = b.view(t, d // per, per)
    shifts = torch.arange(per, dtype=torch.int64, device=b.device) * nbits
    return (b << shifts).sum(-1).to(torch.uint8)


def decode_residuals(packed: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``[T, W]`` uint8 -> ``[T, W * per]`` float32 decoded residuals (`table` from :func:`byte_table`)."""
    t, w = packed.shape
    return table.to(packed.device)[packed.long()].view(t, w * table.shape[1])


def code_dtype(n_centroids: int) -> torch.dtype:
    """The narrowest signed integer type that holds centroid ids below `n_centroids`."""
    return torch.int16 if n_centroids <= (1 << 15) else torch.int32
