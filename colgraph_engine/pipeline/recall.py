"""Stage 1: document recall, the top Kd documents per query.

A document's score on a side is the best score of its units:

* text side: ``max over segments and tables x of s(question + caption tokens, x)``;
* image side (queries with an image): ``max over images x of s(query-image patches, x)``;

with ``s`` = MaxSim (or the pooled cosine for ``recall_ranker="pooled"``). Sides are fused by
reciprocal-rank fusion ``Σ_side 1 / (rrf_k + rank_side(doc))`` (a document missing from a side
adds nothing) or by ``Σ_side w_side · minmax_side(score)`` over the documents a side scored.
Ties rank the lower document number first. A document with no unit on any used side cannot be
recalled. Every store is scored with one call for the whole batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .config import PipelineConfig
from .scoring import score_all, select_queries
from .view import IndexView

TEXT_STORES = ("segment", "table")
UNIT_CHUNK = 8192  # store items scored per call: bounds recall's scratch at [Nq, 8192] float32
IMAGE_STORES = ("image",)


@dataclass
class Recall:
    """``docs[i]`` document numbers (best first) and ``scores[i]`` fused scores of query i;
    ``sides[i]`` the sides actually used; ``units[i]`` how many store items query i was scored against."""
    docs: list[np.ndarray]
    scores: list[np.ndarray]
    sides: list[tuple[str, ...]]
    units: list[int]


def _side_scores(view: IndexView, stores, qv, qo, ranker: str, rows: np.ndarray) -> tuple[torch.Tensor, int]:
    """``[len(rows), D]`` best unit score per document (-inf where it has none) for query rows."""
    nq, d = rows.size, view.n_documents
    best = torch.full((nq, d), float("-inf"))
    units = 0
    if nq == 0:
        return best, 0
    sub_v, sub_o = select_queries(qv, qo, rows)
    for name in stores:
        store = view.vectors.get(name)
        if store is None or store.n_slots == 0:
            continue
        col = torch.from_numpy(np.searchsorted(view.numbers, view.stores[name].doc))  # [N] document column
        # units in slices, so the scores held at once are [nq, UNIT_CHUNK], never [nq, N]
        for a in range(0, store.n_slots, UNIT_CHUNK):
            b = min(store.n_slots, a + UNIT_CHUNK)
            s = score_all(store, sub_v, sub_o, ranker, a, b)                           # [nq, b - a]
            best.scatter_reduce_(1, col[a:b].expand(nq, -1), s, reduce="amax", include_self=True)
        units += store.n_slots
    return best, units


def recall_documents(view: IndexView, text_q, image_q, has_image: np.ndarray, cfg: PipelineConfig) -> Recall:
    """Top-Kd documents for every query. `text_q` / `image_q`: packed ``(values, offsets)`` of
    the question tokens and query-image patches (queries without an image own zero rows)."""
    nq = has_image.size
    use_text = cfg.recall_side in ("text", "fused")
    use_image = cfg.recall_side in ("image", "fused")
    text_rows = np.arange(nq) if use_text else np.flatnonzero(~has_image)  # image side without an image: text
    image_rows = np.flatnonzero(has_image) if use_image and image_q is not None else np.zeros(0, np.int64)
    sides: list[list[str]] = [[] for _ in range(nq)]
    per_side = []
    units = [0] * nq
    for side, stores, packed, rows in (("text", TEXT_STORES, text_q, text_rows),
                                       ("image", IMAGE_STORES, image_q, image_rows)):
        if not rows.size:
            continue
        s, u = _side_scores(view, stores, *packed, cfg.recall_ranker, rows)
        per_side.append((rows, s))
        for r in rows.tolist():
            sides[r].append(side)
            units[r] += u
    d = view.n_documents
    fused = torch.zeros((nq, d), dtype=torch.float64)
    seen = torch.zeros((nq, d), dtype=torch.bool)
    w = {0: cfg.text_weight, 1: 1.0 - cfg.text_weight}
    for side_i, (rows, s) in enumerate(per_side):
        finite = torch.isfinite(s)
        r = torch.from_numpy(rows)
        seen[r] |= finite
        if cfg.fusion == "rrf":
            # rank among the documents this side scored: descending score, lower number first
            order = torch.sort(s, dim=1, descending=True, stable=True).indices
            rank = torch.empty_like(order)
            rank.scatter_(1, order, torch.arange(1, d + 1).expand(rows.size, -1))
            contrib = torch.where(finite, 1.0 / (cfg.rrf_k + rank.double()), 0.0)
        else:
            lo = torch.where(finite, s, torch.inf).min(1, keepdim=True).values
            hi = torch.where(finite, s, -torch.inf).max(1, keepdim=True).values
            span = (hi - lo).clamp(min=1e-12)
            weight = w[side_i] if len(per_side) > 1 else 1.0
            contrib = torch.where(finite, weight * ((s - lo) / span).double(), 0.0)
        fused[r] += contrib
    fused = torch.where(seen, fused, -torch.inf)
    docs, scores = [], []
    k = min(cfg.kd, d)
    order = torch.sort(fused, dim=1, descending=True, stable=True).indices[:, :k] if d else torch.zeros((nq, 0), dtype=torch.int64)
    for i in range(nq):
        o = order[i]
        sc = fused[i, o]
        keep = torch.isfinite(sc)
        docs.append(view.numbers[o[keep].numpy()])
        scores.append(sc[keep].numpy().astype(np.float32))
    return Recall(docs, scores, [tuple(s) for s in sides], units)
