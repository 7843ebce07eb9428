"""The write path: uploads ingested and documents removed, one change at a time.

Every change runs in one dedicated thread (so writes queue behind each other, in arrival
order, and never run on the event loop): it changes the writer's own index object, which
commits to the directory, then :meth:`IndexState.refresh` publishes the new generation to
readers before the request is answered. At most ``max_pending`` changes may wait; more are
refused (:class:`WriterBusy`, answered 429).

Uploads: the files of one request are written (names checked: a plain file name, no folders,
not hidden, unique) into a folder of their own under ``INDEX.uploads/`` beside the index, and
ingested as a folder (:func:`~colgraph_engine.ingest.folder.ingest`): document id = file name,
sidecar files (``photo.jpg.caption.txt`` ...) attach to their image as in ``colgraph index add``.
The folder is kept when a document was added, because the index refers to image pixels by
their path (the generator shows them); otherwise it is deleted.

Conflicts: when another process changed the index since the writer opened it, the writer
reopens it and tries once more; when another process holds the writer lock, the change is
refused (:class:`~colgraph_engine.kg.IndexConflictError`, answered 409). Commits made by other
processes reach readers through :meth:`IndexWriter.reload_if_changed` (the service polls it).
"""
from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..ingest.folder import IngestReport, ingest
from ..kg import IndexConflictError
from .metrics import ServiceMetrics
from .state import IndexState

MAX_NAME_CHARS = 255


class WriterBusy(RuntimeError):
    """``max_pending`` changes are already waiting for the writer."""


class ReadOnly(RuntimeError):
    """The served index has no directory."""


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
        folder = self.uploads / uuid.uuid4().hex
        folder.mkdir(parents=True)
        try:
            for name, content in files:
                path = folder / name
                with open(path, "wb") as f:
                    f.write(content)
                    f.flush()
                    os.fsync(f.fileno())
            report = self._with_retry(lambda index: ingest(index, folder, progress=False, **self.ingest_options))
        except BaseException:
            if self._committed_unseen():
                self.state.refresh()  # a batch committed before the failure: serve it (and keep its files)
            else:
                shutil.rmtree(folder, ignore_errors=True)
            raise
        if not report.by_status("added"):
            shutil.rmtree(folder, ignore_errors=True)
        else:
            self.state.refresh()
        return report

    def _remove(self, doc_id: str) -> None:
        self._with_retry(lambda index: index.remove_document(doc_id))
        self.state.refresh()

    def _committed_unseen(self) -> bool:
        w = self.state._writer_index
        return w is not None and getattr(w, "_generation", 0) != self.state.snapshot.generation

    def _with_retry(self, change):
        index = self.state.writer_index()
        try:
            return change(index)
        except IndexConflictError:
            # changed on disk by another process since we opened it: read it again, try once more
            # (a writer lock held by another process fails the same way again: 409)
            return change(self.state.writer_index(reopen=True))


__all__ = ["IndexWriter", "ReadOnly", "WriterBusy", "check_file_name"]
