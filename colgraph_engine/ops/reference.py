"""Pure-torch references: the specification, the test oracle and the last-resort backend.

The math is documented once, in :mod:`colgraph_engine.ops.scoring` (its module docstring;
the public ``maxsim``, ``maxsim_candidates`` and ``maxsim_topk`` there). These functions assume
validated inputs and compute in `acc_dtype` (float32 by default, float64 for the oracle).
Memory stays bounded: the similarity block ``[Tq, Tchunk]`` never exceeds `max_block_elems`.
"""
from __future__ import annotations

import torch

from ..packed import segment_ids

DEFAULT_BLOCK_ELEMS = 1 << 25  # 128 MiB of fp32 similarities at most


def _doc_chunks(d_offsets: torch.Tensor, rows_per_chunk: int):
    """Yields (first_doc, end_doc) so each chunk holds about `rows_per_chunk` tokens (at least one doc)."""
    bounds = d_offsets.tolist()
    n = len(bounds) - 1
    start = 0
    while start < n:
        end = start + 1
        while end < n and bounds[end + 1] - bounds[start] <= rows_per_chunk:
            end += 1
        yield start, end
        start = end


def maxsim_cross_reference(q_values, q_offsets, d_values, d_offsets, acc_dtype=torch.float32,
                           max_block_elems: int = DEFAULT_BLOCK_ELEMS) -> torch.Tensor:
    """``[Nq, Nd]`` scores in `acc_dtype` (see maxsim_cross for the definition)."""
    nq, nd = q_offsets.numel() - 1, d_offsets.numel() - 1
    out = torch.empty((nq, nd), dtype=acc_dtype, device=q_values.device)
    if nd == 0:
        return out
    q = q_values.to(acc_dtype)
    q_seg = segment_ids(q_offsets)
    rows_per_chunk = max(1, max_block_elems // max(1, q.shape[0]))
    for first, end in _doc_chunks(d_offsets.cpu(), rows_per_chunk):
        lo, hi = int(d_offsets[first]), int(d_offsets[end])
        x = d_values[lo:hi].to(acc_dtype)
        sim = q @ x.T  # [Tq, Tc]
        seg = (segment_ids(d_offsets[first:end + 1] - lo)).expand(q.shape[0], -1)
        token_max = torch.full((q.shape[0], end - first), float("-inf"), dtype=acc_dtype, device=q.device)
        token_max.scatter_reduce_(1, seg, sim, reduce="amax", include_self=True)
        out[:, first:end] = torch.zeros((nq, end - first), dtype=acc_dtype, device=q.device).index_add_(0, q_seg, token_max)
    return out


def maxsim_candidates_reference(q_values, q_offsets, d_values, d_offsets, cand_offsets, cand_ids,
                                acc_dtype=torch.float32) -> torch.Tensor:
    """``[C]`` scores: one per listed (query, candidate) pair, in `acc_dtype`."""
    out = torch.empty(cand_ids.numel(), dtype=acc_dtype, device=q_values.device)
    co = cand_offsets.tolist()
    qo = q_offsets.tolist()
    for i in range(len(qo) - 1):
        if co[i + 1] == co[i]:
            continue
        ids = cand_ids[co[i]:co[i + 1]]
        lengths = d_offsets[ids + 1] - d_offsets[ids]
        sub_offsets = torch.zeros(ids.numel() + 1, dtype=torch.int64, device=ids.device)
        torch.cumsum(lengths, 0, out=sub_offsets[1:])
        rows = torch.repeat_interleave(d_offsets[ids], lengths) + (
            torch.arange(int(sub_offsets[-1]), device=ids.device) - torch.repeat_interleave(sub_offsets[:-1], lengths))
        one_q = torch.tensor([0, qo[i + 1] - qo[i]], dtype=torch.int64, device=ids.device)
        scores = maxsim_cross_reference(q_values[qo[i]:qo[i + 1]], one_q, d_values[rows], sub_offsets, acc_dtype)
        out[co[i]:co[i + 1]] = scores[0]
    return out


def pooled_vectors(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``[N, d]`` float32: mean of L2-normalised token vectors, then L2-normalised (zeros stay zero)."""
    n = offsets.numel() - 1
    unit = torch.nn.functional.normalize(values.float(), dim=-1)
    sums = torch.zeros((n, values.shape[1]), dtype=torch.float32, device=values.device)
    sums.index_add_(0, segment_ids(offsets), unit)
    return torch.nn.functional.normalize(sums, dim=-1)
