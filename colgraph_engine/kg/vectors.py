"""Embedding a document graph's retrievable items with pluggable encoders.

Stores and what fills them (item order = local node or edge id order):

=========  =============  ==========================================================
store      encoder role   items
=========  =============  ==========================================================
entity     text           entity nodes: ``"name: description"``
relation   text           relation edges: ``"source keywords target: description"``
segment    tokens         segment nodes: the segment's text
table      tokens         table nodes: caption and table text
image      patches        image nodes with pixels: the whole image
region     patches        region nodes of an image with pixels: the image cropped to the bbox
image_text tokens         image nodes: the image's *text view* (see :func:`image_text_view`)
region_text tokens        region nodes: the region's label and its scene-graph text
=========  =============  ==========================================================

A store whose encoder role is not configured stays empty; so do images given without pixels
(their text views are still stored). The text views stand in for a text-image model offline:
a question's visual phrases, encoded by the token encoder, can only be compared with image
*patches* when one late-interaction model fills both roles (the colpali-engine family); with
any other pair of encoders the pipeline ranks images by their text views instead.

Item rules of the ``text`` stores (the text encoder says which: MiniLM's
``text_encoder(items=...)``, recorded in its name):

* ``direct``: each entity's and relation's text above through the text encoder (one pass per
  item; an item's description repeats its segment's sentences, so this pass reads ~10x more
  word pieces than the segments themselves);
* ``spans`` (our choice, not a paper's): an item whose description lines are each a span of
  one of its provenance segments (compared with whitespace runs as one space and hyphens left
  out) gets the tokens encoder's segment pass pooled over those spans
  (:meth:`MiniLMEncoder.span_sums`: the mean of the last hidden states of the word pieces the
  spans overlap, L2-normalised) and over its names' mentions inside them (an entity's name, a
  relation's two endpoints), ``v = normalise(d + n)``, since the direct text leads with the
  names; no second pass. The rest (descriptions an LLM wrote, lines that cross a segment
  boundary) keep the direct encoding. Needs the tokens role from the same MiniLM model
  (ValueError otherwise).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..encoders import Encoders
from ..graph.kinds import EdgeKind, NodeKind
from .document import DocumentGraph, SpooledPixels

# store name -> (encoder role, node kind or None for relation edges)
STORES: dict[str, tuple[str, NodeKind | None]] = {
    "entity": ("text", NodeKind.ENTITY),
    "relation": ("text", None),
    "segment": ("tokens", NodeKind.SEGMENT),
    "table": ("tokens", NodeKind.TABLE),
    "image": ("patches", NodeKind.IMAGE),
    "region": ("patches", NodeKind.REGION),
    "image_text": ("tokens", NodeKind.IMAGE),
    "region_text": ("tokens", NodeKind.REGION),
}


@dataclass(frozen=True)
class ItemVectors:
    """Vectors of one store's items of one document: ``local [k]`` int64 local node (or edge)
    ids, packed ``values [T, d]`` float32 and ``offsets [k+1]`` int64."""
    local: np.ndarray
    values: torch.Tensor
    offsets: torch.Tensor


def item_texts(graph: DocumentGraph, store: str) -> tuple[np.ndarray, list[str]]:
    """Local ids and the texts a text or token encoder embeds for `store`."""
    if store == "relation":
        edges = graph.edges_of(EdgeKind.RELATION)
        n = graph.node_name
        texts = [f"{n[graph.edge_src[e]]} {graph.edge_keywords[e]} {n[graph.edge_dst[e]]}: {graph.edge_text[e]}"
                 for e in edges]
        return edges, texts
    nodes = graph.nodes_of(STORES[store][1])
    if store == "entity":
        return nodes, [f"{graph.node_name[v]}: {graph.node_text[v]}" for v in nodes]
    if store == "image_text":
        return nodes, [image_text_view(graph, int(v)) for v in nodes]
    if store == "region_text":
        return nodes, [region_text_view(graph, int(v)) for v in nodes]
    return nodes, [graph.node_text[v] for v in nodes]


def region_text_view(graph: DocumentGraph, node: int) -> str:
    """A region's text view: its label (object category or relation predicate) and its text
    (``"train passing in front of mountain"`` for a relation region), without repeats."""
    label, text = graph.node_type[node], graph.node_text[node]
    return text if not label or label in text else f"{label}: {text}"


def image_text_view(graph: DocumentGraph, node: int) -> str:
    """An image's text view: its caption (which carries OCR text where the reader put it there)
    followed by the text views of its regions in local id order, one per line."""
    regions = np.flatnonzero(graph.node_image == node)
    lines = [graph.node_text[node]] + [region_text_view(graph, int(r)) for r in regions]
    return "\n".join(t for t in lines if t)


def open_image(pixels):
    """An RGB PIL image from a path (a reader's :class:`SpooledImage` too), a graph's
    :class:`SpooledPixels`, a PIL image or a uint8 ``[H, W(, 3)]`` array."""
    from PIL import Image  # deferred: only image stores need it

    if isinstance(pixels, SpooledPixels):
        return pixels.load()
    if isinstance(pixels, (str, os.PathLike)):
        with Image.open(Path(pixels)) as im:
            return im.convert("RGB")
    if isinstance(pixels, np.ndarray):
        return Image.fromarray(pixels if pixels.ndim == 3 else np.repeat(pixels[:, :, None], 3, axis=2))
    if hasattr(pixels, "convert"):
        return pixels.convert("RGB")
    raise TypeError(f"pixels: expected a path, a PIL image or a uint8 array, got {type(pixels).__name__}")


def crop_to_box(image, bbox: np.ndarray):
    """`image` cropped to a normalised ``(x1, y1, x2, y2)`` box (at least one pixel)."""
    w, h = image.size
    x1, y1, x2, y2 = (float(c) for c in bbox)
    left, top = min(int(np.floor(x1 * w)), w - 1), min(int(np.floor(y1 * h)), h - 1)
    right, bottom = max(int(np.ceil(x2 * w)), left + 1), max(int(np.ceil(y2 * h)), top + 1)
    return image.crop((left, top, right, bottom))


def item_images(graph: DocumentGraph, store: str) -> tuple[np.ndarray, list]:
    """Local ids and PIL images to embed for the ``image`` or ``region`` store, all decoded at
    once (for inspection; :func:`encode_document` decodes :data:`IMAGE_CHUNK` at a time)."""
    opened: dict[int, object] = {}

    def image_of(v: int):
        if v not in opened:
            opened[v] = open_image(graph.pixels[graph.node_name[v]])
        return opened[v]

    ids, images = [], []
    for v in graph.nodes_of(STORES[store][1]):
        owner = int(v) if store == "image" else int(graph.node_image[v])
        if owner < 0 or graph.node_name[owner] not in graph.pixels:
            continue
        ids.append(int(v))
        images.append(image_of(owner) if store == "image" else crop_to_box(image_of(owner), graph.node_bbox[v]))
    return np.asarray(ids, np.int64), images


IMAGE_CHUNK = 16  # images decoded at once while encoding (ours: bounds memory, not speed)


def _load_libc_trim():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows): nothing to do
        return None


_MALLOC_TRIM = _load_libc_trim() if os.name == "posix" else None


def release_freed_memory() -> None:
    """Hands memory that was freed but kept by glibc's malloc back to the system (no-op on other
    C libraries).

    Why: encoding an image allocates a few image-sized temporaries (a 612 x 792 page is a 5.8 MB
    float tensor), then frees them, while its small output stays. Below glibc's mmap threshold
    (which grows up to 32 MB as large blocks are freed) the temporaries live in the heap, and each
    kept output splits the hole they leave: measured, the resident size grew by about 5 MB per
    page image encoded (4.5 GB at 800 pages) although nothing was kept. ``malloc_trim(0)`` after
    each chunk of images returns those holes (it also ``madvise``s free pages inside the heap).
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


