"""The knowledge index: every document's graph and vectors, in memory and in one directory.

Directory layout::

    index/
      manifest.json          format, version, generation, encoders (name, dim), vector dtype,
                             documents (id, number, part, counts), parts (sha256 of each part's
                             manifest), totals
      parts/<name>/          one batch of whole documents (see kg/parts.py): graph columns,
                             attribute strings and vectors, each file sha256-checked

``manifest.json`` is the commit point. A change writes new parts first (each atomically: temporary
folder, fsync, rename), then replaces the manifest (temporary file, fsync, ``os.replace``, fsync
of the folder), and only then deletes parts the new manifest no longer names. A crash at any
point leaves either the previous or the new manifest, and every part that manifest names is
complete; parts no manifest names are removed by the next change. Writers take an exclusive
lock on ``.lock`` (``flock``) for the whole change, and a change is refused with
:class:`IndexConflictError` when another writer holds it or when the manifest's generation is
not the one this object read (someone else committed since): nothing is overwritten unseen.

Readers (:meth:`KnowledgeIndex.open`) hold a shared ``flock`` on the index folder itself while
they read the manifest and then its parts, so they see one committed generation whole. A writer
deletes the parts its new manifest no longer names only when it can take that lock exclusively
without waiting; while a reader holds it, the old parts stay (a later commit removes them), and a
writer never waits for readers. Where the file system has no ``flock``, a reader whose parts
vanish retries with the new manifest when its generation changed.

The manifest is untrusted input: part names must be plain folder names (letters, digits,
``._-``, not starting with a dot: no separators, no ``..``, not absolute), document numbers stay
below 2^31 and counts are bounded; anything else raises :class:`IndexFormatError`.

In memory, the documents' graphs are kept per document and the vectors in one
:class:`~colgraph_engine.store.PackedStore` per store, keyed by a stable item id
``uid = doc_number << 32 | local_id`` (node ids; relation edges use edge ids). The merged
:class:`~colgraph_engine.graph.KnowledgeGraph` over all documents (``graph``) is assembled on first
use after a change: documents in insertion order, ``node_doc`` = document number, aliases grouping
entities with equal normalised names across documents (the query-time merge is a view over it).
Removing a document removes its nodes, edges, aliases and vectors; no other document is rebuilt,
re-extracted or re-encoded.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import _arraydir, _atomic
from ..graph.kinds import EdgeKind, NodeKind
from ..graph.knowledge_graph import KnowledgeGraph
from ..packed import check_finite
from ..store import _DTYPE_NAMES, _DTYPES_BY_NAME, PackedStore
from .document import DocumentGraph, DocumentInput, build_document_graph
from .parts import StoredDocument, read_part, write_part
from .vectors import STORES, Encoders, ItemVectors, encode_document

INDEX_FORMAT = "colgraph-kg-index"
INDEX_VERSION = 1
UID_SHIFT = 32
MAX_DOC_NUMBER = 2**31 - 1

IndexFormatError = _arraydir.FormatError


class IndexConflictError(RuntimeError):
    """Another writer holds the index, or changed it since this object read it (reopen it)."""


@dataclass
class _Entry:
    number: int
    graph: DocumentGraph
    part: str


@dataclass
class _Assembly:
    graph: KnowledgeGraph
    doc_ids: list[str]           # insertion order
    node_offsets: np.ndarray     # [D+1]
    edge_offsets: np.ndarray     # [D+1]
    node_uid: np.ndarray         # [n] sorted (numbers and local ids both rise)
    edge_uid: np.ndarray         # [m] sorted


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
        self._parts: dict[str, str] = {}  # part name -> sha256 of its manifest

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
        if (path / "manifest.json").exists() and not overwrite:
            raise ValueError(f"path: {path} already holds an index (pass overwrite=True to replace it)")
        index = cls(encoders, dtype=dtype, dims=dims)
        if overwrite and path.exists():
            _check_replaceable(path)
            shutil.rmtree(path)
        path.mkdir(parents=True, exist_ok=True)
        index.path = path
        with index._writer(check_generation=False):
            index._commit({}, {})
        return index

    @classmethod
    def open(cls, path: str | os.PathLike, encoders: Encoders | None = None, *, verify: bool = True,
             progress: bool = False) -> KnowledgeIndex:
        """Loads the index committed in `path`.

        Args:
            encoders: needed to add documents that are not pre-encoded; must match the names
                and dimensions the index was built with.
            verify: check every file's sha256 (sizes, shapes and structure are always checked).

        Raises ``FormatError`` (a ValueError) when the directory is missing, truncated, tampered
        with or inconsistent. Concurrent commits never make it fail: it reads one generation
        whole (see the module docstring).
        """
        path = _as_dir(path)
        if encoders is not None and not isinstance(encoders, Encoders):
            raise TypeError(f"encoders: expected Encoders or None, got {type(encoders).__name__}")
        for attempt in range(_OPEN_ATTEMPTS):
            with _readers_lock(path, exclusive=False, wait=True) as locked:
                m = _read_manifest(path)
                try:
                    return cls._open_manifest(path, m, encoders, verify=verify, progress=progress)
                except (IndexFormatError, OSError):
                    if locked or attempt == _OPEN_ATTEMPTS - 1 or _generation_on_disk(path) == m["generation"]:
                        raise  # damaged, not replaced underneath
        raise AssertionError("unreachable")

    @classmethod
    def _open_manifest(cls, path: Path, m: dict, encoders: Encoders | None, *, verify: bool,
                       progress: bool) -> KnowledgeIndex:
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
        by_part: dict[str, list[dict]] = {}
        for d in m["documents"]:
            by_part.setdefault(d["part"], []).append(d)
        loaded: dict[str, tuple[StoredDocument, str]] = {}  # doc id -> (document, part)
        for part in tqdm(m["parts"], desc="loading parts", disable=not progress):
            ppath = path / "parts" / part
            got = _part_sha(ppath)
            if got is None:
                raise IndexFormatError(f"{ppath}: part is missing (the manifest lists it)")
            if got != m["parts"][part]:
                raise IndexFormatError(f"{ppath}: part manifest checksum mismatch (expected {m['parts'][part][:12]}…, "
                                       f"got {str(got)[:12]}…)")
            docs = read_part(ppath, dims, dtype, verify=verify)
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
        if (path / "manifest.json").exists() and not overwrite:
            raise ValueError(f"path: {path} already holds an index (pass overwrite=True to replace it)")
        if overwrite and path.exists():
            _check_replaceable(path)
            shutil.rmtree(path)
        path.mkdir(parents=True, exist_ok=True)
        old = self.path, self._parts, self._generation
        self.path, self._parts, self._generation = path, {}, 0
        try:
            with self._writer(check_generation=False):
                if self._docs:
                    docs = [self._stored(doc_id) for doc_id in self._docs]
                    part = self._write_part(docs)
                    self._commit({part: docs}, {})
                    for d in docs:
                        self._docs[d.graph.doc_id].part = part
                else:
                    self._commit({}, {})
        except BaseException:
            self.path, self._parts, self._generation = old
            raise
        return path

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
        if isinstance(docs, (DocumentInput, DocumentGraph)) or not isinstance(docs, Sequence):
            raise TypeError("docs: expected a sequence of DocumentInput or DocumentGraph")
        seen = set()
        for i, d in enumerate(docs):
            if not isinstance(d, (DocumentInput, DocumentGraph)):
                raise TypeError(f"docs[{i}]: expected a DocumentInput or DocumentGraph, got {type(d).__name__}")
            if d.doc_id in self._docs or d.doc_id in seen:
                raise ValueError(f"docs[{i}]: document id {d.doc_id!r} is already in the index")
            seen.add(d.doc_id)
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
                part = self._write_part(stored)
                try:
                    self._commit({part: stored}, {})
                except BaseException:
                    shutil.rmtree(self.path / "parts" / part, ignore_errors=True)
                    raise
        self._apply_add(stored, [part] * len(stored))
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
        siblings = [d for d, e in self._docs.items() if e.part == entry.part and d != doc_id]
        new_part = ""
        if self.path is not None:
            with self._writer():
                kept = [self._stored(d) for d in siblings]
                written = {}
                if kept:
                    new_part = self._write_part(kept)
                    written[new_part] = kept
                try:
                    self._commit(written, {entry.part: None}, removed={doc_id})
                except BaseException:
                    if new_part:
                        shutil.rmtree(self.path / "parts" / new_part, ignore_errors=True)
                    raise
        # committed (or in memory only): now change memory
        for store, ids in self._uids_of(entry).items():
            if ids.size:
                self.stores[store].delete(torch.from_numpy(ids))
                self.stores[store].compact()
        del self._docs[doc_id]
        for d in siblings:
            self._docs[d].part = new_part
        self._assembly = None

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
    def graph(self) -> KnowledgeGraph:
        """The merged graph over all documents (assembled on first use after a change)."""
        return self._assemble().graph

    def node_uid(self) -> np.ndarray:
        """``[n]`` int64 stable item id of every node of :attr:`graph` (the ids stores use)."""
        return self._assemble().node_uid

    def edge_uid(self) -> np.ndarray:
        return self._assemble().edge_uid

    def nodes_of_uids(self, uids) -> np.ndarray:
        """Graph node ids ``[k]`` of store item ids (ValueError for an id no node has)."""
        return _lookup(self._assemble().node_uid, uids, "uids")

    def edges_of_uids(self, uids) -> np.ndarray:
        return _lookup(self._assemble().edge_uid, uids, "uids")

    def describe_node(self, node: int) -> dict:
        """Document, local id, kind, name, type, text, bbox, provenance segments and (images and
        regions) the image's name of a graph node."""
        a = self._assemble()
        if isinstance(node, bool) or not isinstance(node, (int, np.integer)) or not 0 <= node < a.node_uid.size:
            raise ValueError(f"node: expected a node id in [0, {a.node_uid.size}), got {node!r}")
        d = int(np.searchsorted(a.node_offsets, node, side="right") - 1)
        g = self._docs[a.doc_ids[d]].graph
        v = int(node - a.node_offsets[d])
        box = g.node_bbox[v]
        return {"doc_id": g.doc_id, "local": v, "kind": NodeKind(int(g.node_kind[v])).name.lower(),
                "name": g.node_name[v], "type": g.node_type[v], "text": g.node_text[v],
                "bbox": None if np.isnan(box).any() else tuple(float(x) for x in box),
                "segments": g.provenance(v).tolist(),
                "image": g.node_name[v] if g.node_kind[v] == NodeKind.IMAGE
                else (g.node_name[int(g.node_image[v])] if g.node_image[v] >= 0 else None)}

    def describe_edge(self, edge: int) -> dict:
        """Document, local id, kind, endpoints (graph node ids), keywords, text, weight and
        provenance segments of a graph edge."""
        a = self._assemble()
        if isinstance(edge, bool) or not isinstance(edge, (int, np.integer)) or not 0 <= edge < a.edge_uid.size:
            raise ValueError(f"edge: expected an edge id in [0, {a.edge_uid.size}), got {edge!r}")
        d = int(np.searchsorted(a.edge_offsets, edge, side="right") - 1)
        g = self._docs[a.doc_ids[d]].graph
        e = int(edge - a.edge_offsets[d])
        base = int(a.node_offsets[d])
        return {"doc_id": g.doc_id, "local": e, "kind": EdgeKind(int(g.edge_kind[e])).name.lower(),
                "src": base + int(g.edge_src[e]), "dst": base + int(g.edge_dst[e]),
                "keywords": g.edge_keywords[e], "text": g.edge_text[e], "weight": float(g.edge_weight[e]),
                "segments": g.edge_prov[g.edge_prov_offsets[e]:g.edge_prov_offsets[e + 1]].tolist()}

    @property
    def counts(self) -> dict[str, int]:
        totals: dict[str, int] = {"documents": len(self._docs)}
        for e in self._docs.values():
            for k, v in e.graph.counts.items():
                if k not in ("errors", "warnings"):
                    totals[k] = totals.get(k, 0) + v
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

    def _apply_add(self, docs: list[StoredDocument], parts: list[str]) -> None:
        """Puts committed documents in memory: one store append per store for the whole batch
        (appending per document would copy the growing id and offset arrays each time)."""
        for store in self.stores:
            have = [d for d in docs if store in d.vectors]
            if not have:
                continue
            values = torch.cat([d.vectors[store].values for d in have])
            lengths = torch.cat([d.vectors[store].offsets.diff() for d in have])
            offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
            torch.cumsum(lengths, 0, out=offsets[1:])
            uids = np.concatenate([make_uid(d.number, d.vectors[store].local) for d in have])
            self.stores[store].add((values, offsets), ids=torch.from_numpy(uids))
        for d, part in zip(docs, parts):
            self._docs[d.graph.doc_id] = _Entry(d.number, d.graph, part)
            self._next_number = max(self._next_number, d.number + 1)
        self._assembly = None

    def _uids_of(self, entry: _Entry) -> dict[str, np.ndarray]:
        """Item ids this document holds in each store, ascending."""
        lo, hi = entry.number << UID_SHIFT, (entry.number + 1) << UID_SHIFT
        return {store: st.ids_between(lo, hi).cpu().numpy() for store, st in self.stores.items()}

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
                on_disk = _read_manifest(self.path)["generation"]
                if on_disk != self._generation:
                    raise IndexConflictError(f"{self.path}: changed on disk since it was read (generation {on_disk}, "
                                             f"this index has {self._generation}); open it again")
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _write_part(self, docs: list[StoredDocument]) -> str:
        name = f"p{self._generation + 1:06d}-{uuid.uuid4().hex[:8]}"
        write_part(self.path / "parts" / name, docs, self.dims, self.dtype)
        return name

    def _commit(self, written: dict[str, list[StoredDocument]], dropped: dict[str, None], *,
                removed: Iterable[str] = ()) -> None:
        """Replaces the manifest with one that adds `written` parts and drops `dropped` parts
        (and the documents in `removed`), then deletes parts no manifest names."""
        removed = set(removed)
        parts = {p: h for p, h in self._parts.items() if p not in dropped}
        for p in written:
            parts[p] = _part_sha(self.path / "parts" / p)
        moved = {s.graph.doc_id: p for p, docs in written.items() for s in docs}
        documents = []
        for doc_id, e in self._docs.items():
            if doc_id in removed:
                continue
            g = e.graph
            documents.append({"doc_id": doc_id, "number": e.number, "part": moved.get(doc_id, e.part),
                              "nodes": g.n_nodes, "edges": g.n_edges, "counts": _kind_counts(g)})
        for p, docs in written.items():
            for s in docs:
                if s.graph.doc_id not in self._docs:
                    documents.append({"doc_id": s.graph.doc_id, "number": s.number, "part": p,
                                      "nodes": s.graph.n_nodes, "edges": s.graph.n_edges,
                                      "counts": _kind_counts(s.graph)})
        next_number = max([self._next_number] + [d["number"] + 1 for d in documents])
        manifest = {
            "format": INDEX_FORMAT, "version": INDEX_VERSION, "generation": self._generation + 1,
            "dtype": _DTYPE_NAMES[self.dtype], "dims": self.dims, "encoders": self.encoder_info,
            "next_doc_number": next_number, "documents": documents, "parts": parts,
            "totals": {"documents": len(documents),
                       **{k: sum(d["counts"][k] for d in documents) for k in _COUNTED}},
        }
        _replace_file(self.path / "manifest.json", json.dumps(manifest, indent=1, sort_keys=True))
        self._generation += 1
        self._parts = parts
        self._next_number = next_number
        with _readers_lock(self.path, exclusive=True, wait=False) as locked:
            if locked:  # no reader can still be reading an older manifest's parts
                _remove_unlisted_parts(self.path, parts)

    def _assemble(self) -> _Assembly:
        if self._assembly is not None:
            return self._assembly
        entries = list(self._docs.values())
        graphs = [e.graph for e in entries]
        n_nodes = [g.n_nodes for g in graphs]
        node_offsets = np.zeros(len(graphs) + 1, np.int64)
        np.cumsum(n_nodes, out=node_offsets[1:])
        edge_offsets = np.zeros(len(graphs) + 1, np.int64)
        np.cumsum([g.n_edges for g in graphs], out=edge_offsets[1:])

        def cat(name, dtype):
            return np.concatenate([getattr(g, name) for g in graphs]).astype(dtype) if graphs else np.zeros(0, dtype)

        shift_nodes = np.repeat(node_offsets[:-1], [g.n_edges for g in graphs])
        numbers = np.asarray([e.number for e in entries], np.int64)
        node_doc = np.repeat(numbers, n_nodes)
        local_nodes = np.concatenate([np.arange(k, dtype=np.int64) for k in n_nodes]) if graphs else np.zeros(0, np.int64)
        local_edges = np.concatenate([np.arange(g.n_edges, dtype=np.int64) for g in graphs]) if graphs \
            else np.zeros(0, np.int64)
        names = [s for g in graphs for s in g.node_name]
        graph = KnowledgeGraph.from_arrays(
            cat("node_kind", np.uint8), node_doc, cat("edge_src", np.int64) + shift_nodes,
            cat("edge_dst", np.int64) + shift_nodes, node_weight=cat("node_weight", np.float32),
            edge_kind=cat("edge_kind", np.uint8), edge_weight=cat("edge_weight", np.float32), node_names=names)
        graph.set_aliases_from_names((NodeKind.ENTITY,))
        self._assembly = _Assembly(graph, list(self._docs), node_offsets, edge_offsets,
                                   make_uid(node_doc, local_nodes),
                                   make_uid(np.repeat(numbers, [g.n_edges for g in graphs]), local_edges))
        return self._assembly


