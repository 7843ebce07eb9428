"""PDF -> :class:`DocumentInput`: text layer per page, OCR fallback, page images, embedded images
with their boxes, and sections from layout cues.

Page text and rendering reuse :mod:`colgraph_engine.eval.pdf` (the same PDFium calls, text
clean-up and OCR contract as the evaluation loaders). What this module adds:

* **Headings** (``sections="headings"``, the default). PDFium reports each character's font
  size and weight cheaply (``FPDFText_GetFontSize`` / ``FPDFText_GetFontWeight``), so every text
  line is measured on up to :data:`FONT_SAMPLES` of its characters. The body size is the most
  common line size of the document, weighted by characters. A line is a heading when it has a
  letter, at most :data:`MAX_HEADING_WORDS` words, and either its size is at least
  :data:`HEADING_RATIO` times the body size, or it is bold (weight >= 600 on 80% of its samples)
  in body size or larger while body text is not bold, with at most 8 words and no final ``.``.
  Consecutive heading lines form one title. These thresholds are ours (no paper states any).
  A heading starts a new section titled with it (the heading line stays in the text); sections
  never cross pages (a section that runs on gets a new section on the next page under the same
  title), so ``Section.page`` is exact. Lines come in PDFium's text order; in multi-column
  layouts that order, and so the sections, follow the PDF's content stream.
  OCR'd pages carry no font information: each is one section under the running title.
* ``sections="pages"``: one section per page, exactly as ``benchmarks/pipeline_quality.py``'s
  ``page_document`` builds it (text whitespace-joined, the page image ``page-<n>`` captioned with
  that text); page-level retrieval reads pages back from these images.
* **Page images** (``render_pages``): ``page-<n>`` (1-based), the page rendered at ``scale``
  (1.0 = 72 dpi), captioned with the page text, placed in the page's first section. A page over
  the pixel budget ``max_page_pixels`` (default :data:`~colgraph_engine.eval.pdf.MAX_PAGE_PIXELS`)
  is rendered at the largest scale that fits, with a warning naming the scale used; OCR renders
  keep to the same budget.
* **Where images live**: every decoded image (page renders, embedded images) is written at once
  as a lossless PNG into the document's :class:`~colgraph_engine.kg.document.ImageSpool` (a
  temporary folder under ``image_dir``, default the system temporary folder) and
  ``ImageInput.pixels`` is its :class:`~colgraph_engine.kg.document.SpooledImage` path, so
  reading holds at most one page's images in memory whatever the page count. The folder goes
  when the document's images and graph are dropped (after encoding, in ingest) or on
  ``ImageSpool.cleanup()``; a file that fails to read leaves none.
* **Embedded images** (``extract_images``): image objects of the page, also inside form
  XObjects (their boxes mapped through the form matrices), rendered by PDFium with masks and
  transforms (``FPDFImageObj_GetRenderedBitmap``), referenced as ``page-<n>-image-<k>``, with
  the normalised box ``(x1, y1, x2, y2)`` on the page (top-left origin, in [0, 1]) written into
  ``ImageInput.source``. Ours: images whose shorter side on the page is below
  :data:`MIN_IMAGE_POINTS` points or below :data:`MIN_IMAGE_PIXELS` pixels are decorations
  (skipped, counted); when page images are rendered, an image covering at least
  :data:`PAGE_COVER` of the page is the scanned page itself (skipped); at most
  :data:`MAX_IMAGES_PER_PAGE` per page are kept (the largest); bitmaps are downscaled to
  :data:`MAX_IMAGE_SIDE` pixels on the longer side. An image whose own bitmap has more than
  :data:`MAX_IMAGE_RENDER_PIXELS` pixels is skipped with a warning (PDFium decodes all of it,
  whatever size it is drawn at); one drawn so stretched that its render would exceed that
  budget is rendered at a scale that fits. An image goes to the section of its page
  whose heading lies above the image's top edge (the page's first section if none). Boxes are
  in the unrotated page frame; pages with ``/Rotate`` get a warning.
"""
from __future__ import annotations