# texts per token-encoder call (ours: 16 MB of 512 x 128 float32 token vectors; a multiple of the
# encoders' batch sizes, so that their forward passes see the same batches as one call would)
TEXT_CHUNK = 64


def _image_jobs(graph: DocumentGraph, store: str) -> list[tuple[int, int]]:
    """``(item node, image node)`` for the items of `store` whose image has pixels."""
    jobs = []
    for v in graph.nodes_of(STORES[store][1]):
        owner = int(v) if store == "image" else int(graph.node_image[v])
        if owner >= 0 and graph.node_name[owner] in graph.pixels:
            jobs.append((int(v), owner))
    return jobs


def _image_chunks(graph: DocumentGraph, store: str, enc, jobs: list[tuple[int, int]]):
    """`enc`'s outputs for :data:`IMAGE_CHUNK` items at a time, so that a document with hundreds
    of large images never holds them all decoded (and as float tensors) at once."""
    for start in range(0, len(jobs), IMAGE_CHUNK):
        opened: dict[int, object] = {}
        batch = []
        for v, owner in jobs[start:start + IMAGE_CHUNK]:
            if owner not in opened:
                opened[owner] = open_image(graph.pixels[graph.node_name[owner]])
            batch.append(opened[owner] if store == "image" else crop_to_box(opened[owner], graph.node_bbox[v]))
        del opened
        yield enc(batch)
        del batch
        release_freed_memory()


