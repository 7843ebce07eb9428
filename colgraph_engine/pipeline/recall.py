"""Stage 1: document recall, the top Kd documents per query.

A document's score on a side is the best score of its units:

* text side: ``max over segments and tables x of s(question + caption tokens, x)``;
* image side (queries with an image): ``max over images x of s(query-image patches, x)``;

with ``s`` = MaxSim (or the pooled cosine for ``recall_ranker="pooled"``). Sides are fused by
reciprocal-rank fusion ``Σ_side 1 / (rrf_k + rank_side(doc))`` (a document missing from a side
adds nothing) or by ``Σ_side w_side · minmax_side(score)`` over the documents a side scored.
Ties rank the lower document number first. A document with no unit on any used side cannot be
recalled. Every store is scored with one call for the whole batch.

``recall_ranker="auto"`` (the default), per recall store (``segment`` and ``table`` on the text
side, ``image`` on the image side): a store with fewer than ``prefilter_min_tokens`` live
tokens is scored exactly, by the very code ``"maxsim"`` runs (identical results; no prefilter
is read or built); a larger store is searched through the prefilter its index carries
(:meth:`~colgraph_engine.kg.KnowledgeIndex.enable_prefilter`), once that prefilter is checked
against the view's copy of the store (same live items and tokens, and the index unchanged since
the view: otherwise the store is scored exactly and the reason says why, so a stale or damaged
prefilter is never used); a larger store without one is scored exactly, with a warning logged
once per index and store. ``"auto"`` never builds a prefilter on the query path.

``recall_ranker="prefilter"``: a recall store whose index carries a prefilter
(ids = the store's uids, persisted in the index directory and maintained by its commits) uses
that one, whatever ``prefilter_nbits`` says (the reason names the carried nbits); any other
recall store gets a :class:`~colgraph_engine.prefilter.PrefilterIndex` over its live items (ids =
store slots, ``prefilter_nbits``) built on first use and kept for the lifetime of the view (a
change of the index makes a new view, hence new prefilters). The carried one is taken once per
view, and only while the index has not changed since the view was made (else the view builds its
own, so the prefilter always describes the view's documents). Per store, an
:class:`~colgraph_engine.prefilter.AutoSearcher` decides between exact MaxSim over all units and the
prefilter (``prefilter_mode``).

Through a prefilter, with ``prefilter_budget="adaptive"`` (default), each query's budget is
set by :mod:`colgraph_engine.prefilter.adaptive` so that its top-Kd documents are found (items are
grouped by document), and every item it scored exactly enters the document scores; with
``"plaid"`` each query keeps its top ``max(prefilter_units, kd)`` units by PLAID's fixed
settings. A document none of whose units was scored exactly scores ``-inf`` on that side (not
seen); every score that enters the fusion is exact MaxSim on the store's vectors
(``prefilter_exact="store"``) or on the decoded codes (``"codes"``). ``Recall.paths`` says, per
query and store, which path ran and why.
"""
from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch

from ..kg.index import UID_SHIFT
from ..kg.index import prefilters as _auto_prefilters
from .config import PipelineConfig
from .scoring import score_all, score_pairs, select_queries
from .view import IndexView

TEXT_STORES = ("segment", "table")
AUTO_DIM = _auto_prefilters.AUTO_DIM  # prefilter_min_tokens counts tokens of this dimension (a store of dimension d: tokens x d / 128)
UNIT_CHUNK = 8192  # store items scored per call: bounds recall's scratch at [Nq, 8192] float32
IMAGE_STORES = ("image",)


@dataclass
class Recall:
    """``docs[i]`` document numbers (best first) and ``scores[i]`` fused scores of query i;
    ``sides[i]`` the sides actually used; ``units[i]`` how many store items query i was scored against;
    ``paths[i]`` per store the path that ran and why; ``budget[i]`` per store searched through a
    prefilter with the adaptive budget, its counts (candidates, scored_exactly, ncells, stop, exhaustive)."""
    docs: list[np.ndarray]
    scores: list[np.ndarray]
    sides: list[tuple[str, ...]]
    units: list[int]
    paths: list[dict[str, str]] = field(default_factory=list)  # per query: store -> "path: reason"
    budget: list[dict[str, dict]] = field(default_factory=list)  # per query: store -> the adaptive budget's counts


