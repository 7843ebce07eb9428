"""PrefilterIndex: a PLAID-style compressed multi-vector index with exact rescoring.

Build it over a :class:`~colgraph_engine.store.PackedStore` (``PrefilterIndex.from_store``) or
packed ``(values [T, d], offsets [N+1])`` with stable int64 ids, then :meth:`~PrefilterIndex.search`.
Documents keep their external ids; deletion tombstones a position (nothing is renumbered).

Concurrency: like the store, each version is one immutable :class:`~.layout.IndexState`;
writers (add, delete, rebuild) build the next state beside the current one and publish it with
one assignment under a lock, so a failed add leaves the index unchanged and a concurrent
search sees one version.

Drift: the centroids were trained for tokens whose mean squared residual ``|x - c|^2`` was
``build_mse``. :meth:`~PrefilterIndex.drift` is the same mean over the tokens added since,
divided by ``build_mse`` (1.0 = added data fits the centroids as well as the built data);
:meth:`~PrefilterIndex.add` rebuilds when it passes ``rebuild_drift`` (ours: 1.5; None = never).
"""
from __future__ import annotations

import math
import numbers
import os
import threading
from collections.abc import Sequence

import numpy as np
import torch

from .. import backend as _backend
from ..packed import check_finite, check_no_grad, check_offsets, check_values, pack
from . import build as _build
from . import codec, persist
from . import search as _search
from .layout import IndexState, derive_lists
from .row_parts import RowParts

DEFAULT_REBUILD_DRIFT = 1.5


def _ids_tensor(ids, n: int, name: str = "ids") -> torch.Tensor:
    t = torch.as_tensor(ids, dtype=torch.int64) if not isinstance(ids, torch.Tensor) else ids
    if t.dtype not in (torch.int64, torch.int32) or t.dim() != 1:
        raise TypeError(f"{name}: expected a 1-D sequence of int ids")
    if t.numel() != n:
        raise ValueError(f"{name}: expected {n} ids (one per document), got {t.numel()}")
    t = t.to(torch.int64)
    if n and (int(t.min()) < 0 or torch.unique(t).numel() != n):
        raise ValueError(f"{name}: expected unique non-negative ids")
    return t


def _as_packed(docs, offsets, name="documents"):
    if offsets is None:
        if isinstance(docs, (torch.Tensor, RowParts)):
            raise TypeError(f"{name}: a packed [T, d] tensor needs its offsets")
        return pack(docs, name=name)
    return docs, offsets


