// The document view: /ui/documents lists the index's documents with their counts (paged);
// /ui/documents?doc=ID&center=N&hops=H browses one document's graph: a paged, searchable node
// list and the drawn neighbourhood of one node (at most `limit` nodes, so a document of 10,000
// nodes stays responsive: only GET /documents/{doc}/graph's bounded answer is ever drawn).

import { ApiError, apiJson, clear, el, short, status } from "./dom.js";
import { drawGraph, legend } from "./graph.js";

const DOCS_PER_PAGE = 50;
const NODES_PER_PAGE = 100;
const KINDS = ["document", "segment", "entity", "image", "region", "table"];

function $(id) {
  return document.getElementById(id);
}

function params() {
  return new URLSearchParams(location.search);
}

function go(p, replace = false) {
  const url = `/ui/documents${p.toString() ? `?${p.toString()}` : ""}`;
  if (replace) history.replaceState(null, "", url);
  else history.pushState(null, "", url);
  render();
}

function link(text, p, attrs = {}) {
  const href = `/ui/documents${p.toString() ? `?${p.toString()}` : ""}`;
  return el("a", { href, ...attrs, onclick: (event) => {
    if (event.ctrlKey || event.metaKey || event.shiftKey || event.button !== 0) return;
    event.preventDefault();
    go(p);
  } }, text);
}

function int(value, fallback) {
  const n = Number.parseInt(value ?? "", 10);
  return Number.isFinite(n) && n >= 0 ? n : fallback;
}

function pager(offset, limit, total, make) {
  const prev = offset > 0;
  const next = offset + limit < total;
  return el("nav", { class: "pager", "aria-label": "pages" },
    prev ? make("\u2190 previous", Math.max(0, offset - limit)) : el("span", { class: "muted" }, "\u2190 previous"),
    ` ${total ? offset + 1 : 0}\u2013${Math.min(offset + limit, total)} of ${total} `,
    next ? make("next \u2192", offset + limit) : el("span", { class: "muted" }, "next \u2192"));
}

async function listDocuments(holder, p) {
  const offset = int(p.get("offset"), 0);
  const data = await apiJson(`/documents?offset=${offset}&limit=${DOCS_PER_PAGE}`);
  const cols = ["nodes", "entities", "relations", "segments", "images", "regions", "tables"];
  holder.append(
    el("p", {}, `${data.total} document${data.total === 1 ? "" : "s"} in the index (generation ${data.generation}).`),
    el("table", { class: "doc-list" },
      el("caption", { class: "visually-hidden" }, "the index's documents"),
      el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "document"), el("th", { scope: "col" }, "title"),
        cols.map((c) => el("th", { scope: "col", class: "num" }, c)))),
      el("tbody", {}, data.documents.map((d) => el("tr", { "data-doc": d.doc_id },
        el("td", {}, link(d.doc_id, new URLSearchParams({ doc: d.doc_id }))), el("td", {}, d.title || ""),
        cols.map((c) => el("td", { class: "num" }, String(d.counts[c] ?? 0))))))),
    pager(offset, DOCS_PER_PAGE, data.total, (text, o) => link(text, new URLSearchParams({ offset: String(o) }))));
}

