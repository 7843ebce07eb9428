"""Readers (issue 11, items 1 and 7): files the tests generate -> DocumentInput, every bad-input
case reported against its file, folder walks, and the documents building and indexing for real.

PDFs come from matplotlib's PDF backend (TrueType fonts, so a real text layer) and from PIL
(image-only pages, OCR'd with the real RapidOCR); images from scikit-image."""
import json
import struct
import zlib
from pathlib import Path

import matplotlib
import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.backends.backend_pdf import PdfPages  # noqa: E402
from skimage import data as skdata  # noqa: E402

from colgraph_engine.encoders.ocr import RapidOcr  # noqa: E402
from colgraph_engine.eval.pdf import render_pdf  # noqa: E402
from colgraph_engine.graph import EdgeKind, NodeKind  # noqa: E402
from colgraph_engine.ingest.readers import (  # noqa: E402
    SEGMENT_MARKER, ReadIssue, iter_folder, read_image, read_path, read_pdf, read_records, read_text,
)
from colgraph_engine.kg import Encoders, KnowledgeIndex, TableInput, build_document_graph  # noqa: E402

ENC = Encoders.offline(text_dim=32, patch_grid=4, patch_cell=2)


# -- generated files --------------------------------------------------------------------------------

def write_report_pdf(path):
    """Two pages: headings at 20 pt bold, body at 10 pt, one photo and one tiny icon on page 1."""
    plt.rcParams["pdf.fonttype"] = 42  # TrueType: PDFium reads the text layer back
    with PdfPages(path) as pdf:
        fig = plt.figure(figsize=(6, 8))
        fig.text(0.1, 0.95, "Introduction", fontsize=20, fontweight="bold")
        fig.text(0.1, 0.91, "Mount Fuji is the highest mountain in Japan and an active volcano.", fontsize=10)
        fig.text(0.1, 0.88, "Tokyo lies about one hundred kilometres to the north east of it.", fontsize=10)
        ax = fig.add_axes([0.2, 0.1, 0.5, 0.3])  # figure fraction: box (0.2, 0.6, 0.7, 0.9) top-left origin
        ax.imshow(skdata.astronaut()[::4, ::4], aspect="auto")
        ax.axis("off")
        icon = fig.add_axes([0.9, 0.02, 0.02, 0.015])  # ~9 x 9 pt: below MIN_IMAGE_POINTS
        icon.imshow(np.zeros((20, 20, 3), np.uint8), aspect="auto")
        icon.axis("off")
        pdf.savefig(fig)
        plt.close(fig)
        fig = plt.figure(figsize=(6, 8))
        fig.text(0.1, 0.95, "Methods", fontsize=20, fontweight="bold")
        fig.text(0.1, 0.91, "We measured the Shinkansen travel times between Tokyo and Osaka.", fontsize=10)
        pdf.savefig(fig)
        plt.close(fig)
    return path


def write_scanned_pdf(path, lines=("Scanned page about", "Mount Fuji volcano")):
    image = Image.new("RGB", (720, 300), "white")
    font = ImageFont.load_default(size=48)
    for i, line in enumerate(lines):
        ImageDraw.Draw(image).text((30, 30 + 100 * i), line, fill="black", font=font)
    image.save(path, "PDF", resolution=72.0)
    return path


