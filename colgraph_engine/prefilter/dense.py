"""Stages 2-4 of the prefilter search for a few queries, computed densely over every document.

The same search as :mod:`.stages` (same candidates, centroid scores, shortlists and tie-breaks;
``tests/test_prefilter_dense.py`` checks equality), executed with fixed shapes. For one query
with token scores ``S [Lmax, C]`` (padded rows are zeros, as in :mod:`.stages`) and each
document p with distinct centroids ``cells(p)``:

    cand[p]   = alive[p] and any_{c in cells(p)} probed[c]
    pruned[p] = Σ_i max_{c in cells(p), c kept} S[i, c]      (-inf when no cell is kept)
    full[p]   = Σ_i max_{c in cells(p)} S[i, c]

The shortlist is the first ``ndocs`` candidates of a stable sort by pruned score (ties: lower
position, as the sparse stages break them), then the first ``n_exact`` of those by full score.
The sparse stages build each query's candidate pairs from the inverted lists, whose sizes are
data-dependent, so the host waits on the device several times per stage and launches many small
kernels; here nothing is read back until the survivors are listed (one wait). The price is
about ``2 · P · Lmax`` gathered scores per query (``P = Σ_p |cells(p)|``, every document), so
:func:`use_dense` picks this path only for a few queries on an accelerator (ours: at most
:data:`MAX_QUERIES` queries and :data:`MAX_GATHERED` gathered scores per block), never for
restricted search, and only when :data:`AUTO` is on (``COLGRAPH_PREFILTER_DENSE=1``).
"""
from __future__ import annotations

import os

import torch

from .layout import IndexState
from .stages import segment_max

MAX_QUERIES = 4          # ours: beyond this the sparse stages' launches are amortised
MAX_GATHERED = 1 << 28   # ours: 1 GiB of float32 scratch per query block at most
# Whether ``dense=None`` may pick this path. Off until it is timed on a GPU beside the sparse
# stages (benchmarks/gpu_prefilter.py does; the H200 run of 2026-11-30 timed only the sparse
# stages: 4.5 ms for one query on 100k x 128, 3.25 ms of it in stages 2-4). Pass dense=True
# to use it now.
AUTO = os.environ.get("COLGRAPH_PREFILTER_DENSE", "") == "1"


def use_dense(state: IndexState, nq: int, lmax: int, device: torch.device) -> bool:
    """True when the dense execution is the cheaper one (see the module docstring)."""
    return device.type != "cpu" and 0 < nq <= MAX_QUERIES and nq * lmax * state.cells.numel() <= MAX_GATHERED


def cell_owner(state: IndexState) -> torch.Tensor:
    """``[P]`` int64: the document position of each entry of ``state.cells`` (cached per state)."""
    if state._cell_owner is None:
        n = state.cells_offsets.numel() - 1
        owner = torch.repeat_interleave(torch.arange(n, device=state.cells.device), state.cells_offsets.diff(),
                                        output_size=state.cells.numel())
        object.__setattr__(state, "_cell_owner", owner)
    return state._cell_owner


def _first_by_score(score: torch.Tensor, valid: torch.Tensor, pos: torch.Tensor, n: int):
    """The first `n` valid entries by descending score, ties by lower position, returned in
    ascending position with invalid entries last: ``(pos [n'], valid [n'])``, n' = min(n, len).
    Valid entries scoring ``-inf`` still rank above invalid ones."""
    low = torch.finfo(torch.float32).min
    key = torch.where(valid, torch.where(score == float("-inf"), torch.full_like(score, low), score),
                      torch.full_like(score, float("-inf")))
    by_pos = torch.argsort(pos, stable=True)                # ties of the score sort: lower position first
    order = by_pos[torch.argsort(key[by_pos], descending=True, stable=True)][:n]
    p, v = pos[order], valid[order]
    back = torch.argsort(torch.where(v, p, p + (1 << 40)), stable=True)
    return p[back], v[back]


