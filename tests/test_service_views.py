"""The routes the web page reads (issue 27), in-process (starlette's TestClient): the page and its
static files without the token, the data routes behind it; GET /documents, a document's bounded
neighbourhood (/graph) and node list (/nodes), image thumbnails (files, in-memory pixels, PDF
pages and their embedded images re-rendered from an upload), and a query's ``view``."""
from __future__ import annotations

import dataclasses
import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from colgraph_engine.demos.corpus import _photo, demo_documents
from colgraph_engine.kg import Encoders, KnowledgeIndex
from colgraph_engine.demos import kg_data as kg_demo
from colgraph_engine.kg.document import DocumentInput
from colgraph_engine.kg.segment import Segment
from colgraph_engine.service import ServiceConfig, create_app
from colgraph_engine.service.app import STATIC
from colgraph_engine.service.views import segment_pages

ENC = Encoders.offline()
TOKEN = "v1ews-t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
QUESTION = "Which photo shows the mission patch on the astronaut's suit?"


def with_image_files(docs: list[DocumentInput], folder: Path) -> list[DocumentInput]:
    """The documents with their array images written as PNG files (as `colgraph index add` of a
    folder of photos would have them: the image node's source is the file)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for d in docs:
        images = []
        for im in d.images:
            if isinstance(im.pixels, np.ndarray):
                path = folder / f"{d.doc_id}-{im.ref}.png"
                Image.fromarray(im.pixels).save(path)
                im = dataclasses.replace(im, pixels=path)
            images.append(im)
        out.append(dataclasses.replace(d, images=images))
    return out


def big_document(doc_id: str = "big-graph", segments: int = 100, per: int = 99) -> DocumentInput:
    """A document of 1 + segments * (per + 1) nodes (10,001 by default): `per` entities a segment
    in a chain of relations, each segment's first entity linked to the previous segment's."""
    segs, extractions = [], []
    for s in range(segments):
        names = [f"Entity {s}-{j}" for j in range(per)]
        segs.append(Segment(f"Segment {s} names " + ", ".join(names[:5]) + ".", (), (s, s), 20))
        lines = [f"entity<|#|>{n}<|#|>concept<|#|>{n} is item {j} of segment {s}." for j, n in enumerate(names)]
        lines += [f"relation<|#|>{names[j]}<|#|>{names[j + 1]}<|#|>next<|#|>{names[j]} precedes {names[j + 1]}."
                  for j in range(per - 1)]
        if s:
            lines.append(f"relation<|#|>{names[0]}<|#|>Entity {s - 1}-0<|#|>follows<|#|>The chains are linked.")
        extractions.append("\n".join(lines) + "\n<|COMPLETE|>")
    return DocumentInput(doc_id, title="A graph of 10,001 nodes", segments=segs, extractions=extractions)


def pdf_bytes() -> bytes:
    """A two-page PDF with a text layer (matplotlib's PDF backend) and a photo on page 1."""
    import matplotlib
    matplotlib.use("pdf")
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_pdf import PdfPages

    buf = io.BytesIO()
    with PdfPages(buf) as pdf:
        fig = plt.figure(figsize=(8.27, 11.69))
        fig.text(0.1, 0.92, "Harbour report", fontsize=22, weight="bold")
        fig.text(0.1, 0.86, "The harbour cafe keeps a tabby cat called Chelsea. Chelsea sleeps by the window.",
                 fontsize=11)
        ax = fig.add_axes([0.1, 0.35, 0.6, 0.45])
        ax.imshow(_photo("chelsea"))
        ax.axis("off")
        pdf.savefig(fig)
        plt.close(fig)
        fig = plt.figure(figsize=(8.27, 11.69))
        fig.text(0.1, 0.92, "Rockets", fontsize=22, weight="bold")
        fig.text(0.1, 0.86, "Falcon rockets launch from the pad at Cape Canaveral for NASA missions.", fontsize=11)
        pdf.savefig(fig)
        plt.close(fig)
    return buf.getvalue()


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("views")
    index = KnowledgeIndex.create(root / "index", ENC)
    index.add_documents(with_image_files(demo_documents() + kg_demo.demo_documents(), root / "photos")
                        + [big_document(), DocumentInput("notes/a b.txt", sections=["Kalimtor has an observatory."])])
    return root / "index"


@pytest.fixture(scope="module")
def client(template):
    app = create_app(KnowledgeIndex.open(template, ENC), ENC, service=ServiceConfig(token=TOKEN, max_wait_ms=1.0))
    with TestClient(app) as c:
        yield c


# -- the page -----------------------------------------------------------------------------------

def test_the_page_and_its_files_are_served_without_the_token(client):
    for path in ("/", "/ui/documents"):
        r = client.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
        assert '<script type="module" src="/static/app.js">' in r.text
    shipped = sorted(p.name for p in STATIC.iterdir())
    assert {"index.html", "app.js", "documents.js", "graph.js", "dom.js", "style.css"} <= set(shipped)
    for name in shipped:
        r = client.get(f"/static/{name}")
        assert r.status_code == 200, name
        assert r.content == (STATIC / name).read_bytes()
    assert "javascript" in client.get("/static/app.js").headers["content-type"]
    # a path that climbs out of static/ is still the static mount's (and refused), never a data route
    assert client.get("/static/%2e%2e/app.py").status_code == 404
    assert client.get("/static/%2e%2e/documents").status_code == 404
    assert client.get("/static/nothing.js").status_code == 404


def test_no_external_asset_and_no_html_from_data_in_the_page():
    """Everything the page loads comes from the server, and index text is never parsed as HTML."""
    for f in STATIC.iterdir():
        text = f.read_text()
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text, f.name
        if f.suffix == ".js":
            code = re.sub(r"(^|\s)//.*$", "", text, flags=re.M)  # comments may name what the code avoids
            for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
                assert sink not in code, (f.name, sink)


def test_data_routes_need_the_token(client):
    for path in ("/documents", "/documents/fuji-ride/graph", "/documents/fuji-ride/nodes",
                 "/documents/fuji-ride/image?ref=ride-photo", "/info"):
        r = client.get(path)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", path
        assert client.get(path, headers=AUTH).status_code == 200, path
    assert client.post("/static/app.js").status_code == 401  # open for GET only
    assert client.post("/query", json={"question": QUESTION, "view": True}).status_code == 401


# -- GET /documents -----------------------------------------------------------------------------

def test_document_list_with_counts_and_pages(client, template):
    index = KnowledgeIndex.open(template, ENC)
    r = client.get("/documents", headers=AUTH)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["total"] == len(index) == 9 and body["offset"] == 0 and body["generation"] >= 1
    assert [d["doc_id"] for d in body["documents"]] == index.documents
    for d in body["documents"]:
        g = index.document(d["doc_id"])
        assert d["title"] == g.title
        assert all(d["counts"][k] == g.counts[k] for k in d["counts"])
    big = next(d for d in body["documents"] if d["doc_id"] == "big-graph")
    assert big["counts"]["nodes"] == 10_001 and big["counts"]["entities"] == 9_900
    page = client.get("/documents?offset=2&limit=3", headers=AUTH).json()
    assert [d["doc_id"] for d in page["documents"]] == index.documents[2:5] and page["total"] == 9
    assert client.get("/documents?offset=100", headers=AUTH).json()["documents"] == []
    for bad in ("limit=0", "limit=1001", "offset=-1", "limit=x"):
        r = client.get(f"/documents?{bad}", headers=AUTH)
        assert r.status_code == 422 and r.json()["detail"], bad


# -- a document's graph ---------------------------------------------------------------------------

def test_neighbourhood_is_bounded_on_a_graph_of_10001_nodes(client, template):
    g = KnowledgeIndex.open(template, ENC).document("big-graph")
    r = client.get("/documents/big-graph/graph", headers=AUTH)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["counts"]["nodes"] == 10_001 and body["center"] == 0 and body["hops"] == 2 and body["limit"] == 300
    assert len(body["nodes"]) == 300 and body["truncated"]
    ids = [n["id"] for n in body["nodes"]]
    assert len(set(ids)) == 300 and ids[0] == 0 and body["nodes"][0]["hop"] == 0
    assert all(0 <= n["hop"] <= 2 for n in body["nodes"])
    # breadth first: all 100 segments (hop 1) are in before any entity (hop 2)
    assert sum(n["hop"] == 1 for n in body["nodes"]) == 100 and {n["kind"] for n in body["nodes"][1:101]} == {"segment"}
    inside = set(ids)
    for e in body["edges"]:
        assert e["src"] in inside and e["dst"] in inside
        assert (int(g.edge_src[e["id"]]), int(g.edge_dst[e["id"]])) == (e["src"], e["dst"])
    degree = np.bincount(np.concatenate([g.edge_src, g.edge_dst]), minlength=g.n_nodes)
    drawn = np.bincount([x for e in body["edges"] for x in (e["src"], e["dst"])], minlength=g.n_nodes)
    for n in body["nodes"]:
        assert n["degree"] == degree[n["id"]] and n["hidden"] == degree[n["id"]] - drawn[n["id"]]
        assert n["name"] == g.node_name[n["id"]]
    # elsewhere, smaller, and bounded by every cap
    one = client.get("/documents/big-graph/graph?center=150&hops=1&limit=50", headers=AUTH).json()
    assert one["nodes"][0]["id"] == 150 and len(one["nodes"]) <= 50 and all(n["hop"] <= 1 for n in one["nodes"])
    assert one["nodes"][0]["name"] == g.node_name[150]
    few = client.get("/documents/big-graph/graph?limit=20&max_edges=5", headers=AUTH).json()
    assert len(few["nodes"]) == 20 and len(few["edges"]) <= 5 and few["truncated"]
    alone = client.get("/documents/big-graph/graph?center=7&hops=0", headers=AUTH).json()
    assert [n["id"] for n in alone["nodes"]] == [7] and alone["edges"] == [] and alone["truncated"]


def test_small_document_graph_whole_and_relation_labels(client, template):
    g = KnowledgeIndex.open(template, ENC).document("fuji-ride")
    body = client.get("/documents/fuji-ride/graph?hops=3&limit=1000", headers=AUTH).json()
    assert len(body["nodes"]) == g.n_nodes and len(body["edges"]) == g.n_edges and not body["truncated"]
    rel = [e for e in body["edges"] if e["kind"] == "relation"]
    assert rel and {e["label"] for e in rel} >= {"view, scenery"}
    regions = [n for n in body["nodes"] if n["kind"] == "region"]
    assert regions and all(n["image"] == "ride-photo" and len(n["bbox"]) == 4 for n in regions)


def test_graph_and_nodes_refuse_bad_requests(client):
    assert client.get("/documents/nowhere/graph", headers=AUTH).status_code == 404
    assert client.get("/documents/nowhere/nodes", headers=AUTH).status_code == 404
    r = client.get("/documents/fuji-ride/graph?center=11", headers=AUTH)
    assert r.status_code == 422 and "center" in r.json()["detail"]
    for bad in ("center=-1", "hops=4", "limit=0", "limit=1001", "max_edges=0"):
        assert client.get(f"/documents/fuji-ride/graph?{bad}", headers=AUTH).status_code == 422, bad
    for bad in ("kind=planet", "limit=501", "offset=-2", "match=" + "x" * 201):
        assert client.get(f"/documents/fuji-ride/nodes?{bad}", headers=AUTH).status_code == 422, bad


def test_document_ids_with_slashes_and_spaces(client):
    body = client.get("/documents/notes%2Fa%20b.txt/graph", headers=AUTH).json()
    assert body["doc_id"] == "notes/a b.txt" and body["nodes"][0]["kind"] == "document"
    assert client.get("/documents/notes/a b.txt/nodes", headers=AUTH).json()["doc_id"] == "notes/a b.txt"


def test_node_list_filters_and_pages(client, template):
    g = KnowledgeIndex.open(template, ENC).document("big-graph")
    body = client.get("/documents/big-graph/nodes", headers=AUTH).json()
    assert body["total"] == 10_001 and [n["id"] for n in body["nodes"]] == list(range(100))
    body = client.get("/documents/big-graph/nodes?offset=10000&limit=500", headers=AUTH).json()
    assert [n["id"] for n in body["nodes"]] == [10_000]
    body = client.get("/documents/big-graph/nodes?match=entity%2042-9&kind=entity&limit=500", headers=AUTH).json()
    want = [v for v in range(g.n_nodes) if "entity 42-9" in g.node_name[v].lower() and g.node_kind[v] == 2]
    assert body["total"] == len(want) == 10 and [n["id"] for n in body["nodes"]] == want
    segs = client.get("/documents/big-graph/nodes?kind=segment&limit=500", headers=AUTH).json()
    assert segs["total"] == 100 and {n["kind"] for n in segs["nodes"]} == {"segment"}


# -- thumbnails -----------------------------------------------------------------------------------

def jpeg(r) -> Image.Image:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "image/jpeg"
    im = Image.open(io.BytesIO(r.content))
    assert im.format == "JPEG"
    return im


def test_thumbnails_of_image_files(client):
    r = client.get("/documents/fuji-ride/image?ref=ride-photo", headers=AUTH)
    im = jpeg(r)
    assert im.size == (320, 240) and (r.headers["x-image-width"], r.headers["x-image-height"]) == ("320", "240")
    im = jpeg(client.get("/documents/harbour-cafe/image?ref=chelsea&size=100", headers=AUTH))
    assert max(im.size) == 100
    # the pixels are the image's (mean colour close to the original's)
    want = np.asarray(Image.fromarray(kg_demo.ride_photo()).resize((320, 240)), np.float32).mean((0, 1))
    got = np.asarray(jpeg(client.get("/documents/fuji-ride/image?ref=ride-photo", headers=AUTH)), np.float32).mean((0, 1))
    assert np.abs(want - got).max() < 4
    assert client.get("/documents/fuji-ride/image?ref=nothing", headers=AUTH).status_code == 404
    assert client.get("/documents/nowhere/image?ref=x", headers=AUTH).status_code == 404
    for bad in ("", "?ref=", "?ref=ride-photo&size=8", "?ref=ride-photo&size=2000"):
        assert client.get(f"/documents/fuji-ride/image{bad}", headers=AUTH).status_code == 422, bad


def test_thumbnails_of_in_memory_pixels_and_none_kept(tmp_path):
    index = KnowledgeIndex(ENC)  # in memory, served read-only: the arrays stay in this object
    index.add_documents(kg_demo.demo_documents())
    app = create_app(index, ENC)
    with TestClient(app) as c:
        assert jpeg(c.get("/documents/fuji-ride/image?ref=ride-photo")).size == (320, 240)
    index.save(tmp_path / "saved")
    app = create_app(KnowledgeIndex.open(tmp_path / "saved", ENC), ENC)  # opened: the pixels were never kept
    with TestClient(app) as c:
        r = c.get("/documents/fuji-ride/image?ref=ride-photo")
        assert r.status_code == 404 and "no pixels" in r.json()["detail"]


def test_pdf_upload_pages_and_embedded_images_and_citation_pages(template, tmp_path):
    index_dir = tmp_path / "index"
    shutil.copytree(template, index_dir)
    app = create_app(KnowledgeIndex.open(index_dir, ENC), ENC)
    with TestClient(app) as c:
        r = c.post("/documents", files=[("files", ("harbour.pdf", pdf_bytes(), "application/pdf"))])
        assert r.status_code == 200, r.text
        nodes = c.get("/documents/harbour.pdf/nodes?kind=image").json()["nodes"]
        refs = [n["name"] for n in nodes]
        assert refs == ["page-1", "page-1-image-1", "page-2"]
        page = jpeg(c.get("/documents/harbour.pdf/image?ref=page-1"))
        assert page.size[1] == 320 and 0.6 < page.size[0] / page.size[1] < 0.8  # A4 portrait
        photo = jpeg(c.get("/documents/harbour.pdf/image?ref=page-1-image-1"))
        assert photo.size[0] == 320 and photo.size[0] > photo.size[1]  # the cat, cut out of the page
        px = np.asarray(photo, np.float32)
        assert px.std() > 20  # a photo, not a white page
        # citations: the segments' pages
        r = c.post("/query", json={"question": "Where does the tabby cat Chelsea sleep?", "view": True,
                                   "config": {"kd": 2}})
        body = r.json()
        assert "harbour.pdf" in [d["doc_id"] for d in body["documents"]]
        assert body["view"]["pages"]["harbour.pdf"] == {"0": [1], "1": [2]}
        # the page's uploaded file is gone with its document: no pixels any more
        assert c.delete("/documents/harbour.pdf").status_code == 200
        assert c.get("/documents/harbour.pdf/image?ref=page-1").status_code == 404


def test_segment_pages_carry_on_across_segments():
    from colgraph_engine.kg.document import ImageInput, build_document_graph
    from colgraph_engine.kg.segment import Section

    doc = DocumentInput("r.pdf", sections=[Section("One.", images=("page-1",)), Section("Two."),
                                           Section("Three.", images=("page-2",))],
                        images=[ImageInput("page-1", source="r.pdf page 1"), ImageInput("page-2", source="r.pdf page 2")])
    g = build_document_graph(doc)
    pages = segment_pages(g)
    assert pages[0] == [1] and pages[max(pages)] == [2] and set(pages) == set(range(len(pages)))
    assert segment_pages(build_document_graph(DocumentInput("t", sections=["Plain text."]))) == {}


# -- the query answer's view ----------------------------------------------------------------------

def test_view_describes_the_subgraph_and_leaves_the_answer_unchanged(client, template):
    plain = client.post("/query", json={"question": QUESTION}, headers=AUTH).json()
    r = client.post("/query", json={"question": QUESTION, "view": True}, headers=AUTH)
    assert r.status_code == 200, r.text
    body = r.json()
    view = body.pop("view")
    assert "view" not in plain
    for d in (plain, body):
        d.pop("timings"), d.pop("batch")
    assert body == plain
    index = KnowledgeIndex.open(template, ENC)
    sub = dict(zip(body["subgraph"]["nodes"], body["subgraph"]["hops"]))
    ids = [n["id"] for n in view["nodes"]]
    assert len(ids) == len(set(ids)) and not view["truncated"] and view["subgraph_nodes"] == len(sub)
    assert set(sub) <= set(ids)
    hits = {h["node"] for h in body["images"]}
    assert hits <= set(ids)
    for n in view["nodes"]:
        d = index.describe_node(n["id"])
        assert (n["doc_id"], n["kind"], n["name"], n["local"]) == (d["doc_id"], d["kind"], d["name"], d["local"])
        assert n["hop"] == sub.get(n["id"])
        want = "seed" if sub.get(n["id"]) == 0 else "expanded" if n["id"] in sub else \
            "visual" if n["id"] in hits else "context"
        assert n["role"] == want
    for rank, h in enumerate(body["images"], start=1):
        n = next(x for x in view["nodes"] if x["id"] == h["node"])
        if n["role"] == "visual" or "visual_rank" in n:
            assert n["visual_rank"] <= rank
    inside = set(ids)
    assert view["edges"] and all(e["src"] in inside and e["dst"] in inside for e in view["edges"])
    for e in view["edges"]:
        d = index.describe_edge(e["id"])
        assert (d["src"], d["dst"], d["kind"]) == (e["src"], e["dst"], e["kind"])
        if e["kind"] == "relation":
            assert e["label"] == (d["keywords"] or "related to")
    # every region's image is drawn too
    for h in body["images"]:
        if h["kind"] == "region":
            assert any(n["kind"] == "image" and n["doc_id"] == h["doc_id"] and n["name"] == h["image"]
                       for n in view["nodes"])


def test_view_in_batches_and_multipart_and_the_cap(client):
    r = client.post("/query/batch", json={"queries": [{"question": QUESTION, "view": True}, {"question": QUESTION}]},
                    headers=AUTH)
    items = r.json()["results"]
    assert items[0]["result"]["view"]["nodes"] and "view" not in items[1]["result"]
    r = client.post("/query/form", data={"question": QUESTION, "view": "true"}, headers=AUTH)
    assert r.status_code == 200 and r.json()["view"]["nodes"]
    r = client.post("/query", json={"question": "Entity 42-7 precedes what?", "view": True,
                                    "config": {"hops": 3, "expansion_budget": 5000, "kg": 100}}, headers=AUTH)
    view = r.json()["view"]
    assert len([n for n in view["nodes"] if n["hop"] is not None]) <= 300
    assert view["truncated"] == (view["subgraph_nodes"] > 300)
    assert client.post("/query", json={"question": "q", "view": "yes"}, headers=AUTH).status_code == 422


def test_info_lists_the_choices_the_page_offers(client):
    info = client.get("/info", headers=AUTH).json()
    assert set(info["choices"]["filter"]) == {"off", "mkg", "default"}
    assert "maxsim" in info["choices"]["visual_ranker"] and "chunks" in info["choices"]["retrieval"]
    assert info["view_caps"]["graph_limit"] == [1, 1000, 300]
    json.dumps(info)