def write_encrypted_pdf(path):
    """A one-page PDF whose trailer names a standard security handler: PDFium finds that the empty
    user password does not open it (the /U entry belongs to another password)."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] >>",
               b"<< /Filter /Standard /V 1 /R 2 /O <" + b"11" * 32 + b"> /U <" + b"22" * 32 + b"> /P -4 >>"]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += (b"trailer\n<< /Size %d /Root 1 0 R /Encrypt 4 0 R /ID [<" % (len(objects) + 1) + b"ab" * 16 + b"> <"
            + b"ab" * 16 + b">] >>\nstartxref\n%d\n%%%%EOF\n" % xref)
    Path(path).write_bytes(bytes(out))
    return path


def write_png_header(path, width, height):
    """A PNG whose header claims width x height but holds one row: only the header is sound."""
    def chunk(kind, payload):
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    Path(path).write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 7))
                           + chunk(b"IEND", b""))
    return path


def save_astronaut(path, size=(128, 128)):
    Image.fromarray(skdata.astronaut()).resize(size).save(path)
    return path


@pytest.fixture(scope="module")
def report_pdf(tmp_path_factory):
    return write_report_pdf(tmp_path_factory.mktemp("pdf") / "report.pdf")


@pytest.fixture(scope="module")
def ocr():
    return RapidOcr()


def messages(result):
    return " | ".join(str(i) for i in result.issues)


# -- PDF ------------------------------------------------------------------------------------------

def test_pdf_headings_sections_pages_and_embedded_images(report_pdf):
    r = read_pdf(report_pdf, scale=0.5)
    assert r.ok and r.errors == [] and r.doc_id == "report.pdf" and r.kind == "pdf"
    s = r.stats
    assert (s.pages, s.text_layer_pages, s.ocr_pages, s.page_images) == (2, 2, 0, 2)
    assert s.images == 1 and s.images_skipped == 1  # the photo kept, the 9-pt icon skipped
    assert s.headings == 2 and {"text", "fonts", "render", "images"} <= set(s.seconds)
    doc = r.document
    assert [(sec.title, sec.page) for sec in doc.sections] == [("Introduction", 1), ("Methods", 2)]
    intro, methods = doc.sections
    assert intro.text.startswith("Introduction\nMount Fuji is the highest mountain in Japan")
    assert intro.images == ("page-1", "page-1-image-1") and methods.images == ("page-2",)
    images = {im.ref: im for im in doc.images}
    photo = images["page-1-image-1"]
    box = [float(v) for v in photo.source.split("box (")[1].rstrip(")").split(",")]
    np.testing.assert_allclose(box, [0.2, 0.6, 0.7, 0.9], atol=0.01)
    assert photo.pixels.mode == "RGB" and min(photo.pixels.size) > 32
    page1 = images["page-1"]
    assert page1.pixels.size == (216, 288)  # 6 x 8 in at 72 dpi, scale 0.5
    assert page1.caption == " ".join(render_pdf(report_pdf, pages=[1], with_images=False)[0].text.split())
    assert doc.title == "Introduction"


def test_pdf_pages_mode_is_page_document(report_pdf):
    """One section per page, text whitespace-joined, page-<n> captioned with it, as the quality
    benchmark's page_document builds it from render_pdf pages."""
    r = read_pdf(report_pdf, sections="pages", extract_images=False, scale=0.25)
    pages = render_pdf(report_pdf, scale=0.25)
    secs = r.document.sections
    assert [(sec.text, sec.images, sec.page) for sec in secs] == [
        (" ".join(p.text.split()), (f"page-{p.number}",), p.number) for p in pages]
    assert [im.caption for im in r.document.images] == [sec.text for sec in secs]
    assert [np.asarray(im.pixels).tolist() == np.asarray(p.image).tolist()
            for im, p in zip(r.document.images, pages)] == [True, True]


def test_pdf_options_leave_out_images(report_pdf):
    r = read_pdf(report_pdf, render_pages=False, extract_images=False)
    assert r.document.images == [] and all(sec.images == () for sec in r.document.sections)
    assert "render" not in r.stats.seconds and "images" not in r.stats.seconds


def test_scanned_pdf_uses_real_ocr(tmp_path, ocr):
    path = write_scanned_pdf(tmp_path / "scan.pdf")
    r = read_pdf(path, ocr=ocr, ocr_scale=1.0)
    assert r.ok and r.stats.ocr_pages == 1 and r.stats.text_layer_pages == 0
    text = r.document.sections[0].text.lower()
    assert "mount fuji" in text and "scanned" in text
    assert r.stats.images == 0 and r.stats.images_skipped == 1  # the scan itself is the page, not a figure
    assert r.stats.seconds["ocr"] > 0
    without = read_pdf(path)
    assert without.stats.empty_pages == 1 and without.document.sections[0].text == ""
    assert without.document.sections[0].images == ("page-1",)


