"""Folder ingest: files -> readers -> optional model hooks -> document graphs -> the index.

:func:`ingest` takes a folder (every file under it, document id = relative POSIX path) or a list
of files (document id = file name) and, per document:

1. reads it (:mod:`.readers`; an unreadable file is reported and skipped, the batch goes on);
2. skips it when its id is already in the index (so an interrupted ingest, rerun, adds only what
   is missing: documents are committed in batches of ``batch_size`` and a batch is all or
   nothing);
3. captions images without one (``caption`` hook);
4. segments the sections (mKG-RAG's rule, :func:`~colgraph_engine.kg.segment_sections`) and
   extracts records per segment: given records (record files) as they are, else the
   ``extractor`` (an :class:`~.hooks.LLMExtractor` runs its segments concurrently; a plain
   callable ``text -> str`` runs one by one), else the offline
   :class:`~colgraph_engine.kg.PhraseExtractor`. A failed model call falls back to the
   offline extractor for that segment (``on_failure="offline"``, the default, ours) or leaves
   the segment without records (``"skip"``); either way it is reported;
5. asks the ``vision`` hook for the scene graph of every image with pixels and no scene graph,
   then for the matches of the image (and its objects and scene relations) with the entities
   of its segment (mKG-RAG passes the entities of the image's chunk; when that segment has none,
   ours: the document's first :data:`MAX_MATCH_ENTITIES` entities);
6. builds the graph (:func:`~colgraph_engine.kg.build_document_graph`, with mKG-RAG's image
   fallback), encodes it with the index's encoders, and adds the batch (one commit).

Every step is timed per document (reader phases, ``caption``, ``extract``, ``vision``,
``build``, ``encode``) and failures are listed per document in the :class:`IngestReport`,
whose :meth:`~IngestReport.table` is the summary the ``colgraph index`` command prints.

Steps 1 and 3-6 of a file (:func:`.process.process_file`) run either in this process (``isolate=False``, the default of
:func:`ingest`) or in a supervised worker process (``isolate=True``, the default of
``colgraph index build/add``; see :mod:`.isolate`), where a crash of a native library, a
MemoryError or a hang becomes that file's failure and the rest of the folder is still indexed.
Either way this process alone commits. ``max_file_mb`` refuses oversized files before they are
read; the reader option ``max_pages`` reads only the first pages of a long PDF.
"""
from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from ..kg.index import KnowledgeIndex
from .process import MAX_MATCH_ENTITIES, ON_FAILURE, DocumentReport, Job, process_file
from .readers.dispatch import _skip_reason, _walk, check_options, kind_by_name

STATUSES = ("added", "present", "failed", "skipped")


# reader warnings the table prints (the others are counted in ``warnings`` and kept in ``notes``)
_SHOWN_NOTES = ("read only the first",)
_COUNTS = ("pages", "text_layer_pages", "ocr_pages", "segments", "entities", "relations", "images", "regions")


@dataclass
class IngestReport:
    """All documents of one :func:`ingest` call, in input order."""
    documents: list[DocumentReport] = field(default_factory=list)
    seconds: float = 0.0

    def by_status(self, status: str) -> list[DocumentReport]:
        return [d for d in self.documents if d.status == status]

    @property
    def totals(self) -> dict[str, float]:
        """Counts summed over added documents, documents per status, failures, and seconds per phase."""
        added = self.by_status("added")
        out: dict[str, float] = {s: len(self.by_status(s)) for s in STATUSES}
        out.update({k: sum(getattr(d, k) for d in added) for k in _COUNTS})
        out["failures"] = sum(len(d.failures) for d in self.documents)
        phases: dict[str, float] = {}
        for d in self.documents:
            for k, v in d.seconds.items():
                phases[k] = phases.get(k, 0.0) + v
        out.update({f"seconds_{k}": v for k, v in sorted(phases.items())})
        out["seconds"] = self.seconds
        return out

    def table(self, *, max_rows: int = 40) -> str:
        """A plain-text summary: one row per document (up to `max_rows`, failures first), then totals."""
        head = ("document", "status", "pages", "OCR", "entities", "relations", "images", "regions", "failures")
        rows = [(d.doc_id, d.status, d.pages, d.ocr_pages, d.entities, d.relations, d.images, d.regions,
                 len(d.failures)) for d in sorted(self.documents, key=lambda d: (d.status != "failed", False))]
        rows = [r for r in rows if r[1] != "skipped"]
        shown = rows[:max_rows]
        t = self.totals
        total = ("total", f"{int(t['added'])} added", int(t["pages"]), int(t["ocr_pages"]), int(t["entities"]),
                 int(t["relations"]), int(t["images"]), int(t["regions"]), int(t["failures"]))
        width = [max(len(str(x)) for x in col) for col in zip(head, *shown, total)]
        width[0] = min(width[0], 48)
        fmt = lambda r: "  ".join(  # noqa: E731
            (str(x)[:width[0]].ljust(width[0]) if i == 0 else str(x).rjust(width[i])) for i, x in enumerate(r))
        lines = [fmt(head), fmt(["-" * w for w in width])] + [fmt(r) for r in shown]
        if len(rows) > len(shown):
            lines.append(f"... {len(rows) - len(shown)} more documents")
        lines += [fmt(["-" * w for w in width]), fmt(total)]
        extra = [f"{int(t[s])} {s}" for s in ("present", "failed", "skipped") if t[s]]
        if extra:
            lines.append("also: " + ", ".join(extra) + " (present = already in the index, not read again)")
        for d in self.documents:
            for f in d.failures[:3]:
                lines.append(f"  ! {d.doc_id}: {f}")
            if len(d.failures) > 3:
                lines.append(f"  ! {d.doc_id}: ... {len(d.failures) - 3} more")
            lines += [f"  ~ {d.doc_id}: {n}" for n in d.notes if n.startswith(_SHOWN_NOTES)]
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {"totals": self.totals, "documents": [vars(d) for d in self.documents]}


