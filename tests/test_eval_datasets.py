"""PDF pages and dataset loaders on fixtures written into tmp_path (offline, no shared data).

pypdfium2 comes with the test extra; the PDFs are built here, one with a real text layer.
"""
from __future__ import annotations

import ctypes
import gzip
import json
from types import SimpleNamespace

import pytest
from PIL import Image, ImageDraw

from colgraph_engine.eval import datasets as ds_mod
from colgraph_engine.eval.datasets import load_beir, load_mmlongbench, load_mmqa
from colgraph_engine.eval.pdf import page_count, render_pdf

PAGE_TEXTS = ["Alpha page one talks about graphs", "Beta page two covers retrieval"]


def write_text_pdf(path, texts=PAGE_TEXTS, size=(300, 200)):
    """One page per string, each a Helvetica text object, so the PDF has a real text layer."""
    import pypdfium2 as pdfium
    from pypdfium2 import raw

    pdf = pdfium.PdfDocument.new()
    try:
        for text in texts:
            page = pdf.new_page(*size)
            obj = raw.FPDFPageObj_NewTextObj(pdf.raw, b"Helvetica", 12.0)
            buf = ctypes.create_string_buffer((text + "\x00").encode("utf-16-le"))
            assert raw.FPDFText_SetText(obj, ctypes.cast(buf, raw.FPDF_WIDESTRING))
            raw.FPDFPageObj_Transform(obj, 1, 0, 0, 1, 20, size[1] - 40)
            raw.FPDFPage_InsertObject(page.raw, obj)  # the page owns the object from here on
            page.gen_content()
            page.close()
        pdf.save(path)
    finally:
        pdf.close()
    return path


def write_image_pdf(path, n_pages=1, size=(200, 100)):
    """Image-only pages (no text layer) as PIL saves them; at 72 dpi a pixel is a point."""
    images = []
    for i in range(n_pages):
        im = Image.new("RGB", size, "white")
        ImageDraw.Draw(im).rectangle((10, 10, 60 + 10 * i, 40), fill="black")
        images.append(im)
    images[0].save(path, "PDF", resolution=72.0, save_all=True, append_images=images[1:])
    return path


class FakeOcr:
    """Deterministic stand-in for RapidOcr: records the images it sees."""

    def __init__(self, text="scanned words from ocr"):
        self.text, self.seen = text, []

    def __call__(self, image):
        self.seen.append(image.size)
        return SimpleNamespace(text=self.text)


# --------------------------------------------------------------------------- render_pdf

def test_text_layer_pages_and_sizes(tmp_path):
    path = write_text_pdf(tmp_path / "doc.pdf")
    assert page_count(path) == 2
    pages = render_pdf(path, scale=2.0)
    assert [p.number for p in pages] == [1, 2]
    for page, text in zip(pages, PAGE_TEXTS):
        assert page.doc_id == "doc.pdf"
        assert page.text.strip() == text
        assert page.text_source == "layer"
        assert (page.width, page.height) == (300.0, 200.0)
        assert page.image.mode == "RGB" and page.image.size == (600, 400)
        assert page.image.getextrema() != ((255, 255),) * 3  # the text was drawn


def test_page_selection_and_no_images(tmp_path):
    path = write_text_pdf(tmp_path / "doc.pdf")
    pages = render_pdf(path, pages=[2], with_images=False)
    assert len(pages) == 1 and pages[0].number == 2 and pages[0].image is None
    assert "Beta" in pages[0].text
    with pytest.raises(ValueError, match="pages"):
        render_pdf(path, pages=[3])
    with pytest.raises(ValueError, match="pages"):
        render_pdf(path, pages=[0])


def test_image_only_pdf_uses_ocr_fallback(tmp_path):
    path = write_image_pdf(tmp_path / "scan.pdf", n_pages=2)
    plain = render_pdf(path)
    assert [p.text_source for p in plain] == ["none", "none"]
    assert all(p.text.strip() == "" for p in plain)
    assert plain[0].image.size == (200, 100)

    ocr = FakeOcr()
    pages = render_pdf(path, ocr=ocr, with_images=False, ocr_scale=1.5)
    assert [p.text_source for p in pages] == ["ocr", "ocr"]
    assert all(p.text == ocr.text and p.image is None for p in pages)
    assert ocr.seen == [(300, 150), (300, 150)]  # rendered for OCR at ocr_scale even without images


