"""Prefilter search: settings by k, the staged search, restricted search, results.

Defaults by k are PLAID's, as ColBERT's ``Searcher`` configures them (``colbert/searcher.py``):

    k <= 10   ncells 1, centroid_score_threshold 0.5,  ndocs 256
    k <= 100  ncells 2, centroid_score_threshold 0.45, ndocs 1024
    else      ncells 4, centroid_score_threshold 0.4,  ndocs max(4k, 4096)

The exact stage scores the best ``ndocs // 4`` documents (ColBERT's ``score_pids``), at least k.

Restricted search (``allowed``): an allowed document **survives** when it (a) is on the inverted
list of a centroid probed by one of the query's tokens, (b) is among the `ndocs` best allowed
candidates by pruned centroid score, and (c) among the ``max(ndocs // 4, k)`` best of those by
full centroid score. Every survivor is scored exactly; the result's ``stats`` count, per query,
the allowed, candidate, shortlisted and exactly scored documents, so nothing leaves silently.
With ``exact_allowed=True`` (the default when a query allows no more documents than the exact
stage scores anyway) stages (a)-(c) are skipped and every allowed document is scored exactly.
Unknown or deleted ids in ``allowed`` raise ValueError.
"""
from __future__ import annotations

import numbers
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from . import dense as _dense
from . import rescore, stages
from .layout import IndexState

# Queries per batched pass: bounds the [Tq, C] centroid scores and the [pairs, Lmax] scratch of
# stages 3-4 (ours). On a GPU a pass costs mostly launches and waits, so larger blocks should pay
# (128 x 32 tokens x 2^15 centroids is 0.5 GiB of scores); 32 is the size measured on an H200
# (benchmarks/results/gpu_prefilter.md), and the benchmark times 128 beside it.
QUERY_BLOCK = 32
QUERY_BLOCK_GPU = 32