log = logging.getLogger("colgraph_engine")
_PREFILTERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # IndexView -> {(store, nbits): index}
_STATE_TENSORS = ("centroids", "codes", "residuals", "offsets", "ids", "alive", "cells_offsets", "cells", "ivf_offsets",
                  "ivf_docs")  # an IndexState's tensors that live on its device (cutoffs, weights: the CPU)


def _prefilter_for(view: IndexView, name: str, nbits: int):
    """The view's prefilter over store `name` (built on first use; ids are store slots)."""
    from ..prefilter import PrefilterIndex
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
    from ..prefilter import PrefilterIndex
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


def _cached(view: IndexView, key, make):
    per_view = _PREFILTERS.setdefault(view, {})
    if key not in per_view:
        per_view[key] = make()
    return per_view[key]


def _live_tokens(view: IndexView, name: str) -> int:
    """Live token count of the view's copy of store `name` (once per view)."""
    vec = view.vectors[name]
    return _cached(view, (name, "tokens"), lambda: int((vec.offsets.diff() * vec.alive).sum()))


def _on_vectors(vec, by_uid: bool, view: IndexView | None = None, name: str | None = None):
    """The prefilter's exact stage on the view's copy of a store: MaxSim of each shortlisted pair
    over the original vectors. Prefilter ids are the store's uids (`by_uid`, a carried
    prefilter) or its slots. The uid order is sorted once per view (given `view` and `name`)."""
    order = None
    if by_uid:
        order = torch.sort(vec.ids) if view is None else _cached(view, (name, "uid_order"), lambda: torch.sort(vec.ids))

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


_HINTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # KnowledgeIndex -> stores warned about


def _carried_checked(view: IndexView, name: str):
    """``(prefilter, None)`` when the index carries a prefilter for store `name` that describes
    exactly the view's copy of the store (the same live items and tokens), else ``(None, why)``.
    Checked once per view."""
    def check():
        info = view.index.prefilter_info()
        if info is None:
            return None, "the index carries no prefilters"
        if name not in info["stores"]:
            return None, "the index's prefilters do not cover this store"
        idx = _carried_prefilter(view, name)
        if idx is None:
            if view.index.version != view.version:
                return None, "the index changed since this view was made (its prefilter describes a newer version)"
            need = info["stores"][name].get("min_tokens", info["min_tokens"])
            return None, f"its prefilter is deferred ({info['stores'][name].get('tokens', 0):,} tokens < the index's " \
                         f"min_tokens {need:,} for this store)"
        s = idx.snapshot()
        items = int(view.vectors[name].alive.sum())
        tokens = int(((s.offsets[1:] - s.offsets[:-1]) * s.alive).sum())
        if s.n_live != items or tokens != _live_tokens(view, name):
            why = (f"its carried prefilter disagrees with the store ({s.n_live:,} items / {tokens:,} tokens, the store "
                   f"{items:,} / {_live_tokens(view, name):,}; reopen with repair_prefilter=True)")
            log.warning("colgraph_engine: store %r: %s; recall scores it exactly", name, why)
            return None, why
        return idx, None
    return _cached(view, (name, "checked"), check)


def _doc_column(view: IndexView, name: str) -> torch.Tensor:
    """``[N]`` int64 document column (position in ``view.numbers``) of every slot of store `name`,
    once per view: recomputing it for every query batch was O(units) work even on the
    prefilter path."""
    return _cached(view, (name, "doc_column"),
                   lambda: torch.from_numpy(np.searchsorted(view.numbers, view.stores[name].doc)))