def ingest(index: KnowledgeIndex, source: str | os.PathLike | Sequence[str | os.PathLike], *,
           extractor: Callable[[str], str] | None = None, vision=None, caption=None,
           reader_options: dict | None = None, batch_size: int = 8, max_tokens: int = 1200,
           on_failure: str = "offline", progress: bool = True, build_options: dict | None = None,
           isolate=False, max_file_mb: float | None = None) -> IngestReport:
    """Reads, extracts, builds, encodes and adds documents to `index` (see the module docstring).

    Args:
        index: the index to add to (directory-backed: every batch is committed).
        source: a folder, one file, or a sequence of files.
        extractor: an :class:`~.hooks.LLMExtractor` or any ``text -> str`` (default: offline).
        vision: a :class:`~.hooks.VisionHook` for scene graphs and region matches (default: none).
        caption: a :class:`~.hooks.CaptionHook` for images without a caption (default: none).
        reader_options: keyword options of the readers (``ocr``, ``render_pages``, ``scale``,
            ``max_pages``, ...).
        batch_size: documents per commit (>= 1).
        max_tokens: segment size in words (mKG-RAG's segmentation; 1,200 is our default).
        on_failure: ``"offline"`` or ``"skip"`` for segments whose model extraction failed.
        progress: a tqdm bar over files.
        build_options: more keyword options of :func:`~colgraph_engine.kg.build_document_graph`
            (``min_mapping_score``, ``image_fallback``, ``image_entity_scores``, ``strict``).
        isolate: False (the default, for library callers): every file is processed in this
            process, so hooks may be any Python callables (lambdas, closures, clients holding
            sockets), nothing is started (a worker costs ~2 s plus loading the encoders again)
            and debuggers see every step; an exception of one file is still that file's
            failure, but a segfault, abort or hang of a native library ends the call. True, an
            :class:`~.isolate.Isolation` (encoder factory, worker setup, ``timeout``,
            ``memory_gb``) or a running :class:`~.isolate.FileWorker` (reused across calls):
            each file is read, built and encoded in a worker process (see :mod:`.isolate`);
            hooks and reader options must then pickle.
        max_file_mb: files larger than this many MiB are not read (status ``failed``, the failure
            names the size and the limit); None: no limit.

    Returns an :class:`IngestReport`. Bad arguments raise TypeError / ValueError before any file is
    read; bad files never raise (an isolated worker that cannot start raises
    :class:`~.isolate.WorkerError`).
    """
    if not isinstance(index, KnowledgeIndex):
        raise TypeError(f"index: expected a KnowledgeIndex, got {type(index).__name__}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected an int >= 1, got {batch_size!r}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens: expected an int >= 1, got {max_tokens!r}")
    if on_failure not in ON_FAILURE:
        raise ValueError(f"on_failure: expected one of {ON_FAILURE}, got {on_failure!r}")
    if extractor is not None and not callable(extractor):
        raise TypeError(f"extractor: expected a callable text -> str or None, got {type(extractor).__name__}")
    for name, hook, method in (("vision", vision, "scene_graph"), ("caption", caption, "caption")):
        if hook is not None and not callable(getattr(hook, method, None)):
            raise TypeError(f"{name}: expected an object with a .{method}() method or None, got {type(hook).__name__}")
    if max_file_mb is not None and (isinstance(max_file_mb, bool) or not isinstance(max_file_mb, (int, float))
                                    or not max_file_mb > 0 or max_file_mb == float("inf")):
        raise ValueError(f"max_file_mb: expected a finite number > 0 or None, got {max_file_mb!r}")
    reader_options = dict(reader_options or {})
    check_options(reader_options)
    build_options = dict(build_options or {})
    bad = set(build_options) - {"min_mapping_score", "image_fallback", "image_entity_scores", "strict",
                                "count_tokens", "overlap_tokens"}
    if bad:
        raise TypeError(f"build_options: unknown option(s) {sorted(bad)}")
    job = Job(reader_options, index.encoders, extractor, vision, caption, max_tokens, on_failure, build_options)
    worker, own_worker = _worker_for(isolate, index)
    task = worker.task_of(job) if worker is not None else None  # pickled once; TypeError names what does not pickle
    listing = _listing(source)

    report = IngestReport()
    t_start = time.perf_counter()
    batch: list[tuple[DocumentReport, object, dict]] = []
    in_batch: set[str] = set()
    built = 0
    bar = tqdm(listing, desc="ingest", unit="file", disable=not progress)
    try:
        for file, doc_id, skip in bar:
            if doc_id in index or doc_id in in_batch:
                report.documents.append(DocumentReport(str(file), doc_id, "", status="present"))
                continue
            if skip is not None:
                rep = DocumentReport(str(file), doc_id, "skipped", status="skipped")
            elif (too_big := _over_size(file, max_file_mb)) is not None:
                rep = DocumentReport(str(file), doc_id, kind_by_name(file.name) or "", status="failed",
                                     failures=[too_big])
            elif worker is not None:
                rep, graph, vectors = worker.process(file, doc_id, task)
            else:
                rep, graph, vectors, _ = process_file(file, doc_id, job)
            report.documents.append(rep)
            if rep.status in ("skipped", "failed"):
                continue
            batch.append((rep, graph, vectors))
            in_batch.add(doc_id)
            if len(batch) >= batch_size:
                _commit(index, batch)
                batch = []
            built += 1
            bar.set_postfix_str(f"{built} built")
        if batch:
            _commit(index, batch)
    finally:
        bar.close()
        if own_worker:
            worker.close()
    report.seconds = time.perf_counter() - t_start
    return report