def test_bad_pdfs_are_reported_not_raised(tmp_path):
    corrupt = tmp_path / "corrupt.pdf"
    corrupt.write_bytes(b"%PDF-1.7\n" + bytes(range(256)) * 8)
    encrypted = write_encrypted_pdf(tmp_path / "locked.pdf")
    empty = tmp_path / "empty.pdf"
    empty.write_bytes(b"")
    expected = {corrupt: "cannot open as a PDF", encrypted: "encrypted PDF", empty: "empty file (0 bytes)",
                tmp_path / "missing.pdf": "no such file"}
    for path, message in expected.items():
        r = read_pdf(path)
        assert r.document is None and len(r.errors) == 1, messages(r)
        assert message in r.errors[0].message and r.errors[0].file == path.name
        assert str(r.errors[0]).startswith(f"{path.name}: error: ")


# -- images ---------------------------------------------------------------------------------------

def test_image_with_caption_scene_json_in_pixels_and_matches(tmp_path):
    img = save_astronaut(tmp_path / "astro.png", (200, 100))
    (tmp_path / "astro.caption.txt").write_text("Eileen Collins poses beside the American flag.\n")
    (tmp_path / "astro.scene.json").write_text(json.dumps({
        "objects": [{"id": 1, "category": "person", "bbox": [20, 10, 120, 100]},
                    {"id": 2, "category": "flag", "bbox": [0, 0, 50, 40]}],
        "relations": [{"subject": 1, "object": 2, "predicate": "next to"}]}))
    (tmp_path / "astro.matches.txt").write_text(
        '("mapping"|<object-1>|Eileen Collins|9)\n("mapping"|<image>|American|7)\n<|COMPLETE|>')
    r = read_image(img)
    assert r.ok and r.kind == "image" and r.stats.regions == 2, messages(r)
    assert r.stats.sidecars == ["astro.caption.txt", "astro.scene.json", "astro.matches.txt"]
    assert [i.severity for i in r.issues] == ["warning"] and "pixel coordinates" in r.issues[0].message
    doc = r.document
    assert len(doc.sections) == 1 and doc.sections[0].images == ("astro.png",)
    assert doc.sections[0].text == "Eileen Collins poses beside the American flag."
    im = doc.images[0]
    assert im.pixels == img.absolute() and im.caption == doc.sections[0].text
    boxes = {o.index: o.bbox for o in im.scene_graph.objects}
    np.testing.assert_allclose(boxes[1], (0.1, 0.1, 0.6, 1.0))
    np.testing.assert_allclose(boxes[2], (0.0, 0.0, 0.25, 0.4))
    assert [(x.subject, x.predicate, x.object) for x in im.scene_graph.scene_relations] == [(1, "next to", 2)]
    assert len(im.mappings.mappings) == 2


def test_scene_graph_text_sidecar_and_plain_caption(tmp_path):
    img = save_astronaut(tmp_path / "shot.jpg")
    (tmp_path / "shot.txt").write_text("A portrait.")
    (tmp_path / "shot.scene.txt").write_text("<object-0>: woman, (0.1, 0.1, 0.9, 1.0)\n")
    r = read_image(img)
    assert r.ok and r.issues == [] and r.document.images[0].caption == "A portrait." and r.stats.regions == 1