def _hint(view: IndexView, name: str, why: str, size: str, threshold: int) -> None:
    """Logs once per index and store that a large store is scored exactly for want of a prefilter
    (`size`: its live tokens, scaled by d / AUTO_DIM as the auto rule compares them)."""
    seen = _HINTED.setdefault(view.index, set())
    if name in seen:
        return
    seen.add(name)
    log.warning("colgraph_engine: store %r holds %s (>= prefilter_min_tokens %s) but %s: document "
                "recall scores it exactly (O(tokens) per query). Make the index carry a prefilter for sublinear "
                "recall: `colgraph index prefilter INDEX` or KnowledgeIndex.enable_prefilter()",
                name, size, f"{threshold:,}", why)


def _groups(view: IndexView, name: str, idx, carried: bool, col: torch.Tensor) -> np.ndarray:
    """``[N]`` the group (document) of every position of prefilter `idx` (once per view)."""
    def make():
        ids = idx.snapshot().ids.cpu()
        return (ids >> UID_SHIFT).numpy() if carried else col[ids.clamp(max=max(col.numel() - 1, 0))].numpy()
    return _cached(view, (name, "groups", carried, id(idx)), make)


def _prefilter_side(view: IndexView, name: str, store, sub_v, sub_o, cfg: PipelineConfig, best: torch.Tensor,
                    col: torch.Tensor, paths: list[str], ranker: str = "prefilter",
                    stats: list[dict] | None = None) -> bool:
    """Scores store `name` through a prefilter when the ranker (``"auto"`` or ``"prefilter"``)
    says so: fills `best` and returns True; returns False (the reason appended to `paths`) when
    exact MaxSim should run instead."""
    from ..prefilter import AutoSearcher
    n_live = _cached(view, (name, "live"), lambda: int(store.alive.sum()))
    if n_live == 0:
        return False
    if ranker == "auto":
        tokens, least, dim = _live_tokens(view, name), cfg.prefilter_min_tokens, view.vectors[name].dim
        size = f"{tokens:,} live tokens" if dim == AUTO_DIM else f"{tokens:,} live tokens x d {dim} / {AUTO_DIM}"
        if tokens * dim < least * AUTO_DIM:  # exact's work grows with tokens x d, the prefilter's hardly with d
            paths.append(f"{name}: exact (auto: {size} < prefilter_min_tokens {least:,}: exact MaxSim is faster at "
                         f"this size; no prefilter used or built)")
            return False
        idx, why = _carried_checked(view, name)
        if idx is None:
            paths.append(f"{name}: exact (auto: {size} >= prefilter_min_tokens {least:,}, but {why}; "
                         f"no prefilter is built on the query path)")
            _hint(view, name, why, size, least)
            return False
        carried = True
        reason = f"auto: {size} >= prefilter_min_tokens {least:,}; carried by the index, nbits {idx.nbits}"
    else:
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
        if path != "prefilter":
            paths.append(f"{name}: {path} ({reason})")
            return False
    on = "store" if cfg.prefilter_exact == "store" else "codes"
    rescore = _on_vectors(view.vectors[name], carried, view, name) if on == "store" else None
    if cfg.prefilter_budget == "plaid":
        k = min(n_live, len(idx), max(cfg.prefilter_units, cfg.kd))
        res = idx.search(sub_v.float(), sub_o, k, rescore=rescore)
        ids, s = res.ids.cpu(), res.scores.cpu()
        owner = torch.arange(ids.shape[0])[:, None].expand_as(ids).reshape(-1)
        ids, s = ids.reshape(-1), s.reshape(-1)
        budget = ""  # the reason as before the adaptive budget existed
    else:
        groups = _groups(view, name, idx, carried, col)
        kd = min(cfg.kd, int(view.stores[name].numbers.size))
        res = idx.search_adaptive(sub_v.float(), sub_o, max(kd, 1), groups=groups, rescore=rescore, assume_finite=True)
        ids, s = torch.from_numpy(res.ids), torch.from_numpy(res.scores)
        owner = torch.from_numpy(np.repeat(np.arange(res.offsets.size - 1), np.diff(res.offsets)))
        budget = "adaptive budget"  # per-query counts: Recall.budget (the reason is the same for every query)
        if stats is not None:
            for j, row in enumerate(stats):
                row[name] = {key: res.stats[key][j] for key in ("candidates", "scored_exactly", "ncells", "stop",
                                                                  "exhaustive")}
    paths.append(f"{name}: prefilter ({reason}; {budget + '; ' if budget else ''}exact stage on the {on})")
    found = ids >= 0
    if carried:  # uids -> the view's document columns; a document the view lacks is not seen
        number = (ids.clamp(min=0) >> UID_SHIFT).numpy()
        at = np.minimum(np.searchsorted(view.numbers, number), max(view.n_documents - 1, 0))
        found &= torch.from_numpy(view.numbers[at] == number) if view.n_documents else torch.zeros_like(found)
        docs = torch.from_numpy(at.astype(np.int64))
    else:
        docs = col[ids.clamp(min=0)]
    s = torch.where(found, s, float("-inf"))
    d = best.shape[1]
    best.view(-1).scatter_reduce_(0, owner * d + docs, s, reduce="amax", include_self=True)
    return True


