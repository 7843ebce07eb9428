"""Bounded ingest (issue 22, items 2 and 3): page renders within a pixel budget, page images
parked on disk instead of held in memory (and deleted after use), segmentation and encoding
of very long text without per-word lists of the whole file.

Inputs are generated into tmp_path: hand-written PDFs with huge MediaBoxes, pypdfium2 blank
pages, matplotlib pages with text and a picture."""
import gc
import math
import os
import pickle
import random
import tracemalloc
import weakref
from pathlib import Path

import matplotlib
import numpy as np
import pypdfium2 as pdfium
import pytest
import torch
from PIL import Image

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.backends.backend_pdf import PdfPages  # noqa: E402

import colgraph_engine.ingest.readers.pdf as pdf_reader  # noqa: E402
import colgraph_engine.kg.segment as seg  # noqa: E402
import colgraph_engine.kg.vectors as vectors  # noqa: E402
from colgraph_engine.eval.pdf import MAX_PAGE_PIXELS, budget_scale, render_page, render_pdf  # noqa: E402
from colgraph_engine.ingest.folder import ingest  # noqa: E402
from colgraph_engine.ingest.readers import read_path, read_pdf, read_text  # noqa: E402
from colgraph_engine.kg import Encoders, KnowledgeIndex, Section, build_document_graph, encode_document  # noqa: E402
from colgraph_engine.kg.document import DocumentInput, ImageInput, ImageSpool, SpooledImage, SpooledPixels  # noqa: E402
from colgraph_engine.kg.segment import Segment, segment_sections  # noqa: E402

ENC = Encoders.offline(text_dim=32, patch_grid=4, patch_cell=2)


# -- generated files --------------------------------------------------------------------------------

def bomb_pdf(path, pages=1, side=14400.0):
    """Empty pages of side x side points, hand-written (a few hundred bytes)."""
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [" + b" ".join(b"%d 0 R" % (3 + i) for i in range(pages))
            + b"] /Count %d >>" % pages]
    objs += [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 %g %g] >>" % (side, side) for _ in range(pages)]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objs, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    Path(path).write_bytes(bytes(out))
    return path


def blank_pdf(path, pages, width=612.0, height=792.0):
    doc = pdfium.PdfDocument.new()
    for _ in range(pages):
        doc.new_page(width, height).close()
    doc.save(str(path))
    doc.close()
    return path


def content_pdf(path, pages=3):
    """Pages with a text layer and a picture (matplotlib, TrueType fonts)."""
    plt.rcParams["pdf.fonttype"] = 42
    rng = np.random.default_rng(0)
    with PdfPages(path) as pdf:
        for p in range(pages):
            fig = plt.figure(figsize=(4, 5))
            fig.text(0.1, 0.9, f"Page {p + 1}: Mount Fuji and the Shinkansen near Tokyo.", fontsize=9)
            ax = fig.add_axes([0.2, 0.2, 0.5, 0.4])
            ax.imshow(rng.integers(0, 255, (40, 50, 3), dtype=np.uint8), aspect="auto")
            ax.axis("off")
            pdf.savefig(fig)
            plt.close(fig)
    return path


def image_pdf(path, px=(40, 40), drawn=(400.0, 40.0)):
    """One page holding one image object of `px` pixels drawn as `drawn` points."""
    doc = pdfium.PdfDocument.new()
    page = doc.new_page(612, 792)
    img = pdfium.PdfImage.new(doc)
    pil = Image.fromarray(np.random.default_rng(1).integers(0, 255, (px[1], px[0], 3), dtype=np.uint8))
    img.set_bitmap(pdfium.PdfBitmap.from_pil(pil))
    img.set_matrix(pdfium.PdfMatrix().scale(*drawn).translate(100, 400))
    page.insert_obj(img)
    page.gen_content()
    doc.save(str(path))
    page.close()
    doc.close()
    return path


def spool_dirs(folder):
    return sorted(Path(folder).glob(ImageSpool.PREFIX + "*"))


# -- item 2: the pixel budget -----------------------------------------------------------------------

