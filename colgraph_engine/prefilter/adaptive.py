"""Adaptive per-query candidate budget: the prefilter search behind the pipeline's default recall.

PLAID's knobs (:mod:`.search`: probe ``ncells`` centroids per query token, keep ``ndocs``
candidates by a pruned centroid score, score ``ndocs // 4`` exactly) are fixed counts, tuned by
ColBERT on its own corpora. How many candidates a corpus needs depends on how its tokens cluster
and how close its best documents score: on clustered corpora whose documents share topics
(``benchmarks/recall_default.py``), the pipeline's former budget (PLAID's k <= 100 settings
for 64 units) kept 0.84-0.999 of the exact top-10 documents depending on the shape, and no fixed
count fitted every shape without paying for the hardest one everywhere. Here the budget is set
per query, from the corpus's centroids and the query's own scores (rule ours; PLAID's threshold
idea applied to the exact stage):

1. centroid scores ``S = Q C^T`` ``[L, C]`` (PLAID's stage 1);
2. probe: each query token probes its ``n`` best centroids; ``n`` starts at ``ncells`` (1)
   and doubles in step 5, up to ``ncells_max`` (64);
3. candidates: the live items on the probed inverted lists, each with its **full centroid
   score** ``F(x) = Σ_i max_{c in cells(x)} S[i, c]`` (PLAID's stage 4, over every candidate;
   stage 3's threshold pruning is not used: on these CPU runs it was the slowest stage and lost
   documents near the threshold);
4. exact scoring by margin: the ``max(first, 2k, first_share x candidates)`` candidates of
   highest ``F`` (32; 1/32 of the first probe's candidates) and a
   systematic sample of ``sample`` (32) others, evenly spaced in ``F`` order so that it spans
   the candidates' whole range, are scored exactly (``E``, by the caller's exact stage). The
   errors ``e = E - F`` give the margin ``m = max(max e over everything scored,
   mean(e_sample) + z * std(e_sample))`` (z = 3). Every candidate with ``F >= s_k - m``, where
   ``s_k`` is the k-th best **group** (document) score found so far, is scored exactly; repeated
   until none is left (``s_k`` can only rise, ``m`` only grow). Why the sample: ``F``'s error
   falls as ``F`` rises (measured: correlation -0.45 to -0.67 between e and F over a query's
   candidates; the top candidates by ``F`` are the ones ``F`` overrates), so the items scored
   first understate the error of the items not scored yet; a margin from them alone missed
   documents in every shape tried. Why ``first_share``: on hashing token vectors of made-up
   names (``benchmarks/lightrag_peer.py`` at 10,000 documents, 2.9M tokens, 16,384 centroids,
   8-17k candidates at the first probe) ``F`` underrates most the items that hold the question's
   own words (a centroid blends many distinct words): the exact top document's best segment had
   ``e`` = 0.87, far above the sample's margin, and ranked 41st to 309th by ``F``, so 32 first
   candidates missed the top document for 6 of 120 questions (recall of the exact top 10: 0.986,
   worst 0.5). With 1/32 of the candidates first (about 330 there; our choice, the smallest
   share tried that recalled all 120 lists: 1/32, 1/16, 1/8) it was 1.000; on the smaller shapes
   below the share adds little (``first`` already exceeds it);
5. deepen: when nothing is left to score, the search stops if no item still unreached can
   reach ``s_k - m``: an item none of whose centroids is among any token's ``n`` best has
   ``F <= U_n = Σ_i S[i, order[i, n]]`` (each token's ``(n+1)``-th best centroid score), so the
   stop needs ``U_n < s_k - m`` (counted from each token's first centroid not yet probed, by any
   token: a tighter bound, as valid). Else the probe goes to the smallest depth ``n' > n``
   with ``U_n' < s_k - m`` (all the ``U`` come from the centroid scores alone, before any list
   is read), or to ``2n`` when no depth up to ``ncells_max`` has one; the items it adds get
   ``F``, and step 4 runs again. (Doubling alone was the rule before: on lightrag_peer's
   10,000-document corpus it overshot the depth the bound needed, and the last doubling's
   thousands of items got ``F`` only to show that none reached the threshold; going to ``n'``
   gave the same documents for 120 of 120 questions in 11% less recall time. Going to
   ``ncells_max`` when no depth meets the bound lost recall: the items of many probes at once
   reach the exact stage before ``s_k`` has risen with them, ``max_share`` stops the query, and
   topics-2000-d64 fell from 0.988 to 0.941.)
   So the probe depth follows the corpus and the query (a query whose top documents are
   near-ties with many others probes deeper and scores more);
6. limits: a query stops, keeping what it scored, once the margin would have it score more than
   ``max_share`` (half) of the live items, or at ``ncells_max`` (``unsettled="exhaustive"``
   scores every live item instead); a query that has found fewer than ``k`` groups by then
   scores every live item (exact answers rather than fewer of them). ``stats["stop"]`` says which.

Every item returned was scored exactly, so a caller ranking groups by their best item keeps
exact scores; the budget controls only which items reach the exact stage. The stages run on the
CPU with numpy, the centroid scores ``S`` and the full centroid scores in the native module where
it is built (:func:`centroid_scores`; a prefilter on another device is copied to the CPU once per
state, with its centroids in the native kernel's blocked layout: as many bytes again as the
centroids); the exact stage runs wherever the caller's
vectors are, one call per round for a whole batch, or for each half of a batch of
:data:`PARALLEL_MIN_QUERIES` or more searched on two threads (:func:`search`). Nothing per query is sized by the corpus except
the centroid scores (``C ~ 16 sqrt(tokens)`` by PLAID's rule) and, inside one list union at a
time, a byte per item (:func:`_listed`; the pipeline's per-document merge is of that order):
candidates come from the inverted lists of the probed centroids.

Measured (``benchmarks/results/recall_default.md``, 2026-12-04 run at c3fd1a4, with the
unreached bound of step 5; 2 shared CPU cores, one torch thread; recall of the exact top-10
documents, 64 queries per corpus; prefilters built as an index builds a carried one, centroids
assigned two-level where it pays; batches in lockstep, full centroid scores native):

    shape (documents, tokens, d)             recall   PLAID-64   x exact (batch / single)
    topics-50 (3,000, 239k, 128)             1.000    0.989      2.5 / 4.6
    topics-1000 (1,500, 120k, 128)           1.000    0.894      1.0 / 2.9
    topics-2000-d64 (3,000, 241k, 64)        0.988    0.842      0.8 / 1.4
    long-units (1,000 x 128-256 tok., 128)   0.991    0.950      1.3 / 2.8
    one-unit-tight (4,000, 159k, 128)        1.000    0.963      1.5 / 4.1
    topics-1000 at 10,000 (803k, 128)        0.997    0.975      4.8 / 13.2
    topics-200-d64 at 10,000 (805k, 64)      1.000    0.998      2.9 / 5.1
    MMLongBench-Doc pages (2,026, 462k, 384) 0.994    0.990      3.5 / 6.5

At 100,000 documents (``benchmarks/results/ours_at_scale_100k.md``: 29M tokens, 65,536
centroids, the pipeline's default recall against its exact path) the bound took recall of the
exact top-Kd from 0.963 (worst question 0.20) to 0.995 (worst 0.90).

(below ``PipelineConfig.prefilter_min_tokens`` the default recall does not use a prefilter at
all; the small shapes measure the forced prefilter's recall).
"""
from __future__ import annotations

