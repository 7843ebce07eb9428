"""A page render's text view equals its segment's text: encode_document gives it the segment's
token vectors without a second pass of the tokens encoder (issue 25, item 6: ingest speed)."""
import dataclasses

import numpy as np
import torch

from colgraph_engine.kg import DocumentInput, Encoders, ImageInput, Section, build_document_graph
from colgraph_engine.kg.vectors import encode_document, item_texts

PAGES = ["Kestrel Dynamics built the Orrin Bridge over the Vale River in 1931.",
         "The Orrin Bridge was restored by Marunouchi Works in 2012 after the flood."]


def _counting(enc):
    """The real tokens encoder, recording every text it is asked to encode."""
    seen = []

    def fn(texts):
        seen.extend(texts)
        return enc.fn(texts)
    return dataclasses.replace(enc, fn=fn), seen


def _document(extra_caption: str) -> DocumentInput:
    pixels = np.full((16, 16, 3), 200, np.uint8)
    images = [ImageInput(f"page-{i + 1}", pixels=pixels, caption=t) for i, t in enumerate(PAGES)]
    images.append(ImageInput("figure", pixels=pixels, caption=extra_caption))
    sections = [Section(t, images=(f"page-{i + 1}",), page=i + 1) for i, t in enumerate(PAGES)]
    sections[0] = Section(PAGES[0], images=("page-1", "figure"), page=1)
    return DocumentInput("bridges", sections, images=images)


def test_page_text_views_reuse_the_segment_vectors():
    base = Encoders.offline()
    tokens, seen = _counting(base.tokens)
    enc = Encoders(base.text, tokens, base.patches)
    graph = build_document_graph(_document("Figure 1: the bridge in 1931"))
    out = encode_document(graph, enc)
    _, seg_texts = item_texts(graph, "segment")
    _, views = item_texts(graph, "image_text")
    assert set(PAGES) <= set(views) and set(seg_texts) == set(PAGES)
    # every segment text once, and of the text views only the one that is no segment's text
    assert sorted(seen) == sorted(seg_texts + [v for v in views if v not in seg_texts])
    want = base.tokens.fn(views)  # a direct encoding of every text view
    got = out["image_text"]
    for i, w in enumerate(want):
        assert torch.equal(got.values[got.offsets[i]:got.offsets[i + 1]], w.float())