def test_scene_json_bad_boxes_and_unknown_ids_name_the_sidecar(tmp_path):
    img = save_astronaut(tmp_path / "bad.webp", (64, 64))
    (tmp_path / "bad.scene.json").write_text(json.dumps({
        "objects": [{"id": 0, "category": "face", "bbox": [0.1, 0.1, 0.5, 0.5]},
                    {"id": 1, "category": "ghost", "bbox": [-0.2, 0.1, 0.5, 1.3]},
                    {"id": 2, "category": "flipped", "bbox": [0.6, 0.1, 0.5, 0.5]}],
        "relations": [{"subject": 0, "object": 7, "predicate": "holds"},
                      {"subject": 0, "object": 1, "predicate": "sees"}]}))
    r = read_image(img)
    assert r.ok and r.stats.regions == 1  # the image is read; only the good object stays
    errors = [i.message for i in r.errors]
    assert all(m.startswith("sidecar bad.scene.json: ") for m in errors) and len(errors) == 4, errors
    assert "object id 1 bbox" in errors[0] and "outside the image (expected coordinates in [0, 1])" in errors[0]
    assert "object id 2" in errors[1] and "x2 < x1" in errors[1]
    assert "unknown object id 7" in errors[2] and "unknown object id 1" in errors[3]
    # pixel boxes beyond the image are refused too
    outside = {"objects": [{"id": 0, "category": "x", "bbox": [10, 10, 90, 20]}]}
    (tmp_path / "bad.scene.json").write_text(json.dumps(outside))
    r = read_image(img)
    assert r.stats.regions == 0 and "pixel coordinates within the 64x64 image" in r.errors[0].message
    (tmp_path / "bad.scene.json").write_text("{not json")
    r = read_image(img)
    assert r.ok and "sidecar bad.scene.json: invalid JSON" in r.errors[0].message


def test_bad_images_are_reported_not_raised(tmp_path):
    zero = tmp_path / "zero.jpg"
    zero.write_bytes(b"")
    bomb = write_png_header(tmp_path / "bomb.png", 10_000, 9_000)  # above our 64 M, below Pillow's limit
    huge = write_png_header(tmp_path / "huge.png", 100_000, 100_000)  # Pillow itself refuses to open it
    truncated = tmp_path / "cut.png"
    truncated.write_bytes(save_astronaut(tmp_path / "whole.png").read_bytes()[:2000])
    text = tmp_path / "notes.png"
    text.write_text("not an image at all")
    expected = {zero: "empty file (0 bytes)", bomb: "10000x9000 = 90,000,000 pixels, above max_pixels = 64,000,000",
                huge: "larger than Pillow's hard limit (decompression-bomb guard; Image size (10000000000 pixels)",
                truncated: "corrupt or truncated image", text: "not a readable image"}
    for path, message in expected.items():
        r = read_image(path)
        assert r.document is None and message in r.errors[0].message and r.errors[0].file == path.name, messages(r)
    assert "decompression-bomb guard" in read_image(bomb).errors[0].message
    small = read_image(tmp_path / "whole.png", max_pixels=100)
    assert small.document is None and "above max_pixels = 100" in small.errors[0].message


# -- text and Markdown ----------------------------------------------------------------------------

MARKDOWN = """Preface line before any heading.

# Mount Fuji

Mount Fuji is a volcano.

```
# not a heading inside code
```

Climbing
--------

| season | open |
|:-------|-----:|
| summer | yes  |
| winter | no   |

Routes start at the fifth station.

## Access #
Trains run from Tokyo.
"""


def test_markdown_headings_tables_and_fences(tmp_path):
    path = tmp_path / "fuji.md"
    path.write_bytes(b"\xef\xbb\xbf" + MARKDOWN.encode())  # with a UTF-8 byte-order mark
    r = read_text(path)
    assert r.ok and r.issues == [] and r.kind == "text"
    doc = r.document
    assert [s.title for s in doc.sections] == [None, "Mount Fuji", "Climbing", "Access"]
    assert doc.sections[0].text == "Preface line before any heading."
    assert "# not a heading inside code" in doc.sections[1].text
    assert doc.sections[2].text == "Climbing\n\n\nRoutes start at the fifth station."
    assert doc.tables == [TableInput("| season | open |\n|:-------|-----:|\n| summer | yes  |\n| winter | no   |",
                                     section=2)]
    assert doc.title == "Mount Fuji" and (r.stats.sections, r.stats.headings, r.stats.tables) == (4, 3, 1)


