"""The write path: uploads ingested and documents removed, one change at a time.

Every change runs in one dedicated thread (so writes queue behind each other, in arrival
order, and never run on the event loop): it changes the writer's own index object, which
commits to the directory, then :meth:`IndexState.refresh` publishes the new generation to
readers before the request is answered. At most ``max_pending`` changes may wait; more are
refused (:class:`WriterBusy`, answered 429).

Uploads: the files of one request are written (names checked: a plain file name, no folders,
not hidden, unique) into ``INDEX.uploads/<32 hex>/files/`` beside the index, and ingested as a
folder (:func:`~colgraph_engine.ingest.folder.ingest`): document id = file name, sidecar files
(``photo.jpg.caption.txt`` ...) attach to their image as in ``colgraph index add``. The folder
is kept while one of its documents is in the index (the index refers to image pixels by their
path there); beside ``files/`` its record ``upload.json`` (written atomically once the ingest
returned) names them with their document numbers, which the index never reuses, so a record
cannot be confused with a later upload of the same file name.

Upload folders are removed (never anything else: only ``INDEX.uploads/`` entries named like the
ones made here, 32 hex digits, real folders, not links):

* when the ingest fails or adds nothing (unless a batch was committed before the failure: then
  the record names the documents that were);
* when the last document its record names is removed (``DELETE /documents/{id}``);
* at writer start (:meth:`IndexWriter.sweep`), when no document of the committed index refers to
  the folder: its record names none that is still there, or, with no record (an upload killed
  before it finished, or a folder of a version without records), none of its file names is a
  document id that a record does not already account for. A shared lock on
  ``INDEX.uploads/.lock`` is held by every upload from before its folder exists until its
  record is written, and the sweep takes it exclusively (without waiting; else it is skipped),
  so an upload in progress in another service over the same index is never swept.

Disk full: an ENOSPC or EDQUOT while writing (the upload's files or the index's commit) raises
:class:`DiskFull` (answered 507) naming what was being written relative to the index's parent
folder (no absolute server path), the space free and, for the upload's own files, the space
needed; the index is unchanged (its commits are all or nothing) and the upload folder removed.

Conflicts: when another process changed the index since the writer opened it, the writer
reopens it and tries once more; when another process holds the writer lock, the change is
refused (:class:`~colgraph_engine.kg.IndexConflictError`, answered 409). Commits made by other
processes reach readers through :meth:`IndexWriter.reload_if_changed` (the service polls it).
"""
from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from ..ingest.folder import IngestReport, ingest
from ..kg import IndexConflictError
from .metrics import ServiceMetrics
from .state import IndexState

MAX_NAME_CHARS = 255
RECORD = "upload.json"  # beside files/: the upload's documents {doc_id: document number}
FILES = "files"  # the folder that is ingested (the record is outside it: not a document)
RECORD_FORMAT = 1
UPLOAD_NAME = re.compile(r"[0-9a-f]{32}")  # uuid4().hex: the only names this writer creates
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
log = logging.getLogger("colgraph_engine")


class WriterBusy(RuntimeError):
    """``max_pending`` changes are already waiting for the writer."""


class ReadOnly(RuntimeError):
    """The served index has no directory."""


class DiskFull(RuntimeError):
    """ENOSPC / EDQUOT while writing: the message names the path (relative to the index's
    parent folder), the space free and, when known, the space needed; ``committed`` counts the
    upload's documents committed before it (a batch of a large upload), else the index is unchanged.
    The free space is measured when the message is made (after the failed write was cleaned up)."""

    def __init__(self, problem: str, where: str, device: Path, needed: int | None = None):
        super().__init__(problem)
        self.problem, self.where, self.device, self.needed, self.committed = problem, where, device, needed, 0

    def __str__(self) -> str:
        try:
            free = _size(shutil.disk_usage(self.device).free)
        except OSError:
            free = "unknown"
        need = "" if self.needed is None else f", the upload needs {_size(self.needed)}"
        done = "the index is unchanged" if not self.committed else \
            f"{self.committed} document(s) of this upload were committed before it"
        return f"{self.problem}: no space left {self.where} ({free} free{need}); {done}"


