"""Page mapping helpers of benchmarks/pipeline_quality.py on a PDF generated here (no shared data)."""
from __future__ import annotations

import ctypes
import importlib.util
import pathlib

import pytest

pytest.importorskip("pypdfium2")

from colgraph_engine.eval.pdf import render_pdf  # noqa: E402
from colgraph_engine.graph.kinds import NodeKind  # noqa: E402
from colgraph_engine.kg import Encoders, KnowledgeIndex, build_document_graph  # noqa: E402
from colgraph_engine.pipeline import Pipeline  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEXTS = ["Alpha Station reports the Nile River basin in 2019.", "",
         "Beta Labs measured the Nile River flow with Gamma Sensors.", "Delta Council approved the Alpha Station budget."]


@pytest.fixture(scope="module")
def pq():
    spec = importlib.util.spec_from_file_location("pipeline_quality", ROOT / "benchmarks" / "pipeline_quality.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_pdf(path, texts, size=(400, 200)):
    import pypdfium2 as pdfium
    from pypdfium2 import raw

    pdf = pdfium.PdfDocument.new()
    try:
        for text in texts:
            page = pdf.new_page(*size)
            if text:
                obj = raw.FPDFPageObj_NewTextObj(pdf.raw, b"Helvetica", 10.0)
                buf = ctypes.create_string_buffer((text + "\x00").encode("utf-16-le"))
                assert raw.FPDFText_SetText(obj, ctypes.cast(buf, raw.FPDF_WIDESTRING))
                raw.FPDFPageObj_Transform(obj, 1, 0, 0, 1, 10, size[1] - 40)
                raw.FPDFPage_InsertObject(page.raw, obj)
                page.gen_content()
            page.close()
        pdf.save(path)
    finally:
        pdf.close()
    return path


def test_page_names(pq):
    assert pq.page_image_name(7) == "page-7"
    assert pq.page_of_image("page-7") == 7
    for bad in ("page-0", "page-", "page-x", "img-3", None, "page-3a"):
        assert pq.page_of_image(bad) is None


def test_segments_map_to_kept_pages(pq, tmp_path):
    path = write_pdf(tmp_path / "doc.pdf", TEXTS)
    pages = render_pdf(path, scale=0.25, pages=[1, 2, 4])  # page 2 is blank; page 3 not kept
    graph = build_document_graph(pq.page_document("doc.pdf", pages))
    assert graph.counts["segments"] == 3 and graph.counts["images"] == 3  # a blank page keeps its segment
    assert pq.segment_pages(graph) == {0: 1, 1: 2, 2: 4}
    assert graph.node_text[graph.nodes_of(NodeKind.IMAGE)[0]] == "Alpha Station reports the Nile River basin in 2019."  # image caption


def test_evidence_pages_of_a_result(pq, tmp_path):
    path = write_pdf(tmp_path / "doc.pdf", TEXTS)
    pages = render_pdf(path, scale=0.25)
    encoders = Encoders.offline()
    index = KnowledgeIndex(encoders)
    index.add_document(pq.page_document("doc.pdf", pages))
    result = Pipeline(index, encoders).retrieve("Who measured the Nile River flow?")
    node_pages = pq.NodePages(index)
    merged, sources, images = pq.evidence_pages(result, node_pages)
    assert set(merged) == set(sources) | set(images) and len(merged) == len(set(merged))
    assert all(doc == "doc.pdf" and 1 <= p <= 4 for doc, p in merged)
    assert [(s["doc_id"], int(s["name"].split("-")[1]) + 1) for s in result.evidence.sources
            if s["kind"] == "segment"] == sources[:len(result.evidence.sources)]
    assert [(h.doc_id, pq.page_of_image(h.name)) for h in result.images] == images
    # interleaving: the first two pages are the best source and the best image
    assert merged[0] == sources[0]
    assert merged[1] == images[0] or images[0] == sources[0]