def _text_chunks(texts: list[str], enc, known: dict | None = None):
    """`enc` over `texts`, :data:`TEXT_CHUNK` at a time; a text in `known` (text -> its ``[L, d]``
    vectors from the same encoder) is not encoded again: a page render's text view is its
    segment's text, and one MiniLM pass over it is half the tokens role's time."""
    for start in range(0, len(texts), TEXT_CHUNK):
        chunk = texts[start:start + TEXT_CHUNK]
        if not known:
            yield enc(chunk)
            continue
        todo = [t for t in dict.fromkeys(chunk) if t not in known]
        fresh = dict(zip(todo, enc(todo))) if todo else {}
        yield [known[t] if t in known else fresh[t] for t in chunk]


def _pack(chunks, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values [T, d] float32, offsets [k+1] int64)`` of the multi-vectors `chunks` yields
    (lists of ``[L_i, d]`` tensors), equal to concatenating them all.

    Each chunk is concatenated as it comes (its per-item tensors freed), then the chunks are
    copied into the result one at a time, each freed after its copy: the peak is about the
    result plus one chunk, where one ``torch.cat`` of every item would hold the result twice
    (3.4 GB instead of 1.7 GB for the segment tokens of a 50 MB text)."""
    parts, lengths = [], []
    for result in chunks:
        lengths.extend(int(t.shape[0]) for t in result)
        parts.append(torch.cat([t.float() for t in result]) if result else torch.zeros((0, dim)))
        del result
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    if lengths:
        torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0, out=offsets[1:])
    values = torch.empty((int(offsets[-1]), dim), dtype=torch.float32)
    row = 0
    parts.reverse()
    while parts:
        part = parts.pop()
        values[row:row + part.shape[0]] = part
        row += part.shape[0]
        del part
    return values, offsets


def _span_minilm(encoders: Encoders):
    """The MiniLMEncoder whose segment passes the ``spans`` rule pools, or None for ``direct``."""
    text_fn = getattr(encoders.text, "fn", None)
    if getattr(text_fn, "items", "direct") != "spans":
        return None
    minilm = getattr(getattr(encoders.tokens, "fn", None), "minilm", None)
    if minilm is None or minilm.model_id != text_fn.minilm.model_id:
        got = "none" if encoders.tokens is None else repr(encoders.tokens.name)
        raise ValueError(f"encoders: the text role {encoders.text.name!r} pools spans of the tokens role's segment "
                         f"passes and needs the tokens role from the same MiniLM model (got {got}); use "
                         f"text_encoder(items='direct') with other token encoders")
    return minilm


_HYPHENS = "-\u00ad\u2010\u2011"  # hyphen-minus, soft hyphen, hyphen, non-breaking hyphen


def _comparable(text: str) -> str:
    """`text` as :func:`_squeezed` compares it (the same rule: one place)."""
    return _squeezed(text)[0]


_WORD = re.compile(r"\S+")
_HAS_HYPHEN = re.compile("[" + re.escape(_HYPHENS) + "]")
_NOT_HYPHENS = re.compile("[^" + re.escape(_HYPHENS) + "]+")


def _squeezed(text: str) -> tuple[str, np.ndarray]:
    """``(text with whitespace runs as one space, none after a hyphen (a line break's), hyphens
    dropped and no ends; position [len] of each of its characters in text)``. Hyphens are
    dropped on both sides because an extractor that joins a line break's hyphen ("ab-sence" in
    a flowed segment, "absence" in its description) must still match.

    Built from pieces (a word, a run of a word's characters between hyphens, a space) of
    consecutive positions, so Python loops over words rather than characters (ingest called this
    for every description line: 36k calls on 87 pages)."""
    parts: list[str] = []
    starts: list[int] = []  # position in `text` of each part's first character
    after_hyphen = False  # the previous word ends with a hyphen: no space before the next
    for m in _WORD.finditer(text):
        s, w = m.start(), m.group()
        if parts and not after_hyphen:
            parts.append(" ")
            starts.append(s - 1)  # the space stands for the whitespace run before the word
        if _HAS_HYPHEN.search(w) is None:
            parts.append(w)
            starts.append(s)
        else:
            for r in _NOT_HYPHENS.finditer(w):
                parts.append(r.group())
                starts.append(s + r.start())
        after_hyphen = w[-1] in _HYPHENS
    if parts and parts[-1] == " ":  # a last word of hyphens only
        parts.pop()
        starts.pop()
    if not parts:
        return "", np.zeros(0, np.int64)
    lens = np.fromiter(map(len, parts), np.int64, len(parts))
    first = np.cumsum(lens) - lens  # where each part starts in the squeezed text
    where = np.repeat(np.asarray(starts, np.int64) - first, lens) + np.arange(int(lens.sum()), dtype=np.int64)
    return "".join(parts), where


def _item_lines(graph: DocumentGraph, store: str) -> list[tuple[list[str], list[str], np.ndarray]]:
    """``(description lines, names, provenance segment ordinals)`` per item of the entity or
    relation store, in :func:`item_texts` order (a relation's names are its two endpoints')."""
    if store == "entity":
        return [(graph.node_text[v].split("\n"), [graph.node_name[v]], graph.provenance(int(v)))
                for v in graph.nodes_of(NodeKind.ENTITY)]
    po, p, n = graph.edge_prov_offsets, graph.edge_prov, graph.node_name
    return [(graph.edge_text[e].split("\n"), [n[graph.edge_src[e]], n[graph.edge_dst[e]]], p[po[e]:po[e + 1]])
            for e in graph.edges_of(EdgeKind.RELATION)]


def span_ranges(graph: DocumentGraph) -> tuple[np.ndarray, int, int]:
    """``(ranges [R, 4] int64, k_entity, k_relation)``: rows ``(group, segment, start, end)`` of
    the ``spans`` rule (module docstring). Items are numbered entities first then relations
    (item order of :func:`item_texts`), K = ``k_entity + k_relation``; group ``i < K`` holds
    item i's description lines, group ``K + i`` its name mentions (an entity's name, a
    relation's two endpoint names; the first occurrence inside the item's description spans).
    Segments are numbered by position in the segment store, characters are those of the
    segment's ``node_text``. An item gets rows only when every one of its description lines is
    found in one of its provenance segments (the first such segment, the first occurrence)."""
    segments = graph.nodes_of(NodeKind.SEGMENT)
    position = {int(graph.provenance(int(v))[0]): k for k, v in enumerate(segments) if graph.provenance(int(v)).size}
    squeezed: dict[int, tuple[str, np.ndarray]] = {}

    def find(line: str, within) -> tuple[int, int, int] | None:
        """``(segment, start, end)`` of `line`'s first occurrence in one of `within`'s
        ``(segment, start, end)`` windows of squeezed text (a whole segment: 0, inf)."""
        for k, lo, hi in within:
            if k not in squeezed:
                squeezed[k] = _squeezed(graph.node_text[segments[k]])
            flat, where = squeezed[k]
            at = flat.find(line, lo, hi)
            if at >= 0:
                return k, at, at + len(line)
        return None

    rows: list[tuple[int, int, int, int]] = []
    items = _item_lines(graph, "entity")
    k_entity = len(items)
    items += _item_lines(graph, "relation")
    n_items = len(items)
    for item, (lines, names, prov) in enumerate(items):
        whole = [(position[int(o)], 0, None) for o in prov if int(o) in position]
        found = []
        for line in lines:
            line = _comparable(line)
            hit = find(line, whole) if line else None
            if hit is None:
                found = None
                break
            found.append(hit)
        if not found:
            continue
        for group, hits in ((item, found), (n_items + item, [find(_comparable(m), found) for m in names])):
            for hit in hits:
                if hit is not None and hit[2] > hit[1]:
                    where = squeezed[hit[0]][1]
                    rows.append((group, hit[0], int(where[hit[1]]), int(where[hit[2] - 1]) + 1))
    ranges = np.asarray(rows, dtype=np.int64).reshape(-1, 4)
    return ranges, k_entity, n_items - k_entity


@dataclass(frozen=True)
class SpanPass:
    """What the ``spans`` rule's segment pass gives: the segment store's packed token vectors
    (``values [T, d]``, ``offsets [k+1]``), and ``pooled [K, d]`` / ``covered [K]`` bool for the
    K = ``k_entity + k_relation`` items of :func:`span_ranges` (rows of uncovered items are zero)."""
    values: torch.Tensor
    offsets: torch.Tensor
    pooled: torch.Tensor
    covered: torch.Tensor
    k_entity: int

    def of(self, store: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(pooled, covered)`` of the entity or relation store's items."""
        part = slice(0, self.k_entity) if store == "entity" else slice(self.k_entity, None)
        return self.pooled[part], self.covered[part]


