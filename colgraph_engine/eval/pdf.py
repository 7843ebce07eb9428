"""PDF pages as text and images (pypdfium2), with an OCR fallback for pages without a text layer.

``render_pdf(path)`` returns one :class:`Page` per requested page. A page's text comes from the
PDF text layer; when that layer holds fewer than ``min_text_chars`` non-whitespace characters
(scanned pages, slides exported as pictures) and an ``ocr`` callable is given, the rendered
page is OCR'd and the OCR text is used if it holds more non-whitespace characters than the layer.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL.Image import Image

TEXT_SOURCES = ("layer", "ocr", "none")


@dataclass(frozen=True)
class Page:
    """One PDF page.

    * ``doc_id``: the PDF file name (``Path(path).name``), e.g. ``"report.pdf"``.
    * ``number``: 1-based page number.
    * ``text``: page text, lines separated by ``"\\n"`` (PDFium's ``"\\r\\n"`` normalised, its
      U+FFFE line-break hyphen marker turned back into ``"-"``).
    * ``text_source``: ``"layer"`` (PDF text layer), ``"ocr"`` (the ``ocr`` callable) or
      ``"none"`` (neither gave any non-whitespace character; ``text`` is then whitespace or "").
    * ``image``: the page rendered as a PIL RGB image of about ``(width * scale, height * scale)``
      pixels (PDFium rounds), or None when rendered without images.
    * ``width``, ``height``: the page size in PDF points (1/72 inch), independent of ``scale``.
    """

    doc_id: str
    number: int
    text: str
    text_source: str
    image: Image | None
    width: float
    height: float


def _count_chars(text: str) -> int:
    return sum(1 for c in text if not c.isspace())


def clean_layer_text(text: str) -> str:
    """PDFium text-layer text with ``"\\n"`` line ends and hyphens restored.

    PDFium ends lines with ``"\\r\\n"`` and turns a hyphen at a line break into U+FFFE while
    dropping the break (``"eight-in\\ufffeten"``); restoring the hyphen keeps words intact.
    """
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\ufffe", "-")


def _ocr_text(ocr: Callable, image) -> str:
    """Text from an OCR callable's result: an object with a ``.text`` str, or a str."""
    out = ocr(image)
    text = out if isinstance(out, str) else getattr(out, "text", None)
    if not isinstance(text, str):
        raise TypeError(f"ocr: expected the callable to return a str or an object with a str .text, "
                        f"got {type(out).__name__}")
    return text


def _check_pages(pages: Iterable[int] | None, n: int) -> list[int]:
    if pages is None:
        return list(range(1, n + 1))
    if isinstance(pages, (str, bytes)) or not isinstance(pages, Iterable):
        raise TypeError(f"pages: expected an iterable of 1-based page numbers or None, got {type(pages).__name__}")
    out = list(pages)
    for p in out:
        if isinstance(p, bool) or not isinstance(p, int):
            raise TypeError(f"pages: expected int page numbers, got {p!r}")
        if not 1 <= p <= n:
            raise ValueError(f"pages: page {p} is out of range 1..{n}")
    return out


def check_render_args(*, scale: float, ocr: Callable | None, ocr_scale: float | None) -> None:
    """ValueError / TypeError naming the argument unless the rendering settings are usable."""
    for name, v in (("scale", scale), ("ocr_scale", scale if ocr_scale is None else ocr_scale)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{name}: expected a finite number > 0, got {v!r}")
    if ocr is not None and not callable(ocr):
        raise TypeError(f"ocr: expected a callable or None, got {type(ocr).__name__}")


def render_pdf(
    path: str | os.PathLike,
    *,
    scale: float = 1.0,
    pages: Iterable[int] | None = None,
    with_images: bool = True,
    ocr: Callable | None = None,
    min_text_chars: int = 20,
    ocr_scale: float | None = None,
    progress: bool = False,
) -> list[Page]:
    """Pages of the PDF at ``path``, in the order of ``pages`` (default: all, in order).

    Args:
        path: the PDF file.
        scale: render scale; 1.0 is 72 dpi (one pixel per point).
        pages: 1-based page numbers to return; None for all.
        with_images: keep the rendered page image in ``Page.image``.
        ocr: optional callable ``ocr(PIL RGB image) -> obj`` with ``obj.text`` (or a str), e.g.
            ``colgraph_engine.encoders.ocr.RapidOcr()``; used only for pages whose text layer has
            fewer than ``min_text_chars`` non-whitespace characters.
        min_text_chars: threshold (>= 0) below which the text layer counts as missing.
        ocr_scale: render scale for OCR; None uses ``scale`` (small text needs about 2.0 for
            reliable OCR, while ``scale`` may be chosen for an image encoder).
        progress: show a tqdm bar over pages.

    Raises FileNotFoundError when ``path`` is not a file, ValueError when PDFium cannot open it
    as a PDF, and ValueError / TypeError naming the argument for bad arguments.
    """
    check_render_args(scale=scale, ocr=ocr, ocr_scale=ocr_scale)
    if isinstance(min_text_chars, bool) or not isinstance(min_text_chars, int) or min_text_chars < 0:
        raise ValueError(f"min_text_chars: expected an int >= 0, got {min_text_chars!r}")
    ocr_scale = float(scale if ocr_scale is None else ocr_scale)

    doc, path = _open(path)
    out: list[Page] = []
    bar = None
    try:
        numbers = _check_pages(pages, len(doc))
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(numbers), desc=path.name, unit="page")
        for number in numbers:
            out.append(_read_page(doc, number, path.name, scale, with_images, ocr, min_text_chars, ocr_scale))
            if bar is not None:
                bar.update()
    finally:
        if bar is not None:
            bar.close()
        doc.close()
    return out


def _open(path: str | os.PathLike):
    """``(PdfDocument, Path)``; FileNotFoundError / ValueError naming the path."""
    import pypdfium2 as pdfium

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a str or path, got {type(path).__name__}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path: no such PDF file: {path}")
    try:
        return pdfium.PdfDocument(path), path
    except pdfium.PdfiumError as e:
        raise ValueError(f"path: cannot open {path} as a PDF ({e})") from e


def page_count(path: str | os.PathLike) -> int:
    """Number of pages of the PDF at ``path`` (errors as :func:`render_pdf`)."""
    doc, _ = _open(path)
    try:
        return len(doc)
    finally:
        doc.close()


def _render(page, scale: float):
    bitmap = page.render(scale=scale)
    try:
        # convert() copies: to_pil() may share the bitmap's buffer, which close() frees.
        return bitmap.to_pil().convert("RGB")
    finally:
        bitmap.close()


def _read_page(doc, number: int, doc_id: str, scale: float, with_images: bool,
               ocr: Callable | None, min_text_chars: int, ocr_scale: float) -> Page:
    page = doc[number - 1]
    try:
        width, height = page.get_size()
        textpage = page.get_textpage()
        try:
            text = textpage.get_text_range()
        finally:
            textpage.close()
        text = clean_layer_text(text)
        n_layer = _count_chars(text)
        source = "layer" if n_layer else "none"

        image = _render(page, scale) if with_images else None
        if ocr is not None and n_layer < min_text_chars:
            ocr_image = image if image is not None and ocr_scale == scale else _render(page, ocr_scale)
            ocr_text = _ocr_text(ocr, ocr_image)
            if _count_chars(ocr_text) > n_layer:
                text, source = ocr_text, "ocr"
    finally:
        page.close()
    return Page(doc_id, number, text, source, image, float(width), float(height))
