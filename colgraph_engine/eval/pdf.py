"""PDF pages as text and images (pypdfium2), with an OCR fallback for pages without a text layer.

``render_pdf(path)`` returns one :class:`Page` per requested page. A page's text comes from the
PDF text layer; when that layer holds fewer than ``min_text_chars`` non-whitespace characters
(scanned pages, slides exported as pictures) and an ``ocr`` callable is given, the rendered
page is OCR'd and the OCR text is used if it holds more non-whitespace characters than the layer.

Every render (page images and OCR renders alike) is held to a pixel budget,
:data:`MAX_PAGE_PIXELS` by default: a page whose ``width * height * scale**2`` would exceed it is
drawn at the largest smaller scale that fits (:func:`budget_scale`), never at a larger one. A
PDF of a few hundred bytes can declare a 14400 x 14400 pt page (207 million pixels at 72 dpi,
0.8 GB as BGRA before any copy); the budget keeps such a file from costing gigabytes.
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

# Ours: 4 million pixels a render. Image encoders downscale pages to 224-448 px a side anyway,
# and OCR wants about 2x at letter size (612 * 792 * 2**2 = 1.9 M pixels); 4 M leaves room for
# tabloid pages at 2x (792 * 1224 * 4 = 3.9 M; A3 at 2x is 0.3% over, drawn at 1.997) while a
# render costs at most 16 MB as BGRA.
MAX_PAGE_PIXELS = 4_000_000


@dataclass(frozen=True)
class Page:
    """One PDF page.

    * ``doc_id``: the PDF file name (``Path(path).name``), e.g. ``"report.pdf"``.
    * ``number``: 1-based page number.
    * ``text``: page text, lines separated by ``"\\n"`` (PDFium's ``"\\r\\n"`` normalised, its
      U+FFFE line-break hyphen marker turned back into ``"-"``).
    * ``text_source``: ``"layer"`` (PDF text layer), ``"ocr"`` (the ``ocr`` callable) or
      ``"none"`` (neither gave any non-whitespace character; ``text`` is then whitespace or "").
    * ``image``: the page rendered as a PIL RGB image of ``(ceil(width * image_scale),
      ceil(height * image_scale))`` pixels, or None when rendered without images.
    * ``width``, ``height``: the page size in PDF points (1/72 inch), independent of ``scale``.
    * ``image_scale``: the scale ``image`` was drawn at: ``scale``, or less where the page would
      exceed the pixel budget (see :func:`budget_scale`); None without an image.
    """

    doc_id: str
    number: int
    text: str
    text_source: str
    image: Image | None
    width: float
    height: float
    image_scale: float | None = None


def check_max_pixels(value, name: str = "max_page_pixels") -> int:
    """`value` when it is an int > 0, else ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected an int > 0 (pixels), got {value!r}")
    return value


def budget_scale(width: float, height: float, scale: float, max_pixels: int = MAX_PAGE_PIXELS) -> float:
    """The render scale for a `width` x `height` pt page: `scale` when PDFium's bitmap of
    ``ceil(width * scale) x ceil(height * scale)`` pixels fits in `max_pixels`, else the largest
    smaller scale whose bitmap does (never more than `scale`).

    The solution of ``(w s + 1)(h s + 1) = max_pixels`` fits (it bounds the rounded-up product)
    and ``sqrt(max_pixels / (w h))`` does not; bisection between them finds the largest fitting
    scale. Pages with a side <= 0 get `scale` unchanged (PDFium refuses to render them anyway).
    """
    w, h = float(width), float(height)

    def fits(s: float) -> bool:
        return math.ceil(w * s) * math.ceil(h * s) <= max_pixels

    if not (w > 0 and h > 0) or fits(scale):
        return scale
    a, b, c = w * h, w + h, 1.0 - max_pixels
    lo = (-b + math.sqrt(b * b - 4.0 * a * c)) / (2.0 * a)
    hi = min(scale, math.sqrt(max_pixels / a))
    for _ in range(60):  # fits() is monotone in s
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


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
    max_page_pixels: int = MAX_PAGE_PIXELS,
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
        max_page_pixels: pixel budget of each render (int > 0); a larger page is drawn at a
            smaller scale (``Page.image_scale`` says which).

    Raises FileNotFoundError when ``path`` is not a file, ValueError when PDFium cannot open it
    as a PDF, and ValueError / TypeError naming the argument for bad arguments.
    """
    check_render_args(scale=scale, ocr=ocr, ocr_scale=ocr_scale)
    if isinstance(min_text_chars, bool) or not isinstance(min_text_chars, int) or min_text_chars < 0:
        raise ValueError(f"min_text_chars: expected an int >= 0, got {min_text_chars!r}")
    check_max_pixels(max_page_pixels)
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
            out.append(_read_page(doc, number, path.name, scale, with_images, ocr, min_text_chars, ocr_scale,
                                  max_page_pixels))
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


def render_page(page, scale: float, max_pixels: int = MAX_PAGE_PIXELS) -> tuple[Image, float]:
    """``(PIL RGB image, scale used)`` of a pypdfium2 page drawn at `scale`, or at the smaller
    :func:`budget_scale` when `scale` would exceed `max_pixels`; the image has at most
    `max_pixels` pixels either way."""
    width, height = page.get_size()
    used = budget_scale(width, height, scale, max_pixels)
    bitmap = page.render(scale=used)
    try:
        # convert() copies: to_pil() may share the bitmap's buffer, which close() frees.
        return bitmap.to_pil().convert("RGB"), used
    finally:
        bitmap.close()


def _render(page, scale: float, max_pixels: int = MAX_PAGE_PIXELS):
    """:func:`render_page`'s image alone."""
    return render_page(page, scale, max_pixels)[0]


def _read_page(doc, number: int, doc_id: str, scale: float, with_images: bool,
               ocr: Callable | None, min_text_chars: int, ocr_scale: float,
               max_pixels: int = MAX_PAGE_PIXELS) -> Page:
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

        image, image_scale = render_page(page, scale, max_pixels) if with_images else (None, None)
        if ocr is not None and n_layer < min_text_chars:
            ocr_image = image if image is not None and ocr_scale == scale else _render(page, ocr_scale, max_pixels)
            ocr_text = _ocr_text(ocr, ocr_image)
            if _count_chars(ocr_text) > n_layer:
                text, source = ocr_text, "ocr"
    finally:
        page.close()
    return Page(doc_id, number, text, source, image, float(width), float(height), image_scale)