def test_ocr_only_below_threshold(tmp_path):
    path = write_text_pdf(tmp_path / "doc.pdf")
    ocr = FakeOcr()
    pages = render_pdf(path, ocr=ocr)  # layers hold more than 20 characters
    assert ocr.seen == [] and {p.text_source for p in pages} == {"layer"}

    longer = FakeOcr("x" * 100)
    pages = render_pdf(path, ocr=longer, min_text_chars=1000, pages=[1])
    assert pages[0].text_source == "ocr" and pages[0].text == "x" * 100
    shorter = FakeOcr("tiny")  # OCR with fewer characters than the layer does not replace it
    pages = render_pdf(path, ocr=shorter, min_text_chars=1000, pages=[1])
    assert shorter.seen and pages[0].text_source == "layer"

    with pytest.raises(TypeError, match="ocr"):
        render_pdf(path, ocr=lambda im: 42, min_text_chars=1000)


def test_render_pdf_bad_input(tmp_path):
    missing = tmp_path / "missing.pdf"
    with pytest.raises(FileNotFoundError, match="missing.pdf"):
        render_pdf(missing)
    not_pdf = tmp_path / "notes.pdf"
    not_pdf.write_text("this is not a pdf")
    with pytest.raises(ValueError, match="notes.pdf"):
        render_pdf(not_pdf)
    with pytest.raises(ValueError, match="notes.pdf"):
        page_count(not_pdf)
    good = write_text_pdf(tmp_path / "doc.pdf")
    with pytest.raises(ValueError, match="scale"):
        render_pdf(good, scale=0)
    with pytest.raises(ValueError, match="min_text_chars"):
        render_pdf(good, min_text_chars=-1)
    with pytest.raises(TypeError, match="ocr"):
        render_pdf(good, ocr="rapidocr")
    with pytest.raises(TypeError, match="path"):
        render_pdf(3)


# --------------------------------------------------------------------------- MMLongBench

def sample(doc_id, pages, answer="yes", sources="['Chart', 'Table']", **extra):
    return {"doc_id": doc_id, "question": f"q on {doc_id} {pages}", "answer": answer,
            "evidence_pages": pages, "evidence_sources": sources, "answer_format": "Str", **extra}


def make_mmlongbench(root, samples, page_counts=None):
    (root / "documents").mkdir(parents=True)
    write_text_pdf(root / "documents" / "report.pdf")  # 2 pages
    write_image_pdf(root / "documents" / "scan.pdf")  # 1 page
    (root / "samples.json").write_text(json.dumps(samples))
    if page_counts is not None:
        (root / "page_counts.json").write_text(json.dumps(page_counts))
    return root


SAMPLES = [
    sample("report.pdf", "[1]", doc_type="Research report"),
    sample("report.pdf", "[3, 4]", answer=3),  # past the last page of a 2-page document
    sample("report.pdf", "[0, 2, 2]", sources="[]"),  # a 0 label and a duplicate
    sample("scan.pdf", "[]", answer="Not answerable", sources=""),
    sample("scan.pdf", "[1]", sources="['Pure-text (Plain-text)']"),
]


def test_mmlongbench_parsing_and_skips(tmp_path):
    root = make_mmlongbench(tmp_path / "mmlb", SAMPLES)
    ds = load_mmlongbench(root)
    assert len(ds) == 5
    assert ds.doc_ids == ("report.pdf", "scan.pdf")
    assert ds.page_counts == {"report.pdf": 2, "scan.pdf": 1}  # read from the PDFs
    assert ds.skipped == {"page_zero": 1, "past_last_page": 2, "duplicate": 1}

    q = ds.questions
    assert [x.qid for x in q] == ["report.pdf#0", "report.pdf#1", "report.pdf#2", "scan.pdf#3", "scan.pdf#4"]
    assert q[0].evidence_pages == (1,) and q[0].evidence_sources == ("Chart", "Table")
    assert q[0].answerable and q[0].doc_type == "Research report" and q[0].answer_format == "Str"
    assert q[1].evidence_pages == () and not q[1].answerable and q[1].answer == "3"
    assert q[2].evidence_pages == (2,) and q[2].evidence_sources == ()
    assert q[3].answer == "Not answerable" and not q[3].answerable and q[3].evidence_sources == ()
    assert q[4].evidence_sources == ("Pure-text (Plain-text)",)
    assert ds.questions_for("scan.pdf") == (q[3], q[4])


def test_mmlongbench_page_counts_file_and_filter(tmp_path):
    root = make_mmlongbench(tmp_path / "mmlb", SAMPLES, page_counts={"report.pdf": 4})
    ds = load_mmlongbench(root, doc_ids=["report.pdf"])
    assert ds.doc_ids == ("report.pdf",) and len(ds) == 3
    assert ds.page_counts == {"report.pdf": 4}  # the file wins over the PDF
    assert ds.questions[1].evidence_pages == (3, 4)
    assert ds.skipped == {"page_zero": 1, "past_last_page": 0, "duplicate": 1}
    with pytest.raises(ValueError, match="doc_ids"):
        load_mmlongbench(root, doc_ids=["other.pdf"])


