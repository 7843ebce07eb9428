"""What the web page reads beside the query answer, computed on one index snapshot.

* :func:`document_rows`: the index's documents with their counts (``GET /documents``).
* :class:`DocumentAdjacency` and :func:`neighbourhood`: a bounded neighbourhood of one node of a
  document's graph (``GET /documents/{doc_id}/graph``): breadth first from the centre, hop by
  hop, at most ``limit`` nodes (when a hop does not fit, its nodes of highest degree are kept),
  and the edges among them. A document of 10,000 nodes is never sent, let alone drawn, whole.
* :func:`node_rows`: a document's nodes, filtered by name and kind, one page at a time
  (``GET /documents/{doc_id}/nodes``).
* :func:`describe_view`: the query answer's ``view`` (``"view": true`` in the request): the
  subgraph's nodes described (kind, name, type, text, hop, role), the image hits and their
  images, the edges among them with their labels, and the pages of the cited segments.
* :func:`thumbnail`: an image of a document as a small JPEG (``GET /documents/{doc_id}/image``),
  from the pixels the index kept: in-memory pixels, the image file the index names as the
  node's source, or a PDF page (or a box of one) re-rendered from the uploaded PDF in a child
  process, so a hostile upload cannot crash or hang the server.

Node ids: the document routes use the document's local node ids (stable while the document is
in the index); the query answer's ``view`` uses the merged graph's ids, as ``subgraph.nodes``
and ``images[].node`` do.
"""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from ..graph.kinds import EdgeKind, NodeKind
from ..kg.pages import parse_page_source

TEXT_CHARS = 400  # node and edge texts sent to the page are cut to this many characters (ours)
KIND_NAMES = {int(k): k.name.lower() for k in NodeKind}
KIND_OF_NAME = {v: k for k, v in KIND_NAMES.items()}
EDGE_NAMES = {int(k): k.name.lower() for k in EdgeKind}
CACHE_DOCUMENTS = 8  # adjacency of this many documents kept per snapshot
CACHE_THUMBNAILS = 128  # thumbnails kept per snapshot
RENDER_TIMEOUT_S = 30  # a PDF page render in the child process (ours)
RENDER_MAX_PIXELS = 25_000_000  # largest page render a thumbnail asks PDFium for
PAGE_SOURCE = re.compile(r"^(?P<doc>.+) page (?P<page>[0-9]+)(?:, box \((?P<box>[-0-9., ]+)\))?$")
_renders = threading.BoundedSemaphore(2)  # PDF renders at once (each is a child process)


def short(text: str, n: int = TEXT_CHARS) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= n else text[:n - 1] + "\u2026"


def _lru_get(cache: OrderedDict, key, make, size: int):
    hit = cache.get(key)
    if hit is not None:
        cache.move_to_end(key)
        return hit
    value = make()
    cache[key] = value
    while len(cache) > size:
        cache.popitem(last=False)
    return value


# -- documents --------------------------------------------------------------------------------

COUNT_KEYS = ("nodes", "edges", "segments", "entities", "relations", "images", "regions", "tables")


def document_rows(index, offset: int, limit: int) -> dict:
    """One page of the index's documents (insertion order) with their title and counts."""
    ids = index.documents
    rows = []
    for doc_id in ids[offset:offset + limit]:
        g = index.document(doc_id)
        c = g.counts
        rows.append({"doc_id": doc_id, "title": g.title, "counts": {k: int(c.get(k, 0)) for k in COUNT_KEYS}})
    return {"documents": rows, "total": len(ids), "offset": offset, "limit": limit}


