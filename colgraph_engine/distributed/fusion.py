"""The driver's half of stage 1: which query rows each side scores, and the global fusion of
the shards' per-document best-unit scores into the top-Kd documents.

The shards return, per side, the best unit score of each of their documents (the same numbers
the single-process recall computes, store by store); put in the global document order they form
the ``[rows, D]`` matrix ``pipeline.recall`` fuses, and the fusion here is the same arithmetic
on it: RRF ranks over all D documents of a side (descending score, the earlier document first on
ties), or min-max over the documents a side scored, summed in float64 text side first. So the
documents, their order and their float32 scores are bit-identical to
:func:`~colgraph_engine.pipeline.recall.recall_documents` on one index holding the same documents
in the same order.
"""
from __future__ import annotations

import numpy as np
import torch

from ..pipeline.config import PipelineConfig
from ..pipeline.recall import Recall


def side_rows(cfg: PipelineConfig, has_image: np.ndarray, image_q) -> dict[str, np.ndarray]:
    """Query rows per side, as ``recall_documents`` chooses them (a query without an image uses
    the text side even when ``recall_side="image"``); sides with no rows are left out."""
    nq = has_image.size
    use_text = cfg.recall_side in ("text", "fused")
    use_image = cfg.recall_side in ("image", "fused")
    out = {"text": np.arange(nq) if use_text else np.flatnonzero(~has_image),
           "image": np.flatnonzero(has_image) if use_image and image_q is not None else np.zeros(0, np.int64)}
    return {side: rows.astype(np.int64) for side, rows in out.items() if rows.size}


def fuse(nq: int, per_side: list[tuple[str, np.ndarray, torch.Tensor, int]], n_docs: int,
         cfg: PipelineConfig) -> Recall:
    """Top-Kd documents per query from global per-side scores.

    Args:
        nq: queries in the batch.
        per_side: ``[(side, rows [r], scores [r, n_docs] float32 in global order, units)]``,
            text side first.
        n_docs: documents in the global order.

    Returns a :class:`Recall` whose ``docs`` are positions in the global order.
    """
    sides: list[list[str]] = [[] for _ in range(nq)]
    units = [0] * nq
    d = n_docs
    fused = torch.zeros((nq, d), dtype=torch.float64)
    seen = torch.zeros((nq, d), dtype=torch.bool)
    w = {0: cfg.text_weight, 1: 1.0 - cfg.text_weight}
    for side_i, (side, rows, s, u) in enumerate(per_side):
        for r in rows.tolist():
            sides[r].append(side)
            units[r] += u
        finite = torch.isfinite(s)
        r = torch.from_numpy(rows)
        seen[r] |= finite
        if cfg.fusion == "rrf":
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
    k = min(cfg.kd, d)
    order = torch.sort(fused, dim=1, descending=True, stable=True).indices[:, :k] if d \
        else torch.zeros((nq, 0), dtype=torch.int64)
    docs, scores = [], []
    for i in range(nq):
        o = order[i]
        sc = fused[i, o]
        keep = torch.isfinite(sc)
        docs.append(o[keep].numpy().astype(np.int64))
        scores.append(sc[keep].numpy().astype(np.float32))
    return Recall(docs, scores, [tuple(s) for s in sides], units, [{} for _ in range(nq)])


__all__ = ["fuse", "side_rows"]