def _span_pass(graph: DocumentGraph, minilm, dim: int) -> SpanPass:
    """The segment store's token vectors (:data:`TEXT_CHUNK` segments a call, as the tokens
    encoder reads them) and the ``spans`` rule's item vectors from the same passes:
    ``normalise(d_i + n_i)`` with ``d_i`` the pooled description and ``n_i`` the pooled name
    mentions (``d_i`` alone when no name is found)."""
    from ..encoders.minilm import pool_sums  # deferred: models are optional

    ranges, k_entity, k_relation = span_ranges(graph)
    n_items = k_entity + k_relation
    _, texts = item_texts(graph, "segment")
    sums = torch.zeros((2 * n_items, dim), dtype=torch.float32)
    counts = torch.zeros(2 * n_items, dtype=torch.float32)
    covered = torch.ones(2 * n_items, dtype=torch.bool)
    covered[torch.from_numpy(np.setdiff1d(np.arange(2 * n_items), ranges[:, 0]))] = False

    def chunks():
        for start in range(0, len(texts), TEXT_CHUNK):
            mine = ranges[(ranges[:, 1] >= start) & (ranges[:, 1] < start + TEXT_CHUNK)].copy()
            mine[:, 1] -= start
            tokens, s, c, cov = minilm.span_sums(texts[start:start + TEXT_CHUNK], mine, 2 * n_items)
            present = torch.zeros(2 * n_items, dtype=torch.bool)
            present[torch.from_numpy(mine[:, 0])] = True
            covered.logical_and_(cov | ~present)  # a call without a group's ranges says nothing about it
            sums.add_(s)
            counts.add_(c)
            yield [t.float() for t in tokens]

    values, offsets = _pack(chunks(), dim)
    pooled = pool_sums(sums, counts, covered)  # zero rows where not covered
    kept = covered & (counts > 0)
    items = torch.nn.functional.normalize(pooled[:n_items] + pooled[n_items:], dim=-1)
    items[~kept[:n_items]] = 0
    return SpanPass(values, offsets, items, kept[:n_items], k_entity)