class DocumentAdjacency:
    """A document graph's undirected adjacency (CSR over both edge directions) and degrees."""

    def __init__(self, g):
        self.g = g
        n, m = g.n_nodes, g.n_edges
        src, dst = g.edge_src.astype(np.int64), g.edge_dst.astype(np.int64)
        ends = np.concatenate([src, dst])
        order = np.argsort(ends, kind="stable")
        self.neighbour = np.concatenate([dst, src])[order]
        self.edge = np.concatenate([np.arange(m), np.arange(m)])[order]
        self.offsets = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(ends, minlength=n), out=self.offsets[1:])
        self.degree = np.diff(self.offsets)
        self.src, self.dst = src, dst

    @property
    def n(self) -> int:
        return int(self.degree.size)

    def neighbours_of(self, nodes: np.ndarray) -> np.ndarray:
        starts, lens = self.offsets[nodes], self.degree[nodes]
        total = int(lens.sum())
        if not total:
            return np.zeros(0, np.int64)
        shift = np.repeat(starts - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
        return self.neighbour[shift + np.arange(total)]


def adjacency(snapshot, doc_id: str) -> DocumentAdjacency:
    """The document's adjacency, cached on the snapshot (which never changes)."""
    cache = snapshot.view_cache.setdefault("adjacency", OrderedDict())
    with snapshot.view_lock:
        return _lru_get(cache, doc_id, lambda: DocumentAdjacency(snapshot.index.document(doc_id)), CACHE_DOCUMENTS)


def _node_row(g, v: int, degree: int) -> dict:
    kind = KIND_NAMES.get(int(g.node_kind[v]), str(int(g.node_kind[v])))
    row = {"id": v, "kind": kind, "name": g.node_name[v], "type": g.node_type[v], "degree": degree}
    if kind in ("image", "region"):
        box = g.node_bbox[v]
        row["bbox"] = None if np.isnan(box).any() else [round(float(x), 4) for x in box]
        image = v if kind == "image" else int(g.node_image[v])
        row["image"] = g.node_name[image] if image >= 0 else None
    return row


def _edge_label(kind: int, keywords: str, text: str) -> str:
    if kind == EdgeKind.RELATION:
        return keywords or "related to"
    if kind == EdgeKind.SCENE:
        return text or "scene"
    return EDGE_NAMES.get(kind, str(kind))


def neighbourhood(adj: DocumentAdjacency, center: int, hops: int, limit: int, max_edges: int) -> dict:
    """At most `limit` nodes within `hops` of `center` (breadth first; a hop that does not fit
    keeps its nodes of highest degree, ties by id) and at most `max_edges` edges among them."""
    g, n = adj.g, adj.n
    seen = np.zeros(n, bool)
    seen[center] = True
    hop_of = {center: 0}
    chosen = [center]
    frontier = np.asarray([center], np.int64)
    truncated = False
    for h in range(1, hops + 1):
        nb = adj.neighbours_of(frontier)
        nb = np.unique(nb[~seen[nb]])
        if not nb.size:
            break
        room = limit - len(chosen)
        if nb.size > room:
            truncated = True
            nb = nb[np.lexsort((nb, -adj.degree[nb]))][:room]
        seen[nb] = True
        for v in nb.tolist():
            hop_of[v] = h
        chosen.extend(nb.tolist())
        frontier = nb
        if len(chosen) >= limit:
            break
    inset = np.zeros(n, bool)
    inset[chosen] = True
    edges = np.flatnonzero(inset[adj.src] & inset[adj.dst])
    if edges.size > max_edges:
        truncated = True
        edges = edges[:max_edges]
    drawn_degree = np.bincount(np.concatenate([adj.src[edges], adj.dst[edges]]), minlength=n) if edges.size \
        else np.zeros(n, np.int64)
    nodes = []
    for v in chosen:
        row = _node_row(g, v, int(adj.degree[v]))
        row["text"] = short(g.node_text[v])
        row["hop"] = hop_of[v]
        row["hidden"] = int(adj.degree[v] - drawn_degree[v])  # incident edges not drawn
        nodes.append(row)
    out_edges = []
    for e in edges.tolist():
        k = int(g.edge_kind[e])
        out_edges.append({"id": e, "src": int(adj.src[e]), "dst": int(adj.dst[e]), "kind": EDGE_NAMES.get(k, str(k)),
                          "label": short(_edge_label(k, g.edge_keywords[e], g.edge_text[e]), 80),
                          "text": short(g.edge_text[e]) if k == EdgeKind.RELATION else ""})
    c = g.counts
    return {"doc_id": g.doc_id, "title": g.title, "counts": {k: int(c.get(k, 0)) for k in COUNT_KEYS},
            "center": center, "hops": hops, "limit": limit, "truncated": truncated or _more_beyond(adj, seen, frontier),
            "nodes": nodes, "edges": out_edges}


def _more_beyond(adj: DocumentAdjacency, seen: np.ndarray, frontier: np.ndarray) -> bool:
    nb = adj.neighbours_of(frontier)
    return bool((~seen[nb]).any()) if nb.size else False


def node_rows(adj: DocumentAdjacency, match: str, kind: str | None, offset: int, limit: int) -> dict:
    """One page of the document's nodes (by id) whose name contains `match` (case-folded)."""
    g = adj.g
    ids = np.arange(adj.n)
    if kind is not None:
        ids = ids[g.node_kind == KIND_OF_NAME[kind]]
    if match:
        m = match.casefold()
        names = g.node_name
        ids = np.asarray([v for v in ids.tolist() if m in names[v].casefold()], np.int64)
    page = ids[offset:offset + limit].tolist()
    return {"doc_id": g.doc_id, "total": int(ids.size), "offset": offset, "limit": limit,
            "nodes": [_node_row(g, v, int(adj.degree[v])) for v in page]}


# -- the query answer's view ---------------------------------------------------------------------

def segment_pages(g) -> dict[int, list[int]]:
    """Pages of each segment ordinal of a PDF document: the pages the segment records in its
    source (exact: the pages of its sections, :mod:`colgraph_engine.kg.pages`); for a segment of
    an index written before segments recorded them, the pages whose page image the segment holds,
    else (a segment that runs on) the last page before it. Empty for a document without pages."""
    seg_nodes = g.nodes_of(NodeKind.SEGMENT)
    if not seg_nodes.size:
        return {}
    exact = {i: list(p) for i, v in enumerate(seg_nodes.tolist()) if (p := parse_page_source(g.node_source[v])[0])}
    if len(exact) == seg_nodes.size:
        return exact
    return {**_held_pages(g, seg_nodes), **exact}


def _held_pages(g, seg_nodes: np.ndarray) -> dict[int, list[int]]:
    """The older rule of :func:`segment_pages`: pages of the page images each segment holds."""
    ordinal = {int(v): i for i, v in enumerate(seg_nodes.tolist())}
    pages: dict[int, set[int]] = {}
    contains = np.flatnonzero(g.edge_kind == EdgeKind.CONTAINS)
    for e in contains.tolist():
        s, v = int(g.edge_src[e]), int(g.edge_dst[e])
        if s in ordinal and int(g.node_kind[v]) == NodeKind.IMAGE:
            m = PAGE_SOURCE.match(g.node_source[v])
            if m and m.group("box") is None:
                pages.setdefault(ordinal[s], set()).add(int(m.group("page")))
    if not pages:
        return {}
    out, last = {}, None
    for i in range(seg_nodes.size):
        if i in pages:
            out[i] = sorted(pages[i])
            last = out[i][-1]
        elif last is not None:
            out[i] = [last]
    return out


def describe_view(snapshot, result, limit: int, max_edges: int) -> dict:
    """The drawn subgraph of one result (see the module docstring), on the snapshot it ran on."""
    index = snapshot.index
    view = snapshot.pipeline(result.config).view()
    nodes = np.asarray(result.subgraph_nodes, np.int64)
    hops = np.asarray(result.subgraph_hops, np.int64)
    order = np.argsort(hops, kind="stable")
    picked = nodes[order][:limit].tolist()
    hop_of = dict(zip(nodes.tolist(), hops.tolist()))
    truncated = nodes.size > limit
    visual_rank = {}
    for r, h in enumerate(result.images, start=1):
        visual_rank.setdefault(int(h.node), (r, float(h.score)))
    extra = []
    for h in result.images:  # every ranked image and region, and the image a region is on
        v = int(h.node)
        extra.append(v)
        if h.kind == "region":
            d = index.describe_node(v)
            parent = int(index.document(d["doc_id"]).node_image[d["local"]])
            if parent >= 0:
                extra.append(v - d["local"] + parent)
    in_picked = set(picked)
    for v in extra:
        if v not in in_picked:
            in_picked.add(v)
            picked.append(v)
    ge = set(np.asarray(result.evidence.ge_nodes).tolist())
    gstar = set(np.asarray(result.evidence.gstar_nodes).tolist())
    out_nodes = []
    for v in picked:
        d = index.describe_node(v)
        hop = hop_of.get(v)
        role = "seed" if hop == 0 else "expanded" if hop is not None else "visual" if v in visual_rank else "context"
        row = {"id": v, "doc_id": d["doc_id"], "local": d["local"], "kind": d["kind"], "name": d["name"],
               "type": d["type"], "text": short(d["text"]), "hop": hop, "role": role,
               "degree": int(view.degree[v]), "evidence": [s for s, k in (("ge", ge), ("gstar", gstar)) if v in k]}
        if v in visual_rank:
            row["visual_rank"], row["visual_score"] = visual_rank[v]
        if d["kind"] in ("image", "region"):
            row["bbox"] = None if d["bbox"] is None else [round(x, 4) for x in d["bbox"]]
            row["image"] = d["image"]
        out_nodes.append(row)
    inset = np.zeros(view.node_kind.size, bool)
    inset[picked] = True
    edges = np.flatnonzero(inset[view.edge_src] & inset[view.edge_dst])
    if edges.size > max_edges:
        truncated = True
        edges = edges[:max_edges]
    evidence_edges = {int(r["edge"]) for r in result.evidence.relations if "edge" in r}
    out_edges = []
    for e in edges.tolist():
        k = int(view.edge_kind[e])
        keywords = text = ""
        if k in (EdgeKind.RELATION, EdgeKind.SCENE):
            de = index.describe_edge(e)
            keywords, text = de["keywords"], de["text"]
        out_edges.append({"id": e, "src": int(view.edge_src[e]), "dst": int(view.edge_dst[e]),
                          "kind": EDGE_NAMES.get(k, str(k)), "label": short(_edge_label(k, keywords, text), 80),
                          "text": short(text) if k == EdgeKind.RELATION else "", "evidence": e in evidence_edges})
    cited = {r.doc_id for r in result.evidence.records} | {s["doc_id"] for s in result.evidence.sources}
    pages = {}
    for doc_id in sorted(cited):
        if doc_id in index:
            p = segment_pages(index.document(doc_id))
            if p:
                pages[doc_id] = {str(k): v for k, v in p.items()}
    return {"generation": snapshot.generation, "limit": limit, "truncated": bool(truncated),
            "subgraph_nodes": int(nodes.size), "nodes": out_nodes, "edges": out_edges, "pages": pages}


# -- thumbnails ----------------------------------------------------------------------------------

class NoPixels(LookupError):
    """The index keeps no pixels for the image (or no such image)."""


class BadImage(ValueError):
    """The image's pixels cannot be read, or are over the pixel limit."""


def image_node(g, ref: str) -> int:
    for v in g.nodes_of(NodeKind.IMAGE).tolist():
        if g.node_name[v] == ref:
            return v
    raise NoPixels(f"ref: document {g.doc_id!r} has no image {ref!r}")


def _open_file(path: Path, max_pixels: int):
    from PIL import Image, UnidentifiedImageError

    try:
        im = Image.open(path)
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise BadImage(f"the image file cannot be read ({type(exc).__name__})") from None
    if im.size[0] * im.size[1] > max_pixels:
        im.close()
        raise BadImage(f"the image has {im.size[0]}x{im.size[1]} pixels, over the limit of {max_pixels}")
    return im


def _pil(pixels, max_pixels: int):
    """A PIL image of in-memory pixels (array, PIL image, path, or a spool's lazy pixels)."""
    from PIL import Image

    if isinstance(pixels, (str, os.PathLike)):
        return _open_file(Path(pixels), max_pixels)
    if isinstance(pixels, np.ndarray):
        if pixels.dtype != np.uint8 or pixels.ndim not in (2, 3):
            raise BadImage("the image's pixels are not uint8 [H, W(, 3)]")
        return Image.fromarray(pixels)
    if hasattr(pixels, "load") and not isinstance(pixels, Image.Image):  # SpooledPixels
        return pixels.load()
    if isinstance(pixels, Image.Image):
        return pixels.copy()  # the index's own image stays open
    raise BadImage(f"the image's pixels are a {type(pixels).__name__}")


_RENDER = r"""
import math, sys
import pypdfium2 as pdfium
path, number, size, max_pixels = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
box = [float(x) for x in sys.argv[5].split(",")] if len(sys.argv) > 5 else [0.0, 0.0, 1.0, 1.0]
pdf = pdfium.PdfDocument(path)
if not 1 <= number <= len(pdf):
    sys.exit(3)
page = pdf[number - 1]
w, h = page.get_size()
bw, bh = max(box[2] - box[0], 1e-3) * w, max(box[3] - box[1], 1e-3) * h
scale = min(size / max(bw, bh, 1e-3), 8.0, math.sqrt(max_pixels / max(w * h, 1.0)))
bitmap = page.render(scale=scale)
im = bitmap.to_pil().convert("RGB")
W, H = im.size
im = im.crop((int(box[0] * W), int(box[1] * H), max(int(box[0] * W) + 1, round(box[2] * W)),
              max(int(box[1] * H) + 1, round(box[3] * H))))
im.thumbnail((size, size))
im.save(sys.stdout.buffer, "PNG")
"""


def render_pdf(path: Path, page: int, size: int, box: list[float] | None):
    """A page (or a box of it) of the PDF at `path` rendered in a child process as a PIL image."""
    from PIL import Image

    args = [sys.executable, "-I", "-c", _RENDER, str(path), str(page), str(size), str(RENDER_MAX_PIXELS)]
    if box is not None:
        args.append(",".join(f"{x:.6f}" for x in box))
    with _renders:
        try:
            proc = subprocess.run(args, capture_output=True, timeout=RENDER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BadImage(f"the page render took over {RENDER_TIMEOUT_S} s") from None
    if proc.returncode != 0 or not proc.stdout:
        raise BadImage(f"the page could not be rendered (exit status {proc.returncode})")
    im = Image.open(io.BytesIO(proc.stdout))
    im.load()
    return im


def document_file(doc_id: str, number: int, uploads: Path | None, roots: tuple[str, ...]) -> Path | None:
    """The file a document was read from: the upload whose record names this document (and its
    number), else ``root/doc_id`` under one of `roots` (never outside the root)."""
    from .writer import FILES, UPLOAD_NAME, read_record

    if uploads is not None and uploads.is_dir():
        for entry in sorted(os.scandir(uploads), key=lambda e: e.name):
            if UPLOAD_NAME.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                record = read_record(Path(entry.path))
                if record is not None and record.get(doc_id) == number:
                    f = Path(entry.path) / FILES / doc_id
                    if f.is_file():
                        return f
    for root in roots:
        base = Path(root).resolve()
        f = (base / doc_id).resolve()
        if f.is_file() and f.is_relative_to(base):
            return f
    return None


def image_source(snapshot, doc_id: str, ref: str, uploads: Path | None, roots: tuple[str, ...], size: int,
                 max_pixels: int):
    """A PIL image of the document's image `ref` (see the module docstring); NoPixels when the
    index keeps none, BadImage when they cannot be read."""
    index = snapshot.index
    if doc_id not in index:
        raise NoPixels(f"doc_id: no document {doc_id!r} in the index")
    g = index.document(doc_id)
    v = image_node(g, ref)
    pix = g.pixels.get(ref)
    if pix is not None:
        return _pil(pix, max_pixels)
    source = g.node_source[v]
    if source and os.path.isabs(source) and os.path.isfile(source):
        return _open_file(Path(source), max_pixels)
    m = PAGE_SOURCE.match(source or "")
    if m and m.group("doc") == doc_id:
        pdf = document_file(doc_id, index.doc_number(doc_id), uploads, roots)
        if pdf is not None:
            box = None
            if m.group("box"):
                try:
                    box = [min(max(float(x), 0.0), 1.0) for x in m.group("box").split(",")]
                except ValueError:
                    box = None
                if box is not None and (len(box) != 4 or box[2] <= box[0] or box[3] <= box[1]):
                    box = None
            return render_pdf(pdf, int(m.group("page")), size, box)
    raise NoPixels(f"ref: the index keeps no pixels of image {ref!r} of document {doc_id!r}")


def thumbnail(snapshot, doc_id: str, ref: str, size: int, uploads: Path | None, roots: tuple[str, ...],
              max_pixels: int) -> tuple[bytes, int, int, int, int]:
    """``(JPEG bytes, width, height, original width, original height)``, cached per snapshot."""
    def make():
        from PIL import Image

        im = image_source(snapshot, doc_id, ref, uploads, roots, size, max_pixels)
        try:
            w0, h0 = im.size
            if getattr(im, "format", None) == "JPEG":
                im.draft("RGB", (size, size))
            try:
                rgb = im.convert("RGB")
            except (OSError, ValueError, Image.DecompressionBombError) as exc:
                raise BadImage(f"the image cannot be decoded ({type(exc).__name__})") from None
            rgb.thumbnail((size, size))
            buf = io.BytesIO()
            rgb.save(buf, "JPEG", quality=85)
            return buf.getvalue(), rgb.size[0], rgb.size[1], w0, h0
        finally:
            im.close()

    cache = snapshot.view_cache.setdefault("thumbnails", OrderedDict())
    key = (doc_id, ref, size)
    with snapshot.view_lock:
        hit = cache.get(key)
        if hit is not None:
            cache.move_to_end(key)
            return hit
    value = make()  # outside the lock: a render may take a while
    with snapshot.view_lock:
        cache[key] = value
        while len(cache) > CACHE_THUMBNAILS:
            cache.popitem(last=False)
    return value


__all__ = ["BadImage", "DocumentAdjacency", "NoPixels", "adjacency", "describe_view", "document_rows",
           "neighbourhood", "node_rows", "segment_pages", "thumbnail"]