import math
import os
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from ...eval.pdf import (
    MAX_PAGE_PIXELS, _count_chars, _ocr_text, budget_scale, check_max_pixels, check_render_args, clean_layer_text,
    render_page,
)
from ...kg.document import DocumentInput, ImageInput, ImageSpool, SpooledImage
from ...kg.segment import Section
from .result import ReadResult, check_file, resolve

SECTION_MODES = ("headings", "pages")
FONT_SAMPLES = 8
HEADING_RATIO = 1.15
MAX_HEADING_WORDS = 12
MIN_IMAGE_POINTS = 32.0
MIN_IMAGE_PIXELS = 16
PAGE_COVER = 0.9
MAX_IMAGES_PER_PAGE = 32
MAX_IMAGE_SIDE = 2048
# Ours: 40 M pixels (a 7300 x 5500 photo, 160 MB as BGRA): embedded camera pictures up to about
# 40 MP render as before; bigger bitmaps, which cost PDFium their full decode before the
# downscale to MAX_IMAGE_SIDE, are skipped.
MAX_IMAGE_RENDER_PIXELS = 40_000_000
_MAX_FORM_DEPTH = 8


def page_image_ref(number: int) -> str:
    """``page-<n>``: the ref of page ``number``'s rendered image (as ``page_document`` names it)."""
    return f"page-{number}"


@dataclass
class _Line:
    text: str
    size: float = 0.0       # median sampled font size in points; 0 when unknown (OCR)
    bold: bool = False
    top: float | None = None  # PDF y of the line's top edge (points from the page bottom)
    heading: bool = False


@dataclass
class _Page:
    number: int
    text: str
    source: str
    lines: list[_Line]
    image: SpooledImage | None = None
    embedded: list[tuple[ImageInput, float]] = field(default_factory=list)  # (image, top y)
    top: float = 0.0  # PDF y of the page's top edge


def _check_args(ocr, scale, ocr_scale, min_text_chars, sections, render_pages, extract_images, progress, *,
                max_page_pixels=MAX_PAGE_PIXELS, image_dir=None):
    check_render_args(scale=scale, ocr=ocr, ocr_scale=ocr_scale)
    check_max_pixels(max_page_pixels, "max_page_pixels")
    if image_dir is not None and not isinstance(image_dir, (str, os.PathLike)):
        raise TypeError(f"image_dir: expected a folder path or None, got {type(image_dir).__name__}")
    if image_dir is not None and not os.path.isdir(image_dir):
        raise ValueError(f"image_dir: no such folder: {os.fspath(image_dir)}")
    if isinstance(min_text_chars, bool) or not isinstance(min_text_chars, int) or min_text_chars < 0:
        raise ValueError(f"min_text_chars: expected an int >= 0, got {min_text_chars!r}")
    if sections not in SECTION_MODES:
        raise ValueError(f"sections: expected one of {SECTION_MODES}, got {sections!r}")
    for name, v in (("render_pages", render_pages), ("extract_images", extract_images), ("progress", progress)):
        if not isinstance(v, bool):
            raise TypeError(f"{name}: expected bool, got {type(v).__name__}")


