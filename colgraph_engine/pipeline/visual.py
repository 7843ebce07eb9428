"""Stage 5: visual candidates X_img(q) and the top-k E_k(q).

**Candidates** (never filtered before this stage): the images and regions that depict a kept
entity (DEPICTS, DEPICTS_RELATION), the images contained in kept segments and in the segments
that mention a kept entity (their provenance, which covers the kept relations' provenance too:
a relation's segment mentions both its endpoints), and the regions of those images; with
``all_document_images`` every image and region of the Kd documents as well.

**Ranking**, ``s(Q, x) = Σ_i max_{u ∈ units(x)} <q_i, u>`` with Q the token vectors of the
visual phrases C_vis(q) (:mod:`.cvis`; the question's own tokens when it has no visual cue):

* ``visual_units="patches"``: units are the image or region patches. Only valid when the token
  encoder and the patch encoder are one late-interaction model (the colpali-engine family;
  ColGraphRAG's setting); any other pair is refused as a cross-space comparison.
* ``visual_units="text_view"``: units are the token vectors of each image's or region's text
  view (caption, OCR text, scene-graph and region labels; see ``kg.vectors``), encoded by the
  token encoder: the offline surrogate for a text-image model, labelled as such in results.
* with a query image, a second ranking by MaxSim of the query-image patches against the
  candidates' patches (one image encoder, one space) is fused with the first by
  reciprocal-rank fusion; when the question has no visual cue and the query has no caption,
  the query image ranks alone (our choice: the question's own tokens say nothing about it).

The query image's caption, when given, joins the visual phrases (it describes what to look
for; our choice, the paper has no caption).

``visual_ranker="pooled"`` scores the same pairs by the cosine of mean vectors instead; ``"off"``
ranks nothing (E_k is empty).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph.kinds import NODE, EdgeKind, NodeKind
from .graph_retrieval import DEPICT_KINDS, Subgraph
from .scoring import order_desc, rrf, score_node_lists, select_queries
from .view import IndexView

IMAGE_KINDS = (NodeKind.IMAGE, NodeKind.REGION)


def encoder_space(name: str) -> str:
    """The embedding space of an encoder, by name: a late-interaction model's query and image
    encoders are named ``<model>:queries`` and ``<model>:images`` and share ``<model>``."""
    for suffix in (":queries", ":images"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


class CrossSpaceError(ValueError):
    """Query vectors and item vectors come from different embedding spaces."""


def resolve_units(encoder_info: dict, requested: str) -> str:
    """``"patches"`` or ``"text_view"`` for an index's encoders; raises :class:`CrossSpaceError`
    when patches are requested but the token and patch encoders differ in space."""
    tokens, patches = encoder_info.get("tokens"), encoder_info.get("patches")
    same = tokens is not None and patches is not None and encoder_space(tokens["name"]) == encoder_space(patches["name"])
    if requested == "patches" and not same:
        raise CrossSpaceError(
            f"visual_units: 'patches' compares question tokens of {tokens and tokens['name']!r} with image patches of "
            f"{patches and patches['name']!r}: different embedding spaces. Use one late-interaction model for both "
            f"roles (colpali-engine), or visual_units='text_view'")
    if requested == "auto":
        return "patches" if same else "text_view"
    return requested


@dataclass
class Visual:
    """Per query: ``candidates`` (graph nodes of X_img), the top-k ``nodes`` of E_k with
    ``scores``, and the units used (``"patches"`` or ``"text_view"``; ``""`` when off)."""
    candidates: list[np.ndarray]
    nodes: list[np.ndarray]
    scores: list[np.ndarray]
    units: str
    used_question: list[bool]


def visual_candidates(view: IndexView, sub: Subgraph, docs: list[np.ndarray], all_document_images: bool,
                      num_threads: int | None = None) -> list[np.ndarray]:
    g = view.graph
    ents = [n[view.node_kind[n] == NODE.ENTITY] for n in sub.nodes]
    # images/regions depicting kept entities, and segments mentioning them
    up = g.expand([e.tolist() for e in ents], hops=1, direction="in",
                  edge_kinds=DEPICT_KINDS + (EdgeKind.MENTIONS,),
                  node_kinds=(NodeKind.ENTITY, NodeKind.SEGMENT) + IMAGE_KINDS, merge_aliases=False,
                  with_edges=False, num_threads=num_threads)
    segs = []
    direct = []
    for i in range(len(sub.nodes)):
        found = up[i].nodes[up[i].hop == 1]
        kinds = view.node_kind[found]
        direct.append(found[np.isin(kinds, IMAGE_KINDS)])
        kept_segs = sub.nodes[i][view.node_kind[sub.nodes[i]] == NODE.SEGMENT]
        segs.append(np.union1d(found[kinds == NODE.SEGMENT], kept_segs))
    down = g.expand([s.tolist() for s in segs], hops=2, direction="out", edge_kinds=(EdgeKind.CONTAINS,),
                    node_kinds=(NodeKind.SEGMENT,) + IMAGE_KINDS, merge_aliases=False, with_edges=False,
                    num_threads=num_threads)
    first = []
    for i in range(len(sub.nodes)):
        found = down[i].nodes
        first.append(np.union1d(direct[i], found[np.isin(view.node_kind[found], IMAGE_KINDS)]))
    # regions of the images that are candidates because they depict an entity
    imgs = [c[view.node_kind[c] == NODE.IMAGE] for c in first]
    regions = g.expand([m.tolist() for m in imgs], hops=1, direction="out", edge_kinds=(EdgeKind.CONTAINS,),
                       node_kinds=IMAGE_KINDS, merge_aliases=False, with_edges=False, num_threads=num_threads)
    out = []
    for i, c in enumerate(first):
        c = np.union1d(c, regions[i].nodes)
        if all_document_images:
            c = np.union1d(c, np.concatenate([view.nodes_of_docs(docs[i], k) for k in IMAGE_KINDS]))
        out.append(c.astype(np.int64))
    return out


def _unit_stores(units: str) -> dict[int, str]:
    return {NodeKind.IMAGE: "image", NodeKind.REGION: "region"} if units == "patches" else \
        {NodeKind.IMAGE: "image_text", NodeKind.REGION: "region_text"}


def _score_side(view: IndexView, stores: dict[int, str], packed_q, rows: np.ndarray, cands: list[np.ndarray],
                ranker: str) -> list[np.ndarray]:
    """Scores ``[len(cands[j])]`` for query rows (-inf for a candidate without units there)."""
    return score_node_lists(view, stores, select_queries(*packed_q, rows), cands, ranker)


def rank_visual(view: IndexView, candidates: list[np.ndarray], cvis_q, image_q, has_image: np.ndarray,
                units: str, ranker: str, k: int, rrf_k: int, used_question: list[bool]) -> Visual:
    nq = len(candidates)
    if ranker == "off":
        empty = [np.zeros(0, np.int64) for _ in range(nq)]
        return Visual(candidates, empty, [np.zeros(0, np.float32) for _ in range(nq)], "", used_question)
    phrase = _score_side(view, _unit_stores(units), cvis_q, np.arange(nq), candidates, ranker)
    sides = [[p] for p in phrase]
    rows = np.flatnonzero(has_image) if image_q is not None else np.zeros(0, np.int64)
    if rows.size:
        img = _score_side(view, _unit_stores("patches"), image_q, rows, [candidates[i] for i in rows], ranker)
        for j, i in enumerate(rows.tolist()):
            # a question without visual cue (and no caption) says nothing about the picture: the
            # query image alone ranks then, instead of fusing with the question's tokens
            sides[i] = [img[j]] if used_question[i] else sides[i] + [img[j]]
    nodes, scores = [], []
    for i in range(nq):
        c = candidates[i]
        if len(sides[i]) == 1:
            s = sides[i][0]
        else:
            ranks = []
            for s_side in sides[i]:
                o = order_desc(s_side, c)
                o = o[np.isfinite(s_side[o])]
                ranks.append({int(c[x]): r + 1 for r, x in enumerate(o.tolist())})
            fused = rrf(ranks, rrf_k)
            s = np.asarray([fused.get(int(x), -np.inf) for x in c], np.float32)
        o = order_desc(s, c)
        o = o[np.isfinite(s[o])][:k]
        nodes.append(c[o])
        scores.append(s[o])
    return Visual(candidates, nodes, scores, units, used_question)