def check_file_name(name: object, what: str) -> str:
    """`name` when it is a plain file name (ValueError naming `what` otherwise)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what}: expected a file name, got {name!r}")
    if len(name) > MAX_NAME_CHARS or "/" in name or "\\" in name or "\x00" in name or name in (".", ".."):
        raise ValueError(f"{what}: expected a plain file name (no folders, at most {MAX_NAME_CHARS} characters), "
                         f"got {name!r}")
    if name.startswith("."):
        raise ValueError(f"{what}: hidden files are not documents, got {name!r}")
    if any(ord(c) < 32 for c in name):
        raise ValueError(f"{what}: control characters in the file name {name!r}")
    return name


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _write_record(folder: Path, documents: dict[str, int]) -> None:
    """``folder/upload.json`` replaced atomically (temporary file, fsync, rename, fsync folder)."""
    tmp = folder / f".{RECORD}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"format": RECORD_FORMAT, "documents": documents}, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / RECORD)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_record(folder: Path) -> dict[str, int] | None:
    """The documents ``{doc_id: number}`` of an upload folder's record (None: no readable record)."""
    try:
        with open(folder / RECORD, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    docs = data.get("documents") if isinstance(data, dict) and data.get("format") == RECORD_FORMAT else None
    if not isinstance(docs, dict) or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                             for k, v in docs.items()):
        return None
    return docs


