"""Which reader reads a file, and a deterministic walk over a folder.

:func:`read_path` picks the reader by suffix, and by content where the suffix lies or is
unknown (magic bytes: ``%PDF-`` within the first KiB, the PNG signature, JPEG's ``FF D8 FF``,
``RIFF....WEBP``). :func:`iter_folder` yields one :class:`ReadResult` per file, in sorted
relative-path order, with the relative POSIX path as the document id; sidecars of images,
hidden files and folders, and unknown suffixes come back as ``kind == "skipped"`` results with
a ``skip`` issue. Nothing a file contains makes these functions raise; bad *arguments* do.

Besides the readers' own keywords, dispatch takes ``max_pages`` (an int >= 1 or None): a PDF
with more pages is read from a copy holding only its first ``max_pages`` pages (PDFium copies
them without rendering anything), with a warning naming how many pages were left out, so that
one very long PDF costs bounded time and memory; its metadata title is kept. Likewise
``max_text_mb`` (a number > 0 or None): of a text or Markdown file larger than that many MiB only
the first ones are read (cut back to the last whitespace or character boundary before the limit),
with a warning: a document's vectors grow with its text (a 50 MB one-line Markdown file held
1.7 GB of hashing vectors alone), so one huge text file must not take the build's memory. A PDF
stops at the page whose text passes that many characters (``read_pdf``'s ``max_text_chars``).
"""
from __future__ import annotations

import inspect
import os
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from .image import IMAGE_SUFFIXES, MAX_IMAGE_PIXELS, SIDECAR_ENDINGS, read_image
from .pdf import _check_args as _check_pdf_args
from .pdf import read_pdf
from .records import CACHE_SUFFIXES, RECORD_FILE_ENDINGS, read_records
from .result import ReadIssue, ReadResult, resolve
from .text import MARKDOWN_SUFFIXES, TEXT_SUFFIXES, read_text

READERS = {"pdf": read_pdf, "image": read_image, "text": read_text, "records": read_records}
_OPTIONS = {kind: {name for name, p in inspect.signature(f).parameters.items()
                   if p.kind == p.KEYWORD_ONLY and name != "doc_id"} for kind, f in READERS.items()}
# the PDF options read_pdf's argument check takes (its keyword-only ones have defaults there)
_PDF_CHECKED = set(inspect.signature(_check_pdf_args).parameters)
# options of dispatch itself, not passed to a reader
DISPATCH_OPTIONS = ("max_pages", "max_text_mb")
# Sidecar endings that are never documents of their own (a bare ".txt" is a sidecar only next
# to an image with the same stem).
_SIDECAR_ONLY = tuple(e for e in SIDECAR_ENDINGS if e != ".txt")


def kind_by_name(name: str) -> str | None:
    """The reader kind a file name asks for (``pdf``, ``image``, ``text``, ``records``), or None."""
    lower = name.lower()
    if lower.endswith(RECORD_FILE_ENDINGS) or lower.endswith(CACHE_SUFFIXES):
        return "records"
    suffix = os.path.splitext(lower)[1]
    if suffix == ".pdf":
        return "pdf"
    if suffix in IMAGE_SUFFIXES:
        return "image"
    if suffix in TEXT_SUFFIXES or suffix in MARKDOWN_SUFFIXES:
        return "text"
    return None


def kind_by_content(path: Path) -> str | None:
    """``pdf`` or ``image`` from the file's first bytes, or None (unreadable, empty or other)."""
    try:
        with open(path, "rb") as f:
            head = f.read(1024)
    except OSError:
        return None
    at = head.find(b"%PDF-")
    # PDF readers accept the header anywhere in the first KiB, after binary junk; a text file that
    # merely mentions "%PDF-" has only text before it (no control bytes), so it is not a PDF.
    if at >= 0 and (not head[:at].strip() or any(b < 9 or 13 < b < 32 for b in head[:at])):
        return "pdf"
    if head.startswith(b"\x89PNG\r\n\x1a\n") or head.startswith(b"\xff\xd8\xff") or (
            head[:4] == b"RIFF" and head[8:12] == b"WEBP"):
        return "image"
    return None


