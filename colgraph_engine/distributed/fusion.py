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

from dataclasses import dataclass

import numpy as np
import torch

from ..pipeline.config import PipelineConfig
from ..pipeline.recall import Recall, fuse_sides


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
    for side, rows, _, u in per_side:
        for r in rows.tolist():
            sides[r].append(side)
            units[r] += u
    fused = fuse_sides([(side, rows, sc) for side, rows, sc, _ in per_side], sides, nq, d, cfg)
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


@dataclass
class SideTop:
    """One side of a batch in the top-k protocol, merged over shards: per row ``pos[j]`` and
    ``scores[j]`` (the shards' top lists in global positions), ``lo`` / ``hi`` ``[r]`` (global
    min / max finite score), ``cut[j]`` (the highest k-th score of a shard that left finite
    documents out; None when none did)."""
    side: str
    rows: np.ndarray
    pos: list[np.ndarray]
    scores: list[np.ndarray]
    lo: np.ndarray
    hi: np.ndarray
    cut: list[float | None]
    units: int


def merge_top(side: str, rows: np.ndarray, tops: list[dict], col2pos: list[np.ndarray], units: int) -> SideTop:
    """One side's top lists of every shard (``tops[i]``: shard i's answer for the side, see
    :meth:`.shard.Shard.recall_scores`; ``col2pos[i]``: its columns' global positions) merged
    per row."""
    pos, scores, cut = [], [], []
    lo = np.full(rows.size, np.inf, np.float32)
    hi = np.full(rows.size, -np.inf, np.float32)
    for j in range(rows.size):
        p_j, s_j, c_j = [], [], None
        for t, c2p in zip(tops, col2pos):
            p_j.append(c2p[t["cols"][j]])
            s_j.append(t["scores"][j])
            lo[j], hi[j] = min(lo[j], t["lo"][j]), max(hi[j], t["hi"][j])
            if t["truncated"][j]:
                c_j = float(t["cut"][j]) if c_j is None else max(c_j, float(t["cut"][j]))
        pos.append(np.concatenate(p_j) if p_j else np.zeros(0, np.int64))
        scores.append(np.concatenate(s_j) if s_j else np.zeros(0, np.float32))
        cut.append(c_j)
    return SideTop(side, rows, pos, scores, lo, hi, cut, units)


def fuse_top(nq: int, per_side: list[SideTop], n_docs: int, cfg: PipelineConfig) -> Recall | None:
    """The same top-Kd as :func:`fuse` from the shards' top-k lists, for batches where every
    query row uses one side only; None when the lists cannot decide it exactly (then the
    caller asks for every score).

    Why exact: with one side per row, the fused order is the side's order (descending score,
    then global position) up to ties the fusion itself makes. Each shard sent every document
    scoring at least its k-th best, so the merged lists hold the global top k with their exact
    global ranks (every document ahead of one of them is in some list), which is all RRF needs.
    Weighted fusion maps scores through ``w * (s - lo) / span`` in float32, which can tie two
    different scores; the result is exact when the k-th fused value beats the fused value of
    every score a truncated shard left out (below its cut; fused is monotone in the score, so
    the float32 just below the highest cut bounds them all): nothing unseen can tie or pass it;
    else None.
    """
    sides: list[list[str]] = [[] for _ in range(nq)]
    units = [0] * nq
    docs: list[np.ndarray | None] = [None] * nq
    scores: list[np.ndarray | None] = [None] * nq
    k = min(cfg.kd, n_docs)
    for st in per_side:
        for j, qi in enumerate(st.rows.tolist()):
            if docs[qi] is not None:
                raise ValueError("fuse_top: a query row appears on two sides (use fuse)")
            sides[qi].append(st.side)
            units[qi] += st.units
            pos, sc = st.pos[j], st.scores[j]
            if cfg.fusion == "rrf":
                order = np.lexsort((pos, -sc.astype(np.float64)))[:k]
                fused = 1.0 / (cfg.rrf_k + torch.arange(1, order.size + 1).double())
            else:
                s_t = torch.from_numpy(np.ascontiguousarray(sc, np.float32))
                lo = torch.tensor([st.lo[j]], dtype=torch.float32)
                span = (torch.tensor([st.hi[j]], dtype=torch.float32) - lo).clamp(min=1e-12)
                weight = 1.0  # one side per row here (see fuse_sides)
                f_all = (weight * ((s_t - lo) / span).double()).numpy()
                order = np.lexsort((pos, -f_all))[:k]
                fused = torch.from_numpy(f_all[order])
                if st.cut[j] is not None and order.size == k:
                    # unseen documents score below the cut: at most the float32 just below it
                    below = torch.tensor([np.nextafter(np.float32(st.cut[j]), np.float32(-np.inf))], dtype=torch.float32)
                    if not float(fused[-1]) > float(weight * ((below - lo) / span).double()):
                        return None  # an unseen document may tie the k-th
            docs[qi] = pos[order].astype(np.int64)
            scores[qi] = fused.numpy().astype(np.float32)
    empty = (np.zeros(0, np.int64), np.zeros(0, np.float32))
    return Recall([d if d is not None else empty[0] for d in docs], [s if s is not None else empty[1] for s in scores],
                  [tuple(s) for s in sides], units, [{} for _ in range(nq)])


__all__ = ["SideTop", "fuse", "fuse_top", "merge_top", "side_rows"]
