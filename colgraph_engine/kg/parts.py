"""On-disk parts of a knowledge index: a batch of whole documents in one checksummed file.

A part holds, for its D documents in order, every document's graph (columns of
:class:`~colgraph_engine.kg.document.DocumentGraph` concatenated, ids kept local to each
document) and, per store, its items (``vec.<store>.local`` local ids, ``vec.<store>.offsets``
item offsets into the part's rows, ``vec.<store>.doc_items`` per-document item offsets), so that
any document can be cut out again. Strings are UTF-8 blobs with ``[k+1]`` int64 offsets. Parts
are immutable: removing a document writes a new part with the documents that stay.

Version 3 (written now): the arrays of version 2 in ONE file (:mod:`colgraph_engine._arrayfile`:
a header with each array's sha256, then the arrays), so writing a part costs one fsync instead of
one per array; read back as a :class:`MappedPart` (columns and strings stay in the mapped file).
Version 2 (read only): a directory of array files with a manifest; the vectors themselves live
outside the part, in the index's append-only per-store vector files (see
:mod:`colgraph_engine.kg.index`), and the part records, per store, the number of rows its
documents own there (``tokens``) and the sha256 of those rows' bytes (version 3 too). Version 1
(read only) held the rows inside the part as ``vec.<store>.values``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .. import _arraydir, _arrayfile
from ..store.packed_store import _DISK_NP, _DTYPE_NAMES, _DTYPES_BY_NAME, _to_disk
from ..graph.kinds import EdgeKind, NodeKind
from .document import _PLURALS, DocumentGraph
from .strings import StringColumn
from .vectors import STORES, ItemVectors

PART_FORMAT = "colgraph-kg-part"
PART_VERSION = 3
_READABLE = (1, 2)  # part directories; version 3 is a file (MappedPart)

_NODE_STRINGS = ("node_name", "node_type", "node_text", "node_source")
_EDGE_STRINGS = ("edge_keywords", "edge_text")


@dataclass
class StoredDocument:
    """A document on its way to or from a part: its number (stable, never reused), graph and
    vectors (in the index's dtype when read back)."""
    number: int
    graph: DocumentGraph
    vectors: dict[str, ItemVectors]


def _encode_strings(strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    encoded = [s.encode("utf-8") for s in strings]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return np.frombuffer(b"".join(encoded), np.uint8), offsets


def _decode_strings(blob: np.ndarray, offsets: np.ndarray, where: Path) -> list[str]:
    data = blob.tobytes()
    try:
        return [data[offsets[i]:offsets[i + 1]].decode("utf-8") for i in range(offsets.size - 1)]
    except UnicodeDecodeError as exc:
        raise _arraydir.FormatError(f"{where}: string column is not UTF-8 ({exc})") from None


def _offsets_of(counts) -> np.ndarray:
    """``[k+1]`` int64 running sums from 0 of ``k`` counts (a list or an array)."""
    out = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def disk_rows(docs: list[StoredDocument], store: str, dim: int, dtype: torch.dtype) -> np.ndarray:
    """``[t, dim]`` the rows of `store` that `docs` own, in document order, as stored on disk
    (little-endian; bf16 as its 16-bit patterns)."""
    present = [d.vectors[store].values for d in docs if store in d.vectors]
    values = torch.cat(present) if present else torch.zeros((0, dim))
    return np.ascontiguousarray(_to_disk(values.to(dtype)))


def write_part_file(path: Path, docs: list[StoredDocument], dims: dict[str, int], dtype: torch.dtype,
                    row_sha256: dict[str, str], *, fsync: bool = True) -> str:
    """Writes `docs` (graphs and item tables; their vector rows go to the index's vector files)
    as one part file (format version 3: the arrays of a version-2 part in one
    :mod:`~colgraph_engine._arrayfile`) at the new path `path`; returns its header's sha256.
    `dims`: store name -> d; `row_sha256`: store -> sha256 of the bytes of the rows these
    documents own in that store's vector file (in document order). A document's
    ``ItemVectors.values`` may be None here: only its ids and offsets are written.
    ``fsync=False`` leaves the fsync to the caller."""
    arrays, meta = _part_arrays(docs, dims, dtype, row_sha256)
    return _arrayfile.write(path, PART_FORMAT, PART_VERSION, meta, arrays, fsync=fsync)


def _part_arrays(docs: list[StoredDocument], dims: dict[str, int], dtype: torch.dtype,
                 row_sha256: dict[str, str]) -> tuple[dict[str, np.ndarray], dict]:
    graphs = [d.graph for d in docs]
    arrays: dict[str, np.ndarray] = {
        "doc_number": np.asarray([d.number for d in docs], np.int64),
        "doc_nodes": _offsets_of([g.n_nodes for g in graphs]),
        "doc_edges": _offsets_of([g.n_edges for g in graphs]),
    }
    for name in ("node_kind", "node_weight", "node_bbox", "node_edge", "node_image", "node_prov",
                 "edge_src", "edge_dst", "edge_kind", "edge_weight", "edge_prov"):
        parts = [getattr(g, name) for g in graphs]
        arrays[name] = np.concatenate(parts) if parts else np.zeros((0, 4) if name == "node_bbox" else 0,
                                                                    _empty_dtype(name))
    for prov in ("node_prov_offsets", "edge_prov_offsets"):  # per-document CSR -> one CSR
        counts = [np.diff(getattr(g, prov)) for g in graphs]
        arrays[prov] = _offsets_of(np.concatenate(counts) if counts else [])
    for col in ("doc_id", "doc_title") + _NODE_STRINGS + _EDGE_STRINGS:
        if col == "doc_id":
            strings = [g.doc_id for g in graphs]
        elif col == "doc_title":
            strings = [g.title for g in graphs]
        else:
            strings = [s for g in graphs for s in getattr(g, col)]
        arrays[f"{col}.bytes"], arrays[f"{col}.offsets"] = _encode_strings(strings)
    for store, dim in dims.items():
        vecs = [d.vectors.get(store) for d in docs]
        present = [v for v in vecs if v is not None]
        lengths = np.concatenate([np.diff(v.offsets.numpy()) for v in present]) if present else np.zeros(0, np.int64)
        arrays[f"vec.{store}.offsets"] = _offsets_of(lengths)
        arrays[f"vec.{store}.local"] = (np.concatenate([v.local for v in present]) if present
                                        else np.zeros(0, np.int64)).astype(np.int64)
        arrays[f"vec.{store}.doc_items"] = _offsets_of([0 if v is None else v.local.size for v in vecs])
    meta = {"n_docs": len(docs), "n_nodes": int(arrays["doc_nodes"][-1]), "n_edges": int(arrays["doc_edges"][-1]),
            "dtype": _DTYPE_NAMES[dtype], "stores": {s: {"dim": d, "items": int(arrays[f"vec.{s}.local"].size),
                                                          "tokens": int(arrays[f"vec.{s}.offsets"][-1]),
                                                          "sha256": row_sha256[s]}
                                                      for s, d in dims.items()}}
    return arrays, meta


def _empty_dtype(name: str):
    return {"node_kind": np.uint8, "edge_kind": np.uint8, "node_weight": np.float32, "edge_weight": np.float32,
            "node_bbox": np.float32}.get(name, np.int32)


def part_version(path: Path) -> int:
    """The format version of the part in `path` (1 or 2; anything else raises ``FormatError``)."""
    try:
        text = (path / "manifest.json").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _arraydir.FormatError(f"{path}: part manifest unreadable ({exc})") from None
    m = _arraydir.loads_bounded(text, path / "manifest.json")
    v = m.get("version") if isinstance(m, dict) else None
    if v not in _READABLE:
        raise _arraydir.FormatError(f"{path / 'manifest.json'}: part format version {v!r}, this build reads {_READABLE}")
    return v


def read_part(path: Path, dims: dict[str, int], dtype: torch.dtype, *, verify: bool = True,
              version: int = 2) -> tuple[list[StoredDocument], dict[str, tuple[int, str]] | None]:
    """Reads a part directory written by the version-2 or version-1 writer; any
    damage raises ``FormatError``.

    Returns ``(documents, rows)``. Version 2: every ``ItemVectors.values`` is None and `rows`
    maps each store to ``(tokens, sha256)`` of the rows its documents own in the index's vector
    file; item offsets are relative to the part's first row. Version 1: values are read from the
    part and `rows` is None."""
    m = _arraydir.read_manifest(path, PART_FORMAT, version)
    D, n, e = (_arraydir.meta_int(m, k, path) for k in ("n_docs", "n_nodes", "n_edges"))
    stores = m.get("stores")
    if m.get("dtype") != _DTYPE_NAMES[dtype] or not isinstance(stores, dict) or \
            {s: (v or {}).get("dim") for s, v in stores.items()} != dims:
        raise _arraydir.FormatError(f"{path / 'manifest.json'}: dtype or store dimensions differ from the index's")

    def read(name, dt, shape):
        return _arraydir.read_array(path, m, name, dt, shape, verify=verify)

    def offsets(name, k, total=None):
        o = read(name, np.int64, (k + 1,))
        if o[0] != 0 or (np.diff(o) < 0).any() or (total is not None and o[-1] != total):
            raise _arraydir.FormatError(f"{path / (name + '.bin')}: offsets must rise from 0"
                                        + (f" to {total}" if total is not None else ""))
        return o

    def strings(col, k):
        o = offsets(f"{col}.offsets", k)
        return _decode_strings(read(f"{col}.bytes", np.uint8, (int(o[-1]),)), o, path / f"{col}.bytes.bin")

    numbers = read("doc_number", np.int64, (D,))
    doc_nodes, doc_edges = offsets("doc_nodes", D, n), offsets("doc_edges", D, e)
    node = {"node_kind": read("node_kind", np.uint8, (n,)), "node_weight": read("node_weight", np.float32, (n,)),
            "node_bbox": read("node_bbox", np.float32, (n, 4)), "node_edge": read("node_edge", np.int32, (n,)),
            "node_image": read("node_image", np.int32, (n,))}
    edge = {"edge_src": read("edge_src", np.int32, (e,)), "edge_dst": read("edge_dst", np.int32, (e,)),
            "edge_kind": read("edge_kind", np.uint8, (e,)), "edge_weight": read("edge_weight", np.float32, (e,))}
    node_prov_off, edge_prov_off = offsets("node_prov_offsets", n), offsets("edge_prov_offsets", e)
    node_prov = read("node_prov", np.int32, (int(node_prov_off[-1]),))
    edge_prov = read("edge_prov", np.int32, (int(edge_prov_off[-1]),))
    doc_ids, titles = strings("doc_id", D), strings("doc_title", D)
    node_str = {c: strings(c, n) for c in _NODE_STRINGS}
    edge_str = {c: strings(c, e) for c in _EDGE_STRINGS}
    vec = {}
    rows: dict[str, tuple[int, str]] = {}
    for store, dim in dims.items():
        info = stores[store]
        k, t = info.get("items"), info.get("tokens")
        if not all(isinstance(x, int) and x >= 0 for x in (k, t)):
            raise _arraydir.FormatError(f"{path / 'manifest.json'}: store {store!r} counts invalid")
        if version == 1:
            values = torch.from_numpy(read(f"vec.{store}.values", _DISK_NP[dtype], (t, dim)))
            values = values.view(dtype) if dtype == torch.bfloat16 else values
        else:
            sha = info.get("sha256")
            if not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
                raise _arraydir.FormatError(f"{path / 'manifest.json'}: store {store!r} has no valid row checksum")
            rows[store] = (t, sha)
            values = None
        vec[store] = (values, offsets(f"vec.{store}.offsets", k, t), read(f"vec.{store}.local", np.int64, (k,)),
                      offsets(f"vec.{store}.doc_items", D, k))
    docs = []
    for i in range(D):
        a, b = int(doc_nodes[i]), int(doc_nodes[i + 1])
        c, d = int(doc_edges[i]), int(doc_edges[i + 1])
        nn, ne = b - a, d - c
        src, dst = edge["edge_src"][c:d], edge["edge_dst"][c:d]
        if ne and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= nn):
            raise _arraydir.FormatError(f"{path}: document {doc_ids[i]!r} has an edge outside its {nn} nodes")
        npo = node_prov_off[a:b + 1]
        epo = edge_prov_off[c:d + 1]
        g = DocumentGraph(
            doc_id=doc_ids[i], title=titles[i],
            **{k: v[a:b].copy() for k, v in node.items()},
            node_name=node_str["node_name"][a:b], node_type=node_str["node_type"][a:b],
            node_text=node_str["node_text"][a:b], node_source=node_str["node_source"][a:b],
            node_prov_offsets=npo - npo[0], node_prov=node_prov[npo[0]:npo[-1]].copy(),
            **{k: v[c:d].copy() for k, v in edge.items()},
            edge_keywords=edge_str["edge_keywords"][c:d], edge_text=edge_str["edge_text"][c:d],
            edge_prov_offsets=epo - epo[0], edge_prov=edge_prov[epo[0]:epo[-1]].copy())
        vectors = {}
        for store, (values, voff, local, doc_items) in vec.items():
            p, q = int(doc_items[i]), int(doc_items[i + 1])
            if q == p:
                continue
            limit = ne if STORES[store][1] is None else nn
            if local[p:q].min() < 0 or local[p:q].max() >= limit:
                raise _arraydir.FormatError(f"{path}: store {store!r} names an item outside document {doc_ids[i]!r}")
            o = voff[p:q + 1]
            vectors[store] = ItemVectors(local[p:q].copy(), None if values is None else values[o[0]:o[-1]],
                                         torch.from_numpy(o - o[0]))
        docs.append(StoredDocument(int(numbers[i]), g, vectors))
    return docs, (rows if version != 1 else None)


_UTF8_CHUNK = 1 << 22


class MappedPart:
    """A version-3 part file opened for reading (see :func:`write_part_file`).

    Columns stay part-level views of the privately mapped file (pages load on first touch) and
    strings stay :class:`~colgraph_engine.kg.strings.StringColumn` s over its blobs; a document's
    :class:`DocumentGraph` is cut out on demand by :meth:`document` (views, not copies), so an
    open index holds no per-document arrays or ``str`` objects. Only the document ids are decoded.

    Everything the header and the arrays say is checked on open (shapes, rising offsets, every
    edge inside its document's nodes, every item inside its document, every string valid UTF-8,
    read from the file so the check loads no pages into memory); ``verify`` also checks every
    array's sha256. Any damage raises ``FormatError``.

    Attributes: ``path``, ``n_docs``, ``n_nodes``, ``n_edges``, ``numbers [D]`` int64,
    ``doc_ids`` (list of D str), ``doc_nodes`` / ``doc_edges`` ``[D+1]`` int64, the part-level
    graph columns (``node_kind`` ... ``edge_prov``, string columns), ``items[store]`` =
    ``(offsets [k+1], local [k], doc_items [D+1])`` and ``rows[store] = (tokens, sha256)`` of the
    rows its documents own in the index's vector file.
    """

    def __init__(self, path: Path, dims: dict[str, int], dtype: torch.dtype, *, header_sha256: str | None,
                 verify: bool = True):
        f = _arrayfile.ArrayFile(path, PART_FORMAT, (PART_VERSION,), header_sha256=header_sha256)
        if verify:
            f.verify()
        self.path = path
        m = f.meta

        def count(key):
            v = m.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _arraydir.MAX_COUNT:
                raise _arraydir.FormatError(f"{path}: header field {key!r} missing or invalid")
            return v
        D, n, e = count("n_docs"), count("n_nodes"), count("n_edges")
        self.n_docs, self.n_nodes, self.n_edges = D, n, e
        stores = m.get("stores")
        if m.get("dtype") != _DTYPE_NAMES[dtype] or not isinstance(stores, dict) or \
                {s: (v if isinstance(v, dict) else {}).get("dim") for s, v in stores.items()} != dims:
            raise _arraydir.FormatError(f"{path}: dtype or store dimensions differ from the index's")

        def offsets(name, k, total=None):
            o = f.array(name, np.int64, (k + 1,))
            if o[0] != 0 or (np.diff(o) < 0).any() or (total is not None and o[-1] != total):
                raise _arraydir.FormatError(f"{path}: array {name!r}: offsets must rise from 0"
                                            + (f" to {total}" if total is not None else ""))
            return o

        def strings(col, k):
            o = offsets(f"{col}.offsets", k)
            _check_utf8(f, f"{col}.bytes", o)
            return StringColumn(f.array(f"{col}.bytes", np.uint8, (int(o[-1]),)), o)

        self.numbers = f.array("doc_number", np.int64, (D,))
        if D and (self.numbers.min() < 0 or np.unique(self.numbers).size != D):
            raise _arraydir.FormatError(f"{path}: document numbers must be unique and non-negative")
        self.doc_nodes, self.doc_edges = offsets("doc_nodes", D, n), offsets("doc_edges", D, e)
        self.node_kind = f.array("node_kind", np.uint8, (n,))
        self.node_weight = f.array("node_weight", np.float32, (n,))
        self.node_bbox = f.array("node_bbox", np.float32, (n, 4))
        self.node_edge = f.array("node_edge", np.int32, (n,))
        self.node_image = f.array("node_image", np.int32, (n,))
        self.edge_src, self.edge_dst = f.array("edge_src", np.int32, (e,)), f.array("edge_dst", np.int32, (e,))
        self.edge_kind, self.edge_weight = f.array("edge_kind", np.uint8, (e,)), f.array("edge_weight", np.float32, (e,))
        self.node_prov_offsets, self.edge_prov_offsets = offsets("node_prov_offsets", n), offsets("edge_prov_offsets", e)
        self.node_prov = f.array("node_prov", np.int32, (int(self.node_prov_offsets[-1]),))
        self.edge_prov = f.array("edge_prov", np.int32, (int(self.edge_prov_offsets[-1]),))
        self.doc_ids = list(strings("doc_id", D))
        if len(set(self.doc_ids)) != D:
            raise _arraydir.FormatError(f"{path}: a document id appears twice")
        self.titles = strings("doc_title", D)
        for col in _NODE_STRINGS:
            setattr(self, col, strings(col, n))
        for col in _EDGE_STRINGS:
            setattr(self, col, strings(col, e))
        doc_n = np.diff(self.doc_nodes)
        of_edge = np.repeat(np.arange(D), np.diff(self.doc_edges))
        if e and ((np.minimum(self.edge_src, self.edge_dst) < 0).any()
                  or (np.maximum(self.edge_src, self.edge_dst) >= doc_n[of_edge]).any()):
            bad = int(of_edge[(np.maximum(self.edge_src, self.edge_dst) >= doc_n[of_edge])
                              | (np.minimum(self.edge_src, self.edge_dst) < 0)][0])
            raise _arraydir.FormatError(f"{path}: document {self.doc_ids[bad]!r} has an edge outside its "
                                        f"{int(doc_n[bad])} nodes")
        self.items: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.rows: dict[str, tuple[int, str]] = {}
        for store in dims:
            info = stores[store]
            k, t, sha = info.get("items"), info.get("tokens"), info.get("sha256")
            if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (k, t)):
                raise _arraydir.FormatError(f"{path}: store {store!r} counts invalid")
            if not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
                raise _arraydir.FormatError(f"{path}: store {store!r} has no valid row checksum")
            voff, local = offsets(f"vec.{store}.offsets", k, t), f.array(f"vec.{store}.local", np.int64, (k,))
            doc_items = offsets(f"vec.{store}.doc_items", D, k)
            limit = (np.diff(self.doc_edges) if STORES[store][1] is None else doc_n)[
                np.repeat(np.arange(D), np.diff(doc_items))]
            if k and ((local < 0) | (local >= limit)).any():
                raise _arraydir.FormatError(f"{path}: store {store!r} names an item outside its document")
            self.items[store] = (voff, local, doc_items)
            self.rows[store] = (t, sha)

    def document(self, i: int) -> DocumentGraph:
        """The graph of the part's `i`-th document: views of the part's columns (prov offsets
        are rebased, a small new array)."""
        a, b = int(self.doc_nodes[i]), int(self.doc_nodes[i + 1])
        c, d = int(self.doc_edges[i]), int(self.doc_edges[i + 1])
        npo, epo = self.node_prov_offsets[a:b + 1], self.edge_prov_offsets[c:d + 1]
        return DocumentGraph(
            doc_id=self.doc_ids[i], title=self.titles[i],
            node_kind=self.node_kind[a:b], node_weight=self.node_weight[a:b], node_bbox=self.node_bbox[a:b],
            node_edge=self.node_edge[a:b], node_image=self.node_image[a:b],
            node_name=self.node_name[a:b], node_type=self.node_type[a:b], node_text=self.node_text[a:b],
            node_source=self.node_source[a:b],
            node_prov_offsets=npo - npo[0], node_prov=self.node_prov[npo[0]:npo[-1]],
            edge_src=self.edge_src[c:d], edge_dst=self.edge_dst[c:d], edge_kind=self.edge_kind[c:d],
            edge_weight=self.edge_weight[c:d], edge_keywords=self.edge_keywords[c:d], edge_text=self.edge_text[c:d],
            edge_prov_offsets=epo - epo[0], edge_prov=self.edge_prov[epo[0]:epo[-1]])

    def counts(self) -> dict[str, int]:
        """Node, edge and kind counts of all its documents together (as ``DocumentGraph.counts``)."""
        kinds = np.bincount(self.node_kind, minlength=len(NodeKind))
        out = {plural: int(kinds[k]) for k, plural in _PLURALS.items()}
        out["relations"] = int(np.count_nonzero(self.edge_kind == EdgeKind.RELATION))
        out["nodes"], out["edges"] = self.n_nodes, self.n_edges
        return out


def _check_utf8(f: _arrayfile.ArrayFile, name: str, offsets: np.ndarray) -> None:
    """Every string ``blob[o[i]:o[i+1]]`` of blob `name` is valid UTF-8: the blob decodes (read
    from the file in chunks cut at string starts) and no string starts inside a character."""
    total = int(offsets[-1])
    starts = offsets[:-1][np.diff(offsets) > 0]
    cuts = np.unique(np.concatenate([[0], offsets[np.searchsorted(offsets, np.arange(_UTF8_CHUNK, total,
                                                                                       _UTF8_CHUNK))], [total]]))
    for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        data = f.read_bytes(name, a, b)
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _arraydir.FormatError(f"{f.path}: string column {name!r} is not UTF-8 ({exc})") from None
        inside = starts[(starts >= a) & (starts < b)] - a
        if inside.size and ((np.frombuffer(data, np.uint8)[inside] & 0xC0) == 0x80).any():
            raise _arraydir.FormatError(f"{f.path}: string column {name!r}: a string starts inside a character")


__all__ = ["PART_FORMAT", "PART_VERSION", "MappedPart", "StoredDocument", "disk_rows", "part_version", "read_part",
           "write_part_file",
           "_DTYPES_BY_NAME"]
