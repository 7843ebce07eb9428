"""One shard: an index directory of its own, served by one process (a Ray actor, see
:mod:`.corpus`; the class itself is plain Python and runs in-process too).

A shard answers two questions of the query path:

* :meth:`Shard.recall_scores` (stage 1, scattered to every shard): per side, every document's
  best unit score for each query row, exactly as the single-process recall computes it
  (``pipeline.recall._side_scores`` over this shard's stores), with the document ids in the
  shard's order. The driver puts the columns in global order and fuses (:mod:`.fusion`).
* :meth:`Shard.gather_documents` (the gather before stages 2-7): the recalled documents' graphs
  and vectors as one bundle (:mod:`.bundle`), the rows as bytes or as where they lie in the
  shard's vector files; stage 1 can ship its top lists' documents the same way (``ship``).
  :meth:`Shard.stored_documents` gives them per document (a rebalancing move).

Writes (:meth:`add`, :meth:`remove`) go through the shard's own :class:`KnowledgeIndex`
directory (committed before the call returns). A shard opens its directory with encoders=None:
queries are encoded on the driver, and documents arrive encoded.

The query path's calls (stage 1, the gather) can also arrive over a direct connection
(:meth:`Shard.open_channel`, :mod:`.channel`), served on another thread: every entry point holds
the shard's lock, so those calls and the Ray calls never interleave.
"""
from __future__ import annotations

import functools
import os
import pickle
import socket
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import torch

from ..kg.index import KnowledgeIndex
from ..ops._native_impl import num_threads
from ..pipeline.recall import IMAGE_STORES, TEXT_STORES, _side_scores
from ..pipeline.view import IndexView
from .bundle import PartRef, pack_documents
from .channel import ChannelServer

SIDE_STORES = {"text": TEXT_STORES, "image": IMAGE_STORES}
CHANNEL_METHODS = ("recall_scores", "gather_sendable", "ping")  # what the direct connection serves