@dataclass(frozen=True)
class Settings:
    """PLAID's search knobs (see the module docstring for the defaults by k)."""
    ncells: int
    centroid_score_threshold: float
    ndocs: int

    @classmethod
    def for_k(cls, k: int, ncells: int | None = None, centroid_score_threshold: float | None = None,
              ndocs: int | None = None) -> Settings:
        if k <= 10:
            d = (1, 0.5, 256)
        elif k <= 100:
            d = (2, 0.45, 1024)
        else:
            d = (4, 0.4, max(4 * k, 4096))
        out = cls(d[0] if ncells is None else ncells,
                  d[1] if centroid_score_threshold is None else centroid_score_threshold,
                  d[2] if ndocs is None else ndocs)
        for name in ("ncells", "ndocs"):
            v = getattr(out, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        t = out.centroid_score_threshold
        if isinstance(t, bool) or not isinstance(t, numbers.Real):
            raise TypeError(f"centroid_score_threshold: expected a number, got {type(t).__name__}")
        return out

    def n_exact(self, k: int) -> int:
        return max(self.ndocs // 4, k)


@dataclass
class SearchResult:
    """``scores [Nq, k]`` float32 and ``ids [Nq, k]`` int64, best first; a query with fewer than k
    documents reaching the exact stage is padded with score ``-inf`` and id ``-1``.

    ``path``: ``"prefilter"`` or ``"exact"`` (brute force over the store); ``reason``: why that
    path ran; ``stats``: per-query counts ``allowed`` (restricted search only), ``candidates``,
    ``shortlist`` and ``scored_exactly`` (lists of ints), and ``seconds`` per stage."""
    scores: torch.Tensor
    ids: torch.Tensor
    path: str = "prefilter"
    reason: str = ""
    settings: Settings | None = None
    stats: dict = field(default_factory=dict)


def allowed_keys(state: IndexState, allowed: Sequence, nq: int) -> tuple[torch.Tensor, list[int]]:
    """Sorted ``q * N + position`` keys of the allowed (query, document) pairs, and counts per
    query. ValueError for a wrong length, unknown or deleted ids, or repeats."""
    if isinstance(allowed, (str, bytes)) or not isinstance(allowed, Sequence) or len(allowed) != nq:
        raise ValueError(f"allowed: expected a sequence of {nq} id lists (one per query), got "
                         f"{type(allowed).__name__}{'' if not hasattr(allowed, '__len__') else f' of {len(allowed)}'}")
    keys, counts = [], []
    dev = state.ids.device
    for q, ids in enumerate(allowed):
        t = torch.as_tensor(ids, dtype=torch.int64) if not isinstance(ids, torch.Tensor) else ids
        if t.dim() != 1 or t.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"allowed[{q}]: expected a 1-D sequence of int ids")
        t = t.to(dev, torch.int64)
        if torch.unique(t).numel() != t.numel():
            raise ValueError(f"allowed[{q}]: expected each id once")
        pos = state.positions(t, f"allowed[{q}]")
        keys.append(q * state.n_slots + pos)
        counts.append(t.numel())
    return torch.sort(torch.cat(keys) if keys else torch.zeros(0, dtype=torch.int64, device=dev)).values, counts


def run(state: IndexState, qv: torch.Tensor, qo: torch.Tensor, k: int, settings: Settings, backend: str, *,
        allowed: Sequence | None = None, exact_allowed: bool | None = None, rescore_fn=None,
        dense: bool | None = None, qo_host: list[int] | None = None) -> SearchResult:
    """The staged search over validated queries (on the state's device). `rescore_fn`, when
    given, replaces the exact stage: ``fn(qv_block, qo_block, pair_q, pair_doc) -> [M] scores``.
    `dense`: run stages 2-4 densely (:mod:`.dense`; same results); None: when
    :data:`.dense.AUTO` is on and :func:`.dense.use_dense` says so; never for restricted search. `qo_host`: ``qo`` as a list,
    when the caller has it (saves a read from the device)."""
    nq = qo.numel() - 1
    n = state.n_slots
    dev = qv.device
    qo_h = qo.tolist() if qo_host is None else qo_host
    keys, counts = allowed_keys(state, allowed, nq) if allowed is not None else (None, None)
    n_exact = settings.n_exact(k)
    out_s = torch.full((nq, k), float("-inf"), device=dev)
    out_i = torch.full((nq, k), -1, dtype=torch.int64, device=dev)
    st = {"candidates": [], "shortlist": [], "scored_exactly": [], "exact_all_allowed": [],
          "seconds": {"centroids": 0.0, "candidates": 0.0, "pruned": 0.0, "full": 0.0, "exact": 0.0}}
    if counts is not None:
        st["allowed"] = counts
    sec = st["seconds"]
    block = QUERY_BLOCK if dev.type == "cpu" else QUERY_BLOCK_GPU
    for a in range(0, nq, block):
        b = min(nq, a + block)
        bq = qo[a:b + 1] - qo_h[a]
        bq_h = [x - qo_h[a] for x in qo_h[a:b + 1]]
        bv = qv[qo_h[a]:qo_h[b]]
        t0 = time.perf_counter()
        S = stages.centroid_scores(state, bv)
        t1 = time.perf_counter()
        sec["centroids"] += t1 - t0
        lmax = max((y - x for x, y in zip(bq_h, bq_h[1:])), default=0)
        if keys is None and (dense if dense is not None else (_dense.AUTO and _dense.use_dense(state, b - a, lmax, dev))):
            pq3, pd3, cand_counts, short_counts = _dense.shortlist(
                state, S, bq, bq_h, settings.ncells, settings.centroid_score_threshold, settings.ndocs, n_exact,
                kernel=backend == "triton")
            t4 = time.perf_counter()
            sec["dense"] = sec.get("dense", 0.0) + t4 - t1
            st["dense"] = True
            exact_all = [False] * (b - a)
        else:
            pq3, pd3, cand_counts, short_counts, exact_all = _sparse_shortlist(
                state, S, bq, a, b, keys, counts, exact_allowed, settings, n_exact, sec, t1)
            t4 = time.perf_counter()
        if rescore_fn is not None:
            exact = rescore_fn(bv, bq, pq3, pd3)
        else:
            exact = rescore.exact_scores(state, bv, bq, S, pq3, pd3, backend)
        sec["exact"] += time.perf_counter() - t4
        exact_counts = torch.bincount(pq3, minlength=b - a)
        top = stages.top_per_query(pq3, exact, b - a, k)
        tq, tdoc, ts = pq3[top], pd3[top], exact[top]
        # place each query's (already score-sorted within the query) winners in its row
        order = torch.sort(ts, descending=True, stable=True).indices
        order = order[torch.sort(tq[order], stable=True).indices]
        tq, tdoc, ts = tq[order], tdoc[order], ts[order]
        c = torch.bincount(tq, minlength=b - a)
        col = torch.arange(tq.numel(), device=dev) - (torch.cumsum(c, 0) - c)[tq]
        out_s[a + tq, col] = ts
        out_i[a + tq, col] = state.ids[tdoc]
        cand_l, short_l, exact_l = torch.stack([cand_counts, short_counts, exact_counts]).tolist()  # one read
        st["candidates"] += cand_l
        st["shortlist"] += short_l
        st["scored_exactly"] += exact_l
        st["exact_all_allowed"] += exact_all
    return SearchResult(out_s, out_i, "prefilter", "", settings, st)


def _sparse_shortlist(state, S, bq, a, b, keys, counts, exact_allowed, settings, n_exact, sec, t1):
    """Stages 2-4 from the inverted lists (:mod:`.stages`) for queries a..b-1: ``(pair_q, pair_doc,
    candidate counts, shortlist counts, exact_all flags)``; adds stage seconds to `sec`."""
    n = state.n_slots
    dev = S.device
    bkeys = None
    if keys is not None:
        lo, hi = torch.searchsorted(keys, torch.tensor([a * n, b * n], device=keys.device)).tolist()
        bkeys = keys[lo:hi] - a * n
    exact_all = [False] * (b - a)
    if counts is not None:
        exact_all = [bool(exact_allowed) if exact_allowed is not None else counts[q] <= n_exact
                     for q in range(a, b)]
    pq, pd = stages.candidates(state, S, bq, settings.ncells, bkeys)
    if any(exact_all):  # these queries skip stages (a)-(c): all their allowed documents
        mask = torch.tensor(exact_all, device=dev)
        pq, pd = pq[~mask[pq]], pd[~mask[pq]]
        whole = bkeys[mask[bkeys // n]]
        key = torch.sort(torch.cat([pq * n + pd, whole])).values
        pq, pd = key // n, key % n
    t2 = time.perf_counter()
    sec["candidates"] += t2 - t1
    cand_counts = torch.bincount(pq, minlength=b - a)
    sel = stages.top_per_query(pq, stages.pruned_scores(state, S, bq, pq, pd, settings.centroid_score_threshold)
                               if pq.numel() else pq.float(), b - a, settings.ndocs)
    if any(exact_all):
        sel = torch.unique(torch.cat([sel, torch.nonzero(mask[pq]).squeeze(1)]))
    pq2, pd2 = pq[sel], pd[sel]
    t3 = time.perf_counter()
    sec["pruned"] += t3 - t2
    short_counts = torch.bincount(pq2, minlength=b - a)
    full = stages.full_scores(state, S, bq, pq2, pd2)
    if any(exact_all):
        full = torch.where(mask[pq2], torch.inf, full)  # all of an exact_all query's documents stay
    sel = stages.top_per_query(pq2, full, b - a, n_exact)
    if any(exact_all):
        sel = torch.unique(torch.cat([sel, torch.nonzero(mask[pq2]).squeeze(1)]))
    pq3, pd3 = pq2[sel], pd2[sel]
    sec["full"] += time.perf_counter() - t3
    return pq3, pd3, cand_counts, short_counts, exact_all
