"""Where a node sits in its source document: pages (and a box on the page), kept in the node's
``source`` string, the per-node metadata every index already stores (no new column, so an index
written before this existed opens as it is; its segments simply cite no page).

Formats (written by the PDF reader for images, by :func:`build_document_graph` for segments;
``doc`` is the document's id):

* ``"doc page 3"``: a segment on page 3, or the page image ``page-3`` (the whole page);
* ``"doc pages 3-4"`` / ``"doc pages 3, 5-6"``: a segment whose sections come from several pages
  (runs of consecutive pages written ``a-b``);
* ``"doc page 3, box (0.100, 0.200, 0.550, 0.600)"``: an embedded image and its box on the page
  (normalised ``x1, y1, x2, y2``, top-left origin, in [0, 1]).

Any other source (an image file's path, ``""``) names no page.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

_RUN = r"[0-9]+(?:-[0-9]+)?"
PAGE_SOURCE = re.compile(rf"^(?P<doc>.+) pages? (?P<pages>{_RUN}(?:, {_RUN})*)"
                         r"(?:, box \((?P<box>[-+0-9.eE, ]+)\))?$")


def page_runs(pages: Iterable[int]) -> str:
    """``"3"``, ``"3-4"``, ``"3, 5-6"``: sorted distinct page numbers as runs."""
    ps = sorted(set(int(p) for p in pages))
    runs: list[list[int]] = []
    for p in ps:
        if runs and p == runs[-1][1] + 1:
            runs[-1][1] = p
        else:
            runs.append([p, p])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def page_source(doc_id: str, pages: Iterable[int]) -> str:
    """The source string of a node on `pages` of document `doc_id` (``""`` for no page)."""
    ps = sorted(set(int(p) for p in pages))
    if not ps:
        return ""
    return f"{doc_id} {'page' if len(ps) == 1 else 'pages'} {page_runs(ps)}"


def parse_page_source(source: str) -> tuple[tuple[int, ...], tuple[float, float, float, float] | None]:
    """``(pages, box)`` named by a node's source string: pages ascending (``()`` when the source
    names none) and the box on the page (None when it names none, or a malformed one)."""
    if not isinstance(source, str):
        raise TypeError(f"source: expected a str, got {type(source).__name__}")
    m = PAGE_SOURCE.match(source)
    if m is None:
        return (), None
    pages: set[int] = set()
    for run in m.group("pages").split(", "):
        a, _, b = run.partition("-")
        lo, hi = int(a), int(b or a)
        if lo < 1 or hi < lo or hi - lo > 100_000:  # not a page range a reader writes
            return (), None
        pages.update(range(lo, hi + 1))
    box = None
    if m.group("box"):
        try:
            vals = tuple(float(x) for x in m.group("box").split(","))
        except ValueError:
            vals = ()
        if len(vals) == 4 and all(0.0 <= v <= 1.0 for v in vals) and vals[0] <= vals[2] and vals[1] <= vals[3]:
            box = vals
    return tuple(sorted(pages)), box


def section_pages(sections: Sequence, first: int, last: int) -> tuple[int, ...]:
    """Pages of ``sections[first..last]`` (inclusive; sections without a page are skipped)."""
    out: set[int] = set()
    for s in sections[first:last + 1]:
        page = getattr(s, "page", None)
        if isinstance(page, int) and not isinstance(page, bool) and page >= 1:
            out.add(page)
    return tuple(sorted(out))


__all__ = ["PAGE_SOURCE", "page_runs", "page_source", "parse_page_source", "section_pages"]
