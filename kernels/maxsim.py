"""Fused MaxSim on tensor cores: ``score = sum_i max_j <q_i, x_j>`` per (query, document) pair.

One program owns one document and a group of G queries. The G queries' tokens form the rows of
an ``[BLOCK_M = G * LQP, d]`` tile (query g occupies rows g*LQP .. g*LQP + len_g - 1; rows past
a query's length are masked and never score). The program streams the document's tokens in
``[BLOCK_N, d]`` tiles, multiplies on tensor cores, and keeps the running max per row in
registers, so the ``[Tq, Td]`` similarity matrix never reaches memory. At the end the row maxima
are summed per query with a reshape to ``[G, LQP]``.

Two ways to pick the (document, queries) of a program:
  * cross:      every query against every document; program p -> document p // n_groups,
                queries (p % n_groups) * G + [0, G). Consecutive programs share a document,
                so it is read from HBM once and served from L2 to the other query groups.
  * candidates: a work list built by the launcher, sorted by document, so each listed
                document is streamed once for all the queries that list it.

Queries longer than MAX_LQP tokens are split into virtual queries of at most MAX_LQP tokens
whose partial sums are added afterwards (sums over disjoint token sets add exactly).
All row offsets are int64: products such as row * d pass 2^31 on large stores.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "") == "1"
MAX_LQP = 128        # most query rows one query may occupy in a tile
TARGET_BLOCK_M = 128  # query rows per program when queries are short


def _configs():
    if INTERPRET:  # one small config: the interpreter is exact but slow
        return [triton.Config({"BLOCK_N": 16}, num_warps=4, num_stages=1)]
    return [
        triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=s)
        for bn in (64, 128)
        for w in (4, 8)
        for s in (2, 3, 4)
    ]


@triton.jit
def _tile_scores(q, q_ptr, q_row_stride, q_rows, row_valid, x_ptr, x_row_stride, x_rows, x_valid, D,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_K: tl.constexpr,
                 MASK_ROWS: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """[BLOCK_M, BLOCK_N] fp32 similarities of the query rows against one document tile."""
    cols = tl.arange(0, BLOCK_K)
    if NUM_K == 1:
        x_ptrs = x_ptr + x_rows[:, None] * x_row_stride + cols[None, :]
        if not EVEN_K:
            x = tl.load(x_ptrs, mask=x_valid[:, None] & (cols < D)[None, :], other=0.0)
        elif MASK_ROWS:
            x = tl.load(x_ptrs, mask=x_valid[:, None], other=0.0)
        else:  # a full tile of a document whose d fills BLOCK_K: no mask at all
            x = tl.load(x_ptrs)
        if UPCAST:
            x = x.to(tl.float32)
        if IEEE:
            s = tl.dot(q, tl.trans(x), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(x))
    else:
        s = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for kk in tl.static_range(NUM_K):
            kc = kk * BLOCK_K + cols
            qk = tl.load(q_ptr + q_rows[:, None] * q_row_stride + kc[None, :],
                         mask=row_valid[:, None] & (kc < D)[None, :], other=0.0)
            xk = tl.load(x_ptr + x_rows[:, None] * x_row_stride + kc[None, :],
                         mask=x_valid[:, None] & (kc < D)[None, :], other=0.0)
            if UPCAST:
                qk = qk.to(tl.float32)
                xk = xk.to(tl.float32)
            if IEEE:
                s += tl.dot(qk, tl.trans(xk), input_precision="ieee")
            else:
                s += tl.dot(qk, tl.trans(xk))
    return s


@triton.jit
def _score_group(q_ptr, q_row_stride, q_rows, row_valid, x_ptr, x_row_stride, x_start, x_end, D,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 NUM_K: tl.constexpr, G: tl.constexpr, LQP: tl.constexpr,
                 EVEN_K: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """[G] fp32: per query of the group, sum over its rows of max over document rows.

    The max is kept element-wise in a [BLOCK_M, BLOCK_N] register tile and reduced across
    columns once at the end, so the streaming loop has no cross-lane reductions. Full document
    tiles load without masks; only the last partial tile is masked (-inf columns).
    """
    q = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    if NUM_K == 1:
        cols = tl.arange(0, BLOCK_K)
        q = tl.load(q_ptr + q_rows[:, None] * q_row_stride + cols[None, :],
                    mask=row_valid[:, None] & (cols < D)[None, :], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
    best = tl.full([BLOCK_M, BLOCK_N], float("-inf"), dtype=tl.float32)
    full_end = x_start + ((x_end - x_start) // BLOCK_N) * BLOCK_N
    for n0 in range(x_start, full_end, BLOCK_N):
        x_rows = n0 + tl.arange(0, BLOCK_N).to(tl.int64)
        s = _tile_scores(q, q_ptr, q_row_stride, q_rows, row_valid, x_ptr, x_row_stride, x_rows, x_rows < x_end, D,
                         BLOCK_M, BLOCK_N, BLOCK_K, NUM_K, False, EVEN_K, IEEE, UPCAST)
        best = tl.maximum(best, s)
    if full_end < x_end:
        x_rows = full_end + tl.arange(0, BLOCK_N).to(tl.int64)
        x_valid = x_rows < x_end
        s = _tile_scores(q, q_ptr, q_row_stride, q_rows, row_valid, x_ptr, x_row_stride, x_rows, x_valid, D,
                         BLOCK_M, BLOCK_N, BLOCK_K, NUM_K, True, EVEN_K, IEEE, UPCAST)
        best = tl.maximum(best, tl.where(x_valid[None, :], s, float("-inf")))
    running = tl.max(best, axis=1)
    # Rows that are not query tokens contribute nothing; an empty document leaves -inf.
    running = tl.where(row_valid, running, 0.0)
    return tl.sum(tl.reshape(running, [G, LQP]), axis=1)


def _prune_configs(configs, named_args, **kwargs):
    """Drops configs whose two [rows, BLOCK_N] fp32 register tiles (the tile product and the
    running max) would take more than 128 registers per thread, i.e. spill."""
    rows = kwargs.get("G", named_args.get("G", 1)) * kwargs.get("LQP", named_args.get("LQP", 1))
    fitting = [c for c in configs if rows * c.kwargs["BLOCK_N"] // (32 * c.num_warps) <= 64]
    return fitting or configs[:1]


# WORK_LOG2 (log2 of the program count) is in the key so that a tiny first call does not fix
# the configuration used for large ones.
@triton.autotune(configs=_configs(), key=["D", "G", "LQP", "CANDIDATES", "WORK_LOG2"],
                 prune_configs_by={"early_config_prune": _prune_configs})
@triton.jit
def _maxsim_kernel(
    q_ptr, q_offsets_ptr, n_queries, q_row_stride,
    x_ptr, x_offsets_ptr, n_docs, x_row_stride,
    out_ptr, out_row_stride,
    item_doc_ptr, item_start_ptr, item_count_ptr, pair_query_ptr, pair_slot_ptr,
    n_groups, D, WORK_LOG2,
    G: tl.constexpr, LQP: tl.constexpr, BLOCK_K: tl.constexpr, NUM_K: tl.constexpr, EVEN_K: tl.constexpr,
    CANDIDATES: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    BLOCK_M: tl.constexpr = G * LQP
    rows = tl.arange(0, BLOCK_M)
    local_q = rows // LQP
    tok = (rows % LQP).to(tl.int64)
    group_q = tl.arange(0, G)
    if CANDIDATES:
        doc = tl.load(item_doc_ptr + pid)
        start = tl.load(item_start_ptr + pid)
        count = tl.load(item_count_ptr + pid)
        pair_ok = local_q < count
        query = tl.load(pair_query_ptr + start + local_q, mask=pair_ok, other=0)
    else:
        doc = pid // n_groups
        first_q = (pid % n_groups) * G
        query = first_q + local_q
        pair_ok = query < n_queries
    q_start = tl.load(q_offsets_ptr + query, mask=pair_ok, other=0)
    q_end = tl.load(q_offsets_ptr + query + 1, mask=pair_ok, other=0)
    row_valid = pair_ok & (tok < q_end - q_start)
    x_start = tl.load(x_offsets_ptr + doc)
    x_end = tl.load(x_offsets_ptr + doc + 1)
    per_query = _score_group(q_ptr, q_row_stride, q_start + tok, row_valid, x_ptr, x_row_stride,
                             x_start, x_end, D, BLOCK_M, BLOCK_N, BLOCK_K, NUM_K, G, LQP, EVEN_K, IEEE, UPCAST)
    if CANDIDATES:
        ok = group_q < count
        slot = tl.load(pair_slot_ptr + start + group_q, mask=ok, other=0)
        tl.store(out_ptr + slot, per_query, mask=ok)
    else:
        qs = first_q + group_q
        tl.store(out_ptr + qs.to(tl.int64) * out_row_stride + doc, per_query, mask=qs < n_queries)


# ------------------------------------------------------------------------------------------
# Launch helpers
# ------------------------------------------------------------------------------------------

def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _split_long_queries(q_offsets: torch.Tensor, lengths: list[int]):
    """Virtual queries of at most MAX_LQP tokens: (virtual offsets, owner of each virtual query)."""
    starts, owner = [0], []
    pos = 0
    for i, n in enumerate(lengths):
        pieces = max(1, -(-n // MAX_LQP))
        for p in range(pieces):
            pos += min(MAX_LQP, n - p * MAX_LQP) if n else 0
            starts.append(pos)
            owner.append(i)
    dev = q_offsets.device
    return torch.tensor(starts, dtype=torch.int64, device=dev), torch.tensor(owner, dtype=torch.int64, device=dev)


def _plan(q_offsets: torch.Tensor, d: int):
    """Tile geometry for these queries: (q_offsets to use, owner map or None, G, LQP, BLOCK_K, NUM_K)."""
    lengths = q_offsets.diff().tolist()
    owner = None
    if lengths and max(lengths) > MAX_LQP:
        q_offsets, owner = _split_long_queries(q_offsets, lengths)
        lengths = q_offsets.diff().tolist()
    n = len(lengths)
    lqp = _next_pow2(max(1, max(lengths, default=1)))
    g = max(1, min(TARGET_BLOCK_M // lqp, _next_pow2(n)))
    while g * lqp < 16:  # tl.dot needs at least 16 rows
        g *= 2
    block_k = min(_next_pow2(max(d, 16)), 128 if INTERPRET else 256)
    return q_offsets, owner, g, lqp, block_k, -(-d // block_k)


def _flags(values: torch.Tensor):
    ieee = values.dtype == torch.float32
    # The interpreter computes bf16/fp16 products wrongly; widen loads there.
    upcast = INTERPRET and values.dtype != torch.float32
    return ieee, upcast


def maxsim_cross(q_values, q_offsets, x_values, x_offsets, out=None) -> torch.Tensor:
    """``[Nq, Nd]`` fp32 scores. `out`, when given, must be a contiguous fp32 ``[Nq, Nd]``."""
    nq, nd, d = q_offsets.numel() - 1, x_offsets.numel() - 1, q_values.shape[1]
    if out is None:
        out = torch.empty((nq, nd), dtype=torch.float32, device=q_values.device)
    if nq == 0 or nd == 0:
        return out
    q_values, x_values = q_values.contiguous(), x_values.contiguous()
    v_offsets, owner, g, lqp, block_k, num_k = _plan(q_offsets, d)
    n_virtual = v_offsets.numel() - 1
    target = out if owner is None else torch.empty((n_virtual, nd), dtype=torch.float32, device=out.device)
    n_groups = -(-n_virtual // g)
    ieee, upcast = _flags(q_values)
    dummy = x_offsets
    _maxsim_kernel[(nd * n_groups,)](
        q_values, v_offsets, n_virtual, q_values.stride(0),
        x_values, x_offsets, nd, x_values.stride(0),
        target, target.stride(0),
        dummy, dummy, dummy, dummy, dummy,
        n_groups, d, (nd * n_groups).bit_length(),
        G=g, LQP=lqp, BLOCK_K=block_k, NUM_K=num_k, EVEN_K=d % block_k == 0, CANDIDATES=False, IEEE=ieee, UPCAST=upcast,
    )
    if owner is not None:
        out.zero_().index_add_(0, owner, target)
    return out


def build_work_items(pair_doc: torch.Tensor, pair_query: torch.Tensor, pair_slot: torch.Tensor, g: int):
    """Sorts (doc, query, slot) pairs by document and cuts them into items of at most `g` pairs
    of one document. Returns (item_doc, item_start, item_count, sorted pair_query, sorted pair_slot)."""
    order = torch.sort(pair_doc, stable=True).indices
    sd, sq, ss = pair_doc[order], pair_query[order], pair_slot[order]
    n = sd.numel()
    new_run = torch.ones(n, dtype=torch.bool, device=sd.device)
    new_run[1:] = sd[1:] != sd[:-1]
    run_first = torch.nonzero(new_run).squeeze(1)
    run_id = torch.cumsum(new_run.to(torch.int64), 0) - 1
    rank = torch.arange(n, device=sd.device) - run_first[run_id]
    item_start = torch.nonzero(rank % g == 0).squeeze(1)
    bounds = torch.cat([item_start, torch.tensor([n], device=sd.device)])
    return sd[item_start], item_start, bounds.diff(), sq, ss


def maxsim_candidates(q_values, q_offsets, x_values, x_offsets, cand_offsets, cand_ids, out=None) -> torch.Tensor:
    """``[C]`` fp32: one score per listed (query, candidate document) pair."""
    n_cand, d = cand_ids.numel(), q_values.shape[1]
    if out is None:
        out = torch.empty(n_cand, dtype=torch.float32, device=q_values.device)
    if n_cand == 0:
        return out
    q_values, x_values = q_values.contiguous(), x_values.contiguous()
    dev = q_values.device
    nq = q_offsets.numel() - 1
    pair_query = torch.repeat_interleave(torch.arange(nq, device=dev), cand_offsets.diff())
    pair_slot = torch.arange(n_cand, device=dev)
    pair_doc = cand_ids
    v_offsets, owner, g, lqp, block_k, num_k = _plan(q_offsets, d)
    target = out
    if owner is not None:
        # Each candidate of a split query becomes one pair per piece; pieces add afterwards.
        pieces = torch.bincount(owner, minlength=nq)
        first_piece = torch.cumsum(pieces, 0) - pieces
        reps = pieces[pair_query]
        slot_rep = torch.repeat_interleave(pair_slot, reps)
        within = torch.arange(slot_rep.numel(), device=dev) - torch.repeat_interleave(torch.cumsum(reps, 0) - reps, reps)
        pair_query = first_piece[pair_query[slot_rep]] + within
        pair_doc = cand_ids[slot_rep]
        pair_slot = torch.arange(slot_rep.numel(), device=dev)
        target = torch.empty(slot_rep.numel(), dtype=torch.float32, device=dev)
    item_doc, item_start, item_count, sq, ss = build_work_items(pair_doc, pair_query, pair_slot, g)
    ieee, upcast = _flags(q_values)
    _maxsim_kernel[(item_doc.numel(),)](
        q_values, v_offsets, v_offsets.numel() - 1, q_values.stride(0),
        x_values, x_offsets, x_offsets.numel() - 1, x_values.stride(0),
        target, 0,
        item_doc, item_start, item_count, sq, ss,
        1, d, item_doc.numel().bit_length(),
        G=g, LQP=lqp, BLOCK_K=block_k, NUM_K=num_k, EVEN_K=d % block_k == 0, CANDIDATES=True, IEEE=ieee, UPCAST=upcast,
    )
    if owner is not None:
        out.zero_().index_add_(0, slot_rep, target)
    return out