def test_budget_scale_fits_and_never_raises_the_scale():
    assert budget_scale(612, 792, 1.0) == 1.0 and budget_scale(612, 792, 2.0) == 2.0  # letter: unchanged
    for w, h, s, budget in [(14400, 14400, 1.0, MAX_PAGE_PIXELS), (14400, 1, 3.0, 1000), (3, 3, 50.0, 7),
                            (612, 792, 10.0, 4_000_000), (1e6, 2e5, 1.0, 1)]:
        used = budget_scale(w, h, s, budget)
        assert 0 < used <= s
        assert math.ceil(w * used) * math.ceil(h * used) <= budget
        assert math.ceil(w * used * 1.01) * math.ceil(h * used * 1.01) > budget * 0.98  # close to the budget


def test_bomb_pdf_pages_render_within_the_budget_with_a_warning(tmp_path):
    path = bomb_pdf(tmp_path / "bomb.pdf", pages=2)
    assert path.stat().st_size < 700
    r = read_pdf(path, image_dir=tmp_path)
    assert r.ok and len(r.document.images) == 2
    for im in r.document.images:
        assert isinstance(im.pixels, SpooledImage)
        w, h = im.pixels.load().size
        assert w * h <= MAX_PAGE_PIXELS and w > 1000  # reduced, not collapsed
    warnings = [i.message for i in r.issues if i.severity == "warning"]
    assert len(warnings) == 2 and all("over the pixel budget of 4,000,000" in m and "rendered at scale 0.1" in m
                                   for m in warnings)
    small = read_pdf(path, image_dir=tmp_path, max_page_pixels=10_000, extract_images=False)
    assert all(math.prod(im.pixels.size) <= 10_000 for im in small.document.images)
    (page,) = render_pdf(path, pages=[1], max_page_pixels=10_000)  # the evaluation loader too
    assert math.prod(page.image.size) <= 10_000 and page.image_scale < 1.0


def test_ocr_renders_keep_to_the_budget(tmp_path):
    seen = []

    def ocr(image):
        seen.append(image.size)
        return ""

    r = read_pdf(bomb_pdf(tmp_path / "bomb.pdf"), ocr=ocr, ocr_scale=2.0, render_pages=False, max_page_pixels=50_000)
    assert seen and all(w * h <= 50_000 for w, h in seen)
    assert any("the OCR render" in i.message for i in r.issues)
    render_pdf(tmp_path / "bomb.pdf", ocr=ocr, ocr_scale=2.0, with_images=False, max_page_pixels=50_000)
    assert all(w * h <= 50_000 for w, h in seen)


def test_normal_pages_render_at_the_requested_scale(tmp_path):
    r = read_pdf(content_pdf(tmp_path / "c.pdf", pages=1), scale=2.0, image_dir=tmp_path)
    assert not any("pixel budget" in i.message for i in r.issues)
    assert r.document.images[0].pixels.size == (576, 720)  # 4 x 5 in at 144 dpi


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "4M", None])
def test_bad_pixel_budget_is_refused_naming_the_argument(tmp_path, bad):
    path = bomb_pdf(tmp_path / "bomb.pdf")
    with pytest.raises(ValueError, match="max_page_pixels"):
        read_pdf(path, max_page_pixels=bad)
    with pytest.raises(ValueError, match="max_page_pixels"):
        render_pdf(path, max_page_pixels=bad)
    with pytest.raises(TypeError, match="image_dir"):
        read_pdf(path, image_dir=3)
    with pytest.raises(ValueError, match="image_dir"):
        read_pdf(path, image_dir=tmp_path / "missing")


def test_embedded_images_over_the_render_budget(tmp_path, monkeypatch):
    # a 40 x 40 px image stretched over 400 x 40 pt renders at 400 x 40 px: over a budget of 2,000
    monkeypatch.setattr(pdf_reader, "MAX_IMAGE_RENDER_PIXELS", 2_000)
    r = read_pdf(image_pdf(tmp_path / "stretched.pdf"), render_pages=False, image_dir=tmp_path)
    (im,) = r.document.images
    assert math.prod(im.pixels.size) <= 2_000
    # its own bitmap over the budget: PDFium would decode all of it, so it is skipped
    monkeypatch.setattr(pdf_reader, "MAX_IMAGE_RENDER_PIXELS", 1_000)
    r = read_pdf(image_pdf(tmp_path / "big.pdf"), render_pages=False, image_dir=tmp_path)
    assert r.document is None or not r.document.images
    assert any("over the render budget" in i.message for i in r.issues) and r.stats.images_skipped == 1


