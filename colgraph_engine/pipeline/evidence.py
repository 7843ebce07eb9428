"""Stage 6: evidence B(q), records R(q) with provenance, the record graph G_e(q) and its
iterative expansion G*(q).

* **B(q)**: the kept entities (by filter score), the kept relations (by score), and the text
  sources: kept segments and tables plus the segments that are provenance of kept entities and
  relations, ranked by MaxSim of the question (+ caption) tokens against their tokens; the best
  ``evidence_k`` are kept. With ``retrieval="graph+chunks"`` the sources are instead every segment
  and table of the Kd documents ranked by their MaxSim combined with graph support
  (:mod:`.graph_adds`), the best ``evidence_k`` kept.
* **R(q)**: deterministic records ``(subject, predicate, object, evidence)``: one per kept
  relation (endpoint names, its keywords or "related to", its description) and one per
  depiction edge leaving an image or region of E_k(q) (region label or image name, "depicts",
  the entity, the region's text view), each with document, segments, node and edge ids, image
  and box, and score (relation: its filter score; depiction: the image's visual score).
* **G_e(q)**: the nodes and edges those records name.
* **G*(q)** (the engine's rule; the papers do not fix one): seeds are G_e's walkable nodes; each
  round is one filtered hop of the stage-4 expansion; it stops when a round admits nothing,
  after ``gstar_rounds`` rounds, or at ``gstar_budget`` nodes. All queries run in one call.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field

import numpy as np

from ..graph.kinds import NODE, NodeKind
from .graph_retrieval import DEPICT_KINDS, WALK_KINDS, Subgraph, TextScorer, expand_filtered
from .scoring import csr_from_lists, order_desc, score_node_lists, score_pairs
from .view import IndexView


@dataclass(frozen=True)
class Record:
    """One structured fact with its provenance."""
    subject: str
    predicate: str
    object: str
    evidence: str
    doc_id: str
    segments: tuple[int, ...]
    nodes: tuple[int, ...]
    edge: int
    image: str | None
    bbox: tuple[float, float, float, float] | None
    score: float | None  # None: not scored (e.g. relations kept with filter="off")
    source: str  # "relation" or "image"
    # citation (pipeline.citations): pages of the document, and for images and regions the box
    # on the page (in the image when it is on no page); set after the records are built
    pages: tuple[int, ...] = ()
    box: tuple[float, float, float, float] | None = None


@dataclass
class Evidence:
    """One query's stage-6 output."""
    entities: list[dict]
    relations: list[dict]
    sources: list[dict]
    records: list[Record]
    ge_nodes: np.ndarray
    ge_edges: np.ndarray
    gstar_nodes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    gstar_edges: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


def _scored(score: float) -> float | None:
    """A filter score as reported: None for an item no filter judged (NaN inside the expansion),
    so that results compare equal and serialise as JSON."""
    return None if math.isnan(score) else float(score)


def by_score(score: float | None) -> float:
    """Sort key, higher first when negated: unscored items after every scored one."""
    return float("-inf") if score is None else score


def _segment_nodes(view: IndexView, doc_id: str, ordinals) -> list[int]:
    # a document's nodes: the document (local 0), then its segments in order (kg.document)
    i = int(np.searchsorted(view.numbers, view.index.doc_number(doc_id)))
    return [int(view.node_first[i]) + 1 + int(o) for o in ordinals]