def check_options(options: dict) -> None:
    """TypeError / ValueError naming the option unless every reader option is known and usable."""
    known = set().union(*_OPTIONS.values(), DISPATCH_OPTIONS)
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"unknown reader option(s) {unknown}; known: {sorted(known)}")
    pdf = {"ocr": None, "scale": 1.0, "ocr_scale": None, "min_text_chars": 20, "sections": "headings",
           "render_pages": True, "extract_images": True, "progress": False}
    pdf.update({k: v for k, v in options.items() if k in _PDF_CHECKED})
    _check_pdf_args(**pdf)
    max_pixels = options.get("max_pixels", MAX_IMAGE_PIXELS)
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < 1:
        raise ValueError(f"max_pixels: expected an int >= 1, got {max_pixels!r}")
    max_pages = options.get("max_pages")
    if max_pages is not None and (isinstance(max_pages, bool) or not isinstance(max_pages, int) or max_pages < 1):
        raise ValueError(f"max_pages: expected an int >= 1 or None, got {max_pages!r}")
    max_text_mb = options.get("max_text_mb")
    if max_text_mb is not None and (isinstance(max_text_mb, bool) or not isinstance(max_text_mb, (int, float))
                                    or not 0 < max_text_mb < float("inf")):
        raise ValueError(f"max_text_mb: expected a finite number > 0 or None, got {max_text_mb!r}")
    for name in ("sidecars",):
        if name in options and not isinstance(options[name], bool):
            raise TypeError(f"{name}: expected bool, got {type(options[name]).__name__}")
    if options.get("markdown") is not None and not isinstance(options["markdown"], bool):
        raise TypeError(f"markdown: expected bool or None, got {type(options['markdown']).__name__}")


def read_path(path: str | os.PathLike, *, doc_id: str | None = None, **options) -> ReadResult:
    """Reads one file with the reader its suffix (or content) calls for.

    ``options`` are the readers' keyword arguments (``ocr``, ``render_pages``, ``scale``,
    ``ocr_scale``, ``extract_images``, ``min_text_chars``, ``sections``, ``progress``,
    ``max_pixels``, ``sidecars``, ``markdown``); each reader takes the ones it knows.
    ``max_pages`` limits the pages read of a PDF (see the module docstring).
    """
    check_options(options)
    path, doc_id = resolve(path, doc_id)
    return _read(path, doc_id, options)


def _read(path: Path, doc_id: str, options: dict) -> ReadResult:
    by_name = kind_by_name(path.name)
    by_content = kind_by_content(path) if path.is_file() else None
    kind, note = by_name, None
    if by_content is not None and by_content != by_name:
        kind = by_content
        note = (f"the suffix {path.suffix!r} does not match the content, which is a {by_content.upper()} file; "
                f"read as {by_content}")
    if kind is None:
        result = ReadResult(path, doc_id, "skipped")
        result.issue(f"unknown file type {path.suffix or '(no suffix)'!r}; skipped", "skip")
        return result
    reader = READERS[kind]
    kwargs = {k: v for k, v in options.items() if k in _OPTIONS[kind]}
    try:
        if kind == "pdf" and options.get("max_text_mb") is not None:
            kwargs["max_text_chars"] = int(options["max_text_mb"] * (1 << 20))
        if kind == "pdf" and options.get("max_pages") is not None:
            result = _read_pdf_pages(path, doc_id, options["max_pages"], kwargs)
        elif kind == "text" and options.get("max_text_mb") is not None:
            result = _read_text_head(path, doc_id, options["max_text_mb"], kwargs)
        else:
            result = reader(path, doc_id=doc_id, **kwargs)
    except Exception as e:  # a reader bug must not abort a batch; report it against the file
        result = ReadResult(path, doc_id, kind)
        result.fail(f"unexpected error while reading ({type(e).__name__}: {e})")
    if note is not None:
        result.issues.insert(0, ReadIssue(doc_id, note, "warning"))
    return result


def _read_pdf_pages(path: Path, doc_id: str, max_pages: int, kwargs: dict) -> ReadResult:
    """``read_pdf`` of the first `max_pages` pages of `path` (the whole file when it has no more)."""
    import pypdfium2 as pdfium

    try:
        src = pdfium.PdfDocument(path)
    except pdfium.PdfiumError:
        return READERS["pdf"](path, doc_id=doc_id, **kwargs)  # the reader says why it cannot open it
    try:
        n_pages = len(src)
        if n_pages <= max_pages:
            src.close()
            src = None
            return READERS["pdf"](path, doc_id=doc_id, **kwargs)
        try:
            title = " ".join((src.get_metadata_value("Title") or "").split())
        except Exception:  # metadata is optional
            title = ""
        head = pdfium.PdfDocument.new()
        try:
            head.import_pages(src, list(range(max_pages)))
            with tempfile.TemporaryDirectory(prefix="colgraph-pages-") as tmp:
                copy = Path(tmp) / path.name
                head.save(copy)
                head.close()
                head = None
                result = READERS["pdf"](copy, doc_id=doc_id, **kwargs)
        finally:
            if head is not None:
                head.close()
    finally:
        if src is not None:
            src.close()
    result.file = path
    if result.document is not None and title:
        result.document = replace(result.document, title=title)
    result.issue(f"read only the first {max_pages} of {n_pages} pages (max_pages); pages {max_pages + 1}-{n_pages} "
                 "were not read", "warning")
    return result