class PrefilterIndex:
    """See the module docstring. Construct with :meth:`build`, :meth:`from_store` or :meth:`load`."""

    def __init__(self, state: IndexState, build_options: dict | None = None):
        self._state = state
        self._lock = threading.Lock()
        self.build_options = dict(build_options or {})

    # -- construction -------------------------------------------------------------------
    @classmethod
    def build(cls, documents, offsets: torch.Tensor | None = None, ids=None, *, nbits: int = 2,
              n_centroids: int | None = None, max_points: int | None = None,
              iterations: int = _build.kmeans.DEFAULT_ITERATIONS, seed: int = 0,
              device: str | torch.device | None = None, progress: bool = False,
              normalize_decoded: bool | None = None) -> PrefilterIndex:
        """Builds over documents: a sequence of ``[L_i, d]`` tensors, or packed ``values [T, d]``
        (a tensor, or a :class:`~.row_parts.RowParts` read without joining its parts) with
        ``offsets [N+1]``. `ids`: ``[N]`` unique non-negative int64 (default ``0..N-1``).
        `device`: where the index lives and k-means runs (default: the values' device).
        `normalize_decoded`: see :func:`.build.build_state` (default: on for unit-vector inputs).

        Raises ValueError for an empty corpus (no tokens), nbits outside {1, 2, 4}, a dimension
        nbits cannot pack, non-finite values or bad ids."""
        values, offsets = _as_packed(documents, offsets)
        values, offsets = _build.check_corpus(values, offsets, "documents")
        for part in values.parts if isinstance(values, RowParts) else (values,):
            check_no_grad(part, "documents", "the index keeps codes, not autograd graphs")
        n = offsets.numel() - 1
        ids = torch.arange(n, dtype=torch.int64) if ids is None else _ids_tensor(ids, n)
        opts = dict(nbits=nbits, n_centroids=n_centroids, max_points=max_points, iterations=iterations, seed=seed,
                    normalize_decoded=normalize_decoded)
        bar = None
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=iterations, desc="prefilter k-means", unit="iter")
        try:
            state = _build.build_state(values, offsets, ids, device=device, progress=bar.update if bar else None,
                                       **opts)
        finally:
            if bar is not None:
                bar.close()
        return cls(state, opts)

    @classmethod
    def from_store(cls, store, **options) -> PrefilterIndex:
        """Builds over the live items of a :class:`~colgraph_engine.store.PackedStore`, keyed by
        the store's ids, on the store's device (options as :meth:`build`)."""
        snap = store.snapshot()
        if snap.n_live < snap.n_slots:
            keep = torch.nonzero(snap.alive).squeeze(1)
            lo, hi = snap.offsets[keep], snap.offsets[keep + 1]
            docs = [snap.values[int(a):int(b)] for a, b in zip(lo.tolist(), hi.tolist())]
            values, offsets = pack(docs) if docs else (snap.values[:0], torch.zeros(1, dtype=torch.int64))
            ids = snap.ids[keep]
        else:
            values, offsets, ids = snap.values, snap.offsets, snap.ids
        if store.normalize:
            values = torch.nn.functional.normalize(values.float(), dim=-1)
        options.setdefault("device", store.device)
        out = cls.build(values, offsets.to(values.device), ids.cpu(), **options)
        out.build_options["normalize"] = store.normalize
        return out

    # -- views ---------------------------------------------------------------------------
    def snapshot(self) -> IndexState:
        return self._state

    @property
    def dim(self) -> int:
        return self._state.dim

    @property
    def nbits(self) -> int:
        return self._state.nbits

    @property
    def device(self) -> torch.device:
        return self._state.centroids.device

    def __len__(self) -> int:
        return self._state.n_live

    def __repr__(self) -> str:
        s = self._state
        return (f"PrefilterIndex(docs={s.n_live}, deleted={s.n_slots - s.n_live}, tokens={s.n_tokens}, "
                f"centroids={s.n_centroids}, nbits={s.nbits}, dim={s.dim}, device={self.device})")

    def bytes_per_token(self) -> dict[str, float]:
        """Index bytes per stored token: ``codes_and_residuals`` (the compressed vectors) and
        ``total`` (plus inverted lists, document arrays and centroids)."""
        s = self._state
        b = s.nbytes()
        t = max(1, s.n_tokens)
        return {"codes_and_residuals": (b["codes"] + b["residuals"]) / t, "total": sum(b.values()) / t}

    def drift(self) -> float:
        """Mean squared residual of the tokens added since the build over that at build (1.0
        when nothing was added)."""
        s = self._state
        if s.added_tokens == 0 or s.build_mse <= 0:
            return 1.0
        return (s.added_sq_sum / s.added_tokens) / s.build_mse

    # -- search --------------------------------------------------------------------------
    def _queries(self, queries, q_offsets, assume_finite: bool = False):
        """``(qv [Tq, d] float32 on the index's device, qo [Nq+1] there, qo as a list)``. The offsets
        are checked on the host (read back once when given on a device); the values' finiteness
        is checked unless `assume_finite`."""
        qv, qo = _as_packed(queries, q_offsets, "queries")
        qv = check_values(qv, "queries")
        if not isinstance(qo, torch.Tensor):
            raise TypeError(f"q_offsets: expected a torch.int64 tensor, got {type(qo).__name__}")
        qo_cpu = qo.cpu()
        check_offsets(qo_cpu, qv.shape[0], qo_cpu.device, "q_offsets")
        if qv.shape[1] != self.dim:
            raise ValueError(f"queries: expected dimension d={self.dim} (the index's), got {qv.shape[1]}")
        if qv.shape[0] and not assume_finite:
            check_finite(qv, "queries")
        qv = qv.to(self.device).float()
        if self.build_options.get("normalize"):
            qv = torch.nn.functional.normalize(qv, dim=-1)
        return qv, qo_cpu.to(self.device), qo_cpu.tolist()

    def search(self, queries, q_offsets: torch.Tensor | None = None, k: int = 10, *, ncells: int | None = None,
               centroid_score_threshold: float | None = None, ndocs: int | None = None,
               allowed: Sequence | None = None, exact_allowed: bool | None = None,
               backend: str | None = None, store=None, rescore=None, dense: bool | None = None,
               assume_finite: bool = False) -> _search.SearchResult:
        """Top-k documents per query by the staged PLAID search (see :mod:`.search`).

        Args:
            queries: a sequence of ``[L_i, d]`` tensors, or packed ``[Tq, d]`` with `q_offsets`.
            k: results per query; ValueError when larger than the live documents.
            ncells, centroid_score_threshold, ndocs: override PLAID's defaults for k.
            allowed: optional per-query id lists (restricted search); exact_allowed: see :mod:`.search`.
            backend: exact stage: ``"triton"`` (CUDA, or the interpreter), ``"native"`` (CPU,
                C++), ``"torch"``; default: triton on CUDA, native on the CPU.
            store: optional :class:`~colgraph_engine.store.PackedStore` holding the original
                vectors under the same ids: the exact stage then scores the shortlist on them
                (``store.score_candidates``) instead of the decoded vectors.
            rescore: optional callable ``fn(qv [Tb, d], qo [Nb+1], pair_q [M], pair_ids [M]) -> [M]``
                float32 scores of the shortlisted (query, external id) pairs of a block of queries
                (``qv``/``qo`` on the index's device, ``pair_q`` sorted); replaces the exact stage
                like `store` does, for vectors held elsewhere (the pipeline's view of a store).
            dense: stages 2-4 computed densely over every document (:mod:`.dense`) or from the
                inverted lists; the results are the same. None: the sparse stages, unless
                ``COLGRAPH_PREFILTER_DENSE=1`` lets :func:`.dense.use_dense` pick (a few queries on
                an accelerator; never for restricted search).
            assume_finite: skip the NaN/inf check of the queries (the caller vouches for them).
        """
        state = self._state
        if not isinstance(assume_finite, bool):
            raise TypeError(f"assume_finite: expected a bool, got {type(assume_finite).__name__}")
        if dense is not None and not isinstance(dense, bool):
            raise TypeError(f"dense: expected a bool or None, got {type(dense).__name__}")
        qv, qo, qo_host = self._queries(queries, q_offsets, assume_finite)
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"k: expected a positive int, got {k!r}")
        if k > state.n_live:
            raise ValueError(f"k: expected at most the {state.n_live} live documents of the index, got {k}")
        if exact_allowed is not None and not isinstance(exact_allowed, bool):
            raise TypeError(f"exact_allowed: expected a bool or None, got {type(exact_allowed).__name__}")
        settings = _search.Settings.for_k(int(k), ncells, centroid_score_threshold, ndocs)
        name = resolve_backend(self.device, backend)
        rescore_fn = None
        if store is not None and rescore is not None:
            raise ValueError("store, rescore: expected at most one of them")
        if rescore is not None:
            if not callable(rescore):
                raise TypeError(f"rescore: expected a callable, got {type(rescore).__name__}")

            def rescore_fn(bv, bq, pq, pd):
                return rescore(bv, bq, pq, state.ids[pd]).to(qv.device, torch.float32)
        if store is not None:
            if store.dim != self.dim:
                raise ValueError(f"store: expected dimension d={self.dim}, got {store.dim}")

            def rescore_fn(bv, bq, pq, pd):
                co = torch.zeros(bq.numel(), dtype=torch.int64)
                torch.cumsum(torch.bincount(pq.cpu(), minlength=bq.numel() - 1), 0, out=co[1:])
                return store.score_candidates(bv.to(store.device), bq.cpu(), co, state.ids[pd].cpu(),
                                              assume_finite=True).to(qv.device)
        with torch.no_grad():
            res = _search.run(state, qv, qo, int(k), settings, name, allowed=allowed, exact_allowed=exact_allowed,
                              rescore_fn=rescore_fn, dense=dense, qo_host=qo_host)
        on = "the store" if store is not None else "the caller's vectors" if rescore is not None else repr(name)
        res.reason = f"prefilter requested; exact stage on {on}"
        res.stats["backend"] = "store" if store is not None else "rescore" if rescore is not None else name
        return res

    def search_adaptive(self, queries, q_offsets: torch.Tensor | None = None, k: int = 10, *, groups=None,
                        rescore=None, budget=None, assume_finite: bool = False):
        """Every item the adaptive budget scores exactly, per query (:func:`.adaptive.search`:
        the budget is set per query from the centroid scores and the query's score
        distribution, so that the top-`k` **groups** by their best item are found).

        Args:
            k: groups wanted per query (at least 1; a query finding fewer scores every live item).
            groups: ``[N]`` int64 group of each position of the index (``snapshot().ids[i]``'s
                group; e.g. the document of each item); None: each item its own group.
            rescore: the exact stage, ``fn(qv [Tq, d], qo [Nq+1], pair_q [M], pair_ids [M]) -> [M]``
                (as :meth:`search`'s: pairs sorted by query; called with the whole batch, once per
                round of the lockstep search); None: exact MaxSim on the decoded codes.
            budget: an :class:`.adaptive.Budget` (None: its defaults).

        Returns an :class:`.adaptive.GroupResult` (CSR of external ids and exact scores)."""
        from . import adaptive, rescore as _rescore, stages
        state = self._state
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"k: expected a positive int, got {k!r}")
        if rescore is not None and not callable(rescore):
            raise TypeError(f"rescore: expected a callable, got {type(rescore).__name__}")
        if budget is not None and not isinstance(budget, adaptive.Budget):
            raise TypeError(f"budget: expected an adaptive.Budget or None, got {type(budget).__name__}")
        if groups is not None:
            groups = np.asarray(groups.cpu() if isinstance(groups, torch.Tensor) else groups)
            if groups.shape != (state.n_slots,) or groups.dtype.kind not in "iu":
                raise ValueError(f"groups: expected [{state.n_slots}] ints (one per position), got "
                                 f"{groups.dtype} {groups.shape}")
            groups = groups.astype(np.int64, copy=False)
        qv, qo, _ = self._queries(queries, q_offsets, assume_finite)
        if rescore is None:
            name = resolve_backend(self.device, None)
            cache = {}

            def rescore(bv, bq, pq, ids):  # exact MaxSim on the decoded codes (centroid scores once per batch)
                bv = bv.to(self.device)
                key = (bv.data_ptr(), tuple(bv.shape))
                if key not in cache:
                    cache.clear()
                    cache[key] = stages.centroid_scores(state, bv)
                pos = state.positions(ids, "ids")
                return _rescore.exact_scores(state, bv, bq.to(self.device), cache[key], pq.to(self.device), pos, name)
        with torch.no_grad():
            return adaptive.search(state, qv.cpu(), qo.cpu(), int(k), groups, rescore,
                                   adaptive.DEFAULT if budget is None else budget)

    # -- maintenance ---------------------------------------------------------------------
    def add(self, documents, offsets: torch.Tensor | None = None, ids=None, *,
            rebuild_drift: float | None = DEFAULT_REBUILD_DRIFT) -> torch.Tensor:
        """Adds documents against the existing centroids; returns their ``[K]`` ids (default: the
        next free ids). When the drift afterwards exceeds `rebuild_drift`, the centroids are
        re-trained over all live documents (decoded from their codes; see :meth:`rebuild`).
        Any failed check leaves the index unchanged."""
        values, offsets = _as_packed(documents, offsets)
        values, offsets = _build.check_corpus(values, offsets, "documents")
        if values.shape[1] != self.dim:
            raise ValueError(f"documents: expected dimension d={self.dim} (the index's), got {values.shape[1]}")
        if rebuild_drift is not None and (isinstance(rebuild_drift, bool) or not isinstance(rebuild_drift, numbers.Real)
                                          or not math.isfinite(rebuild_drift) or rebuild_drift <= 0):
            raise ValueError(f"rebuild_drift: expected a positive number or None, got {rebuild_drift!r}")
        if self.build_options.get("normalize"):
            values = torch.nn.functional.normalize(values.float(), dim=-1)
        k = offsets.numel() - 1
        with self._lock:
            s = self._state
            if ids is None:
                new_ids = torch.arange(s.next_id, s.next_id + k, dtype=torch.int64)
            else:
                new_ids = _ids_tensor(ids, k)
                if k:
                    sid, _ = s.id_lookup()
                    at = torch.searchsorted(sid, new_ids.to(sid.device)).clamp(max=max(sid.numel() - 1, 0))
                    clash = sid[at] == new_ids.to(sid.device) if sid.numel() else torch.zeros(k, dtype=torch.bool)
                    if bool(clash.any()):
                        raise ValueError(f"ids: id {int(new_ids[clash.cpu()][0])} is already in the index")
            dev = self.device
            codes, resid, sq = _build.encode(values, s.centroids, s.cutoffs, s.nbits)
            t_old = s.n_tokens
            all_codes = torch.cat([s.codes, codes])
            all_offsets = torch.cat([s.offsets, offsets.to(dev)[1:] + t_old])
            lists = derive_lists(all_codes, all_offsets, s.n_centroids)
            new = s.with_(codes=all_codes, residuals=torch.cat([s.residuals, resid]), offsets=all_offsets,
                          ids=torch.cat([s.ids, new_ids.to(dev)]),
                          alive=torch.cat([s.alive, torch.ones(k, dtype=torch.bool, device=dev)]),
                          cells_offsets=lists[0], cells=lists[1], ivf_offsets=lists[2], ivf_docs=lists[3],
                          added_sq_sum=s.added_sq_sum + sq, added_tokens=s.added_tokens + values.shape[0],
                          next_id=max(s.next_id, int(new_ids.max()) + 1 if k else 0))
            if rebuild_drift is not None and self._drift_of(new) > rebuild_drift:
                new = self._rebuilt(new)
            self._state = new
        return new_ids

    @staticmethod
    def _drift_of(s: IndexState) -> float:
        return (s.added_sq_sum / s.added_tokens) / s.build_mse if s.added_tokens and s.build_mse > 0 else 1.0

    def delete(self, ids) -> int:
        """Tombstones documents by external id (positions and other ids unchanged); returns the
        count. Unknown, already deleted or repeated ids raise ValueError and nothing changes."""
        t = torch.as_tensor(ids, dtype=torch.int64) if not isinstance(ids, torch.Tensor) else ids.to(torch.int64)
        if t.dim() != 1:
            raise TypeError("ids: expected a 1-D sequence of int ids")
        if torch.unique(t).numel() != t.numel():
            raise ValueError("ids: expected each id once")
        with self._lock:
            s = self._state
            pos = s.positions(t, "ids")
            alive = s.alive.clone()
            alive[pos] = False
            self._state = s.with_(alive=alive)
        return int(t.numel())

    def decoded(self, state: IndexState | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(values [T', d] float32, offsets [N'+1], ids [N'])`` of the live documents, decoded
        from codes and residuals (the vectors the exact stage scores)."""
        s = self._state if state is None else state
        keep = torch.nonzero(s.alive).squeeze(1)
        from .stages import _expand_csr
        owner, rows = _expand_csr(s.offsets, keep)
        table = codec.byte_table(s.weights, s.nbits).to(s.codes.device)
        values = s.centroids[s.codes[rows].long()] + codec.decode_residuals(s.residuals[rows], table)
        if s.unit:
            values = torch.nn.functional.normalize(values, dim=-1)
        lengths = (s.offsets[keep + 1] - s.offsets[keep])
        offsets = torch.zeros(keep.numel() + 1, dtype=torch.int64, device=values.device)
        torch.cumsum(lengths, 0, out=offsets[1:])
        return values, offsets, s.ids[keep]

    def _rebuilt(self, s: IndexState) -> IndexState:
        values, offsets, ids = self.decoded(s)
        opts = {k: v for k, v in self.build_options.items() if k != "normalize"}
        opts["nbits"] = s.nbits
        new = _build.build_state(values, offsets, ids.cpu(), device=self.device, **opts)
        return new.with_(next_id=max(new.next_id, s.next_id))

    def rebuild(self, store=None) -> None:
        """Re-trains centroids and codec over the live documents and re-encodes them: from
        `store` (a PackedStore holding the original vectors under the same ids) when given,
        else from the decoded vectors. Deleted documents are dropped; ids are kept."""
        with self._lock:
            s = self._state
            if store is None:
                new = self._rebuilt(s)
            else:
                other = PrefilterIndex.from_store(store, **{k: v for k, v in self.build_options.items()
                                                            if k != "normalize"}, device=self.device)
                new = other._state.with_(next_id=max(other._state.next_id, s.next_id))
            if new.n_live == 0:
                raise ValueError("rebuild: no live documents")
            self._state = new

    # -- persistence ---------------------------------------------------------------------
    def save(self, path: str | os.PathLike):
        """Writes the index atomically to directory `path` (checksummed arrays; see :mod:`.persist`)."""
        return persist.save(self._state, self.build_options, path)

    @classmethod
    def load(cls, path: str | os.PathLike, *, device: str | torch.device = "cpu", verify: bool = True) -> PrefilterIndex:
        state, options = persist.load(path, device=device, verify=verify)
        return cls(state, options)


def resolve_backend(device: torch.device, backend: str | None) -> str:
    """The exact stage's backend (see :mod:`.rescore`): the caller's, else ``COLGRAPH_BACKEND``,
    else ``triton`` on CUDA and ``native`` on the CPU, falling back to ``torch``. A backend
    named explicitly runs or raises ValueError with the reason."""
    wanted = _backend.requested_backend(backend)
    if wanted is None:
        preferred = "triton" if device.type == "cuda" else "native"
        return preferred if _backend._why_not(preferred, device) is None else "torch"
    why = _backend._why_not(wanted, device)
    if why is not None:
        raise ValueError(f"backend {wanted!r} cannot run the prefilter's exact stage: {why}")
    return wanted