def read_pdf(path: str | os.PathLike, *, doc_id: str | None = None, ocr: Callable | None = None,
             render_pages: bool = True, scale: float = 1.0, ocr_scale: float | None = None,
             extract_images: bool = True, min_text_chars: int = 20, sections: str = "headings",
             progress: bool = False, max_page_pixels: int = MAX_PAGE_PIXELS,
             image_dir: str | os.PathLike | None = None, max_text_chars: int | None = None) -> ReadResult:
    """Reads one PDF (see the module docstring for what becomes what).

    Args:
        path: the PDF file.
        doc_id: the document id (default: the file name).
        ocr: ``ocr(PIL RGB image) -> str | obj with .text`` (e.g. ``encoders.ocr.RapidOcr()``),
            run on pages whose text layer has fewer than ``min_text_chars`` non-whitespace
            characters; its text replaces the layer's when it has more such characters.
        render_pages: render each page as the image ``page-<n>``.
        scale: page render scale (1.0 = 72 dpi); ``ocr_scale``: OCR render scale (default ``scale``).
        extract_images: extract embedded images with their boxes.
        min_text_chars: below this the text layer counts as missing (>= 0).
        sections: ``"headings"`` or ``"pages"``.
        progress: a tqdm bar over pages.
        max_page_pixels: pixel budget of one page render, page image or OCR (an int > 0); a
            larger page is drawn at a smaller scale, with a warning.
        image_dir: the folder in which the document's temporary image folder is made (default:
            the system temporary folder).
        max_text_chars: stop after the page whose text brings the document past this many
            characters (None: read every page), with a warning naming the pages left out: a
            document's vectors grow with its text, so a text-dense PDF of thousands of pages must
            not take the build's memory (``max_text_mb`` of :func:`~.dispatch.read_path`).

    Returns a :class:`ReadResult`; an encrypted, corrupt or empty file gives an error issue and
    no document. A page that fails alone is reported and left out; the rest is read.
    """
    _check_args(ocr, scale, ocr_scale, min_text_chars, sections, render_pages, extract_images, progress,
                max_page_pixels=max_page_pixels, image_dir=image_dir)
    if max_text_chars is not None and (isinstance(max_text_chars, bool) or not isinstance(max_text_chars, int)
                                       or max_text_chars < 1):
        raise ValueError(f"max_text_chars: expected an int >= 1 or None, got {max_text_chars!r}")
    path, doc_id = resolve(path, doc_id)
    result = ReadResult(path, doc_id, "pdf")
    if not check_file(result):
        return result
    import pypdfium2 as pdfium

    stats = result.stats
    try:
        with stats.timed("open"):
            doc = pdfium.PdfDocument(path)
    except pdfium.PdfiumError as e:
        if "password" in str(e).lower():
            return result.fail("encrypted PDF: it needs a password, none is supplied; not read")
        return result.fail(f"cannot open as a PDF ({e})")
    ocr_scale = float(scale if ocr_scale is None else ocr_scale)
    pages: list[_Page] = []
    spools: list[ImageSpool] = []  # made on the first image, so text-only reads create no folder

    def park(image) -> SpooledImage:
        if not spools:
            spools.append(ImageSpool(image_dir))
        return spools[0].add(image)

    render = _Render(scale, ocr_scale, max_page_pixels, park)
    bar = None
    try:
        n_pages = len(doc)
        if n_pages == 0:
            return result.fail("the PDF has no pages")
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=n_pages, desc=doc_id, unit="page", leave=False)
        chars = 0
        for number in range(1, n_pages + 1):
            try:
                pages.append(_read_page(doc, number, doc_id, result, ocr=ocr, render=render_pages, how=render,
                                        extract=extract_images, min_text_chars=min_text_chars))
                chars += len(pages[-1].text)
            except Exception as e:  # one bad page must not lose the document
                result.issue(f"page {number} not read ({type(e).__name__}: {e})")
            if bar is not None:
                bar.update()
            if max_text_chars is not None and chars > max_text_chars and number < n_pages:
                result.issue(f"read only the first {number} of {n_pages} pages: their text reached {chars} "
                             f"characters, over max_text_chars = {max_text_chars} (max_text_mb); pages "
                             f"{number + 1}-{n_pages} were not read", "warning")
                break
        title = _metadata_title(doc)
    finally:
        if bar is not None:
            bar.close()
        doc.close()
    if not pages:
        for spool in spools:
            spool.cleanup()
        return result.fail("no page could be read")
    stats.pages = len(pages)
    _mark_headings(pages)
    secs = _page_sections(pages) if sections == "pages" else _heading_sections(pages)
    images = []
    for p in pages:
        if p.image is not None:
            images.append(ImageInput(page_image_ref(p.number), pixels=p.image, caption=" ".join(p.text.split()),
                                     source=f"{doc_id} page {p.number}"))
        images.extend(im for im, _ in p.embedded)
    if not title:
        title = next((ln.text for p in pages for ln in p.lines if ln.heading), "")
    stats.sections = len(secs)
    stats.headings = sum(ln.heading for p in pages for ln in p.lines)
    stats.page_images = sum(p.image is not None for p in pages)
    stats.images = sum(len(p.embedded) for p in pages)
    result.document = DocumentInput(doc_id, secs, title=title, images=images)
    return result


