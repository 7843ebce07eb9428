"""Stage 1: document recall, the top Kd documents per query.

A document's score on a side is the best score of its units:

* text side: ``max over segments and tables x of s(question + caption tokens, x)``;
* image side (queries with an image): ``max over images x of s(query-image patches, x)``;

with ``s`` = MaxSim (or the pooled cosine for ``recall_ranker="pooled"``). Sides are fused by
reciprocal-rank fusion ``Σ_side 1 / (rrf_k + rank_side(doc))`` (a document missing from a side
adds nothing) or by ``Σ_side w_side · minmax_side(score)`` over the documents a side scored.
Ties rank the lower document number first. A document with no unit on any used side cannot be
recalled. Every store is scored with one call for the whole batch.

``recall_ranker="prefilter"``: a recall store whose index carries a prefilter
(:meth:`~colgraph_engine.kg.KnowledgeIndex.enable_prefilter`; ids = the store's uids, persisted
in the index directory and maintained by its commits) uses that one, whatever
``prefilter_nbits`` says (the reason names the carried nbits); any other recall store gets a
:class:`~colgraph_engine.index.PrefilterIndex` over its live items (ids = store slots,
``prefilter_nbits``) built on first use and kept for the lifetime of the view (a change of the
index makes a new view, hence new prefilters). The carried one is taken once per view, and only
while the index has not changed since the view was made (else the view builds its own, so the
prefilter always describes the view's documents). Per store, an :class:`~colgraph_engine.index.AutoSearcher`
decides between exact MaxSim over all units and the prefilter (``prefilter_mode``); with the
prefilter each query keeps its top ``max(prefilter_units, kd)`` units, and a document none of
whose units is among them scores ``-inf`` on that side (not seen). ``Recall.paths`` says, per
query and store, which path ran and why.
"""
from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch

from ..kg.index import UID_SHIFT
from .config import PipelineConfig
from .scoring import score_all, score_pairs, select_queries
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
    paths: list[dict[str, str]] = field(default_factory=list)  # per query: store -> "path: reason"


log = logging.getLogger("colgraph_engine")
_PREFILTERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # IndexView -> {(store, nbits): index}
_STATE_TENSORS = ("centroids", "codes", "residuals", "offsets", "ids", "alive", "cells_offsets", "cells", "ivf_offsets",
                  "ivf_docs")  # an IndexState's tensors that live on its device (cutoffs, weights: the CPU)


def _prefilter_for(view: IndexView, name: str, nbits: int):
    """The view's prefilter over store `name` (built on first use; ids are store slots)."""
    from ..index import PrefilterIndex
    per_view = _PREFILTERS.setdefault(view, {})
    key = (name, nbits)
    if key not in per_view:
        vec = view.vectors[name]
        idx = PrefilterIndex.build(vec.values, vec.offsets, torch.arange(vec.n_slots), nbits=nbits,
                                   device=vec.device)
        dead = torch.nonzero(~vec.alive.cpu()).squeeze(1)
        if dead.numel():
            idx.delete(dead)
        log.info("colgraph_engine: built a prefilter over store %r (%r)", name, idx)
        per_view[key] = idx
    return per_view[key]


def _carried_prefilter(view: IndexView, name: str):
    """The prefilter the index carries for store `name` as of this view (ids are uids), or
    None: none carried (deferred or not configured), or the index changed since the view."""
    from ..index import PrefilterIndex
    per_view = _PREFILTERS.setdefault(view, {})
    key = (name, "carried")
    if key not in per_view:
        version = view.index.version
        pf = view.index.prefilter(name)
        same = version == view.version == view.index.version
        if pf is not None and same:
            # a frozen copy on the view's device (as persist.load places a state): later commits
            # replace the index's object, and nobody changes this one
            s, dev = pf.snapshot(), view.vectors[name].device
            if s.centroids.device != dev:
                s = s.with_(**{f: getattr(s, f).to(dev) for f in _STATE_TENSORS})
            per_view[key] = PrefilterIndex(s, pf.build_options)
        else:
            per_view[key] = None
    return per_view[key]


def _on_vectors(vec, by_uid: bool):
    """The prefilter's exact stage on the view's copy of a store: MaxSim of each shortlisted pair
    over the original vectors. Prefilter ids are the store's uids (`by_uid`, a carried
    prefilter) or its slots."""
    order = torch.sort(vec.ids) if by_uid else None

    def rescore(qv, qo, pair_q, pair_ids):
        if by_uid:
            pair_ids = pair_ids.to(vec.ids.device)
            at = torch.searchsorted(order.values, pair_ids).clamp(max=max(vec.n_slots - 1, 0))
            if not bool((order.values[at] == pair_ids).all()):
                raise RuntimeError("prefilter_exact='store': a shortlisted uid is not in the view's store")
            slots = order.indices[at]
        else:
            slots = pair_ids
        co = np.zeros(qo.numel(), np.int64)
        np.cumsum(np.bincount(pair_q.cpu().numpy(), minlength=qo.numel() - 1), out=co[1:])
        return torch.from_numpy(score_pairs(vec, qv, qo, co, slots.cpu().numpy(), "maxsim"))
    return rescore


