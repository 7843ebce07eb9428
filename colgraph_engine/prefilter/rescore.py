"""Exact MaxSim of (query, document) pairs straight from codes and residuals.

A document token decodes to ``x' = c[code] + r'`` (see :mod:`.codec`), so

    <q_i, x'_j> = S[i, code_j] + <q_i, r'_j>,    S = q @ centroids^T (already computed by stage 1)

and ``score(q, doc) = Σ_i max_j <q_i, x'_j>`` (a document without tokens scores ``-inf``). When
the index normalises decoded vectors (``state.unit``), ``x'`` is replaced by ``x' / |x'|``.

Backends:
  ``triton``  one fused kernel (:mod:`colgraph_engine.kernels.prefilter`): a program per pair
              streams the document's codes and packed residual bytes, decodes a tile of tokens in
              registers, multiplies it with the resident query tile and keeps the running max;
              decoded vectors never reach memory.
  ``native``  (CPU) the shortlisted documents of a block of queries are decoded once each (a
              document shared by several queries is decoded once), in chunks of at most
              ``BLOCK_TOKENS`` tokens (a 16 MiB float32 scratch at d = 128), and each chunk's
              pairs are scored by the C++ MaxSim kernel (``colgraph_engine._core``, AVX-512
              where present); only a chunk is ever decoded, never the shortlist as a whole.
  ``torch``   (any device) per query, tokens of its shortlisted documents are taken in
              blocks of at most ``BLOCK_TOKENS`` rows: the residual bytes of a block are decoded
              through a ``[256, 8 / nbits]`` byte table into a scratch block, multiplied with the
              query, and the centroid part is gathered from ``S``; only that block is ever
              decoded (never the shortlist as a whole).
The pure reference (decode everything, then MaxSim) is :func:`.reference.exact_scores`.
"""
from __future__ import annotations

import torch

from . import codec
from .layout import IndexState
from .stages import _expand_csr

BLOCK_TOKENS = 1 << 15  # tokens decoded per step on the torch path: a 16 MiB float32 block at d = 128


def exact_scores(state: IndexState, qv: torch.Tensor, qo: torch.Tensor, S: torch.Tensor, pair_q: torch.Tensor,
                 pair_doc: torch.Tensor, backend: str) -> torch.Tensor:
    """``[M]`` float32 exact scores (on the decoded vectors) of pairs sorted by query."""
    if pair_q.numel() == 0:
        return torch.zeros(0, dtype=torch.float32, device=qv.device)
    if backend == "triton":
        from ..kernels import prefilter as kp
        return kp.score_pairs(qv.float().contiguous(), qo, state.centroids, state.weights.to(qv.device),
                              state.codes, state.residuals, state.offsets, pair_q, pair_doc, state.nbits,
                              unit=state.unit)
    if backend == "native":
        return _native_scores(state, qv, qo, pair_q, pair_doc)
    return _torch_scores(state, qv, qo, S, pair_q, pair_doc)


def _native_scores(state, qv, qo, pair_q, pair_doc):
    from ..ops import _native_impl
    table = codec.byte_table(state.weights, state.nbits)
    qv = qv.float().contiguous()
    uniq, inv = torch.unique(pair_doc, return_inverse=True)                 # documents decoded once
    lengths = (state.offsets[uniq + 1] - state.offsets[uniq]).tolist()
    out = torch.empty(pair_q.numel(), dtype=torch.float32)
    nq = qo.numel() - 1
    a = 0
    while a < len(lengths):
        b, tokens = a + 1, lengths[a]
        while b < len(lengths) and tokens + lengths[b] <= BLOCK_TOKENS:
            tokens += lengths[b]
            b += 1
        owner, rows = _expand_csr(state.offsets, uniq[a:b])
        x = torch.nn.functional.embedding(state.codes[rows].long(), state.centroids)
        x += torch.nn.functional.embedding(state.residuals[rows].long(), table).view(rows.numel(), state.dim)
        if state.unit:
            x = torch.nn.functional.normalize(x, dim=-1)
        xo = torch.zeros(b - a + 1, dtype=torch.int64)
        torch.cumsum(torch.tensor(lengths[a:b], dtype=torch.int64), 0, out=xo[1:])
        sel = torch.nonzero((inv >= a) & (inv < b)).squeeze(1)              # pairs sorted by query
        co = torch.zeros(nq + 1, dtype=torch.int64)
        torch.cumsum(torch.bincount(pair_q[sel], minlength=nq), 0, out=co[1:])
        out[sel] = _native_impl.maxsim_candidates(qv, qo, x, xo, co, inv[sel] - a)
        a = b
    return out


def _torch_scores(state, qv, qo, S, pair_q, pair_doc):
    dev = qv.device
    table = codec.byte_table(state.weights, state.nbits).to(dev)
    st = S[:-1].T.contiguous()                                                   # [C, Tq]: rows gather fast
    out = torch.empty(pair_q.numel(), dtype=torch.float32, device=dev)
    counts = torch.bincount(pair_q, minlength=qo.numel() - 1).tolist()
    qo_h = qo.tolist()
    a = 0
    for q, cnt in enumerate(counts):
        if not cnt:
            continue
        lo, hi = qo_h[q], qo_h[q + 1]
        docs = pair_doc[a:a + cnt]
        qt = qv[lo:hi].float()                                                   # [L, d]
        owner, rows = _expand_csr(state.offsets, docs)                           # token rows of the docs
        best = torch.full((cnt, hi - lo), float("-inf"), device=dev)
        for b in range(0, rows.numel(), BLOCK_TOKENS):
            r = rows[b:b + BLOCK_TOKENS]
            resid = torch.nn.functional.embedding(state.residuals[r].long(), table).view(r.numel(), state.dim)
            if state.unit:  # the norm needs the whole decoded vector
                x = torch.nn.functional.normalize(resid + state.centroids[state.codes[r].long()], dim=-1)
                sim = x @ qt.T
            else:
                sim = torch.addmm(torch.nn.functional.embedding(state.codes[r].long(), st[:, lo:hi]), resid, qt.T)
            _segment_max_into(best, sim, owner[b:b + BLOCK_TOKENS])
        out[a:a + cnt] = best.sum(1) if hi > lo else 0.0
        a += cnt
    return out


def _segment_max_into(best: torch.Tensor, sim: torch.Tensor, owner: torch.Tensor) -> None:
    """``best[o] = max(best[o], max of sim rows owned by o)`` for rows ``sim [Tb, L]`` whose
    owners ``[Tb]`` are non-decreasing (documents are contiguous token ranges)."""
    if owner.numel() == 0:
        return
    if sim.device.type == "cpu":
        import numpy as np
        o = owner.numpy()
        starts = np.flatnonzero(np.r_[True, o[1:] != o[:-1]])
        m = torch.from_numpy(np.maximum.reduceat(sim.numpy(), starts, axis=0))  # [segments, L]
        who = owner[torch.from_numpy(starts)]
        best[who] = torch.maximum(best[who], m)
        return
    best.scatter_reduce_(0, owner[:, None].expand(-1, sim.shape[1]), sim, reduce="amax", include_self=True)
