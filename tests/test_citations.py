"""Citations to the page (issue 24, item 4): every source, record, entity, relation, image and
context line carries its document, pages and (images, regions) box, from a real multi-page PDF
written here with pypdfium2 (text objects) and matplotlib (an embedded picture)."""
from __future__ import annotations

import ctypes
import json

import numpy as np
import pytest

from colgraph_engine.graph.kinds import NodeKind
from colgraph_engine.ingest.readers import read_pdf
from colgraph_engine.kg import DocumentInput, Encoders, ImageInput, KnowledgeIndex, Section, build_document_graph
from colgraph_engine.kg.pages import page_runs, page_source, parse_page_source
from colgraph_engine.pipeline import Pipeline, PipelineConfig
from colgraph_engine.pipeline.citations import Citation, Citer

ENC = Encoders.offline(text_dim=64, patch_grid=4, patch_cell=2)
PAGES = [["Harbour report.", "The Velmora ferry leaves at nine every morning."],
         ["Kestrel Dynamics builds ships in Velmora Harbour.", "Its shipyard employs 400 people."],
         ["Weather notes: the bay freezes in January."]]
QUESTION = "Who builds ships in Velmora Harbour?"  # the answer is on page 2


def write_pdf(path, pages, size=(400, 300)):
    """One page per list of lines, each line a Helvetica text object (a real text layer)."""
    import pypdfium2 as pdfium
    from pypdfium2 import raw

    pdf = pdfium.PdfDocument.new()
    try:
        for lines in pages:
            page = pdf.new_page(*size)
            for k, text in enumerate(lines):
                obj = raw.FPDFPageObj_NewTextObj(pdf.raw, b"Helvetica", 10.0)
                buf = ctypes.create_string_buffer((text + "\x00").encode("utf-16-le"))
                assert raw.FPDFText_SetText(obj, ctypes.cast(buf, raw.FPDF_WIDESTRING))
                raw.FPDFPageObj_Transform(obj, 1, 0, 0, 1, 10, size[1] - 40 - 14 * k)
                raw.FPDFPage_InsertObject(page.raw, obj)
            page.gen_content()
            page.close()
        pdf.save(str(path))
    finally:
        pdf.close()
    return path