def test_embedded_images_within_the_budget_are_unchanged(tmp_path):
    path = image_pdf(tmp_path / "img.pdf", px=(60, 50), drawn=(120.0, 100.0))
    r = read_pdf(path, render_pages=False, image_dir=tmp_path)
    doc = pdfium.PdfDocument(path)
    (obj,) = [o for o in doc[0].get_objects() if o.type == pdfium.raw.FPDF_PAGEOBJ_IMAGE]
    want = np.asarray(obj.get_bitmap(render=True).to_pil().convert("RGB"))
    assert np.array_equal(np.asarray(r.document.images[0].pixels.load()), want)
    doc.close()


# -- item 3: page images on disk, deleted after use --------------------------------------------------

def test_page_images_are_spooled_pngs_with_the_same_pixels(tmp_path):
    path = content_pdf(tmp_path / "c.pdf", pages=3)
    r = read_pdf(path, scale=0.75, image_dir=tmp_path)
    pages = [im for im in r.document.images if im.ref.startswith("page-") and "-image-" not in im.ref]
    embedded = [im for im in r.document.images if "-image-" in im.ref]
    assert len(pages) == 3 and len(embedded) == 3
    assert all(isinstance(im.pixels, SpooledImage) and os.fspath(im.pixels).endswith(".png")
               for im in r.document.images)
    doc = pdfium.PdfDocument(path)
    for im in pages:
        want, _ = render_page(doc[int(im.ref.split("-")[1]) - 1], 0.75)
        assert np.array_equal(np.asarray(im.pixels.load()), np.asarray(want))  # PNG is lossless
        assert im.source == f"c.pdf page {im.ref.split('-')[1]}"  # never the temporary path
    doc.close()
    (folder,) = spool_dirs(tmp_path)
    assert len(list(folder.iterdir())) == 6
    g = build_document_graph(r.document)
    assert all(isinstance(p, SpooledPixels) and not isinstance(p, os.PathLike) for p in g.pixels.values())
    assert all(g.node_source[v] and str(tmp_path) not in g.node_source[v] for v in range(g.n_nodes)
               if g.node_name[v].startswith("page-"))


def test_spool_is_deleted_once_the_document_and_graph_are_dropped(tmp_path):
    gc.disable()  # deleted by reference counting, right away, not by a later cycle collection
    try:
        r = read_pdf(content_pdf(tmp_path / "c.pdf", pages=2), image_dir=tmp_path)
        g = build_document_graph(r.document)
        v = encode_document(g, ENC)
        assert v["image"].local.size == 4 and len(spool_dirs(tmp_path)) == 1
        del r
        assert len(spool_dirs(tmp_path)) == 1  # the graph still needs its pixels
        g.pixels = {k: p for k, p in g.pixels.items() if isinstance(p, (str, os.PathLike))}  # as ingest does
        assert spool_dirs(tmp_path) == []
    finally:
        gc.enable()


def test_spool_is_deleted_when_encoding_fails(tmp_path):
    def broken(images):
        raise RuntimeError("encoder out of memory")

    from colgraph_engine.encoders import Encoder
    encoders = Encoders(ENC.text, ENC.tokens, Encoder(broken, "broken", 8, "patches"))
    gc.disable()
    try:
        r = read_pdf(content_pdf(tmp_path / "c.pdf", pages=1), image_dir=tmp_path)
        g = build_document_graph(r.document)
        with pytest.raises(RuntimeError, match="out of memory"):
            encode_document(g, encoders)
        del r, g
        assert spool_dirs(tmp_path) == []
    finally:
        gc.enable()


