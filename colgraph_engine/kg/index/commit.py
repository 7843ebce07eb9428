"""The writer's commit protocol (:class:`_Committer`, a private base of :class:`~.facade.KnowledgeIndex`):
the exclusive lock and generation check, appended vector rows and new part files fsync'ed
together, the manifest replaced as the commit point, the carried prefilters planned and written
with the change, and the clean-up of files no manifest names (the protocol is in
:mod:`colgraph_engine.kg.index`)."""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from ... import _arraydir, _atomic
from . import prefilters as _pf
from ...store.packed_store import _DTYPE_NAMES, PackedStore
from ..parts import StoredDocument, disk_rows, write_part_file
from .format import (INDEX_FORMAT, INDEX_VERSION, IndexFormatError, _COUNTED, _EMPTY_SHA,
                     _add_counts, _load_manifest, _readers_lock, _sha_rows, read_range, _stat_key, _to_disk_rows, log)
from .assembly import _Entry, make_uid


class IndexConflictError(RuntimeError):
    """Another writer holds the index, or changed it since this object read it (reopen it)."""


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


# A forked child inherits the parent's pool but none of its threads: work it queued there would
# wait forever, so the child makes a pool of its own on first use.
os.register_at_fork(after_in_child=_fsync_pool.cache_clear)


def _copy_without(src: Path, dst: Path, lo: int, hi: int, end: int) -> None:
    """Writes bytes ``[0, lo)`` and ``[hi, end)`` of `src` to a new file `dst` (streamed in
    blocks: memory stays bounded), fsync'ed."""
    try:
        with open(src, "rb") as fin, open(dst, "xb") as fout:
            for a, b in ((0, lo), (hi, end)):
                for block in read_range(fin, a, b - a, src):
                    fout.write(block)
            fout.flush()
            os.fsync(fout.fileno())
    except BaseException:
        dst.unlink(missing_ok=True)
        raise


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


class _Committer:
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
