"""Exact MaxSim from PLAID codes, decompression fused into scoring (the prefilter's last stage).

For each listed (query, document) pair: ``score = Σ_i max_j <q_i, c[code_j] + w[bucket_j]>``
(see :mod:`colgraph_engine.prefilter.codec` for the residual layout). One program per pair:

* the query's rows stay resident in ``[BLOCK_M, BLOCK_D]`` tiles (queries longer than BLOCK_M
  run in pieces inside the program: sums over disjoint rows add exactly);
* the document streams in tiles of BLOCK_N tokens: the program loads the tokens' centroid ids,
  gathers their centroid rows, loads the packed residual bytes, extracts each dimension's
  bucket with a shift and a mask, looks the bucket value up in the ``[2^nbits]`` weight table
  and adds it (and, for an index of unit vectors, divides the token by its norm). The decoded
  ``[BLOCK_N, BLOCK_D]`` tile exists only in registers / shared
  memory; on a GPU it is rounded to fp16 (10 mantissa bits, as tf32; decoded values lie
  within about +-1.5 so the range is no concern) and multiplied with the fp16 query tile on
  tensor cores with float32 accumulation (``tl.dot``); under the interpreter both stay
  float32. The running max per query row is kept;
* tokens past the document's end score ``-inf``; query rows past its end add 0. An empty
  document scores ``-inf`` (a max over nothing) and an empty query 0, as in the reference.

The launcher validates nothing (the index did) and reads nothing back from the device.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "") == "1"
# Two stages keep the staged tiles within sm_80's shared memory (compile check:
# tests/compile_prefilter_kernel.py); three needed 176 KB at d = 128.
NUM_STAGES = 2
NUM_WARPS = 8  # 4 warps needed all 255 registers per thread (compile check)


@triton.jit
def _pairs_kernel(q_ptr, q_off_ptr, cent_ptr, w_ptr, codes_ptr, res_ptr, d_off_ptr, pair_q_ptr, pair_doc_ptr,
                  out_ptr, D: tl.constexpr, W: tl.constexpr, NBITS: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HALF: tl.constexpr,
                  UNIT: tl.constexpr):
    pid = tl.program_id(0)
    qi = tl.load(pair_q_ptr + pid)
    doc = tl.load(pair_doc_ptr + pid)
    q_lo = tl.load(q_off_ptr + qi)
    q_hi = tl.load(q_off_ptr + qi + 1)
    d_lo = tl.load(d_off_ptr + doc)
    d_hi = tl.load(d_off_ptr + doc + 1)
    PER: tl.constexpr = 8 // NBITS
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < D
    byte_col = cols // PER
    shift = (cols % PER) * NBITS
    total = tl.zeros([BLOCK_M], dtype=tl.float32)
    for m0 in range(q_lo, q_hi, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        rmask = rows < q_hi
        qt = tl.load(q_ptr + rows[:, None].to(tl.int64) * D + cols[None, :],
                     mask=rmask[:, None] & cmask[None, :], other=0.0)
        if HALF:
            qt = qt.to(tl.float16)
        best = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        for n0 in range(d_lo, d_hi, BLOCK_N):
            toks = n0 + tl.arange(0, BLOCK_N)
            tmask = toks < d_hi
            code = tl.load(codes_ptr + toks, mask=tmask, other=0).to(tl.int64)
            lmask = tmask[:, None] & cmask[None, :]
            cent = tl.load(cent_ptr + code[:, None] * D + cols[None, :], mask=lmask, other=0.0)
            byte = tl.load(res_ptr + toks[:, None].to(tl.int64) * W + byte_col[None, :], mask=lmask, other=0)
            bucket = (byte.to(tl.int32) >> shift[None, :]) & ((1 << NBITS) - 1)
            x = cent + tl.load(w_ptr + bucket)                               # decoded tile, never stored
            x = tl.where(lmask, x, 0.0)
            if UNIT:  # L2-normalise each decoded token (rows past the end stay 0)
                x = x / tl.maximum(tl.sqrt(tl.sum(x * x, axis=1)), 1e-12)[:, None]
            if HALF:
                x = x.to(tl.float16)
            s = tl.dot(qt, tl.trans(x))                                      # [BLOCK_M, BLOCK_N]
            s = tl.where(tmask[None, :], s, float("-inf"))
            best = tl.maximum(best, tl.max(s, axis=1))
        total += tl.where(rmask, best, 0.0)
    tl.store(out_ptr + pid, tl.sum(total, axis=0))


def block_sizes(d: int) -> tuple[int, int, int]:
    """``(BLOCK_M, BLOCK_N, BLOCK_D)``: query rows per piece, document tokens per tile, padded d.
    On a GPU: 32 query rows (one piece for the usual 32-token query) and 64 tokens per tile
    (ours; not yet tuned on hardware); the interpreter uses 16 x 16 (tl.dot's minimum)."""
    bd = max(16, triton.next_power_of_2(d))
    return (16, 16, bd) if INTERPRET else (32, 64, bd)


def score_pairs(qv: torch.Tensor, qo: torch.Tensor, centroids: torch.Tensor, weights: torch.Tensor,
                codes: torch.Tensor, residuals: torch.Tensor, d_offsets: torch.Tensor, pair_q: torch.Tensor,
                pair_doc: torch.Tensor, nbits: int, unit: bool = False) -> torch.Tensor:
    """``[M]`` float32 exact scores of pairs ``(pair_q [M], pair_doc [M])``: float32 queries
    ``qv [Tq, d]`` / ``qo [Nq+1]``, centroids ``[C, d]`` float32, ``weights [2^nbits]``, codes
    ``[T]``, residuals ``[T, d*nbits/8]`` uint8, document offsets ``[N+1]`` (all on one device).
    `unit`: L2-normalise each decoded token before scoring."""
    m = pair_q.numel()
    out = torch.empty(m, dtype=torch.float32, device=qv.device)
    if m == 0:
        return out
    d = qv.shape[1]
    bm, bn, bd = block_sizes(d)
    _pairs_kernel[(m,)](qv, qo, centroids.float().contiguous(), weights.float().contiguous(), codes,
                        residuals.contiguous(), d_offsets, pair_q.contiguous(), pair_doc.contiguous(), out,
                        D=d, W=residuals.shape[1], NBITS=nbits, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd,
                        HALF=not INTERPRET, UNIT=unit, num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return out


@triton.jit
def _interaction_kernel(st_ptr, kept_ptr, probed_ptr, cells_ptr, cells_off_ptr, pruned_ptr, full_ptr, hit_ptr,
                        L, BLOCK_L: tl.constexpr):
    """One program per document: walks its distinct centroids (``cells``), keeping the running
    max of their score rows ``st [C, L]`` (all, and the kept ones), then sums over the L rows."""
    pid = tl.program_id(0)
    lo = tl.load(cells_off_ptr + pid)
    hi = tl.load(cells_off_ptr + pid + 1)
    cols = tl.arange(0, BLOCK_L)
    cmask = cols < L
    best = tl.full([BLOCK_L], float("-inf"), dtype=tl.float32)
    best_kept = tl.full([BLOCK_L], float("-inf"), dtype=tl.float32)
    hit = tl.zeros([BLOCK_L], dtype=tl.int32)
    for j in range(lo, hi):
        c = tl.load(cells_ptr + j).to(tl.int64)
        row = tl.load(st_ptr + c * L + cols, mask=cmask, other=0.0)
        best = tl.maximum(best, row)
        kept = tl.load(kept_ptr + c + cols * 0)                    # broadcast of one flag
        best_kept = tl.where(kept != 0, tl.maximum(best_kept, row), best_kept)
        hit = tl.maximum(hit, tl.load(probed_ptr + c + cols * 0).to(tl.int32))
    tl.store(full_ptr + pid, tl.sum(tl.where(cmask, best, 0.0), axis=0))
    tl.store(pruned_ptr + pid, tl.sum(tl.where(cmask, best_kept, 0.0), axis=0))
    tl.store(hit_ptr + pid, tl.max(hit, axis=0))


def centroid_interaction(st: torch.Tensor, kept: torch.Tensor, probed: torch.Tensor, cells: torch.Tensor,
                         cells_offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per document p (``cells_offsets [N+1]`` into ``cells [P]``) and one query:
    ``(pruned [N], full [N], hit [N] int32)`` with ``full[p] = Σ_i max_{c in cells(p)} st[c, i]``,
    ``pruned[p]`` the same over the kept centroids (``kept [C]`` uint8; ``-inf`` when none is
    kept) and ``hit[p] = max_{c in cells(p)} probed[c]`` (``probed [C]`` uint8). `st`:
    ``[C, L]`` float32 contiguous, the query's token scores transposed. A document without
    cells gets ``full = pruned = -inf`` and ``hit = 0``. Summation order is the kernel's (the
    torch path in :mod:`colgraph_engine.prefilter.dense` may differ in the last bits)."""
    n = cells_offsets.numel() - 1
    dev = st.device
    pruned = torch.empty(n, dtype=torch.float32, device=dev)
    full = torch.empty(n, dtype=torch.float32, device=dev)
    hit = torch.empty(n, dtype=torch.int32, device=dev)
    if n == 0:
        return pruned, full, hit
    L = st.shape[1]
    _interaction_kernel[(n,)](st, kept, probed, cells, cells_offsets, pruned, full, hit, L,
                              BLOCK_L=max(16, triton.next_power_of_2(L)), num_warps=1)
    return pruned, full, hit
