"""The web page of ``colgraph serve`` (issue 27) in a real browser: headless Chromium (Debian's
``chromium``) driven over the DevTools protocol (tests/_browser.py) against real ``colgraph serve``
processes on 127.0.0.1.

What is checked: a question given in the URL runs on load and its drawing matches the JSON
answer (the drawn nodes are the answer's ``view`` nodes, every subgraph node among them, the
region boxes are the ranked regions' boxes on their image's thumbnail, documents, records,
timings, the collapsed context); the form with a query image from the file picker; the state in
the URL (a shared link restores the knobs and the explain toggle); the bearer token asked for
by the page; index text shown as text (``<script>`` in a document); keyboard use and labels; the
document view, and a document of 10,001 nodes drawn as a bounded neighbourhood. Screenshots go
to tests/artifacts/ (``COLGRAPH_TEST_ARTIFACTS`` elsewhere; ignored by git).

Without Chromium every test here skips, saying so; ``scripts/setup.sh --test`` installs it.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, urlencode

import httpx
import pytest
from PIL import Image

from colgraph_engine.demos.corpus import _photo, demo_documents
from colgraph_engine.kg import Encoders, KnowledgeIndex
from colgraph_engine.demos import kg_data as kg_demo
from colgraph_engine.kg.document import DocumentInput
from colgraph_engine.kg.segment import Section
from tests._browser import Browser, find_chromium
from tests.test_service import free_port, wait_until_serving
from tests.test_service_views import big_document, pdf_bytes, with_image_files

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("COLGRAPH_TEST_ARTIFACTS", REPO / "tests" / "artifacts"))
ENC = Encoders.offline()
TOKEN = "p4ge-t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
QUESTION = "Which photo shows the mission patch on the astronaut's suit?"
CAT_QUESTION = "Where does this animal live?"
DONE = "['done', 'error'].includes(document.body.dataset.state)"
READY = "['idle', 'done', 'error'].includes(document.body.dataset.state)"  # a page without a question is idle
UNTRUSTED_EXTRACTION = """\
entity<|#|><script>window.__xss=1</script> Zorblax<|#|>instrument<|#|><img src=x onerror="window.__xss=2"> The Zorblax telescope <b>watches</b> comets.
entity<|#|>Comet Vexa<|#|>comet<|#|>Comet Vexa <iframe src="/"></iframe> returns every seven years.
relation<|#|><script>window.__xss=1</script> Zorblax<|#|>Comet Vexa<|#|><svg onload=window.__xss=3><|#|>The Zorblax telescope tracks Comet Vexa.
<|COMPLETE|>"""
UNTRUSTED = DocumentInput(
    "untrusted-notes", title="<b>Untrusted</b> notes",
    sections=[Section("The Zorblax telescope tracks Comet Vexa <script>window.__xss=4</script> every night.")],
    extractions=[UNTRUSTED_EXTRACTION])

pytestmark = pytest.mark.skipif(find_chromium() is None, reason=(
    "Chromium is not installed: `apt-get install chromium` (scripts/setup.sh --test does it), "
    "or set COLGRAPH_CHROMIUM to a Chromium or Chrome executable"))


# -- servers, browser, artefacts ------------------------------------------------------------------

@contextmanager
def colgraph_serve(index_dir: Path, log: Path, token: str | None = None, extra: tuple[str, ...] = ()):
    """A real ``colgraph serve`` process on 127.0.0.1 (an ephemeral port); yields its URL."""
    port = free_port()
    env = dict(os.environ)
    args = [sys.executable, "-m", "colgraph_engine", "serve", str(index_dir), "--port", str(port),
            "--max-wait-ms", "0", "--reload-interval", "0", "--log-level", "warning", *extra]
    if token is not None:
        env["COLGRAPH_WEB_TEST_TOKEN"] = token
        args += ["--token-env", "COLGRAPH_WEB_TEST_TOKEN"]
    with open(log, "wb") as err:
        proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=err)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_serving(proc, url, lambda: log.read_text()[-3000:], timeout=120)
            yield url
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)


@pytest.fixture(scope="module")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    ignore = ARTIFACTS / ".gitignore"
    if ARTIFACTS == REPO / "tests" / "artifacts" and not ignore.exists():
        ignore.write_text("# screenshots and numbers written by tests/test_web_page.py\n*\n")
    return ARTIFACTS


@pytest.fixture(scope="module")
def demo_index(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("web")
    index = KnowledgeIndex.create(root / "index", ENC)
    index.add_documents(with_image_files(demo_documents() + kg_demo.demo_documents(), root / "photos") + [UNTRUSTED])
    return root / "index"


@pytest.fixture(scope="module")
def demo_server(demo_index, tmp_path_factory):
    with colgraph_serve(demo_index, tmp_path_factory.mktemp("logs") / "demo.log", token=TOKEN) as url:
        yield url


@pytest.fixture(scope="module")
def big_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("web-big")
    index = KnowledgeIndex.create(root / "index", ENC)
    index.add_documents([big_document(), DocumentInput("small", sections=["Kalimtor has an observatory."])])
    with colgraph_serve(root / "index", root / "serve.log") as url:
        yield url


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with Browser.start(tmp_path_factory.mktemp("chromium")) as b:
        yield b


@pytest.fixture
def page(browser):
    """A tab that already holds the demo server's token (as after the user gave it once)."""
    p = browser.new_page()
    p.on_new_document(f"sessionStorage.setItem('colgraph-token', {json.dumps(TOKEN)});")
    yield p
    assert p.errors() == [], p.errors()  # no exception, console error or CSP violation
    p.close()