def test_plain_text_paragraphs_and_encodings(tmp_path):
    plain = tmp_path / "notes.txt"
    plain.write_bytes("First paragraph\nstill first.\r\n\r\nSecond: café.\n".encode("latin-1"))
    r = read_text(plain)
    assert [s.text for s in r.document.sections] == ["First paragraph\nstill first.", "Second: café."]
    assert [(i.severity, i.message) for i in r.issues] == [("warning", "not valid UTF-8; decoded as latin-1")]
    binary = tmp_path / "blob.txt"
    binary.write_bytes(b"abc\x00\x01\x02def")
    assert "binary data" in read_text(binary).errors[0].message
    blank = tmp_path / "blank.md"
    blank.write_text("  \n\n ")
    assert "no text" in read_text(blank).errors[0].message


# -- record files ---------------------------------------------------------------------------------

FIRST = ("entity<|#|>Mount Fuji<|#|>location<|#|>Highest mountain in Japan.\n"
         "entity<|#|>Japan<|#|>location<|#|>A country.\n"
         "relation<|#|>Mount Fuji<|#|>Japan<|#|>located in<|#|>Fuji is in Japan.\n<|COMPLETE|>")
GLEANED = "entity<|#|>Honshu<|#|>location<|#|>Main island.\n<|COMPLETE|>"
SECOND = '("entity"<|>"Tokyo"<|>"location"<|>"Capital of Japan.")##\n<|COMPLETE|>'


def current_prompt(chunk):
    return f"---Task---\n...\n<Entity_types>\n[Person]\n\n<Input Text>\n```\n{chunk}\n```\n\n<Output>\n---Role---"


def test_lightrag_flattened_cache_groups_gleaning_by_chunk(tmp_path):
    history = json.dumps([{"role": "user", "content": current_prompt("Fuji text.")},
                          {"role": "assistant", "content": FIRST}])
    cache = {
        "default:extract:aaa": {"return": FIRST, "cache_type": "extract", "chunk_id": "chunk-1",
                                "original_prompt": current_prompt("Mount Fuji is in Japan.")},
        "default:extract:bbb": {"return": GLEANED, "cache_type": "extract", "chunk_id": "chunk-1",
                                "original_prompt": history + "\nContinue extracting."},
        "mix:query:ccc": {"return": "an answer", "cache_type": "query", "original_prompt": "q"},
        "default:extract:ddd": {"return": SECOND, "cache_type": "extract", "chunk_id": "chunk-2",
                                "original_prompt": current_prompt("Tokyo is the capital.")},
    }
    path = tmp_path / "kv_store_llm_response_cache.json"
    path.write_text(json.dumps(cache))
    r = read_records(path)
    assert r.ok and r.kind == "records" and r.stats.segments == 2
    assert [(i.severity, i.message.split(";")[0]) for i in r.issues] == [
        ("skip", "1 entries are not extraction responses (query, keywords, summary or other modes)")]
    doc = r.document
    assert [s.text for s in doc.segments] == ["Mount Fuji is in Japan.", "Tokyo is the capital."]
    assert [e.name for e in doc.extractions[0].entities] == ["Mount Fuji", "Japan", "Honshu"]
    assert [e.name for e in doc.extractions[1].entities] == ["Tokyo"]
    g = build_document_graph(doc)
    assert g.counts["segments"] == 2 and g.counts["entities"] == 4 and g.counts["relations"] == 1


def test_lightrag_nested_and_nano_graphrag_caches(tmp_path):
    old_prompt = ("-Steps-\n...Example Text:\n```\nexample\n```\n-Real Data-\n######################\n"
                  "Entity_types: [person]\nText:\nTokyo is the capital of Japan.\n######################\nOutput:")
    nested = {"default": {"h1": {"return": SECOND, "cache_type": "extract", "embedding": None,
                                 "original_prompt": old_prompt}},
              "global": {"h2": {"return": "answer", "cache_type": "query", "original_prompt": "q"}}}
    path = tmp_path / "nested.json"
    path.write_text(json.dumps(nested))
    r = read_records(path)
    assert r.ok and [s.text for s in r.document.segments] == ["Tokyo is the capital of Japan."]
    nano = {"h1": {"return": SECOND, "model": "gpt-4o-mini"},
            "h2": {"return": '```json\n{"title": "Community", "findings": []}\n```', "model": "gpt-4o-mini"}}
    path = tmp_path / "nano.json"
    path.write_text(json.dumps(nano))
    r = read_records(path)
    assert r.ok and r.stats.segments == 1
    assert r.document.segments[0].text == "Tokyo: Capital of Japan."  # no prompt: text from the records
    assert sorted(i.severity for i in r.issues) == ["skip", "warning"]
    other = tmp_path / "settings.json"
    other.write_text(json.dumps({"name": "x", "values": [1, 2]}))
    bad = read_records(other)
    assert bad.document is None and "not a response cache" in bad.errors[0].message
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert "invalid JSON" in read_records(broken).errors[0].message


