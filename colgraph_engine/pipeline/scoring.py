"""Scoring helpers shared by the stages: every call scores all queries of a batch at once.

Stores hold packed multi-vectors; a query batch is packed the same way (``values [Tq, d]``,
``offsets [Nq+1]``). ``maxsim`` is ``s(q, x) = Σ_i max_j <q_i, x_j>`` (colgraph_engine.ops);
``pooled`` is the cosine of mean unit vectors (the single-vector baseline).
"""
from __future__ import annotations

import numpy as np
import torch

from .. import backend as _backend, ops
from ..ops import reference
from .view import Vectors, item_norms  # noqa: F401  (item_norms: re-exported)


def as_store_dtype(qv: torch.Tensor, store: Vectors) -> torch.Tensor:
    return qv.to(device=store.device, dtype=store.dtype)


def score_all(store: Vectors, qv: torch.Tensor, qo: torch.Tensor, ranker: str, first: int = 0,
              last: int | None = None) -> torch.Tensor:
    """``[Nq, last - first]`` float32 scores of every query against slots ``first:last`` of `store`."""
    last = store.n_slots if last is None else last
    off = store.offsets[first:last + 1]
    lo, hi = int(off[0]), int(off[-1])
    xv, xo = store.values[lo:hi], off - lo
    if ranker == "maxsim":
        # store values were checked finite when added, queries when encoded (Encoder): skip the re-check
        return ops.maxsim(as_store_dtype(qv, store), qo.to(store.device), xv, xo, assume_finite=True).cpu()
    qp = reference.pooled_vectors(qv.float().to(store.device), qo.to(store.device))  # [Nq, d]
    return (qp @ store.pooled[first:last].T).cpu()


def score_pairs(store: Vectors, qv: torch.Tensor, qo: torch.Tensor, cand_offsets: np.ndarray,
                cand_slots: np.ndarray, ranker: str) -> np.ndarray:
    """``[C]`` float32 scores of each query against its own candidate slots (CSR)."""
    if cand_slots.size == 0:
        return np.zeros(0, np.float32)
    co = torch.from_numpy(np.ascontiguousarray(cand_offsets, np.int64))
    ci = torch.from_numpy(np.ascontiguousarray(cand_slots, np.int64))
    if ranker == "maxsim":
        return _candidates_trusted(store, qv, qo, co, ci).cpu().numpy()
    # pooled: the store's pooled vectors are computed once per snapshot (Vectors.pooled)
    uniq, inv = np.unique(cand_slots, return_inverse=True)
    qp = reference.pooled_vectors(qv.float().cpu(), qo.cpu())            # [Nq, d]
    xp = store.pooled[torch.from_numpy(uniq).to(store.device)].cpu()      # [U, d]
    pair_owner = torch.from_numpy(np.repeat(np.arange(cand_offsets.size - 1), np.diff(cand_offsets)))
    return (qp[pair_owner] * xp[torch.from_numpy(inv.reshape(-1))]).sum(1).numpy()


def _candidates_trusted(store: Vectors, qv: torch.Tensor, qo: torch.Tensor, co: torch.Tensor,
                        ci: torch.Tensor) -> torch.Tensor:
    """``[C]`` :func:`colgraph_engine.ops.maxsim_candidates` of the queries against their
    candidate slots of `store`, with ``trusted_docs=True``: a view's snapshot was validated when
    its items were added, and re-validating its offsets on each call made every seeds, evidence
    and recall call O(store items) per query (0.7 ms a query at 10,000 documents, 250k items).
    The queries and the candidate list are checked (O(their size)); store values were checked
    finite when added, queries when encoded (``assume_finite=True``)."""
    dev = store.device
    q = as_store_dtype(qv, store)
    if dev.type == "cpu" and _backend.resolve("maxsim_candidates", dev) == "native":
        # straight to the native kernel: these inputs are the stages' own (queries checked when
        # encoded, candidates built from the view's slots), and the native entry point checks
        # every candidate id and the offsets of every document it reads, so nothing is read out
        # of bounds; the public call's checks cost ~150 us a call against ~10 us of scoring for
        # the filter's few-item calls, about ten of them per query
        from ..ops import _native_impl
        from ..ops.scoring import check_ids_in_range, check_same_dim  # the public call's messages, O(candidates)
        check_same_dim(q, store.values)
        check_ids_in_range(ci, store.n_slots)
        return _native_impl.maxsim_candidates(q, qo, store.values, store.offsets, co, ci)
    return ops.maxsim_candidates(q, qo.to(dev), store.values, store.offsets, co.to(dev),
                                 ci.to(dev), assume_finite=True, trusted_docs=True)