def test_unreadable_pdf_leaves_no_spool(tmp_path):
    bad = tmp_path / "bad.pdf"
    bad.write_bytes(b"%PDF-1.4\n" + b"garbage " * 100)
    assert not read_pdf(bad, image_dir=tmp_path).ok
    text_only = read_pdf(content_pdf(tmp_path / "c.pdf", pages=1), render_pages=False, extract_images=False,
                         image_dir=tmp_path)
    assert text_only.ok and spool_dirs(tmp_path) == []  # no image, no folder


def test_cleanup_and_pickling_move_or_end_ownership(tmp_path):
    spool = ImageSpool(tmp_path)
    image = spool.add(Image.new("RGB", (5, 4), (10, 20, 30)))
    assert image.size == (5, 4) and image.load().getpixel((0, 0)) == (10, 20, 30)
    copy = pickle.loads(pickle.dumps(image))  # e.g. a worker process handing a document back
    del image, spool
    assert len(spool_dirs(tmp_path)) == 1  # the copy owns the folder now
    assert copy.load().size == (5, 4)
    copy.spool.cleanup()
    assert spool_dirs(tmp_path) == []
    with pytest.raises(FileNotFoundError, match="deleted with its image spool"):
        copy.load()


def test_ingest_leaves_no_image_files_behind(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    content_pdf(corpus / "a.pdf", pages=2)
    blank_pdf(corpus / "b.pdf", pages=3)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    index = KnowledgeIndex.create(tmp_path / "ix", ENC)
    report = ingest(index, corpus, progress=False, batch_size=1)
    assert [d.status for d in report.documents] == ["added", "added"]
    assert report.totals["images"] == 2 * 2 + 3
    assert spool_dirs(tmp) == []


def test_decoded_page_images_in_memory_do_not_grow_with_pages(tmp_path, monkeypatch):
    """Reading and encoding a 60-page PDF holds at most one page render (reading) and one chunk
    of decoded images (encoding) at a time; before, every page image of the document was held."""
    refs = []  # weak references to every decoded image (PIL images are not hashable: no WeakSet)
    most = {"read": 0, "encode": 0}

    def alive():  # freed by reference counting: no gc.collect() needed (nor wanted: it is slow here)
        return sum(r() is not None for r in refs)

    def tracked(phase, fn, pick):
        def wrapper(*a, **k):
            out = fn(*a, **k)
            refs.append(weakref.ref(pick(out)))
            most[phase] = max(most[phase], alive())
            return out
        return wrapper

    monkeypatch.setattr(pdf_reader, "render_page", tracked("read", pdf_reader.render_page, lambda o: o[0]))
    monkeypatch.setattr(vectors, "open_image", tracked("encode", vectors.open_image, lambda o: o))
    r = read_pdf(blank_pdf(tmp_path / "blank.pdf", 60), image_dir=tmp_path)
    most_after_read = alive()
    g = build_document_graph(r.document)
    v = encode_document(g, ENC)
    assert v["image"].local.size == 60
    assert most["read"] <= 1 and most_after_read == 0
    assert most["encode"] <= vectors.IMAGE_CHUNK


# -- item 3: long text ---------------------------------------------------------------------------------

def _reference_segments(sections, max_tokens=1200, overlap_tokens=0, count_tokens=None):
    """The list-based segmentation this module replaced (every word of a section in one list)."""
    cost = (lambda w: 1) if count_tokens is None else count_tokens
    out, buf = [], []

    def words_of(text):
        ws_all = []
        for para in seg._PARAGRAPHS.split(text):
            ws = para.split()
            if ws:
                if ws_all:
                    ws_all.append(seg._BREAK)
                ws_all.extend(ws)
        return ws_all

    def flush():
        if buf:
            words = [w for k, (_, ws, _) in enumerate(buf) for w in ([seg._BREAK] if k else []) + ws]
            out.append(Segment(seg._join(words), (), (buf[0][0], buf[-1][0]), sum(c for _, _, cs in buf for c in cs)))
            buf.clear()

    for i, s in enumerate(Section(x) if isinstance(x, str) else x for x in sections):
        words = words_of(s.text)
        costs = [0 if w is seg._BREAK else int(cost(w)) for w in words]
        total = sum(costs)
        if s.images:
            flush()
            out.append(Segment(seg._join(words), tuple(s.images), (i, i), total))
        elif not words:
            continue
        elif total > max_tokens:
            flush()
            for part, (a, b) in enumerate(seg._split_words(words, costs, max_tokens, overlap_tokens)):
                out.append(Segment(seg._join(words[a:b]), (), (i, i), sum(costs[a:b]), part))
        else:
            if buf and sum(c for _, _, cs in buf for c in cs) + total > max_tokens:
                flush()
            buf.append((i, words, costs))
    flush()
    return out


def _random_text(rng, n_words):
    seps = [" ", " ", " ", "\n", "\n\n", " \n \n ", "\t", "\n\n\n", "  "]
    return "".join(rng.choice(["alpha", "Be", "c", "Mount", "Fuji", "x" * rng.randint(1, 9)]) + rng.choice(seps)
                   for _ in range(n_words))


@pytest.mark.parametrize("piece", [3, 16, 1 << 16])
def test_streamed_segmentation_equals_the_list_based_rule(monkeypatch, piece):
    monkeypatch.setattr(seg, "PIECE_CHARS", piece)
    rng = random.Random(piece)
    for trial in range(40):
        sections = [Section(_random_text(rng, rng.randint(0, 60)), images=("im",) if rng.random() < 0.15 else ())
                    for _ in range(rng.randint(1, 6))]
        max_tokens = rng.randint(1, 25)
        overlap = rng.randint(0, max_tokens - 1)
        count = None if trial % 3 else (lambda w: len(w) % 3)  # zero-cost words too
        assert segment_sections(sections, max_tokens=max_tokens, overlap_tokens=overlap, count_tokens=count) == \
            _reference_segments(sections, max_tokens, overlap, count), (trial, sections, max_tokens, overlap)


def test_long_one_line_text_segments_with_bounded_memory(tmp_path):
    rng = random.Random(0)
    vocab = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 8))) for _ in range(500)]
    words = rng.choices(vocab, k=400_000)
    path = tmp_path / "long.md"
    path.write_text(" ".join(words))  # about 2.2 MB, one line
    r = read_text(path)
    n_chars = len(r.document.sections[0].text)
    tracemalloc.start()
    try:
        segments = segment_sections(r.document.sections, max_tokens=1200)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(segments) == math.ceil(400_000 / 1200) and all(s.n_tokens <= 1200 for s in segments)
    assert " ".join(s.text for s in segments) == " ".join(words)
    # the segments' own text is about n_chars (+ ~50 bytes of str header each); the words of the
    # whole line as a list (the rule before) cost about 30 bytes a character here (~65 MB)
    assert peak < 1.5 * n_chars + 4_000_000, peak


