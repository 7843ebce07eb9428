// The question view of the colgraph page. Its state is its URL: /?q=QUESTION&kd=3&hops=2&...
// runs that question on load, so a result can be shared and bookmarked (the query image cannot
// travel in a link). Everything is read from the service's JSON routes (POST /query with
// "view": true, GET /info, GET /documents/{doc}/image).

import { ApiError, api, apiJson, clear, el, fmt, ms, short, status, svg } from "./dom.js";
import { documentsView } from "./documents.js";
import { drawGraph, legend } from "./graph.js";

const KNOBS = ["kd", "kg", "hops", "filter", "visual_ranker", "retrieval"];
const NUMBERS = new Set(["kd", "kg", "hops"]);
let info = null;
let queryImage = null; // {dataUrl, name}
let lastRun = 0;

export async function loadInfo() {
  if (!info) info = await apiJson("/info");
  return info;
}

function $(id) {
  return document.getElementById(id);
}

// -- the form and the URL ----------------------------------------------------------------------

function fillChoices() {
  const cfg = info.pipeline_config || {};
  const choices = info.choices || {};
  for (const name of ["filter", "visual_ranker", "retrieval"]) {
    const select = clear($(name));
    select.appendChild(el("option", { value: "" }, `default (${cfg[name] ?? "?"})`));
    for (const option of choices[name] || []) select.appendChild(el("option", { value: option }, option));
  }
  for (const name of NUMBERS) {
    const input = $(name);
    input.placeholder = String(cfg[name] ?? "");
    const cap = (info.caps || {})[name];
    if (cap) { input.min = cap[0]; input.max = cap[1]; }
  }
  const answer = $("answer");
  answer.disabled = !info.generator;
  answer.title = info.generator ? "" : "this service has no generator";
}

function formState() {
  const p = new URLSearchParams();
  const q = $("q").value.trim();
  if (q) p.set("q", q);
  const caption = $("caption").value.trim();
  if (caption) p.set("caption", caption);
  for (const name of KNOBS) {
    const v = $(name).value.trim();
    if (v !== "") p.set(name, v);
  }
  if ($("answer").checked) p.set("answer", "1");
  if ($("explain").checked) p.set("explain", "1");
  return p;
}

function applyState(p) {
  $("q").value = p.get("q") || "";
  $("caption").value = p.get("caption") || "";
  for (const name of KNOBS) {
    const v = p.get(name) || "";
    const input = $(name);
    if (input.tagName === "SELECT" && v && ![...input.options].some((o) => o.value === v)) {
      input.appendChild(el("option", { value: v }, v)); // let the service say what is wrong with it
    }
    input.value = v;
  }
  $("answer").checked = p.get("answer") === "1" && !$("answer").disabled;
  $("explain").checked = p.get("explain") === "1";
  setExplain();
  $("share").href = `/?${p.toString()}`;
}

function requestBody(p) {
  const config = {};
  for (const name of KNOBS) {
    if (!p.has(name)) continue;
    const v = p.get(name);
    config[name] = NUMBERS.has(name) ? Number(v) : v;
  }
  const body = { question: p.get("q"), view: true };
  if (p.get("caption")) body.caption = p.get("caption");
  if (Object.keys(config).length) body.config = config;
  if (p.get("answer") === "1") body.answer = true;
  if (queryImage) body.image_base64 = queryImage.dataUrl;
  return body;
}

function setExplain() {
  $("results").classList.toggle("explain-on", $("explain").checked);
}

// -- the query image: drag and drop or the file picker -------------------------------------------

function setImage(file) {
  if (!file) return;
  if (!file.type.startsWith("image/")) {
    $("error").textContent = `${file.name}: not an image`;
    return;
  }
  const reader = new FileReader();
  reader.onload = () => {
    queryImage = { dataUrl: reader.result, name: file.name };
    $("image-preview").src = reader.result;
    $("image-preview").hidden = false;
    $("image-name").textContent = file.name;
    $("image-clear").hidden = false;
    document.body.dataset.image = "ready";
  };
  reader.readAsDataURL(file);
}

function clearImage() {
  queryImage = null;
  $("image").value = "";
  $("image-preview").hidden = true;
  $("image-preview").removeAttribute("src");
  $("image-name").textContent = "";
  $("image-clear").hidden = true;
  delete document.body.dataset.image;
}

function wireImage() {
  const drop = $("drop");
  const input = $("image");
  drop.addEventListener("click", () => input.click());
  drop.addEventListener("keydown", (event) => {
    if (event.key === "Enter" || event.key === " ") { event.preventDefault(); input.click(); }
  });
  input.addEventListener("change", () => setImage(input.files[0]));
  drop.addEventListener("dragover", (event) => { event.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    drop.classList.remove("over");
    setImage(event.dataTransfer.files[0]);
  });
  $("image-clear").addEventListener("click", clearImage);
}

