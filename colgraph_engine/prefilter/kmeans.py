"""k-means for the prefilter's centroids (torch; runs on the device of the points).

Count: PLAID's rule, ``2^floor(log2(16 * sqrt(T)))`` for T token vectors (ColBERT's
``collection_indexer.py``: ``num_partitions``), clipped to the number of training points.

Training points: at most ``max_points`` tokens, sampled uniformly without replacement (ColBERT
samples whole passages, about ``16 * sqrt(120 * N)`` of them; sampling tokens directly is our
choice: it bounds the work by a token count whatever the document lengths). Default
(:func:`default_max_points`): 256 points per centroid, fastkmeans' ``max_points_per_centroid``
as fast-plaid calls it, capped at 2^18 tokens on the CPU (ours: k-means there costs about
``points x centroids x d x 8`` flops, minutes beyond that on a few cores) and 2^24 on a GPU
(ours: a 8 GiB float32 sample at d = 128). Iterations: 4 by
default, ColBERT's ``kmeans_niters``. Initialisation: distinct random training points; an empty
cluster is re-seeded with the point farthest from its centroid (ours). Assignment is by largest
inner product on unit vectors (== nearest in L2 for unit data); centroids are the normalised
means, as the token vectors of late-interaction models are unit vectors.

Work is blocked: the ``[points, centroids]`` score block never exceeds ``block_elems`` values.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import coarse, row_parts

DEFAULT_ITERATIONS = 4          # ColBERT's kmeans_niters
POINTS_PER_CENTROID = 256       # fastkmeans' max_points_per_centroid (fast-plaid's create)
MAX_POINTS_CPU = 1 << 18        # ours: caps of the default sample (see the module docstring)
MAX_POINTS_GPU = 1 << 24
BLOCK_ELEMS = 1 << 22           # ours: 16 MiB of fp32 scores per assignment block (CPU; 1.36x faster than 64 MiB blocks here)
BLOCK_ELEMS_GPU = 1 << 28       # ours: 1 GiB on a GPU, where a block is one large matrix product


def default_centroid_count(n_tokens: int) -> int:
    """PLAID's default: ``2^floor(log2(16 * sqrt(n_tokens)))`` (at least 1)."""
    if n_tokens < 1:
        raise ValueError(f"n_tokens: expected at least 1 token, got {n_tokens}")
    return int(2 ** math.floor(math.log2(16 * math.sqrt(n_tokens))))


def default_max_points(n_centroids: int, device: torch.device | str) -> int:
    """Training tokens sampled by default: ``256 * n_centroids``, at most 2^18 on the CPU and
    2^24 elsewhere (see the module docstring)."""
    cap = MAX_POINTS_CPU if torch.device(device).type == "cpu" else MAX_POINTS_GPU
    return min(POINTS_PER_CENTROID * int(n_centroids), cap)


def assign(points: torch.Tensor, centroids: torch.Tensor, block_elems: int | None = None):
    """``(best [P] int64, score [P] float32)``: each point's centroid by largest inner product
    (ties: lower index), computed in blocks of rows of at most `block_elems` scores (default
    :data:`BLOCK_ELEMS` on the CPU, :data:`BLOCK_ELEMS_GPU` elsewhere). `points` ``[P, d]``,
    `centroids` ``[C, d]``."""
    if block_elems is None:
        block_elems = BLOCK_ELEMS if points.device.type == "cpu" else BLOCK_ELEMS_GPU
    p = points.shape[0]
    best = torch.empty(p, dtype=torch.int64, device=points.device)
    score = torch.empty(p, dtype=torch.float32, device=points.device)
    rows = max(1, block_elems // max(1, centroids.shape[0]))
    c = centroids.float()
    for a in range(0, p, rows):
        s = points[a:a + rows].float() @ c.T
        v, i = s.max(dim=1)
        best[a:a + rows], score[a:a + rows] = i, v
    return best, score


def sample_points(values: torch.Tensor, max_points: int, generator: torch.Generator) -> torch.Tensor:
    """At most `max_points` rows of ``values [T, d]`` (a tensor or a :class:`~.row_parts.RowParts`) chosen uniformly without replacement (all
    rows when T is smaller), as float32 on `values`' device."""
    t = values.shape[0]
    if t <= max_points:
        return row_parts.rows(values, 0, t).float()
    pick = torch.randperm(t, generator=generator)[:max_points].sort().values
    return row_parts.take(values, pick).float()


def assign_any(points: torch.Tensor, centroids: torch.Tensor, groups=None):
    """``(best, score)`` as :func:`assign`, through `groups` (a
    :class:`~.coarse.CentroidGroups` of these centroids) when given: two-level, approximate."""
    return assign(points, centroids) if groups is None else coarse.assign_grouped(points, groups)


def kmeans(points: torch.Tensor, n_centroids: int, *, iterations: int = DEFAULT_ITERATIONS, seed: int = 0,
           progress=None, two_level: bool = True) -> torch.Tensor:
    """``[C, d]`` float32 unit centroids of ``points [P, d]`` (C = min(n_centroids, P)).

    `progress`: optional callable taking one int (iterations done), e.g. a tqdm's ``update``.
    `two_level`: assign through :mod:`.coarse` (centroids regrouped each iteration) where
    :func:`.coarse.fit_groups` finds it pays and agrees with exact assignment; False: always exact.
    """
    p, d = points.shape
    c = min(int(n_centroids), p)
    g = torch.Generator().manual_seed(seed)
    x = F.normalize(points.float(), dim=-1)
    cent = x[torch.randperm(p, generator=g)[:c].to(x.device)].clone()
    for _ in range(iterations):
        best, score = assign_any(x, cent, coarse.fit_groups(cent, x, seed=seed) if two_level else None)
        sums = torch.zeros_like(cent).index_add_(0, best, x)
        counts = torch.bincount(best, minlength=c)
        empty = torch.nonzero(counts == 0).squeeze(1)
        if empty.numel():  # re-seed with the worst-served points (distinct)
            worst = torch.topk(score, min(empty.numel(), p), largest=False).indices
            sums[empty[:worst.numel()]] = x[worst]
        cent = F.normalize(sums, dim=-1)
        if progress is not None:
            progress(1)
    return cent
