"""The public face of the knowledge index: :class:`KnowledgeIndex` (create, open, save, add,
remove, prefilters, lookups) over its layers — :mod:`.format` (the on-disk format and its checks),
:mod:`.reading` (a directory into memory), :mod:`.assembly` (the merged in-memory graph) and
:mod:`.commit` (the writer's protocol), mixed in as private bases. The design is in
:mod:`colgraph_engine.kg.index`.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from . import prefilters as _pf
from ...graph.kinds import NODE, EdgeKind, NodeKind
from ...graph.knowledge_graph import KnowledgeGraph
from ...packed import check_finite
from ...store.packed_store import _DTYPE_NAMES, PackedStore
from ..document import DocumentGraph, DocumentInput, build_document_graph
from ..parts import StoredDocument
from ..vectors import STORES, Encoders, ItemVectors, encode_document
from .assembly import _Assembler, _Assembly, _Entry, _locate, _lookup, make_uid
from .commit import _check_new_folder, _check_replaceable, _Committer
from .format import (INDEX_VERSION, IndexFormatError, MAX_DOC_NUMBER, UID_SHIFT, _COUNTED, _OPEN_ATTEMPTS,
                     _add_counts, _as_dir, _generation_on_disk, _load_manifest, _readers_lock, _stat_key)
from .reading import _Reader

# node kind number -> its lower-case name, as describe_node gives it (an enum call per node was
# a tenth of describe_node's time)
_KIND_NAMES = {int(k): k.name.lower() for k in NodeKind}


def _kind_name(kind) -> str:
    name = _KIND_NAMES.get(int(kind))
    return name if name is not None else NodeKind(int(kind)).name.lower()  # ValueError, as before, for no kind


class KnowledgeIndex(_Reader, _Assembler, _Committer):
    """Per-document multimodal graphs and their vectors, optionally backed by a directory.

    Use :meth:`create` / :meth:`open` for a directory-backed index (every change is committed
    before the call returns), or the constructor for an in-memory one (:meth:`save` writes it).

    Args:
        encoders: the encoders items are embedded with (None: add documents with precomputed
            vectors only). Their names and dimensions are recorded in the manifest.
        dtype: vector storage dtype (float32, float16 or bfloat16).
        dims: store dimensions when `encoders` is None (store name -> d).
    """

    # the alias key of a re-assembly (None: the uncached normalize_name; a subclass built per
    # query, whose names repeat across queries, passes the cached one)
    _alias_key = None

    def store_layout(self, store: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(doc [N], local [N], graph id [N])`` of `store`'s slots when this index already
        knows them (a subclass filled once from trusted parts), else None: the query view then
        derives them from the store's ids and checks them."""
        return None

    def __init__(self, encoders: Encoders | None = None, *, dtype: torch.dtype = torch.float32,
                 dims: dict[str, int] | None = None):
        if encoders is not None and not isinstance(encoders, Encoders):
            raise TypeError(f"encoders: expected Encoders or None, got {type(encoders).__name__}")
        if dtype not in _DTYPE_NAMES:
            raise TypeError(f"dtype: expected one of {list(_DTYPE_NAMES)}, got {dtype}")
        self.encoders = encoders
        self.dtype = dtype
        described = encoders.describe() if encoders is not None else None
        if dims is None:
            dims = {} if described is None else {
                s: described[role]["dim"] for s, (role, _) in STORES.items() if described[role] is not None}
        self._check_dims(dims)
        self.dims = dict(dims)
        self.encoder_info = described or {}
        self.stores = {s: PackedStore(d, dtype) for s, d in self.dims.items()}
        self._docs: dict[str, _Entry] = {}
        self._next_number = 0
        self._assembly: _Assembly | None = None
        self.path: Path | None = None
        self._generation = 0
        # version 3: part file name -> {"sha256" (of its header), "documents", "counts"}, in document
        # order; an opened version-1/2 directory: part folder name -> sha256 of its manifest
        self._parts: dict[str, dict | str] = {}
        self._totals = dict.fromkeys(_COUNTED, 0)  # summed over the documents
        self._vectors: dict[str, dict] = {}  # store -> {"file": name in vectors/, "rows": committed rows}
        self._disk_version = INDEX_VERSION  # of the directory's committed manifest
        self._changes = 0
        self._manifest_stat: tuple | None = None  # identity of the manifest file this object read or wrote
        # carried prefilters (see enable_prefilter): settings, store -> PrefilterIndex (None:
        # deferred), store -> committed folder entry, store -> what the last change did
        self._pf_settings: _pf.PrefilterSettings | None = None
        self._prefilters: dict = {}
        self._pf_files: dict[str, dict] = {}
        self._pf_events: dict[str, str] = {}
        # False: every change writes a touched store's prefilter folder whole (the layout before
        # appended pieces; kept for benchmarks/index_prefilter_commit.py to compare against)
        self._pf_append = True
        # True after disable_prefilter(): whoever made the index turned prefilters off, so the
        # service's writer (which makes an index carry them before its first change) leaves it
        self._pf_declined = False

    @staticmethod
    def _check_dims(dims) -> None:
        if not isinstance(dims, dict) or any(s not in STORES for s in dims) or any(
                isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims.values()):
            raise ValueError(f"dims: expected {{store: positive int}} with stores from {list(STORES)}, got {dims!r}")

    # -- directory life cycle -------------------------------------------------------------
    @classmethod
    def create(cls, path: str | os.PathLike, encoders: Encoders | None = None, *,
               dtype: torch.dtype = torch.float32, dims: dict[str, int] | None = None,
               overwrite: bool = False, prefilters: bool = True) -> KnowledgeIndex:
        """A new, empty index committed to directory `path` (which must not hold one, unless
        `overwrite`).

        `prefilters` (default True): the index carries the recall stores' centroid prefilters
        from its first commit (:meth:`enable_prefilter` with ``min_tokens`` =
        :func:`~colgraph_engine.kg.index.prefilters.auto_min_tokens`): each is deferred until its
        store is as large as the one where the default ``recall_ranker="auto"`` reads it, then
        built by that commit and kept up to date by the later ones, so an index that grows large
        is searched sublinearly with no step of the user's. False: none (exact recall only,
        unless :meth:`enable_prefilter` is called later)."""
        path = _as_dir(path)
        if not isinstance(prefilters, bool):
            raise TypeError(f"prefilters: expected a bool, got {type(prefilters).__name__}")
        _check_new_folder(path, overwrite)
        index = cls(encoders, dtype=dtype, dims=dims)
        if overwrite and path.exists():
            _check_replaceable(path)
            shutil.rmtree(path)
        path.mkdir(parents=True, exist_ok=True)
        index.path = path
        if prefilters:  # settings only (every store is empty): the creating commit records them
            index.enable_prefilter(**_pf.auto_options(index.dims), commit=False)
        with index._writer(check_generation=False):
            index._commit({}, vectors=index._new_vector_files({s: None for s in index.dims}))
        if prefilters:
            index._pf_events = {s: f"deferred (0 tokens < min_tokens {index._pf_settings.threshold(index.dims[s])})"
                                for s in index._pf_settings.stores}
        return index

    @classmethod
    def open(cls, path: str | os.PathLike, encoders: Encoders | None = None, *, verify: bool = True,
             progress: bool = False, repair_prefilter: bool = False) -> KnowledgeIndex:
        """Loads the index committed in `path`.

        Args:
            encoders: needed to add documents that are not pre-encoded; must match the names
                and dimensions the index was built with.
            verify: check every file's sha256 (sizes, shapes and structure are always checked).
            repair_prefilter: a carried prefilter (see :meth:`enable_prefilter`) that is missing,
                damaged or disagrees with its store (other uids or token counts) is refused with
                ``FormatError`` by default (checksums chain the manifest to it, so only tampering
                or a bug gets there); True rebuilds it from the store's vectors instead and
                commits the rebuilt one at once (the writer lock is taken).

        Raises ``FormatError`` (a ValueError) when the directory is missing, truncated, tampered
        with or inconsistent. Concurrent commits never make it fail: it reads one generation
        whole (see the module docstring).
        """
        path = _as_dir(path)
        if encoders is not None and not isinstance(encoders, Encoders):
            raise TypeError(f"encoders: expected Encoders or None, got {type(encoders).__name__}")
        if not isinstance(repair_prefilter, bool):
            raise TypeError(f"repair_prefilter: expected a bool, got {type(repair_prefilter).__name__}")
        for attempt in range(_OPEN_ATTEMPTS):
            with _readers_lock(path, exclusive=False, wait=True) as locked:
                stat = _stat_key(path / "manifest.json")
                m = _load_manifest(path)
                try:
                    index = cls._open_manifest(path, m, encoders, verify=verify, progress=progress,
                                               repair_prefilter=repair_prefilter)
                    index._manifest_stat = stat if _stat_key(path / "manifest.json") == stat else None
                    break
                except (IndexFormatError, OSError):
                    if locked or attempt == _OPEN_ATTEMPTS - 1 or _generation_on_disk(path) == m["generation"]:
                        raise  # damaged, not replaced underneath
        else:
            raise AssertionError("unreachable")
        repaired = {s: e for s, e in index._pf_events.items() if e.startswith("repaired")}
        if repaired:  # outside the readers' lock: the commit may then delete the damaged folders
            with index._writer():
                index._commit_prefilters({s: (index._prefilters[s], e) for s, e in repaired.items()})
        return index

    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        """Writes this (in-memory) index to a new directory `path` as a single part, and makes
        `path` its backing directory."""
        path = _as_dir(path)
        _check_new_folder(path, overwrite)
        if overwrite and path.exists():
            _check_replaceable(path)
            shutil.rmtree(path)
        path.mkdir(parents=True, exist_ok=True)
        old = self.path, self._parts, self._generation, self._vectors, self._disk_version, self._pf_files
        self.path, self._parts, self._generation, self._vectors, self._pf_files = path, {}, 0, {}, {}
        try:
            with self._writer(check_generation=False):
                self._rewrite_all()
        except BaseException:
            self.path, self._parts, self._generation, self._vectors, self._disk_version, self._pf_files = old
            raise
        return path

    # -- carried prefilters -----------------------------------------------------------------
    def enable_prefilter(self, stores: Sequence[str] = _pf.DEFAULT_STORES, *, nbits: int = 2,
                         min_tokens: int = _pf.DEFAULT_MIN_TOKENS,
                         rebuild_drift: float | None = _pf.DEFAULT_REBUILD_DRIFT,
                         min_tokens_d128: int | None = None,
                         progress: bool = False, commit: bool = True) -> dict[str, str]:
        """Makes the named stores carry a centroid prefilter (a
        :class:`~colgraph_engine.prefilter.PrefilterIndex` keyed by the stores' uids), maintained by
        every later add and removal and, in a directory, committed with them (one manifest
        replace covers a change's rows and its prefilters). Builds each store's prefilter now
        when the store holds at least `min_tokens` tokens (else defers it to the first change
        that gets there); in a directory, commits at once. Calling it again replaces the
        settings and rebuilds every carried prefilter. Rules and defaults (ours):
        :mod:`colgraph_engine.kg.index.prefilters`.

        Args:
            stores: store names of this index (default: the text stores of document recall,
                ``("segment", "table")``, those this index has).
            nbits: residual bits per dimension: 1, 2 or 4.
            min_tokens: a store with fewer live tokens carries no prefilter yet.
            rebuild_drift: rebuild a store's prefilter from its vectors during the commit whose
                additions bring its drift above this (None: never).
            min_tokens_d128: None, or a count of tokens of d = 128: a store of dimension d is
                also deferred below ``min_tokens_d128 * 128 / d`` tokens, where the default
                ``recall_ranker="auto"`` starts to read it (:meth:`create` sets it, so that a
                narrow store is not built long before a query uses it).
            progress: a tqdm bar over each build's k-means iterations.
            commit: False (a directory index only): nothing is built or written now; the
                settings take effect in memory and the next change's commit carries them,
                building each store's prefilter there when the store is large enough (so the
                change and the prefilters it starts carrying commit together, or neither does;
                the service's writer uses it).

        Returns ``{store: what happened}`` (``"built (...)"`` or ``"deferred (...)"``). Raises
        ValueError naming the argument for unknown stores, nbits outside {1, 2, 4} (or one
        that cannot pack a store's dimension), a min_tokens below 1 or a non-positive drift.
        """
        if stores is _pf.DEFAULT_STORES:
            stores = tuple(s for s in stores if s in self.dims)
        settings = _pf.PrefilterSettings.checked(stores, nbits, min_tokens, rebuild_drift, self.dims, min_tokens_d128)
        if not isinstance(commit, bool):
            raise TypeError(f"commit: expected a bool, got {type(commit).__name__}")
        if not commit and self.path is not None:
            self._pf_settings, self._prefilters, self._pf_declined = settings, {}, False
            self._pf_events = {s: "carried from the next commit" for s in settings.stores}
            return dict(self._pf_events)
        plan = {s: _pf.next_prefilter(settings, None, self.stores[s], progress=progress) for s in settings.stores}
        self._pf_declined = False
        if self.path is not None:
            with self._writer():
                if self._disk_version != INDEX_VERSION:
                    self._rewrite_all()  # upgrade the directory first (same contents)
                self._commit_prefilters(plan, settings=settings, replace=True)
        else:
            self._pf_settings, self._prefilters = settings, {}
            self._swap_prefilters(plan)
        return dict(self._pf_events)

    def disable_prefilter(self) -> None:
        """Stops carrying prefilters; in a directory, commits a manifest without them (their
        folders are then deleted like any unlisted file) that records the choice
        (:attr:`prefilter_declined`: the service's writer then does not make the index carry
        them again; :meth:`enable_prefilter` clears it)."""
        if self._pf_settings is None and self._pf_declined:
            return
        declined, self._pf_declined = self._pf_declined, True  # the commit below records it
        if self.path is not None:
            try:
                with self._writer():
                    if self._disk_version != INDEX_VERSION:
                        self._rewrite_all()
                    self._commit_prefilters({}, settings=None, replace=True)
            except BaseException:
                self._pf_declined = declined
                raise
        self._pf_settings, self._prefilters, self._pf_events = None, {}, {}

    @property
    def prefilter_declined(self) -> bool:
        """True when prefilters were turned off (:meth:`disable_prefilter`), recorded in the
        manifest: nothing makes this index carry them unless :meth:`enable_prefilter` is called."""
        return self._pf_declined

    def prefilter(self, store: str):
        """The :class:`~colgraph_engine.prefilter.PrefilterIndex` `store` carries (ids are the
        store's uids), or None (no prefilter configured for it, or its build is deferred).
        The object is replaced, never changed, by later commits."""
        if not isinstance(store, str):
            raise TypeError(f"store: expected a store name (str), got {type(store).__name__}")
        if store not in self.dims:
            raise ValueError(f"store: expected one of this index's stores {list(self.dims)}, got {store!r}")
        return self._prefilters.get(store)

    def prefilter_info(self) -> dict | None:
        """None when no store carries a prefilter; else the settings and per configured store
        ``{"state": "built" | "deferred", "items", "deleted", "tokens", "drift", "last_change"}``."""
        if self._pf_settings is None:
            return None
        out = {**self._pf_settings.to_manifest(), "stores": {}}
        for s in self._pf_settings.stores:
            pf = self._prefilters.get(s)
            if pf is None:
                info = {"state": "deferred", "tokens": int(self.stores[s].offsets[-1]),
                        "min_tokens": self._pf_settings.threshold(self.dims[s])}
            else:
                st = pf.snapshot()
                info = {"state": "built", "items": st.n_live, "deleted": st.n_slots - st.n_live,
                        "tokens": st.n_tokens, "drift": float(pf.drift())}
            out["stores"][s] = {**info, "last_change": self._pf_events.get(s, "")}
        return out

    # -- adding and removing --------------------------------------------------------------
    def add_document(self, doc: DocumentInput | DocumentGraph, vectors: dict[str, ItemVectors] | None = None,
                     **build_options) -> DocumentGraph:
        """Adds one document (see :meth:`add_documents`); returns its graph."""
        return self.add_documents([doc], None if vectors is None else [vectors], **build_options)[0]

    def add_documents(self, docs: Sequence[DocumentInput | DocumentGraph],
                      vectors: Sequence[dict[str, ItemVectors]] | None = None, *, progress: bool = False,
                      extractor: Callable[[str], str] | None = None, **build_options) -> list[DocumentGraph]:
        """Builds, embeds and adds documents, then commits them as one part; all or nothing.

        Args:
            docs: inputs (built with :func:`build_document_graph`, `extractor` and
                `build_options`) or graphs already built.
            vectors: precomputed vectors per document (as :func:`encode_document` returns);
                by default the index's encoders embed each document.
            progress: show tqdm bars for building and encoding.

        Raises ValueError for a document id already in the index or repeated in `docs`; the
        index (memory and directory) is unchanged after any failure.
        """
        check_new_documents(docs, self._docs, "the index")
        if vectors is not None and (not isinstance(vectors, Sequence) or len(vectors) != len(docs)):
            raise ValueError(f"vectors: expected one dict per document ({len(docs)})")
        if vectors is None and self.encoders is None and any(self.dims.values()):
            raise ValueError("vectors: the index has no encoders; pass precomputed vectors")
        if self._next_number + len(docs) > MAX_DOC_NUMBER:
            raise ValueError("docs: the index has used every document number")
        graphs = [d if isinstance(d, DocumentGraph) else build_document_graph(d, extractor=extractor, **build_options)
                  for d in tqdm(docs, desc="building graphs", disable=not progress)]
        if vectors is None:
            vectors = [encode_document(g, self.encoders) if self.encoders is not None else {}
                       for g in tqdm(graphs, desc="encoding", disable=not progress)]
        stored = []
        for i, (g, v) in enumerate(zip(graphs, vectors)):
            self._check_vectors(g, v, f"vectors[{i}]")
            stored.append(StoredDocument(self._next_number + i, g, v))
        part = ""
        if self.path is not None:
            with self._writer():
                if self._disk_version != INDEX_VERSION:
                    self._rewrite_all()  # upgrade the directory first (same contents), then append
                plan = self._plan_prefilters(added=stored)
                part = self._append_committed(stored, plan)
        else:
            plan = self._plan_prefilters(added=stored)
        self._apply_add(stored, [part] * len(stored), plan)
        if progress:
            total = {k: sum(g.counts[k] for g in graphs) for k in _COUNTED + ("errors", "warnings")}
            tqdm.write(f"added {len(graphs)} documents: " + ", ".join(f"{v} {k}" for k, v in total.items()))
        return graphs

    def remove_document(self, doc_id: str) -> None:
        """Removes a document with its nodes, edges, aliases and vectors. Other documents of the
        same part are rewritten into a new part as they are (not rebuilt or re-encoded)."""
        if not isinstance(doc_id, str):
            raise TypeError(f"doc_id: expected str, got {type(doc_id).__name__}")
        if doc_id not in self._docs:
            raise ValueError(f"doc_id: no document {doc_id!r} in the index")
        entry = self._docs[doc_id]
        if self.path is not None:
            with self._writer():
                if self._disk_version != INDEX_VERSION:
                    self._rewrite_all()  # upgrade the directory first (same contents)
                    entry = self._docs[doc_id]
                self._remove_committed(doc_id, self._plan_prefilters(removed=entry))
            return
        plan = self._plan_prefilters(removed=entry)
        for store, ids in self._uids_of(entry).items():
            if ids.size:
                self.stores[store].delete(torch.from_numpy(ids))
                self.stores[store].compact()
        _add_counts(self._totals, entry.graph.counts, -1)
        del self._docs[doc_id]
        self._assembly = None
        self._swap_prefilters(plan)
        self._changes += 1

    # -- reading ----------------------------------------------------------------------------
    @property
    def documents(self) -> list[str]:
        """Document ids in insertion order."""
        return list(self._docs)

    def __len__(self) -> int:
        return len(self._docs)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._docs

    def document(self, doc_id: str) -> DocumentGraph:
        if doc_id not in self._docs:
            raise ValueError(f"doc_id: no document {doc_id!r} in the index")
        return self._docs[doc_id].graph

    def doc_number(self, doc_id: str) -> int:
        """The document's number: its ``node_doc`` value in :attr:`graph` (stable, never reused)."""
        if doc_id not in self._docs:
            raise ValueError(f"doc_id: no document {doc_id!r} in the index")
        return self._docs[doc_id].number

    @property
    def version(self) -> int:
        """Counts the changes made through this object (adds and removals): a reader that keeps
        arrays derived from :attr:`graph` rebuilds them when this moves (the graph object itself
        grows in place when documents are added)."""
        return self._changes

    @property
    def graph(self) -> KnowledgeGraph:
        """The merged graph over all documents (assembled on first use, then grown in place by
        additions; re-assembled after a removal)."""
        return self._assemble().graph

    def node_uid(self) -> np.ndarray:
        """``[n]`` int64 stable item id of every node of :attr:`graph` (the ids stores use)."""
        return self._assemble().node_uid.array

    def edge_uid(self) -> np.ndarray:
        return self._assemble().edge_uid.array

    def nodes_of_uids(self, uids) -> np.ndarray:
        """Graph node ids ``[k]`` of store item ids (ValueError for an id no node has)."""
        return _lookup(self._assemble().node_uid.array, uids, "uids")

    def edges_of_uids(self, uids) -> np.ndarray:
        return _lookup(self._assemble().edge_uid.array, uids, "uids")

    def describe_node(self, node: int) -> dict:
        """Document, local id, kind, name, type, text, bbox, provenance segments and (images and
        regions) the image's name of a graph node."""
        a = self._assemble()
        _, doc_id, v = _locate(a, a.node_offsets.array, node, "node")
        c, nb, _ = self._docs[doc_id].columns()
        i = nb + v  # row in the columns
        box = c.node_bbox[i]
        image = int(c.node_image[i])
        return {"doc_id": doc_id, "local": v, "kind": _kind_name(c.node_kind[i]),
                "name": c.node_name[i], "type": c.node_type[i], "text": c.node_text[i],
                "bbox": None if np.isnan(box).any() else tuple(float(x) for x in box),
                "segments": c.node_prov[c.node_prov_offsets[i]:c.node_prov_offsets[i + 1]].tolist(),
                "image": c.node_name[i] if c.node_kind[i] == NODE.IMAGE
                else (c.node_name[nb + image] if image >= 0 else None)}

    def node_segments(self, node: int) -> list[int]:
        """The provenance segments of a graph node (local segment numbers of its document): the
        ``"segments"`` of :meth:`describe_node` without decoding the node's strings, for the
        query stages that read provenance alone."""
        a = self._assemble()
        _, doc_id, v = _locate(a, a.node_offsets.array, node, "node")
        c, nb, _ = self._docs[doc_id].columns()
        i = nb + v
        return c.node_prov[c.node_prov_offsets[i]:c.node_prov_offsets[i + 1]].tolist()

    def node_place(self, node: int) -> tuple[str, int, str]:
        """``(doc_id, local id, kind)`` of a graph node: the first three fields of
        :meth:`describe_node` without decoding the node's strings (citations read only these
        for segments)."""
        a = self._assemble()
        _, doc_id, v = _locate(a, a.node_offsets.array, node, "node")
        c, nb, _ = self._docs[doc_id].columns()
        return doc_id, v, _kind_name(c.node_kind[nb + v])

    def document_node_segments(self, nodes) -> list[np.ndarray]:
        """:meth:`node_segments` of several graph nodes of one document, as int32 arrays: one
        look-up of the document for all of them (ValueError for nodes of more than one)."""
        nodes = np.asarray(nodes)
        if nodes.ndim != 1 or nodes.dtype.kind not in "iu":
            raise TypeError(f"nodes: expected a 1-D integer array, got {nodes.dtype} of shape {nodes.shape}")
        if nodes.size == 0:
            return []
        a = self._assemble()
        offsets = a.node_offsets.array
        d, doc_id, _ = _locate(a, offsets, int(nodes[0]), "node")
        lo, hi = int(offsets[d]), int(offsets[d + 1])
        if int(nodes.min()) < lo or int(nodes.max()) >= hi:
            raise ValueError(f"nodes: expected nodes of one document ({doc_id!r}: [{lo}, {hi}))")
        c, nb, _ = self._docs[doc_id].columns()
        rows = nb + (nodes.astype(np.int64) - lo)
        starts, ends = c.node_prov_offsets[rows].tolist(), c.node_prov_offsets[rows + 1].tolist()
        return [c.node_prov[x:y] for x, y in zip(starts, ends)]

    def node_text(self, node: int) -> str:
        """The text of a graph node: the ``"text"`` of :meth:`describe_node` alone, for the query
        stages that read a unit's words (a tenth of describe_node's cost here)."""
        a = self._assemble()
        _, doc_id, v = _locate(a, a.node_offsets.array, node, "node")
        c, nb, _ = self._docs[doc_id].columns()
        return c.node_text[nb + v]

    def describe_edge(self, edge: int) -> dict:
        """Document, local id, kind, endpoints (graph node ids), keywords, text, weight and
        provenance segments of a graph edge."""
        a = self._assemble()
        d, doc_id, e = _locate(a, a.edge_offsets.array, edge, "edge")
        c, _, eb = self._docs[doc_id].columns()
        j = eb + e  # row in the columns
        base = int(a.node_offsets.array[d])
        return {"doc_id": doc_id, "local": e, "kind": EdgeKind(int(c.edge_kind[j])).name.lower(),
                "src": base + int(c.edge_src[j]), "dst": base + int(c.edge_dst[j]),
                "keywords": c.edge_keywords[j], "text": c.edge_text[j], "weight": float(c.edge_weight[j]),
                "segments": c.edge_prov[c.edge_prov_offsets[j]:c.edge_prov_offsets[j + 1]].tolist()}

    @property
    def counts(self) -> dict[str, int]:
        totals: dict[str, int] = {"documents": len(self._docs), **self._totals}
        for s, store in self.stores.items():
            totals[f"{s}_vectors"] = len(store)
        return totals

    def __repr__(self) -> str:
        where = f", path={str(self.path)!r}" if self.path is not None else ""
        return f"KnowledgeIndex(documents={len(self._docs)}{where})"

    # -- internals ----------------------------------------------------------------------------
    def _check_vectors(self, g: DocumentGraph, vectors, what: str) -> None:
        if not isinstance(vectors, dict):
            raise TypeError(f"{what}: expected a dict store -> ItemVectors, got {type(vectors).__name__}")
        for store, v in vectors.items():
            if store not in self.dims:
                raise ValueError(f"{what}: store {store!r} is not one of this index's {list(self.dims)}")
            if not isinstance(v, ItemVectors):
                raise TypeError(f"{what}[{store!r}]: expected ItemVectors")
            limit = g.n_edges if STORES[store][1] is None else g.n_nodes
            k = v.local.size
            if v.offsets.shape != (k + 1,) or v.values.dim() != 2 or v.values.shape[1] != self.dims[store] \
                    or int(v.offsets[-1]) != v.values.shape[0]:
                raise ValueError(f"{what}[{store!r}]: expected {k} items of dimension {self.dims[store]} "
                                 f"(offsets [{k + 1}], values [T, {self.dims[store]}])")
            if k and (v.local.min() < 0 or v.local.max() >= limit or np.unique(v.local).size != k):
                raise ValueError(f"{what}[{store!r}]: local ids must be unique and in [0, {limit})")
            check_finite(v.values, f"{what}[{store!r}]")

    def _apply_add(self, docs: list[StoredDocument], parts: list[str], prefilters: dict | None = None) -> None:
        """Puts committed documents in memory: one store append per store for the whole batch
        (appending per document would copy the growing id and offset arrays each time), over
        the longer mapping of the store's vector file when the index has a directory; then
        appends them to the merged graph when it is assembled."""
        for store in self.stores:
            have = [d for d in docs if store in d.vectors]
            if not have:
                continue
            lengths = torch.cat([d.vectors[store].offsets.diff() for d in have])
            offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
            torch.cumsum(lengths, 0, out=offsets[1:])
            uids = torch.from_numpy(np.concatenate([make_uid(d.number, d.vectors[store].local) for d in have]))
            if self._vectors:  # a version-2 directory: the rows are in the file already
                self.stores[store].extend_wrapped(self._map_store(store), offsets, uids)
            else:
                self.stores[store].add((torch.cat([d.vectors[store].values for d in have]), offsets), ids=uids)
        for d, part in zip(docs, parts):
            self._docs[d.graph.doc_id] = _Entry(d.number, part, d.graph)
            _add_counts(self._totals, d.graph.counts)
            self._next_number = max(self._next_number, d.number + 1)
        if self._assembly is not None:
            self._append_to_assembly(self._assembly, [(d.number, d.graph) for d in docs])
        self._swap_prefilters(prefilters or {})
        self._changes += 1

    def _stored_items(self, doc_id: str) -> StoredDocument:
        """The document with its item tables only (``ItemVectors.values`` None): what a part
        holds."""
        return self._stored_items_many([doc_id])[0]

    def _stored_items_many(self, doc_ids: list[str], uids: list[dict[str, np.ndarray]] | None = None,
                           ranges: dict[str, list] | None = None) -> list[StoredDocument]:
        """:meth:`_stored_items` of many documents (`uids` from :meth:`_uids_of_many` and
        `ranges` per store from :meth:`_item_ranges`, when the caller has them)."""
        entries = [self._docs[d] for d in doc_ids]
        if uids is None:
            uids = self._uids_of_many(entries)
        if ranges is None:
            ranges = {s: self._item_ranges(s, [u[s] for u in uids]) for s in self.stores}
        out = []
        for i, entry in enumerate(entries):
            vectors = {}
            for store, u in uids[i].items():
                if u.size:
                    first, last = ranges[store][i]
                    off = self.stores[store].offsets[first:last + 1]
                    vectors[store] = ItemVectors(u & ((1 << UID_SHIFT) - 1), None, off - off[0])
            out.append(StoredDocument(entry.number, entry.graph, vectors))
        return out

    def _stored(self, doc_id: str) -> StoredDocument:
        entry = self._docs[doc_id]
        vectors = {}
        for store, uids in self._uids_of(entry).items():
            if not uids.size:
                continue
            st = self.stores[store]
            pos = st.positions(torch.from_numpy(uids))
            off = st.offsets
            rows = [st.values[int(off[p]): int(off[p + 1])] for p in pos.tolist()]
            lengths = torch.tensor([r.shape[0] for r in rows], dtype=torch.int64)
            offsets = torch.zeros(len(rows) + 1, dtype=torch.int64)
            torch.cumsum(lengths, 0, out=offsets[1:])
            vectors[store] = ItemVectors(uids & ((1 << UID_SHIFT) - 1), torch.cat(rows), offsets)
        return StoredDocument(entry.number, entry.graph, vectors)


# -- files --------------------------------------------------------------------------------------


def check_new_documents(docs, present, where: str) -> None:
    """TypeError unless `docs` is a sequence of DocumentInput / DocumentGraph; ValueError for an id
    already in `present` (a container of ids; `where` names it) or repeated within `docs`."""
    if isinstance(docs, (DocumentInput, DocumentGraph)) or not isinstance(docs, Sequence):
        raise TypeError("docs: expected a sequence of DocumentInput or DocumentGraph")
    seen = set()
    for i, d in enumerate(docs):
        if not isinstance(d, (DocumentInput, DocumentGraph)):
            raise TypeError(f"docs[{i}]: expected a DocumentInput or DocumentGraph, got {type(d).__name__}")
        if d.doc_id in present or d.doc_id in seen:
            raise ValueError(f"docs[{i}]: document id {d.doc_id!r} is already in {where}")
        seen.add(d.doc_id)