// -- running a question ---------------------------------------------------------------------------

async function run(p) {
  const mine = ++lastRun;
  $("error").textContent = "";
  if (!p.get("q")) { status("", "idle"); return; }
  $("ask").disabled = true;
  status("Asking\u2026", "running");
  const t0 = performance.now();
  try {
    const res = await apiJson("/query", { method: "POST", json: requestBody(p) });
    if (mine !== lastRun) return;
    const t1 = performance.now();
    await renderResults(res);
    window.colgraphLast = res; // for tests and the curious: the JSON answer the page drew
    status(`Answered in ${(t1 - t0).toFixed(0)} ms (drawn in ${(performance.now() - t1).toFixed(0)} ms).`, "done");
  } catch (exc) {
    if (mine !== lastRun) return;
    clear($("results"));
    $("error").textContent = exc instanceof ApiError ? `The service answered ${exc.status}: ${exc.detail}` : String(exc);
    status("Failed.", "error");
  } finally {
    $("ask").disabled = false;
  }
}

function section(id, title, ...children) {
  return el("section", { id, class: "result", "aria-labelledby": `${id}-title` }, el("h3", { id: `${id}-title` }, title), ...children);
}

function explain(text) {
  return el("span", { class: "explain" }, text);
}

function nodeWhy(d) {
  const parts = [];
  if (d.role === "seed") parts.push("seed: matched the question (hop 0)");
  else if (d.role === "expanded") parts.push(`expanded: reached ${d.hop} hop${d.hop === 1 ? "" : "s"} from the seeds`);
  else if (d.role === "visual") parts.push("ranked by the visual ranker");
  else if (d.role === "context") parts.push("the image a ranked region lies on");
  if (d.visual_rank) parts.push(`visual rank ${d.visual_rank} (score ${fmt(d.visual_score)})`);
  if (d.evidence && d.evidence.includes("gstar")) parts.push("in the evidence graph G*");
  else if (d.evidence && d.evidence.includes("ge")) parts.push("in the evidence graph G_E");
  return parts.join("; ");
}

function citation(rec, pages) {
  const doc = rec.doc_id;
  const segs = rec.segments || [];
  const docPages = (pages || {})[doc];
  const found = new Set();
  if (docPages) for (const s of segs) for (const page of docPages[String(s)] || []) found.add(page);
  if (found.size) return `${doc}, p. ${[...found].sort((a, b) => a - b).join(", ")}`;
  return segs.length ? `${doc}, segment ${segs.join(", ")}` : doc;
}

async function renderResults(res) {
  const out = clear($("results"));
  const view = res.view || { nodes: [], edges: [], pages: {} };
  if (res.answer) {
    out.appendChild(section("answer-result", "Answer",
      res.answer.error ? el("p", { class: "error" }, `The generator failed: ${res.answer.error}`)
        : el("p", { class: "answer-text" }, res.answer.text || "")));
  }
  // documents
  const top = Math.max(...res.documents.map((d) => d.score), 1e-9);
  out.appendChild(section("documents-hit", `Documents (${res.documents.length})`,
    el("ol", { class: "docs" }, res.documents.map((d, i) => el("li", { "data-doc": d.doc_id },
      el("a", { href: `/ui/documents?doc=${encodeURIComponent(d.doc_id)}` }, d.doc_id), " ",
      el("span", { class: "bar", "aria-hidden": "true" }, el("span", { style: null, class: "fill", "data-w": 0 })),
      el("span", { class: "score" }, fmt(d.score)),
      explain(` rank ${i + 1} by recall (${(res.recall_sides || []).join(" + ") || "text"} side)`))))));
  out.querySelectorAll("#documents-hit li").forEach((li, i) => {
    li.querySelector(".fill").style.width = `${Math.max(2, (100 * res.documents[i].score) / top).toFixed(1)}%`;
  });
  // timings
  out.appendChild(section("timings", "Timings", timingBar(res.timings, res.batch)));
  // the subgraph
  const counts = { seed: 0, expanded: 0, visual: 0, context: 0 };
  for (const d of view.nodes) counts[d.role] = (counts[d.role] || 0) + 1;
  const details = el("div", { class: "node-info", "aria-live": "polite" }, "Hover or focus a node to see its description.");
  const holder = el("div", { class: "graph-holder" });
  const kinds = [...new Set(view.nodes.map((d) => d.kind))];
  out.appendChild(section("subgraph", "Subgraph",
    el("p", { class: "caption" }, `${view.nodes.length} nodes drawn (${counts.seed} seeds, ${counts.expanded} expanded, `
      + `${counts.visual} ranked images or regions, ${counts.context} their images), ${view.edges.length} edges`
      + (view.truncated ? `; the subgraph has ${view.subgraph_nodes} nodes, the first ${view.limit} by hop are drawn` : "")),
    legend(kinds, ["seed", "expanded", "visual"]), holder, details, nodeTable(view.nodes)));
  drawGraph(holder, view, {
    title: `the subgraph: ${view.nodes.length} nodes`,
    label: (d) => `${d.kind} ${d.name}, ${d.role}`,
    onFocus: (d) => showNode(details, d),
    onActivate: (d) => showNode(details, d),
  });
  // images
  out.appendChild(section("images", `Images (${res.images.length} ranked)`, imageCards(res)));
  // records
  out.appendChild(section("records", `Records (${res.evidence.records.length})`, recordTable(res.evidence.records, view.pages)));
  // context
  out.appendChild(section("context", "Context",
    el("details", {}, el("summary", {}, `The rendered context (${res.context.length} characters)`),
      el("pre", { class: "context" }, res.context))));
  if (res.notes && res.notes.length) {
    out.appendChild(section("notes", "Notes", el("ul", {}, res.notes.map((n) => el("li", {}, n)))));
  }
}

