"""Late-interaction scoring over packed multi-vectors.

For a query with token vectors ``q_1..q_L`` and a document with token vectors ``x_1..x_M``::

    MaxSim(q, x) = sum_{i=1..L} max_{j=1..M} <q_i, x_j>

accumulated in float32 whatever the input dtype (float32, float16, bfloat16). With
``normalize=True`` every token vector is first scaled to unit L2 norm (zero vectors stay zero),
so each term is a cosine. **Non-finite values** (NaN, +-inf) in queries or documents are
rejected with ``ValueError`` naming the argument: every backend then computes the same
function (the native kernel's max would otherwise drop a NaN the reference propagates). The
check is one pass over the scored rows; a caller whose vectors are known finite (a
:class:`~colgraph_engine.store.PackedStore` checks on entry) may skip it with
``assume_finite=True``, and then non-finite input gives backend-dependent results. Tensors
that require grad are rejected by the native and Triton backends (they compute no
gradients); the torch backend keeps the autograd graph of :func:`maxsim` and
:func:`maxsim_candidates`. Edge cases, by the same formula: an **empty document** (M = 0)
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
import numbers

from ..packed import (_all_finite, check_finite, check_no_grad, check_offsets, check_offsets_layout, check_packed,
                      check_values)
from . import reference


# ------------------------------------------------------------------------------------------
# Implementations behind the dispatch (inputs already validated)
# ------------------------------------------------------------------------------------------

def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` on `device`. A host tensor bound for CUDA goes through pinned memory, so the copy is
    queued on the stream without the host waiting for the device (a copy from pageable memory
    may have to). Pinned buffers come from torch's caching host allocator and are not reused
    before the copy has run."""
    if t.device == device or device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def host_lengths(offsets: torch.Tensor) -> list[int]:
    """The N item lengths, as Python ints. A CPU tensor costs no transfer; a device tensor costs
    one read (callers that hold host offsets, such as a store, pass those instead)."""
    return (offsets if offsets.device.type == "cpu" else offsets.cpu()).diff().tolist()


def _cross_impl(name, qv, qo, xv, xo, out=None, q_lengths=None):
    """`q_lengths`: the queries' lengths on the host when the caller has them (the Triton
    launcher plans tiles with them; without them they are read from `qo`)."""
    if name == "triton":
        from ..kernels import maxsim as tk
        return tk.maxsim_cross(qv, qo, xv, xo, out, q_lengths=host_lengths(qo) if q_lengths is None else q_lengths)
    if name == "native":
        from . import _native_impl
        return _native_impl.maxsim_cross(qv, qo, xv, xo, out)
    res = reference.maxsim_cross_reference(qv, qo, xv, xo)
    return res if out is None else out.copy_(res)


def _candidates_impl(name, qv, qo, xv, xo, co, ci, out=None, q_lengths=None, cand_counts=None):
    """`q_lengths`, `cand_counts`: host copies when the caller has them (see :func:`_cross_impl`)."""
    if name == "triton":
        from ..kernels import maxsim as tk
        return tk.maxsim_candidates(qv, qo, xv, xo, co, ci, out,
                                    q_lengths=host_lengths(qo) if q_lengths is None else q_lengths,
                                    cand_counts=cand_counts)
    if name == "native":
        from . import _native_impl
        return _native_impl.maxsim_candidates(qv, qo, xv, xo, co, ci, out)
    res = reference.maxsim_candidates_reference(qv, qo, xv, xo, co, ci)
    return res if out is None else out.copy_(res)


def _unit(values: torch.Tensor) -> torch.Tensor:
    return F.normalize(values.float(), dim=-1).to(values.dtype)


# Rows normalised per step inside the top-k scan (elements): the normalised copy never holds
# more than this many values, whatever the collection size (row-wise, so results are the same
# as normalising everything first).
NORMALIZE_BLOCK_ELEMS = 1 << 19


def _check_pair(q_values, q_offsets, d_values, d_offsets, trusted_docs: bool = False):
    qv, qo = check_packed(q_values, q_offsets, "queries")
    if trusted_docs:  # the caller vouches for the offsets' values (see maxsim_candidates)
        xv = check_values(d_values, "docs_values")
        xo = check_offsets_layout(d_offsets, xv.device, "docs_offsets")
    else:
        xv, xo = check_packed(d_values, d_offsets, "docs")
    if qv.dtype != xv.dtype:
        raise TypeError(f"queries_values: expected the documents' dtype {xv.dtype}, got {qv.dtype}")
    check_same_dim(qv, xv)
    if qv.device != xv.device:
        raise ValueError(f"queries_values: expected the documents' device {xv.device}, got {qv.device}")
    return qv, qo, xv, xo