def _prefilter_side(view: IndexView, name: str, store, sub_v, sub_o, cfg: PipelineConfig, best: torch.Tensor,
                    col: torch.Tensor, paths: list[str]) -> bool:
    """Scores store `name` through the prefilter when the auto choice (or the config) says so:
    fills `best` and returns True; returns False when exact MaxSim should run instead."""
    from ..index import AutoSearcher
    n_live = int(store.alive.sum())
    if n_live == 0:
        return False
    idx = _carried_prefilter(view, name)
    carried = idx is not None
    if not carried:
        idx = _prefilter_for(view, name, cfg.prefilter_nbits)
    k = min(n_live, len(idx), max(cfg.prefilter_units, cfg.kd))
    if k == 0:
        return False
    path, reason = AutoSearcher(view.index.stores[name], idx).choose(k, cfg.prefilter_mode)
    if carried:
        reason += f"; carried by the index, nbits {idx.nbits}"
    paths.append(f"{name}: {path} ({reason})")
    if path != "prefilter":
        return False
    res = idx.search(sub_v.float(), sub_o, k,
                     rescore=_on_vectors(view.vectors[name], carried) if cfg.prefilter_exact == "store" else None)
    paths[-1] = paths[-1][:-1] + f"; exact stage on the {'store' if cfg.prefilter_exact == 'store' else 'codes'})"
    ids = res.ids.cpu()
    found = ids >= 0
    if carried:  # uids -> the view's document columns; a document the view lacks is not seen
        number = (ids.clamp(min=0) >> UID_SHIFT).numpy()
        at = np.minimum(np.searchsorted(view.numbers, number), max(view.n_documents - 1, 0))
        found &= torch.from_numpy(view.numbers[at] == number) if view.n_documents else torch.zeros_like(found)
        docs = torch.from_numpy(at.astype(np.int64))
    else:
        docs = col[ids.clamp(min=0)]
    s = torch.where(found, res.scores.cpu(), float("-inf"))
    best.scatter_reduce_(1, docs, s, reduce="amax", include_self=True)
    return True


def _side_scores(view: IndexView, stores, qv, qo, ranker: str, rows: np.ndarray,
                 cfg: PipelineConfig | None = None, paths: list[str] | None = None) -> tuple[torch.Tensor, int]:
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
        if ranker == "prefilter":
            if _prefilter_side(view, name, store, sub_v, sub_o, cfg, best, col, paths):
                units += store.n_slots
                continue
            ranker_here = "maxsim"
        else:
            ranker_here = ranker
        # units in slices, so the scores held at once are [nq, UNIT_CHUNK], never [nq, N]
        for a in range(0, store.n_slots, UNIT_CHUNK):
            b = min(store.n_slots, a + UNIT_CHUNK)
            s = score_all(store, sub_v, sub_o, ranker_here, a, b)                      # [nq, b - a]
            best.scatter_reduce_(1, col[a:b].expand(nq, -1), s, reduce="amax", include_self=True)
        units += store.n_slots
    return best, units


def fuse_sides(per_side: list[tuple[str, np.ndarray, torch.Tensor]], sides: list[list[str]], nq: int, d: int,
               cfg: PipelineConfig) -> torch.Tensor:
    """``[nq, d]`` float64 fused document scores (-inf: no side scored the document).

    Args:
        per_side: ``(side, rows [r], scores [r, d])`` per side, text first; scores -inf where a
            side scored no unit of the document.
        sides: the sides of each query (a query's weights are over its own sides, so a text-only
            query in a batch with image queries scores as it would alone).

    RRF: ``sum_side 1 / (rrf_k + rank)``, ranks over the side's scores in descending order (the
    earlier document first on ties); weighted: ``sum_side w_side * (s - lo) / (hi - lo)`` over
    the documents the side scored, with ``w = text_weight`` / ``1 - text_weight`` when the query
    has both sides, else 1.
    """
    fused = torch.zeros((nq, d), dtype=torch.float64)
    seen = torch.zeros((nq, d), dtype=torch.bool)
    w = {"text": cfg.text_weight, "image": 1.0 - cfg.text_weight}
    for side, rows, s in per_side:
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
            weight = torch.tensor([w[side] if len(sides[q]) > 1 else 1.0 for q in rows.tolist()],
                                  dtype=torch.float64)[:, None]
            contrib = torch.where(finite, weight * ((s - lo) / span).double(), 0.0)
        fused[r] += contrib
    return torch.where(seen, fused, -torch.inf)


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
    paths: list[dict[str, str]] = [{} for _ in range(nq)]
    for side, stores, packed, rows in (("text", TEXT_STORES, text_q, text_rows),
                                       ("image", IMAGE_STORES, image_q, image_rows)):
        if not rows.size:
            continue
        side_paths: list[str] = []
        s, u = _side_scores(view, stores, *packed, cfg.recall_ranker, rows, cfg, side_paths)
        per_side.append((side, rows, s))
        for r in rows.tolist():
            sides[r].append(side)
            units[r] += u
            for p in side_paths:
                store_name, _, what = p.partition(": ")
                paths[r][store_name] = what
    d = view.n_documents
    fused = fuse_sides(per_side, sides, nq, d, cfg)
    docs, scores = [], []
    k = min(cfg.kd, d)
    order = torch.sort(fused, dim=1, descending=True, stable=True).indices[:, :k] if d else torch.zeros((nq, 0), dtype=torch.int64)
    for i in range(nq):
        o = order[i]
        sc = fused[i, o]
        keep = torch.isfinite(sc)
        docs.append(view.numbers[o[keep].numpy()])
        scores.append(sc[keep].numpy().astype(np.float32))
    return Recall(docs, scores, [tuple(s) for s in sides], units, paths)