def text_head(data: bytes, limit: int) -> bytes:
    """The first at most `limit` bytes of encoded text `data`, cut where no word or character is
    split: after the last whitespace byte of the final 4 KiB when there is one, else before a
    UTF-8 lead byte (UTF-16 with a byte-order mark: at an even length)."""
    if len(data) <= limit:
        return data
    head = data[:limit]
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return head[:len(head) & ~1]
    cut = max(head.rfind(c, max(0, limit - 4096)) for c in (b" ", b"\n", b"\t", b"\r"))
    if cut > 0:
        return head[:cut + 1]
    end = limit
    while end > 0 and (head[end - 1] & 0xC0) == 0x80:  # continuation bytes of a split character
        end -= 1
    if end > 0 and head[end - 1] >= 0xC0:  # its lead byte
        end -= 1
    return head[:end]


def _read_text_head(path: Path, doc_id: str, max_text_mb: float, kwargs: dict) -> ReadResult:
    """``read_text`` of the first `max_text_mb` MiB of `path` (the whole file when it is smaller)."""
    limit = int(max_text_mb * (1 << 20))
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    if size <= limit:
        return READERS["text"](path, doc_id=doc_id, **kwargs)  # also says why a missing file cannot be read
    with open(path, "rb") as f:
        data = text_head(f.read(limit + 1), limit)
    with tempfile.TemporaryDirectory(prefix="colgraph-text-") as tmp:
        copy = Path(tmp) / path.name
        copy.write_bytes(data)
        del data
        result = READERS["text"](copy, doc_id=doc_id, **kwargs)
    result.file = path
    result.issue(f"read only the first {max_text_mb:g} MiB of {size / (1 << 20):.3g} MiB (max_text_mb); the rest "
                 "of the text was not read", "warning")
    return result


def iter_folder(folder: str | os.PathLike, *, recursive: bool = True, include_hidden: bool = False,
                **options) -> Iterator[ReadResult]:
    """One :class:`ReadResult` per file under ``folder``, sorted by relative path.

    Args:
        folder: the folder to walk (symbolic links to folders are not followed).
        recursive: descend into sub-folders.
        include_hidden: read names starting with ``.`` too (default: skipped, reported).
        options: reader options, as for :func:`read_path` (checked before the walk starts).
    """
    check_options(options)
    for name, v in (("recursive", recursive), ("include_hidden", include_hidden)):
        if not isinstance(v, bool):
            raise TypeError(f"{name}: expected bool, got {type(v).__name__}")
    root, _ = resolve(folder, "folder", what="folder")
    if not root.is_dir():
        raise ValueError(f"folder: not a directory: {root}")
    for rel in _walk(root, recursive, include_hidden):
        path = root / rel
        doc_id = rel.as_posix()
        reason = _skip_reason(path, rel, include_hidden)
        if reason is not None:
            result = ReadResult(path, doc_id, "skipped")
            result.issue(reason, "skip")
            yield result
            continue
        yield _read(path, doc_id, options)


def read_folder(folder: str | os.PathLike, **options) -> list[ReadResult]:
    """``list(iter_folder(folder, **options))``."""
    return list(iter_folder(folder, **options))


def _walk(root: Path, recursive: bool, include_hidden: bool) -> list[Path]:
    """Relative paths of the files under ``root``; a hidden folder is one entry (not entered)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath).relative_to(root)
        if not include_hidden:
            out.extend(here / d for d in dirnames if d.startswith("."))
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        out.extend(here / name for name in filenames)
        if not recursive:
            dirnames.clear()
    return sorted(out, key=lambda p: p.as_posix())


def _skip_reason(path: Path, rel: Path, include_hidden: bool) -> str | None:
    if not include_hidden and any(part.startswith(".") for part in rel.parts):
        return "hidden folder; not entered" if path.is_dir() else "hidden file; skipped"
    lower = path.name.lower()
    for ending in SIDECAR_ENDINGS:
        if lower.endswith(ending):
            stem = path.name[: len(path.name) - len(ending)]
            image = next((path.with_name(stem + s) for s in _case_variants(IMAGE_SUFFIXES)
                          if path.with_name(stem + s).is_file()), None)
            if image is not None:
                return f"sidecar of {image.name}; read with it"
            if ending in _SIDECAR_ONLY:
                return f"sidecar ({ending}) with no image named {stem}.jpg/.jpeg/.png/.webp beside it; skipped"
            break
    if not path.is_file():
        return "not a regular file; skipped"
    if kind_by_name(path.name) is None and kind_by_content(path) is None:
        return f"unknown file type {path.suffix or '(no suffix)'!r}; skipped"
    return None


def _case_variants(suffixes):
    return [v for s in suffixes for v in (s, s.upper())]