def _check_bool(value, name):
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")


def check_positive_int(value, name: str, *, allow_none: bool = False) -> int | None:
    """An int >= 1 (numpy integers accepted); TypeError for other types, ValueError below 1."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int{' or None' if allow_none else ''}, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name}: expected {name} >= 1, got {int(value)}")
    return int(value)


def check_inputs(name: str, tensors, assume_finite: bool) -> None:
    """Backend-dependent checks on validated inputs: `tensors` = ((tensor, argument name), ...)."""
    for t, arg in tensors:
        if name != "torch":
            check_no_grad(t, arg, f"the {name} backend computes no gradients; or use backend='torch'")
        if not assume_finite:
            check_finite(t.detach(), arg)


def _check_candidate_rows_finite(xv, xo, ci, arg: str) -> None:
    """Finiteness of the rows of the listed documents only (never a pass over the whole store)."""
    if ci.numel() == 0:
        return
    docs = torch.unique(ci)
    starts, ends = xo[docs], xo[docs + 1]
    lengths = ends - starts
    total = int(lengths.sum())
    if total >= xv.shape[0] // 2:
        check_finite(xv.detach(), arg)
        return
    step = max(1, (1 << 22) // max(1, xv.shape[1]))  # rows gathered per step
    first = torch.cumsum(lengths, 0) - lengths
    for a in range(0, total, step):
        r = torch.arange(a, min(total, a + step), device=xv.device)
        owner = torch.searchsorted(first, r, right=True) - 1
        rows = starts[owner] + (r - first[owner])
        block = xv.detach()[rows]
        if not _all_finite(block):
            bad = int(rows[torch.nonzero(~torch.isfinite(block))[0, 0]])
            raise ValueError(f"{arg}: expected finite values, found NaN or inf in row {bad}")


# ------------------------------------------------------------------------------------------
# Public operations
# ------------------------------------------------------------------------------------------

def maxsim(queries_values: torch.Tensor, queries_offsets: torch.Tensor,
           docs_values: torch.Tensor, docs_offsets: torch.Tensor, *,
           normalize: bool = False, backend: str | None = None, assume_finite: bool = False) -> torch.Tensor:
    """Cross scores of every query against every document.

    Args:
        queries_values: ``[Tq, d]`` query token vectors, packed.
        queries_offsets: ``[Nq+1]`` int64 offsets into `queries_values`.
        docs_values: ``[Td, d]`` document token/patch vectors, packed (same dtype and device).
        docs_offsets: ``[Nd+1]`` int64 offsets into `docs_values`.
        normalize: L2-normalise every token vector first.
        backend: ``"triton"``, ``"native"``, ``"torch"`` or None (automatic).
        assume_finite: skip the NaN/inf check (the caller vouches that every value is finite).

    Returns:
        ``[Nq, Nd]`` float32 on the inputs' device: ``out[i, j] = MaxSim(query i, document j)``.
    """
    qv, qo, xv, xo = _check_pair(queries_values, queries_offsets, docs_values, docs_offsets)
    _check_bool(normalize, "normalize")
    _check_bool(assume_finite, "assume_finite")
    name = _backend.resolve("maxsim", qv.device, backend)
    check_inputs(name, ((qv, "queries_values"), (xv, "docs_values")), assume_finite)
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
    check_ids_in_range(cand_ids, n_docs)
    return co, cand_ids


def check_same_dim(qv: torch.Tensor, xv: torch.Tensor) -> None:
    """Queries ``[Tq, d]`` of the documents' dimension d (ValueError naming queries_values)."""
    if qv.dim() != 2 or qv.shape[1] != xv.shape[1]:
        got = qv.shape[1] if qv.dim() == 2 else tuple(qv.shape)
        raise ValueError(f"queries_values: expected dimension d={xv.shape[1]} (the documents'), got {got}")


def check_ids_in_range(cand_ids: torch.Tensor, n_docs: int) -> None:
    """Every candidate id in ``[0, n_docs)`` (ValueError naming cand_ids and the first bad id)."""
    if cand_ids.numel():
        lo, hi = torch.stack([cand_ids.min(), cand_ids.max()]).tolist()  # one sync
        if lo < 0 or hi >= n_docs:
            bad = lo if lo < 0 else hi
            raise ValueError(f"cand_ids: expected ids in [0, {n_docs}) (documents), got {bad}")