def _worker_for(isolate, index: KnowledgeIndex):
    """``(worker or None, whether this call owns it)`` for the ``isolate`` argument."""
    from .isolate import FileWorker, Isolation

    if isolate is False or isolate is None:
        return None, False
    if isolate is True:
        return FileWorker(Isolation(), index.encoders), True
    if isinstance(isolate, Isolation):
        return FileWorker(isolate, index.encoders), True
    if isinstance(isolate, FileWorker):
        isolate.check_encoders(index.encoders)
        return isolate, False
    raise TypeError(f"isolate: expected a bool, an Isolation or a FileWorker, got {type(isolate).__name__}")


def _over_size(file: Path, max_file_mb: float | None) -> str | None:
    """Why `file` is too large to read (its size and the limit), or None."""
    if max_file_mb is None:
        return None
    try:
        size = file.stat().st_size
    except OSError:
        return None  # the reader reports a file it cannot stat
    if size <= max_file_mb * 2**20:
        return None
    return (f"not read: the file is {size / 2**20:,.2f} MiB ({size:,} bytes), over the limit of {max_file_mb:g} MiB "
            f"(max_file_mb / --max-file-mb)")


def _listing(source) -> list[tuple[Path, str, str | None]]:
    """``(file, doc_id, skip reason or None)`` for every file of `source`, in order; nothing is
    read yet, so that documents already in the index cost no reading."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            return [(path / rel, rel.as_posix(), _skip_reason(path / rel, rel, False))
                    for rel in _walk(path, True, False)]
        if not path.exists():
            raise ValueError(f"source: no such file or folder: {path}")
        return [(path, path.name, None)]
    if isinstance(source, Iterable) and not isinstance(source, bytes):
        paths = list(source)
        for i, p in enumerate(paths):
            if not isinstance(p, (str, os.PathLike)):
                raise TypeError(f"source[{i}]: expected a str or path, got {type(p).__name__}")
        names = [Path(p).name for p in paths]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise ValueError(f"source: two files are named {dup!r}; document ids (file names) must be unique "
                             f"(ingest their folder instead: ids are then relative paths)")
        return [(Path(p), Path(p).name, None) for p in paths]
    raise TypeError(f"source: expected a folder, a file or a sequence of files, got {type(source).__name__}")


def _commit(index: KnowledgeIndex, batch) -> None:
    try:
        index.add_documents([g for _, g, _ in batch], [v for _, _, v in batch])
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            # what the CLI can tell the user: at least this batch's vectors had to be written
            exc.needed_bytes = sum(iv.values.numel() * iv.values.element_size() + iv.offsets.numel() * 8
                                   for _, _, v in batch for iv in v.values())
        raise
    for rep, _, _ in batch:
        rep.status = "added"


__all__ = ["MAX_MATCH_ENTITIES", "ON_FAILURE", "DocumentReport", "IngestReport", "Job", "ingest", "process_file"]
