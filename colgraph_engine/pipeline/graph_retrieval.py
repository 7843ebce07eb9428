"""Stages 2-4: the merged view G_m of the recalled documents, the top-Kg entities and
relations inside it, and their l-hop expansion with the relevance filter.

**G_m** is never built: every graph call passes the query's Kd documents as its document
restriction and merges alias groups (entities with equal normalised names) as one node, which is
the merged graph as a view.

**Seeds.** The top Kg entities and the top Kg relations by the cosine of the question's text
vector (question + caption, the text encoder) with the item's description vector, among the
items of the Kd documents only; entities of one alias group count once (the best member), and
relations whose endpoints are the same alias groups count once. A relation hit seeds both its
endpoints and the edge. With a query image, the top Kg images and regions by MaxSim of the
query-image patches against their patches seed the entities they depict (DEPICTS,
DEPICTS_RELATION).

**Relevance filter.** A score per judged item, and per hop: items with score > threshold are
kept, and at least the `min_keep` best scored items when fewer pass.

* ``filter="off"`` (mKG-RAG's released configuration): nothing is judged; the expansion keeps
  every node it reaches (up to the node budget) and every relation among them.
* ``filter="mkg"`` (mKG-RAG's code, as its rule reads; threshold 0.5, min_keep 3): entities and
  relations only. The seed entity list and the seed relation list are judged; then, per hop,
  the relations incident to the entities kept at the previous hop, and the endpoints of the
  relations kept at the previous hop, each as one judged list. Scores: cosine with the item's
  description vector. For l > 1 the same step repeats (our generalisation; the code runs l=1).
* ``filter="default"`` (the engine's rule, where the papers are silent): seeds are kept as
  retrieved (they already are the best Kg by the same score). The expansion walks entities,
  segments and tables over every edge kind (documents are not entered, so a hop never jumps
  through a whole document; images and regions are left to stage 5, so the filter can never
  starve it). Entities are judged by cosine with their description vector; segments and tables
  carry no description vector and pass (stage 6 ranks them by MaxSim); a node without a score
  is never admitted by the min_keep top-up. Relations among the kept entities are kept when
  they are seeds, score > threshold, or are among the `min_keep` best. The threshold is
  calibrated per text encoder (:data:`config.CALIBRATED_THRESHOLDS`).

**Scoring only what is judged.** No ``[Nq, n_nodes]`` matrix is ever made: hop by hop, one
unfiltered one-hop call lists the neighbours of the nodes kept so far (a superset of what the
next hop judges), only those not scored yet are scored, and the final filtered call reads the
scores as a sparse list per query.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..graph.kinds import EDGE, NODE, EdgeKind, NodeKind
from ..graph.knowledge_graph import SparseScores
from .scoring import cosine_pairs, csr_from_lists, order_desc, score_pairs, select_queries, unit_rows
from .view import IndexView

WALK_KINDS = (NodeKind.ENTITY, NodeKind.SEGMENT, NodeKind.TABLE)
UNJUDGED_PASS = (NodeKind.SEGMENT, NodeKind.TABLE)
DEPICT_KINDS = (EdgeKind.DEPICTS, EdgeKind.DEPICTS_RELATION)


@dataclass
class Seeds:
    """Per query: entity hits and relation hits (best first, with scores), the entities linked
    from image hits, and the seed nodes of the expansion (in that order, repeats removed)."""
    entities: list[np.ndarray]
    entity_scores: list[np.ndarray]
    relations: list[np.ndarray]
    relation_scores: list[np.ndarray]
    image_hits: list[np.ndarray]
    image_linked: list[np.ndarray]
    nodes: list[np.ndarray]
    candidates: dict = field(default_factory=dict)


@dataclass
class Subgraph:
    """Per query: kept nodes (hop ascending; discovery order within a hop), their hop and score, the
    kept relations (edge ids) with scores, and every edge among the kept nodes."""
    nodes: list[np.ndarray]
    hop: list[np.ndarray]
    score: list[np.ndarray]
    relations: list[np.ndarray]
    relation_scores: list[np.ndarray]
    edges: list[np.ndarray]
    judged: np.ndarray | None = None  # [Nq] items the filter scored per query (None: nothing judged)


class TextScorer:
    """Cosine of each query's text vector with entity and relation description vectors, cached
    per (query, item) so no item is scored twice."""

    def __init__(self, view: IndexView, text_vectors: torch.Tensor | None):
        self.view, self.q = view, text_vectors
        self.q_unit = None if text_vectors is None else unit_rows(text_vectors)  # once, not per call
        self.norms = {}
        self.cache_nodes: list[dict[int, float]] = [dict() for _ in range(0 if text_vectors is None else text_vectors.shape[0])]
        self.cache_edges: list[dict[int, float]] = [dict() for _ in range(len(self.cache_nodes))]
        self.scored = np.zeros(len(self.cache_nodes), np.int64)  # items scored per query

    def _norms(self, store: str) -> np.ndarray:
        if store not in self.norms:  # once per view's snapshot of the store, not per batch (Vectors.norms)
            self.norms[store] = self.view.vectors[store].norms
        return self.norms[store]

    def _score(self, store: str, per_query: list[np.ndarray], cache: list[dict]) -> list[np.ndarray]:
        """Scores ``per_query[i]`` (graph node or edge ids) for query i; -inf where no vector."""
        # an empty list costs nothing: the graph adds' per-seed calls pass one list among a batch's
        todo = [np.asarray([x for x in ids.tolist() if x not in cache[i]], np.int64) if ids.size else _NONE
                for i, ids in enumerate(per_query)]
        rows = [i for i, t in enumerate(todo) if t.size]
        if self.q is not None and store in self.view.vectors and rows:
            slots = [self.view.store_slots(store, t) if t.size else _NONE for t in todo]
            has = [s >= 0 for s in slots]
            co, cs = csr_from_lists([s[h] for s, h in zip(slots, has)])
            vals = cosine_pairs(self.view.vectors[store], self._norms(store), self.q_unit, co, cs, unit=True)
            self.scored += np.diff(co)
            for i in rows:
                got = iter(vals[co[i]:co[i + 1]].tolist())
                for x, ok in zip(todo[i].tolist(), has[i].tolist()):
                    cache[i][x] = next(got) if ok else float("-inf")
        else:
            for i in rows:
                for x in todo[i].tolist():
                    cache[i][x] = float("-inf")
        return [np.asarray([cache[i][x] for x in ids.tolist()], np.float32) if ids.size else np.zeros(0, np.float32)
                for i, ids in enumerate(per_query)]

    def entities(self, per_query: list[np.ndarray]) -> list[np.ndarray]:
        return self._score("entity", per_query, self.cache_nodes)

    def relations(self, per_query: list[np.ndarray]) -> list[np.ndarray]:
        return self._score("relation", per_query, self.cache_edges)

    def nodes(self, per_query: list[np.ndarray]) -> list[np.ndarray]:
        """Filter scores of graph nodes: entities by cosine, segments and tables pass (+inf)."""
        kinds = [self.view.node_kind[n] for n in per_query]
        ents = [n[k == NODE.ENTITY] for n, k in zip(per_query, kinds)]
        ent_scores = self.entities(ents)
        out = []
        for n, k, e, s in zip(per_query, kinds, ents, ent_scores):
            v = np.full(n.size, -np.inf, np.float32)
            v[np.isin(k, UNJUDGED_PASS)] = np.inf
            v[k == NODE.ENTITY] = s
            out.append(v)
        return out


_NONE = np.zeros(0, np.int64)


def _alias_key(view: IndexView, nodes: np.ndarray) -> np.ndarray:
    a = view.alias_of[nodes]
    return np.where(a >= 0, a, -(nodes + 1))


def _top_unique(items: np.ndarray, scores: np.ndarray, keys: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    order = order_desc(scores, items)
    _, first = np.unique(keys[order], return_index=True)
    keep = order[np.sort(first)][:k]
    return items[keep], scores[keep]


def retrieve_seeds(view: IndexView, scorer: TextScorer, docs: list[np.ndarray], kg: int,
                   image_q=None, has_image: np.ndarray | None = None, num_threads: int | None = None) -> Seeds:
    """Stage 3 for every query (see the module docstring)."""
    nq = len(docs)
    ent_sv, rel_sv = view.stores.get("entity"), view.stores.get("relation")
    ent_c = [ent_sv.node[ent_sv.slots_of(d)] if ent_sv else np.zeros(0, np.int64) for d in docs]
    rel_c = [rel_sv.node[rel_sv.slots_of(d)] if rel_sv else np.zeros(0, np.int64) for d in docs]
    ent_s, rel_s = scorer.entities(ent_c), scorer.relations(rel_c)
    entities, entity_scores, relations, relation_scores = [], [], [], []
    for i in range(nq):
        e, s = _top_unique(ent_c[i], ent_s[i], _alias_key(view, ent_c[i]), kg)
        entities.append(e)
        entity_scores.append(s)
        r = rel_c[i]
        ka, kb = _alias_key(view, view.edge_src[r]), _alias_key(view, view.edge_dst[r])
        pair = np.minimum(ka, kb) * (1 << 32) + (np.maximum(ka, kb) & 0xFFFFFFFF)
        r, s = _top_unique(r, rel_s[i], pair, kg)
        relations.append(r)
        relation_scores.append(s)
    image_hits = [np.zeros(0, np.int64) for _ in range(nq)]
    image_linked = [np.zeros(0, np.int64) for _ in range(nq)]
    n_image_c = [0] * nq
    if image_q is not None and has_image is not None and has_image.any():
        rows = np.flatnonzero(has_image)
        cand = []
        for i in rows.tolist():
            cand.append([(name, view.stores[name].slots_of(docs[i])) for name in ("image", "region") if name in view.stores])
        hits = _rank_units(view, image_q, rows, cand, kg)
        for j, i in enumerate(rows.tolist()):
            n_image_c[i] = int(sum(c.size for _, c in cand[j]))
        linked = view.graph.expand([h.tolist() for h in hits], hops=1, edge_kinds=DEPICT_KINDS,
                                   node_kinds=(NodeKind.ENTITY, NodeKind.IMAGE, NodeKind.REGION), direction="out",
                                   merge_aliases=False, with_edges=False, num_threads=num_threads)
        for j, i in enumerate(rows.tolist()):
            image_hits[i] = hits[j]
            ex = linked[j]
            image_linked[i] = ex.nodes[(ex.hop == 1) & (view.node_kind[ex.nodes] == NODE.ENTITY)]
    nodes = []
    for i in range(nq):
        r = relations[i]
        ends = np.stack([view.edge_src[r], view.edge_dst[r]], 1).reshape(-1)
        allv = np.concatenate([entities[i], ends, image_linked[i]]).astype(np.int64)
        _, first = np.unique(allv, return_index=True)
        nodes.append(allv[np.sort(first)])
    counts = {"entity_candidates": [int(c.size) for c in ent_c], "relation_candidates": [int(c.size) for c in rel_c],
              "image_candidates": n_image_c}
    return Seeds(entities, entity_scores, relations, relation_scores, image_hits, image_linked, nodes, counts)


def _rank_units(view: IndexView, packed_q, rows: np.ndarray, cand, k: int) -> list[np.ndarray]:
    """Top-k graph nodes per query row by MaxSim of its packed vectors against candidate slots
    of several stores (``cand[j]`` = [(store, slots)] for ``rows[j]``)."""
    sub_v, sub_o = select_queries(*packed_q, rows)
    nodes = [[] for _ in rows]
    scores = [[] for _ in rows]
    for name in ("image", "region"):
        if name not in view.stores:
            continue
        per = [dict(c).get(name, np.zeros(0, np.int64)) for c in cand]
        co, cs = csr_from_lists(per)
        vals = score_pairs(view.vectors[name], sub_v, sub_o, co, cs, "maxsim")
        for j in range(len(rows)):
            nodes[j].append(view.stores[name].node[cs[co[j]:co[j + 1]]])
            scores[j].append(vals[co[j]:co[j + 1]])
    out = []
    for j in range(len(rows)):
        n = np.concatenate(nodes[j]) if nodes[j] else np.zeros(0, np.int64)
        s = np.concatenate(scores[j]) if scores[j] else np.zeros(0, np.float32)
        out.append(n[order_desc(s, n)[:k]])
    return out


def _sparse(known: list[dict[int, float]]) -> SparseScores:
    offsets = np.zeros(len(known) + 1, np.int64)
    np.cumsum([len(d) for d in known], out=offsets[1:])
    nodes = np.fromiter((k for d in known for k in d), np.int64, int(offsets[-1]))
    values = np.fromiter((v for d in known for v in d.values()), np.float32, int(offsets[-1]))
    return SparseScores(offsets, nodes, values)


def expand_filtered(view: IndexView, scorer: TextScorer, seeds: list[np.ndarray], docs: list[np.ndarray], hops: int,
                    *, filtered: bool, threshold: float, min_keep: int, budget: int,
                    num_threads: int | None = None):
    """Batched expansion over :data:`WALK_KINDS` inside each query's documents, scoring only
    the nodes it judges. Returns the native :class:`~colgraph_engine.graph.Expansion`."""
    g = view.graph
    common = dict(node_kinds=WALK_KINDS, docs=[d.tolist() for d in docs], merge_aliases=True, num_threads=num_threads)
    seed_lists = [s.tolist() for s in seeds]
    if not filtered:
        return g.expand(seed_lists, hops=hops, budget=budget, with_edges=True, **common)
    known: list[dict[int, float]] = [dict() for _ in seeds]

    def learn(per_query: list[np.ndarray]):
        fresh = [np.asarray([v for v in n.tolist() if v not in known[i]], np.int64) for i, n in enumerate(per_query)]
        for i, (n, s) in enumerate(zip(fresh, scorer.nodes(fresh))):
            known[i].update(zip(n.tolist(), s.tolist()))

    learn(seeds)
    frontier = seeds
    for h in range(1, hops + 1):
        if h > 1:
            ex = g.expand(seed_lists, hops=h - 1, scores=_sparse(known), threshold=threshold, min_keep=min_keep,
                          budget=budget, with_edges=False, **common)
            frontier = [ex[i].nodes[ex[i].hop == h - 1] for i in range(len(seeds))]
        around = g.expand([f.tolist() for f in frontier], hops=1, with_edges=False, **common)
        learn([around[i].nodes for i in range(len(seeds))])
    return g.expand(seed_lists, hops=hops, scores=_sparse(known), threshold=threshold, min_keep=min_keep,
                    budget=budget, with_edges=True, **common)


def _judge(items: np.ndarray, scores: np.ndarray, threshold: float, min_keep: int) -> np.ndarray:
    """Indices kept by the rule: score > threshold, topped up to min_keep from scored items."""
    order = order_desc(scores, items)
    passed = order[scores[order] > threshold]
    if passed.size >= min_keep:
        return passed
    scored = order[np.isfinite(scores[order]) | (scores[order] > threshold)]
    return scored[:min_keep]


def _group_members(view: IndexView, nodes: np.ndarray, allowed_docs: np.ndarray) -> np.ndarray:
    """`nodes` and the members of their alias groups inside the allowed documents."""
    groups = view.alias_of[nodes]
    groups = np.unique(groups[groups >= 0])
    if not groups.size:
        return nodes
    ranges = view.document_node_ranges(allowed_docs)  # inside the allowed documents only, never a whole group
    members = np.concatenate([view.alias_members_in(g, ranges) for g in groups.tolist()])
    return np.union1d(nodes, members)


def mkg_expand(view: IndexView, scorer: TextScorer, seeds: Seeds, docs: list[np.ndarray], hops: int,
               threshold: float, min_keep: int) -> Subgraph:
    """mKG-RAG's filter (see the module docstring), per query on entity and relation lists; each
    hop scores the candidates of every query in one call (query i against its own vector)."""
    offsets, inc = view.relation_csr
    nq = len(docs)
    e_level: list[list[tuple[np.ndarray, np.ndarray]]] = []
    r_level: list[list[tuple[np.ndarray, np.ndarray]]] = []
    for i in range(nq):
        ents, es = seeds.entities[i], seeds.entity_scores[i]
        keep = _judge(ents, es, threshold, min_keep)
        e_level.append([(ents[keep], es[keep])])
        rels, rs = seeds.relations[i], seeds.relation_scores[i]
        keep = _judge(rels, rs, threshold, min_keep)
        r_level.append([(rels[keep], rs[keep])])
    seen_e = [set(e[0][0].tolist()) for e in e_level]
    seen_r = [set(r[0][0].tolist()) for r in r_level]
    for _ in range(hops):
        cand_r, cand_e = [], []
        for i in range(nq):
            prev_e, prev_r = e_level[i][-1][0], r_level[i][-1][0]
            members = _group_members(view, prev_e, docs[i])
            cr = np.unique(np.concatenate([inc[offsets[v]:offsets[v + 1]] for v in members.tolist()]
                                          or [np.zeros(0, np.int64)]))
            cr = cr[np.isin(view.node_doc[view.edge_src[cr]], docs[i])]
            cand_r.append(np.asarray([r for r in cr.tolist() if r not in seen_r[i]], np.int64))
            ce = np.unique(np.concatenate([view.edge_src[prev_r], view.edge_dst[prev_r]]))
            cand_e.append(np.asarray([v for v in ce.tolist() if v not in seen_e[i]], np.int64))
        crs_all, ces_all = scorer.relations(cand_r), scorer.entities(cand_e)
        for i in range(nq):
            crs, ces = crs_all[i], ces_all[i]
            kr, ke = _judge(cand_r[i], crs, threshold, min_keep), _judge(cand_e[i], ces, threshold, min_keep)
            r_level[i].append((cand_r[i][kr], crs[kr]))
            e_level[i].append((cand_e[i][ke], ces[ke]))
            seen_r[i].update(cand_r[i][kr].tolist())
            seen_e[i].update(cand_e[i][ke].tolist())
    out = Subgraph([], [], [], [], [], [])
    for i in range(nq):
        out.nodes.append(np.concatenate([e for e, _ in e_level[i]]).astype(np.int64))
        out.hop.append(np.concatenate([np.full(e.size, h, np.int32) for h, (e, _) in enumerate(e_level[i])]))
        out.score.append(np.concatenate([s for _, s in e_level[i]]).astype(np.float32))
        out.relations.append(np.concatenate([r for r, _ in r_level[i]]).astype(np.int64))
        out.relation_scores.append(np.concatenate([s for _, s in r_level[i]]).astype(np.float32))
        out.edges.append(np.sort(out.relations[-1]))
    out.judged = scorer.scored.copy()
    return out


def subgraph_from_expansion(view: IndexView, scorer: TextScorer, ex, seeds: Seeds, *, filtered: bool,
                            threshold: float, min_keep: int) -> Subgraph:
    """Kept nodes of a native expansion, and the relations among them (see the module docstring)."""
    out = Subgraph([], [], [], [], [], [])
    rel_lists = []
    for i in range(ex.n_queries):
        q = ex[i]
        out.nodes.append(q.nodes)
        out.hop.append(q.hop)
        out.score.append(q.score)
        out.edges.append(q.edges)
        rel_lists.append(q.edges[view.edge_kind[q.edges] == EDGE.RELATION])
    rel_scores = scorer.relations(rel_lists)
    for i, (r, s) in enumerate(zip(rel_lists, rel_scores)):
        if filtered:
            is_seed = np.isin(r, seeds.relations[i])
            order = order_desc(s, r)
            top = np.zeros(r.size, bool)
            top[order[np.isfinite(s[order])][:min_keep]] = True
            keep = is_seed | (s > threshold) | top
            r, s = r[keep], s[keep]
        order = order_desc(s, r)
        out.relations.append(r[order])
        out.relation_scores.append(s[order])
    out.judged = scorer.scored.copy()
    return out
