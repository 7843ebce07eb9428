"""Citations to the page: the document, page numbers and (images, regions) box of every source,
record, entity, relation and image a query's evidence and context carry.

Where pages come from (:mod:`colgraph_engine.kg.pages`): a segment's source names the pages of
its sections (PDF pages are known at ingest); a PDF page image names its page and an embedded
image its page and box. Rules:

* a segment cites its own pages; a table, entity or relation cites the union of the pages of the
  segments it was extracted from (its provenance);
* an image cites its page and its box on that page (``(0, 0, 1, 1)`` for a whole page image); a
  region cites the page of its image and its own box mapped onto the page (the region's box is
  relative to its image, the image's box relative to the page);
* an image that is not on a PDF page (an image file) cites no page; its box, and its regions'
  boxes, are then in the image's own frame, and the citation names the image;
* an index written before segments recorded their pages: a segment cites the pages of the page
  images it holds (exact for those segments, none for the others).

Boxes are normalised ``(x0, y0, x1, y1)``, top-left origin, in [0, 1].
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..graph.kinds import EDGE, NODE
from ..kg.pages import page_runs, parse_page_source

FULL_BOX = (0.0, 0.0, 1.0, 1.0)


@dataclass(frozen=True)
class Citation:
    """Where one unit of evidence sits: ``doc_id``, ``pages`` (ascending, ``()`` when unknown),
    ``box`` (images and regions: on the page when `pages` is known, else in the image; None for
    text) and ``image`` (the image's name, for images and regions)."""
    doc_id: str
    pages: tuple[int, ...] = ()
    box: tuple[float, float, float, float] | None = None
    image: str | None = None

    def label(self) -> str:
        """``[doc p.5]``, ``[doc p.2-3,7]``, ``[doc p.5 box (0.10, 0.20, 0.55, 0.60)]``; an image
        off any page: ``[doc image-name box (...)]``. A whole-page box is not written."""
        parts = [self.doc_id]
        if self.pages:
            parts.append("p." + page_runs(self.pages).replace(", ", ","))
        elif self.image is not None:
            parts.append(self.image)
        if self.box is not None and not (self.pages and self.box == FULL_BOX):
            parts.append("box (" + ", ".join(f"{x:.2f}" for x in self.box) + ")")
        return "[" + " ".join(parts) + "]"

    def as_dict(self) -> dict:
        """``{"doc_id": str, "pages": [int], "box": [4 floats] or None}`` (JSON-ready)."""
        return {"doc_id": self.doc_id, "pages": list(self.pages),
                "box": None if self.box is None else [round(float(x), 4) for x in self.box]}


def _on_page(outer: tuple, inner: tuple) -> tuple[float, float, float, float]:
    """`inner` (a box relative to `outer`) in `outer`'s frame."""
    w, h = outer[2] - outer[0], outer[3] - outer[1]
    return (outer[0] + inner[0] * w, outer[1] + inner[1] * h, outer[0] + inner[2] * w, outer[1] + inner[3] * h)


class _DocPages:
    """One document's pages per segment ordinal and per image node, read once per :class:`Citer`."""

    def __init__(self, g):
        self.g = g
        self.n_segments = int(np.count_nonzero(g.node_kind == NODE.SEGMENT))
        self._segments: dict[int, tuple[int, ...]] = {}
        self._images: dict[int, tuple[tuple[int, ...], tuple | None]] = {}
        self._held: dict[int, tuple[int, ...]] | None = None  # old indexes: pages of held page images

    def image(self, local: int) -> tuple[tuple[int, ...], tuple | None]:
        if local not in self._images:
            self._images[local] = parse_page_source(self.g.node_source[local])
        return self._images[local]

    def segment(self, ordinal: int) -> tuple[int, ...]:
        if ordinal not in self._segments:
            pages = ()
            if 0 <= ordinal < self.n_segments:
                local = 1 + ordinal  # a document's nodes: the document, then its segments (kg.document)
                pages, _ = parse_page_source(self.g.node_source[local])
                if not pages:
                    pages = self._held_pages().get(local, ())
            self._segments[ordinal] = pages
        return self._segments[ordinal]

    def _held_pages(self) -> dict[int, tuple[int, ...]]:
        if self._held is None:
            g, held = self.g, {}
            contains = np.flatnonzero(np.asarray(g.edge_kind) == EDGE.CONTAINS)
            src, dst = np.asarray(g.edge_src)[contains], np.asarray(g.edge_dst)[contains]
            kinds = np.asarray(g.node_kind)
            keep = (kinds[src] == NODE.SEGMENT) & (kinds[dst] == NODE.IMAGE)
            for s, v in zip(src[keep].tolist(), dst[keep].tolist()):
                pages, _ = self.image(v)
                if pages:
                    held[s] = tuple(sorted(set(held.get(s, ())) | set(pages)))
            self._held = held
        return self._held


class Citer:
    """Citations of graph nodes and edges of `index`, with each document's pages read once
    (one per query batch: an index that changes gets a new one)."""

    def __init__(self, index):
        self.index = index
        self._docs: dict[str, _DocPages] = {}

    def _doc(self, doc_id: str) -> _DocPages:
        d = self._docs.get(doc_id)
        if d is None:
            d = self._docs[doc_id] = _DocPages(self.index.document(doc_id))
        return d

    def segments(self, doc_id: str, ordinals) -> Citation:
        """The union of the pages of segment `ordinals` of `doc_id`."""
        d = self._doc(doc_id)
        pages: set[int] = set()
        for o in ordinals:
            pages.update(d.segment(int(o)))
        return Citation(doc_id, tuple(sorted(pages)))

    def node(self, node: int) -> Citation:
        """The citation of graph node `node` (see the module docstring)."""
        doc_id, local, kind = self.index.node_place(int(node))  # no strings decoded for a segment
        if kind == "segment":
            return Citation(doc_id, self._doc(doc_id).segment(local - 1))
        if kind == "document":
            return Citation(doc_id)
        if kind not in ("image", "region"):  # entities and tables: their provenance (no strings decoded)
            return self.segments(doc_id, self.index.node_segments(int(node)))
        desc = self.index.describe_node(int(node))
        if kind in ("image", "region"):
            d = self._doc(doc_id)
            image = local if kind == "image" else int(d.g.node_image[local])
            if image < 0:  # a region without its image: its box in an unknown frame
                return Citation(doc_id, (), desc["bbox"], desc["image"])
            pages, page_box = d.image(image)  # no pages: an image file, off any page
            own = desc["bbox"] if kind == "region" else FULL_BOX
            if not pages or own is None:
                return Citation(doc_id, pages, own, desc["image"])
            return Citation(doc_id, pages, _on_page(page_box or FULL_BOX, own), desc["image"])

    def edge(self, edge: int) -> Citation:
        """The citation of graph edge `edge`: the pages of its provenance segments."""
        desc = self.index.describe_edge(int(edge))
        return self.segments(desc["doc_id"], desc["segments"])

    def union(self, doc_id: str, cites) -> Citation:
        """The pages of every citation of `cites` (of one document) together."""
        pages = sorted({p for c in cites for p in c.pages})
        return Citation(doc_id, tuple(pages))


def _fill(row: dict, c: Citation) -> None:
    row["pages"], row["box"] = list(c.pages), None if c.box is None else [round(float(x), 4) for x in c.box]
    row["cite"] = c.label()


def cite_evidence(citer: Citer, evidence: list) -> None:
    """Adds ``pages``, ``box`` and ``cite`` (the label) to every entity, relation and source row
    of each query's evidence, and sets ``pages`` and ``box`` of every record (in place)."""
    for ev in evidence:
        for row in ev.entities:
            _fill(row, citer.node(row["node"]))
        for row in ev.relations:
            _fill(row, citer.segments(row["doc_id"], row["segments"]))
        for row in ev.sources:
            _fill(row, citer.node(row["node"]))
        records = []
        for r in ev.records:
            if r.source == "relation":
                c = citer.segments(r.doc_id, r.segments)
            elif r.source == "image":
                c = citer.node(r.nodes[0])  # the depicting image or region
            elif r.nodes and r.doc_id:
                cites = [citer.node(v) for v in r.nodes]
                c = citer.union(r.doc_id, [x for x in cites if x.doc_id == r.doc_id])
            else:
                c = Citation(r.doc_id)
            records.append(replace(r, pages=c.pages, box=c.box))
        ev.records[:] = records


def record_citation(r) -> Citation:
    """A record's citation, from its own fields."""
    return Citation(r.doc_id, tuple(getattr(r, "pages", ()) or ()), getattr(r, "box", None), r.image)


__all__ = ["Citation", "Citer", "FULL_BOX", "cite_evidence", "record_citation"]