import math
import numbers
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import _native
from ..ops._native_impl import num_threads as native_threads, thread_cap
from .layout import IndexState


@dataclass(frozen=True)
class Budget:
    """The adaptive rule's constants (see the module docstring; all ours)."""
    ncells: int = 1          # probe depth to start from (doubled per deepening)
    ncells_max: int = 64     # deepest probe
    first: int = 32          # candidates of best F scored exactly first (at least 2k) ...
    first_share: float = 1 / 32  # ... and at least this share of the first probe's candidates
    sample: int = 32         # candidates sampled evenly in F order to estimate F's error
    z: float = 3.0           # margin = mean + z * std of the sampled errors (or the largest error seen)
    max_share: float = 0.5   # a query stops once it would score more than this share of the live items exactly
    unsettled: str = "stop"  # a query stopped by ncells_max or max_share: "stop" (keep what it scored) or
    #                          "exhaustive" (score every live item)

    def __post_init__(self):
        for name in ("ncells", "ncells_max", "first", "sample"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < (0 if name == "sample" else 1):
                raise ValueError(f"{name}: expected a {'non-negative' if name == 'sample' else 'positive'} int, "
                                 f"got {v!r}")
        if self.ncells_max < self.ncells:
            raise ValueError(f"ncells_max: expected at least ncells ({self.ncells}), got {self.ncells_max}")
        if isinstance(self.z, bool) or not isinstance(self.z, numbers.Real) or not 0 <= self.z <= 100:
            raise ValueError(f"z: expected a number in [0, 100], got {self.z!r}")
        x = self.max_share
        if isinstance(x, bool) or not isinstance(x, numbers.Real) or not 0 < x <= 1:
            raise ValueError(f"max_share: expected a number in (0, 1], got {x!r}")
        x = self.first_share
        if isinstance(x, bool) or not isinstance(x, numbers.Real) or not 0 <= x <= 1:
            raise ValueError(f"first_share: expected a number in [0, 1], got {x!r}")
        if self.unsettled not in ("stop", "exhaustive"):
            raise ValueError(f"unsettled: expected 'stop' or 'exhaustive', got {self.unsettled!r}")


DEFAULT = Budget()


@dataclass
class GroupResult:
    """Per query the exactly scored items as CSR: ``ids[offsets[q]:offsets[q+1]]`` (external
    ids) and their exact ``scores``; ``stats`` per query: ``candidates``, ``scored_exactly``,
    ``ncells`` (final probe depth), ``rounds``, ``margin``, ``exhaustive`` (lists), ``seconds``."""
    offsets: np.ndarray
    ids: np.ndarray
    scores: np.ndarray
    stats: dict = field(default_factory=dict)


class _Host:
    """The CPU numpy arrays of a state the search reads (cached per state)."""

    def __init__(self, state: IndexState):
        cpu = lambda t: t.detach().cpu().numpy()  # noqa: E731
        self.centroids = state.centroids.detach().float().cpu()
        self.ivf_offsets, self.ivf_docs = cpu(state.ivf_offsets), cpu(state.ivf_docs).astype(np.int64)
        # cells stay int32 (their dtype in the state): half the bytes the full centroid scores stream
        self.cells_offsets, self.cells = cpu(state.cells_offsets).astype(np.int64), cpu(state.cells).astype(np.int32)
        self.alive, self.ids = cpu(state.alive), cpu(state.ids)
        self.live = np.flatnonzero(self.alive)
        self.blocks = centroid_blocks(self.centroids.numpy()) if _NATIVE_S is not None else None


# The native kernel of the centroid scores (csrc/query_centroid_scores.cpp), None without it.
_NATIVE_S = getattr(_native.core, "query_centroid_scores", None)


def centroid_blocks(centroids: np.ndarray) -> np.ndarray:
    """``[B, d, 16]`` float32: centroids ``16b .. 16b + 15`` of ``centroids [C, d]`` transposed in
    block b, zero past C (the layout :func:`centroid_scores` reads: one contiguous stretch a block)."""
    c, d = centroids.shape
    nb = -(-c // 16)
    padded = np.zeros((nb * 16, d), np.float32)
    padded[:c] = centroids
    return np.ascontiguousarray(padded.reshape(nb, 16, d).transpose(0, 2, 1))


def centroid_scores(h: "_Host", queries: torch.Tensor) -> np.ndarray:
    """``S = Q C^T`` ``[Tq, C]`` float32 for float32 CPU ``queries [Tq, d]``: the native kernel on
    the native kernels' threads where the module has it (one FMA chain per entry, the same bits
    for any thread count), else torch's matmul. Both are float32 products summed in float32; they
    may differ in the last bits (the summation order), never by more than float32 rounding."""
    if h.blocks is not None:
        return _NATIVE_S(np.ascontiguousarray(queries.numpy(), np.float32), h.blocks, h.centroids.shape[0],
                         num_threads=native_threads())
    return (queries @ h.centroids.T).numpy()



def _host(state: IndexState) -> _Host:
    h = getattr(state, "_adaptive_host", None)
    if h is None:
        h = _Host(state)
        object.__setattr__(state, "_adaptive_host", h)  # a cache on the frozen state (not a field)
    return h


def _csr_rows(offsets: np.ndarray, which: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, segment starts)``: the entries ``offsets[w]..offsets[w+1]`` of every w in
    `which`, concatenated, and where each w's entries start."""
    lo, hi = offsets[which], offsets[which + 1]
    lens = hi - lo
    seg = np.zeros(which.size, np.int64)
    if which.size > 1:
        np.cumsum(lens[:-1], out=seg[1:])
    return np.repeat(lo - seg, lens) + np.arange(int(lens.sum()), dtype=np.int64), seg


# Candidates from which the native full centroid scores share the work among the native kernels'
# threads (COLGRAPH_NUM_THREADS, else torch's count): below it starting a thread costs about what
# it saves (ours: one thread start is ~50 us, 2,048 items ~0.3 ms at 10,000 documents).
THREADED_ITEMS = 2048


def full_scores(h: _Host, st: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """``[n]`` float32 full centroid scores ``Σ_i max_{c in cells(x)} S[i, c]`` of positions
    `pos`; `st`: the query's ``S`` transposed, ``[C, L]`` C-contiguous (one row gather per
    (item, centroid) pair). An item without centroids (no tokens) scores ``-inf``. Native
    (csrc/centroid_scores.cpp) where the module has it, else :func:`full_scores_numpy`: the
    same bits either way (it repeats numpy's pairwise summation over the L tokens)."""
    if pos.size == 0:
        return np.zeros(0, np.float32)
    native = getattr(_native.core, "full_centroid_scores", None)  # None: no native module (or one built before it)
    if native is not None:  # without numpy's [E, L] gather
        threads = native_threads() if pos.size >= THREADED_ITEMS else 1
        return native(st, h.cells_offsets, h.cells, pos.astype(np.int64, copy=False), num_threads=threads)
    return full_scores_numpy(h, st, pos)


def full_scores_numpy(h: _Host, st: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """:func:`full_scores` in numpy (the fallback without the native module)."""
    if pos.size == 0:
        return np.zeros(0, np.float32)
    lens = h.cells_offsets[pos + 1] - h.cells_offsets[pos]
    keep = lens > 0
    out = np.full(pos.size, -np.inf, np.float32)
    if not keep.any():
        return out
    rows, seg = _csr_rows(h.cells_offsets, pos[keep])
    g = np.take(st, h.cells[rows], axis=0)                                        # [E, L]
    out[keep] = np.maximum.reduceat(g, seg, axis=0).sum(1) if st.shape[1] else 0.0
    return out


def _sorted_unique(x: np.ndarray) -> np.ndarray:
    """The distinct values of `x`, ascending (np.unique's result): a sort and a mask, 3.5x faster
    than np.unique on the 17k int64 inverted-list entries of a query's first probe here."""
    if x.size < 2:
        return np.sort(x)
    s = np.sort(x)
    keep = np.empty(s.size, bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


# Inverted-list entries from which :func:`_listed` marks a byte per position instead of sorting
# the entries: marking is O(entries) plus a vectorised scan of one byte per position, a sort
# O(entries log entries). At lightrag_peer's 10,000 documents (50,000 positions, a probe's
# median 13,856 entries, up to 149,205) the mask took a query's list unions from 1.89 to
# 0.23 ms; below this many entries the sort is cheaper than touching every position (ours).
MASK_MIN_SHARE = 1 / 16


def _listed(h: _Host, cells: np.ndarray, exclude: np.ndarray | None = None) -> np.ndarray:
    """The live positions on the inverted lists of `cells`, ascending and distinct, less the
    positions `exclude` (those already taken). The byte mask lives for this call alone."""
    rows, _ = _csr_rows(h.ivf_offsets, cells)
    entries = h.ivf_docs[rows]
    if entries.size >= MASK_MIN_SHARE * h.alive.size:
        mark = np.zeros(h.alive.size, bool)
        mark[entries] = True
        mark &= h.alive
        if exclude is not None:
            mark[exclude] = False
        return np.flatnonzero(mark)
    pos = _sorted_unique(entries)
    pos = pos[h.alive[pos]]
    return pos if exclude is None or not pos.size else pos[~np.isin(pos, exclude)]


# Candidates from which :func:`first_and_sample` selects by rank instead of sorting them all
# (ours: below it the stable sort is as fast).
SELECT_MIN = 4096


def first_and_sample(F: np.ndarray, first: int, sample: int) -> tuple[np.ndarray, np.ndarray]:
    """``(best, spread)``: in the order of ``np.argsort(-F, kind="stable")`` (F descending, ties
    by position), the positions of ranks ``0 .. first-1`` in that order, and of `sample` ranks
    evenly spaced over the rest (``rest[unique(linspace(0, len(rest) - 1, sample))]``).

    From :data:`SELECT_MIN` candidates the ranks are selected without sorting everything: each
    position gets one unique int64 key, ``(-F as an order-preserving int) << 32 | position``, so
    the key order is exactly the stable descending order; a partition splits off the first
    ranks (then sorted) and a multi-rank partition of the rest finds the sample. The same
    positions as the sort, in about 60% of its time at 27k candidates (the first probe at lightrag_peer's
    10,000 documents)."""
    n = F.size
    rest_n = max(n - first, 0)
    ranks = np.unique(np.linspace(0, rest_n - 1, min(sample, rest_n)).astype(np.int64)) if rest_n else \
        np.zeros(0, np.int64)
    if n < SELECT_MIN or n >= 1 << 32:  # the key holds a position in 32 bits
        by_f = np.argsort(-F, kind="stable")
        return by_f[:first], by_f[first:][ranks]
    bits = (F.astype(np.float32) + np.float32(0)).view(np.int32).astype(np.int64)  # + 0: -0.0 ties +0.0
    ordered = np.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # float order as signed int order (no NaN in F)
    keys = ((-ordered) << 32) | np.arange(n, dtype=np.int64)
    if first >= n:
        return np.argsort(keys), np.zeros(0, np.int64)
    split = np.argpartition(keys, first - 1) if first > 0 else np.arange(n)
    best = split[:first]
    best = best[np.argsort(keys[best])]
    rest = keys[split[first:]]
    spread = np.partition(rest, ranks)[ranks] & 0xFFFFFFFF if ranks.size else np.zeros(0, np.int64)
    return best, spread


def _bound_ranks(order: np.ndarray, probed: np.ndarray) -> np.ndarray:
    """``[L]`` per token the first rank of `order` whose centroid is not `probed` (the last rank
    when all are: a looser but still valid bound)."""
    unprobed = ~probed[order]
    first = unprobed.argmax(1)
    first[~unprobed.any(1)] = order.shape[1] - 1
    return first


def _probed_bound(s: np.ndarray, order: np.ndarray, probed: np.ndarray) -> float:
    """An upper bound on ``F`` of every item none of whose centroids is `probed`:
    ``U = Σ_i S[i, order[i, r_i]]``, ``r_i`` token i's first unprobed rank (-inf once every
    centroid is probed). Such an item's best match for token i is some unprobed centroid, which
    scores at most the best unprobed one; :func:`_unreached_bound` is the case of every token
    probed to the same depth."""
    if probed.all():
        return float("-inf")
    if s.shape[0] == 0:
        return 0.0
    r = _bound_ranks(order, probed)
    return float(np.take_along_axis(s, order[np.arange(order.shape[0]), r][:, None], 1).sum())


def _next_depth(s: np.ndarray, order: np.ndarray, n: int, target: float, nmax: int) -> int:
    """The smallest probe depth ``n' > n`` (at most `nmax`) with ``U_n' < target``
    (:func:`_unreached_bound`), else 0 (no depth up to `nmax` meets it). Every ``U_n'`` comes
    from the centroid scores alone, before anything is probed, so the search can go straight to
    the depth its bound needs instead of doubling past it (rule ours)."""
    if s.shape[0] == 0 or n >= nmax:
        return nmax
    un = np.take_along_axis(s, order[:, n + 1:nmax + 1], 1).sum(0)   # U_{n+1} .. U_nmax
    below = np.flatnonzero(un < target)
    return n + 1 + int(below[0]) if below.size else 0


def _unreached_bound(s: np.ndarray, order: np.ndarray, n: int) -> float:
    """An upper bound on ``F`` of every item the first `n` probe ranks did not reach:
    ``U_n = Σ_i S[i, order[i, n]]`` (-inf once every centroid is probed). Such an item has no
    centroid among any token's `n` best, so each token's best match over its centroids scores at
    most that token's (n+1)-th best centroid score."""
    if n >= s.shape[1]:
        return float("-inf")
    if s.shape[0] == 0:
        return 0.0
    return float(np.take_along_axis(s, order[:, n:n + 1], 1).sum())


def _kth_group(groups: np.ndarray, scores: np.ndarray, k: int) -> tuple[float, int]:
    """``(k-th best group score or -inf, number of groups)`` over scored items."""
    if groups.size == 0:
        return float("-inf"), 0
    order = np.argsort(groups)  # any order inside a group: its best is the same (one sort key, not two)
    g = groups[order]
    first = np.empty(g.size, bool)
    first[0] = True
    np.not_equal(g[1:], g[:-1], out=first[1:])
    best = np.maximum.reduceat(scores[order], np.flatnonzero(first))
    if best.size < k:
        return float("-inf"), int(best.size)
    return float(np.partition(best, best.size - k)[best.size - k]), int(best.size)


PAIRS_PER_CALL = 1 << 20  # pairs handed to the exact stage in one call (bounds its scratch; ours)


# Centroid-score bytes the lockstep groups searched at once may hold together (``S [Tq, C]`` float32, ours: 256 MB,
# about 1,000 ten-token queries at 65,536 centroids): a larger batch is searched in groups of
# whole queries, so memory stays bounded whatever the batch's size.
MAX_S_BYTES = 1 << 28


# Queries from which a batch is searched as two lockstep groups on two threads, each with half of
# the native kernels' threads (ours): a group's Python steps (list unions, selections, margins:
# about a third of a batch's recall at lightrag_peer's 10,000 documents) then run while the
# other group is inside a native kernel, which releases the GIL. Below it a batch is too short
# for the overlap to pay for a thread.
PARALLEL_MIN_QUERIES = 16


def search(state: IndexState, queries: torch.Tensor, q_offsets: torch.Tensor, k: int, groups: np.ndarray | None,
           rescore, budget: Budget = DEFAULT) -> GroupResult:
    """:func:`search_group` over groups of whole queries whose centroid scores fit
    :data:`MAX_S_BYTES` (one group for any usual batch), and, with two or more native threads,
    split in two halves searched side by side (:data:`PARALLEL_MIN_QUERIES`). Each query's
    result is the same as searching it alone, so the groups change only memory and time, never
    an answer. Arguments as :func:`search_group`; `rescore` may be called from two threads at
    once (the pipeline's exact stage is a pure function of its arguments)."""
    qo = q_offsets.cpu().tolist()
    nq = len(qo) - 1
    threads = native_threads()
    workers = 2 if threads >= 2 and nq >= PARALLEL_MIN_QUERIES else 1
    per_token = 4 * int(state.centroids.shape[0])
    limit = MAX_S_BYTES // workers  # groups searched side by side share the bound
    cuts = [0]
    for q in range(nq):
        if q > cuts[-1] and (qo[q + 1] - qo[cuts[-1]]) * per_token > limit:
            cuts.append(q)
    cuts.append(nq)
    if workers > 1 and len(cuts) == 2:
        cuts = [0, nq // 2, nq]  # halves by queries (their lockstep rounds are about as long)
    if len(cuts) <= 2:
        return search_group(state, queries, q_offsets, k, groups, rescore, budget)
    _host(state)  # built once, before any thread reads it

    def one(a: int, b: int) -> GroupResult:
        with thread_cap(max(1, threads // workers)):
            return search_group(state, queries[qo[a]:qo[b]], torch.as_tensor(qo[a:b + 1], dtype=torch.int64) - qo[a],
                                k, groups, rescore, budget)
    spans = list(zip(cuts[:-1], cuts[1:]))
    if workers > 1:
        with ThreadPoolExecutor(workers, thread_name_prefix="colgraph-recall") as pool:
            parts = list(pool.map(lambda ab: one(*ab), spans))
    else:
        parts = [one(a, b) for a, b in spans]
    offsets = np.concatenate([[0]] + [p.offsets[1:] + base for p, base in
                                      zip(parts, np.cumsum([0] + [int(p.offsets[-1]) for p in parts[:-1]]))])
    stats = {key: [v for p in parts for v in p.stats[key]] for key in parts[0].stats if key != "seconds"}
    stats["seconds"] = {key: sum(p.stats["seconds"][key] for p in parts) for key in parts[0].stats["seconds"]}
    return GroupResult(offsets.astype(np.int64), np.concatenate([p.ids for p in parts]),
                       np.concatenate([p.scores for p in parts]), stats)


def search_group(state: IndexState, queries: torch.Tensor, q_offsets: torch.Tensor, k: int,
                 groups: np.ndarray | None, rescore, budget: Budget = DEFAULT) -> GroupResult:
    """The adaptive search (module docstring) for packed ``queries [Tq, d]`` / ``q_offsets [Nq+1]``
    (float32 on the CPU, normalised as the index expects).

    The queries of a batch advance in lockstep: each round, every query that still has items to
    score hands them over, and all of them go to the exact stage in one call (at most
    :data:`PAIRS_PER_CALL` pairs, whole queries), so a batch pays the exact stage's fixed cost once
    per round rather than once per query and round. What each query scores, and so its result,
    is the same as searching it alone.

    Args:
        k: groups wanted per query (at most the groups with live items).
        groups: ``[N]`` int64 group of every position (the document of each item); None: each
            item is its own group.
        rescore: ``fn(qv [Tq, d], qo [Nq+1], pair_q [M], pair_ids [M]) -> [M]`` exact scores of
            pairs (query number into `queries`, external id), pairs sorted by query (the caller's
            exact stage, as :meth:`PrefilterIndex.search`'s `rescore`); called with the whole
            batch's `queries` and `q_offsets` every time.
    """
    h = _host(state)
    if groups is None:
        groups = np.arange(state.n_slots, dtype=np.int64)
    qo = q_offsets.cpu().tolist()
    nq = len(qo) - 1
    t0 = time.perf_counter()
    S = centroid_scores(h, queries.float().cpu())                                      # [Tq, C]
    nmax = min(budget.ncells_max, S.shape[1])
    # one rank past the deepest probe: its scores bound every item the probes have not reached
    ranks = min(nmax + 1, S.shape[1])
    order = (torch.topk(torch.from_numpy(S), ranks, dim=1).indices.numpy() if S.shape[0]
             else np.zeros((0, ranks), np.int64))
    sec = {"centroids": time.perf_counter() - t0, "candidates": 0.0, "exact": 0.0}
    q_offsets = torch.as_tensor(qo, dtype=torch.int64)
    steps = [_query_steps(h, S[qo[q]:qo[q + 1]], order[qo[q]:qo[q + 1]], k, groups, budget, nmax, sec)
             for q in range(nq)]
    done: list = [None] * nq
    wants: dict[int, np.ndarray] = {}

    def advance(q: int, scores) -> None:
        try:
            wants[q] = steps[q].send(scores)
        except StopIteration as finished:
            done[q] = finished.value
            wants.pop(q, None)

    for q in range(nq):
        advance(q, None)
    while wants:
        asked = sorted(wants)
        lo = 0
        while lo < len(asked):  # whole queries, up to PAIRS_PER_CALL pairs a call
            hi, pairs = lo + 1, wants[asked[lo]].size
            while hi < len(asked) and pairs + wants[asked[hi]].size <= PAIRS_PER_CALL:
                pairs += wants[asked[hi]].size
                hi += 1
            part = asked[lo:hi]
            sizes = [wants[q].size for q in part]
            t = time.perf_counter()
            s = rescore(queries, q_offsets, torch.from_numpy(np.repeat(np.asarray(part, np.int64), sizes)),
                        torch.from_numpy(h.ids[np.concatenate([wants[q] for q in part])]))
            s = np.asarray(torch.as_tensor(s).detach().cpu(), np.float32)
            sec["exact"] += time.perf_counter() - t
            for q, scores in zip(part, np.split(s, np.cumsum(sizes)[:-1])):
                advance(q, scores)
            lo = hi
    stats = {"candidates": [], "scored_exactly": [], "ncells": [], "rounds": [], "margin": [], "exhaustive": [],
             "stop": [], "seconds": sec}
    offsets = np.zeros(nq + 1, np.int64)
    for q, (pos, _, info) in enumerate(done):
        offsets[q + 1] = offsets[q] + pos.size
        for key, v in info.items():
            stats[key].append(v)
    return GroupResult(offsets, np.concatenate([h.ids[pos] for pos, _, _ in done]) if nq else np.zeros(0, np.int64),
                       np.concatenate([e for _, e, _ in done]) if nq else np.zeros(0, np.float32), stats)


def _query_steps(h: _Host, s: np.ndarray, order: np.ndarray, k: int, groups: np.ndarray, budget: Budget,
                 nmax: int, sec: dict):
    """One query's search as a generator: it yields the positions it wants scored exactly
    (never none) and is sent their ``[n]`` float32 scores; it returns ``(positions scored,
    their scores, stats)``."""
    t0 = time.perf_counter()
    st = np.ascontiguousarray(s.T)                                                  # [C, L]
    n = min(budget.ncells, nmax)
    probed = np.zeros(s.shape[1], bool)
    probed[order[:, :n].reshape(-1)] = True
    cand = _listed(h, np.flatnonzero(probed))
    F = full_scores(h, st, cand)
    E = np.full(cand.size, -np.inf, np.float32)
    scored = np.zeros(cand.size, bool)
    sec["candidates"] += time.perf_counter() - t0
    first = max(budget.first, 2 * k, math.ceil(budget.first_share * cand.size))

    best, sample = first_and_sample(F, first, budget.sample)
    sel = np.concatenate([best, sample])  # the best by F and the sample, in one exact call
    if sel.size:
        E[sel] = yield cand[sel]
    scored[sel] = True
    err_s = E[sample] - F[sample]
    rounds, m = 0, 0.0
    converged, stop = False, "margin"
    while True:
        rounds += 1
        sk, n_groups = _kth_group(groups[cand[scored]], E[scored], k)
        err = E[scored] - F[scored]
        err = err[np.isfinite(err)]
        m = float(err.max()) if err.size else 0.0
        if err_s.size > 1 and np.isfinite(err_s).all():
            m = max(m, float(err_s.mean() + budget.z * err_s.std()))
        if sk == float("-inf"):
            left = np.flatnonzero(~scored)
            todo = left[np.argsort(-F[left], kind="stable")[:first]]
        else:
            todo = np.flatnonzero(~scored & (F >= sk - m))
        if todo.size and scored.sum() + todo.size > h.live.size * budget.max_share:
            stop = "max_share"
            break
        if todo.size:
            E[todo] = yield cand[todo]
            scored[todo] = True
            continue
        if sk > float("-inf") and _probed_bound(s, order, probed) < sk - m:
            converged = True  # no unreached item can reach s_k - m, and every reached one that can is scored
            break
        t0 = time.perf_counter()
        if n >= nmax:
            sec["candidates"] += time.perf_counter() - t0
            converged = bool(probed.all()) or cand.size >= h.live.size
            stop = "ncells_max"
            break
        # as deep as the bound needs, else (or with fewer than k groups so far) twice as deep
        n2 = min(2 * n, nmax)
        if sk > float("-inf"):
            n2 = _next_depth(s, order, n, sk - m, nmax) or n2
        cells = order[:, n:n2].reshape(-1)
        cells = _sorted_unique(cells[~probed[cells]])
        probed[cells] = True
        n = n2
        new = _listed(h, cells, exclude=cand)
        if new.size:
            cand, F = np.concatenate([cand, new]), np.concatenate([F, full_scores(h, st, new)])
            E = np.concatenate([E, np.full(new.size, -np.inf, np.float32)])
            scored = np.concatenate([scored, np.zeros(new.size, bool)])
        sec["candidates"] += time.perf_counter() - t0
    _, n_groups = _kth_group(groups[cand[scored]], E[scored], k)
    exhaustive = (n_groups < k or (not converged and budget.unsettled == "exhaustive")) \
        and int(scored.sum()) < h.live.size
    if exhaustive:  # the probes did not settle the top k: score every live item
        rest = h.live[~np.isin(h.live, cand[scored])]
        cand = np.concatenate([cand[scored], rest])
        E = np.concatenate([E[scored], (yield rest) if rest.size else np.zeros(0, np.float32)])
        scored = np.ones(cand.size, bool)
    info = {"candidates": int(cand.size), "scored_exactly": int(scored.sum()), "ncells": n, "rounds": rounds,
            "margin": round(m, 4), "exhaustive": bool(exhaustive), "stop": stop if n_groups >= k else "groups"}
    return cand[scored], E[scored], info