def interaction(state: IndexState, st: torch.Tensor, kept: torch.Tensor, probed: torch.Tensor,
                kernel: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(pruned [N], full [N], hit [N])`` of every document for one query (``st [C, Lmax]``, its
    token scores transposed; ``kept``/``probed`` ``[C]`` bool). `kernel`: the Triton kernel
    (:func:`colgraph_engine.kernels.prefilter.centroid_interaction`, one program per document,
    nothing gathered to memory); else torch: gather ``[P, Lmax]`` rows and scatter-max them."""
    if kernel:
        from ..kernels import prefilter as kp
        return kp.centroid_interaction(st, kept.to(torch.uint8), probed.to(torch.uint8), state.cells,
                                       state.cells_offsets)
    owner, cells, n = cell_owner(state), state.cells.long(), state.n_slots
    g = st[cells]                                                                       # [P, Lmax]
    full = segment_max(owner, g, n, groups_sorted=True).sum(1)
    pruned = segment_max(owner, torch.where(kept[cells][:, None], g, float("-inf")), n, groups_sorted=True).sum(1)
    hit = torch.zeros(n, device=st.device).scatter_reduce_(0, owner, probed[cells].float(), reduce="amax")
    return pruned, full, hit


def shortlist(state: IndexState, S: torch.Tensor, qo: torch.Tensor, qo_host: list[int], ncells: int,
              threshold: float, ndocs: int, n_exact: int, kernel: bool = False):
    """Stages 2-4 for one block of queries: ``(pair_q [M], pair_doc [M], candidates [Nq],
    shortlist [Nq])``, pairs sorted by query then position, counts per query as tensors.
    `S`: ``[Tq + 1, C]`` from :func:`.stages.centroid_scores`; `qo_host`: the block's offsets;
    `kernel`: see :func:`interaction`."""
    dev = S.device
    nq = len(qo_host) - 1
    tq = qo_host[-1]
    n = state.n_slots
    lengths = [b - a for a, b in zip(qo_host, qo_host[1:])]
    lmax = max(max(lengths), 1)
    owner_tok = torch.repeat_interleave(torch.arange(nq, device=dev), qo.diff(), output_size=tq)
    top = torch.topk(S[:tq], min(ncells, S.shape[1]), dim=1).indices                   # [Tq, ncells]
    probed = torch.zeros(nq, S.shape[1], dtype=torch.bool, device=dev)
    probed[owner_tok[:, None].expand_as(top), top] = True
    qmax = torch.full((nq, S.shape[1]), float("-inf"), device=dev)
    qmax.scatter_reduce_(0, owner_tok[:, None].expand(-1, S.shape[1]), S[:tq], reduce="amax", include_self=True)
    kept = qmax >= threshold                                                           # [Nq, C]
    pos = torch.arange(n, device=dev)
    i = torch.arange(lmax, device=dev)
    out_q, out_p, out_v, n_cand = [], [], [], []
    for q in range(nq):
        rows = torch.where(i < lengths[q], qo_host[q] + i, tq)                          # pads: the zero row
        st = S[rows].T.contiguous()                                                     # [C, Lmax]
        pruned, full, hit = interaction(state, st, kept[q], probed[q], kernel)
        cand = (hit > 0) & state.alive
        p2, v2 = _first_by_score(pruned, cand, pos, ndocs)
        p3, v3 = _first_by_score(full[p2], v2, p2, n_exact)
        out_q.append(torch.full_like(p3, q))
        out_p.append(p3)
        out_v.append(v3)
        n_cand.append(cand.sum())
    valid = torch.cat(out_v)
    keep = torch.nonzero(valid).squeeze(1)                                              # the one wait
    cand_counts = torch.stack(n_cand)
    return (torch.cat(out_q)[keep], torch.cat(out_p)[keep], cand_counts, cand_counts.clamp(max=ndocs))
