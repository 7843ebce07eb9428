"""One file's work, wherever it runs: read -> caption -> segment + extract -> vision -> build ->
encode (steps 1 and 3-6 of :mod:`.folder`'s list), as :func:`process_file` for a :class:`Job`.

:func:`.folder.ingest` calls it in this process or hands the job to the supervised worker of
:mod:`.isolate`; both import it from here, so the folder loop and the worker do not import each
other. :class:`DocumentReport` is the file's outcome either way.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..kg.document import DocumentInput, build_document_graph
from ..kg.extract import PhraseExtractor
from ..kg.parsers import parse_extraction
from ..kg.segment import segment_sections
from ..kg.vectors import encode_document
from .readers import ReadResult, read_path
from .readers.dispatch import kind_by_name
from .readers.result import timed_into

MAX_MATCH_ENTITIES = 60
ON_FAILURE = ("offline", "skip")


@dataclass
class DocumentReport:
    """One file's outcome.

    ``status``: ``added`` (committed to the index; ``pending`` until its batch commits),
    ``present`` (its id was already in the index: not read again), ``failed`` (unreadable, too
    large, not buildable, or its worker crashed or timed out: see ``failures``) or ``skipped``
    (not a document: sidecar, hidden or unknown file). ``failures``: read errors and failed model
    calls (the document is still added with what succeeded when it has a graph). ``notes``: the
    readers' warnings (e.g. pages beyond ``max_pages`` not read). ``seconds``: wall time per phase.
    """
    file: str
    doc_id: str
    kind: str
    status: str = "pending"
    pages: int = 0
    text_layer_pages: int = 0
    ocr_pages: int = 0
    segments: int = 0
    entities: int = 0
    relations: int = 0
    images: int = 0
    regions: int = 0
    warnings: int = 0
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def timed(self, phase: str):
        """Adds the wall time of the ``with`` body to ``seconds[phase]``."""
        return timed_into(self.seconds, phase)


@dataclass
class Job:
    """What processing one file needs besides the file: reader options, encoders, hooks and the
    build settings of one :func:`ingest` call (an isolated worker rebuilds it from its task)."""
    reader_options: dict
    encoders: object
    extractor: object = None
    vision: object = None
    caption: object = None
    max_tokens: int = 1200
    on_failure: str = "offline"
    build_options: dict = field(default_factory=dict)
    offline: PhraseExtractor = field(default_factory=PhraseExtractor)


def process_file(file: Path, doc_id: str, job: Job):
    """Reads, builds and encodes one file: ``(report, graph, vectors, error)``.

    ``graph`` and ``vectors`` are None unless ``report.status`` is ``pending`` (ready to commit).
    An exception of any step (a reader, a hook, the builder, an encoder running out of memory)
    is recorded in the report as that step's failure and returned as ``error``; only
    interrupts (KeyboardInterrupt, SystemExit) propagate.
    """
    phase, rep = "read", DocumentReport(str(file), doc_id, kind_by_name(Path(file).name) or "")
    try:
        result = read_path(file, doc_id=doc_id, **job.reader_options)
        rep = _report_of(result)
        if result.kind == "skipped":
            rep.status = "skipped"
            return rep, None, None, None
        if result.document is None:
            rep.status = "failed"
            return rep, None, None, None
        phase = "build"
        graph = _build_one(result.document, rep, job.extractor, job.vision, job.caption, job.offline,
                           job.max_tokens, job.on_failure, job.build_options)
        if graph is None:
            return rep, None, None, None
        phase = "encode"
        with rep.timed("encode"):
            vectors = encode_document(graph, job.encoders) if job.encoders is not None else {}
        # decoded images are not persisted; holding them in the index's in-memory graphs would
        # keep every page image of the run alive (file paths are kept: they cost nothing)
        graph.pixels = {k: v for k, v in graph.pixels.items() if isinstance(v, (str, os.PathLike))}
        return rep, graph, vectors, None
    except Exception as exc:  # one file's failure (MemoryError included) must not end the batch
        rep.status = "failed"
        rep.failures.append(f"{phase}: {type(exc).__name__}" + (f": {exc}" if str(exc) else ""))
        return rep, None, None, exc


def _report_of(result: ReadResult) -> DocumentReport:
    s = result.stats
    rep = DocumentReport(str(result.file), result.doc_id, result.kind, pages=s.pages,
                         text_layer_pages=s.text_layer_pages, ocr_pages=s.ocr_pages, seconds=dict(s.seconds))
    rep.failures += [f"read: {i.message}" for i in result.issues if i.severity == "error"]
    rep.warnings += sum(i.severity == "warning" for i in result.issues)
    rep.notes += [i.message for i in result.issues if i.severity == "warning"]
    return rep


def _build_one(doc: DocumentInput, rep: DocumentReport, extractor, vision, caption, offline, max_tokens: int,
               on_failure: str, build_options: dict):
    """Hooks + graph for one read document; None (status failed) when the graph cannot be built."""
    try:
        if caption is not None:
            doc = _caption_images(doc, caption, rep)
        with rep.timed("extract"):
            segments = list(doc.segments) if doc.segments is not None else segment_sections(
                doc.sections, max_tokens=max_tokens, overlap_tokens=build_options.get("overlap_tokens", 0),
                count_tokens=build_options.get("count_tokens"))
            extractions = list(doc.extractions) if doc.extractions is not None else _extract(
                [s.text for s in segments], rep, extractor, offline, on_failure)
        if vision is not None:
            with rep.timed("vision"):
                doc = _vision(doc, segments, extractions, vision, rep)
        doc = replace(doc, segments=segments, extractions=extractions)
        options = {k: v for k, v in build_options.items() if k not in ("overlap_tokens", "count_tokens")}
        with rep.timed("build"):
            graph = build_document_graph(doc, **options)
    except (TypeError, ValueError) as exc:  # a document the builder refuses (strict mode, bad input)
        rep.status = "failed"
        rep.failures.append(f"build: {exc}")
        return None
    c = graph.counts
    rep.segments, rep.entities, rep.relations = c["segments"], c["entities"], c["relations"]
    rep.images, rep.regions = c["images"], c["regions"]
    rep.warnings += c["warnings"]
    return graph


def _extract(texts: list[str], rep: DocumentReport, extractor, offline, on_failure: str) -> list[str]:
    if extractor is None:
        return [offline(t) for t in texts]
    if callable(getattr(extractor, "extract_many", None)):
        outcomes = extractor.extract_many(texts, where=[f"{rep.doc_id} segment {i}" for i in range(len(texts))])
        answers = [o.text for o in outcomes]
        errors = [o.error for o in outcomes]
    else:
        answers, errors = [], []
        for i, t in enumerate(texts):
            try:
                answers.append(extractor(t))
                errors.append(None)
            except Exception as exc:  # a user's extractor failing on one segment must not lose the document
                answers.append(None)
                errors.append(f"{type(exc).__name__}: {exc}")
    out = []
    for i, (text, answer, error) in enumerate(zip(texts, answers, errors)):
        if error is not None:
            kept = "earlier answers kept" if answer else (
                "offline extractor used" if on_failure == "offline" else "segment left without records")
            rep.failures.append(f"extract segment {i}: {error} ({kept})")
        if answer is None or (not answer and error is not None):
            answer = offline(text) if on_failure == "offline" else "<|COMPLETE|>"
        out.append(answer)
    return out


def _caption_images(doc: DocumentInput, hook, rep: DocumentReport) -> DocumentInput:
    todo = [i for i, im in enumerate(doc.images) if im.pixels is not None and not im.caption.strip()]
    if not todo:
        return doc
    with rep.timed("caption"):
        return _captioned(doc, todo, hook, rep)


def _captioned(doc: DocumentInput, todo: list[int], hook, rep: DocumentReport) -> DocumentInput:
    images = list(doc.images)
    for i in todo:
        text = _call(hook.caption, rep, f"caption {images[i].ref!r}", images[i].pixels,
                     where=f"{rep.doc_id} image {images[i].ref}")
        if text:
            images[i] = replace(images[i], caption=text)
    # a section that is only images (an image file's document) gets their captions as its text,
    # so that extraction and the segment vectors see them
    caption_of = {im.ref: im.caption for im in images}
    sections = [replace(sec, text="\n\n".join(c for r in sec.images if (c := caption_of.get(r, "")).strip()))
                if not isinstance(sec, str) and sec.images and not sec.text.strip() else sec
                for sec in doc.sections]
    return replace(doc, images=images, sections=sections)


def _vision(doc: DocumentInput, segments, extractions: list[str], hook, rep: DocumentReport) -> DocumentInput:
    segment_of = {}
    for s, seg in enumerate(segments):
        for ref in seg.images:
            segment_of.setdefault(ref, s)
    parsed = [parse_extraction(x) if isinstance(x, str) else x for x in extractions]
    doc_entities = _entities(parsed)
    images = list(doc.images)
    for i, im in enumerate(images):
        if im.pixels is None or (im.scene_graph is not None and im.mappings is not None):
            continue
        where = f"{rep.doc_id} image {im.ref}"
        scene = im.scene_graph
        if scene is None:
            scene = _call(hook.scene_graph, rep, f"scene graph of {im.ref!r}", im.pixels, where=where)
        if im.mappings is None and callable(getattr(hook, "match", None)):
            s = segment_of.get(im.ref)
            entities = _entities([parsed[s]]) if s is not None else []
            entities = (entities or doc_entities)[:MAX_MATCH_ENTITIES]
            mappings = None
            if entities:
                scene_text = scene if isinstance(scene, str) else ""
                mappings = _call(hook.match, rep, f"matching of {im.ref!r}", im.pixels, scene_text, entities,
                                 where=where)
            images[i] = replace(im, scene_graph=scene, mappings=mappings)
        else:
            images[i] = replace(im, scene_graph=scene)
    return replace(doc, images=images)


def _entities(parsed) -> list[tuple[str, str, str]]:
    seen, out = set(), []
    for p in parsed:
        for e in p.entities:
            key = e.name.lower()
            if key not in seen:
                seen.add(key)
                out.append((e.name, e.type or "", e.description or ""))
    return out


def _call(fn, rep: DocumentReport, what: str, *args, **kwargs):
    """A hook call whose failure (None, or an exception) is recorded against the document."""
    try:
        out = fn(*args, **kwargs)
    except Exception as exc:  # hooks should not raise; a broken one must still not lose the document
        rep.failures.append(f"{what}: {type(exc).__name__}: {exc}")
        return None
    if out is None:
        rep.failures.append(f"{what}: the model call failed (see the client's failures)")
    return out
