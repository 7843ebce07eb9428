"""Figure and table captions in a segment's text, and the embedded images they name.

PDF readers give embedded images no caption (issue 11); the caption is in the text layer
("Figure 3: The architecture of QACHECK ..."). :func:`figure_links` finds caption definitions
in each segment and pairs them with the segment's images, so that
:func:`~colgraph_engine.kg.document.build_document_graph` can caption the image and link it to
the ``Figure N`` entity (a DEPICTS edge with the keyword ``caption``).

Rules (ours; no paper states one):

* a caption definition is ``Figure``/``Fig.``/``Chart``/``Exhibit``/``Table`` + a number (``3``,
  ``2a``, ``A.1``, ``IV``) followed by ``:``, ``.``, ``|`` or a dash and text, at the start of
  the text, of a line or of a sentence; its caption runs to the end of that sentence or line
  (at most :data:`MAX_CAPTION` characters); with a colon (``Figure 3:``) it may stand anywhere
  (page text flowed into one line puts captions mid-text). ``"in Figure 3,"`` or ``"Figure 3 shows"`` are
  references, not definitions;
* candidates are the segment's images except whole-page renders (refs ``page-<n>``, as
  :mod:`colgraph_engine.ingest.readers.pdf` names them), in the segment's order;
* figure definitions pair with candidates in order when their counts are equal; one candidate
  and several definitions: the first definition; more candidates than definitions, with their
  boxes known (``box (x1, y1, x2, y2)`` in ``ImageInput.source``, as the PDF reader writes it):
  the definitions pair, in order, with the largest candidates (logos and icons are small) when
  each of those covers at least :data:`MIN_FIGURE_AREA` of the page; otherwise (ambiguous) no embedded image is
  paired, and when the segment has exactly one whole-page render, each figure definition is
  linked to it instead (the page depicts the figure). Table definitions always go to the page
  render when there is exactly one (tables are text, not embedded images).
"""
from __future__ import annotations

import re
from collections.abc import Sequence

MAX_CAPTION = 240
MIN_FIGURE_AREA = 0.02  # of the page: smaller images are logos, icons, bullets (ours)
_BOX = re.compile(r"box \(([-\d.]+), ([-\d.]+), ([-\d.]+), ([-\d.]+)\)")


def box_area(source: str) -> float | None:
    """The page share of an image's box written in its source (``"... box (x1, y1, x2, y2)"``,
    normalised coordinates), or None when the source names no box."""
    m = _BOX.search(source or "")
    if m is None:
        return None
    x1, y1, x2, y2 = map(float, m.groups())
    return max(0.0, x2 - x1) * max(0.0, y2 - y1)
_PAGE_RENDER = re.compile(r"^page-\d+$")
_DEFINITION = re.compile(
    r"(?:(?:^|(?<=\n)|(?<=[.!?]\s)|(?<=[.!?]\s\s))\s*(?P<word>{w})\s*(?P<num>{n})\s*(?:[:.|]|\s[-–—])"
    r"|(?<!\S)(?P<word2>{w})\s*(?P<num2>{n}):)"  # "Figure 3:" anywhere: a colon defines
    r"\s*(?P<text>[^\n]*)".format(w=r"Figure|FIGURE|Fig\.|FIG\.|Chart|Exhibit|Table|TABLE",
                                  n=r"\d+[a-z]?|[A-Z]?\d+(?:\.\d+)*|[IVX]+"))


def caption_definitions(text: str) -> list[tuple[str, str, str]]:
    """``text -> [(kind, label, caption)]`` in order: kind ``"figure"`` or ``"table"``, label
    ``"Figure 3"`` / ``"Table 2"``, caption the definition's own text (may be empty)."""
    if not isinstance(text, str):
        raise TypeError(f"text: expected str, got {type(text).__name__}")
    out = []
    for m in _DEFINITION.finditer(text):
        word = (m.group("word") or m.group("word2")).lower().rstrip(".")
        kind = "table" if word == "table" else "figure"
        label = f"{'Table' if kind == 'table' else 'Figure'} {m.group('num') or m.group('num2')}"
        rest = m.group("text")
        end = re.search(r"(?<=[.!?])\s+(?=[A-Z])", rest)
        caption = " ".join((rest[:end.start()] if end else rest).split())[:MAX_CAPTION]
        out.append((kind, label, caption))
    return out


def caption_texts(sections: Sequence, segments: Sequence) -> list[str]:
    """Per segment, the text to look for caption definitions in: a segment that holds images is
    one whole section (:func:`~colgraph_engine.kg.segment_sections` neither splits nor merges
    those), and that section's own text keeps the line breaks a caption starts after ("2\\nFig.
    1. ..." where the segment has "2 Fig. 1. ..."); any other segment: its text."""
    out = []
    for seg in segments:
        a, b = seg.sections
        if seg.images and a == b and 0 <= a < len(sections):
            sec = sections[a]
            out.append(sec if isinstance(sec, str) else sec.text)
        else:
            out.append(seg.text)
    return out


def figure_links(texts: Sequence[str], images: Sequence[Sequence[str]], areas: dict | None = None
                 ) -> dict[str, list[tuple[str, str, int]]]:
    """Which image each caption definition names, by the rules in the module docstring.

    Args:
        texts: segment texts ``[s]``.
        images: per segment, the image refs it holds ``[s][k]`` (same length as `texts`).
        areas: ``{ref: page share of its box}`` where known (see :func:`box_area`).

    Returns:
        ``{image ref: [(label, caption, segment), ...]}`` (an image may carry several).
    """
    if isinstance(texts, str) or isinstance(images, str) or len(texts) != len(images):
        raise ValueError("texts, images: expected two sequences of the same length (one entry per segment)")
    links: dict[str, list[tuple[str, str, int]]] = {}
    for s, (text, refs) in enumerate(zip(texts, images)):
        defs = caption_definitions(text)
        if not defs:
            continue
        pages = [r for r in refs if _PAGE_RENDER.match(r)]
        embedded = [r for r in refs if not _PAGE_RENDER.match(r)]
        figures = [(label, cap) for kind, label, cap in defs if kind == "figure"]
        tables = [(label, cap) for kind, label, cap in defs if kind == "table"]
        pairs: list[tuple[str, str, str]] = []
        if figures and embedded and len(figures) == len(embedded):
            pairs += [(ref, label, cap) for ref, (label, cap) in zip(embedded, figures)]
        elif figures and len(embedded) == 1:
            pairs.append((embedded[0], *figures[0]))
        elif figures and areas and len(embedded) > len(figures) and all(r in areas for r in embedded):
            big = sorted(embedded, key=lambda r: -areas[r])[:len(figures)]
            if all(areas[r] >= MIN_FIGURE_AREA for r in big):
                big = [r for r in embedded if r in big]  # back to page order
                pairs += [(ref, label, cap) for ref, (label, cap) in zip(big, figures)]
            elif len(pages) == 1:
                pairs += [(pages[0], label, cap) for label, cap in figures]
        elif figures and len(pages) == 1:
            pairs += [(pages[0], label, cap) for label, cap in figures]
        if tables and len(pages) == 1:
            pairs += [(pages[0], label, cap) for label, cap in tables]
        for ref, label, cap in pairs:
            links.setdefault(ref, []).append((label, cap, s))
    return links


__all__ = ["MAX_CAPTION", "MIN_FIGURE_AREA", "box_area", "caption_definitions", "caption_texts", "figure_links"]
