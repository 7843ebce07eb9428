// Small DOM helpers. Everything that comes from the index (names, descriptions, texts, document
// ids) goes through text nodes (createTextNode / textContent) or setAttribute, never through
// innerHTML: entity names and descriptions are untrusted text.

const SVG_NS = "http://www.w3.org/2000/svg";

function fill(node, attrs, children) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") node.textContent = String(value);
    else if (key === "class") node.setAttribute("class", Array.isArray(value) ? value.filter(Boolean).join(" ") : value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** An HTML element: el("td", {class: "x"}, "text", otherNode). */
export function el(tag, attrs = {}, ...children) {
  return fill(document.createElement(tag), attrs, children);
}

/** An SVG element. */
export function svg(tag, attrs = {}, ...children) {
  return fill(document.createElementNS(SVG_NS, tag), attrs, children);
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

export function short(text, n) {
  text = text == null ? "" : String(text);
  return text.length <= n ? text : text.slice(0, n - 1) + "\u2026";
}

export function fmt(x, digits = 3) {
  return typeof x === "number" && Number.isFinite(x) ? x.toFixed(digits) : "\u2013";
}

export function ms(seconds) {
  return typeof seconds === "number" ? `${(seconds * 1000).toFixed(1)} ms` : "\u2013";
}

// -- the JSON API, with the bearer token the user gives when the service asks for one --------

const TOKEN_KEY = "colgraph-token";
let token = sessionStorage.getItem(TOKEN_KEY);
let asking = null;

export class ApiError extends Error {
  constructor(status, detail) {
    super(`${status}: ${detail}`);
    this.status = status;
    this.detail = detail;
  }
}

function detailText(body, fallback) {
  const d = body && body.detail;
  if (Array.isArray(d)) return d.map((e) => (e && e.loc ? `${e.loc}: ${e.msg}` : JSON.stringify(e))).join("; ");
  if (typeof d === "string") return d;
  return d ? JSON.stringify(d) : fallback;
}

function askToken(again) {
  if (asking) return asking;
  const dialog = document.getElementById("token-dialog");
  const input = document.getElementById("token-input");
  const note = document.getElementById("token-note");
  note.textContent = again ? "That token was refused; try again." : "This service needs its bearer token.";
  input.value = "";
  asking = new Promise((resolve, reject) => {
    const done = (event) => {
      event.preventDefault();
      dialog.removeEventListener("submit", done);
      dialog.removeEventListener("cancel", cancel);
      dialog.close();
      asking = null;
      token = input.value.trim();
      sessionStorage.setItem(TOKEN_KEY, token);
      resolve(token);
    };
    const cancel = () => {
      dialog.removeEventListener("submit", done);
      dialog.removeEventListener("cancel", cancel);
      asking = null;
      reject(new ApiError(401, "no token given"));
    };
    dialog.addEventListener("submit", done);
    dialog.addEventListener("cancel", cancel);
    dialog.showModal();
    input.focus();
  });
  return asking;
}

/** fetch() of a route of this service with the token; asks for the token on a 401. */
export async function api(path, { method = "GET", json, signal } = {}) {
  for (let attempt = 0; ; attempt++) {
    const headers = { Accept: "application/json" };
    if (token) headers.Authorization = `Bearer ${token}`;
    if (json !== undefined) headers["Content-Type"] = "application/json";
    const res = await fetch(path, { method, headers, signal, body: json === undefined ? undefined : JSON.stringify(json) });
    if (res.status === 401 && attempt < 5) {
      await askToken(attempt > 0 || Boolean(token));
      continue;
    }
    if (!res.ok) {
      let body = null;
      try { body = await res.json(); } catch (e) { body = null; }
      throw new ApiError(res.status, detailText(body, res.statusText));
    }
    return res;
  }
}

export async function apiJson(path, options) {
  return (await api(path, options)).json();
}

/** Sets the page's status line (an aria-live region) and the body's data-state. */
export function status(text, state) {
  document.getElementById("status").textContent = text;
  if (state) document.body.dataset.state = state;
}