def _text_store(texts: list[str], enc, pooled: torch.Tensor | None, covered: torch.Tensor | None) -> torch.Tensor:
    """``[k, d]`` text-store vectors: the ``spans`` rule's rows where `covered`, `enc` on the
    other items' texts (all of them when `pooled` is None)."""
    if pooled is None:
        return enc(texts).float()
    values = pooled.clone()
    rest = (~covered).nonzero().flatten()
    if len(rest):
        values[rest] = enc([texts[i] for i in rest.tolist()]).float()
    return values


def encode_document(graph: DocumentGraph, encoders: Encoders) -> dict[str, ItemVectors]:
    """Vectors for every store whose encoder is configured (stores with no items are omitted).

    The text stores follow the text encoder's item rule (``direct`` or ``spans``, see the module
    docstring); under ``spans`` the segment store's pass also yields the covered items' vectors.

    Memory: images are decoded :data:`IMAGE_CHUNK` at a time and token stores are encoded
    :data:`TEXT_CHUNK` texts at a time and packed without a second full copy (see :func:`_pack`),
    so the peak is about the document's vectors plus one chunk.

    The encoders' calls run as document encoding (:func:`~colgraph_engine.encoders.precision.bulk`):
    model encoders left at ``compute="auto"`` use bfloat16 here where the hardware has it."""
    if not isinstance(encoders, Encoders):
        raise TypeError(f"encoders: expected Encoders, got {type(encoders).__name__}")
    from ..encoders.precision import bulk
    with bulk():
        return _encode_document(graph, encoders)