def _metadata_title(doc) -> str:
    try:
        return " ".join((doc.get_metadata_value("Title") or "").split())
    except Exception:  # metadata is optional; a broken info dictionary is not worth a failure
        return ""


# -- one page ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Render:
    """How a document's pages are drawn: scales, the pixel budget, and ``park(PIL) -> SpooledImage``."""
    scale: float
    ocr_scale: float
    max_pixels: int
    park: Callable


def _budget_note(number: int, what: str, page, scale: float, used: float, image, budget: int) -> str:
    w, h = page.get_size()
    return (f"page {number}: {what} of {w:g} x {h:g} pt at scale {scale:g} is over the pixel budget of "
            f"{budget:,} (max_page_pixels); rendered at scale {used:.4g} ({image.size[0]} x {image.size[1]} pixels)")


def _read_page(doc, number, doc_id, result, *, ocr, render, how: _Render, extract, min_text_chars) -> _Page:
    stats = result.stats
    page = doc[number - 1]
    try:
        left, bottom, right, top = page.get_bbox()
        with stats.timed("text"):
            textpage = page.get_textpage()
        try:
            with stats.timed("text"):
                raw = textpage.get_text_range()
                text = clean_layer_text(raw)
            with stats.timed("fonts"):
                lines = _measure_lines(textpage, raw)
        finally:
            textpage.close()
        n_layer = _count_chars(text)
        source = "layer" if n_layer else "none"
        image = pil = None
        if render:
            with stats.timed("render"):
                pil, used = render_page(page, how.scale, how.max_pixels)
            if used < how.scale:
                result.issue(_budget_note(number, "the page image", page, how.scale, used, pil, how.max_pixels),
                             "warning")
        if ocr is not None and n_layer < min_text_chars:
            with stats.timed("ocr"):
                if pil is not None and how.ocr_scale == how.scale:
                    ocr_image = pil
                else:
                    ocr_image, used = render_page(page, how.ocr_scale, how.max_pixels)
                    if used < how.ocr_scale:
                        result.issue(_budget_note(number, "the OCR render", page, how.ocr_scale, used, ocr_image,
                                                  how.max_pixels), "warning")
                ocr_text = _ocr_text(ocr, ocr_image)
                del ocr_image
            if _count_chars(ocr_text) > n_layer:
                text, source = ocr_text, "ocr"
                lines = [_Line(t) for t in ocr_text.split("\n") if t.strip()]
        if pil is not None:
            with stats.timed("render"):
                image = how.park(pil)  # to disk now: no page image stays in memory
            del pil
        if source == "layer":
            stats.text_layer_pages += 1
        elif source == "ocr":
            stats.ocr_pages += 1
        else:
            stats.empty_pages += 1
        embedded = []
        if extract:
            if page.get_rotation():
                result.issue(f"page {number} is rotated by {page.get_rotation()} degrees; image boxes are in the "
                             "unrotated page frame", "warning")
            with stats.timed("images"):
                embedded = _embedded_images(page, number, doc_id, (left, bottom, right, top), render, result,
                                            how.park)
        return _Page(number, text, source, lines, image, embedded, top)
    finally:
        page.close()


def _measure_lines(textpage, raw: str) -> list[_Line]:
    """Text lines of a page with sampled font size, boldness and top edge.

    PDFium's text is one UTF-16 unit per character index, so ``raw[i]`` is character ``i``; when
    the lengths disagree (characters outside the BMP) the lines carry no font information.
    """
    import pypdfium2.raw as pdfium_c

    n = textpage.count_chars()
    measured = len(raw) == n
    lines, start = [], 0
    for end in [i for i, c in enumerate(raw) if c == "\n"] + [len(raw)]:
        stop = end - 1 if end > start and raw[end - 1] == "\r" else end
        text = " ".join(clean_layer_text(raw[start:stop]).split())
        if text:
            line = _Line(text)
            if measured:
                idx = [i for i in range(start, stop) if not raw[i].isspace()]
                step = max(1, math.ceil(len(idx) / FONT_SAMPLES))
                sample = idx[::step][:FONT_SAMPLES]
                sizes = [pdfium_c.FPDFText_GetFontSize(textpage.raw, i) for i in sample]
                weights = [pdfium_c.FPDFText_GetFontWeight(textpage.raw, i) for i in sample]
                line.size = float(statistics.median(sizes)) if sizes else 0.0
                line.bold = bool(weights) and sum(w >= 600 for w in weights) >= 0.8 * len(weights)
                if sample:
                    line.top = float(textpage.get_charbox(sample[0])[3])
            lines.append(line)
        start = end + 1
    return lines