def ask(url: str, **params) -> str:
    return f"{url}/?{urlencode(params, quote_via=quote)}"


def comparable(body: dict) -> dict:
    body = dict(body)
    body.pop("timings", None)
    body.pop("batch", None)
    return body


def post_query(url: str, body: dict) -> dict:
    r = httpx.post(url + "/query", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


DRAWN = """(() => {
  const g = document.querySelector('#subgraph svg.graph');
  const box = (r) => { const vb = r.ownerSVGElement.viewBox.baseVal; return {
    node: Number(r.dataset.node), bbox: r.dataset.bbox.split(',').map(Number), w: vb.width, h: vb.height,
    x: Number(r.getAttribute('x')), y: Number(r.getAttribute('y')),
    width: Number(r.getAttribute('width')), height: Number(r.getAttribute('height')),
    doc: r.closest('figure').dataset.doc, image: r.closest('figure').dataset.image }; };
  return {
    nodes: [...g.querySelectorAll('g.node')].map((n) => ({ id: Number(n.dataset.id), role: n.dataset.role,
      kind: n.dataset.kind, label: n.querySelector('text').textContent, title: n.querySelector('title').textContent })),
    edges: g.querySelectorAll('line.edge').length,
    boxes: [...document.querySelectorAll('#images rect.region-box')].map(box),
    cards: [...document.querySelectorAll('#images figure.card')].map((c) => ({ doc: c.dataset.doc, image: c.dataset.image,
      drawn: c.dataset.drawn })),
    docs: [...document.querySelectorAll('#documents-hit li')].map((li) => li.dataset.doc),
    records: [...document.querySelectorAll('#records tbody tr')].map((tr) => [...tr.cells].map((c) => c.textContent)),
    stages: document.querySelectorAll('#timings .timebar .stage').length,
    contextOpen: document.querySelector('#context details').open,
    context: document.querySelector('#context pre').textContent,
    duplicateIds: (() => { const ids = [...document.querySelectorAll('[id]')].map((e) => e.id);
      return ids.filter((id, i) => ids.indexOf(id) !== i); })(),
  };
})()"""
CARDS_DRAWN = "[...document.querySelectorAll('#images figure.card')].every((c) => c.dataset.drawn)"


def check_drawing_matches(drawn: dict, res: dict, regions: bool = True) -> None:
    view = res["view"]
    ids = [n["id"] for n in drawn["nodes"]]
    assert len(ids) == len(view["nodes"]) == len(set(ids))  # one drawn node per described node
    assert ids == [n["id"] for n in view["nodes"]]
    if view["truncated"]:  # the first `limit` subgraph nodes by hop, then the ranked images
        assert sum(n["hop"] is not None for n in view["nodes"]) == view["limit"] < len(res["subgraph"]["nodes"])
    else:
        assert set(res["subgraph"]["nodes"]) <= set(ids)
    seeds = {v for v, h in zip(res["subgraph"]["nodes"], res["subgraph"]["hops"]) if h == 0} & set(ids)
    assert {n["id"] for n in drawn["nodes"] if n["role"] == "seed"} == seeds
    assert {n["id"] for n in drawn["nodes"] if n["role"] == "visual"} == \
        {h["node"] for h in res["images"]} - set(res["subgraph"]["nodes"])
    assert drawn["edges"] == len(view["edges"])
    # region boxes: exactly the ranked regions', on their own image, where their bbox says
    want = sorted((h["node"], tuple(round(x, 6) for x in h["bbox"]), h["doc_id"], h["image"])
                  for h in res["images"] if h["kind"] == "region" and h["bbox"])
    got = sorted((b["node"], tuple(round(x, 6) for x in b["bbox"]), b["doc"], b["image"]) for b in drawn["boxes"])
    assert got == want and (want or not regions)
    for b in drawn["boxes"]:
        x1, y1, x2, y2 = b["bbox"]
        assert abs(b["x"] - x1 * b["w"]) < 0.02 and abs(b["y"] - y1 * b["h"]) < 0.02
        assert abs(b["width"] - (x2 - x1) * b["w"]) < 0.02 and abs(b["height"] - (y2 - y1) * b["h"]) < 0.02
    assert {(c["doc"], c["image"]) for c in drawn["cards"]} == {(h["doc_id"], h["image"]) for h in res["images"]}
    assert drawn["docs"] == [d["doc_id"] for d in res["documents"]]
    assert len(drawn["records"]) == len(res["evidence"]["records"])
    assert [r[1:4] for r in drawn["records"]] == [[r["subject"], r["predicate"], r["object"]]
                                                  for r in res["evidence"]["records"]]
    assert drawn["stages"] == len(res["timings"])
    assert drawn["contextOpen"] is False and drawn["context"] == res["context"]
    assert drawn["duplicateIds"] == []  # labels and aria references stay unambiguous


# -- the question view ----------------------------------------------------------------------------

def test_a_question_in_the_url_runs_on_load_and_matches_the_json_answer(page, demo_server, artifacts):
    page.goto(ask(demo_server, q=QUESTION, kd=3, hops=2))
    assert page.wait_for(DONE) and page.eval("document.body.dataset.state") == "done", page.eval(
        "document.getElementById('error').textContent")
    page.wait_for(CARDS_DRAWN)
    res = page.eval("window.colgraphLast")
    want = post_query(demo_server, {"question": QUESTION, "config": {"kd": 3, "hops": 2}, "view": True})
    assert comparable(res) == comparable(want)  # the page asked what the link says, and drew that answer
    drawn = page.eval(DRAWN)
    check_drawing_matches(drawn, res)
    assert all(c["drawn"] == "image" for c in drawn["cards"])  # every thumbnail came (image files)
    assert page.eval("document.getElementById('kd').value") == "3"
    page.eval("document.querySelector('#subgraph details').open = true; document.querySelector('#context details').open = true")
    page.screenshot(artifacts / "query_demo.png")
    readme = os.environ.get("COLGRAPH_README_SCREENSHOT")
    if readme:  # the screenshot in the README (docs/web_page.png): the top of the page, quantised
        page.eval("document.querySelector('#subgraph details').open = false; document.querySelector('#context details').open = false")
        full = page.screenshot(artifacts / "readme_full.png")
        im = Image.open(full)
        im.crop((0, 0, im.width, min(im.height, 2100))).quantize(128, method=Image.Quantize.MEDIANCUT).save(readme, optimize=True)


def test_the_form_with_a_query_image_from_the_file_picker(page, demo_server, artifacts, tmp_path):
    cat = tmp_path / "cat.png"
    Image.fromarray(_photo("chelsea")[30:270, 60:400]).save(cat)
    page.goto(demo_server + "/")
    page.wait_for(READY)
    page.eval("document.getElementById('q').focus()")
    page.type_text(CAT_QUESTION)  # typed, as a user does
    page.eval("document.getElementById('caption').focus()")
    page.type_text("a tabby cat")
    page.eval("document.getElementById('kd').value = '2'")
    page.set_files("#image", [cat])
    page.wait_for("document.body.dataset.image === 'ready'")
    assert page.eval("!document.getElementById('image-preview').hidden")
    page.eval("document.getElementById('ask').click()")
    page.wait_for("document.body.dataset.state === 'done' && window.colgraphLast && window.colgraphLast.has_image")
    page.wait_for(CARDS_DRAWN)
    res = page.eval("window.colgraphLast")
    data_url = "data:image/png;base64," + base64.b64encode(cat.read_bytes()).decode()
    want = post_query(demo_server, {"question": CAT_QUESTION, "caption": "a tabby cat", "image_base64": data_url,
                                    "config": {"kd": 2}, "view": True})
    assert comparable(res) == comparable(want)
    assert res["has_image"] and res["documents"][0]["doc_id"] == "harbour-cafe"
    check_drawing_matches(page.eval(DRAWN), res)
    # the question (not the image) is in the URL now
    url = page.eval("location.href")
    assert f"q={quote(CAT_QUESTION)}" in url.replace("+", "%20") and "kd=2" in url and "caption=" in url
    page.screenshot(artifacts / "query_with_image.png")


def test_a_shared_link_restores_the_knobs_and_the_explain_toggle(page, demo_server):
    page.goto(ask(demo_server, q=QUESTION, kd=2, kg=5, hops=1, filter="off", visual_ranker="off",
                  retrieval="graph", explain=1))
    page.wait_for(DONE)
    state = page.eval("""(() => Object.fromEntries(['q', 'kd', 'kg', 'hops', 'filter', 'visual_ranker', 'retrieval']
        .map((k) => [k, document.getElementById(k).value]).concat([['explain', document.getElementById('explain').checked]])))()""")
    assert state == {"q": QUESTION, "kd": "2", "kg": "5", "hops": "1", "filter": "off", "visual_ranker": "off",
                     "retrieval": "graph", "explain": True}
    res = page.eval("window.colgraphLast")
    assert res["images"] == [] and len(res["documents"]) == 2  # the knobs reached the service
    assert max(res["subgraph"]["hops"]) <= 1
    shown = page.eval("[...document.querySelectorAll('#results .explain')].filter((e) => getComputedStyle(e).display !== 'none').length")
    assert shown >= len(res["documents"])  # each recalled document says why it is there
    page.eval("document.getElementById('explain').click()")
    assert "explain" not in page.eval("location.search")
    assert page.eval("[...document.querySelectorAll('#results .explain')].every((e) => getComputedStyle(e).display === 'none')")
    # the browser's back button: the previous question comes back
    page.goto(ask(demo_server, q=CAT_QUESTION))
    page.wait_for(DONE)
    page.eval("history.back()")
    page.wait_for(f"document.getElementById('q').value === {json.dumps(QUESTION)}")
    # the service's caps are the page's: an override over one is refused with the service's message
    page.goto(ask(demo_server, q=QUESTION, kd=500))
    page.wait_for(DONE)
    assert page.eval("document.body.dataset.state") == "error"
    error = page.eval("document.getElementById('error').textContent")
    assert "422" in error and "kd" in error and page.eval("document.getElementById('error').getAttribute('role')") == "alert"
    page.browser.events[page.session].clear()  # the refused request's console line is expected


def test_the_page_asks_for_the_token(browser, demo_server):
    p = browser.new_page()  # no token in this tab yet
    try:
        p.goto(demo_server + "/")
        p.wait_for("document.getElementById('token-dialog').open")
        p.eval("document.getElementById('token-input').focus()")
        p.type_text("wrong")
        p.key("Enter")
        p.wait_for("document.getElementById('token-dialog').open && "
                   "document.getElementById('token-note').textContent.includes('refused')")
        p.eval("document.getElementById('token-input').focus()")
        p.type_text(TOKEN)
        p.key("Enter")
        p.wait_for("!document.getElementById('token-dialog').open && document.getElementById('filter').options.length > 1")
        assert p.eval("sessionStorage.getItem('colgraph-token')") == TOKEN
        assert [e for e in p.errors() if "401" not in e] == []  # the refused requests are logged as 401s, nothing else
    finally:
        p.close()


def test_index_text_is_shown_as_text_never_as_html(page, demo_server, artifacts):
    page.goto(ask(demo_server, q="What does the Zorblax telescope track?", kd=1))
    page.wait_for(DONE)
    res = page.eval("window.colgraphLast")
    assert res["documents"][0]["doc_id"] == "untrusted-notes"
    assert page.eval("window.__xss") is None  # nothing of the document ran
    assert page.eval("document.querySelectorAll('#results script, #results iframe, #results img, #results b').length") == 0
    assert page.eval("document.querySelectorAll('svg.graph svg, [onerror], [onload]').length") == 0
    drawn = page.eval(DRAWN)
    name = "<script>window.__xss=1</script> Zorblax"
    node = next(n for n in drawn["nodes"] if n["title"].startswith(name))
    assert '<img src=x onerror="window.__xss=2">' in node["title"]
    assert any(r[1] == name and r[3] == "Comet Vexa" and r[2] == "<svg onload=window.__xss=3>" for r in drawn["records"])
    text = page.eval("document.getElementById('results').textContent")
    assert "<script>window.__xss=4</script>" in text  # the context shows the segment's text as it is
    page.goto(f"{demo_server}/ui/documents?doc=untrusted-notes")
    page.wait_for(DONE)
    assert page.eval("window.__xss") is None
    assert page.eval("document.querySelector('#documents h3').textContent").startswith("<b>Untrusted</b> notes")
    assert name in page.eval("document.querySelector('.node-list').textContent")
    page.screenshot(artifacts / "untrusted_text.png")


def test_keyboard_and_labels(page, demo_server):
    page.goto(demo_server + "/")
    page.wait_for(READY)
    unlabelled = page.eval("""[...document.querySelectorAll('input, select, textarea')]
        .filter((e) => e.type !== 'file' && !e.closest('dialog'))
        .filter((e) => !document.querySelector(`label[for="${e.id}"]`) && !e.getAttribute('aria-label')).map((e) => e.id)""")
    assert unlabelled == []
    order = []
    for _ in range(8):
        page.key("Tab")
        order.append(page.eval("document.activeElement.id || document.activeElement.textContent.trim()"))
    assert order[:7] == ["Skip to the content", "colgraph", "nav-ask", "nav-documents", "q", "drop", "caption"], order
    # Enter on the drop zone opens the file chooser (what a click does)
    page.call("Page.setInterceptFileChooserDialog", {"enabled": True})
    since = len(page.events)
    page.eval("document.getElementById('drop').focus()")
    page.key("Enter")
    page.browser.wait_event(page.session, "Page.fileChooserOpened", 10, since)
    page.call("Page.setInterceptFileChooserDialog", {"enabled": False})
    # the drawn nodes are reachable with Tab, and Enter on one centres the document view on it
    page.goto(f"{demo_server}/ui/documents?doc=fuji-ride")
    page.wait_for(DONE)
    target = page.eval("""(() => { const n = [...document.querySelectorAll('svg.graph g.node')].find((g) => g.dataset.id !== '0');
        n.focus(); return [Number(n.dataset.id), document.activeElement === n]; })()""")
    assert target[1]
    page.key("Enter")
    page.wait_for(f"new URLSearchParams(location.search).get('center') === '{target[0]}' && "
                  f"document.body.dataset.state === 'done' && "
                  f"document.querySelector('svg.graph g.node')?.dataset.id === '{target[0]}'")


def test_the_answer_when_a_generator_is_configured(browser, demo_index, tmp_path):
    from colgraph_engine.pipeline import OpenAIGenerator
    from tests.chat_standin import chat_standin

    said = "Eileen Collins wears the STS-93 <b>mission patch</b> on her suit."

    def reply(req):
        assert req["messages"][0]["content"] == OpenAIGenerator.SYSTEM
        return said

    with chat_standin(reply) as (endpoint, server), \
            colgraph_serve(demo_index, tmp_path / "serve.log",
                           extra=("--generator-model", "gen", "--generator-url", endpoint)) as url:
        p = browser.new_page()
        try:
            p.goto(ask(url, q=QUESTION, kd=2, answer=1))
            p.wait_for(DONE)
            assert p.eval("document.getElementById('answer').checked && !document.getElementById('answer').disabled")
            res = p.eval("window.colgraphLast")
            assert res["answer"] == {"text": said, "error": None} and server.count == 1
            assert p.eval("document.querySelector('#answer-result-title').textContent") == "Answer"
            assert p.eval("document.querySelector('#results .answer-text').textContent") == said
            assert p.eval("document.querySelectorAll('#results b').length") == 0  # the model's text is text too
            assert p.errors() == []
        finally:
            p.close()


# -- the document view ----------------------------------------------------------------------------

def test_documents_are_listed_with_their_counts(page, demo_server, artifacts):
    page.goto(demo_server + "/ui/documents")
    page.wait_for(DONE)
    rows = page.eval("""[...document.querySelectorAll('table.doc-list tbody tr')].map((tr) =>
        [tr.dataset.doc, ...[...tr.cells].slice(2).map((c) => Number(c.textContent))])""")
    listed = httpx.get(demo_server + "/documents", headers=AUTH).json()["documents"]
    cols = ["nodes", "entities", "relations", "segments", "images", "regions", "tables"]
    assert rows == [[d["doc_id"], *[d["counts"][c] for c in cols]] for d in listed]
    page.screenshot(artifacts / "documents_demo.png")
    page.eval("document.querySelector('table.doc-list tbody tr[data-doc=\"harbour-cafe\"] a').click()")
    page.wait_for("new URLSearchParams(location.search).get('doc') === 'harbour-cafe' && document.body.dataset.state === 'done'")
    graph = httpx.get(demo_server + "/documents/harbour-cafe/graph", headers=AUTH).json()
    assert page.eval("[...document.querySelectorAll('svg.graph g.node')].map((g) => Number(g.dataset.id))") == \
        [n["id"] for n in graph["nodes"]]
    page.screenshot(artifacts / "document_demo.png")


def test_a_document_of_10001_nodes_draws_a_bounded_neighbourhood(browser, big_server, artifacts):
    p = browser.new_page()
    try:
        numbers = {}
        t0 = time.perf_counter()
        p.goto(big_server + "/ui/documents?doc=big-graph")
        p.wait_for("document.body.dataset.state === 'done'")
        numbers["first_view_s"] = round(time.perf_counter() - t0, 3)
        graph = httpx.get(big_server + "/documents/big-graph/graph").json()
        assert graph["counts"]["nodes"] == 10_001 and graph["truncated"]
        drawn = p.eval("""(() => { const s = document.querySelector('svg.graph'); return { ...s.dataset,
            ids: [...s.querySelectorAll('g.node')].map((g) => Number(g.dataset.id)), edges: s.querySelectorAll('line').length,
            rows: document.querySelectorAll('.node-list tbody tr').length, elements: document.getElementsByTagName('*').length,
            caption: document.getElementById('graph-caption').textContent }; })()""")
        assert drawn["ids"] == [n["id"] for n in graph["nodes"]] and len(drawn["ids"]) == 300  # bounded: 300 of 10,001
        assert drawn["edges"] == len(graph["edges"]) and drawn["rows"] == 100  # the node list is paged
        assert "Drawing 300 of 10001 nodes" in drawn["caption"]
        numbers.update(nodes_drawn=len(drawn["ids"]), edges_drawn=drawn["edges"], dom_elements=drawn["elements"],
                       draw_ms=float(drawn["drawMs"]), fetch_ms=float(drawn["fetchMs"]), layout_ms=float(drawn["layoutMs"]))
        # responsive: the main thread answers at once after drawing, and hovering a node is immediate
        t = time.perf_counter()
        p.eval("1")
        numbers["eval_roundtrip_ms"] = round((time.perf_counter() - t) * 1e3, 2)
        numbers["hover_ms"] = p.eval("""(() => { const t = performance.now(); const n = document.querySelectorAll('svg.graph g.node')[150];
            n.dispatchEvent(new MouseEvent('mouseenter')); return performance.now() - t; })()""")
        p.screenshot(artifacts / "document_10001_nodes.png")
        # move on with the keyboard: Enter on an entity centres there, still bounded
        target = p.eval("""(() => { const n = [...document.querySelectorAll('svg.graph g.node')].find((g) => g.dataset.kind === 'entity');
            n.focus(); return Number(n.dataset.id); })()""")
        t = time.perf_counter()
        p.key("Enter")
        p.wait_for(f"document.querySelector('svg.graph g.node')?.dataset.id === '{target}' && document.body.dataset.state === 'done'")
        numbers["recentre_s"] = round(time.perf_counter() - t, 3)
        again = p.eval("document.querySelectorAll('svg.graph g.node').length")
        want = httpx.get(big_server + f"/documents/big-graph/graph?center={target}").json()
        assert again == len(want["nodes"]) <= 300
        numbers["recentred_nodes_drawn"] = again
        # the last page of the node list
        p.goto(big_server + "/ui/documents?doc=big-graph&offset=10000")
        p.wait_for("document.body.dataset.state === 'done'")
        assert p.eval("[...document.querySelectorAll('.node-list tbody tr')].map((r) => Number(r.dataset.id))") == [10_000]
        (artifacts / "document_10001_nodes.json").write_text(json.dumps(numbers, indent=1) + "\n")
        print("10,001-node document:", json.dumps(numbers))
        assert p.errors() == []
    finally:
        p.close()


# -- PDFs -------------------------------------------------------------------------------------------

def test_an_uploaded_pdf_shows_its_pages_and_citations(browser, demo_index, tmp_path, artifacts):
    index_dir = tmp_path / "index"
    shutil.copytree(demo_index, index_dir)
    with colgraph_serve(index_dir, tmp_path / "serve.log", token=TOKEN) as url:
        r = httpx.post(url + "/documents", files=[("files", ("harbour.pdf", pdf_bytes(), "application/pdf"))],
                       headers=AUTH, timeout=300)
        assert r.status_code == 200, r.text
        cat = tmp_path / "cat.png"
        Image.fromarray(_photo("chelsea")[30:270, 60:400]).save(cat)
        p = browser.new_page()
        p.on_new_document(f"sessionStorage.setItem('colgraph-token', {json.dumps(TOKEN)});")
        try:
            p.goto(ask(url, q="Where does the tabby cat Chelsea sleep?", kd=2))
            p.wait_for(DONE)
            p.set_files("#image", [cat])
            p.wait_for("document.body.dataset.image === 'ready'")
            p.eval("document.getElementById('ask').click()")
            p.wait_for("document.body.dataset.state === 'done' && window.colgraphLast.has_image")
            p.wait_for(CARDS_DRAWN)
            res = p.eval("window.colgraphLast")
            assert "harbour.pdf" in [d["doc_id"] for d in res["documents"]]
            drawn = p.eval(DRAWN)
            check_drawing_matches(drawn, res)
            pages = [c for c in drawn["cards"] if c["doc"] == "harbour.pdf"]
            assert pages and all(c["drawn"] == "image" for c in pages)  # page renders from the uploaded PDF
            cited = [r[5] for r in drawn["records"] if r[5].startswith("harbour.pdf")]
            assert cited and all(", p. " in c for c in cited)
            p.eval("document.querySelector('#subgraph details').open = false")
            p.screenshot(artifacts / "query_pdf.png")
            assert p.errors() == []
        finally:
            p.close()


@pytest.mark.skipif(not os.environ.get("COLGRAPH_REAL_PDFS"), reason="set COLGRAPH_REAL_PDFS to PDF files (':' between)")
def test_real_pdfs_with_a_query_image(browser, tmp_path, artifacts):
    """Real PDFs uploaded through the page's service, one question with a query image (a figure
    cut out of one of the PDFs' pages), screenshots kept."""
    import pypdfium2 as pdfium

    pdfs = [Path(p) for p in os.environ["COLGRAPH_REAL_PDFS"].split(":")]
    question = os.environ.get("COLGRAPH_REAL_QUESTION", "What does this figure show?")
    page_no, box = int(os.environ.get("COLGRAPH_REAL_PAGE", "1")), os.environ.get("COLGRAPH_REAL_BOX", "0.1,0.1,0.9,0.5")
    x1, y1, x2, y2 = (float(v) for v in box.split(","))
    im = pdfium.PdfDocument(str(pdfs[0]))[page_no - 1].render(scale=2).to_pil().convert("RGB")
    crop = tmp_path / "figure.png"
    im.crop((int(x1 * im.width), int(y1 * im.height), int(x2 * im.width), int(y2 * im.height))).save(crop)
    index = KnowledgeIndex.create(tmp_path / "index", ENC)
    del index
    with colgraph_serve(tmp_path / "index", tmp_path / "serve.log", token=TOKEN) as url:
        r = httpx.post(url + "/documents", headers=AUTH, timeout=1800,
                       files=[("files", (p.name, p.read_bytes(), "application/pdf")) for p in pdfs])
        assert r.status_code == 200, r.text
        p = browser.new_page()
        p.on_new_document(f"sessionStorage.setItem('colgraph-token', {json.dumps(TOKEN)});")
        try:
            p.goto(url + "/")
            p.wait_for(READY)
            p.eval(f"document.getElementById('q').value = {json.dumps(question)}")
            p.set_files("#image", [crop])
            p.wait_for("document.body.dataset.image === 'ready'")
            p.eval("document.getElementById('ask').click()")
            p.wait_for("document.body.dataset.state === 'done' && window.colgraphLast.has_image", timeout=300)
            p.wait_for(CARDS_DRAWN, timeout=120)
            check_drawing_matches(p.eval(DRAWN), p.eval("window.colgraphLast"), regions=False)
            p.screenshot(artifacts / "query_real_pdfs.png")
            p.goto(url + "/ui/documents")
            p.wait_for(DONE)
            p.screenshot(artifacts / "documents_real_pdfs.png")
            p.goto(f"{url}/ui/documents?doc={quote(pdfs[0].name)}")
            p.wait_for(DONE)
            p.screenshot(artifacts / "document_real_pdf.png")
        finally:
            p.close()
