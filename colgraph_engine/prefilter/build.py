"""Building a prefilter index: centroids, residual codec, codes, inverted lists.

Steps (PLAID's, see :mod:`.kmeans` and :mod:`.codec` for the rules and where they come from):

1. k-means centroids over at most ``max_points`` sampled tokens (default: 256 per centroid,
   capped; see :mod:`.kmeans`) (default count
   ``2^floor(log2(16 * sqrt(T)))``), on the device of the input (CPU fallback: the CPU);
2. every token assigned to its nearest centroid (blocked), residual ``x - c``;
3. bucket cutoffs and weights from the residuals of the training tokens;
4. every residual packed into ``nbits`` per dimension; inverted lists derived from the codes.
"""
from __future__ import annotations

import numbers

import torch

from ..packed import check_finite, check_offsets, check_values
from . import codec, coarse, kmeans, row_parts
from .layout import IndexState, derive_lists

ENCODE_BLOCK = 1 << 16  # tokens encoded per step (bounds the float32 scratch at 64K x d)


def encode(values: torch.Tensor, centroids: torch.Tensor, cutoffs: torch.Tensor, nbits: int, groups=None,
           *, fit_groups: bool = True):
    """``(codes [T] int16/int32, residuals [T, W] uint8, squared residual norm sum)`` for
    ``values [T, d]`` (a tensor or a :class:`~.row_parts.RowParts`) against fixed centroids; blocked so scratch stays ``[ENCODE_BLOCK, d]``.
    Assignment is two-level (:mod:`.coarse`) through `groups`; without them, through groups fitted
    here to these values where `fit_groups` is set and :func:`.coarse.fit_groups` finds they pay;
    exact otherwise."""
    t = values.shape[0]
    dev = centroids.device
    codes = torch.empty(t, dtype=codec.code_dtype(centroids.shape[0]), device=dev)
    packed = torch.empty((t, codec.packed_width(values.shape[1], nbits)), dtype=torch.uint8, device=dev)
    sq = 0.0
    if groups is None and fit_groups:
        groups = coarse.fit_groups(centroids, values)
    for a in range(0, t, ENCODE_BLOCK):
        x = row_parts.rows(values, a, a + ENCODE_BLOCK).to(dev).float()
        best, _ = kmeans.assign_any(x, centroids, groups)
        r = x - centroids[best]
        sq += float((r * r).sum())
        codes[a:a + x.shape[0]] = best.to(codes.dtype)
        packed[a:a + x.shape[0]] = codec.encode_residuals(r, cutoffs, nbits)
    return codes, packed, sq


def check_corpus(values, offsets, name: str = "values") -> tuple[torch.Tensor, torch.Tensor]:
    """Validated packed ``(values [T, d], offsets [N+1])``: finite, at least one token. `values`
    may be a :class:`~.row_parts.RowParts` (checked part by part, never joined)."""
    if isinstance(values, row_parts.RowParts):
        if values.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"{name}: expected float32, float16 or bfloat16 values, got {values.dtype}")
        offsets = check_offsets(offsets, values.shape[0], values.device, "offsets")
        values.check_finite(name)
        return values, offsets
    values = check_values(values, name)
    offsets = check_offsets(offsets, values.shape[0], values.device, "offsets")
    check_finite(values, name)
    return values, offsets


def build_state(values: torch.Tensor, offsets: torch.Tensor, ids: torch.Tensor, *, nbits: int = 2,
                n_centroids: int | None = None, max_points: int | None = None,
                iterations: int = kmeans.DEFAULT_ITERATIONS, seed: int = 0, device: torch.device | None = None,
                progress=None, normalize_decoded: bool | None = None) -> IndexState:
    """An :class:`IndexState` over validated packed documents (see the module docstring).

    `normalize_decoded`: L2-normalise decoded vectors before exact scoring, as ColBERT does with
    its decompressed embeddings; None (default) turns it on when the inputs are unit vectors
    (every sampled token's norm within 1e-3 of 1: late-interaction encoders emit unit tokens),
    so the decoded vectors keep the inputs' norm; non-unit inputs are scored as decoded."""
    nbits = codec.check_nbits(nbits)
    t, d = values.shape
    if t == 0:
        raise ValueError("values: the corpus is empty (no token vectors); a prefilter needs at least one token")
    codec.packed_width(d, nbits)  # raises for a dimension nbits cannot pack
    if n_centroids is None:
        n_centroids = kmeans.default_centroid_count(t)
    elif isinstance(n_centroids, bool) or not isinstance(n_centroids, numbers.Integral) or n_centroids < 1:
        raise ValueError(f"n_centroids: expected a positive int or None, got {n_centroids!r}")
    dev = torch.device(device) if device is not None else values.device
    g = torch.Generator().manual_seed(seed)
    if max_points is None:
        max_points = kmeans.default_max_points(n_centroids, dev)
    elif isinstance(max_points, bool) or not isinstance(max_points, numbers.Integral) or max_points < 1:
        raise ValueError(f"max_points: expected a positive int or None, got {max_points!r}")
    sample = kmeans.sample_points(values, int(max_points), g).to(dev)
    if normalize_decoded is None:
        normalize_decoded = bool(((sample.norm(dim=1) - 1).abs() <= 1e-3).all())
    elif not isinstance(normalize_decoded, bool):
        raise TypeError(f"normalize_decoded: expected a bool or None, got {type(normalize_decoded).__name__}")
    centroids = kmeans.kmeans(sample, int(n_centroids), iterations=iterations, seed=seed, progress=progress)
    groups = coarse.fit_groups(centroids, sample, seed=seed)
    best, _ = kmeans.assign_any(sample, centroids, groups)
    cutoffs, weights = codec.fit_buckets(sample - centroids[best], nbits)
    codes, residuals, sq = encode(values, centroids, cutoffs, nbits, groups, fit_groups=False)
    offsets = offsets.to(dev)
    cells_offsets, cells, ivf_offsets, ivf_docs = derive_lists(codes, offsets, centroids.shape[0])
    ids = ids.to(dev)
    return IndexState(nbits=nbits, centroids=centroids, cutoffs=cutoffs, weights=weights, codes=codes,
                      residuals=residuals, offsets=offsets, ids=ids,
                      alive=torch.ones(ids.numel(), dtype=torch.bool, device=dev), cells_offsets=cells_offsets,
                      cells=cells, ivf_offsets=ivf_offsets, ivf_docs=ivf_docs, unit=normalize_decoded, build_mse=sq / t,
                      next_id=int(ids.max()) + 1 if ids.numel() else 0)