def _side_scores(view: IndexView, stores, qv, qo, ranker: str, rows: np.ndarray,
                 cfg: PipelineConfig | None = None, paths: list[str] | None = None,
                 stats: list[dict] | None = None) -> tuple[torch.Tensor, int]:
    """``[len(rows), D]`` best unit score per document (-inf where it has none) for query rows;
    `paths` gets one ``"store: path (reason)"`` per store, `stats` (one dict per row) the adaptive
    budget's counts per store searched through a prefilter."""
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
        col = _doc_column(view, name)  # [N] document column
        if ranker in ("auto", "prefilter"):
            if _prefilter_side(view, name, store, sub_v, sub_o, cfg or PipelineConfig(recall_ranker=ranker), best, col,
                               paths if paths is not None else [], ranker, stats):
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


def finite_desc(scores: torch.Tensor) -> torch.Tensor:
    """``[m]`` int64 columns of the finite entries of ``scores [D]``, best first, the earlier column
    first on ties: the order a stable descending sort of all D entries gives them (-inf last),
    found by sorting only the m scored ones."""
    cols = torch.nonzero(torch.isfinite(scores)).squeeze(1)
    return cols[torch.sort(scores[cols], descending=True, stable=True).indices]


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
        if cfg.fusion == "rrf":  # ranks over the scored documents only: O(scored), not O(D), per query
            contrib = torch.zeros((rows.size, d), dtype=torch.float64)
            for j in range(rows.size):
                cols = finite_desc(s[j])
                contrib[j, cols] = 1.0 / (cfg.rrf_k + torch.arange(1, cols.numel() + 1, dtype=torch.float64))
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
    budget: list[dict[str, dict]] = [{} for _ in range(nq)]
    for side, stores, packed, rows in (("text", TEXT_STORES, text_q, text_rows),
                                       ("image", IMAGE_STORES, image_q, image_rows)):
        if not rows.size:
            continue
        side_paths: list[str] = []
        side_stats: list[dict] = [{} for _ in range(rows.size)]
        s, u = _side_scores(view, stores, *packed, cfg.recall_ranker, rows, cfg, side_paths, side_stats)
        for j, r in enumerate(rows.tolist()):
            budget[r].update(side_stats[j])
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
    for i in range(nq):
        o = finite_desc(fused[i])[:k]
        docs.append(view.numbers[o.numpy()])
        scores.append(fused[i, o].numpy().astype(np.float32))
    return Recall(docs, scores, [tuple(s) for s in sides], units, paths, budget)


def carry_default_prefilters(index, *, commit: bool = True) -> dict[str, str]:
    """Makes an index carry the recall stores' prefilters, each deferred until its store is
    large enough for the default ``recall_ranker="auto"`` to use it
    (:func:`~colgraph_engine.kg.index.prefilters.auto_min_tokens`), as
    :meth:`KnowledgeIndex.create <colgraph_engine.kg.KnowledgeIndex.create>` does for a new one:
    what the service's writer does to an index that carries none (`commit`: False leaves the
    settings to the caller's next commit)."""
    return index.enable_prefilter(**_auto_prefilters.auto_options(index.dims), commit=commit)
