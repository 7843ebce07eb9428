// A graph drawn as SVG with a small force layout of our own (Fruchterman-Reingold within each
// connected component: every pair repels, every edge pulls, a cooling step limit; O(n^2) a step,
// so callers keep n to a bounded neighbourhood: the service sends at most 300 nodes by default).
// Deterministic: start positions are rings by hop on the golden angle, no randomness.

import { clear, el, short, svg } from "./dom.js";

const WIDTH = 1000;
const HEIGHT = 700;

// One connected component laid out around (0, 0): positions in x, y for the nodes `members`.
function layoutComponent(members, links, x, y, hopOf, steps) {
  const n = members.length;
  const golden = Math.PI * (3 - Math.sqrt(5));
  const k = 58;
  const k2 = k * k;
  members.forEach((i, j) => {
    const r = 20 + hopOf[i] * 60 + Math.sqrt(j) * 12;
    x[i] = r * Math.cos(j * golden);
    y[i] = r * Math.sin(j * golden);
  });
  if (n === 1) { x[members[0]] = 0; y[members[0]] = 0; return; }
  const dx = new Float64Array(x.length);
  const dy = new Float64Array(x.length);
  let temp = 10 * Math.sqrt(n) + 20;
  for (let step = 0; step < steps; step++) {
    for (const i of members) { dx[i] = 0; dy[i] = 0; }
    for (let a = 0; a < n; a++) {
      const i = members[a];
      for (let b = a + 1; b < n; b++) {
        const j = members[b];
        let ex = x[i] - x[j];
        let ey = y[i] - y[j];
        let d2 = ex * ex + ey * ey;
        if (d2 < 0.01) { ex = 0.1 * (((a + b) % 3) - 1 || 1); ey = 0.1; d2 = 0.02; }
        if (d2 > 90000) continue; // beyond 300 units: no push (keeps big components compact)
        const f = k2 / d2;
        dx[i] += ex * f; dy[i] += ey * f;
        dx[j] -= ex * f; dy[j] -= ey * f;
      }
    }
    for (const [i, j] of links) {
      const ex = x[i] - x[j];
      const ey = y[i] - y[j];
      const d = Math.sqrt(ex * ex + ey * ey) || 0.01;
      const f = d / k;
      dx[i] -= ex * f; dy[i] -= ey * f;
      dx[j] += ex * f; dy[j] += ey * f;
    }
    for (const i of members) {
      dx[i] -= x[i] * 0.02; // a weak pull to the component's centre
      dy[i] -= y[i] * 0.02;
      const d = Math.sqrt(dx[i] * dx[i] + dy[i] * dy[i]) || 1;
      const m = Math.min(d, temp);
      x[i] += (dx[i] / d) * m;
      y[i] += (dy[i] / d) * m;
    }
    temp = Math.max(0.5, temp * 0.96);
  }
}

/**
 * Positions {id -> [x, y]} in a WIDTH x HEIGHT box: each connected component laid out on its
 * own (force-directed), then the components packed in rows, largest first, and the whole
 * scaled to fit.
 */