def picture_pdf(path):
    """Two pages with a text layer; page 2 also holds a picture in its lower half."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_pdf import PdfPages

    plt.rcParams["pdf.fonttype"] = 42
    with PdfPages(path) as pdf:
        for p in range(2):
            fig = plt.figure(figsize=(4, 5))
            fig.text(0.1, 0.9, f"Page {p + 1}: the lighthouse of Velmora Harbour.", fontsize=9)
            if p == 1:
                ax = fig.add_axes([0.2, 0.1, 0.5, 0.4])
                ax.imshow(np.random.default_rng(0).integers(0, 255, (40, 50, 3), dtype=np.uint8), aspect="auto")
                ax.axis("off")
            pdf.savefig(fig)
            plt.close(fig)
    return path


@pytest.fixture(scope="module")
def pdf_index(tmp_path_factory):
    root = tmp_path_factory.mktemp("cite")
    path = write_pdf(root / "harbour.pdf", PAGES)
    index = KnowledgeIndex.create(root / "index", ENC)
    index.add_documents([read_pdf(path, sections="headings").document])
    return KnowledgeIndex.open(root / "index", ENC)


def test_page_sources_round_trip_and_reject_what_is_no_page():
    assert page_runs([5, 3, 4, 7, 3]) == "3-5, 7"
    assert page_source("r.pdf", []) == "" and page_source("r.pdf", [2]) == "r.pdf page 2"
    assert page_source("my page 3.pdf", [4, 5, 9]) == "my page 3.pdf pages 4-5, 9"
    assert parse_page_source("my page 3.pdf pages 4-5, 9") == ((4, 5, 9), None)
    assert parse_page_source("r.pdf page 3, box (0.100, 0.200, 0.550, 0.600)") == ((3,), (0.1, 0.2, 0.55, 0.6))
    for no_page in ("", "/data/page 3/photo.png", "r.pdf page 0", "r.pdf pages 5-2", "r.pdf page x"):
        assert parse_page_source(no_page) == ((), None), no_page
    assert parse_page_source("r.pdf page 3, box (0.5, 0.2, 0.1, 0.6)") == ((3,), None)  # not a box
    with pytest.raises(TypeError, match="source"):
        parse_page_source(None)


def test_segments_record_the_pages_of_their_sections():
    doc = DocumentInput("r.pdf", sections=[Section("One.", page=1), Section("Two.", page=2), Section("Three.", page=4)])
    g = build_document_graph(doc, max_tokens=2)
    segs = g.nodes_of(NodeKind.SEGMENT).tolist()
    assert [g.node_source[v] for v in segs] == ["r.pdf pages 1-2", "r.pdf page 4"]
    plain = build_document_graph(DocumentInput("t.txt", sections=["No pages here."]))
    assert [plain.node_source[v] for v in plain.nodes_of(NodeKind.SEGMENT)] == [""]


def pages_naming(name: str) -> set[int]:
    """The pages of PAGES whose text holds `name` (case folded)."""
    return {p for p, lines in enumerate(PAGES, start=1) if name.casefold() in " ".join(lines).casefold()}


@pytest.mark.parametrize("retrieval", ["graph", PipelineConfig().retrieval])
def test_a_question_answered_on_page_2_cites_page_2(pdf_index, retrieval):
    r = Pipeline(pdf_index, ENC, PipelineConfig(kd=1, retrieval=retrieval)).retrieve(QUESTION)
    ev = r.evidence
    top = ev.sources[0]
    assert "Kestrel Dynamics" in top["text"] and top["pages"] == [2] and top["cite"] == "[harbour.pdf p.2]"
    assert top["box"] is None and top["doc_id"] == "harbour.pdf"
    by_page = {s["text"].split()[0]: s["pages"] for s in ev.sources}
    assert by_page["Harbour"] == [1] and by_page["Weather"] == [3]
    # entities and relations cite the pages of the segments they were extracted from: here one
    # segment per page, so pages whose text names them
    for e in ev.entities:
        assert e["pages"] and e["cite"] == f"[harbour.pdf p.{page_runs(e['pages']).replace(', ', ',')}]"
        if pages_naming(e["name"]):
            assert set(e["pages"]) <= pages_naming(e["name"]), e
    for x in ev.relations:
        assert x["pages"] and set(x["pages"]) <= pages_naming(x["source"]) | pages_naming(x["target"]), x
    if retrieval == "graph":  # mKG-RAG's graph retrieval keeps the entities of page 2
        assert [e["pages"] for e in ev.entities if "Kestrel" in e["name"]] == [[2]]
        assert any("Kestrel" in x["source"] + x["target"] and x["pages"] == [2] for x in ev.relations)
    for rec in ev.records:  # every record cites the pages its segments or image are on
        assert rec.pages and set(rec.pages) <= {1, 2, 3}
        if rec.source == "image":
            assert rec.box == (0.0, 0.0, 1.0, 1.0) and rec.pages == (int(rec.image.split("-")[1]),)
    page2 = next(h for h in r.images if h.image == "page-2")
    assert page2.pages == (2,) and page2.box == (0.0, 0.0, 1.0, 1.0) and page2.cite == "[harbour.pdf p.2]"
    # every rendered context line opens with its citation
    lines = [json.loads(line) for line in r.context.render().splitlines() if line.startswith("{")]
    assert lines and all(list(x)[0] == "cite" and x["cite"].startswith("[harbour.pdf p.") for x in lines)
    assert any(x.get("content", "").startswith("Kestrel") and x["cite"] == "[harbour.pdf p.2]" for x in lines)
    # as_dict (what the service returns) carries them too
    d = r.as_dict()
    assert d["evidence"]["sources"][0]["pages"] == [2] and d["images"][0]["pages"]
    assert all(set(rec) >= {"doc_id", "pages", "box"} for rec in d["evidence"]["records"])


def test_embedded_images_and_regions_cite_their_box_on_the_page(tmp_path):
    doc = read_pdf(picture_pdf(tmp_path / "light.pdf"), sections="pages").document
    embedded = [im for im in doc.images if "-image-" in im.ref]
    assert [im.ref for im in embedded] == ["page-2-image-1"]
    pages, box = parse_page_source(embedded[0].source)
    assert pages == (2,) and box is not None and box[1] > 0.4  # the lower half of the page
    # a region of that image: its box (in the image) mapped onto the page
    sg = "<object-1>: lamp, (0.00, 0.00, 0.50, 0.50)"
    doc = DocumentInput(doc.doc_id, doc.sections, title=doc.title,
                        images=[im if im.ref != "page-2-image-1" else ImageInput(im.ref, im.pixels, sg, source=im.source)
                                for im in doc.images])
    index = KnowledgeIndex.create(tmp_path / "index", ENC)
    index.add_documents([doc])
    index = KnowledgeIndex.open(tmp_path / "index", ENC)
    citer = Citer(index)
    kinds = index.graph.node_kind
    names = {index.describe_node(v)["name"]: v for v in range(kinds.size)}
    image = citer.node(names["page-2-image-1"])
    assert image.pages == (2,) and image.box == pytest.approx(box) and image.image == "page-2-image-1"
    region = citer.node(next(v for v in range(kinds.size) if kinds[v] == NodeKind.REGION))
    w, h = box[2] - box[0], box[3] - box[1]
    assert region.pages == (2,) and region.box == pytest.approx((box[0], box[1], box[0] + w / 2, box[1] + h / 2))
    assert region.label() == "[light.pdf p.2 box (" + ", ".join(f"{x:.2f}" for x in region.box) + ")]"
    assert citer.node(names["page-1"]).label() == "[light.pdf p.1]"  # a whole page: no box written


def test_an_index_without_segment_pages_still_opens_and_cites_what_it_can(tmp_path):
    """Indexes written before segments recorded pages: their segment sources are empty; a
    segment cites the pages of the page images it holds, others no page."""
    doc = DocumentInput("old.pdf", sections=[Section("Kestrel Dynamics builds ships.", images=("page-2",)),
                                             Section("A note without a page image.")],
                        images=[ImageInput("page-2", source="old.pdf page 2")])
    g = build_document_graph(doc)
    segs = g.nodes_of(NodeKind.SEGMENT).tolist()
    assert [g.node_source[v] for v in segs] == ["", ""]  # as an old index stored them
    index = KnowledgeIndex.create(tmp_path / "index", ENC)
    index.add_documents([doc])
    index = KnowledgeIndex.open(tmp_path / "index", ENC)
    r = Pipeline(index, ENC, PipelineConfig(kd=1)).retrieve("Who builds ships?")
    pages = {s["text"].split()[0]: s["pages"] for s in r.evidence.sources}
    assert pages == {"Kestrel": [2], "A": []}
    assert Citation("old.pdf").label() == "[old.pdf]"


def test_images_off_any_page_name_the_image():
    c = Citation("cafe", (), (0.1, 0.2, 0.3, 0.4), "cup")
    assert c.label() == "[cafe cup box (0.10, 0.20, 0.30, 0.40)]"
    assert c.as_dict() == {"doc_id": "cafe", "pages": [], "box": [0.1, 0.2, 0.3, 0.4]}
    assert Citation("r.pdf", (2, 3, 7)).label() == "[r.pdf p.2-3,7]"


def test_the_service_returns_the_citations(pdf_index):
    from fastapi.testclient import TestClient

    from colgraph_engine.service import create_app

    with TestClient(create_app(pdf_index, ENC)) as c:
        r = c.post("/query", json={"question": QUESTION, "config": {"kd": 1, "retrieval": "graph"}})
        assert r.status_code == 200, r.text
        body = r.json()
    top = body["evidence"]["sources"][0]
    assert top["doc_id"] == "harbour.pdf" and top["pages"] == [2] and top["box"] is None
    assert top["cite"] == "[harbour.pdf p.2]"
    for section in ("entities", "relations", "sources", "records"):
        assert body["evidence"][section] and all({"doc_id", "pages", "box"} <= set(x) for x in body["evidence"][section])
    page2 = next(h for h in body["images"] if h["image"] == "page-2")
    assert page2["doc_id"] == "harbour.pdf" and page2["pages"] == [2] and page2["box"] == [0.0, 0.0, 1.0, 1.0]
    assert "[harbour.pdf p.2]" in body["context"]


def test_the_web_pages_segment_pages_are_the_recorded_ones(pdf_index):
    from colgraph_engine.service.views import segment_pages

    assert segment_pages(pdf_index.document("harbour.pdf")) == {0: [1], 1: [2], 2: [3]}
