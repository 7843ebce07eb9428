"""Late-interaction scoring over packed multi-vectors.

For a query with token vectors ``q_1..q_L`` and a document with token vectors ``x_1..x_M``::

    MaxSim(q, x) = sum_{i=1..L} max_{j=1..M} <q_i, x_j>

accumulated in float32 whatever the input dtype (float32, float16, bfloat16). With
``normalize=True`` every token vector is first scaled to unit L2 norm (zero vectors stay zero),
so each term is a cosine. Edge cases, by the same formula: an **empty document** (M = 0)
scores ``-inf`` against any non-empty query (a max over nothing), so it ranks last; an
**empty query** (L = 0) scores ``0`` against every document (a sum over nothing). Padding does
not exist: items are packed (see :mod:`colgraph_engine.packed`), so nothing but real tokens
can score.

Every public function validates, resolves a backend once (:mod:`colgraph_engine.backend`), and
calls the implementation. Queries and documents must share dtype, dimension and device.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import backend as _backend
from ..packed import check_offsets, check_packed
from . import reference


# ------------------------------------------------------------------------------------------
# Implementations behind the dispatch (inputs already validated)
# ------------------------------------------------------------------------------------------

def _cross_impl(name, qv, qo, xv, xo, out=None):
    if name == "triton":
        from ..kernels import maxsim as tk
        return tk.maxsim_cross(qv, qo, xv, xo, out)
    if name == "native":
        from . import _native_impl
        return _native_impl.maxsim_cross(qv, qo, xv, xo, out)
    res = reference.maxsim_cross_reference(qv, qo, xv, xo)
    return res if out is None else out.copy_(res)


def _candidates_impl(name, qv, qo, xv, xo, co, ci, out=None):
    if name == "triton":
        from ..kernels import maxsim as tk
        return tk.maxsim_candidates(qv, qo, xv, xo, co, ci, out)
    if name == "native":
        from . import _native_impl
        return _native_impl.maxsim_candidates(qv, qo, xv, xo, co, ci, out)
    res = reference.maxsim_candidates_reference(qv, qo, xv, xo, co, ci)
    return res if out is None else out.copy_(res)


def _unit(values: torch.Tensor) -> torch.Tensor:
    return F.normalize(values.float(), dim=-1).to(values.dtype)


def _check_pair(q_values, q_offsets, d_values, d_offsets):
    qv, qo = check_packed(q_values, q_offsets, "queries")
    xv, xo = check_packed(d_values, d_offsets, "docs")
    if qv.dtype != xv.dtype:
        raise TypeError(f"queries_values: expected the documents' dtype {xv.dtype}, got {qv.dtype}")
    if qv.shape[1] != xv.shape[1]:
        raise ValueError(f"queries_values: expected dimension d={xv.shape[1]} (the documents'), got {qv.shape[1]}")
    if qv.device != xv.device:
        raise ValueError(f"queries_values: expected the documents' device {xv.device}, got {qv.device}")
    return qv, qo, xv, xo


def _check_bool(value, name):
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")


# ------------------------------------------------------------------------------------------
# Public operations
# ------------------------------------------------------------------------------------------

def maxsim(queries_values: torch.Tensor, queries_offsets: torch.Tensor,
           docs_values: torch.Tensor, docs_offsets: torch.Tensor, *,
           normalize: bool = False, backend: str | None = None) -> torch.Tensor:
    """Cross scores of every query against every document.

    Args:
        queries_values: ``[Tq, d]`` query token vectors, packed.
        queries_offsets: ``[Nq+1]`` int64 offsets into `queries_values`.
        docs_values: ``[Td, d]`` document token/patch vectors, packed (same dtype and device).
        docs_offsets: ``[Nd+1]`` int64 offsets into `docs_values`.
        normalize: L2-normalise every token vector first.
        backend: ``"triton"``, ``"native"``, ``"torch"`` or None (automatic).

    Returns:
        ``[Nq, Nd]`` float32 on the inputs' device: ``out[i, j] = MaxSim(query i, document j)``.
    """
    qv, qo, xv, xo = _check_pair(queries_values, queries_offsets, docs_values, docs_offsets)
    _check_bool(normalize, "normalize")
    name = _backend.resolve("maxsim", qv.device, backend)
    if normalize:
        qv, xv = _unit(qv), _unit(xv)
    return _cross_impl(name, qv, qo, xv, xo)


def check_candidates(cand_offsets, cand_ids, n_queries: int, n_docs: int, device: torch.device):
    """Validates a CSR candidate list: ``cand_offsets [Nq+1]`` over ``cand_ids [C]`` in ``[0, n_docs)``."""
    if not isinstance(cand_ids, torch.Tensor):
        raise TypeError(f"cand_ids: expected a torch.int64 tensor, got {type(cand_ids).__name__}")
    if cand_ids.dtype != torch.int64:
        raise TypeError(f"cand_ids: expected dtype torch.int64, got {cand_ids.dtype}")
    if cand_ids.dim() != 1:
        raise ValueError(f"cand_ids: expected shape [C], got {tuple(cand_ids.shape)}")
    if cand_ids.device != device:
        raise ValueError(f"cand_ids: expected device {device}, got {cand_ids.device}")
    co = check_offsets(cand_offsets, cand_ids.numel(), device, "cand_offsets")
    if co.numel() != n_queries + 1:
        raise ValueError(f"cand_offsets: expected length n_queries + 1 = {n_queries + 1}, got {co.numel()}")
    if cand_ids.numel():
        lo, hi = torch.stack([cand_ids.min(), cand_ids.max()]).tolist()  # one sync
        if lo < 0 or hi >= n_docs:
            bad = lo if lo < 0 else hi
            raise ValueError(f"cand_ids: expected ids in [0, {n_docs}) (documents), got {bad}")
    return co, cand_ids


def maxsim_candidates(queries_values: torch.Tensor, queries_offsets: torch.Tensor,
                      docs_values: torch.Tensor, docs_offsets: torch.Tensor,
                      cand_offsets: torch.Tensor, cand_ids: torch.Tensor, *,
                      normalize: bool = False, backend: str | None = None) -> torch.Tensor:
    """Scores each query against its own candidate documents only (graph-restricted rerank).

    Query i's candidates are ``cand_ids[cand_offsets[i]:cand_offsets[i+1]]`` (CSR). Every listed
    pair is scored exactly; an id may repeat, and a query may list nothing.

    Args:
        cand_offsets: ``[Nq+1]`` int64, CSR offsets into `cand_ids`.
        cand_ids: ``[C]`` int64 document indices in ``[0, Nd)``.
        (others as in :func:`maxsim`)

    Returns:
        ``[C]`` float32: ``out[c] = MaxSim(query owning c, document cand_ids[c])``.
    """
    qv, qo, xv, xo = _check_pair(queries_values, queries_offsets, docs_values, docs_offsets)
    co, ci = check_candidates(cand_offsets, cand_ids, qo.numel() - 1, xo.numel() - 1, qv.device)
    _check_bool(normalize, "normalize")
    name = _backend.resolve("maxsim_candidates", qv.device, backend)
    if normalize:
        qv, xv = _unit(qv), _unit(xv)
    return _candidates_impl(name, qv, qo, xv, xo, co, ci)


def _merge_topk(best_s, best_i, best_dead, s, idx, dead, k):
    """Keeps the k best of (previous best ++ this chunk). Ties: live before dead, then lower index."""
    s_all = torch.cat([best_s, s], 1)
    i_all = torch.cat([best_i, idx], 1)
    if dead is not None:
        d_all = torch.cat([best_dead, dead], 1)
        order = torch.sort(d_all.to(torch.int8), dim=1, stable=True).indices  # secondary key first
        s_all, i_all, d_all = (t.gather(1, order) for t in (s_all, i_all, d_all))
    order = torch.sort(s_all, dim=1, descending=True, stable=True).indices[:, :k]
    out = (s_all.gather(1, order), i_all.gather(1, order))
    return out + ((d_all.gather(1, order),) if dead is not None else (None,))


def topk_scan(qv, qo, xv, xo, k: int, name: str, alive: torch.Tensor | None = None,
              chunk_docs: int | None = None):
    """Exact top-k by scanning documents in chunks (inputs validated). See :func:`maxsim_topk`."""
    nq, nd = qo.numel() - 1, xo.numel() - 1
    n_live = nd if alive is None else int(alive.sum())
    k = min(k, n_live)
    dev = qv.device
    best_s = torch.empty((nq, 0), dtype=torch.float32, device=dev)
    best_i = torch.empty((nq, 0), dtype=torch.int64, device=dev)
    best_dead = torch.empty((nq, 0), dtype=torch.bool, device=dev) if alive is not None else None
    if k == 0:
        return best_s, best_i
    chunk = chunk_docs or max(1024, (1 << 24) // max(1, nq))
    starts = list(range(0, nd, chunk)) + [nd]
    row_of = dict(zip(starts, xo[torch.tensor(starts, device=xo.device)].tolist()))  # only chunk edges
    for a in starts[:-1]:
        b = min(nd, a + chunk)
        sub_x = xv[row_of[a]:row_of[b]]
        sub_o = xo[a:b + 1] - row_of[a]
        s = _cross_impl(name, qv, qo, sub_x, sub_o)
        idx = torch.arange(a, b, device=dev).expand(nq, -1)
        dead = None
        if alive is not None:
            dead = (~alive[a:b]).expand(nq, -1)
            s = s.masked_fill(dead, float("-inf"))
        best_s, best_i, best_dead = _merge_topk(best_s, best_i, best_dead, s, idx, dead, k)
    return best_s, best_i


def maxsim_topk(queries_values: torch.Tensor, queries_offsets: torch.Tensor,
                docs_values: torch.Tensor, docs_offsets: torch.Tensor, k: int, *,
                alive: torch.Tensor | None = None, chunk_docs: int | None = None,
                normalize: bool = False, backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k documents per query by MaxSim, scanning the collection in chunks.

    Peak extra memory is one ``[Nq, chunk_docs]`` score block (plus the backend's own bounded
    working set), whatever the number of documents.

    Args:
        k: documents to return per query (int >= 1); clipped to the number of live documents.
        alive: optional ``[Nd]`` bool mask; documents with False are never returned.
        chunk_docs: documents scored per step (default: about 16M scores per block).
        (others as in :func:`maxsim`)

    Returns:
        ``(scores [Nq, k'], indices [Nq, k'])``, float32 and int64, best first, with
        ``k' = min(k, live documents)``. Equal scores are ordered by lower document index.
    """
    qv, qo, xv, xo = _check_pair(queries_values, queries_offsets, docs_values, docs_offsets)
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k: expected an int, got {type(k).__name__}")
    if k <= 0:
        raise ValueError(f"k: expected k >= 1, got {k}")
    if chunk_docs is not None and (isinstance(chunk_docs, bool) or not isinstance(chunk_docs, int) or chunk_docs <= 0):
        raise ValueError(f"chunk_docs: expected a positive int, got {chunk_docs!r}")
    nd = xo.numel() - 1
    if alive is not None:
        if not isinstance(alive, torch.Tensor) or alive.dtype != torch.bool:
            raise TypeError(f"alive: expected a torch.bool tensor, got {getattr(alive, 'dtype', type(alive).__name__)}")
        if alive.shape != (nd,) or alive.device != qv.device:
            raise ValueError(f"alive: expected shape [{nd}] on {qv.device}, got {tuple(alive.shape)} on {alive.device}")
    _check_bool(normalize, "normalize")
    name = _backend.resolve("maxsim_topk", qv.device, backend)
    if normalize:
        qv, xv = _unit(qv), _unit(xv)
    return topk_scan(qv, qo, xv, xo, k, name, alive, chunk_docs)


def pooled_scores(queries_values: torch.Tensor, queries_offsets: torch.Tensor,
                  docs_values: torch.Tensor, docs_offsets: torch.Tensor) -> torch.Tensor:
    """Single-vector baseline for A/B: cosine of pooled vectors.

    ``pool(x) = normalize(mean_j normalize(x_j))`` and ``score(q, x) = <pool(q), pool(x)>``.
    An empty item pools to the zero vector and so scores 0.

    Returns:
        ``[Nq, Nd]`` float32.
    """
    qv, qo, xv, xo = _check_pair(queries_values, queries_offsets, docs_values, docs_offsets)
    return reference.pooled_vectors(qv, qo) @ reference.pooled_vectors(xv, xo).T
