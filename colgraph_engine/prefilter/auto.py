"""Auto mode: exact brute force over the store when it is cheaper, else the prefilter.

:class:`AutoSearcher` holds a :class:`~colgraph_engine.store.PackedStore` (the full vectors) and
optionally a :class:`~.prefilter_index.PrefilterIndex` over it. ``mode="auto"`` runs exact brute force
when the store is resident on its device (a CPU store, or a CUDA store: both already fit) and
its estimated work is at most the prefilter's; the choice and the numbers behind it are in the
result's ``path`` and ``reason``.

Work model (multiply-adds per query token; ours, a first-order count, not a measurement):

    exact      T_live * d                           (every live token against every query token)
    prefilter  C * d                                (query x centroid scores)
             + n_exact * L_avg * d * DECODE_COST    (decode + score the exact stage's documents)
             + ndocs * P_avg                        (full centroid scores of the shortlist)

with ``DECODE_COST = 2`` (decoding a token costs about as much as scoring it) and ``P_avg`` the
mean distinct centroids per document. The benchmark (``benchmarks/prefilter_report.py``)
reports both paths' measured speed beside this choice.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from .prefilter_index import PrefilterIndex
from .search import SearchResult, Settings

DECODE_COST = 2.0
MODES = ("auto", "prefilter", "exact")


class AutoSearcher:
    """Search that picks exact brute force or the prefilter per call (see the module docstring)."""

    def __init__(self, store, index: PrefilterIndex | None = None):
        self.store = store
        self.index = index

    def estimate(self, k: int, ncells=None, centroid_score_threshold=None, ndocs=None) -> dict[str, float]:
        """The work model's ``exact`` and ``prefilter`` counts (multiply-adds per query token)."""
        snap = self.store.snapshot()
        t_live = int((snap.offsets.diff() * snap.alive).sum())
        out = {"exact": float(t_live * self.store.dim)}
        if self.index is not None:
            s = self.index.snapshot()
            st = Settings.for_k(k, ncells, centroid_score_threshold, ndocs)
            n_live = max(1, s.n_live)
            l_avg = s.n_tokens / max(1, s.n_slots)
            p_avg = s.cells.numel() / max(1, s.n_slots)
            out["prefilter"] = (s.n_centroids * s.dim + min(st.n_exact(k), n_live) * l_avg * s.dim * DECODE_COST
                                + min(st.ndocs, n_live) * p_avg)
        return out

    def choose(self, k: int, mode: str = "auto", **settings) -> tuple[str, str]:
        """``(path, reason)`` for a search with `k` in `mode`."""
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
        if mode == "exact":
            return "exact", "exact requested"
        if self.index is None:
            if mode == "prefilter":
                raise ValueError("mode: 'prefilter' needs a PrefilterIndex; this searcher has none")
            return "exact", "no prefilter index"
        if mode == "prefilter":
            return "prefilter", "prefilter requested"
        est = self.estimate(k, **settings)
        where = f"the store is resident on {self.store.device}"
        if est["exact"] <= est["prefilter"]:
            return "exact", (f"auto: {where} and exact work {est['exact']:.3g} <= prefilter work "
                             f"{est['prefilter']:.3g} multiply-adds per query token")
        return "prefilter", (f"auto: prefilter work {est['prefilter']:.3g} < exact work {est['exact']:.3g} "
                             f"multiply-adds per query token")

    def search(self, queries, q_offsets=None, k: int = 10, *, mode: str = "auto", allowed: Sequence | None = None,
               exact_allowed: bool | None = None, backend: str | None = None, **settings) -> SearchResult:
        """Top-k per query by the chosen path; `settings` are the prefilter's (ncells, ...)."""
        path, reason = self.choose(k, mode, **settings)
        if path == "prefilter":
            res = self.index.search(queries, q_offsets, k, allowed=allowed, exact_allowed=exact_allowed,
                                    backend=backend, **settings)
            res.path, res.reason = path, reason
            return res
        if k > len(self.store):
            raise ValueError(f"k: expected at most the {len(self.store)} live documents of the store, got {k}")
        if allowed is None:
            scores, ids = self.store.search(queries, q_offsets, k, backend=backend)
            return SearchResult(scores, ids, path, reason, None, {})
        return _exact_allowed(self.store, queries, q_offsets, k, allowed, backend, reason)


def _exact_allowed(store, queries, q_offsets, k, allowed, backend, reason) -> SearchResult:
    """Every allowed document scored exactly over the store (its score_candidates)."""
    lists = [torch.as_tensor(a, dtype=torch.int64) if not isinstance(a, torch.Tensor) else a.to(torch.int64)
             for a in allowed]
    counts = torch.tensor([x.numel() for x in lists], dtype=torch.int64)
    co = torch.zeros(len(lists) + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=co[1:])
    ids = torch.cat(lists) if lists else torch.zeros(0, dtype=torch.int64)
    s = store.score_candidates(queries, q_offsets, co, ids, backend=backend).cpu()
    nq = len(lists)
    out_s = torch.full((nq, k), float("-inf"))
    out_i = torch.full((nq, k), -1, dtype=torch.int64)
    for q in range(nq):
        seg = s[int(co[q]):int(co[q + 1])]
        top = torch.sort(seg, descending=True, stable=True).indices[:k]
        out_s[q, :top.numel()] = seg[top]
        out_i[q, :top.numel()] = lists[q].cpu()[top]
    return SearchResult(out_s, out_i, "exact", reason, None,
                        {"allowed": counts.tolist(), "scored_exactly": counts.tolist()})