def build_evidence(view: IndexView, sub: Subgraph, visual, text_q, evidence_k: int,
                   num_threads: int | None = None, ranked: list | None = None) -> list[Evidence]:
    """Stage 6 for every query. `ranked` (``retrieval="graph+chunks"``): per query the text units
    ``(nodes [n], scores [n])`` already ranked by :func:`.graph_adds.rank_text_units`; the
    sources are then its first `evidence_k` with those scores, instead of the subgraph's
    segments and provenance ranked by MaxSim."""
    index, degree = view.index, view.degree
    names = view.graph.node_names  # the merged graph's names where it holds them: no describe_node
    name_of = (lambda v: names[v]) if names is not None else (lambda v: index.describe_node(v)["name"])
    nq = len(sub.nodes)
    out: list[Evidence] = []
    # text sources per query: kept segments/tables + provenance of kept entities and relations
    src_lists, ent_info, rel_info = [], [], []
    for i in range(nq):
        nodes, kinds = sub.nodes[i], view.node_kind[sub.nodes[i]]
        ents = []
        prov: set[int] = set(nodes[np.isin(kinds, (NodeKind.SEGMENT, NodeKind.TABLE))].tolist())
        for v, s in zip(nodes[kinds == NODE.ENTITY].tolist(), sub.score[i][kinds == NODE.ENTITY].tolist()):
            d = index.describe_node(v)
            prov.update(_segment_nodes(view, d["doc_id"], d["segments"]))
            ents.append({"node": v, "name": d["name"], "type": d["type"], "description": d["text"],
                         "doc_id": d["doc_id"], "score": _scored(s), "rank": int(degree[v])})
        rels = []
        for e, s in zip(sub.relations[i].tolist(), sub.relation_scores[i].tolist()):
            d = index.describe_edge(e)
            prov.update(_segment_nodes(view, d["doc_id"], d["segments"]))
            rels.append({"edge": e, "src": d["src"], "dst": d["dst"], "source": name_of(d["src"]),
                         "target": name_of(d["dst"]), "keywords": d["keywords"],
                         "description": d["text"], "weight": d["weight"], "doc_id": d["doc_id"],
                         "segments": tuple(d["segments"]), "score": _scored(s),
                         "rank": int(degree[d["src"]] + degree[d["dst"]])})
        src_lists.append(np.asarray(sorted(prov), np.int64))
        ent_info.append(ents)
        rel_info.append(rels)
    if ranked is not None:  # graph+chunks: candidates and order come from the combined rule
        src_lists = [np.asarray(u, np.int64) for u, _ in ranked]
        src_scores = [np.asarray(sc, np.float64) for _, sc in ranked]
    else:
        src_scores = _score_sources(view, text_q, src_lists)
    # depiction edges leaving E_k
    ek = [v for v in visual.nodes]
    dep = view.graph.expand([e.tolist() for e in ek], hops=1, direction="out", edge_kinds=DEPICT_KINDS,
                            merge_aliases=False, with_edges=True, num_threads=num_threads)
    for i in range(nq):
        order = order_desc(src_scores[i], src_lists[i])[:evidence_k]
        sources = []
        for j in order.tolist():
            v = int(src_lists[i][j])
            d = index.describe_node(v)
            sources.append({"node": v, "kind": d["kind"], "doc_id": d["doc_id"], "name": d["name"], "text": d["text"],
                            "score": float(src_scores[i][j])})
        records = []
        for r in rel_info[i]:
            records.append(Record(r["source"], r["keywords"] or "related to", r["target"], r["description"], r["doc_id"],
                                  r["segments"], (r["src"], r["dst"]), r["edge"], None, None, r["score"],
                                  "relation"))
        vscore = dict(zip(visual.nodes[i].tolist(), visual.scores[i].tolist()))
        src_e, dst_e = view.edge_src[dep[i].edges], view.edge_dst[dep[i].edges]
        for e, u, w in zip(dep[i].edges.tolist(), src_e.tolist(), dst_e.tolist()):
            if u not in vscore or int(view.edge_kind[e]) not in DEPICT_KINDS:
                continue
            du, dw = index.describe_node(u), index.describe_node(w)
            image = du["image"]
            # an object region reads as its category, a relation region as its scene-graph triple
            relation_region = du["kind"] == "region" and du["name"].startswith("relation-")
            label = du["text"] if relation_region else (du["type"] or du["name"]) if du["kind"] == "region" \
                else du["name"]
            records.append(Record(label, "depicts", dw["name"], du["text"], du["doc_id"], tuple(du["segments"]),
                                  (u, w), e, image, du["bbox"], float(vscore[u]), "image"))
        ge_nodes = np.unique(np.asarray([n for r in records for n in r.nodes], np.int64))
        ge_edges = np.unique(np.asarray([r.edge for r in records if r.edge >= 0], np.int64))
        out.append(Evidence(ent_info[i], rel_info[i], sources, records, ge_nodes, ge_edges))
    return out


def _score_sources(view: IndexView, text_q, lists: list[np.ndarray]) -> list[np.ndarray]:
    return score_node_lists(view, {NodeKind.SEGMENT: "segment", NodeKind.TABLE: "table"}, text_q, lists, "maxsim")


