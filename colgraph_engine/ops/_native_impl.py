"""Adapters from torch tensors to the C++ kernels in ``colgraph_engine._core`` (CPU)."""
from __future__ import annotations

import contextlib
import os
from contextvars import ContextVar

import torch

from .._native import core

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


# A cap on the native kernels' threads for the calls of this thread (context), set by a caller
# that already runs several of them side by side (the adaptive search's parallel groups).
_THREAD_CAP: ContextVar[int | None] = ContextVar("colgraph_native_thread_cap", default=None)


def num_threads() -> int:
    """Worker threads for native kernels: COLGRAPH_NUM_THREADS, else torch's intra-op count
    (at most :func:`thread_cap`'s where one is set)."""
    env = os.environ.get("COLGRAPH_NUM_THREADS", "").strip()
    n = int(env) if env.isdigit() and int(env) > 0 else torch.get_num_threads()
    cap = _THREAD_CAP.get()
    return n if cap is None else max(1, min(n, cap))


@contextlib.contextmanager
def thread_cap(n: int):
    """Caps :func:`num_threads` at `n` for the native calls made inside, in this context only."""
    token = _THREAD_CAP.set(int(n))
    try:
        yield
    finally:
        _THREAD_CAP.reset(token)


def _as_array(values: torch.Tensor):
    values = values.contiguous()
    if values.dtype == torch.float32:
        return values.numpy()
    return values.view(torch.int16).numpy()  # numpy has no bfloat16: pass the bit patterns


def maxsim_cross(q_values, q_offsets, x_values, x_offsets, out=None) -> torch.Tensor:
    nq, nd = q_offsets.numel() - 1, x_offsets.numel() - 1
    if out is None:
        out = torch.empty((nq, nd), dtype=torch.float32)
    core.maxsim_cross(_as_array(q_values), q_offsets.contiguous().numpy(), _as_array(x_values),
                      x_offsets.contiguous().numpy(), out.numpy(), _DTYPE_NAMES[q_values.dtype], num_threads())
    return out


def maxsim_candidates(q_values, q_offsets, x_values, x_offsets, cand_offsets, cand_ids, out=None) -> torch.Tensor:
    if out is None:
        out = torch.empty(cand_ids.numel(), dtype=torch.float32)
    core.maxsim_candidates(_as_array(q_values), q_offsets.contiguous().numpy(), _as_array(x_values),
                           x_offsets.contiguous().numpy(), cand_offsets.contiguous().numpy(),
                           cand_ids.contiguous().numpy(), out.numpy(), _DTYPE_NAMES[q_values.dtype],
                           num_threads())
    return out