def test_mmlongbench_pages_are_lazy(tmp_path, monkeypatch):
    root = make_mmlongbench(tmp_path / "mmlb", SAMPLES)

    def no_render(*a, **k):
        raise AssertionError("rendered at load")

    monkeypatch.setattr(ds_mod, "render_pdf", no_render)
    ds = load_mmlongbench(root, render=True, scale=0.5, ocr=FakeOcr())
    monkeypatch.undo()

    pages = ds.pages("report.pdf")
    assert [p.number for p in pages] == [1, 2]
    assert pages[0].image.size == (150, 100) and pages[0].text_source == "layer"
    scan = ds.pages("scan.pdf")
    assert scan[0].text_source == "ocr" and scan[0].text == FakeOcr().text
    text_only = load_mmlongbench(root).pages("report.pdf", pages=[2])
    assert text_only[0].image is None and "Beta" in text_only[0].text
    with pytest.raises(KeyError, match="nope.pdf"):
        ds.pages("nope.pdf")


def test_mmlongbench_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="absent"):
        load_mmlongbench(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="samples.json"):
        load_mmlongbench(tmp_path / "empty")

    root = make_mmlongbench(tmp_path / "a", [sample("lost.pdf", "[1]")])
    with pytest.raises(FileNotFoundError, match="lost.pdf"):
        load_mmlongbench(root)

    bad_cases = [
        (sample("report.pdf", "[1"), r"entry 1: field 'evidence_pages'"),
        (sample("report.pdf", "[1.5]"), r"entry 1: field 'evidence_pages'"),
        (sample("report.pdf", "[-1]"), r"entry 1: field 'evidence_pages'"),
        (sample("report.pdf", "5"), r"entry 1: field 'evidence_pages'"),
        (sample("report.pdf", "[1]", sources="['Chart'"), r"entry 1: field 'evidence_sources'"),
        (sample("report.pdf", "[1]", answer=None), r"entry 1: field 'answer'"),
        ({"doc_id": "report.pdf", "answer": "a", "evidence_pages": "[1]"}, r"entry 1: missing field 'question'"),
        (sample("../report.pdf", "[1]"), r"entry 1: field 'doc_id'"),
        ("not a dict", r"entry 1"),
    ]
    for k, (bad, pattern) in enumerate(bad_cases):
        root = make_mmlongbench(tmp_path / f"bad{k}", [SAMPLES[0], bad])
        with pytest.raises(ValueError, match=pattern):
            load_mmlongbench(root)

    root = make_mmlongbench(tmp_path / "counts", SAMPLES, page_counts={"report.pdf": "2"})
    with pytest.raises(ValueError, match="page_counts.json"):
        load_mmlongbench(root)
    with pytest.raises(ValueError, match="scale"):
        load_mmlongbench(root, scale=-1)


# --------------------------------------------------------------------------- MultimodalQA

def write_gz_lines(path, rows):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path


MMQA_ROWS = [
    {"qid": "q1", "question": "Which film?",
     "answers": [{"answer": "Mask", "type": "string", "modality": "table"}],
     "metadata": {"type": "TableQ", "modalities": ["table"], "image_doc_ids": ["i1", "i2"],
                  "text_doc_ids": ["t1"], "table_id": "tab1"},
     "supporting_context": [{"doc_id": "tab1", "doc_part": "table"}]},
    {"qid": "q2", "question": "How many?", "answers": [{"answer": 300.0}, {"answer": 1.5}],
     "supporting_context": [{"doc_id": "t9", "doc_part": "text"}, {"doc_id": "i9", "doc_part": "image"}]},
]


def test_mmqa_questions_and_images(tmp_path):
    qpath = write_gz_lines(tmp_path / "MMQA_dev.jsonl.gz", [MMQA_ROWS[0], "", MMQA_ROWS[1]])
    ipath = write_gz_lines(tmp_path / "MMQA_images.jsonl.gz", [
        {"id": "i1", "title": "Ben Piazza", "path": "i1.jpg", "url": "u"}, {"id": "i2"}])
    data = load_mmqa(qpath, ipath)
    assert len(data) == 2
    q1, q2 = data.questions
    assert q1.qid == "q1" and q1.answers == ("Mask",) and q1.supporting == (("tab1", "table"),)
    assert q1.image_doc_ids == ("i1", "i2") and q1.text_doc_ids == ("t1",) and q1.table_id == "tab1"
    assert q1.modalities == ("table",) and q1.qtype == "TableQ"
    # optional keys missing: empty defaults, modalities from the supporting parts
    assert q2.answers == ("300", "1.5") and q2.table_id is None and q2.image_doc_ids == ()
    assert q2.modalities == ("text", "image") and q2.qtype == ""
    assert data.images == {"i1": ("Ben Piazza", "i1.jpg"), "i2": ("", "")}
    assert load_mmqa(qpath).images == {}


