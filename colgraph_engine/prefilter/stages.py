"""The prefilter's search stages, batched over queries (vectorised torch, any device).

For a block of queries (packed ``qv [Tq, d]``, ``qo [Nq+1]``) and an :class:`IndexState`:

1. :func:`centroid_scores`: ``S = qv @ centroids^T`` ``[Tq, C]``;
2. :func:`candidates`: each query token probes its top `ncells` centroids; a query's
   candidates are the live documents on the inverted lists of the centroids its tokens probe
   (intersected with the allowed documents in restricted search);
3. :func:`pruned_scores`: centroid interaction with pruning: a query keeps the centroids whose
   best score over its tokens is ``>= centroid_score_threshold``; a candidate scores
   ``Σ_i max_{c kept, c in cells(doc)} S[i, c]`` (``-inf`` when it holds no kept centroid);
4. :func:`full_scores`: the same without pruning, ``Σ_i max_{c in cells(doc)} S[i, c]``;
5. the exact stage lives in :mod:`.rescore`.

Stages 3 and 4 are PLAID's (ColBERT ``index_storage.py``, ``score_pids``: keep the top
``ndocs`` by the pruned score, then the top ``ndocs // 4`` by the full centroid score, then
score those exactly). Scoring walks centroids, not tokens: a document's max over its tokens'
centroids equals the max over its distinct centroids, so stage 3 walks the inverted lists of
the kept centroids and stage 4 the shortlisted documents' distinct centroids (``cells``).

Pairs are CSR-like: ``(pair_q [M], pair_doc [M])`` sorted by query then document position.
"""
from __future__ import annotations

import torch

from .layout import IndexState