def _render_image_object(obj, max_pixels: int):
    """PIL RGB of an image object, as pypdfium2 renders it (at about its own resolution) when
    that fits `max_pixels`; at a smaller scale when only the drawn size is over (a small
    bitmap stretched very unevenly); None when its own bitmap is over `max_pixels`."""
    px_w, px_h = obj.get_px_size()
    if px_w * px_h > max_pixels:
        return None
    left, bottom, right, top = obj.get_bounds()
    cw, ch = abs(right - left), abs(top - bottom)
    if (px_w < px_h) != (cw < ch):  # as pypdfium2's scale_to_original: sides swapped by rotation
        px_w, px_h = px_h, px_w
    factor = max(px_w / cw, px_h / ch) if cw > 0 and ch > 0 else 0.0
    if factor == 0.0 or cw * ch * factor * factor <= max_pixels:
        bitmap = obj.get_bitmap(render=True)
    else:
        original = obj.get_matrix()
        s = budget_scale(cw, ch, factor, max_pixels)
        obj.set_matrix(original.scale(s, s))
        try:
            bitmap = obj.get_bitmap(render=True, scale_to_original=False)
        finally:
            obj.set_matrix(original)
    # convert() copies out of PDFium's buffer; the bitmap is freed with its Python object
    # (pypdfium2 warns against closing a bitmap whose buffer PDFium allocated).
    return bitmap.to_pil().convert("RGB")


def _embedded_images(page, number, doc_id, box, render, result, park) -> list[tuple[ImageInput, float]]:
    """``(ImageInput, top y)`` for the page's kept image objects (see the module docstring)."""
    import pypdfium2.raw as pdfium_c

    left, bottom, right, top = box
    width, height = right - left, top - bottom
    if width <= 0 or height <= 0:
        return []
    found = []  # (area, k, obj, (x1, y1, x2, y2) normalised, page top y)

    def walk(form, matrix, depth):
        for obj in page.get_objects(max_depth=0, form=form):
            if obj.type == pdfium_c.FPDF_PAGEOBJ_FORM and depth < _MAX_FORM_DEPTH:
                inner = obj.get_matrix()
                walk(obj, inner if matrix is None else inner.multiply(matrix), depth + 1)
            elif obj.type == pdfium_c.FPDF_PAGEOBJ_IMAGE:
                l, b, r, t = obj.get_bounds()
                if matrix is not None:
                    l, b, r, t = matrix.on_rect(l, b, r, t)
                x1, x2 = (max(0.0, min(1.0, (v - left) / width)) for v in (l, r))
                y1, y2 = (max(0.0, min(1.0, (top - v) / height)) for v in (t, b))
                w_pt, h_pt = (x2 - x1) * width, (y2 - y1) * height
                px_w, px_h = obj.get_px_size()
                if min(w_pt, h_pt) < MIN_IMAGE_POINTS or min(px_w, px_h) < MIN_IMAGE_PIXELS:
                    result.stats.images_skipped += 1
                elif render and (x2 - x1) * (y2 - y1) >= PAGE_COVER:
                    result.stats.images_skipped += 1
                else:
                    found.append(((x2 - x1) * (y2 - y1), len(found), obj, (x1, y1, x2, y2), min(t, top)))

    try:
        walk(None, None, 0)
    finally:
        # walk refers to itself through its closure cell; that cycle (holding `result` and so the
        # document with its image spool) would otherwise live until the cyclic GC runs
        del walk
    if len(found) > MAX_IMAGES_PER_PAGE:
        result.stats.images_skipped += len(found) - MAX_IMAGES_PER_PAGE
        found = sorted(sorted(found, key=lambda f: -f[0])[:MAX_IMAGES_PER_PAGE], key=lambda f: f[1])
    out = []
    for k, (_, _, obj, (x1, y1, x2, y2), y_top) in enumerate(found, start=1):
        ref = f"{page_image_ref(number)}-image-{k}"
        try:
            pil = _render_image_object(obj, MAX_IMAGE_RENDER_PIXELS)
        except Exception as e:
            result.issue(f"page {number}: image {k} could not be rendered ({e}); skipped", "warning")
            result.stats.images_skipped += 1
            continue
        if pil is None:
            px_w, px_h = obj.get_px_size()
            result.issue(f"page {number}: image {k} is {px_w} x {px_h} pixels, over the render budget of "
                         f"{MAX_IMAGE_RENDER_PIXELS:,} (MAX_IMAGE_RENDER_PIXELS); skipped", "warning")
            result.stats.images_skipped += 1
            continue
        if max(pil.size) > MAX_IMAGE_SIDE:
            pil.thumbnail((MAX_IMAGE_SIDE, MAX_IMAGE_SIDE))
        source = f"{doc_id} page {number}, box ({x1:.3f}, {y1:.3f}, {x2:.3f}, {y2:.3f})"
        out.append((ImageInput(ref, pixels=park(pil), source=source), y_top))
        del pil
    return out