def test_token_stores_pack_to_the_same_vectors_in_chunks():
    text = " ".join(f"w{i % 97} Mount Fuji" if i % 7 == 0 else f"w{i % 89}" for i in range(3 * vectors.TEXT_CHUNK * 5))
    doc = DocumentInput("long", [Section(text)], images=[ImageInput(f"im{k}", np.full((9, 7, 3), k, np.uint8))
                                                          for k in range(vectors.IMAGE_CHUNK + 3)])
    g = build_document_graph(doc, max_tokens=5)
    assert g.counts["segments"] > 2 * vectors.TEXT_CHUNK
    got = encode_document(g, ENC)
    for store in ("segment", "image"):
        ids = got[store].local
        if store == "segment":
            outputs = ENC.tokens([g.node_text[v] for v in ids])
        else:
            outputs = ENC.patches([vectors.open_image(g.pixels[g.node_name[v]]) for v in ids])
        assert torch.equal(got[store].values, torch.cat(outputs))
        assert got[store].offsets.tolist() == [0] + np.cumsum([t.shape[0] for t in outputs]).tolist()


def test_read_path_passes_the_new_pdf_options(tmp_path):
    r = read_path(bomb_pdf(tmp_path / "bomb.pdf"), max_page_pixels=20_000, image_dir=str(tmp_path))
    assert r.ok and math.prod(r.document.images[0].pixels.size) <= 20_000
    assert Path(os.fspath(r.document.images[0].pixels)).parent.parent == tmp_path