def _locked(method):
    """Runs the method under the shard's lock (Ray calls and direct-connection calls come from
    different threads)."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return run


class Shard:
    """One shard's index, opened (or created empty) in `path`.

    Args:
        path: the shard's index directory.
        create: ``None`` (open), or ``{"dims": {store: d}, "dtype": "float32" | ...}`` to create
            an empty index there when none exists yet.
        torch_threads: torch's intra-op threads in this process (None: leave as is).
    """

    def __init__(self, path: str | os.PathLike, create: dict | None = None, torch_threads: int | None = None):
        if torch_threads is not None:
            torch.set_num_threads(torch_threads)
        self._lock = threading.RLock()
        self._channel: ChannelServer | None = None
        self.path = Path(path)
        if create is not None and not (self.path / "manifest.json").exists():
            dtype = getattr(torch, create["dtype"])
            self.index = KnowledgeIndex.create(self.path, None, dtype=dtype, dims=create["dims"])
        else:
            self.index = KnowledgeIndex.open(self.path, None, verify=False)
        self._view: IndexView | None = None
        self._token = uuid.uuid4().hex  # versions of different actor lives never compare equal
        # a thread count given to this process (the actor's runtime environment) is the caller's
        # choice; otherwise share_cores may set one
        self._threads_given = os.environ.get("COLGRAPH_NUM_THREADS", "").strip() or None

    def _current_view(self) -> IndexView:
        if self._view is None or self._view.graph is not self.index.graph or self._view.version != self.index.version:
            self._view = IndexView(self.index)
            self._units_cache: dict = {}  # per view: units per side, store offsets, vector files
        return self._view

    def ping(self) -> int:
        """The process id (a liveness check)."""
        return os.getpid()

    def node(self) -> str:
        """Which machine this shard runs on: its Ray node id (the host name outside Ray)."""
        try:
            import ray
            if ray.is_initialized():
                return ray.get_runtime_context().get_node_id()
        except ImportError:
            pass
        return socket.gethostname()

    @_locked
    def share_cores(self, shards_here: int) -> int:
        """Gives this shard's native kernels ``max(1, cores // shards_here)`` threads (cores: the
        ones this process may run on), unless its environment named a thread count; returns the
        count in effect. Why (the split is our choice): every shard's stage 1 runs at the same
        time, so shards that share a machine and each take every core oversubscribe it, and the
        slowest shard, which sets the query's latency, waits on the others' threads
        (``benchmarks/results/ray_shards.md`` compares ``every core each``)."""
        if isinstance(shards_here, bool) or not isinstance(shards_here, int) or shards_here < 1:
            raise ValueError(f"shards_here: expected an int >= 1, got {shards_here!r}")
        if self._threads_given is None:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            os.environ["COLGRAPH_NUM_THREADS"] = str(max(1, cores // shards_here))
        return num_threads()

    def open_channel(self, authkey: bytes) -> tuple[str, int]:
        """Starts serving :data:`CHANNEL_METHODS` over a direct connection (once per actor) on
        this node's address; returns that address. Only peers holding `authkey` connect."""
        with self._lock:
            if self._channel is None:
                try:
                    import ray
                    host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
                except ImportError:
                    host = "127.0.0.1"
                self._channel = ChannelServer(self, CHANNEL_METHODS, authkey, host)
            elif self._channel_key != authkey:
                raise ValueError("authkey: this shard already serves a channel under another key")
            self._channel_key = authkey
            return self._channel.address

    @_locked
    def documents(self) -> list[str]:
        return self.index.documents

    # -- query path -------------------------------------------------------------------------------
    @_locked
    def recall_scores(self, sides: dict[str, tuple], ranker: str, known: str | None = None, top: int | None = None,
                      skip: list[int] | None = None, ship: bool = False, have: list[int] | None = None,
                      cfg=None) -> dict:
        """Stage 1 on this shard.

        Args:
            sides: ``{"text" | "image": (values [T, d] float32, offsets [Nq+1] int64, rows [r] int64)}``
                (numpy arrays or tensors), or that dict pickled,
                the packed queries of the batch and the rows scored on that side.
            ranker: ``"maxsim"`` or ``"pooled"``.
            known: the ``version`` of this shard's answer the caller already holds the document
                list of (None: none).
            top: None (every document's score), or k: per row only the best k documents (see
                below); honoured only when `known` is the current version (the caller's column
                numbers must be this shard's).
            skip: columns to leave out of `top` lists (documents the map does not list here).
            ship: in mode top, also send the documents of the top lists (their graphs and where
                their rows lie in this shard's vector files, :meth:`gather_documents` with
                ``by_file``): the global top-Kd documents this shard holds are among them, so the
                driver needs no second round to gather them.
            have: columns of documents the caller holds already (its cache): not shipped.
            cfg: the :class:`~colgraph_engine.pipeline.PipelineConfig` for ``ranker="prefilter"``
                (its prefilter settings and Kd): this shard's recall stores are then scored
                through this shard's own prefilters, as the single-process recall does on one
                index (a prefilter its index carries, else one built over the view on first use);
                the answer's ``"paths"`` says per side which path each store took and why.

        Returns ``{"version": str (this actor and its index version), "mode": "full" | "top",
        "seconds": compute time, side: ...}`` in this shard's document order, where side is
        ``scores [r, D]`` float32 (-inf where a document has no unit) in mode full, and in mode
        top ``{"cols": [r] arrays, "scores": [r] float32 arrays, "cut": [r], "truncated": [r],
        "lo": [r], "hi": [r]}``: per row the columns scoring at least the k-th best finite score
        (ties with it included), that score (``cut``), whether finite documents were left out,
        and the min / max finite score (inf / -inf when none). When `known` is not ``version``,
        also ``"doc_ids": [D]`` and ``"units": {side: [D] int64}`` (each document's items in the
        side's stores, for every side), so the caller counts only the documents the map lists.
        With `ship` in mode top, also ``"docs"``: their bundle (:meth:`gather_sendable`);
        ``"seconds"`` counts the scoring, ``"ship_seconds"`` the shipped documents' gathering, and
        ``"clock"`` is ``(start, end)`` of this call in ``time.time()`` seconds (the caller's spans).
        """
        clock = time.time()
        t0 = time.perf_counter()
        view = self._current_view()
        key = f"{self._token}:{view.version}"
        use_top = top is not None and known == key
        out: dict = {"version": key, "mode": "top" if use_top else "full"}
        if isinstance(sides, bytes):  # pickled once by the driver for every shard
            sides = pickle.loads(sides)
        for side, (qv, qo, rows) in sides.items():
            qv, qo = torch.tensor(np.asarray(qv)), torch.tensor(np.asarray(qo))  # numpy travels cheaper than tensors
            side_paths: list[str] = []
            best, _ = _side_scores(view, SIDE_STORES[side], qv, qo, ranker, np.asarray(rows, np.int64), cfg, side_paths)
            if side_paths:
                out.setdefault("paths", {})[side] = side_paths
            if use_top:
                if skip:
                    best[:, torch.as_tensor(skip, dtype=torch.int64)] = -torch.inf
                out[side] = _top_lists(best, top)
            else:
                out[side] = best.numpy()
        if known != key:
            out["doc_ids"] = view.doc_ids
            out["units"] = {side: self._units(view, side) for side in SIDE_STORES}
        out["seconds"] = time.perf_counter() - t0
        if use_top and ship:
            t0 = time.perf_counter()
            cols = np.unique(np.concatenate([c for side in sides for c in out[side]["cols"]] or [np.zeros(0, np.int64)]))
            if have:
                cols = np.setdiff1d(cols, np.asarray(have, np.int64), assume_unique=True)
            ids = [view.doc_ids[c] for c in cols.tolist()]
            out["docs"] = self.gather_sendable(ids, by_file=True)
            out["ship_seconds"] = time.perf_counter() - t0
        out["clock"] = (clock, time.time())
        return out

    @_locked
    def memory(self) -> dict:
        """What this shard holds: documents, items, vector bytes, the merged graph's native
        bytes, the part files' bytes (graphs, strings, item tables; memory-mapped), and this
        process's resident set (``VmRSS``, bytes; 0 where /proc is missing)."""
        view = self._current_view()
        rss = 0
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
        except OSError:
            pass
        parts = self.path / "parts"
        return {"documents": len(self.index), "items": sum(v.n_slots for v in view.vectors.values()),
                "vector_bytes": sum(v.values.numel() * v.values.element_size() for v in view.vectors.values()),
                "graph_bytes": int(self.index.graph.memory_bytes()),
                "part_bytes": sum(f.stat().st_size for f in parts.iterdir()) if parts.is_dir() else 0,
                "rss_bytes": rss}

    def _units(self, view: IndexView, side: str) -> np.ndarray:
        """``[D]`` items of each document in the side's stores (what stage 1 scores), so the
        driver counts only the documents the map lists here."""
        if side not in self._units_cache:
            units = np.zeros(view.n_documents, np.int64)
            for name in SIDE_STORES[side]:
                sv = view.stores.get(name)
                if sv is not None and sv.doc.size:
                    units += np.bincount(np.searchsorted(view.numbers, sv.doc), minlength=view.n_documents)
            self._units_cache[side] = units
        return self._units_cache[side]

    @_locked
    def stored_documents(self, doc_ids: list[str]) -> list[tuple]:
        """``[(graph, {store: (local [k] int64, values [T, d], offsets [k+1] int64)})]`` of
        `doc_ids`, in that order: each document's graph and its items' vectors as numpy arrays
        (they pickle out of band, far cheaper than tensors; bfloat16 rows travel as int16 bits,
        see :func:`.gather.item_vectors`): how a rebalancing move reads a document. A document's
        items are one contiguous run of slots in each store (the view's ``first_slot``), so each
        (document, store) is one slice."""
        view = self._current_view()
        numbers = np.asarray([self.index.doc_number(d) for d in doc_ids], np.int64)
        out = [(self.index.document(d), {}) for d in doc_ids]
        for store, sv in view.stores.items():
            if not sv.doc.size or not numbers.size:
                continue
            at = np.minimum(np.searchsorted(sv.numbers, numbers), sv.numbers.size - 1)
            off = self._offsets(store)
            values = view.vectors[store].values
            if values.dtype == torch.bfloat16:
                values = values.view(torch.int16)
            for i in np.flatnonzero(sv.numbers[at] == numbers).tolist():
                lo, hi = int(sv.first_slot[at[i]]), int(sv.first_slot[at[i] + 1])
                a, b = int(off[lo]), int(off[hi])
                out[i][1][store] = (sv.local[lo:hi], values[a:b].numpy(), off[lo:hi + 1] - a)
        return out

    @_locked
    def gather_documents(self, doc_ids: list[str], by_file: bool = False) -> dict:
        """The graphs and vectors of `doc_ids` as one bundle (:mod:`.bundle`): what the driver's
        gather asks for. Per store, the documents' slot runs are cut out of the store at once
        (a document's items are one contiguous run of slots, its rows one contiguous run of
        rows); with `by_file` a document read from a part file is sent as where it lies there
        (:class:`.bundle.PartRef`), and a store whose rows lie row for row in its vector file sends
        the first file row of each run instead of the rows: the driver reads them there when it sees
        the file, and no row travels (see :class:`.gather.RowFiles`)."""
        view = self._current_view()
        numbers = np.asarray([self.index.doc_number(d) for d in doc_ids], np.int64)
        files = self._vector_files() if by_file else {}
        stores = {}
        for store, sv in view.stores.items():
            if not sv.doc.size or not numbers.size:
                continue
            at = np.minimum(np.searchsorted(sv.numbers, numbers), sv.numbers.size - 1)
            docs = np.flatnonzero(sv.numbers[at] == numbers)
            if not docs.size:
                continue
            lo, hi = sv.first_slot[at[docs]], sv.first_slot[at[docs] + 1]
            items = hi - lo
            slots = np.repeat(lo - np.concatenate([[0], np.cumsum(items)[:-1]]), items) + np.arange(int(items.sum()))
            off = self._offsets(store)
            run = {"doc": docs.astype(np.int64), "items": items.astype(np.int64), "local": sv.local[slots],
                   "lengths": off[slots + 1] - off[slots]}
            if store in files:
                run.update(path=files[store], start=off[lo].astype(np.int64), dim=int(view.vectors[store].values.shape[1]))
            else:
                values = view.vectors[store].values
                values = (values.view(torch.int16) if values.dtype == torch.bfloat16 else values).numpy()
                run["values"] = np.concatenate([values[a:b] for a, b in zip(off[lo].tolist(), off[hi].tolist())])
            stores[store] = run
        return pack_documents([self._part_ref(d) or self.index.document(d) if by_file else self.index.document(d)
                               for d in doc_ids], stores)

    @_locked
    def gather_sendable(self, doc_ids: list[str], by_file: bool = False) -> dict | bytes:
        """:meth:`gather_documents` as the driver's calls receive it: with `by_file`, the bundle
        pickled here (a few KiB of small arrays: one bytes object crosses Ray cheaper than ~60
        framed arrays, ~0.4 ms less per answer measured on this machine); with rows as bytes the
        bundle itself (its big arrays then travel out of band, uncopied)."""
        bundle = self.gather_documents(doc_ids, by_file)
        return pickle.dumps(bundle, protocol=5) if by_file else bundle

    def _part_ref(self, doc_id: str) -> PartRef | None:
        """Where this shard itself reads the document's graph: its version-3 part file and
        position (a document added in this process is held in memory, with its issues and
        pixels, and travels whole: None)."""
        entry = self.index._docs[doc_id]  # noqa: SLF001 - the document's part and position
        if entry.source is None:
            return None
        meta = self.index._parts.get(entry.source.path.name)  # noqa: SLF001 - the manifest's header sha256
        return PartRef(str(entry.source.path), meta.get("sha256") if isinstance(meta, dict) else None, int(entry.pos),
                       doc_id)

    def _vector_files(self) -> dict[str, str]:
        """``{store: path}`` of the stores whose view rows are their vector file's rows, row for
        row: a directory-backed index maps each store's committed rows as they lie in its
        append-only file (all documents in document order, as the store holds them); a store
        whose row count differs (a legacy directory held in memory) is left out (its rows travel
        as bytes)."""
        view = self._current_view()
        if "files" in self._units_cache:
            return self._units_cache["files"]
        out = self._units_cache["files"] = {}
        for store, meta in self.index._vectors.items():  # noqa: SLF001 - file name and committed rows
            v = view.vectors.get(store)
            if v is not None and int(v.values.shape[0]) == int(meta["rows"]):
                out[store] = str(self.index._vector_path(store))  # noqa: SLF001
        return out

    def _offsets(self, store: str) -> np.ndarray:
        """The view's ``offsets [N+1]`` of `store` as numpy (cached per view)."""
        key = "offsets:" + store
        if key not in self._units_cache:
            self._units_cache[key] = self._view.vectors[store].offsets.cpu().numpy()
        return self._units_cache[key]

    # -- writes -----------------------------------------------------------------------------------
    @_locked
    def enable_prefilter(self, stores, options: dict) -> dict[str, str]:
        """:meth:`KnowledgeIndex.enable_prefilter` on this shard's index (committed); `stores`
        None: its default stores."""
        if stores is None:
            return self.index.enable_prefilter(**options)
        return self.index.enable_prefilter(stores, **options)

    @_locked
    def add(self, graphs: list, vectors: list[dict]) -> int:
        """Adds documents (graphs and their vectors) as one commit; returns the document count."""
        self.index.add_documents(graphs, vectors)
        return len(self.index)

    @_locked
    def remove(self, doc_ids: list[str]) -> int:
        """Removes documents (each one commit); ids it does not hold are skipped."""
        for d in doc_ids:
            if d in self.index:
                self.index.remove_document(d)
        return len(self.index)


def _top_lists(best: torch.Tensor, k: int) -> dict:
    """Per row of ``best [r, D]``: the columns scoring at least the k-th best finite score (see
    :meth:`Shard.recall_scores`)."""
    finite = torch.isfinite(best)
    n_finite = finite.sum(1).tolist()
    lo = torch.where(finite, best, torch.inf).min(1).values if best.shape[1] else torch.full((best.shape[0],), torch.inf)
    hi = torch.where(finite, best, -torch.inf).max(1).values if best.shape[1] else torch.full((best.shape[0],), -torch.inf)
    out = {"cols": [], "scores": [], "cut": [], "truncated": [], "lo": lo.numpy(), "hi": hi.numpy()}
    for i, nf in enumerate(n_finite):
        row = best[i]
        if nf <= k:
            keep, cut = finite[i], -np.inf
        else:
            cut = float(torch.topk(row, k).values[-1])
            keep = row >= cut
        cols = torch.nonzero(keep).squeeze(1)
        out["cols"].append(cols.numpy())
        out["scores"].append(row[cols].numpy())
        out["cut"].append(np.float32(cut))
        out["truncated"].append(int(cols.numel()) < nf)
    return out


__all__ = ["SIDE_STORES", "Shard"]