export function layout(nodes, edges, iterations) {
  const n = nodes.length;
  const at = new Map(nodes.map((d, i) => [d.id, i]));
  const x = new Float64Array(n);
  const y = new Float64Array(n);
  const parent = Array.from({ length: n }, (_, i) => i);
  const find = (i) => { while (parent[i] !== i) { parent[i] = parent[parent[i]]; i = parent[i]; } return i; };
  for (const e of edges) {
    const a = at.get(e.src);
    const b = at.get(e.dst);
    if (a !== undefined && b !== undefined && a !== b) parent[find(a)] = find(b);
  }
  const groups = new Map();
  for (let i = 0; i < n; i++) {
    const r = find(i);
    if (!groups.has(r)) groups.set(r, []);
    groups.get(r).push(i);
  }
  const links = new Map([...groups.keys()].map((r) => [r, []]));
  for (const e of edges) {
    const a = at.get(e.src);
    const b = at.get(e.dst);
    if (a === undefined || b === undefined || a === b) continue;
    links.get(find(a)).push([a, b]);
  }
  const hopOf = nodes.map((d) => (d.hop == null ? 3 : d.hop));
  const steps = iterations || (n <= 60 ? 300 : n <= 150 ? 200 : 120);
  const boxes = [];
  for (const [r, members] of groups) {
    layoutComponent(members, links.get(r), x, y, hopOf, steps);
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (const i of members) {
      x0 = Math.min(x0, x[i]); x1 = Math.max(x1, x[i]);
      y0 = Math.min(y0, y[i]); y1 = Math.max(y1, y[i]);
    }
    boxes.push({ members, x0, y0, w: x1 - x0 + 90, h: y1 - y0 + 40 });
  }
  // pack: rows about as wide as the drawing's aspect asks for
  boxes.sort((a, b) => b.members.length - a.members.length || b.w * b.h - a.w * a.h);
  const area = boxes.reduce((s, b) => s + b.w * b.h, 0);
  const rowWidth = Math.max(Math.sqrt(area * (WIDTH / HEIGHT)), ...boxes.map((b) => b.w));
  let cx = 0, cy = 0, rowH = 0;
  for (const b of boxes) {
    if (cx > 0 && cx + b.w > rowWidth) { cx = 0; cy += rowH; rowH = 0; }
    for (const i of b.members) { x[i] += cx - b.x0 + 30; y[i] += cy - b.y0 + 20; }
    cx += b.w;
    rowH = Math.max(rowH, b.h);
  }
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (let i = 0; i < n; i++) {
    x0 = Math.min(x0, x[i]); x1 = Math.max(x1, x[i]);
    y0 = Math.min(y0, y[i]); y1 = Math.max(y1, y[i]);
  }
  const pad = 40;
  const s = Math.min((WIDTH - 2 * pad - 120) / Math.max(x1 - x0, 1), (HEIGHT - 2 * pad) / Math.max(y1 - y0, 1), 2.5);
  const mx = (x0 + x1) / 2;
  const my = (y0 + y1) / 2;
  const pos = new Map();
  nodes.forEach((d, i) => pos.set(d.id, [WIDTH / 2 - 50 + (x[i] - mx) * s, HEIGHT / 2 + (y[i] - my) * s]));
  return pos;
}

function shape(d) {
  const seed = d.role === "seed";
  switch (d.kind) {
    case "entity":
      return svg("circle", { r: seed ? 11 : 8 });
    case "segment":
    case "table":
      return svg("rect", { x: -9, y: -7, width: 18, height: 14, rx: 2 });
    case "image":
      return svg("rect", { x: -11, y: -9, width: 22, height: 18, rx: 1 });
    case "region":
      return svg("rect", { x: -7, y: -6, width: 14, height: 12 });
    case "document":
      return svg("polygon", { points: "0,-13 12,-6 12,7 0,13 -12,7 -12,-6" });
    default:
      return svg("circle", { r: 7 });
  }
}

/**
 * Draws `graph` ({nodes: [{id, kind, name, type, text, hop, role}], edges: [{src, dst, kind,
 * label}]}) into `holder`. Options: `label(d)` the aria label, `onActivate(d)` for a click or
 * Enter on a node, `onFocus(d)` when a node is hovered or focused, `title` the SVG's label.
 * Returns {svg, layoutMs}.
 */