# -- sections ------------------------------------------------------------------------------------

def _mark_headings(pages: list[_Page]) -> None:
    sizes, bold_chars, chars = Counter(), 0, 0
    for p in pages:
        for ln in p.lines:
            if ln.size > 0:
                sizes[round(ln.size * 2) / 2] += len(ln.text)
                chars += len(ln.text)
                bold_chars += len(ln.text) if ln.bold else 0
    if not sizes:
        return
    body = sizes.most_common(1)[0][0]
    body_bold = bold_chars > 0.5 * chars
    for p in pages:
        for ln in p.lines:
            if ln.size <= 0 or not any(c.isalpha() for c in ln.text):
                continue
            words = len(ln.text.split())
            if words > MAX_HEADING_WORDS:
                continue
            larger = ln.size >= HEADING_RATIO * body
            bolder = (ln.bold and not body_bold and ln.size >= 0.95 * body and words <= 8
                      and not ln.text.endswith("."))
            ln.heading = larger or bolder


def _page_sections(pages: list[_Page]) -> list[Section]:
    out = []
    for p in pages:
        refs = ((page_image_ref(p.number),) if p.image is not None else ()) + tuple(im.ref for im, _ in p.embedded)
        title = next((ln.text for ln in p.lines if ln.heading), None)
        out.append(Section(" ".join(p.text.split()), images=refs, title=title, page=p.number))
    return out


def _heading_sections(pages: list[_Page]) -> list[Section]:
    out: list[Section] = []
    running: str | None = None
    for p in pages:
        # [title, lines, top y, body lines so far]
        parts: list[list] = [[running, [], math.inf, 0]]
        for ln in p.lines:
            cur = parts[-1]
            if ln.heading and cur[3] == 0 and cur[1] and cur[2] != math.inf:
                cur[0] = f"{cur[0]} {ln.text}"  # a heading running over two lines
                cur[1].append(ln.text)
            elif ln.heading:
                parts.append([ln.text, [ln.text], math.inf if ln.top is None else ln.top, 0])
            else:
                cur[1].append(ln.text)
                cur[3] += 1
            running = parts[-1][0]
        if len(parts) > 1 and not parts[0][1]:
            parts.pop(0)  # the page starts with a heading
        refs: list[list[str]] = [[] for _ in parts]
        if p.image is not None:
            refs[0].append(page_image_ref(p.number))
        for im, y_top in p.embedded:
            target = 0
            for i, part in enumerate(parts):
                if part[2] != math.inf and part[2] >= y_top:
                    target = i
            refs[target].append(im.ref)
        for part, r in zip(parts, refs):
            out.append(Section("\n".join(part[1]), images=tuple(r), title=part[0], page=p.number))
    return out