def token_rows(qo: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``([Nq, Lmax] int64, Lmax)``: row of each query's i-th token in the packed queries; rows
    past a query's length point to the sentinel row ``Tq`` (a row of zeros in :func:`extend`)."""
    lengths = qo.diff()
    lmax = int(lengths.max()) if lengths.numel() else 0
    i = torch.arange(max(lmax, 1), device=qo.device)
    rows = qo[:-1, None] + i[None, :]
    return torch.where(i[None, :] < lengths[:, None], rows, qo[-1]), max(lmax, 1)


def centroid_scores(state: IndexState, qv: torch.Tensor) -> torch.Tensor:
    """``[Tq + 1, C]`` float32 query-token x centroid scores, plus a sentinel row of zeros."""
    s = qv.float() @ state.centroids.T
    return torch.cat([s, s.new_zeros(1, s.shape[1])])


def _expand_csr(offsets: torch.Tensor, which: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(owner [K], entry [K])``: for each i, the entries ``offsets[which[i]] .. offsets[which[i]+1]``."""
    starts = offsets[which]
    lens = offsets[which + 1] - starts
    total = int(lens.sum()) if lens.numel() else 0
    owner = torch.repeat_interleave(torch.arange(which.numel(), device=which.device), lens, output_size=total)
    shift = starts - (torch.cumsum(lens, 0) - lens)                  # entry = shift[owner] + running index
    return owner, shift[owner] + torch.arange(total, device=which.device)


def candidates(state: IndexState, S: torch.Tensor, qo: torch.Tensor, ncells: int,
               allowed_keys: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pair_q, pair_doc)`` candidate documents per query (stage 2). `allowed_keys`: sorted
    ``q * N + position`` keys of the allowed pairs, or None (no restriction)."""
    dev = S.device
    nq = qo.numel() - 1
    n = state.n_slots
    tq = S.shape[0] - 1
    top = torch.topk(S[:tq], min(ncells, S.shape[1]), dim=1).indices                 # [Tq, ncells]
    owner = torch.repeat_interleave(torch.arange(nq, device=dev), qo.diff())          # [Tq]
    qc = torch.unique(owner[:, None].mul(state.n_centroids).add(top).reshape(-1))     # (query, cell)
    q, c = qc // state.n_centroids, qc % state.n_centroids
    o, entry = _expand_csr(state.ivf_offsets, c)
    key = torch.unique(q[o] * n + state.ivf_docs[entry].long())
    pair_q, pair_doc = key // n, key % n
    keep = state.alive[pair_doc]
    if allowed_keys is not None:
        keep &= _member(allowed_keys, key)
    return pair_q[keep], pair_doc[keep]


def segment_max(group: torch.Tensor, vals: torch.Tensor, m: int, groups_sorted: bool = False) -> torch.Tensor:
    """``[m, L]`` float32: per group the element-wise max of its rows of ``vals [V, L]`` (``-inf``
    for a group without rows). On the CPU rows are ordered by group and reduced with numpy's
    ``maximum.reduceat`` (far faster there than a scatter); elsewhere a scatter-reduce."""
    lmax = vals.shape[1]
    out = torch.full((m, lmax), float("-inf"), device=vals.device)
    if group.numel() == 0:
        return out
    if vals.device.type != "cpu":
        return out.scatter_reduce_(0, group[:, None].expand(-1, lmax), vals, reduce="amax", include_self=True)
    import numpy as np
    if not groups_sorted:
        order = torch.sort(group, stable=True).indices
        group, vals = group[order], vals[order]
    g = group.numpy()
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    out[torch.from_numpy(g[starts])] = torch.from_numpy(np.maximum.reduceat(vals.contiguous().numpy(), starts, axis=0))
    return out


def _member(sorted_keys: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    if sorted_keys.numel() == 0:
        return torch.zeros_like(keys, dtype=torch.bool)
    at = torch.searchsorted(sorted_keys, keys).clamp(max=sorted_keys.numel() - 1)
    return sorted_keys[at] == keys


def pruned_scores(state: IndexState, S: torch.Tensor, qo: torch.Tensor, pair_q: torch.Tensor,
                  pair_doc: torch.Tensor, threshold: float) -> torch.Tensor:
    """``[M]`` float32 pruned centroid-interaction scores of the candidate pairs (stage 3).

    One path on every device: walking the kept centroids' inverted lists. Stage 4's CPU path
    (per query, gather its candidates' cells) was tried here and lost on MiniLM page tokens
    (0.98x the QPS at the defaults, 0.79x at ncells 2 / ndocs 1024; one interleaved run on the
    shared 2-core machine): stage 3 sees every candidate, whose cells outnumber the entries the
    threshold keeps."""
    dev = S.device
    m = pair_q.numel()
    rows, lmax = token_rows(qo)
    nq = qo.numel() - 1
    owner = torch.repeat_interleave(torch.arange(nq, device=dev), qo.diff())
    qmax = segment_max(owner, S[:-1], nq, groups_sorted=True)                          # [Nq, C]
    kq, kc = torch.nonzero(qmax >= threshold, as_tuple=True)
    o, entry = _expand_csr(state.ivf_offsets, kc)
    n = state.n_slots
    key = kq[o] * n + state.ivf_docs[entry].long()
    pair_key = pair_q * n + pair_doc
    if not (m and key.numel()):
        return torch.full((m,), float("-inf"), device=dev)
    at = torch.searchsorted(pair_key, key).clamp(max=m - 1)
    hit = pair_key[at] == key
    at, cell, qq = at[hit], kc[o[hit]], kq[o[hit]]
    vals = S[rows[qq], cell[:, None]]                                                    # [V, Lmax]
    return segment_max(at, vals, m).sum(1)


def full_scores(state: IndexState, S: torch.Tensor, qo: torch.Tensor, pair_q: torch.Tensor,
                pair_doc: torch.Tensor) -> torch.Tensor:
    """``[M]`` float32 centroid-interaction scores without pruning (stage 4)."""
    m = pair_q.numel()
    if S.device.type == "cpu" and m and not bool((pair_q[1:] < pair_q[:-1]).any()):
        return _full_scores_cpu(state, S, qo, pair_q, pair_doc, token_rows(qo)[1]).sum(1)
    return _full_scores_generic(state, S, qo, pair_q, pair_doc)


def _full_scores_generic(state: IndexState, S: torch.Tensor, qo: torch.Tensor, pair_q: torch.Tensor,
                         pair_doc: torch.Tensor) -> torch.Tensor:
    """:func:`full_scores` on any device: every (pair, cell) row of `S` gathered at once."""
    m = pair_q.numel()
    rows, lmax = token_rows(qo)
    o, entry = _expand_csr(state.cells_offsets, pair_doc)                               # o ascending
    vals = S[rows[pair_q[o]], state.cells[entry].long()[:, None]]
    return segment_max(o, vals, m, groups_sorted=True).sum(1)


def _full_scores_cpu(state: IndexState, S: torch.Tensor, qo: torch.Tensor, pair_q: torch.Tensor,
                     pair_doc: torch.Tensor, lmax: int) -> torch.Tensor:
    """``[M, Lmax]``: per pair and query token the best score over the document's distinct
    centroids, as the generic path's ``segment_max`` gives it (``0`` for padding tokens, a row
    of ``-inf`` for a document without centroids), so the caller's sum is the same float32 sum.

    Per query: its token rows of `S` (``[L, C]``) gathered at the concatenated cells of its
    candidate documents (one column gather, ``[L, E]``) and reduced per document with numpy's
    ``maximum.reduceat``. The generic path gathers ``[V, Lmax]`` with two broadcast index arrays
    per (pair, cell); on the CPU that took ~70 % of a search of real page tokens (MiniLM,
    ndocs 256: 14 ms per question; ``benchmarks/results/prefilter_pages_sweep.md``)."""
    import numpy as np
    m = pair_q.numel()
    out = np.zeros((m, lmax), np.float32)
    sn, qon = S.numpy(), qo.numpy()
    pq, pd = pair_q.numpy(), pair_doc.numpy()
    co, cells = state.cells_offsets.numpy(), state.cells.numpy()
    starts, ends = co[pd], co[pd + 1]
    lens = ends - starts
    empty = lens == 0
    out[empty] = -np.inf
    bounds = np.searchsorted(pq, np.arange(qon.size))  # pairs are sorted by query
    for q in np.flatnonzero(np.diff(bounds)).tolist():
        a, b = int(bounds[q]), int(bounds[q + 1])
        keep = np.flatnonzero(~empty[a:b]) + a
        if not keep.size:
            continue
        ln = lens[keep]
        seg = np.zeros(keep.size, np.int64)
        np.cumsum(ln[:-1], out=seg[1:])
        idx = np.repeat(starts[keep] - seg, ln) + np.arange(int(ln.sum()))
        tok = sn[qon[q]:qon[q + 1]]                                                      # [L, C]
        if tok.shape[0]:
            out[keep, :tok.shape[0]] = np.maximum.reduceat(tok[:, cells[idx]], seg, axis=1).T
    return torch.from_numpy(out)


def top_per_query(pair_q: torch.Tensor, scores: torch.Tensor, nq: int, n: int) -> torch.Tensor:
    """Indices into the pairs of each query's `n` best (descending score, ties: earlier pair),
    ordered by query; every pair of a query with at most `n` pairs is kept."""
    m = pair_q.numel()
    if m == 0:
        return torch.zeros(0, dtype=torch.int64, device=pair_q.device)
    counts = torch.bincount(pair_q, minlength=nq)
    if int(counts.max()) <= n:
        return torch.arange(m, device=pair_q.device)
    # sort by (query, -score) stably: score first, then a stable sort by query
    order = torch.sort(scores, descending=True, stable=True).indices
    order = order[torch.sort(pair_q[order], stable=True).indices]
    start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(m, device=pair_q.device) - start[pair_q[order]]
    return order[rank < n].sort().values
