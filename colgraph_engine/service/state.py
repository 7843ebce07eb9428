"""What the service reads (one index snapshot at a time) and the one writer that changes it.

Readers: a :class:`Snapshot` is a :class:`KnowledgeIndex` opened from the directory (one
committed generation) and the pipelines over it, one per config (at most ``MAX_PIPELINES``,
least recently used dropped; each builds its own :class:`IndexView` on first use). Nothing ever
changes a snapshot: a batch takes ``state.snapshot`` when it starts and uses only it.

Writer: one :class:`KnowledgeIndex` object of its own, opened on the first write (a read-only
service never opens it), used by one thread at a time (:class:`~.writer.IndexWriter`). After a
commit, :meth:`IndexState.refresh` opens the new generation as a new snapshot, builds the
default pipeline's view there (so no query pays for it), and publishes it with one assignment.
Queries already running finish on the old snapshot; every query dispatched after the write
returned sees the new one. Readers never wait for the writer: they never share an object with
it, and opening a generation takes only a shared lock on the folder (see "Readers and writers"
in the README).
"""
from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from pathlib import Path

from ..kg import Encoders, KnowledgeIndex
from ..pipeline import Pipeline, PipelineConfig, Query, Result

MAX_PIPELINES = 16  # configs kept per snapshot (ours): each keeps an IndexView of the graph's arrays


def manifest_stamp(path: Path | None) -> tuple | None:
    """What identifies one committed generation cheaply: the manifest file's inode, size and
    modification time (every commit replaces the file). None when there is no such file."""
    if path is None:
        return None
    try:
        st = os.stat(path / "manifest.json")
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class Snapshot:
    """One opened generation of the index and its pipelines."""

    def __init__(self, index: KnowledgeIndex, encoders: Encoders, default: PipelineConfig, generator=None,
                 device: str = "cpu"):
        self.index, self.encoders, self.default, self.generator = index, encoders, default, generator
        self.device = device
        # the committed generation this object was opened at (KnowledgeIndex keeps it privately;
        # no public accessor exists)
        self.generation = int(getattr(index, "_generation", 0))
        self.documents = len(index)
        self.stamp: tuple | None = None  # manifest_stamp taken before the index was opened
        self._pipelines: OrderedDict[PipelineConfig, Pipeline] = OrderedDict()
        self._lock = threading.Lock()
        # what the web page's routes derive from this snapshot (adjacency, thumbnails: views.py)
        self.view_cache: dict[str, OrderedDict] = {}
        self.view_lock = threading.Lock()

    def pipeline(self, config: PipelineConfig) -> Pipeline:
        with self._lock:
            pipe = self._pipelines.get(config)
            if pipe is None:
                pipe = Pipeline(self.index, self.encoders, config, generator=self.generator, device=self.device)
                self._pipelines[config] = pipe
                if len(self._pipelines) > MAX_PIPELINES:
                    self._pipelines.popitem(last=False)
            else:
                self._pipelines.move_to_end(config)
            return pipe

    def warm(self) -> None:
        """Assembles the merged graph and the default pipeline's view now, not in a query."""
        if len(self.index):
            self.pipeline(self.default).view()


class IndexState:
    """The served snapshot and the writer's index (see the module docstring).

    Args:
        index: the index to serve, opened from its directory (``index.path`` is where writes go;
            an in-memory index is served read-only).
        encoders: the index's encoders (None: ``index.encoders``).
        default: the pipeline config of requests without overrides.
        generator: the pipeline's generator for requests that ask for an answer (None: refused).
        device: where the pipelines score vectors (``"cpu"`` or ``"cuda"``; the graph stays on the CPU).
    """

    def __init__(self, index: KnowledgeIndex, encoders: Encoders | None = None, default: PipelineConfig | None = None,
                 generator=None, device: str = "cpu"):
        if not isinstance(index, KnowledgeIndex):
            raise TypeError(f"index: expected a KnowledgeIndex, got {type(index).__name__}")
        encoders = index.encoders if encoders is None else encoders
        if not isinstance(encoders, Encoders):
            raise TypeError(f"encoders: expected Encoders (the index has none; pass them), got {type(encoders).__name__}")
        default = PipelineConfig() if default is None else default
        if not isinstance(default, PipelineConfig):
            raise TypeError(f"default: expected a PipelineConfig, got {type(default).__name__}")
        if generator is not None and not callable(generator):
            raise TypeError(f"generator: expected None or a callable (prompt, images) -> str, "
                            f"got {type(generator).__name__}")
        self.path: Path | None = index.path
        self.encoders, self.default, self.generator, self.device = encoders, default, generator, device
        Pipeline(index, encoders, default, device=device)  # refuses mismatched encoders (or device) before serving
        self.snapshot = Snapshot(index, encoders, default, generator, device)
        self.snapshot.stamp = self._stamp_if_current(self.snapshot.generation)
        self._writer_index: KnowledgeIndex | None = None

    @property
    def writable(self) -> bool:
        return self.path is not None

    def run_batch(self, config: PipelineConfig, queries: list[Query]) -> list[Result]:
        """``retrieve_batch`` on the snapshot current when the call starts. Each result keeps that
        snapshot as ``served_by`` (the answer's ``view`` describes its nodes there)."""
        snap = self.snapshot
        results = snap.pipeline(config).retrieve_batch(queries)
        for r in results:
            r.served_by = snap
        return results

    # -- the writer's side (one thread at a time: IndexWriter) ---------------------------------
    def writer_index(self, *, reopen: bool = False) -> KnowledgeIndex:
        """The writer's own index object, opened from the directory on first use (or again)."""
        if self.path is None:
            raise RuntimeError("the served index has no directory: it is read-only")
        if self._writer_index is None or reopen:
            self._writer_index = KnowledgeIndex.open(self.path, self.encoders, verify=False)
        return self._writer_index

    def _stamp_if_current(self, generation: int) -> tuple | None:
        """The manifest's stamp when it holds `generation` (else None: the snapshot is older than
        the directory, and the next :meth:`changed_on_disk` says so)."""
        stamp = manifest_stamp(self.path)
        if stamp is None:
            return None
        try:
            with open(self.path / "manifest.json", encoding="utf-8") as f:
                on_disk = json.load(f).get("generation")
        except (OSError, ValueError, TypeError, AttributeError):
            return None
        return stamp if on_disk == generation and stamp == manifest_stamp(self.path) else None

    def changed_on_disk(self) -> bool:
        """Whether the directory holds a commit the served snapshot was not opened at (another
        process's, e.g. ``colgraph index add``)."""
        return self.path is not None and manifest_stamp(self.path) != self.snapshot.stamp

    def refresh(self) -> Snapshot:
        """Opens the committed generation as a new snapshot, warms it and publishes it."""
        stamp = manifest_stamp(self.path)  # before opening: a commit in between is seen next time
        # the files were written and checksummed by a writer (ours, or another process's, which
        # verifies its own) : sizes and structure are still checked, the sha256 pass over every
        # vector file is skipped
        index = KnowledgeIndex.open(self.path, self.encoders, verify=False)
        snap = Snapshot(index, self.encoders, self.default, self.generator, self.device)
        snap.stamp = stamp
        snap.warm()
        self.snapshot = snap  # one assignment: a batch sees the old snapshot or the new one
        return snap


__all__ = ["IndexState", "MAX_PIPELINES", "Snapshot"]
