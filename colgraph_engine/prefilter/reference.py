"""Slow pure-torch references of the prefilter's stages: one query and one document at a time,
walking tokens (not the inverted lists), decoding every vector. The test oracle for
:mod:`.stages`, :mod:`.rescore` and the Triton kernel."""
from __future__ import annotations

import torch

from . import codec
from .layout import IndexState


def doc_tokens(state: IndexState, p: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes [L] int64, decoded vectors [L, d] float64)`` of the document at position p."""
    lo, hi = int(state.offsets[p]), int(state.offsets[p + 1])
    codes = state.codes[lo:hi].long()
    table = codec.byte_table(state.weights, state.nbits).double()
    resid = table[state.residuals[lo:hi].long()].reshape(hi - lo, state.dim)
    x = state.centroids[codes].double() + resid
    return codes, torch.nn.functional.normalize(x, dim=-1) if state.unit else x


def candidates(state: IndexState, q: torch.Tensor, ncells: int) -> set[int]:
    """Live positions of documents holding a token coded by a centroid one of `q`'s tokens probes."""
    s = q.float() @ state.centroids.T
    probed = set(torch.topk(s, min(ncells, s.shape[1]), dim=1).indices.reshape(-1).tolist())
    out = set()
    for p in range(state.n_slots):
        lo, hi = int(state.offsets[p]), int(state.offsets[p + 1])
        if bool(state.alive[p]) and probed & set(state.codes[lo:hi].tolist()):
            out.add(p)
    return out


def centroid_score(state: IndexState, q: torch.Tensor, p: int, threshold: float | None) -> float:
    """``Σ_i max_j S[i, code_j]`` over the document's tokens whose centroid is kept (all when
    `threshold` is None); ``-inf`` when none is kept (or the document is empty)."""
    s = q.float() @ state.centroids.T
    codes, _ = doc_tokens(state, p)
    if threshold is not None:
        kept = s.max(0).values >= threshold
        codes = codes[kept[codes]]
    if codes.numel() == 0:
        return float("-inf")
    return float(s[:, codes].max(1).values.sum())


def exact_score(state: IndexState, q: torch.Tensor, p: int) -> float:
    """MaxSim of `q` with the decoded document (float64); ``-inf`` for an empty document."""
    _, x = doc_tokens(state, p)
    if x.shape[0] == 0:
        return float("-inf") if q.shape[0] else 0.0
    return float((q.double() @ x.T).max(1).values.sum())


def search(state: IndexState, q: torch.Tensor, k: int, ncells: int, threshold: float, ndocs: int,
           n_exact: int) -> list[tuple[int, float]]:
    """The whole staged search for one query: ``[(position, exact score)]`` best first."""
    cand = sorted(candidates(state, q, ncells))
    pruned = sorted(cand, key=lambda p: -centroid_score(state, q, p, threshold))[:ndocs]  # stable: position ties
    pruned = sorted(pruned)
    full = sorted(pruned, key=lambda p: -centroid_score(state, q, p, None))[:n_exact]
    scored = sorted(((p, exact_score(state, q, p)) for p in sorted(full)), key=lambda t: -t[1])
    return scored[:k]
