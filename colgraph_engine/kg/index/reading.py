"""Reading an index directory into memory (:class:`_Reader`, a private base of
:class:`~.facade.KnowledgeIndex`): the manifest's parts mapped and checked, the vector files mapped
as the stores, the carried prefilters opened (and repaired on request)."""
from __future__ import annotations

from pathlib import Path
from typing import Self

import numpy as np
import torch
from tqdm.auto import tqdm

from . import prefilters as _pf
from ...store.packed_store import _DISK_NP, _DTYPES_BY_NAME, PackedStore
from ..parts import MappedPart, StoredDocument, part_version, read_part
from ..vectors import Encoders
from .format import IndexFormatError, _add_counts, _check_part_sha, _map_rows, _sha_rows, log
from .assembly import _Entry, make_uid


class _Reader:
    @classmethod
    def _open_manifest(cls, path: Path, m: dict, encoders: Encoders | None, *, verify: bool,
                       progress: bool, repair_prefilter: bool = False) -> Self:
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
                    if int(self.stores[s].offsets[-1]) >= self._pf_settings.threshold(self.dims[s]):
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

    # -- vector files ---------------------------------------------------------------------------
    def _vector_path(self, store: str, name: str | None = None) -> Path:
        return self.path / "vectors" / (self._vectors[store]["file"] if name is None else name)

    def _row_bytes(self, store: str) -> int:
        return self.dims[store] * np.dtype(_DISK_NP[self.dtype]).itemsize

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
