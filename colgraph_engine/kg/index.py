"""The knowledge index: every document's graph and vectors, in memory and in one directory.

Directory layout (format version 3)::

    index/
      manifest.json          format, version, generation, encoders (name, dim), vector dtype,
                             next document number, parts (in document order: file name, sha256 of
                             its header, document count, counts by kind), vectors (per store: file
                             name, committed rows), totals (the parts' sums); optionally
                             prefilter (settings, and per store its base folder with that
                             folder's manifest sha256 and its appended pieces with theirs, or
                             null while deferred), or prefilter_declined (true: turned off by
                             disable_prefilter, so nothing carries them again unasked)
      parts/<name>.part      one batch of whole documents in ONE file (see kg/parts.py): graph
                             columns, UTF-8 string blobs and item tables behind a header that holds
                             each array's sha256, and per store the row count and sha256 of the rows
                             its documents own
      vectors/<store>.<tag>.bin
                             one append-only file of raw rows ``[T, d]`` per store: the rows of
                             every document in document order (the parts' order, then each part's)
      prefilter/<store>.<tag>/   only for stores that carry a centroid prefilter
      prefilter/<store>.<tag>.piece
                             (:meth:`KnowledgeIndex.enable_prefilter`; see kg/prefilters.py): a
                             base folder in the layout of index/persist.py, keyed by uids, plus
                             one appended piece file per later commit (merged, and compacted
                             into a new base when they outgrow it)

Each part's documents are one contiguous run of the document order, so each part owns one
contiguous row range of every vector file; the range's sha256 sits in the part's header (whose
own sha256 sits in the index manifest): a chain of checksums from the manifest to every byte.
Only the first ``rows`` rows of a vector file are committed; bytes past them are the leftovers of
an interrupted append, ignored by readers and cut off by the next writer. The manifest lists
parts, not documents (document ids, numbers and per-document columns live in the parts): a commit
rewrites a manifest whose size grows with the number of parts, not of documents; and an added part
absorbs the parts at the end of the list that hold no more documents than it has gathered (a
binary counter), so an index grown one document at a time keeps about log2(documents) + 1 parts,
each document's graph rewritten O(log documents) times amortised (vector rows never move).

``manifest.json`` is the commit point. Adding documents appends their rows to the vector files
and writes a new part file under a name no manifest lists yet; then the change replaces the
manifest (temporary file, fsync, ``os.replace``, fsync of the folder). The appended files, the
part, the parts folder and the manifest's temporary file are fsync'ed together (concurrently)
before the rename: a constant number of fsyncs per commit (one per store that got rows, plus
four) in two rounds, however many documents and arrays. A store that carries a prefilter and
gets rows (or loses them) has its next prefilter computed before anything is written; what
changed is saved as a new piece file ``prefilter/<store>.<tag>.piece`` (O(the change); a build,
rebuild or compaction writes a new base folder instead), fsync'ed before the manifest that names
it replaces the old one, so the manifest commits the rows and the prefilter together. Removing one
writes new, compacted vector files for the stores it had rows in (a new tag, never the file a
reader maps) and a new part for the documents that shared its part, in that part's place of the
order. Only after the manifest is replaced are parts the new manifest no longer names deleted. A
crash at any point leaves either the previous or the new manifest, and every part that manifest
names is complete; parts and vector files no manifest names are removed by the next change.
Writers take an exclusive
lock on ``.lock`` (``flock``) for the whole change, and a change is refused with
:class:`IndexConflictError` when another writer holds it or when the manifest's generation is
not the one this object read (someone else committed since): nothing is overwritten unseen.

Readers (:meth:`KnowledgeIndex.open`) hold a shared ``flock`` on the index folder itself while
they read the manifest and then its parts, so they see one committed generation whole. Vector
files and part files are memory-mapped, never read whole: pages load on first touch, and a mapping
stays valid after a later commit deletes the file (POSIX keeps it alive) or appends to it (rows
past the mapped ones are never looked at). Strings stay UTF-8 in the mapped part
(:class:`~colgraph_engine.kg.strings.StringColumn`, decoded when read) and a document's graph is
cut out of its part's columns when asked for, so an open index holds no per-document objects
beyond a small entry. A writer deletes the parts and vector files its new manifest no longer names
only when it can take that lock exclusively
without waiting; while a reader holds it, the old parts stay (a later commit removes them), and a
writer never waits for readers. Where the file system has no ``flock``, a reader whose parts
vanish retries with the new manifest when its generation changed.

The manifest is untrusted input: part names must be plain file names (letters, digits,
``._-``, not starting with a dot: no separators, no ``..``, not absolute) listed once, a part's
header must have the sha256 the manifest lists and its document count and counts must match,
document ids and numbers must be unique (numbers below 2^31), counts are bounded and the totals
are their sums, vector file names are ``<store>.<hex tag>.bin`` and a vector file must hold at
least its committed rows; a carried prefilter's base folder and pieces must have the listed
sha256 and sizes and together hold exactly its store's live uids with their token counts (a
disagreement is refused unless opened with ``repair_prefilter=True``, which rebuilds it from the
store and commits it); anything else
raises :class:`IndexFormatError`. The ``prefilter`` field keeps the format at version 3: an index
without it opens as before, and an older writer that does not know the field drops it (its
folders are then unlisted files, removed by the next change of a writer that knows it). Version-1 directories
(vectors inside the parts) and version-2 directories (a folder of array files per part, every
document listed in the manifest) are read as before; the first change rewrites such a directory
as version 3 (one commit of the same contents) before applying itself.

In memory, the documents' graphs are kept per document and the vectors in one
:class:`~colgraph_engine.store.PackedStore` per store (over the mapped file when the index has a
directory), keyed by a stable item id ``uid = doc_number << 32 | local_id`` (node ids; relation
edges use edge ids). The merged :class:`~colgraph_engine.graph.KnowledgeGraph` over all documents
(``graph``) is assembled on first use: documents in insertion order, ``node_doc`` = document number,
aliases grouping entities with equal normalised names across documents (the query-time merge is a
view over it); an alias group's id is its first member's node id. Once assembled it grows in
place: adding documents appends their nodes and edges (native append, O(new edges)), their
uids, and alias entries for their entities only; the result equals a full re-assembly array for
array. Removing a document removes its nodes, edges, aliases, vectors and strings; the merged
graph is then re-assembled on next use (node ids after it shift), and in a directory the
vector files it had rows in are rewritten without them (both O(index), the honest cost of exact
removal); no other document is rebuilt, re-extracted or re-encoded.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import _arraydir, _atomic
from . import prefilters as _pf
from ..graph.kinds import EdgeKind, NodeKind
from ..graph.knowledge_graph import KnowledgeGraph, NodeNames, normalize_name
from ..packed import check_finite
from ..store.packed_store import _DISK_NP, _DTYPE_NAMES, _DTYPES_BY_NAME, PackedStore
from .document import DocumentGraph, DocumentInput, build_document_graph
from .parts import MappedPart, StoredDocument, disk_rows, part_version, read_part, write_part_file
from .vectors import STORES, Encoders, ItemVectors, encode_document

INDEX_FORMAT = "colgraph-kg-index"
INDEX_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
UID_SHIFT = 32
MAX_DOC_NUMBER = 2**31 - 1

IndexFormatError = _arraydir.FormatError
log = logging.getLogger("colgraph_engine")


class IndexConflictError(RuntimeError):
    """Another writer holds the index, or changed it since this object read it (reopen it)."""


class _Entry:
    """A document in memory: its number, the part that holds it on disk, and its graph: held
    (added by this process, or read from a version-1/2 part) or, for a document of a mapped
    version-3 part (`source`, at position `pos`), cut out of the part's columns on each use, so
    an open index keeps no per-document arrays or strings."""

    __slots__ = ("number", "part", "_graph", "source", "pos")

    def __init__(self, number: int, part: str, graph: DocumentGraph | None = None, source: MappedPart | None = None,
                 pos: int = 0):
        self.number, self.part, self._graph, self.source, self.pos = number, part, graph, source, pos

    @property
    def graph(self) -> DocumentGraph:
        return self._graph if self._graph is not None else self.source.document(self.pos)

    def columns(self) -> tuple[DocumentGraph | MappedPart, int, int]:
        """``(columns, first node row, first edge row)``: where this document's node and edge
        attributes are read without building its graph (the held graph, or its part's
        part-level columns; provenance CSRs are part-level there too, local ids stay local)."""
        if self._graph is not None:
            return self._graph, 0, 0
        p = self.source
        return p, int(p.doc_nodes[self.pos]), int(p.doc_edges[self.pos])


class _Column:
    """A 1-D array that grows by appending, with spare capacity (doubling): a view of its first
    entries (:attr:`array`) stays valid and unchanged after later appends, and appending k
    entries costs O(k) amortised instead of a copy of the whole column."""

    def __init__(self, values: np.ndarray):
        self._buf = np.ascontiguousarray(values)
        self._n = self._buf.size

    def append(self, values: np.ndarray) -> None:
        need = self._n + values.size
        if need > self._buf.size:
            grown = np.empty(max(need, 2 * self._buf.size, 16), self._buf.dtype)
            grown[:self._n] = self._buf[:self._n]
            self._buf = grown
        self._buf[self._n:need] = values
        self._n = need

    @property
    def array(self) -> np.ndarray:
        return self._buf[:self._n]

    def last(self):
        return self._buf[self._n - 1]


@dataclass
class _Assembly:
    graph: KnowledgeGraph
    doc_ids: list[str]           # insertion order
    node_offsets: _Column        # [D+1]
    edge_offsets: _Column        # [D+1]
    node_uid: _Column            # [n] sorted (numbers and local ids both rise)
    edge_uid: _Column            # [m] sorted
    alias_of: _Column            # [n] int64 group (= first member's node id) or -1
    alias_keys: dict             # normalised entity name -> first member's node id


def _as_dir(path, name: str = "path") -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name}: expected a str or os.PathLike folder, got {type(path).__name__}")
    return Path(path)


def make_uid(number: int | np.ndarray, local: np.ndarray) -> np.ndarray:
    return (np.asarray(number, np.int64) << UID_SHIFT) | np.asarray(local, np.int64)


class KnowledgeIndex:
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
               overwrite: bool = False) -> KnowledgeIndex:
        """A new, empty index committed to directory `path` (which must not hold one, unless
        `overwrite`)."""
        path = _as_dir(path)
        _check_new_folder(path, overwrite)
        index = cls(encoders, dtype=dtype, dims=dims)
        if overwrite and path.exists():
            _check_replaceable(path)
            shutil.rmtree(path)
        path.mkdir(parents=True, exist_ok=True)
        index.path = path
        with index._writer(check_generation=False):
            index._commit({}, vectors=index._new_vector_files({s: None for s in index.dims}))
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

    @classmethod
    def _open_manifest(cls, path: Path, m: dict, encoders: Encoders | None, *, verify: bool,
                       progress: bool, repair_prefilter: bool = False) -> KnowledgeIndex:
        dtype = _DTYPES_BY_NAME[m["dtype"]]
        dims = m["dims"]
        if encoders is not None:
            if encoders.describe() != m["encoders"]:
                raise ValueError(f"encoders: the index was built with {m['encoders']}, got {encoders.describe()}")
        index = cls(encoders, dtype=dtype, dims=dims)
        index.encoder_info = m["encoders"]
        index.path = path
        index._generation = m["generation"]
        index._next_number = m["next_doc_number"]
        index._disk_version = m["version"]
        index._pf_declined = m.get("prefilter_declined") is True
        if m["version"] == 3:
            index._open_parts(m, verify=verify, progress=progress)
            index._open_prefilters(m, verify=verify, repair=repair_prefilter)
            return index
        if m["version"] == 2:
            index._open_mapped(m, verify=verify, progress=progress)
            return index
        by_part: dict[str, list[dict]] = {}
        for d in m["documents"]:
            by_part.setdefault(d["part"], []).append(d)
        loaded: dict[str, tuple[StoredDocument, str]] = {}  # doc id -> (document, part)
        for part in tqdm(m["parts"], desc="loading parts", disable=not progress):
            ppath = path / "parts" / part
            _check_part_sha(ppath, m["parts"][part])
            docs, _ = read_part(ppath, dims, dtype, verify=verify, version=1)
            want = [(d["doc_id"], d["number"]) for d in by_part.get(part, [])]
            if sorted((d.graph.doc_id, d.number) for d in docs) != sorted(want):
                raise IndexFormatError(f"{ppath}: holds other documents than the manifest lists")
            for d in docs:
                loaded[d.graph.doc_id] = (d, part)
        for d in m["documents"]:
            stored, _ = loaded[d["doc_id"]]
            if (stored.graph.n_nodes, stored.graph.n_edges) != (d["nodes"], d["edges"]):
                raise IndexFormatError(f"{path}: document {d['doc_id']!r} has other counts than the manifest lists")
        order = [loaded[d["doc_id"]] for d in m["documents"]]
        index._apply_add([s for s, _ in order], [p for _, p in order])
        index._parts = dict(m["parts"])
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
                         progress: bool = False, commit: bool = True) -> dict[str, str]:
        """Makes the named stores carry a centroid prefilter (a
        :class:`~colgraph_engine.prefilter.PrefilterIndex` keyed by the stores' uids), maintained by
        every later add and removal and, in a directory, committed with them (one manifest
        replace covers a change's rows and its prefilters). Builds each store's prefilter now
        when the store holds at least `min_tokens` tokens (else defers it to the first change
        that gets there); in a directory, commits at once. Calling it again replaces the
        settings and rebuilds every carried prefilter. Rules and defaults (ours):
        :mod:`colgraph_engine.kg.prefilters`.

        Args:
            stores: store names of this index (default: the text stores of document recall,
                ``("segment", "table")``, those this index has).
            nbits: residual bits per dimension: 1, 2 or 4.
            min_tokens: a store with fewer live tokens carries no prefilter yet.
            rebuild_drift: rebuild a store's prefilter from its vectors during the commit whose
                additions bring its drift above this (None: never).
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
        settings = _pf.PrefilterSettings.checked(stores, nbits, min_tokens, rebuild_drift, self.dims)
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
                info = {"state": "deferred", "tokens": int(self.stores[s].offsets[-1])}
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
        return {"doc_id": doc_id, "local": v, "kind": NodeKind(int(c.node_kind[i])).name.lower(),
                "name": c.node_name[i], "type": c.node_type[i], "text": c.node_text[i],
                "bbox": None if np.isnan(box).any() else tuple(float(x) for x in box),
                "segments": c.node_prov[c.node_prov_offsets[i]:c.node_prov_offsets[i + 1]].tolist(),
                "image": c.node_name[i] if c.node_kind[i] == NodeKind.IMAGE
                else (c.node_name[nb + image] if image >= 0 else None)}

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

    def _uids_of(self, entry: _Entry) -> dict[str, np.ndarray]:
        """Item ids this document holds in each store, ascending."""
        lo, hi = entry.number << UID_SHIFT, (entry.number + 1) << UID_SHIFT
        return {store: st.ids_between(lo, hi).cpu().numpy() for store, st in self.stores.items()}

    def _uids_of_many(self, entries: list[_Entry]) -> list[dict[str, np.ndarray]]:
        """:meth:`_uids_of` for many documents: one host copy of each store's live ids and two
        searches per store, instead of a range lookup per document and store."""
        lows = np.fromiter((e.number for e in entries), np.int64, len(entries)) << UID_SHIFT
        out = [{} for _ in entries]
        for store, st in self.stores.items():
            ids = st.live_ids()
            a, b = np.searchsorted(ids, lows).tolist(), np.searchsorted(ids, lows + (1 << UID_SHIFT)).tolist()
            for row, lo, hi in zip(out, a, b):
                row[store] = ids[lo:hi]
        return out

    def _item_ranges(self, store: str, uids: list[np.ndarray]) -> list[tuple[int, int] | None]:
        """:meth:`_item_range` of many documents' items in `store` (None for a document without
        items there), with one position lookup."""
        sizes = np.fromiter((u.size for u in uids), np.int64, len(uids))
        if not sizes.sum():
            return [None] * len(uids)
        pos = self.stores[store].positions(torch.from_numpy(np.concatenate(uids))).cpu().numpy()
        ends = np.cumsum(sizes)
        starts = ends - sizes
        out = []
        for lo, hi in zip(starts.tolist(), ends.tolist()):
            if lo == hi:
                out.append(None)
                continue
            first, last = int(pos[lo:hi].min()), int(pos[lo:hi].max()) + 1
            if last - first != hi - lo:
                raise RuntimeError(f"store {store!r}: a document's items are not contiguous")  # our invariant broke
            out.append((first, last))
        return out

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

    def _item_range(self, store: str, uids: np.ndarray) -> tuple[int, int]:
        """``[first, last)`` positions of a document's items in `store` (they are contiguous:
        items are appended and compacted by whole documents, in document order)."""
        pos = self.stores[store].positions(torch.from_numpy(uids))
        first, last = int(pos.min()), int(pos.max()) + 1
        if last - first != uids.size:
            raise RuntimeError(f"store {store!r}: a document's items are not contiguous")  # our invariant broke
        return first, last

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

    def _plan_prefilters(self, added: list[StoredDocument] | None = None,
                         removed: _Entry | None = None) -> dict[str, tuple]:
        """``{store: (next prefilter or None, what happened)}`` for each store that carries
        prefilters, after adding documents `added` or removing document `removed` (computed
        before anything is written; nothing is changed here)."""
        if self._pf_settings is None:
            return {}
        plan = {}
        uids_out = self._uids_of(removed) if removed is not None else {}
        for s in self._pf_settings.stores:
            new = None
            have = [d for d in (added or ()) if s in d.vectors and d.vectors[s].local.size]
            if have:
                lengths = torch.cat([d.vectors[s].offsets.diff() for d in have])
                offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
                torch.cumsum(lengths, 0, out=offsets[1:])
                values = torch.cat([d.vectors[s].values for d in have]).to(self.dtype)  # as the store keeps them
                uids = torch.from_numpy(np.concatenate([make_uid(d.number, d.vectors[s].local) for d in have]))
                new = (values, offsets, uids)
            out = uids_out.get(s)
            out = torch.from_numpy(out) if out is not None and out.size else None
            plan[s] = _pf.next_prefilter(self._pf_settings, self._prefilters.get(s), self.stores[s], new, out)
        return plan

    def _swap_prefilters(self, plan: dict[str, tuple]) -> None:
        """Puts a committed change's prefilters in memory."""
        for s, (pf, why) in plan.items():
            if why != "unchanged":
                log.info("colgraph_engine: prefilter of store %r %s", s, why)
                self._pf_events[s] = why
            self._prefilters[s] = pf

    def _write_prefilters(self, plan: dict[str, tuple], *, replace: bool = False) -> tuple[dict[str, dict], list]:
        """Writes the plan's changed prefilters (writer lock held): an appended piece per store
        whose prefilter was only updated, else a new base folder (see
        :func:`.prefilters.write_next`); returns the entries the next manifest lists and the
        names written now (to discard when the commit fails). `replace`: the plan replaces
        every entry (settings changed, or a new directory): new bases only."""
        files = {} if replace else {s: dict(e) for s, e in self._pf_files.items()}
        written = []
        try:
            for s, (pf, why) in plan.items():
                if why == "unchanged" and not replace:
                    continue
                committed = files.pop(s, None)
                if pf is not None:
                    files[s], names = _pf.write_next(self.path, s, pf, why, self._prefilters.get(s), committed,
                                                     append=self._pf_append and not replace)
                    written.extend(names)
        except BaseException:
            _pf.discard(self.path, written)
            raise
        return files, written

    def _commit_prefilters(self, plan: dict[str, tuple], *, settings=..., replace: bool = False) -> None:
        """Commits prefilters alone (writer lock held): the plan's folders and a manifest with
        the same parts and vector files; `settings` (default: unchanged) are then this index's."""
        settings = self._pf_settings if settings is ... else settings
        files, written = self._write_prefilters(plan, replace=replace)
        try:
            self._commit(dict(self._parts), prefilter=(settings, files))
        except BaseException:
            _pf.discard(self.path, written)
            raise
        if replace:
            self._prefilters, self._pf_events = {}, {}
        self._pf_settings = settings
        self._swap_prefilters(plan)
        self._changes += 1

    def _open_prefilters(self, m: dict, *, verify: bool, repair: bool) -> None:
        """Loads the prefilters a version-3 manifest `m` names and checks each against its
        store (see :func:`.prefilters.load`); with `repair`, one that fails is rebuilt from the
        store (committed by :meth:`open`)."""
        parsed = _pf.parse_section(m, self.dims, self.path / "manifest.json")
        if parsed is None:
            return
        self._pf_settings, files = parsed
        for s in self._pf_settings.stores:
            entry = files.get(s)
            try:
                if entry is None:
                    pf = None
                    if int(self.stores[s].offsets[-1]) >= self._pf_settings.min_tokens:
                        raise IndexFormatError(f"{self.path / 'manifest.json'}: store {s!r} holds at least min_tokens "
                                               f"tokens but carries no prefilter (the commit that crossed it builds one)")
                else:
                    pf = _pf.load(self.path, s, entry, self.stores[s], self._pf_settings, verify=verify)
            except (IndexFormatError, OSError) as exc:
                if not repair:
                    raise
                pf, why = _pf.next_prefilter(self._pf_settings, None, self.stores[s])
                log.warning("colgraph_engine: %s; rebuilt from the store's vectors", exc)
                self._pf_events[s] = f"repaired: {why}"
            self._prefilters[s] = pf
        self._pf_files = files

    @contextlib.contextmanager
    def _writer(self, *, check_generation: bool = True):
        """Holds the directory's writer lock; refuses to write over a newer generation."""
        fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise IndexConflictError(f"{self.path}: another writer is changing this index") from None
            if check_generation:
                # a commit replaces the manifest (a new file): the same file as at our last read or
                # commit is the same generation, so the O(documents) read is needed only when it changed
                seen = self._manifest_stat
                on_disk = self._generation if seen is not None and seen == _stat_key(self.path / "manifest.json") \
                    else _load_manifest(self.path)["generation"]
                if on_disk != self._generation:
                    raise IndexConflictError(f"{self.path}: changed on disk since it was read (generation {on_disk}, "
                                             f"this index has {self._generation}); open it again")
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _write_part(self, docs: list[StoredDocument], row_sha256: dict[str, str], *,
                    fsync: bool = True) -> tuple[str, dict]:
        """Writes `docs` as a new part file (``fsync=False``: the caller fsyncs it and the parts
        folder); returns its name and manifest entry."""
        folder = self.path / "parts"
        if not folder.is_dir():
            folder.mkdir()
            _atomic.fsync_dir(self.path)
        name = f"p{self._generation + 1:06d}-{uuid.uuid4().hex[:8]}.part"
        sha = write_part_file(folder / name, docs, self.dims, self.dtype, row_sha256, fsync=fsync)
        counts = dict.fromkeys(_COUNTED, 0)
        for d in docs:
            _add_counts(counts, d.graph.counts)
        if fsync:
            _atomic.fsync_dir(folder)
        return name, {"sha256": sha, "documents": len(docs), "counts": counts}

    def _commit(self, parts: dict[str, dict], *, vectors: dict[str, dict] | None = None,
                next_number: int | None = None, pending: Sequence[int] = (), prefilter: tuple | None = None) -> None:
        """Replaces the manifest with one that lists `parts` (name -> entry, in document order)
        and vector files `vectors` (default: unchanged), then deletes the parts and vector files
        no manifest names. The manifest lists parts, not documents: its size grows with the
        number of commits that added parts, not with the documents in them. `pending`: open
        files and folders the commit's files were written to, fsync'ed together with the new
        manifest's temporary file before it replaces the old one. `prefilter`: ``(settings,
        folder entries)`` of the carried prefilters (default: unchanged; settings None: none),
        their folders already written and fsync'ed."""
        vectors = self._vectors if vectors is None else vectors
        pf_settings, pf_files = (self._pf_settings, self._pf_files) if prefilter is None else prefilter
        next_number = self._next_number if next_number is None else next_number
        totals = dict.fromkeys(_COUNTED, 0)
        for e in parts.values():
            _add_counts(totals, e["counts"])
        manifest = {
            "format": INDEX_FORMAT, "version": INDEX_VERSION, "generation": self._generation + 1,
            "dtype": _DTYPE_NAMES[self.dtype], "dims": self.dims, "encoders": self.encoder_info,
            "next_doc_number": next_number, "parts": [{"name": n, **e} for n, e in parts.items()],
            "vectors": vectors, "totals": {"documents": sum(e["documents"] for e in parts.values()), **totals},
        }
        if pf_settings is not None:
            manifest["prefilter"] = _pf.section(pf_settings, pf_files)
        elif self._pf_declined:
            manifest["prefilter_declined"] = True
        _replace_file(self.path / "manifest.json", json.dumps(manifest, separators=(",", ":"), sort_keys=True),
                      pending)
        self._manifest_stat = _stat_key(self.path / "manifest.json")
        self._generation += 1
        self._parts = dict(parts)
        self._vectors = {s: dict(v) for s, v in vectors.items()}
        self._pf_files = {s: dict(e) for s, e in pf_files.items()} if pf_settings is not None else {}
        self._disk_version = INDEX_VERSION
        self._next_number = next_number
        with _readers_lock(self.path, exclusive=True, wait=False) as locked:
            if locked:  # no reader can still be reading an older manifest's parts or files
                _remove_unlisted_parts(self.path, self._parts)
                _remove_unlisted_vectors(self.path, self._vectors)
                _pf.remove_unlisted(self.path, self._pf_files)

    def _assemble(self) -> _Assembly:
        if self._assembly is None:
            self._assembly = self._reassemble()
        return self._assembly

    def _reassemble(self) -> _Assembly:
        """The merged graph built from every document at once (concatenated columns, one
        ``from_arrays``, aliases from every entity name): what each change cost before the
        graph grew in place, kept for removals and as the benchmark's baseline. Consecutive
        documents of one mapped part contribute the part's columns in one slice each."""
        blocks = list(_column_blocks(list(self._docs.values())))

        def cat(name, dtype):
            return np.concatenate([b[name] for b in blocks]).astype(dtype) if blocks else np.zeros(0, dtype)

        n_nodes, n_edges, numbers = cat("n_nodes", np.int64), cat("n_edges", np.int64), cat("numbers", np.int64)
        node_offsets = np.zeros(n_nodes.size + 1, np.int64)
        np.cumsum(n_nodes, out=node_offsets[1:])
        edge_offsets = np.zeros(n_edges.size + 1, np.int64)
        np.cumsum(n_edges, out=edge_offsets[1:])
        shift_nodes = np.repeat(node_offsets[:-1], n_edges)
        node_doc = np.repeat(numbers, n_nodes)
        local_nodes = np.arange(node_offsets[-1], dtype=np.int64) - np.repeat(node_offsets[:-1], n_nodes)
        local_edges = np.arange(edge_offsets[-1], dtype=np.int64) - np.repeat(edge_offsets[:-1], n_edges)
        names = NodeNames()  # the blocks' name columns as chunks: a mapped part's stay undecoded
        for b in blocks:
            names.extend(b["names"])
        node_kind = cat("node_kind", np.uint8)
        graph = KnowledgeGraph.from_arrays(
            node_kind, node_doc, cat("edge_src", np.int64) + shift_nodes,
            cat("edge_dst", np.int64) + shift_nodes, node_weight=cat("node_weight", np.float32),
            edge_kind=cat("edge_kind", np.uint8), edge_weight=cat("edge_weight", np.float32), node_names=names)
        alias_of, keys = _Column(np.full(len(names), -1, np.int64)), {}
        _extend_aliases(alias_of, keys, node_kind, names, 0, self._alias_key)
        graph.set_aliases(alias_of.array)
        return _Assembly(graph, list(self._docs), _Column(node_offsets), _Column(edge_offsets),
                         _Column(make_uid(node_doc, local_nodes)),
                         _Column(make_uid(np.repeat(numbers, n_edges), local_edges)),
                         alias_of, keys)

    @staticmethod
    def _append_to_assembly(a: _Assembly, docs: list[tuple[int, DocumentGraph]]) -> None:
        """Appends documents ``(number, graph)`` to an assembled merged graph in place: their
        nodes and edges (the native append: all their edges lie among their own new nodes),
        offsets, uids and alias entries for their entities only. The result equals
        :meth:`_reassemble` over all documents, array for array."""
        graph = a.graph
        first = graph.n_nodes
        graphs = [g for _, g in docs]
        n_nodes = np.asarray([g.n_nodes for g in graphs], np.int64)
        n_edges = np.asarray([g.n_edges for g in graphs], np.int64)
        numbers = np.asarray([number for number, _ in docs], np.int64)
        node_base = first + np.concatenate([[0], np.cumsum(n_nodes)[:-1]]).astype(np.int64)
        node_kind = np.concatenate([g.node_kind for g in graphs]).astype(np.uint8)
        names = [s for g in graphs for s in g.node_name]
        graph.add_nodes(node_kind, np.repeat(numbers, n_nodes), np.concatenate([g.node_weight for g in graphs]),
                        names=names)
        shift = np.repeat(node_base, n_edges)
        graph.add_edges(np.concatenate([g.edge_src for g in graphs]).astype(np.int64) + shift,
                        np.concatenate([g.edge_dst for g in graphs]).astype(np.int64) + shift,
                        np.concatenate([g.edge_kind for g in graphs]).astype(np.uint8),
                        np.concatenate([g.edge_weight for g in graphs]).astype(np.float32))
        a.doc_ids.extend(g.doc_id for g in graphs)
        a.node_offsets.append(a.node_offsets.last() + np.cumsum(n_nodes))
        a.edge_offsets.append(a.edge_offsets.last() + np.cumsum(n_edges))
        a.node_uid.append(make_uid(np.repeat(numbers, n_nodes), np.concatenate([np.arange(k) for k in n_nodes])))
        a.edge_uid.append(make_uid(np.repeat(numbers, n_edges), np.concatenate([np.arange(k) for k in n_edges])))
        a.alias_of.append(np.full(len(names), -1, np.int64))
        if _extend_aliases(a.alias_of, a.alias_keys, node_kind, names, first):
            graph.set_aliases(a.alias_of.array)

    # -- vector files ---------------------------------------------------------------------------
    def _vector_path(self, store: str, name: str | None = None) -> Path:
        return self.path / "vectors" / (self._vectors[store]["file"] if name is None else name)

    def _row_bytes(self, store: str) -> int:
        return self.dims[store] * np.dtype(_DISK_NP[self.dtype]).itemsize

    def _new_vector_files(self, rows: dict[str, np.ndarray | None]) -> dict[str, dict]:
        """Writes a new vector file per store of `rows` (``[t, d]`` disk rows, None: empty),
        fsync'ed; returns their manifest entries."""
        folder = self.path / "vectors"
        folder.mkdir(exist_ok=True)
        out = {}
        for store, data in rows.items():
            name = f"{store}.{uuid.uuid4().hex[:16]}.bin"
            with open(folder / name, "wb") as f:
                if data is not None and data.size:
                    f.write(memoryview(data).cast("B"))
                f.flush()
                os.fsync(f.fileno())
            out[store] = {"file": name, "rows": 0 if data is None else int(data.shape[0])}
        _atomic.fsync_dir(folder)
        return out

    def _map_store(self, store: str) -> torch.Tensor:
        """``[rows, d]`` the committed rows of `store`'s vector file, memory-mapped (copy on
        write, so the file is never modified through it)."""
        return _map_rows(self._vector_path(store), self._vectors[store]["rows"], self.dims[store], self.dtype)

    def _open_mapped(self, m: dict, *, verify: bool, progress: bool) -> None:
        """Loads a version-2 manifest `m`: graphs and item tables from the parts, vectors mapped."""
        path, dims, dtype = self.path, self.dims, self.dtype
        self._vectors = {s: dict(v) for s, v in m["vectors"].items()}
        runs: list[tuple[str, list[dict]]] = []
        for d in m["documents"]:
            if runs and runs[-1][0] == d["part"]:
                runs[-1][1].append(d)
            else:
                runs.append((d["part"], [d]))
        if len({p for p, _ in runs}) != len(runs) or set(m["parts"]) != {p for p, _ in runs}:
            raise IndexFormatError(f"{path / 'manifest.json'}: a part's documents must form one run of the document "
                                   f"list, and every part must hold documents")
        files = self._check_vector_files()
        row = {s: 0 for s in dims}
        items: dict[str, list] = {s: [] for s in dims}
        for part, listed in tqdm(runs, desc="loading parts", disable=not progress):
            ppath = path / "parts" / part
            _check_part_sha(ppath, m["parts"][part])
            docs, rows = read_part(ppath, dims, dtype, verify=verify, version=part_version(ppath))
            if rows is None:
                raise IndexFormatError(f"{ppath}: a version-1 part in a version-2 index")
            if [(d.graph.doc_id, d.number) for d in docs] != [(d["doc_id"], d["number"]) for d in listed]:
                raise IndexFormatError(f"{ppath}: holds other documents than the manifest lists")
            for stored, d in zip(docs, listed):
                if (stored.graph.n_nodes, stored.graph.n_edges) != (d["nodes"], d["edges"]):
                    raise IndexFormatError(f"{path}: document {d['doc_id']!r} has other counts than the manifest lists")
            for store, (tokens, sha) in rows.items():
                self._claim_rows(row, store, tokens, sha, files[store], part, verify)
                for stored in docs:
                    v = stored.vectors.get(store)
                    if v is not None:
                        items[store].append((make_uid(stored.number, v.local), v.offsets.diff().numpy()))
            for stored in docs:
                self._docs[stored.graph.doc_id] = _Entry(stored.number, part, stored.graph)
                _add_counts(self._totals, stored.graph.counts)
        self._wrap_stores(files, row, items)
        self._parts = dict(m["parts"])

    def _claim_rows(self, row: dict[str, int], store: str, tokens: int, sha: str, file: Path, part: str,
                    verify: bool) -> None:
        """A part owns the next `tokens` rows of `store`'s vector file (advances ``row[store]``):
        IndexFormatError when they pass the committed rows or (with `verify`) their checksum differs."""
        lo = row[store]
        row[store] += tokens
        if row[store] > self._vectors[store]["rows"]:
            raise IndexFormatError(f"{file}: the parts own more rows than the manifest commits")
        if verify and _sha_rows(file, lo, tokens, self._row_bytes(store)) != sha:
            raise IndexFormatError(f"{file}: checksum mismatch in the rows of part {part} "
                                   f"(file changed after it was written)")

    def _check_vector_files(self) -> dict[str, Path]:
        files = {}
        for store in self.dims:
            f = self._vector_path(store)
            want = self._vectors[store]["rows"] * self._row_bytes(store)
            size = f.stat().st_size if f.is_file() else None
            if size is None or size < want:
                raise IndexFormatError(f"{f}: {size or 0} bytes on disk, expected at least {want} "
                                       f"(missing or truncated vector file)")
            files[store] = f
        return files

    def _open_parts(self, m: dict, *, verify: bool, progress: bool) -> None:
        """Loads a version-3 manifest `m`: each part file mapped (:class:`MappedPart`: columns
        and strings stay in the file's pages, documents are cut out on use), item tables per part
        (no per-document work), vectors mapped. Every part's header checksum, document count and
        counts must match the manifest; document ids and numbers must be unique."""
        path, dims = self.path, self.dims
        self._vectors = {s: dict(v) for s, v in m["vectors"].items()}
        files = self._check_vector_files()
        row = {s: 0 for s in dims}
        items: dict[str, list] = {s: [] for s in dims}
        numbers: set[int] = set()
        for entry in tqdm(m["parts"], desc="loading parts", disable=not progress):
            name = entry["name"]
            ppath = path / "parts" / name
            if not ppath.is_file():
                raise IndexFormatError(f"{ppath}: part is missing (the manifest lists it)")
            part = MappedPart(ppath, dims, self.dtype, header_sha256=entry["sha256"], verify=verify)
            if part.n_docs != entry["documents"] or part.counts() != entry["counts"]:
                raise IndexFormatError(f"{ppath}: holds other documents or counts than the manifest lists")
            nums = part.numbers.tolist()
            if max(nums, default=-1) >= m["next_doc_number"] or numbers.intersection(nums):
                raise IndexFormatError(f"{ppath}: document numbers repeat or reach next_doc_number")
            numbers.update(nums)
            for store, (tokens, sha) in part.rows.items():
                self._claim_rows(row, store, tokens, sha, files[store], name, verify)
                voff, local, doc_items = part.items[store]
                if local.size:
                    items[store].append((make_uid(np.repeat(part.numbers, np.diff(doc_items)), local), np.diff(voff)))
            for i, doc_id in enumerate(part.doc_ids):
                if doc_id in self._docs:
                    raise IndexFormatError(f"{ppath}: document {doc_id!r} is in two parts")
                self._docs[doc_id] = _Entry(nums[i], name, source=part, pos=i)
            self._parts[name] = {k: entry[k] for k in ("sha256", "documents", "counts")}
            _add_counts(self._totals, entry["counts"])
        self._wrap_stores(files, row, items)

    def _wrap_stores(self, files: dict[str, Path], row: dict[str, int], items: dict[str, list]) -> None:
        """Stores over the mapped vector files from per-part ``(uids [k], lengths [k])`` tables."""
        for store in self.dims:
            if row[store] != self._vectors[store]["rows"]:
                raise IndexFormatError(f"{files[store]}: the manifest commits {self._vectors[store]['rows']} rows, "
                                       f"the parts own {row[store]}")
            uids = np.concatenate([u for u, _ in items[store]]) if items[store] else np.zeros(0, np.int64)
            lengths = np.concatenate([n for _, n in items[store]]) if items[store] else np.zeros(0, np.int64)
            offsets = np.zeros(lengths.size + 1, np.int64)
            np.cumsum(lengths, out=offsets[1:])
            try:
                self.stores[store] = PackedStore.wrap(self._map_store(store), torch.from_numpy(offsets),
                                                      torch.from_numpy(uids))
            except ValueError as exc:
                raise IndexFormatError(f"{files[store]}: {exc}") from None

    def _rewrite_all(self) -> None:
        """Commits every document as one part with fresh vector files (writer lock held): what
        :meth:`save` writes, and the upgrade of a version-1 directory. Memory then maps them."""
        docs = self._stored_items_many(list(self._docs))
        rows = {s: _to_disk_rows(st.values, self.dtype) for s, st in self.stores.items()}
        for s, st in self.stores.items():
            if st.n_slots != len(st):
                raise RuntimeError(f"store {s!r} holds deleted items")  # removal compacts at once
        vectors = self._new_vector_files(rows)
        part, pf_written = "", []
        try:
            shas = {s: hashlib.sha256(memoryview(r).cast("B")).hexdigest() if r.size else _EMPTY_SHA
                    for s, r in rows.items()}
            parts = {}
            if docs:
                part, entry = self._write_part(docs, shas)
                parts[part] = entry
            # every carried prefilter again, under new folder names (a new or upgraded directory)
            pf_files, pf_written = self._write_prefilters(
                {s: (pf, "rewritten") for s, pf in self._prefilters.items()}, replace=True)
            self._commit(parts, vectors=vectors, next_number=self._next_number,
                         prefilter=(self._pf_settings, pf_files))
        except BaseException:
            for v in vectors.values():
                (self.path / "vectors" / v["file"]).unlink(missing_ok=True)
            if part:
                (self.path / "parts" / part).unlink(missing_ok=True)
            _pf.discard(self.path, pf_written)
            raise
        del rows
        for doc_id in self._docs:
            self._docs[doc_id].part = part
        for s, st in self.stores.items():
            self.stores[s] = PackedStore.wrap(self._map_store(s), st.offsets, st.ids)
        self._changes += 1

    def _merged_tail(self, n_new: int) -> list[str]:
        """The documents (ids, in order) of the parts at the end of the list that a new part of
        `n_new` documents absorbs: going back from the end, each part that holds no more
        documents than the new part has gathered so far (a binary counter). So an index keeps at
        most about log2(documents) + 1 parts however it was grown (one file, one header check and
        one mapping each on open), and a document is rewritten O(log documents) times amortised;
        vector rows never move (the merged parts' rows are already the files' last rows)."""
        tail, gathered = set(), n_new
        for name in reversed(self._parts):
            if self._parts[name]["documents"] > gathered:
                break
            tail.add(name)
            gathered += self._parts[name]["documents"]
        out = []
        for doc_id in reversed(self._docs):  # the tail parts' documents are the last ones
            if self._docs[doc_id].part not in tail:
                break
            out.append(doc_id)
        return out[::-1]

    def _append_committed(self, stored: list[StoredDocument], prefilters: dict[str, tuple]) -> str:
        """Appends the documents' rows to the vector files, writes their part file (absorbing
        the small parts at the end of the list, see :meth:`_merged_tail`) and commits (writer
        lock held); returns the part's name. The appended vector files, the part file, the parts
        folder and the new manifest are fsync'ed together (concurrently), then the index folder
        after the rename: a constant number of fsyncs per commit, however many documents and
        arrays. The changed prefilters (`prefilters`, see :meth:`_plan_prefilters`) are written
        to new folders (fsync'ed) before the manifest names them. On failure, cuts the files back
        to their committed rows and removes the part and the new prefilter folders (a crash leaves
        them to the next writer)."""
        rows = {s: disk_rows(stored, s, d, self.dtype) for s, d in self.dims.items()}
        merged = self._merged_tail(len(stored))
        kept = self._stored_items_many(merged)
        appended, files = {}, []
        part, folder, pf_written = "", None, []
        try:
            pf_files, pf_written = self._write_prefilters(prefilters)
            for store, data in rows.items():
                committed = self._vectors[store]["rows"] * self._row_bytes(store)
                f = _append_rows(self._vector_path(store), committed, data)
                if f is not None:
                    appended[store] = committed
                    files.append(f)
            shas = {}
            for s, r in rows.items():
                h = hashlib.sha256()
                old = sum(int(d.vectors[s].offsets[-1]) for d in kept if s in d.vectors)  # the tail's rows
                if old:
                    _sha_rows(self._vector_path(s), self._vectors[s]["rows"] - old, old, self._row_bytes(s), h)
                h.update(memoryview(r).cast("B") if r.size else b"")
                shas[s] = h.hexdigest()
            part, entry = self._write_part(kept + stored, shas, fsync=False)
            files.append(open(self.path / "parts" / part, "rb"))
            folder = os.open(self.path / "parts", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))  # the part's name
            vectors = {s: {"file": v["file"], "rows": v["rows"] + int(rows[s].shape[0])}
                       for s, v in self._vectors.items()}
            absorbed = {self._docs[d].part for d in merged}
            self._commit({**{n: e for n, e in self._parts.items() if n not in absorbed}, part: entry},
                         vectors=vectors, next_number=max([self._next_number] + [d.number + 1 for d in stored]),
                         pending=[f.fileno() for f in files] + [folder], prefilter=(self._pf_settings, pf_files))
            for d in merged:
                self._docs[d].part = part
        except BaseException:
            if part:
                (self.path / "parts" / part).unlink(missing_ok=True)
            _pf.discard(self.path, pf_written)
            for store, committed in appended.items():
                with contextlib.suppress(OSError):
                    os.truncate(self._vector_path(store), committed)
            raise
        finally:
            for f in files:
                f.close()
            if folder is not None:
                os.close(folder)
        return part

    def _remove_committed(self, doc_id: str, prefilters: dict[str, tuple]) -> None:
        """Removes a document from the directory and memory (writer lock held): new vector files
        without its rows for the stores it had rows in, a new part for the documents that shared
        its part, one commit; memory then maps the new files and re-assembles the graph."""
        entry = self._docs[doc_id]
        siblings = [d for d, e in self._docs.items() if e.part == entry.part and d != doc_id]
        group_uids = self._uids_of_many([self._docs[d] for d in siblings] + [entry])
        ranges = {s: self._item_ranges(s, [u[s] for u in group_uids]) for s in self.stores}
        cut = {}  # store -> (first item, last item, first row, last row)
        for store, r in ranges.items():
            if r[-1] is not None:
                first, last = r[-1]
                off = self.stores[store].offsets
                cut[store] = (first, last, int(off[first]), int(off[last]))
        kept = self._stored_items_many(siblings, group_uids[:-1], {s: r[:-1] for s, r in ranges.items()})
        new_files, part, pf_written = {}, "", []
        try:
            pf_files, pf_written = self._write_prefilters(prefilters)
            vectors = {s: dict(v) for s, v in self._vectors.items()}
            folder = self.path / "vectors"
            for store, (_, _, lo, hi) in cut.items():
                name = f"{store}.{uuid.uuid4().hex[:16]}.bin"
                rb = self._row_bytes(store)
                _copy_without(self._vector_path(store), folder / name, lo * rb, hi * rb,
                              self._vectors[store]["rows"] * rb)
                new_files[store] = name
                vectors[store] = {"file": name, "rows": self._vectors[store]["rows"] - (hi - lo)}
            if new_files:
                _atomic.fsync_dir(folder)
            parts = {}
            if kept:
                shas = {}
                for store in self.dims:
                    # the part's documents own one run of rows; the removed one's rows lie inside it
                    runs = [r for r in ranges[store] if r is not None]
                    off = self.stores[store].offsets
                    lo = int(off[min(r[0] for r in runs)]) if runs else 0
                    hi = int(off[max(r[1] for r in runs)]) if runs else 0
                    if store in cut:
                        hi -= cut[store][3] - cut[store][2]
                    shas[store] = _sha_rows(folder / vectors[store]["file"], lo, hi - lo, self._row_bytes(store))
                part, part_entry = self._write_part(kept, shas)
            for name, e in self._parts.items():  # the new part takes the old one's place (document order)
                if name != entry.part:
                    parts[name] = e
                elif part:
                    parts[part] = part_entry
            self._commit(parts, vectors=vectors, prefilter=(self._pf_settings, pf_files))
        except BaseException:
            if part:
                (self.path / "parts" / part).unlink(missing_ok=True)
            for name in new_files.values():
                (self.path / "vectors" / name).unlink(missing_ok=True)
            _pf.discard(self.path, pf_written)
            raise
        # committed: now memory
        for store, (first, last, lo, hi) in cut.items():
            st = self.stores[store]
            off, ids = st.offsets, st.ids
            offsets = torch.cat([off[:first + 1], off[last + 1:] - (hi - lo)])
            self.stores[store] = PackedStore.wrap(self._map_store(store), offsets, torch.cat([ids[:first], ids[last:]]))
        _add_counts(self._totals, entry.graph.counts, -1)
        del self._docs[doc_id]
        for d in siblings:
            self._docs[d].part = part
        self._assembly = None
        self._swap_prefilters(prefilters)
        self._changes += 1


_BLOCK_COLUMNS = ("node_kind", "node_weight", "edge_src", "edge_dst", "edge_kind", "edge_weight")


def _column_blocks(entries: list[_Entry]):
    """The columns the merged graph needs, for consecutive documents at a time: a run of one
    mapped part's consecutive documents gives one slice of each of the part's columns; a held
    graph gives its own. Yields dicts with ``n_nodes``/``n_edges``/``numbers`` (``[r]`` per
    document), the columns and ``names`` (node names, a sequence)."""
    i = 0
    while i < len(entries):
        e = entries[i]
        if e._graph is not None:
            g = e._graph
            yield {"n_nodes": [g.n_nodes], "n_edges": [g.n_edges], "numbers": [e.number], "names": g.node_name,
                   **{c: getattr(g, c) for c in _BLOCK_COLUMNS}}
            i += 1
            continue
        j = i + 1
        while j < len(entries) and entries[j]._graph is None and entries[j].source is e.source \
                and entries[j].pos == entries[j - 1].pos + 1:
            j += 1
        p, a, b = e.source, e.pos, entries[j - 1].pos + 1
        na, nb, ea, eb = int(p.doc_nodes[a]), int(p.doc_nodes[b]), int(p.doc_edges[a]), int(p.doc_edges[b])
        yield {"n_nodes": np.diff(p.doc_nodes[a:b + 1]), "n_edges": np.diff(p.doc_edges[a:b + 1]),
               "numbers": p.numbers[a:b], "names": p.node_name[na:nb],
               **{c: getattr(p, c)[na:nb] if c.startswith("node") else getattr(p, c)[ea:eb] for c in _BLOCK_COLUMNS}}
        i = j


def _extend_aliases(alias_of: _Column, keys: dict, node_kind: np.ndarray, names: list[str], first: int,
                    normalize=None) -> bool:
    """Alias entries for nodes ``first, first+1, ...`` (kinds `node_kind`, names `names`):
    entities with equal :func:`normalize_name` share a group whose id is the first member's node
    id (stable as nodes are appended, so a full re-assembly gives the same ids). `keys` maps a
    normalised name to its first member (a group of one has ``alias_of == -1`` there: one int
    per name, no per-group object). `normalize`: the key function (default the uncached
    :func:`normalize_name`). Returns whether any entry changed."""
    normalize = _normalize if normalize is None else normalize
    arr = alias_of._buf  # entries below alias_of's length; older ones change when a key gains its second member
    changed = False
    ent = np.flatnonzero(node_kind == NodeKind.ENTITY)
    # a NodeNames over mapped columns decodes the entity names in one pass per chunk
    ent_names = names.take(ent) if hasattr(names, "take") else [names[i] for i in ent.tolist()]
    for i, name in zip(ent.tolist(), ent_names):
        v = first + i
        key = normalize(name)
        head = keys.get(key)
        if head is None:
            keys[key] = v
            continue
        arr[head] = head  # (again) the group's id: its first member's
        arr[v] = head
        changed = True
    return changed


# normalize_name without its cache: the index normalises every entity name once per assembly, and
# a cache of up to 2^17 names would hold tens of MiB in a process that only serves the index
_normalize = getattr(normalize_name, "__wrapped__", normalize_name)


_COUNTED = ("nodes", "edges", "segments", "entities", "relations", "images", "regions", "tables")


def _add_counts(totals: dict[str, int], counts: dict[str, int], sign: int = 1) -> dict[str, int]:
    """Adds (``sign=-1``: subtracts) a document's or part's `counts` to `totals` in place."""
    for k in _COUNTED:
        totals[k] += sign * counts[k]
    return totals


# -- files --------------------------------------------------------------------------------------

_OPEN_ATTEMPTS = 8
_PART_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_MAX_DIM = 1 << 20


@contextlib.contextmanager
def _readers_lock(path: Path, *, exclusive: bool, wait: bool):
    """``flock`` on the index folder itself. Yields True when held; False when it is not (a
    writer asking without waiting while readers read, or a file system without flock)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # missing folder: the manifest reader reports it
        yield False
        return
    try:
        flags = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB)
        try:
            fcntl.flock(fd, flags)
            held = True
        except BlockingIOError:
            held = False
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            held = False
        yield held
    finally:
        os.close(fd)


def _stat_key(path: Path) -> tuple | None:
    """What identifies one written version of a file: device, inode, size, change time."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _generation_on_disk(path: Path):
    try:
        return _load_manifest(path)["generation"]
    except (IndexFormatError, OSError):
        return None


def _check_new_folder(path: Path, overwrite: bool) -> None:
    """ValueError unless a new index may be written at `path`: a missing or empty folder, or
    (with `overwrite`) one that holds an index. A folder with other files is refused, naming a
    few of them: writing an index into it would mix the user's files with the index's."""
    if (path / "manifest.json").exists() and not overwrite:
        raise ValueError(f"path: {path} already holds an index (pass overwrite=True to replace it)")
    if overwrite or not path.exists():
        return
    if not path.is_dir():
        raise ValueError(f"path: {path} exists and is not a folder")
    entries = sorted(e.name for e in path.iterdir())
    if entries:
        shown = ", ".join(entries[:5]) + (f", ... ({len(entries)} entries)" if len(entries) > 5 else "")
        raise ValueError(f"path: {path} is a non-empty folder that holds no knowledge index ({shown}); "
                         "choose an empty or new folder")


def _check_replaceable(path: Path) -> None:
    """Overwriting may delete `path` only when it is an empty folder or holds an index."""
    if not path.is_dir() or path.is_symlink():
        raise ValueError(f"path: {path} exists and is not a folder; refusing to replace it")
    if not any(path.iterdir()):
        return
    try:
        m = _arraydir.loads_bounded((path / "manifest.json").read_text(encoding="utf-8"), path / "manifest.json")
    except (OSError, UnicodeDecodeError, IndexFormatError):
        m = None
    if not isinstance(m, dict) or m.get("format") != INDEX_FORMAT:
        raise ValueError(f"path: {path} is a non-empty folder that holds no knowledge index; refusing to delete it "
                         f"(remove it yourself or choose another path)")


def _check_part_sha(path: Path, expected: str) -> None:
    """IndexFormatError unless the part folder `path` exists with the manifest checksum the
    index manifest lists for it (folder parts: versions 1 and 2)."""
    got = _part_sha(path)
    if got is None:
        raise IndexFormatError(f"{path}: part is missing (the manifest lists it)")
    if got != expected:
        raise IndexFormatError(f"{path}: part manifest checksum mismatch (expected {expected[:12]}…, "
                               f"got {str(got)[:12]}…)")


def _part_sha(path: Path) -> str | None:
    mf = path / "manifest.json"
    return _atomic.sha256_file(mf) if mf.is_file() else None


def _replace_file(path: Path, text: str, pending: Sequence[int] = ()) -> None:
    """Atomically replaces `path` with `text` (temporary file, fsync, rename, fsync folder).
    `pending`: open files (descriptors) that must be on disk before the rename; they are
    fsync'ed together with the temporary file."""
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            _fsync_all([f.fileno(), *pending])
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _atomic.fsync_dir(path.parent)


_EMPTY_SHA = hashlib.sha256(b"").hexdigest()
_VECTOR_NAME = re.compile(r"([a-z_]{1,32})\.[0-9a-f]{8,32}\.bin")
_COPY_BLOCK = 1 << 24


def _to_disk_rows(values: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    v = values.detach().cpu().to(dtype).contiguous()
    return (v.view(torch.int16) if dtype == torch.bfloat16 else v).numpy()


def _map_rows(path: Path, rows: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """``[rows, dim]`` over the first rows of raw file `path`, memory-mapped copy-on-write
    (pages load on first touch; writes through it would never reach the file)."""
    if rows == 0:
        return torch.empty((0, dim), dtype=dtype)
    values = torch.from_numpy(np.memmap(path, dtype=_DISK_NP[dtype], mode="c", shape=(rows, dim)))
    return values.view(dtype) if dtype == torch.bfloat16 else values


def _append_rows(path: Path, committed_bytes: int, data: np.ndarray):
    """Cuts `path` back to its committed bytes (leftovers of an interrupted append; readers never
    look past them) and appends `data`. Returns the open file for the caller to fsync and close,
    or None when there was nothing to append (no fsync needed)."""
    f = open(path, "r+b")
    try:
        if os.fstat(f.fileno()).st_size != committed_bytes:
            f.truncate(committed_bytes)
        if not data.size:
            f.close()
            return None
        f.seek(committed_bytes)
        f.write(memoryview(np.ascontiguousarray(data)).cast("B"))
        f.flush()
    except BaseException:
        f.close()
        raise
    return f


def _fsync_all(fds: Sequence[int]) -> None:
    """fsyncs the files concurrently: one commit's files reach the disk in about the time of one
    fsync instead of one after another (``os.fsync`` releases the GIL)."""
    if len(fds) <= 1:
        for fd in fds:
            os.fsync(fd)
        return
    for _ in _fsync_pool().map(lambda fd: os.fsync(fd), fds):  # re-raises the first failure
        pass


@functools.lru_cache(maxsize=1)
def _fsync_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=16, thread_name_prefix="colgraph-fsync")


def _copy_without(src: Path, dst: Path, lo: int, hi: int, end: int) -> None:
    """Writes bytes ``[0, lo)`` and ``[hi, end)`` of `src` to a new file `dst` (streamed in
    blocks: memory stays bounded), fsync'ed."""
    try:
        with open(src, "rb") as fin, open(dst, "xb") as fout:
            for a, b in ((0, lo), (hi, end)):
                fin.seek(a)
                left = b - a
                while left:
                    block = fin.read(min(left, _COPY_BLOCK))
                    if not block:
                        raise IndexFormatError(f"{src}: shorter than its committed rows")
                    fout.write(block)
                    left -= len(block)
            fout.flush()
            os.fsync(fout.fileno())
    except BaseException:
        dst.unlink(missing_ok=True)
        raise


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


def _sha_rows(path: Path, first_row: int, n_rows: int, row_bytes: int, h=None) -> str:
    """sha256 of rows ``[first_row, first_row + n_rows)`` of raw file `path`, read in blocks
    (through the page cache, not into this process's memory); `h`: a hash to continue."""
    h = hashlib.sha256() if h is None else h
    with open(path, "rb") as f:
        f.seek(first_row * row_bytes)
        left = n_rows * row_bytes
        while left:
            block = f.read(min(left, _COPY_BLOCK))
            if not block:
                raise IndexFormatError(f"{path}: shorter than its committed rows")
            h.update(block)
            left -= len(block)
    return h.hexdigest()


# What the index itself writes into parts/ and vectors/ (see _write_part, _new_vector_files; folder
# parts are versions 1 and 2). Cleanup after a commit deletes only such names: a file the index did
# not write is never its to delete.
_OWN_PART = _atomic.own_names(r"p\d{6}-[0-9a-f]{8}(?:\.part)?")
_OWN_VECTORS = _atomic.own_names(r"[a-z_]{1,32}\.[0-9a-f]{16}\.bin")


def _remove_unlisted_vectors(path: Path, vectors: dict[str, dict]) -> None:
    folder = path / "vectors"
    if not folder.is_dir():
        return
    listed = {v["file"] for v in vectors.values()}
    for entry in folder.iterdir():
        if entry.name not in listed and _OWN_VECTORS.fullmatch(entry.name) and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)


def _remove_unlisted_parts(path: Path, parts: dict[str, str]) -> None:
    folder = path / "parts"
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        if entry.name not in parts and _OWN_PART.fullmatch(entry.name) and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
    for stale in path.glob(".manifest.json.tmp-*"):
        stale.unlink(missing_ok=True)


def _load_manifest(path: Path) -> dict:
    """The index manifest of `path` (any readable version), validated as untrusted input."""
    mf = path / "manifest.json"
    m = None
    for version in sorted(READABLE_VERSIONS, reverse=True):
        try:
            m = _arraydir.read_versioned_json(path, INDEX_FORMAT, version)
            break
        except IndexFormatError as exc:
            if "format version" not in str(exc):
                raise
            if version == READABLE_VERSIONS[0]:
                raise IndexFormatError(f"{mf}: format version {_version_of(mf)!r}, this build reads "
                                       f"{list(READABLE_VERSIONS)}") from None

    def count(x, top=_arraydir.MAX_COUNT):
        return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= top

    ok = (m.get("dtype") in _DTYPES_BY_NAME and isinstance(m.get("dims"), dict)
          and all(s in STORES and count(d, _MAX_DIM) and d > 0 for s, d in m["dims"].items())
          and isinstance(m.get("encoders"), dict) and count(m.get("generation"))
          and count(m.get("next_doc_number"), MAX_DOC_NUMBER + 1))
    if ok and m["version"] != 1:
        vec = m.get("vectors")
        ok = isinstance(vec, dict) and set(vec) == set(m["dims"]) and all(
            isinstance(v, dict) and isinstance(v.get("file"), str)
            and (g := _VECTOR_NAME.fullmatch(v["file"])) is not None and g.group(1) == s
            and count(v.get("rows")) for s, v in vec.items())
        if not ok:
            raise IndexFormatError(f"{mf}: field 'vectors' missing or invalid (one entry per store: a file named "
                                   f"'<store>.<hex>.bin' and its committed rows)")
    if ok and m["version"] == 3:
        _check_part_list(m, mf, count)
        return m
    ok = ok and isinstance(m.get("parts"), dict) and all(isinstance(h, str) for h in m["parts"].values()) \
        and isinstance(m.get("documents"), list)
    if ok:
        _check_part_names(m["parts"], mf)
        numbers, ids = set(), set()
        for d in m["documents"]:
            if not (isinstance(d, dict) and isinstance(d.get("doc_id"), str) and count(d.get("number"))
                    and d["number"] < m["next_doc_number"] and d.get("part") in m["parts"]
                    and count(d.get("nodes")) and count(d.get("edges"))
                    and d["number"] not in numbers and d["doc_id"] not in ids):
                ok = False
                break
            numbers.add(d["number"])
            ids.add(d["doc_id"])
    if not ok:
        raise IndexFormatError(f"{mf}: fields missing or inconsistent")
    return m


def _version_of(mf: Path):
    try:
        m = _arraydir.loads_bounded(mf.read_text(encoding="utf-8"), mf)
    except (OSError, UnicodeDecodeError, IndexFormatError):
        return None
    return m.get("version") if isinstance(m, dict) else None


def _check_part_names(names, mf: Path) -> None:
    bad = [p for p in names if not _PART_NAME.fullmatch(p)]
    if bad:  # checked here, once, so no caller can be led outside parts/
        raise IndexFormatError(f"{mf}: part name {bad[0][:80]!r} is not a plain file or folder name "
                               f"(letters, digits, '._-', no leading dot, at most 128 characters)")


def _check_part_list(m: dict, mf: Path, count) -> None:
    """Version 3: ``parts`` is a list of ``{"name", "sha256", "documents", "counts"}`` (unique
    plain names, a hex sha256, bounded counts), and ``totals`` are their sums."""
    parts = m.get("parts")
    ok = isinstance(parts, list) and all(
        isinstance(p, dict) and isinstance(p.get("name"), str) and isinstance(p.get("sha256"), str)
        and len(p["sha256"]) == 64 and all(c in "0123456789abcdef" for c in p["sha256"])
        and count(p.get("documents")) and p["documents"] > 0 and isinstance(p.get("counts"), dict)
        and set(p["counts"]) == set(_COUNTED) and all(count(v) for v in p["counts"].values()) for p in parts)
    if not ok:
        raise IndexFormatError(f"{mf}: field 'parts' missing or invalid (a list of name, sha256, documents, counts)")
    names = [p["name"] for p in parts]
    _check_part_names(names, mf)
    if len(set(names)) != len(names):
        raise IndexFormatError(f"{mf}: a part is listed twice")
    totals = {"documents": sum(p["documents"] for p in parts),
              **{k: sum(p["counts"][k] for p in parts) for k in _COUNTED}}
    if m.get("totals") != totals:
        raise IndexFormatError(f"{mf}: 'totals' are not the sums of the parts' counts")


class _DocumentList(Sequence):
    """``documents`` of a version-3 manifest for readers of the version-2 layout (``colgraph
    index info``): its length comes from the manifest; the entries (doc_id, number, part, nodes,
    edges, counts, in document order) are read from the part files on first use."""

    def __init__(self, path: Path, m: dict):
        self._path, self._m, self._docs = path, m, None
        self._n = sum(p["documents"] for p in m["parts"])

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if self._docs is None:
            self._docs = _documents_of(self._path, self._m)
        return self._docs[i]


def _documents_of(path: Path, m: dict) -> list[dict]:
    """The documents of the generation committed when the readers' lock is taken (`m` if it
    is still the current one): under that lock no commit deletes a part being read."""
    with _readers_lock(path, exclusive=False, wait=True):
        now = _load_manifest(path)
        return _documents_of_locked(path, now if now["version"] == 3 else m)


def _documents_of_locked(path: Path, m: dict) -> list[dict]:
    if m["version"] != 3:
        return list(m["documents"])
    docs = []
    for entry in m["parts"]:
        part = MappedPart(path / "parts" / entry["name"], m["dims"], _DTYPES_BY_NAME[m["dtype"]],
                          header_sha256=entry["sha256"], verify=False)
        for i, doc_id in enumerate(part.doc_ids):
            c = part.document(i).counts
            docs.append({"doc_id": doc_id, "number": int(part.numbers[i]), "part": entry["name"],
                         "nodes": c["nodes"], "edges": c["edges"], "counts": {k: c[k] for k in _COUNTED}})
    return docs


def _read_manifest(path: str | os.PathLike) -> dict:
    """The manifest as the command line reads it: :func:`_load_manifest`, and for version 3 a
    ``documents`` list (see :class:`_DocumentList`) in the version-2 shape."""
    path = Path(path)
    m = _load_manifest(path)
    if m["version"] == 3:
        m["documents"] = _DocumentList(path, m)
    return m


def read_documents(path: str | os.PathLike) -> list[dict]:
    """Every document of the index committed in `path`, in order: ``{"doc_id", "number",
    "part", "nodes", "edges", "counts"}`` (read from the part files; any version)."""
    return list(_read_manifest(_as_dir(path))["documents"])


def _locate(a, offsets: np.ndarray, x, name: str) -> tuple[int, str, int]:
    """``(document position, doc id, local id)`` of graph node or edge `x`, given the merged
    graph's per-document `offsets` ``[D+1]``; ValueError naming `name` when out of range."""
    n = int(offsets[-1]) if offsets.size else 0
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or not 0 <= x < n:
        raise ValueError(f"{name}: expected a {name} id in [0, {n}), got {x!r}")
    d = int(np.searchsorted(offsets, x, side="right") - 1)
    return d, a.doc_ids[d], int(x - offsets[d])


def _lookup(sorted_uids: np.ndarray, uids, name: str) -> np.ndarray:
    if isinstance(uids, torch.Tensor):
        uids = uids.cpu().numpy()
    q = np.asarray(uids)
    if q.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integer ids, got dtype {q.dtype}")
    q = q.astype(np.int64).reshape(-1)
    pos = np.searchsorted(sorted_uids, q)
    pos_c = np.minimum(pos, max(sorted_uids.size - 1, 0))
    bad = (pos >= sorted_uids.size) | (sorted_uids[pos_c] != q) if sorted_uids.size else np.ones(q.size, bool)
    if bad.any():
        raise ValueError(f"{name}: id {int(q[bad][0])} names no item of the index")
    return pos.astype(np.int64)


__all__ = ["INDEX_FORMAT", "INDEX_VERSION", "IndexConflictError", "IndexFormatError", "KnowledgeIndex", "make_uid",
           "read_documents", "EdgeKind"]