def _encode_document(graph: DocumentGraph, encoders: Encoders) -> dict[str, ItemVectors]:
    minilm = _span_minilm(encoders) if encoders.text is not None else None
    spans = _span_pass(graph, minilm, encoders.tokens.dim) if minilm is not None else None
    out = {}
    known = None  # segment text -> its token vectors, for the other tokens-role stores
    for store, (role, _) in STORES.items():
        enc = getattr(encoders, role)
        if enc is None:
            continue
        if role == "patches":
            jobs = _image_jobs(graph, store)
            ids = np.asarray([v for v, _ in jobs], np.int64)
            if not len(ids):
                continue
            values, offsets = _pack(_image_chunks(graph, store, enc, jobs), enc.dim)
        else:
            ids, texts = item_texts(graph, store)
            if not len(ids):
                continue
            if role == "text":
                pooled, covered = spans.of(store) if spans is not None else (None, None)
                values = _text_store(texts, enc, pooled, covered)
                offsets = torch.arange(len(ids) + 1, dtype=torch.int64)
            elif store == "segment" and spans is not None:
                values, offsets = spans.values, spans.offsets
            else:
                values, offsets = _pack(_text_chunks(texts, enc, known), enc.dim)
            if store == "segment":
                o = offsets.tolist()
                known = {t: values[o[i]:o[i + 1]] for i, t in enumerate(texts)}
            del texts
        out[store] = ItemVectors(ids, values.contiguous(), offsets)
    return out