async function showDocument(holder, p) {
  const doc = p.get("doc");
  const center = int(p.get("center"), 0);
  const hops = Math.min(int(p.get("hops"), 2), 3);
  const limit = Math.min(Math.max(int(p.get("limit"), 300), 1), 1000);
  const match = p.get("match") || "";
  const kind = KINDS.includes(p.get("kind")) ? p.get("kind") : "";
  const offset = int(p.get("offset"), 0);
  const enc = encodeURIComponent(doc);
  const t0 = performance.now();
  const graphQuery = `/documents/${enc}/graph?center=${center}&hops=${hops}&limit=${limit}`;
  const nodeQuery = `/documents/${enc}/nodes?offset=${offset}&limit=${NODES_PER_PAGE}`
    + (match ? `&match=${encodeURIComponent(match)}` : "") + (kind ? `&kind=${kind}` : "");
  const [graph, nodes] = await Promise.all([apiJson(graphQuery), apiJson(nodeQuery)]);
  const fetched = performance.now();
  const c = graph.counts;
  const centerNode = graph.nodes.find((d) => d.id === graph.center) || { name: String(graph.center), kind: "" };
  const with_ = (changes) => {
    const q = new URLSearchParams(p);
    for (const [k, v] of Object.entries(changes)) {
      if (v === null || v === "") q.delete(k); else q.set(k, String(v));
    }
    return q;
  };
  // the search form (state in the URL)
  const form = el("form", { class: "node-search", role: "search" },
    el("div", { class: "field" }, el("label", { for: "match" }, "Name contains"),
      el("input", { id: "match", name: "match", value: match, maxlength: 200 })),
    el("div", { class: "field" }, el("label", { for: "kind" }, "Kind"),
      el("select", { id: "kind", name: "kind" }, el("option", { value: "" }, "any"),
        KINDS.map((k) => el("option", { value: k, selected: k === kind }, k)))),
    el("div", { class: "field" }, el("label", { for: "hops-doc" }, "Hops drawn"),
      el("select", { id: "hops-doc", name: "hops" }, [0, 1, 2, 3].map((h) => el("option", { value: h, selected: h === hops }, String(h))))),
    el("button", { type: "submit" }, "Search"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    go(with_({ match: $("match").value.trim(), kind: $("kind").value, hops: $("hops-doc").value, offset: null }));
  });
  const info = el("div", { class: "node-info", "aria-live": "polite" }, "Hover or focus a node; Enter or a click centres the drawing on it.");
  const graphHolder = el("div", { class: "graph-holder" });
  const caption = el("p", { class: "caption", id: "graph-caption" });
  const list = el("table", { class: "node-list" },
    el("caption", {}, `${nodes.total} node${nodes.total === 1 ? "" : "s"}${match ? ` named like \u201c${match}\u201d` : ""}${kind ? ` of kind ${kind}` : ""}`),
    el("thead", {}, el("tr", {}, ["id", "name", "kind", "type", "degree"].map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, nodes.nodes.map((d) => el("tr", { "data-id": d.id, class: d.id === graph.center ? "current" : null },
      el("td", {}, String(d.id)), el("td", {}, link(short(d.name, 60), with_({ center: d.id }), { title: d.name })),
      el("td", {}, d.kind), el("td", {}, d.type || ""), el("td", { class: "num" }, String(d.degree))))));
  holder.append(
    el("p", {}, link("\u2190 all documents", new URLSearchParams())),
    el("h3", {}, graph.title ? `${graph.title} ` : "", el("span", { class: "muted" }, graph.doc_id)),
    el("p", { class: "counts" }, `${c.nodes} nodes, ${c.edges} edges: ${c.segments} segments, ${c.entities} entities, `
      + `${c.relations} relations, ${c.images} images, ${c.regions} regions, ${c.tables} tables.`),
    form,
    el("div", { class: "doc-browse" },
      el("div", { class: "doc-nodes" }, list,
        pager(offset, NODES_PER_PAGE, nodes.total, (text, o) => link(text, with_({ offset: o })))),
      el("div", { class: "doc-graph" }, caption, legend([...new Set(graph.nodes.map((d) => d.kind))], []), graphHolder, info)));
  const drawn = drawGraph(graphHolder, graph, {
    title: `the neighbourhood of ${centerNode.name}: ${graph.nodes.length} nodes`,
    label: (d) => `${d.kind} ${d.name}, ${d.hop} hop${d.hop === 1 ? "" : "s"} from the centre, degree ${d.degree}`,
    onFocus: (d) => {
      clear(info).append(el("strong", {}, d.name), ` \u2014 ${d.kind}${d.type ? ` (${d.type})` : ""}, id ${d.id}, `
        + `degree ${d.degree}${d.hidden ? `, ${d.hidden} edges not drawn` : ""}`, el("p", {}, d.text || ""));
    },
    onActivate: (d) => { if (d.id !== graph.center) go(with_({ center: d.id, offset: null })); },
  });
  const drawnMs = performance.now() - t0;
  const svgNodes = drawn.svg.querySelectorAll("g.node").length;
  caption.textContent = `Drawing ${svgNodes} of ${c.nodes} nodes: the neighbourhood of ${centerNode.kind} `
    + `\u201c${short(centerNode.name, 60)}\u201d within ${hops} hop${hops === 1 ? "" : "s"}`
    + `${graph.truncated ? ` (more lie beyond: at most ${graph.limit} are drawn; pick another node to move on)` : ""}; `
    + `${graph.edges.length} edges. Fetched in ${(fetched - t0).toFixed(0)} ms, laid out in ${drawn.layoutMs.toFixed(0)} ms.`;
  Object.assign(drawn.svg.dataset, { drawMs: drawnMs.toFixed(1), fetchMs: (fetched - t0).toFixed(1),
    layoutMs: drawn.layoutMs.toFixed(1), nodes: String(svgNodes) });
  status(`Drawn in ${drawnMs.toFixed(0)} ms.`, "done");
}

async function render() {
  const holder = clear($("documents"));
  const p = params();
  status("Loading\u2026", "running");
  try {
    if (p.get("doc")) await showDocument(holder, p);
    else {
      await listDocuments(holder, p);
      status("", "done");
    }
  } catch (exc) {
    holder.appendChild(el("p", { role: "alert", class: "error" },
      exc instanceof ApiError ? `The service answered ${exc.status}: ${exc.detail}` : String(exc)));
    status("Failed.", "error");
  }
}

export function documentsView() {
  $("view-documents").hidden = false;
  $("nav-documents").setAttribute("aria-current", "page");
  window.addEventListener("popstate", render);
  render();
}

