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

from ..encoders import Encoder, HashingTextEncoder, PixelPatchEncoder
from ..graph.kinds import EdgeKind, NodeKind
from .document import DocumentGraph

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
class Encoders:
    """The encoders of an index, one per role (None: the role's stores stay empty)."""
    text: Encoder | None = None
    tokens: Encoder | None = None
    patches: Encoder | None = None

    def __post_init__(self):
        for role in ("text", "tokens", "patches"):
            enc = getattr(self, role)
            if enc is not None and (not isinstance(enc, Encoder) or enc.role != role):
                raise TypeError(f"{role}: expected an Encoder with role {role!r} or None, got {enc!r}")

    @classmethod
    def offline(cls, text_dim: int = 128, patch_grid: int = 8, patch_cell: int = 4) -> Encoders:
        """Deterministic model-free encoders (feature hashing for text, raw pixel patches)."""
        h = HashingTextEncoder(text_dim)
        return cls(h.text_encoder(), h.token_encoder(), PixelPatchEncoder(patch_grid, patch_cell).patch_encoder())

    def describe(self) -> dict:
        """``{role: {"name", "dim"} or None}`` as recorded in an index manifest."""
        return {role: None if (e := getattr(self, role)) is None else {"name": e.name, "dim": e.dim}
                for role in ("text", "tokens", "patches")}


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
    """An RGB PIL image from a path, a PIL image or a uint8 ``[H, W(, 3)]`` array."""
    from PIL import Image  # deferred: only image stores need it

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
    """Local ids and PIL images to embed for the ``image`` or ``region`` store."""
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


def _encode_images(graph: DocumentGraph, store: str, enc) -> tuple[np.ndarray, list]:
    """:func:`item_images` encoded :data:`IMAGE_CHUNK` images at a time, so that a document with
    hundreds of large images never holds them all decoded (and as float tensors) at once."""
    jobs = []
    for v in graph.nodes_of(STORES[store][1]):
        owner = int(v) if store == "image" else int(graph.node_image[v])
        if owner >= 0 and graph.node_name[owner] in graph.pixels:
            jobs.append((int(v), owner))
    out = []
    for start in range(0, len(jobs), IMAGE_CHUNK):
        opened: dict[int, object] = {}
        batch = []
        for v, owner in jobs[start:start + IMAGE_CHUNK]:
            if owner not in opened:
                opened[owner] = open_image(graph.pixels[graph.node_name[owner]])
            batch.append(opened[owner] if store == "image" else crop_to_box(opened[owner], graph.node_bbox[v]))
        out.extend(enc(batch))
    return np.asarray([v for v, _ in jobs], np.int64), out


def encode_document(graph: DocumentGraph, encoders: Encoders) -> dict[str, ItemVectors]:
    """Vectors for every store whose encoder is configured (stores with no items are omitted)."""
    if not isinstance(encoders, Encoders):
        raise TypeError(f"encoders: expected Encoders, got {type(encoders).__name__}")
    out = {}
    for store, (role, _) in STORES.items():
        enc = getattr(encoders, role)
        if enc is None:
            continue
        if role == "patches":
            ids, result = _encode_images(graph, store, enc)
        else:
            ids, batch = item_texts(graph, store)
            result = enc(batch) if len(ids) else []
        if not len(ids):
            continue
        if role == "text":
            values = result.float()
            offsets = torch.arange(len(ids) + 1, dtype=torch.int64)
        else:
            values = torch.cat([t.float() for t in result]) if result else torch.zeros((0, enc.dim))
            offsets = torch.zeros(len(ids) + 1, dtype=torch.int64)
            torch.cumsum(torch.tensor([t.shape[0] for t in result], dtype=torch.int64), 0, out=offsets[1:])
        out[store] = ItemVectors(ids, values.contiguous(), offsets)
    return out
