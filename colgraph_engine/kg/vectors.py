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
"""
from __future__ import annotations

import os
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


def _text_chunks(texts: list[str], enc):
    for start in range(0, len(texts), TEXT_CHUNK):
        yield enc(texts[start:start + TEXT_CHUNK])


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


def encode_document(graph: DocumentGraph, encoders: Encoders) -> dict[str, ItemVectors]:
    """Vectors for every store whose encoder is configured (stores with no items are omitted).

    Memory: images are decoded :data:`IMAGE_CHUNK` at a time and token stores are encoded
    :data:`TEXT_CHUNK` texts at a time and packed without a second full copy (see :func:`_pack`),
    so the peak is about the document's vectors plus one chunk."""
    if not isinstance(encoders, Encoders):
        raise TypeError(f"encoders: expected Encoders, got {type(encoders).__name__}")
    out = {}
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
                values = enc(texts).float()
                offsets = torch.arange(len(ids) + 1, dtype=torch.int64)
            else:
                values, offsets = _pack(_text_chunks(texts, enc), enc.dim)
            del texts
        out[store] = ItemVectors(ids, values.contiguous(), offsets)
    return out