def test_record_file_segments_and_unknown_dialect(tmp_path):
    path = tmp_path / "doc.records.txt"
    path.write_text(f"Mount Fuji is in Japan.\n<|RECORDS|>\n{FIRST}\n{SEGMENT_MARKER}\n{SECOND}\n"
                    f"{SEGMENT_MARKER}\nthe model wrote prose instead of records\n")
    r = read_records(path)
    assert r.ok and r.stats.segments == 2
    assert len(r.errors) == 1 and r.errors[0].message.startswith("segment 3: no recognisable extraction dialect")
    assert r.errors[0].file == "doc.records.txt"
    assert [s.text for s in r.document.segments] == ["Mount Fuji is in Japan.", "Tokyo: Capital of Japan."]
    unknown = tmp_path / "prose.records.txt"
    unknown.write_text("Just some prose.\n<|SEGMENT|>\nMore prose.")
    u = read_records(unknown)
    assert u.document is None and len(u.errors) == 3
    assert u.errors[-1].message.startswith("no extraction response in a recognisable dialect")


# -- dispatch and folders -------------------------------------------------------------------------

def test_read_path_follows_content_when_the_suffix_lies(tmp_path, report_pdf):
    fake_png = tmp_path / "report.png"
    fake_png.write_bytes(report_pdf.read_bytes())
    r = read_path(fake_png, render_pages=False, max_pixels=10)
    assert r.kind == "pdf" and r.ok and r.issues[0].severity == "warning" and "content" in r.issues[0].message
    fake_pdf = tmp_path / "photo.pdf"
    fake_pdf.write_bytes(save_astronaut(tmp_path / "p.png").read_bytes())
    assert read_path(fake_pdf).kind == "image"
    mentions = tmp_path / "about.md"
    mentions.write_text("# PDF files\nEvery PDF starts with %PDF-1.7 and ends with %%EOF.")
    assert read_path(mentions).kind == "text"
    junk = tmp_path / "junk-before-header.bin"
    junk.write_bytes(b"\x00\x01\x02" + report_pdf.read_bytes())
    junk_result = read_path(junk, render_pages=False)
    assert junk_result.kind == "pdf" and junk_result.ok, messages(junk_result)
    odd = tmp_path / "data.xyz"
    odd.write_text("?")
    assert read_path(odd).kind == "skipped"


