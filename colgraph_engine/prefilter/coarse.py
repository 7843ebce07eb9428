"""Two-level centroid assignment on the CPU: a point scores a few groups of centroids, not all.

Encoding a store (:func:`colgraph_engine.prefilter.build.encode`) and the k-means iterations
assign every token to its nearest of ``C`` centroids: ``T x C x d`` multiply-adds, about 82 % of
a 10,000-document ingest on this project's 2-core CPU machine (C = 16,384, T = 2.9M tokens), where
one matrix product per block runs at about 50 GFLOP/s.

Here the centroids themselves are clustered into ``G`` groups (seeded k-means over the
centroids, :data:`GROUP_ITERATIONS` iterations), and each centroid is listed in the ``L`` groups
whose means it is nearest to, so a group's list holds its own members and the borders of its
neighbours. A point scores the ``G`` group means, takes its nearest group and scores only that
group's list, taking the best centroid there (ties: lower centroid index, as
:func:`colgraph_engine.prefilter.kmeans.assign`). Work per point: ``G + L x C / G`` centroids
instead of ``C`` (C = 16,384, G = 128, L = 8: 1,152). Listing centroids in several groups (rather
than probing several groups per point) keeps one matrix product per group over the points that
chose it.

It is approximate, so it checks itself on the data it is given (:func:`fit_groups`): a sample of
:data:`CHECK_POINTS` points is assigned both ways, and ``L`` doubles from :data:`LISTED_IN` until
at least :data:`TARGET_AGREEMENT` of the sample gets its exact centroid; where that needs more
than a third of the exact work, assignment stays exact. Measured (ad-hoc, one thread, this
project's 2-core CPU machine): on the segment tokens of ``benchmarks/lightrag_peer.py``'s 1k corpus
(8,192 centroids, 65,536 tokens, hashing encoder) L = 8 agreed on 99.99 % of the tokens, the mean
squared residual rose 0.2 %, and a block took 0.29 s against 2.3-2.9 s exact; on synthetic
points whose noise is as large as the spread of their centres (2,048 centroids, d = 32 or 128)
L = 8 agreed on only 77-81 % (residual +9-14 %), L = 16 on 90 %, so those stay exact. A different
centroid only moves a token to a neighbouring cell of the prefilter (the exact stage scores the
shortlist on the stored vectors). End to end (``benchmarks/results/lightrag_peer.md``, 2026-12-03,
same machine): the 10,000-document ingest took 130 s (commits 124 s) against 942 s (commits
934 s) on 2026-12-02 before this module, and ``benchmarks/results/recall_default.md`` kept recall
of the exact top-10 at 0.988-1.000 over its ten corpora. The rule, G, L, the target and the switch-over sizes are ours:
PLAID and ColBERT assign exactly (on a GPU); so does :func:`~.kmeans.assign`, which stays the
path on a GPU, for small centroid sets and for few points.

A bound that would make it exact (skip a group only when its mean's score plus its radius is
below the best found) prunes nothing here: the groups' radii are about 1 for unit centroids in
d = 128, so every group's bound passes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

GROUP_ITERATIONS = 6        # ours: k-means iterations over the centroids (C x G x d each: cheap)
LISTED_IN = 8               # ours: first L tried by fit_groups (groups listing each centroid)
TARGET_AGREEMENT = 0.99     # ours: share of checked points that must get their exact centroid
CHECK_POINTS = 4096         # ours: points fit_groups assigns both ways
MAX_WORK_SHARE = 1 / 3      # ours: above this share of the exact work, stay exact
MIN_CENTROIDS = 2048        # ours: below this the exact product is cheap enough
MIN_POINTS_PER_CENTROID = 4  # ours: fewer points than 4 x C do not pay for grouping the centroids


@dataclass(frozen=True)
class CentroidGroups:
    """The centroids ``[C, d]`` grouped: ``means [G, d]`` unit group means; group g's list is
    ``listed[starts[g]:starts[g + 1]]``, centroid indices in ascending order."""

    centroids: torch.Tensor
    means: torch.Tensor
    listed: torch.Tensor
    starts: torch.Tensor

    @property
    def n_groups(self) -> int:
        return int(self.means.shape[0])


def default_group_count(n_centroids: int) -> int:
    """``2^floor(log2(sqrt(C)) + 1/2)``, at most C (ours): groups of about ``sqrt(C)`` centroids
    (C = 8,192 or 16,384: 128 groups)."""
    if n_centroids < 1:
        raise ValueError(f"n_centroids: expected at least 1, got {n_centroids}")
    return min(int(n_centroids), 1 << int(math.log2(math.sqrt(n_centroids)) + 0.5))


def worthwhile(n_points: int, centroids: torch.Tensor) -> bool:
    """True where two-level assignment pays: on the CPU, at least :data:`MIN_CENTROIDS` centroids
    and :data:`MIN_POINTS_PER_CENTROID` points per centroid (grouping costs about
    ``C x G x d x GROUP_ITERATIONS``)."""
    c = int(centroids.shape[0])
    return (centroids.device.type == "cpu" and c >= MIN_CENTROIDS
            and n_points >= MIN_POINTS_PER_CENTROID * c)


def _group_means(centroids: torch.Tensor, n_groups: int | None, seed: int) -> torch.Tensor:
    from . import kmeans  # kmeans imports this module

    c = centroids.float()
    g = default_group_count(c.shape[0]) if n_groups is None else n_groups
    if isinstance(g, bool) or not isinstance(g, int) or not 1 <= g <= c.shape[0]:
        raise ValueError(f"n_groups: expected an int from 1 to {c.shape[0]} (the centroid count), got {n_groups!r}")
    return kmeans.kmeans(c, g, iterations=GROUP_ITERATIONS, seed=seed, two_level=False)


def _check_listed_in(listed_in) -> None:
    if isinstance(listed_in, bool) or not isinstance(listed_in, int) or listed_in < 1:
        raise ValueError(f"listed_in: expected a positive int, got {listed_in!r}")


def _listed(centroids: torch.Tensor, means: torch.Tensor, listed_in: int) -> CentroidGroups:
    _check_listed_in(listed_in)
    c = centroids.float()
    g = means.shape[0]
    near = (c @ means.T).topk(min(listed_in, g), dim=1).indices        # [C, L]
    pair_group = near.reshape(-1)
    by_group = torch.argsort(pair_group, stable=True)                   # centroid-major: ascending within a group
    listed = by_group // near.shape[1]
    starts = torch.zeros(g + 1, dtype=torch.int64)
    starts[1:] = torch.cumsum(torch.bincount(pair_group, minlength=g), 0)
    return CentroidGroups(c, means, listed, starts)


def group_centroids(centroids: torch.Tensor, n_groups: int | None = None, *, listed_in: int = LISTED_IN,
                    seed: int = 0) -> CentroidGroups:
    """Groups ``centroids [C, d]`` by seeded k-means into `n_groups` (default
    :func:`default_group_count`), each centroid listed in its `listed_in` nearest groups;
    deterministic for the same centroids and seed. `listed_in` is checked before the grouping
    work (:func:`_listed` checks it again for its other callers)."""
    _check_listed_in(listed_in)
    return _listed(centroids, _group_means(centroids, n_groups, seed), listed_in)


def work_per_point(groups: CentroidGroups) -> float:
    """Centroids a point scores on average: ``G + (list entries) / G``."""
    return groups.n_groups + int(groups.starts[-1]) / groups.n_groups


def check_sample(points: torch.Tensor, n: int = CHECK_POINTS) -> torch.Tensor:
    """At most `n` rows of ``points [P, d]``, evenly strided (deterministic), as float32."""
    step = max(1, points.shape[0] // n)
    return points[::step][:n].float()


def fit_groups(centroids: torch.Tensor, points: torch.Tensor, *, seed: int = 0):
    """Groups for assigning `points` ``[P, d]`` to ``centroids [C, d]``, or None where exact
    assignment is the choice: not :func:`worthwhile`, or no ``L`` within :data:`MAX_WORK_SHARE`
    of the exact work reaches :data:`TARGET_AGREEMENT` on :func:`check_sample` of the points."""
    from . import kmeans  # kmeans imports this module

    if not worthwhile(points.shape[0], centroids):
        return None
    c = int(centroids.shape[0])
    means = _group_means(centroids, None, seed)
    probe = check_sample(points)
    exact, _ = kmeans.assign(probe, centroids)
    listed_in = LISTED_IN
    while listed_in <= means.shape[0]:
        groups = _listed(centroids, means, listed_in)
        if work_per_point(groups) > MAX_WORK_SHARE * c:
            return None
        got, _ = assign_grouped(probe, groups)
        if float((got == exact).float().mean()) >= TARGET_AGREEMENT:
            return groups
        listed_in *= 2
    return None


def assign_grouped(points: torch.Tensor, groups: CentroidGroups):
    """``(best [P] int64, score [P] float32)``: each point's best centroid in the list of its
    nearest group (see the module docstring). `points` ``[P, d]`` on the CPU."""
    x = points.float()
    p = x.shape[0]
    best = torch.zeros(p, dtype=torch.int64)
    score = torch.full((p,), -torch.inf)
    if p == 0:
        return best, score
    nearest = (x @ groups.means.T).argmax(dim=1)
    order = torch.argsort(nearest, stable=True)
    rows = x[order]                                                     # the points, contiguous per group
    bounds = torch.searchsorted(nearest[order], torch.arange(groups.n_groups + 1)).tolist()
    starts = groups.starts.tolist()
    for gi in range(groups.n_groups):
        lo, hi = bounds[gi], bounds[gi + 1]
        if lo == hi:
            continue
        listed = groups.listed[starts[gi]:starts[gi + 1]]
        at = order[lo:hi]
        if listed.numel() == 0:  # no centroid lists this group (its mean drifted off them): exact
            from .kmeans import assign
            best[at], score[at] = assign(rows[lo:hi], groups.centroids)
            continue
        v, j = (rows[lo:hi] @ groups.centroids[listed].T).max(dim=1)   # first of equals: the lower index
        score[at], best[at] = v, listed[j]
    return best, score