def maxsim_candidates(queries_values: torch.Tensor, queries_offsets: torch.Tensor,
                      docs_values: torch.Tensor, docs_offsets: torch.Tensor,
                      cand_offsets: torch.Tensor, cand_ids: torch.Tensor, *,
                      normalize: bool = False, backend: str | None = None,
                      assume_finite: bool = False, trusted_docs: bool = False) -> torch.Tensor:
    """Scores each query against its own candidate documents only (graph-restricted rerank).

    Query i's candidates are ``cand_ids[cand_offsets[i]:cand_offsets[i+1]]`` (CSR). Every listed
    pair is scored exactly; an id may repeat, and a query may list nothing.

    Args:
        cand_offsets: ``[Nq+1]`` int64, CSR offsets into `cand_ids`.
        cand_ids: ``[C]`` int64 document indices in ``[0, Nd)``.
        trusted_docs: the caller vouches that `docs_offsets` is valid for `docs_values`
            (``docs_offsets[0] == 0``, non-decreasing, ``docs_offsets[-1] == Td``), as a store's
            snapshot is, validated when its items were added. Skips the check of the offsets'
            values, a pass over all Nd documents with a device-to-host read on every call, so
            the call costs O(queries + candidates) however large the store; the types, dtypes,
            shapes and devices of both tensors are still checked, and the queries and the
            candidate list in full. Invalid offsets passed with ``trusted_docs=True`` give
            undefined scores (possibly an out-of-bounds read on a GPU), never an error.
        (others as in :func:`maxsim`)

    Returns:
        ``[C]`` float32: ``out[c] = MaxSim(query owning c, document cand_ids[c])``. The scores do
        not depend on `trusted_docs`.
    """
    _check_bool(trusted_docs, "trusted_docs")
    qv, qo, xv, xo = _check_pair(queries_values, queries_offsets, docs_values, docs_offsets, trusted_docs)
    co, ci = check_candidates(cand_offsets, cand_ids, qo.numel() - 1, xo.numel() - 1, qv.device)
    _check_bool(normalize, "normalize")
    _check_bool(assume_finite, "assume_finite")
    name = _backend.resolve("maxsim_candidates", qv.device, backend)
    check_inputs(name, ((qv, "queries_values"), (xv, "docs_values")), True)
    if not assume_finite:  # only the listed documents' rows are read, so only those are checked
        check_finite(qv.detach(), "queries_values")
        _check_candidate_rows_finite(xv, xo, ci, "docs_values")
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


def _chunk_edges(xo: torch.Tensor, nd: int, chunk: int, max_rows: int | None) -> list[int]:
    """Document indices where scan chunks start (ending with nd): at most `chunk` documents, and
    at most `max_rows` rows unless one document alone is longer."""
    if max_rows is None:
        return list(range(0, nd, chunk)) + [nd]
    off = xo.cpu()
    edges, a = [0], 0
    while a < nd:
        b = int(torch.searchsorted(off, off[a] + max_rows, right=True)) - 1  # docs a..b-1 fit
        b = min(nd, a + chunk, max(b, a + 1))
        edges.append(b)
        a = b
    return edges


def _normalized_block(xv: torch.Tensor, lo: int, hi: int, scratch: dict) -> torch.Tensor:
    """Rows lo:hi of `xv` scaled to unit norm, bit for bit as :func:`_unit` (F.normalize in
    float32, then the input dtype). The result lives in buffers kept in `scratch` and reused by
    the next block, so a scan allocates them once (repeated large allocations fragment the heap
    and raise the peak far past one block)."""
    sub = xv[lo:hi]
    n = sub.numel()
    if scratch.get("f32") is None or scratch["f32"].numel() < n:
        scratch["f32"] = torch.empty(n, dtype=torch.float32, device=xv.device)
        scratch["out"] = None if xv.dtype == torch.float32 else torch.empty(n, dtype=xv.dtype, device=xv.device)
    f32 = scratch["f32"][:n].view_as(sub)
    f32.copy_(sub)
    denom = f32.norm(2, -1, keepdim=True).clamp_min(1e-12)  # F.normalize's denominator
    f32.div_(denom)
    if scratch["out"] is None:
        return f32
    out = scratch["out"][:n].view_as(sub)
    out.copy_(f32)
    return out