def test_iter_folder_is_sorted_skips_and_reports(tmp_path, report_pdf):
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("x")
    (root / "b_report.pdf").write_bytes(report_pdf.read_bytes())
    save_astronaut(root / "a_photo.png")
    (root / "a_photo.txt").write_text("An astronaut.")
    (root / "a_photo.scene.txt").write_text("<object-0>: person, (0, 0, 1, 1)")
    (root / "orphan.scene.json").write_text("{}")
    (root / "sub" / "notes.md").write_text("# Notes\nText here.")
    (root / "sub" / "broken.pdf").write_bytes(b"%PDF-1.4 nothing else")
    (root / "zero.png").write_bytes(b"")
    (root / "readme.xyz").write_text("?")
    (root / ".hidden.txt").write_text("secret")
    results = list(iter_folder(root, render_pages=False, extract_images=False))
    got = [(r.doc_id, r.kind, r.ok) for r in results]
    assert got == [
        (".git", "skipped", False), (".hidden.txt", "skipped", False), ("a_photo.png", "image", True),
        ("a_photo.scene.txt", "skipped", False), ("a_photo.txt", "skipped", False), ("b_report.pdf", "pdf", True),
        ("orphan.scene.json", "skipped", False), ("readme.xyz", "skipped", False), ("sub/broken.pdf", "pdf", False),
        ("sub/notes.md", "text", True), ("zero.png", "image", False)]
    by_id = {r.doc_id: r for r in results}
    assert by_id["a_photo.png"].stats.sidecars == ["a_photo.txt", "a_photo.scene.txt"]
    assert by_id["a_photo.txt"].issues == [ReadIssue("a_photo.txt", "sidecar of a_photo.png; read with it", "skip")]
    assert "no image named orphan" in by_id["orphan.scene.json"].issues[0].message
    assert by_id[".git"].issues[0].message == "hidden folder; not entered"
    assert "cannot open as a PDF" in by_id["sub/broken.pdf"].errors[0].message
    assert by_id["zero.png"].errors[0].message == "empty file (0 bytes)"
    assert by_id["sub/notes.md"].document.doc_id == "sub/notes.md"
    flat = [r.doc_id for r in iter_folder(root, recursive=False, include_hidden=True)]
    assert ".hidden.txt" in flat and ".git/config" not in flat and "sub/notes.md" not in flat


def test_bad_arguments_raise_before_any_file_is_read(tmp_path, report_pdf):
    with pytest.raises(ValueError, match="scale"):
        read_pdf(report_pdf, scale=0)
    with pytest.raises(ValueError, match="sections"):
        read_pdf(report_pdf, sections="chapters")
    with pytest.raises(TypeError, match="unknown reader option"):
        read_path(report_pdf, dpi=300)
    with pytest.raises(ValueError, match="max_pixels"):
        list(iter_folder(tmp_path, max_pixels=0))
    with pytest.raises(ValueError, match="folder: not a directory"):
        list(iter_folder(tmp_path / "nope"))
    with pytest.raises(TypeError, match="path"):
        read_text(123)


# -- each reader's document builds and indexes ------------------------------------------------------

def test_documents_from_every_reader_build_and_index(tmp_path, report_pdf):
    img = save_astronaut(tmp_path / "astro.png", (64, 64))
    (tmp_path / "astro.caption.txt").write_text("Astronaut Eileen Collins in a NASA suit.")
    (tmp_path / "astro.scene.txt").write_text("<object-0>: person, (0.1, 0.1, 0.9, 1.0)\n"
                                              "<object-1>: flag, (0.0, 0.0, 0.3, 0.4)\n"
                                              "<relation-0>: <object-0> beside <object-1>")
    md = tmp_path / "fuji.md"
    md.write_text(MARKDOWN)
    records = tmp_path / "fuji.records.txt"
    records.write_text(f"Mount Fuji is in Japan.\n<|RECORDS|>\n{FIRST}")
    docs = [read_pdf(report_pdf, scale=0.25).document, read_image(img).document, read_text(md).document,
            read_records(records).document]
    graphs = [build_document_graph(d) for d in docs]
    pdf_g, img_g, md_g, rec_g = graphs
    assert pdf_g.counts["images"] == 3 and pdf_g.counts["segments"] == 2
    sources = [pdf_g.node_source[v] for v in pdf_g.nodes_of(NodeKind.IMAGE)]
    assert sources[1].startswith("report.pdf page 1, box (0.2")
    assert img_g.counts["regions"] == 2 and img_g.edges_of(EdgeKind.SCENE).size == 1
    assert md_g.counts["tables"] == 1 and md_g.counts["entities"] > 0
    assert rec_g.counts["entities"] == 2 and rec_g.counts["relations"] == 1
    index = KnowledgeIndex(ENC)
    index.add_documents(docs)
    assert sorted(index.documents) == sorted(d.doc_id for d in docs)
    for store in ("segment", "entity", "image", "region"):
        assert index.stores[store].ids.numel() > 0, store