function showNode(holder, d) {
  clear(holder).append(
    el("strong", {}, d.name), ` \u2014 ${d.kind}${d.type ? ` (${d.type})` : ""}, document ${d.doc_id ?? ""}`,
    el("p", {}, d.text || ""), el("p", { class: "why" }, nodeWhy(d)));
}

function nodeTable(nodes) {
  return el("details", { class: "node-table" }, el("summary", {}, "The drawn nodes as a table"),
    el("table", {}, el("thead", {}, el("tr", {}, ["id", "name", "kind", "document", "hop", "why"].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, nodes.map((d) => el("tr", { "data-id": d.id },
        el("td", {}, String(d.id)), el("td", {}, d.name), el("td", {}, d.kind), el("td", {}, d.doc_id || ""),
        el("td", {}, d.hop == null ? "" : String(d.hop)), el("td", {}, nodeWhy(d)))))));
}

function timingBar(timings, batch) {
  const stages = Object.entries(timings || {}).filter(([, s]) => typeof s === "number" && s >= 0);
  const total = stages.reduce((a, [, s]) => a + s, 0) || 1e-9;
  const bar = el("div", { class: "timebar", role: "img", "aria-label": stages.map(([k, s]) => `${k} ${ms(s)}`).join(", ") });
  stages.forEach(([k, s], i) => {
    const part = el("span", { class: `stage stage-${i % 8}`, title: `${k}: ${ms(s)}` });
    part.style.width = `${((100 * s) / total).toFixed(2)}%`;
    bar.appendChild(part);
  });
  const items = stages.map(([k, s], i) => el("li", {}, el("span", { class: `key stage-${i % 8}`, "aria-hidden": "true" }), ` ${k} ${ms(s)}`));
  if (batch) items.push(el("li", {}, `queued ${fmt(batch.queue_ms, 1)} ms, batch of ${batch.size}`));
  return el("div", {}, bar, el("ul", { class: "timings" }, items), el("p", { class: "caption" }, `total ${ms(total)} (the batch's stages)`));
}

function imageCards(res) {
  const groups = new Map();
  res.images.forEach((h, i) => {
    const key = `${h.doc_id}\u0000${h.image}`;
    if (!groups.has(key)) groups.set(key, { doc_id: h.doc_id, image: h.image, hits: [] });
    groups.get(key).hits.push({ ...h, rank: i + 1 });
  });
  const grid = el("div", { class: "cards" });
  for (const g of groups.values()) grid.appendChild(imageCard(g, res));
  return grid;
}

function imageCard(g, res) {
  const own = g.hits.find((h) => h.kind === "image");
  const regions = g.hits.filter((h) => h.kind === "region" && h.bbox);
  const best = g.hits[0];
  const frame = svg("svg", { class: "thumb", viewBox: "0 0 320 240", role: "img",
    "aria-label": `${g.image} of ${g.doc_id} with ${regions.length} matched region${regions.length === 1 ? "" : "s"}` });
  const card = el("figure", { class: "card", "data-doc": g.doc_id, "data-image": g.image }, frame,
    el("figcaption", {},
      el("strong", {}, g.image || "(image)"), ` in ${g.doc_id}`,
      el("br"), own ? `image rank ${own.rank}, score ${fmt(own.score)}` : `best rank ${best.rank}`,
      el("ol", { class: "regions" }, regions.map((h) => el("li", {},
        `#${h.rank} ${h.name}: ${short(h.text, 60)} (${fmt(h.score)})`))),
      explain(`visual rank ${best.rank} of ${res.images.length} by ${res.image_units}`)));
  const draw = (w, h, href) => {
    clear(frame);
    frame.setAttribute("viewBox", `0 0 ${w} ${h}`);
    if (href) frame.appendChild(svg("image", { href, x: 0, y: 0, width: w, height: h }));
    else {
      frame.appendChild(svg("rect", { class: "placeholder", x: 0, y: 0, width: w, height: h }));
      frame.appendChild(svg("text", { class: "placeholder-text", x: w / 2, y: h / 2, text: "no pixels kept for this image" }));
    }
    for (const r of regions) {
      const [x1, y1, x2, y2] = r.bbox;
      frame.appendChild(svg("g", { class: "region" },
        svg("rect", { class: "region-box", "data-node": r.node, "data-bbox": r.bbox.join(","),
          x: (x1 * w).toFixed(2), y: (y1 * h).toFixed(2), width: ((x2 - x1) * w).toFixed(2), height: ((y2 - y1) * h).toFixed(2) },
          svg("title", { text: `#${r.rank} ${r.name}: ${r.text} (${fmt(r.score)})` })),
        svg("text", { class: "region-label", x: (x1 * w + 3).toFixed(1), y: (y1 * h + 13).toFixed(1), text: `#${r.rank} ${fmt(r.score, 2)}` })));
    }
    card.dataset.drawn = href ? "image" : "placeholder";
  };
  draw(320, 240, null);
  card.dataset.drawn = "";
  thumbnail(g.doc_id, g.image).then(([href, w, h]) => draw(w, h, href), () => draw(320, 240, null));
  return card;
}

const thumbs = new Map();
function thumbnail(doc, ref) {
  const key = `${doc}\u0000${ref}`;
  if (!thumbs.has(key)) {
    thumbs.set(key, (async () => {
      const res = await api(`/documents/${encodeURIComponent(doc)}/image?ref=${encodeURIComponent(ref)}&size=320`);
      const href = URL.createObjectURL(await res.blob());
      const img = new Image();
      img.src = href;
      await img.decode();
      return [href, img.naturalWidth, img.naturalHeight];
    })());
    thumbs.get(key).catch(() => thumbs.delete(key));
  }
  return thumbs.get(key);
}

const RECORDS_SHOWN = 25; // more are in the table but hidden until asked for

function recordTable(records, pages) {
  if (!records.length) return el("p", {}, "No records.");
  const table = el("table", { class: "records" },
    el("thead", {}, el("tr", {}, ["#", "subject", "predicate", "object", "evidence", "cited", "score", "from"].map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, records.map((r, i) => el("tr", { hidden: i >= RECORDS_SHOWN },
      el("td", {}, String(i + 1)), el("td", {}, r.subject), el("td", {}, r.predicate), el("td", {}, r.object),
      el("td", { title: r.evidence }, short(r.evidence, 160)), el("td", { class: "cite" }, citation(r, pages)),
      el("td", {}, r.score == null ? "\u2013" : fmt(r.score)),
      el("td", {}, r.source, explain(r.source === "image" ? ` the image ${r.image || ""} matched` : ` relation edge ${r.edge}`))))));
  if (records.length <= RECORDS_SHOWN) return table;
  const more = el("button", { type: "button", "aria-expanded": "false" }, `Show all ${records.length} records`);
  more.addEventListener("click", () => {
    const open = more.getAttribute("aria-expanded") !== "true";
    table.querySelectorAll("tbody tr").forEach((tr, i) => { tr.hidden = !open && i >= RECORDS_SHOWN; });
    more.setAttribute("aria-expanded", String(open));
    more.textContent = open ? `Show the first ${RECORDS_SHOWN} records` : `Show all ${records.length} records`;
  });
  return el("div", {}, table, more);
}

// -- start ------------------------------------------------------------------------------------

async function queryView() {
  $("view-query").hidden = false;
  $("nav-ask").setAttribute("aria-current", "page");
  wireImage();
  try {
    await loadInfo();
    fillChoices();
  } catch (exc) {
    $("error").textContent = `Cannot read the service's settings: ${exc.message || exc}`;
  }
  applyState(new URLSearchParams(location.search));
  $("ask-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const p = formState();
    if (!p.get("q")) { $("error").textContent = "Type a question first."; $("q").focus(); return; }
    history.pushState(null, "", `/?${p.toString()}`);
    $("share").href = `/?${p.toString()}`;
    run(p);
  });
  $("explain").addEventListener("change", () => {
    setExplain();
    const p = new URLSearchParams(location.search);
    if ($("explain").checked) p.set("explain", "1"); else p.delete("explain");
    history.replaceState(null, "", `/?${p.toString()}`);
    $("share").href = `/?${p.toString()}`;
  });
  window.addEventListener("popstate", () => {
    const p = new URLSearchParams(location.search);
    applyState(p);
    run(p);
  });
  const p = new URLSearchParams(location.search);
  if (p.get("q")) run(p);
  else status("", "idle");
}

if (location.pathname.startsWith("/ui/documents")) documentsView();
else queryView();