def cosine_pairs(store: Vectors, norms: np.ndarray, qvec: torch.Tensor, cand_offsets: np.ndarray,
                 cand_slots: np.ndarray, *, unit: bool = False) -> np.ndarray:
    """``[C]`` cosine of each query's single vector ``qvec [Nq, d]`` with its candidate items of
    a one-vector-per-item store (``norms [N]``: the items' L2 norms). `unit`: `qvec` is float32
    and already L2-normalised (:func:`unit_rows`), as a caller that scores many times keeps it."""
    if cand_slots.size == 0:
        return np.zeros(0, np.float32)
    q = qvec if unit else unit_rows(qvec)
    qo = torch.arange(q.shape[0] + 1, dtype=torch.int64)
    dots = score_pairs(store, q, qo, cand_offsets, cand_slots, "maxsim")
    n = norms[cand_slots]
    return np.where(n > 0, dots / np.maximum(n, 1e-30), 0.0).astype(np.float32)


def unit_rows(qvec: torch.Tensor) -> torch.Tensor:
    """``[Nq, d]`` float32 rows of `qvec` L2-normalised (what :func:`cosine_pairs` scores with)."""
    return torch.nn.functional.normalize(qvec.float(), dim=1)


def csr_from_lists(lists: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(lists) + 1, np.int64)
    np.cumsum([x.size for x in lists], out=offsets[1:])
    values = np.concatenate(lists).astype(np.int64) if lists else np.zeros(0, np.int64)
    return offsets, values


def order_desc(scores: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Indices sorting by score descending, then key ascending (deterministic ties)."""
    return np.lexsort((keys, -scores.astype(np.float64)))


def rrf(rank_lists: list[dict[int, int]], k: int) -> dict[int, float]:
    """Reciprocal-rank fusion ``Σ_lists 1 / (k + rank)`` with ranks from 1."""
    out: dict[int, float] = {}
    for ranks in rank_lists:
        for item, r in ranks.items():
            out[item] = out.get(item, 0.0) + 1.0 / (k + r)
    return out


def select_queries(qv: torch.Tensor, qo: torch.Tensor, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed queries ``rows`` (in that order) of a packed batch."""
    sel = torch.from_numpy(np.ascontiguousarray(rows, np.int64))
    pieces = [qv[a:b] for a, b in zip(qo[sel].tolist(), qo[sel + 1].tolist())]
    offsets = torch.zeros(len(pieces) + 1, dtype=torch.int64)
    torch.cumsum(torch.tensor([p.shape[0] for p in pieces], dtype=torch.int64), 0, out=offsets[1:])
    return (torch.cat(pieces) if pieces else qv[:0]), offsets


def score_node_lists(view, store_of_kind: dict[int, str], packed_q, lists: list[np.ndarray],
                     ranker: str) -> list[np.ndarray]:
    """Scores of query j against the graph nodes ``lists[j]``, each node in the store of its
    kind (``store_of_kind``); -inf where a node's kind has no store or the node no vectors.
    One call per store for the whole batch."""
    qv, qo = packed_q
    out = [np.full(x.size, -np.inf, np.float32) for x in lists]
    for kind, name in store_of_kind.items():
        if name not in view.stores or not view.vectors[name].n_slots:
            continue
        positions, slots = [], []
        for x in lists:
            pos = np.flatnonzero(view.node_kind[x] == int(kind))  # a plain int: numpy's fast path
            s = view.store_slots(name, x[pos])
            positions.append(pos[s >= 0])
            slots.append(s[s >= 0])
        co, cs = csr_from_lists(slots)
        vals = score_pairs(view.vectors[name], qv, qo, co, cs, ranker)
        for j, pos in enumerate(positions):
            out[j][pos] = vals[co[j]:co[j + 1]]
    return out