def expand_gstar(view: IndexView, scorer: TextScorer, evidence: list[Evidence], docs: list[np.ndarray], *,
                 rounds: int, budget: int, filtered: bool, threshold: float, min_keep: int,
                 num_threads: int | None = None) -> None:
    """Fills ``gstar_nodes`` / ``gstar_edges`` of every query's evidence (one batched call)."""
    seeds = [ev.ge_nodes[np.isin(view.node_kind[ev.ge_nodes], WALK_KINDS)] for ev in evidence]
    if rounds == 0 or not any(s.size for s in seeds):
        for ev in evidence:
            ev.gstar_nodes, ev.gstar_edges = ev.ge_nodes, ev.ge_edges
        return
    ex = expand_filtered(view, scorer, seeds, docs, rounds, filtered=filtered, threshold=threshold,
                         min_keep=min_keep, budget=budget, num_threads=num_threads)
    for i, ev in enumerate(evidence):
        ev.gstar_nodes = np.union1d(ev.ge_nodes, ex[i].nodes)
        ev.gstar_edges = np.union1d(ev.ge_edges, ex[i].edges)


def chunk_subgraph(view: IndexView, text_q, docs: list[np.ndarray], k: int) -> Subgraph:
    """``retrieval="chunks"``: the top-k segments of each query's Kd documents by MaxSim of the
    question (+ caption) tokens; no entities or relations."""
    sv = view.stores.get("segment")
    lists = [sv.slots_of(d) if sv else np.zeros(0, np.int64) for d in docs]
    co, cs = csr_from_lists(lists)
    vals = score_pairs(view.vectors["segment"], *text_q, co, cs, "maxsim") if sv else np.zeros(0, np.float32)
    sub = Subgraph([], [], [], [], [], [])
    for i in range(len(docs)):
        nodes, s = sv.node[cs[co[i]:co[i + 1]]] if sv else np.zeros(0, np.int64), vals[co[i]:co[i + 1]]
        o = order_desc(s, nodes)[:k]
        sub.nodes.append(nodes[o])
        sub.hop.append(np.zeros(o.size, np.int32))
        sub.score.append(s[o])
        sub.relations.append(np.zeros(0, np.int64))
        sub.relation_scores.append(np.zeros(0, np.float32))
        sub.edges.append(np.zeros(0, np.int64))
    sub.judged = np.diff(co)
    return sub


__all__ = ["Evidence", "Record", "build_evidence", "chunk_subgraph", "expand_gstar"]


def llm_records(extractor, question: str, evidence: Evidence, view: IndexView) -> tuple[list[Record], str | None]:
    """The optional query-conditioned extraction: ``extractor(question, evidence_text)`` returns
    relation records in any dialect the KG parsers read (LightRAG's line format, tuples, JSON);
    each parsed relation becomes a Record with ``source="llm"``. Provenance: entity names are
    matched (by normalised name) to the query's evidence entities, whose nodes and document the
    record carries; a name that matches nothing leaves those empty. A failing extractor or an
    unparsable answer gives no records and the reason (never an exception)."""
    from ..kg.parsers import parse_extraction
    from ..kg.records import normalize_name

    lines = [f"{r.subject} | {r.predicate} | {r.object}: {r.evidence}" for r in evidence.records]
    lines += [f"{s['doc_id']}: {s['text']}" for s in evidence.sources]
    try:
        answer = extractor(question, "\n".join(lines))
        if not isinstance(answer, str):
            raise TypeError(f"record extractor returned {type(answer).__name__}, expected str")
        parsed = parse_extraction(answer)
    except Exception as exc:  # the deterministic records stand on their own
        return [], f"{type(exc).__name__}: {exc}"
    by_name = {}
    for e in evidence.entities:
        by_name.setdefault(normalize_name(e["name"]), e)
    out = []
    for rel in parsed.relations:
        a, b = by_name.get(normalize_name(rel.source)), by_name.get(normalize_name(rel.target))
        nodes = tuple(x["node"] for x in (a, b) if x is not None)
        doc = (a or b or {}).get("doc_id", "")
        out.append(Record(rel.source, rel.keywords or "related to", rel.target, rel.description, doc, (), nodes, -1,
                          None, None, float(rel.weight) if rel.weight is not None else 1.0, "llm"))
    return out, None if parsed.relations or not parsed.issues else str(parsed.issues[0])