class IndexWriter:
    """Runs index changes one at a time (see the module docstring)."""

    def __init__(self, state: IndexState, *, max_pending: int = 8, metrics: ServiceMetrics | None = None,
                 ingest_options: dict | None = None):
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending: expected an int >= 1, got {max_pending!r}")
        self.state, self.max_pending, self.metrics = state, max_pending, metrics
        self.ingest_options = dict(ingest_options or {})
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="colgraph-writer")
        self._pending = 0

    @property
    def uploads(self) -> Path:
        return self.state.path.parent / f"{self.state.path.name}.uploads"

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    async def start(self) -> None:
        """Sweeps orphan upload folders (:meth:`sweep`) in the writer's thread, before any change;
        a failure is logged, never raised (serving matters more than tidying)."""
        if not self.state.writable:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self.sweep)
        except Exception as exc:
            log.warning("colgraph serve: could not sweep the upload folders (%s: %s)", type(exc).__name__, exc)

    async def _run(self, operation: str, fn, *args):
        if not self.state.writable:
            raise ReadOnly("the served index has no directory: it is read-only")
        if self._pending >= self.max_pending:
            raise WriterBusy(f"{self._pending} index changes are waiting (limit {self.max_pending})")
        self._pending += 1
        t0 = time.perf_counter()
        outcome = "error"
        try:
            out = await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
            outcome = "ok"
            return out
        except (ValueError, TypeError):
            outcome = "refused"
            raise
        except IndexConflictError:
            outcome = "conflict"
            raise
        except DiskFull:
            outcome = "disk_full"
            raise
        finally:
            self._pending -= 1
            if self.metrics is not None:
                self.metrics.writes.inc(operation=operation, outcome=outcome)
                self.metrics.write_seconds.observe(time.perf_counter() - t0, operation=operation)

    # -- operations -------------------------------------------------------------------------
    async def add_files(self, files: list[tuple[str, bytes]]) -> IngestReport:
        """Ingests uploaded ``(file name, content)`` pairs; returns the ingest report."""
        seen = set()
        for i, (name, _) in enumerate(files):
            check_file_name(name, f"files[{i}]")
            if name in seen:
                raise ValueError(f"files[{i}]: two files are named {name!r}")
            seen.add(name)
        return await self._run("add", self._add, files)

    async def reload_if_changed(self) -> bool:
        """Publishes a commit another process made (queued behind this service's own changes;
        skipped while one is waiting, since it publishes the directory's state anyway)."""
        if not self.state.writable or self._pending or not self.state.changed_on_disk():
            return False
        self._pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, self._reload)
        finally:
            self._pending -= 1

    def _reload(self) -> bool:
        if not self.state.changed_on_disk():
            return False
        self.state.refresh()
        return True

    async def remove(self, doc_id: str) -> None:
        """Removes one document (ValueError when the index has no such document)."""
        await self._run("remove", self._remove, doc_id)

    def _add(self, files: list[tuple[str, bytes]]) -> IngestReport:
        needed = sum(len(content) for _, content in files)
        with self._upload_lock(exclusive=False):
            folder = self.uploads / uuid.uuid4().hex
            with self._disk_full("creating the upload folder", folder, needed):
                (folder / FILES).mkdir(parents=True)
            return self._add_in(folder, files, needed)

    def _add_in(self, folder: Path, files: list[tuple[str, bytes]], needed: int) -> IngestReport:
        try:
            for name, content in files:
                path = folder / FILES / name
                with self._disk_full("writing the upload file", path, needed):
                    with open(path, "wb") as f:
                        f.write(content)
                        f.flush()
                        os.fsync(f.fileno())
            with self._disk_full("committing to the index", self.state.path):
                report = self._with_retry(lambda index: ingest(index, folder / FILES, progress=False,
                                                               **self.ingest_options))
        except BaseException as exc:
            if self._committed_unseen():
                # a batch committed before the failure: serve it, and keep its files
                self.state.refresh()
                kept = self._keep(folder, [name for name, _ in files])
                if isinstance(exc, DiskFull):
                    exc.committed = kept
            else:
                shutil.rmtree(folder, ignore_errors=True)
            raise
        added = [d.doc_id for d in report.by_status("added")]
        if not added:
            shutil.rmtree(folder, ignore_errors=True)
            return report
        self.state.refresh()
        self._keep(folder, added)
        return report

    def _keep(self, folder: Path, names: list[str]) -> int:
        """Writes the record of a kept upload folder: those of `names` the served index now has
        (their count is returned)."""
        index = self.state.snapshot.index
        documents = {n: index.doc_number(n) for n in names if n in index}
        try:
            _write_record(folder, documents)
        except OSError as exc:  # the documents are committed: say so; the sweep goes by file names
            log.warning("colgraph serve: could not write the record of the upload folder %s (%s)",
                        self._shown(folder), exc)
        return len(documents)

    def _remove(self, doc_id: str) -> None:
        number = None

        def change(index):
            nonlocal number
            if doc_id in index:
                number = index.doc_number(doc_id)
            index.remove_document(doc_id)

        with self._disk_full("committing to the index", self.state.path):
            self._with_retry(change)
        self.state.refresh()
        if number is not None:
            try:
                self._release(doc_id, number)
            except OSError as exc:  # the removal is committed; the next start sweeps what is left
                log.warning("colgraph serve: could not tidy the upload folder of %r (%s)", doc_id, exc)

    def _release(self, doc_id: str, number: int) -> None:
        """Drops ``(doc_id, number)`` from the record that names it; removes that folder when no
        document it names is left in the served index. Only folders with a record are touched
        here (a folder without one may be an upload in progress; the sweep handles those)."""
        if not self.uploads.is_dir():
            return
        index = self.state.snapshot.index
        for folder in self._upload_folders():
            docs = read_record(folder)
            if docs is None or docs.get(doc_id) != number:
                continue
            del docs[doc_id]
            left = {d: n for d, n in docs.items() if d in index and index.doc_number(d) == n}
            if left:
                _write_record(folder, left)
            else:
                shutil.rmtree(folder)

    def sweep(self) -> list[str]:
        """Removes the upload folders no document of the committed index refers to (see the
        module docstring); returns their names. Skipped (returns []) while an upload holds the
        lock, here or in another process."""
        if not self.state.writable or not self.uploads.is_dir():
            return []
        with self._upload_lock(exclusive=True) as locked:
            if not locked:
                return []
            if self.state.changed_on_disk():
                self.state.refresh()  # decide on what is committed now, not on an older snapshot
            index = self.state.snapshot.index
            folders = self._upload_folders()
            records = {f: read_record(f) for f in folders}
            claimed = {d for docs in records.values() if docs for d, n in docs.items()
                       if d in index and index.doc_number(d) == n}
            removed = []
            for folder, docs in records.items():
                try:
                    if docs is not None:
                        live = any(d in index and index.doc_number(d) == n for d, n in docs.items())
                    else:  # no record: by file names (of files/, or the folder itself in older layouts)
                        inner = folder / FILES if (folder / FILES).is_dir() else folder
                        live = any(name in index and name not in claimed for name in os.listdir(inner))
                    if not live:
                        shutil.rmtree(folder)
                        removed.append(folder.name)
                except OSError as exc:  # one folder we cannot read or remove: the others still go
                    log.warning("colgraph serve: could not sweep the upload folder %s (%s)", self._shown(folder), exc)
        if removed:
            log.info("colgraph serve: removed %d upload folder(s) no document refers to", len(removed))
        return removed

    def _upload_folders(self) -> list[Path]:
        """The entries of ``INDEX.uploads/`` this writer could have made: real folders (not links)
        named 32 hex digits. Nothing else there is ever touched."""
        out = []
        with os.scandir(self.uploads) as it:
            for e in it:
                if UPLOAD_NAME.fullmatch(e.name) and e.is_dir(follow_symlinks=False):
                    out.append(Path(e.path))
        return sorted(out)

    @contextmanager
    def _upload_lock(self, *, exclusive: bool):
        """``INDEX.uploads/.lock``: shared for an upload (waits), exclusive for the sweep (yields
        False at once when an upload holds it)."""
        with self._disk_full("creating the upload lock", self.uploads / ".lock"):
            self.uploads.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.uploads / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB if exclusive else fcntl.LOCK_SH)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # closing releases the lock

    def _shown(self, path: Path) -> str:
        """`path` relative to the index's parent folder (what answers may name: no server layout)."""
        try:
            return Path(path).resolve().relative_to(self.state.path.parent.resolve()).as_posix()
        except ValueError:
            return Path(path).name

    @contextmanager
    def _disk_full(self, doing: str, path: Path, needed: int | None = None):
        """Turns ENOSPC / EDQUOT raised inside into :class:`DiskFull`: `doing` `path` (or the
        file the error names), the space free there and `needed` bytes when known."""
        try:
            yield
        except OSError as exc:
            if exc.errno not in DISK_FULL:
                raise
            where = Path(exc.filename) if exc.filename else Path(path)
            problem = "the disk quota is exhausted" if exc.errno == errno.EDQUOT else "the disk is full"
            log.warning("colgraph serve: %s %s %s (%s)", problem, doing, where, exc)
            raise DiskFull(problem, f"{doing} {self._shown(where)!r}", self.state.path, needed) from exc

    def _committed_unseen(self) -> bool:
        w = self.state._writer_index
        return w is not None and getattr(w, "_generation", 0) != self.state.snapshot.generation

    def _with_retry(self, change):
        index = self.state.writer_index()
        try:
            carry_prefilters(index)
            return change(index)
        except IndexConflictError:
            # changed on disk by another process since we opened it: read it again, try once more
            # (a writer lock held by another process fails the same way again: 409)
            index = self.state.writer_index(reopen=True)
            carry_prefilters(index)
            return change(index)


def carry_prefilters(index) -> dict[str, str]:
    """Before the writer's first change to an index that carries no prefilters (created with
    ``prefilters=False``, or by a version before new indexes carried them), makes it carry the
    recall stores' prefilters as ``colgraph index build`` does (:func:`colgraph_engine.pipeline.recall.
    carry_default_prefilters`: deferred below the size where the default ``recall_ranker="auto"`` uses
    them, then built and maintained by the commits), committed by the change itself
    (``enable_prefilter(commit=False)``: a change that fails leaves the directory as it was). An index whose
    prefilters were turned off (``disable_prefilter``, ``colgraph index build --no-prefilter``,
    ``colgraph index prefilter --off``) is left as it is. Returns what happened per store ({}: nothing)."""
    if index.prefilter_info() is not None or index.prefilter_declined:
        return {}
    from ..pipeline.recall import carry_default_prefilters as carry
    events = carry(index, commit=False)
    log.info("colgraph serve: the index now carries prefilters (%s)", events)
    return events


__all__ = ["DiskFull", "IndexWriter", "ReadOnly", "WriterBusy", "carry_prefilters", "check_file_name", "read_record"]