export function drawGraph(holder, graph, options = {}) {
  clear(holder);
  const t0 = performance.now();
  const pos = layout(graph.nodes, graph.edges);
  const layoutMs = performance.now() - t0;
  const root = svg("svg", {
    class: ["graph", graph.nodes.length > 120 && "dense"], viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "group",
    "aria-label": options.title || `graph of ${graph.nodes.length} nodes and ${graph.edges.length} edges`,
  });
  const view = svg("g", { class: "viewport" });
  const edgeLayer = svg("g", { class: "edges" });
  const labelLayer = svg("g", { class: "edge-labels", "aria-hidden": "true" });
  const nodeLayer = svg("g", { class: "nodes" });
  const showLabels = graph.edges.length <= 160;
  const incident = new Map(graph.nodes.map((d) => [d.id, []]));
  for (const e of graph.edges) {
    const a = pos.get(e.src);
    const b = pos.get(e.dst);
    if (!a || !b) continue;
    const line = svg("line", {
      class: ["edge", `edge-${e.kind}`, e.evidence && "evidence"], x1: a[0].toFixed(1), y1: a[1].toFixed(1),
      x2: b[0].toFixed(1), y2: b[1].toFixed(1), "data-src": e.src, "data-dst": e.dst,
    }, svg("title", { text: e.text ? `${e.label}: ${e.text}` : e.label }));
    edgeLayer.appendChild(line);
    incident.get(e.src)?.push(line);
    incident.get(e.dst)?.push(line);
    if (showLabels && (e.kind === "relation" || e.kind === "scene")) {
      labelLayer.appendChild(svg("text", {
        class: "edge-label", x: ((a[0] + b[0]) / 2).toFixed(1), y: ((a[1] + b[1]) / 2).toFixed(1),
        text: short(e.label, 24),
      }));
    }
  }
  for (const d of graph.nodes) {
    const [px, py] = pos.get(d.id);
    const label = options.label ? options.label(d) : `${d.kind} ${d.name}`;
    const g = svg("g", {
      class: ["node", `kind-${d.kind}`, d.role && `role-${d.role}`, d.hop === 0 && "hop0"], transform: `translate(${px.toFixed(1)},${py.toFixed(1)})`,
      tabindex: 0, role: "button", "aria-label": label, "data-id": d.id, "data-kind": d.kind, "data-role": d.role || "",
    }, shape(d), svg("text", { class: "node-label", x: 13, y: 4, text: short(d.name, 22) }),
    svg("title", { text: d.text ? `${d.name} (${d.kind})\n${d.text}` : `${d.name} (${d.kind})` }));
    const lit = (on) => {
      g.classList.toggle("lit", on);
      for (const line of incident.get(d.id) || []) line.classList.toggle("lit", on);
    };
    g.addEventListener("mouseenter", () => { lit(true); options.onFocus?.(d); });
    g.addEventListener("mouseleave", () => lit(false));
    g.addEventListener("focus", () => { lit(true); options.onFocus?.(d); });
    g.addEventListener("blur", () => lit(false));
    g.addEventListener("click", () => options.onActivate?.(d));
    g.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") {
        event.preventDefault();
        options.onActivate?.(d);
      }
    });
    nodeLayer.appendChild(g);
  }
  view.append(edgeLayer, labelLayer, nodeLayer);
  root.appendChild(view);
  holder.appendChild(zoomControls(root, view));
  holder.appendChild(root);
  return { svg: root, layoutMs };
}

function zoomControls(root, view) {
  let scale = 1, tx = 0, ty = 0;
  const apply = () => view.setAttribute("transform", `translate(${tx.toFixed(1)},${ty.toFixed(1)}) scale(${scale.toFixed(3)})`);
  const zoom = (factor, cx = WIDTH / 2, cy = HEIGHT / 2) => {
    const s = Math.min(8, Math.max(0.25, scale * factor));
    tx = cx - ((cx - tx) * s) / scale;
    ty = cy - ((cy - ty) * s) / scale;
    scale = s;
    apply();
  };
  root.addEventListener("wheel", (event) => {
    event.preventDefault();
    const box = root.getBoundingClientRect();
    zoom(event.deltaY < 0 ? 1.2 : 1 / 1.2, ((event.clientX - box.left) / box.width) * WIDTH,
      ((event.clientY - box.top) / box.height) * HEIGHT);
  }, { passive: false });
  let drag = null;
  root.addEventListener("pointerdown", (event) => {
    if (event.target.closest(".node")) return;
    drag = [event.clientX, event.clientY, tx, ty];
    root.setPointerCapture(event.pointerId);
  });
  root.addEventListener("pointermove", (event) => {
    if (!drag) return;
    const box = root.getBoundingClientRect();
    tx = drag[2] + ((event.clientX - drag[0]) / box.width) * WIDTH;
    ty = drag[3] + ((event.clientY - drag[1]) / box.height) * HEIGHT;
    apply();
  });
  root.addEventListener("pointerup", () => { drag = null; });
  return el("div", { class: "zoom", role: "toolbar", "aria-label": "zoom" },
    el("button", { type: "button", onclick: () => zoom(1.25), "aria-label": "zoom in" }, "+"),
    el("button", { type: "button", onclick: () => zoom(0.8), "aria-label": "zoom out" }, "\u2212"),
    el("button", { type: "button", onclick: () => { scale = 1; tx = 0; ty = 0; apply(); }, "aria-label": "reset zoom" }, "reset"));
}

/** A legend of node kinds and roles. */
export function legend(kinds, roles) {
  const items = [];
  for (const k of kinds) {
    items.push(el("li", {}, svgSwatch(k, null), ` ${k}`));
  }
  for (const r of roles) {
    items.push(el("li", {}, svgSwatch("entity", r), ` ${r}`));
  }
  return el("ul", { class: "legend", "aria-label": "legend" }, items);
}

function svgSwatch(kind, role) {
  return svg("svg", { class: "swatch", viewBox: "-14 -14 28 28", width: 18, height: 18, "aria-hidden": "true" },
    svg("g", { class: ["node", `kind-${kind}`, role && `role-${role}`] }, shape({ kind, role })));
}
