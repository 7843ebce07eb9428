"""Fused MaxSim on tensor cores: ``score = sum_i max_j <q_i, x_j>`` per (query, document) pair.

Tile: a program scores G queries at once. Their tokens form the rows of a ``[BLOCK_M = G * LQP, d]``
tile (query g occupies rows g*LQP .. g*LQP + len_g - 1; rows past a query's length never score).
A document streams through in ``[BLOCK_N, d]`` tiles multiplied on tensor cores; the running
max per row stays in registers, so the ``[Tq, Td]`` similarity matrix never reaches memory.

No masks in the streaming loop: the rows of a document's last, partial tile are clamped to its
last row (``min(row, end - 1)``). A repeated row cannot change a max, every load stays inside
the document, and the loads stay unpredicated 16-byte copies. An empty document runs no tile
and scores ``-inf`` (a max over nothing); a query row past the query's length adds 0.

Persistent grids (one wave of programs that loop), in document order:
  * cross:      program p keeps query group ``p % n_groups`` resident and walks documents
                ``p // n_groups, + stride, ...`` (stride = programs / n_groups): the programs
                that share a document run side by side, so it is read from HBM once and served
                from L2 to the other query groups. The documents' tiles form ONE loop (written
                flat: Triton's ``flatten=True`` leaves nests whose inner trip count varies), so
                the pipeliner fetches the next document's first tiles while the current one
                finishes (TTGIR: async copies two tiles ahead across document ends).
  * candidates: work items of exactly G queries of one document (G in 1, 2, 4, 8: a document
                listed by k queries becomes items of 8, then 4, 2, 1 by the bits of k % 8),
                one launch per bucket, items in document order. The lists are built on the
                device without data-dependent sizes; the item count stays on the device and
                the program loop reads it (no host wait).

Queries longer than MAX_LQP tokens are scored in pieces of MAX_LQP tokens inside the program
(sums over disjoint token sets add exactly), so nothing is split or gathered on the host.
Row offsets are int64: products such as row * d pass 2^31 on large stores.

The launchers take the queries' lengths from the host (the callers hold them: see
:mod:`colgraph_engine.ops.scoring` and :class:`colgraph_engine.store.PackedStore`) and never
read a device tensor: a call is a few device ops and one launch per bucket.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "") == "1"
MAX_LQP = 128       # most rows one query occupies in a tile; longer queries run in pieces
CROSS_ROWS = 256    # query rows per cross program when queries are short (8 queries of <= 32 tokens)
WIDE_ROWS = 64      # rows wider than 256 bytes (d > 128 in 16 bits): smaller tiles fit without spills
FP32_ROWS = 32      # float32 products run on FMA units (exact) with both operands in registers
BUCKETS = (8, 4, 2, 1)  # queries per candidate work item
# Resident programs per SM the persistent grids plan for: every kept config reaches this in the
# compile table (benchmarks/results/kernel_compile.md); more programs than SMs x 2 would queue.
PROGRAMS_PER_SM = 2

# (BLOCK_N, num_warps, num_stages) kept per tile height (rows = G * LQP), from the sm_90 / sm_80
# compile table: no spills and >= 2 resident programs per SM on both. Two at most per height,
# so a store's shapes compile a handful of kernels, not dozens (the benchmark's budget).
KEPT = {
    16: ((64, 4, 3),),
    32: ((64, 4, 3),),                   # the 1-query path: memory bound, tiles in flight
    64: ((64, 4, 3),),
    128: ((64, 4, 3), (32, 8, 3)),       # BLOCK_N 64 at 8 warps: 1 program per SM on sm_80
    256: ((32, 8, 3), (32, 4, 3)),       # BLOCK_N 64 here: 1 program per SM, or spills
}
# Rows wider than 256 bytes (bf16/fp16 d > 128, any fp32): Q and the staged document tiles take
# more shared memory and the products more registers, so one narrow config (compile table:
# the wide rows) replaces the table above.
WIDE = (32, 4, 2)


def _is_wide(d: int, fp32: bool) -> bool:
    return fp32 or d > 128


def _configs():
    if INTERPRET:  # one small config: the interpreter is exact but slow
        return [triton.Config({"BLOCK_N": 64}, num_warps=4, num_stages=1)]
    kept = sorted({c for per_height in KEPT.values() for c in per_height} | {WIDE})
    return [triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=s) for bn, w, s in kept]


def _prune_configs(configs, named_args, **kwargs):
    """Keeps the configs of :data:`KEPT` for this tile height (all of them under the interpreter)."""
    if INTERPRET:
        return configs
    args = {**named_args, **kwargs}
    rows = args["G"] * args["LQP"]
    kept = (WIDE,) if _is_wide(args["D"], args["IEEE"]) else KEPT.get(rows, KEPT[256])
    return [c for c in configs if (c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) in kept] or configs[:1]


# -------------------------------------------------------------------------------------------
# Device helpers
# -------------------------------------------------------------------------------------------

@triton.jit
def _load_q(q_ptr, q_rows, row_valid, k0, D: tl.constexpr,
            BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr):
    """``[BLOCK_M, BLOCK_K]`` query rows, columns k0 .. k0 + BLOCK_K (zeros where not a token)."""
    cols = k0 + tl.arange(0, BLOCK_K)
    ptrs = q_ptr + q_rows[:, None] * D + cols[None, :]
    if EVEN_K:
        q = tl.load(ptrs, mask=row_valid[:, None], other=0.0)
    else:
        q = tl.load(ptrs, mask=row_valid[:, None] & (cols < D)[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    return q


@triton.jit
def _load_x(x_ptr, x_rows, k0, D: tl.constexpr,
            BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr):
    """``[BLOCK_N, BLOCK_K]`` document rows (already clamped inside the document)."""
    cols = k0 + tl.arange(0, BLOCK_K)
    ptrs = x_ptr + x_rows[:, None] * D + cols[None, :]
    if EVEN_K:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=(cols < D)[None, :], other=0.0)
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def _dot(a, b_t, acc, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, tl.trans(b_t), acc, input_precision="ieee")
    return tl.dot(a, tl.trans(b_t), acc)


@triton.jit
def _doc_row_max(q, q_ptr, q_rows, row_valid, x_ptr, x_start, x_end, D: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_K: tl.constexpr,
                 EVEN_K: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """``[BLOCK_M]`` fp32: per query row, the max over the document's rows (-inf when empty).

    `q` is the resident query tile when NUM_K == 1; otherwise the query columns are loaded
    chunk by chunk beside the document's. The max is kept element-wise in a
    ``[BLOCK_M, BLOCK_N]`` register tile and reduced across columns once at the end.
    """
    best = tl.full([BLOCK_M, BLOCK_N], float("-inf"), dtype=tl.float32)
    n_tiles = tl.cdiv(x_end - x_start, BLOCK_N).to(tl.int32)
    last = x_end - 1
    for t in range(n_tiles):
        x_rows = tl.minimum(x_start + t * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64), last)
        s = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        if NUM_K == 1:
            s = _dot(q, _load_x(x_ptr, x_rows, 0, D, BLOCK_K, EVEN_K, UPCAST), s, IEEE)
        else:
            for kk in tl.static_range(NUM_K):
                qk = _load_q(q_ptr, q_rows, row_valid, kk * BLOCK_K, D, BLOCK_K, False, UPCAST)
                xk = _load_x(x_ptr, x_rows, kk * BLOCK_K, D, BLOCK_K, False, UPCAST)
                s = _dot(qk, xk, s, IEEE)
        best = tl.maximum(best, s)
    return tl.max(best, axis=1)


@triton.jit
def _sum_per_query(row_max, row_valid, G: tl.constexpr, LQP: tl.constexpr):
    """``[G]``: rows that are not query tokens add nothing."""
    return tl.sum(tl.reshape(tl.where(row_valid, row_max, 0.0), [G, LQP]), axis=1)


@triton.jit
def _stream_docs(q, row_valid, first_q, n_queries, x_ptr, x_offsets_ptr, first_doc, n_docs, doc_stride,
                 out_ptr, out_row_stride, D: tl.constexpr, G: tl.constexpr, LQP: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr,
                 UPCAST: tl.constexpr):
    """Documents first_doc, + doc_stride, ... against the resident query tile `q`, as ONE loop
    over all their tiles (not a loop per document), so the pipeliner keeps the next document's
    first tiles in flight while the current one ends. Triton's own loop flattening (tl.range
    flatten=True) fuses only inner loops whose bounds do not depend on the outer loop, and a
    document's tile count does, so the loop is written flat here. An empty document takes one
    (discarded) tile, so every document has a last tile at which its scores are stored."""
    BLOCK_M: tl.constexpr = G * LQP
    total = 0
    for doc in range(first_doc, n_docs, doc_stride):
        n = tl.load(x_offsets_ptr + doc + 1) - tl.load(x_offsets_ptr + doc)
        total += tl.maximum(tl.cdiv(n, BLOCK_N), 1).to(tl.int32)
    doc = first_doc
    has_doc = doc < n_docs
    x_start = tl.load(x_offsets_ptr + doc, mask=has_doc, other=0)
    x_end = tl.load(x_offsets_ptr + doc + 1, mask=has_doc, other=0)
    n0 = x_start
    best = tl.full([BLOCK_M, BLOCK_N], float("-inf"), dtype=tl.float32)
    for _ in range(total):
        x_rows = tl.maximum(tl.minimum(n0 + tl.arange(0, BLOCK_N).to(tl.int64), x_end - 1), 0)
        x = _load_x(x_ptr, x_rows, 0, D, BLOCK_K, EVEN_K, UPCAST)
        best = tl.maximum(best, _dot(q, x, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IEEE))
        n0 += BLOCK_N
        last = n0 >= x_end  # the document's last tile (or its only, discarded one when empty)
        if last:
            m = tl.where(x_end > x_start, tl.max(best, axis=1), float("-inf"))
            tl.store(out_ptr + first_q.to(tl.int64) * out_row_stride + doc,
                     _sum_per_query(m, row_valid, G, LQP), mask=first_q < n_queries)
            best = tl.full([BLOCK_M, BLOCK_N], float("-inf"), dtype=tl.float32)
        # The next tile's position by selects, not inside the branch: the pipeliner can then
        # compute addresses ahead (offsets of the next document are read every tile, from L1).
        nxt = doc + doc_stride
        nxt_start = tl.load(x_offsets_ptr + nxt, mask=nxt < n_docs, other=0)
        nxt_end = tl.load(x_offsets_ptr + nxt + 1, mask=nxt < n_docs, other=0)
        doc = tl.where(last, nxt, doc)
        x_start = tl.where(last, nxt_start, x_start)
        x_end = tl.where(last, nxt_end, x_end)
        n0 = tl.where(last, nxt_start, n0)


# -------------------------------------------------------------------------------------------
# Kernels
# -------------------------------------------------------------------------------------------

# Sizes that vary per call are not specialised (an int equal to 1, or divisible by 16, would
# otherwise compile a kernel of its own); strides and D stay specialised: their divisibility by
# 16 is what lets the loads become 16-byte vectors.
@triton.autotune(configs=_configs(), key=["D", "G", "LQP", "NUM_K", "IEEE", "PIECED"],
                 prune_configs_by={"early_config_prune": _prune_configs}, cache_results=True)
@triton.jit(do_not_specialize=["n_queries", "n_docs", "out_row_stride", "n_groups", "n_pieces"])
def _cross_kernel(
    q_ptr, q_offsets_ptr, n_queries, x_ptr, x_offsets_ptr, n_docs,
    out_ptr, out_row_stride, n_groups, n_pieces,
    D: tl.constexpr, G: tl.constexpr, LQP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_K: tl.constexpr,
    EVEN_K: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr, PIECED: tl.constexpr,
):
    """``out[q, doc]`` for every query and document. Grid: n_groups * docs-per-group programs."""
    BLOCK_M: tl.constexpr = G * LQP
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    group = pid % n_groups
    rows = tl.arange(0, BLOCK_M)
    tok = (rows % LQP).to(tl.int64)
    query = group * G + rows // LQP
    q_ok = query < n_queries
    q_start = tl.load(q_offsets_ptr + query, mask=q_ok, other=0)
    q_len = tl.load(q_offsets_ptr + query + 1, mask=q_ok, other=0) - q_start
    first_q = group * G + tl.arange(0, G)
    # The query tile stays resident for every document of this program.
    valid0 = q_ok & (tok < q_len)
    q = _load_q(q_ptr, q_start + tok, valid0, 0, D, BLOCK_K, EVEN_K, UPCAST)
    first_doc = pid // n_groups
    doc_stride = n_prog // n_groups
    if NUM_K == 1 and not PIECED:
        _stream_docs(q, valid0, first_q, n_queries, x_ptr, x_offsets_ptr, first_doc, n_docs, doc_stride,
                     out_ptr, out_row_stride, D, G, LQP, BLOCK_N, BLOCK_K, EVEN_K, IEEE, UPCAST)
        return
    for doc in range(first_doc, n_docs, doc_stride):
        x_start = tl.load(x_offsets_ptr + doc)
        x_end = tl.load(x_offsets_ptr + doc + 1)
        if PIECED:  # queries longer than LQP: one pass over the document per piece of LQP tokens
            total = tl.zeros([G], dtype=tl.float32)
            for p in range(n_pieces):
                ptok = p * LQP + tok
                valid = q_ok & (ptok < q_len)
                qp = _load_q(q_ptr, q_start + ptok, valid, 0, D, BLOCK_K, EVEN_K, UPCAST)
                m = _doc_row_max(qp, q_ptr, q_start + ptok, valid, x_ptr, x_start, x_end,
                                 D, BLOCK_M, BLOCK_N, BLOCK_K, NUM_K, EVEN_K, IEEE, UPCAST)
                total += _sum_per_query(m, valid, G, LQP)
        else:
            m = _doc_row_max(q, q_ptr, q_start + tok, valid0, x_ptr, x_start, x_end,
                             D, BLOCK_M, BLOCK_N, BLOCK_K, NUM_K, EVEN_K, IEEE, UPCAST)
            total = _sum_per_query(m, valid0, G, LQP)
        tl.store(out_ptr + first_q.to(tl.int64) * out_row_stride + doc, total, mask=first_q < n_queries)


@triton.autotune(configs=_configs(), key=["D", "G", "LQP", "NUM_K", "IEEE", "PIECED"],
                 prune_configs_by={"early_config_prune": _prune_configs}, cache_results=True)
# item_start and n_items are rows / elements of one [buckets, C + 1] tensor: their addresses
# alignment varies with the number of pairs, which would otherwise compile one kernel per
# alignment (they are read one scalar at a time: alignment buys nothing).
@triton.jit(do_not_specialize=["n_pieces"], do_not_specialize_on_alignment=["item_start_ptr", "n_items_ptr"])
def _candidates_kernel(
    q_ptr, q_offsets_ptr, x_ptr, x_offsets_ptr,
    out_ptr, pair_doc_ptr, pair_query_ptr, pair_slot_ptr, item_start_ptr, n_items_ptr, n_pieces,
    D: tl.constexpr, G: tl.constexpr, LQP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_K: tl.constexpr,
    EVEN_K: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr, PIECED: tl.constexpr,
):
    """One score per pair of each work item: G (query, slot) pairs of one document.
    The item count is read here, on the device; programs past it do nothing."""
    BLOCK_M: tl.constexpr = G * LQP
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    n_items = tl.load(n_items_ptr)
    rows = tl.arange(0, BLOCK_M)
    local_q = rows // LQP
    tok = (rows % LQP).to(tl.int64)
    for item in range(pid, n_items, n_prog):  # per item a new query tile: not flattened
        start = tl.load(item_start_ptr + item)
        doc = tl.load(pair_doc_ptr + start)
        query = tl.load(pair_query_ptr + start + local_q)
        q_start = tl.load(q_offsets_ptr + query)
        q_len = tl.load(q_offsets_ptr + query + 1) - q_start
        x_start = tl.load(x_offsets_ptr + doc)
        x_end = tl.load(x_offsets_ptr + doc + 1)
        if PIECED:
            total = tl.zeros([G], dtype=tl.float32)
            for p in range(n_pieces):
                ptok = p * LQP + tok
                valid = ptok < q_len
                qp = _load_q(q_ptr, q_start + ptok, valid, 0, D, BLOCK_K, EVEN_K, UPCAST)
                m = _doc_row_max(qp, q_ptr, q_start + ptok, valid, x_ptr, x_start, x_end,
                                 D, BLOCK_M, BLOCK_N, BLOCK_K, NUM_K, EVEN_K, IEEE, UPCAST)
                total += _sum_per_query(m, valid, G, LQP)
        else:
            valid = tok < q_len
            q = _load_q(q_ptr, q_start + tok, valid, 0, D, BLOCK_K, EVEN_K, UPCAST)
            m = _doc_row_max(q, q_ptr, q_start + tok, valid, x_ptr, x_start, x_end,
                             D, BLOCK_M, BLOCK_N, BLOCK_K, NUM_K, EVEN_K, IEEE, UPCAST)
            total = _sum_per_query(m, valid, G, LQP)
        slot = tl.load(pair_slot_ptr + start + tl.arange(0, G))
        tl.store(out_ptr + slot, total)


# ------------------------------------------------------------------------------------------
# Launch planning (host only: sizes and lengths the caller already holds)
# ------------------------------------------------------------------------------------------

def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@functools.lru_cache(maxsize=256)
def tile_plan(max_len: int, n_queries: int, d: int, rows: int = CROSS_ROWS,
              fp32: bool = False) -> tuple[int, int, int, int, int, bool]:
    """``(G, LQP, n_pieces, BLOCK_K, NUM_K, EVEN_K)`` for queries of at most `max_len` tokens.

    LQP is the query length rounded up to a power of two (at most MAX_LQP; longer queries run in
    ``n_pieces`` pieces); G fills `rows` query rows, no more groups than queries, and at
    least 16 rows (the smallest tensor-core tile)."""
    lqp = min(MAX_LQP, rows, _next_pow2(max(1, max_len)))
    pieces = max(1, -(-max_len // lqp))
    g = max(1, min(rows // lqp, _next_pow2(max(1, n_queries))))
    while g * lqp < 16:
        g *= 2
    block_k = _next_pow2(max(d, 16))
    if fp32 and not INTERPRET:  # FMA products hold both operands in registers: narrow column chunks
        block_k = min(block_k, 32)
    elif block_k > 256:  # wider rows are scored in chunks of 128 columns (256 spills)
        block_k = 128
    return g, lqp, pieces, block_k, -(-d // block_k), d % block_k == 0


def _rows(d: int, fp32: bool) -> int:
    """Most query rows per tile for this row width (the compile table's limits)."""
    return FP32_ROWS if fp32 else WIDE_ROWS if _is_wide(d, fp32) else CROSS_ROWS


def _flags(values: torch.Tensor) -> tuple[bool, bool]:
    ieee = values.dtype == torch.float32
    # The interpreter computes bf16/fp16 products wrongly; widen loads there.
    upcast = INTERPRET and values.dtype != torch.float32
    return ieee, upcast


@functools.lru_cache(maxsize=16)
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 2  # the interpreter: a small grid still exercises the persistent loops


def max_programs(device: torch.device) -> int:
    """Programs of one persistent wave on `device` (SMs x :data:`PROGRAMS_PER_SM`)."""
    return _sm_count(device) * PROGRAMS_PER_SM


def _lengths_info(q_lengths) -> tuple[int, int]:
    """(number of queries, longest) from host lengths (a list/tuple of ints or a CPU tensor)."""
    if isinstance(q_lengths, torch.Tensor):
        if q_lengths.device.type != "cpu":
            raise AssertionError("q_lengths must live on the host")  # a caller bug, not user input
        n = q_lengths.numel()
        return n, int(q_lengths.max()) if n else 0
    return len(q_lengths), max(q_lengths, default=0)


def maxsim_cross(q_values, q_offsets, x_values, x_offsets, out=None, *, q_lengths) -> torch.Tensor:
    """``[Nq, Nd]`` fp32 scores. `q_lengths`: the queries' token counts, on the host.
    `out`, when given, must be a contiguous fp32 ``[Nq, Nd]``."""
    nq, nd, d = q_offsets.shape[0] - 1, x_offsets.shape[0] - 1, q_values.shape[1]
    if out is None:
        out = torch.empty((nq, nd), dtype=torch.float32, device=q_values.device)
    if nq == 0 or nd == 0:
        return out
    q_values, x_values = q_values.contiguous(), x_values.contiguous()
    _, max_len = _lengths_info(q_lengths)
    fp32 = q_values.dtype == torch.float32
    g, lqp, pieces, block_k, num_k, even_k = tile_plan(max_len, nq, d, _rows(d, fp32), fp32)
    n_groups = -(-nq // g)
    per_group = max(1, min(nd, max_programs(q_values.device) // n_groups))
    ieee, upcast = _flags(q_values)
    _cross_kernel[(n_groups * per_group,)](
        q_values, q_offsets, nq, x_values, x_offsets, nd,
        out, out.stride(0), n_groups, pieces, D=d,
        G=g, LQP=lqp, BLOCK_K=block_k, NUM_K=num_k, EVEN_K=even_k, IEEE=ieee, UPCAST=upcast,
        PIECED=pieces > 1,
    )
    return out


def bucket_work(pair_doc: torch.Tensor, pair_query: torch.Tensor, pair_slot: torch.Tensor, n_docs: int,
                buckets=BUCKETS):
    """Cuts (doc, query, slot) pairs into work items of exactly G pairs of one document.

    A document listed by k queries gives k // 8 items of 8, then one item of 4, 2 and 1 for each
    bit set in k % 8. Device ops only, every size known on the host (no nonzero, no sync).

    Returns ``(sorted pair_doc [C], sorted pair_query [C], sorted pair_slot [C], {G: (item_start
    [C + 1], n_items [1])})``: items of bucket G start at ``item_start[:n_items]`` (indices into
    the sorted pairs); entries past ``n_items`` are unused. About 40 small device ops in all.
    """
    c = pair_doc.shape[0]
    dev = pair_doc.device
    order = torch.sort(pair_doc, stable=True).indices
    sd, sq, ss = pair_doc[order], pair_query[order], pair_slot[order]
    idx = torch.arange(c, device=dev)
    new_run = torch.ones(c, dtype=torch.bool, device=dev)
    new_run[1:] = sd[1:] != sd[:-1]
    run_first = torch.cummax(torch.where(new_run, idx, 0), 0).values
    per_doc = torch.zeros(n_docs, dtype=torch.int64, device=dev).index_add_(0, sd, torch.ones_like(sd))
    k = per_doc[sd]                      # pairs of this pair's document
    j = idx - run_first                  # rank of the pair within its document
    # The bucket of each pair and whether it starts its item, for all buckets at once: the largest
    # size takes k // big * big pairs of a document; the rest r = k % big splits by its bits,
    # larger first (r = 7: ranks 0-3 in a 4, 4-5 in a 2, 6 in a 1).
    big = buckets[0]
    full = k // big * big
    in_full = j < full
    rest, r = j - full, k - full
    which = torch.full_like(k, len(buckets) - 1)  # the smallest size, 1: every pair starts an item
    start = torch.ones_like(in_full)
    before = torch.zeros_like(k)                  # remainder pairs in larger items than size b
    for i, b in enumerate(buckets[1:-1], start=1):
        has = (r & b) != 0
        in_b = has & (rest >= before) & (rest < before + b)
        which = torch.where(in_b, i, which)
        start = torch.where(in_b, rest == before, start)
        before = before + torch.where(has, b, 0)
    which = torch.where(in_full, 0, which)
    start = torch.where(in_full, j % big == 0, start)
    # Item index within its bucket = starts of that bucket so far; one cumsum for all buckets.
    nb = len(buckets)
    starts = (which[None, :] == torch.arange(nb, device=dev)[:, None]) & start[None, :]  # [nb, C]
    cum = torch.cumsum(starts.to(torch.int64), 1)
    item_start = torch.zeros((nb, c + 1), dtype=torch.int64, device=dev)
    # Starts land at their item index; every other pair writes the spare last entry.
    item_start.scatter_(1, torch.where(starts, cum - 1, c), idx.expand(nb, c))
    n_items = cum[:, -1] if c else torch.zeros(nb, dtype=torch.int64, device=dev)
    items = {b: (item_start[i], n_items[i:i + 1]) for i, b in enumerate(buckets)}
    return sd, sq, ss, items


def maxsim_candidates(q_values, q_offsets, x_values, x_offsets, cand_offsets, cand_ids, out=None, *,
                      q_lengths, cand_counts=None) -> torch.Tensor:
    """``[C]`` fp32: one score per listed (query, candidate document) pair.

    `q_lengths`: the queries' token counts on the host. `cand_counts`: candidates per query on
    the host when the caller has them; otherwise the owner of each pair is found on the device
    by a binary search in `cand_offsets`.
    """
    n_cand, d = cand_ids.shape[0], q_values.shape[1]
    dev = q_values.device
    if out is None:
        out = torch.empty(n_cand, dtype=torch.float32, device=dev)
    if n_cand == 0:
        return out
    q_values, x_values = q_values.contiguous(), x_values.contiguous()
    nq, nd = q_offsets.shape[0] - 1, x_offsets.shape[0] - 1
    _, max_len = _lengths_info(q_lengths)
    slots = torch.arange(n_cand, device=dev)
    if cand_counts is not None:
        counts = torch.as_tensor(cand_counts, dtype=torch.int64)
        # through pinned memory: a copy from pageable memory may make the host wait
        counts = counts.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else counts.to(dev)
        pair_query = torch.repeat_interleave(torch.arange(nq, device=dev), counts, output_size=n_cand)
    else:
        pair_query = torch.searchsorted(cand_offsets, slots, right=True) - 1
    fp32 = q_values.dtype == torch.float32
    rows = _rows(d, fp32)
    lqp = tile_plan(max_len, 1, d, rows, fp32)[1]
    buckets = tuple(b for b in BUCKETS if b * lqp <= rows or b == 1)
    sd, sq, ss, items = bucket_work(cand_ids, pair_query, slots, nd, buckets)
    ieee, upcast = _flags(q_values)
    wave = max_programs(dev)
    for gsz, (item_start, n_items) in items.items():
        _, lqp, pieces, block_k, num_k, even_k = tile_plan(max_len, gsz, d, gsz * lqp, fp32)
        lqp = max(lqp, 16 // gsz)  # at least 16 rows per tile
        _candidates_kernel[(max(1, min(wave, n_cand // gsz)),)](
            q_values, q_offsets, x_values, x_offsets,
            out, sd, sq, ss, item_start, n_items, pieces, D=d,
            G=gsz, LQP=lqp, BLOCK_K=block_k, NUM_K=num_k, EVEN_K=even_k, IEEE=ieee, UPCAST=upcast,
            PIECED=pieces > 1,
        )
    return out