_COUNTED = ("nodes", "edges", "segments", "entities", "relations", "images", "regions", "tables")


def _kind_counts(g: DocumentGraph) -> dict[str, int]:
    c = g.counts
    return {k: c[k] for k in _COUNTED}


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


def _generation_on_disk(path: Path):
    try:
        return _read_manifest(path)["generation"]
    except (IndexFormatError, OSError):
        return None


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


def _part_sha(path: Path) -> str | None:
    mf = path / "manifest.json"
    return _atomic.sha256_file(mf) if mf.is_file() else None


def _replace_file(path: Path, text: str) -> None:
    """Atomically replaces `path` with `text` (temporary file, fsync, rename, fsync folder)."""
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _atomic.fsync_dir(path.parent)


def _remove_unlisted_parts(path: Path, parts: dict[str, str]) -> None:
    folder = path / "parts"
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        if entry.name not in parts:
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
    for stale in path.glob(".manifest.json.tmp-*"):
        stale.unlink(missing_ok=True)


def _read_manifest(path: Path) -> dict:
    mf = path / "manifest.json"
    m = _arraydir.read_versioned_json(path, INDEX_FORMAT, INDEX_VERSION)
    def count(x, top=_arraydir.MAX_COUNT):
        return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= top

    ok = (m.get("dtype") in _DTYPES_BY_NAME and isinstance(m.get("dims"), dict)
          and all(s in STORES and count(d, _MAX_DIM) and d > 0 for s, d in m["dims"].items())
          and isinstance(m.get("encoders"), dict) and isinstance(m.get("parts"), dict)
          and all(isinstance(h, str) for h in m["parts"].values())
          and isinstance(m.get("documents"), list) and count(m.get("generation"))
          and count(m.get("next_doc_number"), MAX_DOC_NUMBER + 1))
    if ok:
        bad = [p for p in m["parts"] if not _PART_NAME.fullmatch(p)]
        if bad:  # checked here, once, so no caller can be led outside parts/
            raise IndexFormatError(f"{mf}: part name {bad[0][:80]!r} is not a plain folder name "
                                   f"(letters, digits, '._-', no leading dot, at most 128 characters)")
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
           "EdgeKind"]