def test_mmqa_plain_jsonl_and_errors(tmp_path):
    plain = tmp_path / "dev.jsonl"
    plain.write_text(json.dumps(MMQA_ROWS[0]) + "\n")
    assert load_mmqa(plain).questions[0].qid == "q1"

    with pytest.raises(FileNotFoundError, match="nothing.jsonl.gz"):
        load_mmqa(tmp_path / "nothing.jsonl.gz")
    bad = write_gz_lines(tmp_path / "noqid.jsonl.gz", [MMQA_ROWS[0], {"question": "no id"}])
    with pytest.raises(ValueError, match=r"line 2: .*'qid'"):
        load_mmqa(bad)
    bad = write_gz_lines(tmp_path / "noquestion.jsonl.gz", [{"qid": "x"}])
    with pytest.raises(ValueError, match=r"line 1: .*'question'"):
        load_mmqa(bad)
    bad = write_gz_lines(tmp_path / "json.jsonl.gz", [MMQA_ROWS[0], "{broken"])
    with pytest.raises(ValueError, match="line 2: invalid JSON"):
        load_mmqa(bad)
    bad = write_gz_lines(tmp_path / "dup.jsonl.gz", [MMQA_ROWS[0], MMQA_ROWS[0]])
    with pytest.raises(ValueError, match="line 2: duplicate qid"):
        load_mmqa(bad)
    good = write_gz_lines(tmp_path / "good.jsonl.gz", MMQA_ROWS)
    bad_images = write_gz_lines(tmp_path / "img.jsonl.gz", [{"id": "i1"}, {"title": "no id"}])
    with pytest.raises(ValueError, match=r"img.jsonl.gz: line 2"):
        load_mmqa(good, bad_images)


# --------------------------------------------------------------------------- BEIR

def make_beir(folder, qrels_lines, split="test"):
    (folder / "qrels").mkdir(parents=True)
    corpus = [{"_id": "d1", "title": "Graphs", "text": "about graphs"},
              {"_id": "d2", "text": "about images", "image": "images/d2.png"},
              {"_id": 3, "title": "numeric id"}]
    (folder / "corpus.jsonl").write_text("\n".join(json.dumps(c) for c in corpus) + "\n")
    (folder / "queries.jsonl").write_text(
        json.dumps({"_id": "q1", "text": "what about graphs"}) + "\n"
        + json.dumps({"_id": "q2", "text": "what about images"}) + "\n")
    (folder / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        line + "\n" for line in qrels_lines))
    return folder


def test_beir_folder(tmp_path):
    folder = make_beir(tmp_path / "beir", ["q1\td1\t1", "q1\t3\t0", "q2\td2\t2"])
    data = load_beir(folder)
    assert set(data.corpus) == {"d1", "d2", "3"}
    assert data.corpus["d1"] == {"title": "Graphs", "text": "about graphs"}
    assert data.corpus["d2"]["image"] == str(folder / "images" / "d2.png")
    assert data.queries == {"q1": "what about graphs", "q2": "what about images"}
    assert data.qrels == {"q1": {"d1": 1, "3": 0}, "q2": {"d2": 2}}
    assert data.split == "test"


def test_beir_errors(tmp_path):
    folder = make_beir(tmp_path / "beir", ["q1\td1\t1", "q1\tghost\t1"])
    with pytest.raises(ValueError, match=r"test.tsv: line 3: unknown corpus id 'ghost'"):
        load_beir(folder)
    folder = make_beir(tmp_path / "beir2", ["q9\td1\t1"])
    with pytest.raises(ValueError, match=r"test.tsv: line 2: unknown query id 'q9'"):
        load_beir(folder)
    folder = make_beir(tmp_path / "beir3", ["q1\td1"])
    with pytest.raises(ValueError, match=r"test.tsv: line 2: expected 3"):
        load_beir(folder)
    folder = make_beir(tmp_path / "beir4", ["q1\td1\thigh"])
    with pytest.raises(ValueError, match=r"test.tsv: line 2: score"):
        load_beir(folder)
    with pytest.raises(FileNotFoundError, match="dev.tsv"):
        load_beir(folder, split="dev")
    (folder / "queries.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="queries.jsonl"):
        load_beir(folder)
    folder = make_beir(tmp_path / "beir5", [])
    with open(folder / "corpus.jsonl", "a") as f:
        f.write(json.dumps({"_id": "d1"}) + "\n")
    with pytest.raises(ValueError, match=r"corpus.jsonl: line 4: duplicate _id 'd1'"):
        load_beir(folder)