def topk_scan(qv, qo, xv, xo, k: int, name: str, alive: torch.Tensor | None = None,
              chunk_docs: int | None = None, normalize: bool = False, *, q_lengths=None,
              host_offsets: torch.Tensor | None = None, n_live: int | None = None):
    """Exact top-k by scanning documents in chunks (inputs validated). See :func:`maxsim_topk`.

    With `normalize`, `qv` is normalised once and the documents one chunk at a time (a chunk
    then holds at most :data:`NORMALIZE_BLOCK_ELEMS` values unless one document alone is longer).
    A caller that holds the queries' lengths, the document offsets and the live count on the
    host (a store) passes them: the scan then reads nothing back from the device.
    """
    nq, nd = qo.shape[0] - 1, xo.shape[0] - 1
    if n_live is None:
        n_live = nd if alive is None else int(alive.sum())
    if name == "triton" and q_lengths is None:
        q_lengths = host_lengths(qo)
    if host_offsets is None:
        host_offsets = xo if xo.device.type == "cpu" else None
    k = min(k, n_live)
    dev = qv.device
    best_s = torch.empty((nq, 0), dtype=torch.float32, device=dev)
    best_i = torch.empty((nq, 0), dtype=torch.int64, device=dev)
    best_dead = torch.empty((nq, 0), dtype=torch.bool, device=dev) if alive is not None else None
    if k == 0:
        return best_s, best_i
    if normalize:
        qv = _unit(qv)
    chunk = chunk_docs or max(1024, (1 << 24) // max(1, nq))
    max_rows = max(1, NORMALIZE_BLOCK_ELEMS // max(1, xv.shape[1])) if normalize else None
    starts = _chunk_edges(xo if host_offsets is None else host_offsets, nd, chunk, max_rows)
    if host_offsets is not None:
        row_of = dict(zip(starts, host_offsets[starts].tolist()))
    else:
        row_of = dict(zip(starts, xo[torch.tensor(starts, device=xo.device)].tolist()))  # only chunk edges
    if len(starts) == 2 and alive is None and not normalize:
        # One chunk holding every document: its scores sorted once (stable: equal scores keep
        # the lower index first, as the merge does). Fewer ops matter on the 1-query path.
        s = _cross_impl(name, qv, qo, xv, xo, q_lengths=q_lengths)
        ranked = torch.sort(s, dim=1, descending=True, stable=True)
        return ranked.values[:, :k], ranked.indices[:, :k]
    scratch: dict = {}
    for a, b in zip(starts[:-1], starts[1:]):
        sub_x = _normalized_block(xv, row_of[a], row_of[b], scratch) if normalize else xv[row_of[a]:row_of[b]]
        sub_o = xo[a:b + 1] - row_of[a]
        s = _cross_impl(name, qv, qo, sub_x, sub_o, q_lengths=q_lengths)
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
                normalize: bool = False, backend: str | None = None,
                assume_finite: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k documents per query by MaxSim, scanning the collection in chunks.

    Peak extra memory is one ``[Nq, chunk_docs]`` score block (plus the backend's own bounded
    working set), whatever the number of documents; with ``normalize=True`` the documents are
    normalised chunk by chunk, in chunks of at most ``NORMALIZE_BLOCK_ELEMS`` values (never the
    whole collection at once).

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
    k = check_positive_int(k, "k")
    chunk_docs = check_positive_int(chunk_docs, "chunk_docs", allow_none=True)
    nd = xo.numel() - 1
    if alive is not None:
        if not isinstance(alive, torch.Tensor) or alive.dtype != torch.bool:
            raise TypeError(f"alive: expected a torch.bool tensor, got {getattr(alive, 'dtype', type(alive).__name__)}")
        if alive.shape != (nd,) or alive.device != qv.device:
            raise ValueError(f"alive: expected shape [{nd}] on {qv.device}, got {tuple(alive.shape)} on {alive.device}")
    _check_bool(normalize, "normalize")
    _check_bool(assume_finite, "assume_finite")
    name = _backend.resolve("maxsim_topk", qv.device, backend)
    check_inputs(name, ((qv, "queries_values"), (xv, "docs_values")), assume_finite)
    with torch.no_grad():  # a ranking: no gradient flows through top-k on any backend
        return topk_scan(qv, qo, xv, xo, k, name, alive, chunk_docs, normalize)


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
