"""One document's multimodal knowledge graph, built from its text, extraction records, scene
graphs and region matches (mKG-RAG's offline stage).

Nodes, in local id order: the document (0), its segments, its entities (first-seen order),
tables, images, then regions. Edges (see :class:`~colgraph_engine.graph.EdgeKind`):

* document -CONTAINS-> segment -CONTAINS-> image -CONTAINS-> region, segment -CONTAINS-> table
* segment -MENTIONS-> entity (weight: how many records of that segment name it)
* entity -RELATION-> entity (weight: summed strength, 1 per record without one)
* image / object region -DEPICTS-> entity (weight: the match score)
* relation region -DEPICTS_RELATION-> each endpoint; the region's bbox is the union of its two
  objects' boxes and ``node_edge`` points at the relation edge it depicts
* region -SCENE-> region (the scene graph's predicates)

Merge rules, inside this document only (documents never merge in storage):
* entities with equal :func:`normalize_name` are one node: the first spelling is the name, the
  most frequent type wins (ties: first seen), distinct descriptions are kept in first-seen order
  and joined by new lines, provenance is the set of segments that mention it;
* relations between the same two entities, in either direction, are one edge (LightRAG treats
  relations as undirected): weights add, keywords and descriptions are unioned in order, the
  first orientation is kept;
* a relation whose endpoint was never declared creates that entity with type ``UNKNOWN`` (and a
  warning); a mapping that names an entity this document does not have is an error (dropped).
"""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..graph.kinds import EdgeKind, NodeKind
from .captions import box_area, caption_texts, figure_links
from .parsers import parse_extraction, parse_region_mappings, parse_scene_graph
from .pages import page_source, section_pages
from .records import ExtractionFormatError, ParseIssue, ParseResult, normalize_name
from .segment import Section, Segment, segment_sections
from .spool import ImageSpool, SpooledImage, SpooledPixels

UNKNOWN_TYPE = "UNKNOWN"
NO_BOX = (np.nan, np.nan, np.nan, np.nan)
FULL_BOX = (0.0, 0.0, 1.0, 1.0)


# -- inputs -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ImageInput:
    """An image of the document.

    ``ref`` is how sections name it (``Section.images``); ``pixels`` is a file path, a PIL image
    or a uint8 ``[H, W, 3]`` array (None: the image gets a node but no patch vectors); readers
    give decoded images as :class:`SpooledImage` paths (files of an :class:`ImageSpool`);
    ``scene_graph`` and ``mappings`` are model responses (text) or already parsed results.
    ``source`` says where the image came from when `pixels` is not the user's own file path (e.g.
    ``"report.pdf page 3, box (0.100, 0.200, 0.550, 0.600)"``); it is kept as the node's source.
    """
    ref: str
    pixels: object = None
    scene_graph: str | ParseResult | None = None
    mappings: str | ParseResult | None = None
    caption: str = ""
    source: str = ""


@dataclass(frozen=True)
class TableInput:
    """A table: its text (any serialisation), a caption, and the section it sits in (None: the
    document itself)."""
    text: str
    caption: str = ""
    section: int | None = None


@dataclass(frozen=True)
class DocumentInput:
    """A source document.

    ``extractions``: one extraction response (or parsed result) per segment, when records were
    produced beforehand; otherwise the builder's extractor runs on each segment's text. Use
    ``segments`` instead of ``sections`` to supply the segmentation yourself.
    """
    doc_id: str
    sections: Sequence[Section | str] = ()
    title: str = ""
    images: Sequence[ImageInput] = ()
    tables: Sequence[TableInput] = ()
    extractions: Sequence[str | ParseResult] | None = None
    segments: Sequence[Segment] | None = None


@dataclass(frozen=True)
class DocumentIssue:
    """A parse or build issue, with where it came from (``"segment 3"``, ``"image 'fig1' mappings"``)."""
    where: str
    issue: ParseIssue

    @property
    def severity(self) -> str:
        return self.issue.severity

    def __str__(self) -> str:
        return f"{self.where}: {self.issue}"


class DocumentBuildError(ValueError):
    """Strict build failed; ``issues`` lists every error found in the document."""

    def __init__(self, doc_id: str, issues: Sequence[DocumentIssue]):
        self.issues = tuple(issues)
        errors = [i for i in self.issues if i.severity == "error"]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(f"document {doc_id!r}: {errors[0]}{more}")


# -- the built graph ------------------------------------------------------------------------------

@dataclass
class DocumentGraph:
    """One document's graph in columnar form; node and edge ids are local (0-based).

    Arrays: ``node_kind [n]`` uint8, ``node_weight [n]`` float32, ``node_bbox [n, 4]`` float32
    (normalised ``x1, y1, x2, y2``; NaN for nodes without a box; images span the unit square),
    ``node_edge [n]`` int32 (relation regions: the edge they depict, else -1), ``node_image [n]``
    int32 (regions: their image node, else -1), ``node_prov_offsets [n+1]`` int64 /
    ``node_prov [P]`` int32 (segment ordinals each node comes from, CSR), and
    ``edge_src / edge_dst [m]`` int32, ``edge_kind [m]`` uint8, ``edge_weight [m]`` float32,
    ``edge_prov_offsets [m+1]`` / ``edge_prov``. Strings are lists of length n or m.
    """
    doc_id: str
    title: str
    node_kind: np.ndarray
    node_weight: np.ndarray
    node_name: list[str]
    node_type: list[str]
    node_text: list[str]
    node_source: list[str]
    node_bbox: np.ndarray
    node_edge: np.ndarray
    node_image: np.ndarray
    node_prov_offsets: np.ndarray
    node_prov: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_kind: np.ndarray
    edge_weight: np.ndarray
    edge_keywords: list[str]
    edge_text: list[str]
    edge_prov_offsets: np.ndarray
    edge_prov: np.ndarray
    issues: list[DocumentIssue] = field(default_factory=list)
    pixels: dict[str, object] = field(default_factory=dict, repr=False)  # image ref -> pixels (not persisted)

    @property
    def n_nodes(self) -> int:
        return int(self.node_kind.size)

    @property
    def n_edges(self) -> int:
        return int(self.edge_src.size)

    def nodes_of(self, kind: NodeKind) -> np.ndarray:
        """Local ids ``[k]`` of the nodes of one kind, ascending."""
        return np.flatnonzero(self.node_kind == kind).astype(np.int64)

    def edges_of(self, kind: EdgeKind) -> np.ndarray:
        return np.flatnonzero(self.edge_kind == kind).astype(np.int64)

    def provenance(self, node: int) -> np.ndarray:
        return self.node_prov[self.node_prov_offsets[node]: self.node_prov_offsets[node + 1]]

    @property
    def counts(self) -> dict[str, int]:
        kinds = np.bincount(self.node_kind, minlength=len(NodeKind))
        ekinds = np.bincount(self.edge_kind, minlength=len(EdgeKind))
        out = {plural: int(kinds[k]) for k, plural in _PLURALS.items()}
        out["relations"] = int(ekinds[EdgeKind.RELATION])
        out["nodes"], out["edges"] = self.n_nodes, self.n_edges
        out["errors"] = sum(i.severity == "error" for i in self.issues)
        out["warnings"] = sum(i.severity == "warning" for i in self.issues)
        return out

    def entity(self, name: str) -> int:
        """Local id of the entity named `name` (compared by normalised name); KeyError if none."""
        key = normalize_name(name)
        for v in self.nodes_of(NodeKind.ENTITY):
            if normalize_name(self.node_name[v]) == key:
                return int(v)
        raise KeyError(f"document {self.doc_id!r} has no entity {name!r}")


_PLURALS = {NodeKind.SEGMENT: "segments", NodeKind.ENTITY: "entities", NodeKind.TABLE: "tables",
            NodeKind.IMAGE: "images", NodeKind.REGION: "regions"}


# -- building -------------------------------------------------------------------------------------

class _Builder:
    """Accumulates nodes and edges with the merge rules; ``finish`` freezes them into arrays."""

    def __init__(self, doc_id: str, title: str):
        self.doc_id = doc_id
        self.kind: list[int] = []
        self.weight: list[float] = []
        self.name: list[str] = []
        self.type: list[str] = []
        self.text: list[str] = []
        self.source: list[str] = []
        self.bbox: list[tuple] = []
        self.node_edge: list[int] = []
        self.node_image: list[int] = []
        self.prov: list[list[int]] = []
        self.src: list[int] = []
        self.dst: list[int] = []
        self.ekind: list[int] = []
        self.eweight: list[float] = []
        self.keywords: list[list[str]] = []
        self.etext: list[list[str]] = []
        self.eprov: list[list[int]] = []
        self.edge_index: dict[tuple, int] = {}
        self.issues: list[DocumentIssue] = []
        # entity bookkeeping (local id, types seen, descriptions seen)
        self.entity_of: dict[str, int] = {}
        self.entity_types: dict[int, Counter] = {}
        self.entity_descriptions: dict[int, dict[str, None]] = {}
        self.mentions: dict[tuple[int, int], int] = {}  # (segment node, entity) -> count
        self.node(NodeKind.DOCUMENT, title or doc_id, "", title)

    def node(self, kind, name, type_, text, *, weight=1.0, source="", bbox=NO_BOX, prov=(), image=-1) -> int:
        self.kind.append(int(kind))
        self.weight.append(float(weight))
        self.name.append(name)
        self.type.append(type_)
        self.text.append(text)
        self.source.append(source)
        self.bbox.append(bbox)
        self.node_edge.append(-1)
        self.node_image.append(image)
        self.prov.append(list(prov))
        return len(self.kind) - 1

    def edge(self, u, v, kind, weight=1.0, keywords=(), text=(), prov=(), *, merge_key=None) -> int:
        """Adds an edge, or merges into the edge with the same `merge_key` (weights add for
        relations, the higher score wins for matches)."""
        if merge_key is not None and merge_key in self.edge_index:
            e = self.edge_index[merge_key]
            if kind == EdgeKind.RELATION:
                self.eweight[e] += weight
            else:
                self.eweight[e] = max(self.eweight[e], weight)
            _union(self.keywords[e], keywords)
            _union(self.etext[e], text)
            _union(self.eprov[e], prov)
            return e
        self.src.append(u)
        self.dst.append(v)
        self.ekind.append(int(kind))
        self.eweight.append(float(weight))
        self.keywords.append([])
        self.etext.append([])
        self.eprov.append([])
        e = len(self.src) - 1
        _union(self.keywords[e], keywords)
        _union(self.etext[e], text)
        _union(self.eprov[e], prov)
        if merge_key is not None:
            self.edge_index[merge_key] = e
        return e

    def note(self, where: str, issue: ParseIssue) -> None:
        self.issues.append(DocumentIssue(where, issue))

    def entity(self, name: str, type_: str, description: str, segment: int) -> int:
        key = normalize_name(name)
        v = self.entity_of.get(key)
        if v is None:
            v = self.node(NodeKind.ENTITY, name, "", "", weight=0.0)
            self.entity_of[key] = v
            self.entity_types[v] = Counter()
            self.entity_descriptions[v] = {}
        if type_:
            self.entity_types[v][type_] += 1
        if description:
            self.entity_descriptions[v][description] = None
        if segment not in self.prov[v]:
            self.prov[v].append(segment)
        return v

    def mention(self, segment_node: int, entity: int) -> None:
        self.weight[entity] += 1.0
        self.mentions[(segment_node, entity)] = self.mentions.get((segment_node, entity), 0) + 1

    def finish(self) -> DocumentGraph:
        for v, types in self.entity_types.items():
            # most frequent type, ties to the first seen (Counter keeps insertion order)
            self.type[v] = max(types.items(), key=lambda kv: kv[1])[0] if types else UNKNOWN_TYPE
            self.text[v] = "\n".join(self.entity_descriptions[v])
        for (seg, ent), count in self.mentions.items():
            self.edge(seg, ent, EdgeKind.MENTIONS, float(count), prov=(self.prov[seg][0],))
        n, m = len(self.kind), len(self.src)
        node_prov_offsets, node_prov = _csr(self.prov)
        edge_prov_offsets, edge_prov = _csr(self.eprov)
        return DocumentGraph(
            doc_id=self.doc_id, title=self.text[0],
            node_kind=np.asarray(self.kind, np.uint8).reshape(n),
            node_weight=np.asarray(self.weight, np.float32).reshape(n),
            node_name=self.name, node_type=self.type, node_text=self.text, node_source=self.source,
            node_bbox=np.asarray(self.bbox, np.float32).reshape(n, 4),
            node_edge=np.asarray(self.node_edge, np.int32).reshape(n),
            node_image=np.asarray(self.node_image, np.int32).reshape(n),
            node_prov_offsets=node_prov_offsets, node_prov=node_prov,
            edge_src=np.asarray(self.src, np.int32).reshape(m), edge_dst=np.asarray(self.dst, np.int32).reshape(m),
            edge_kind=np.asarray(self.ekind, np.uint8).reshape(m),
            edge_weight=np.asarray(self.eweight, np.float32).reshape(m),
            edge_keywords=[", ".join(k) for k in self.keywords], edge_text=["\n".join(t) for t in self.etext],
            edge_prov_offsets=edge_prov_offsets, edge_prov=edge_prov, issues=self.issues)


def _union(target: list, items) -> None:
    """Appends the items not yet in `target`, skipping empty strings (segment ordinal 0 is kept)."""
    for item in items:
        if item is not None and item != "" and item not in target:
            target.append(item)


def _csr(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(lists) + 1, np.int64)
    np.cumsum([len(x) for x in lists], out=offsets[1:])
    values = np.fromiter((v for x in lists for v in x), np.int32, count=int(offsets[-1]))
    return offsets, values


def _split_keywords(keywords: str) -> list[str]:
    return [k.strip() for k in keywords.replace(";", ",").split(",") if k.strip()]


def _issue(reason: str, raw: str, detail: str, severity: str = "error") -> ParseIssue:
    return ParseIssue((0, 0), reason, raw, severity, detail)


def _as_parsed(value, what: str, parse: Callable[[str, bool], ParseResult], strict: bool) -> ParseResult:
    if isinstance(value, ParseResult):
        return value
    if not isinstance(value, str):
        raise TypeError(f"{what}: expected str or ParseResult, got {type(value).__name__}")
    return parse(value, strict)


def _check_document(doc) -> None:
    if not isinstance(doc, DocumentInput):
        raise TypeError(f"doc: expected a DocumentInput, got {type(doc).__name__}")
    if not isinstance(doc.doc_id, str) or not doc.doc_id.strip():
        raise ValueError(f"doc.doc_id: expected a non-empty str, got {doc.doc_id!r}")
    if not isinstance(doc.title, str):
        raise TypeError(f"doc.title: expected str, got {type(doc.title).__name__}")
    refs = set()
    for i, im in enumerate(doc.images):
        if not isinstance(im, ImageInput):
            raise TypeError(f"doc.images[{i}]: expected an ImageInput, got {type(im).__name__}")
        if not isinstance(im.ref, str) or not im.ref:
            raise ValueError(f"doc.images[{i}].ref: expected a non-empty str, got {im.ref!r}")
        if im.ref in refs:
            raise ValueError(f"doc.images[{i}].ref: duplicate image ref {im.ref!r}")
        if not isinstance(im.caption, str):
            raise TypeError(f"doc.images[{i}].caption: expected str, got {type(im.caption).__name__}")
        if not isinstance(im.source, str):
            raise TypeError(f"doc.images[{i}].source: expected str, got {type(im.source).__name__}")
        refs.add(im.ref)
    for i, t in enumerate(doc.tables):
        if not isinstance(t, TableInput) or not isinstance(t.text, str) or not isinstance(t.caption, str):
            raise TypeError(f"doc.tables[{i}]: expected a TableInput with str text and caption")
        if t.section is not None and (isinstance(t.section, bool) or not isinstance(t.section, int) or t.section < 0):
            raise ValueError(f"doc.tables[{i}].section: expected a section index >= 0 or None, got {t.section!r}")
    if doc.segments is not None and (isinstance(doc.segments, (str, bytes))
                                     or not all(isinstance(s, Segment) for s in doc.segments)):
        raise TypeError("doc.segments: expected a sequence of Segment or None")


def build_document_graph(doc: DocumentInput, *, extractor: Callable[[str], str] | None = None,
                         max_tokens: int = 1200, overlap_tokens: int = 0,
                         count_tokens: Callable[[str], int] | None = None, strict: bool = False,
                         min_mapping_score: float = 0.0, image_fallback: str = "degree",
                         image_entity_scores: Callable[[object, Sequence[str]], Sequence[float]] | None = None,
                         ) -> DocumentGraph:
    """Builds one document's graph by the rules in the module docstring.

    Args:
        doc: the document.
        extractor: ``segment text -> record text`` for segments without given extractions
            (default: :class:`~colgraph_engine.kg.extract.PhraseExtractor`). Caption definitions in a
            segment ("Figure 3: ...") caption the image they name and link it to the ``Figure 3``
            entity (DEPICTS, keyword ``caption``; rules in :mod:`colgraph_engine.kg.captions`).
        max_tokens, overlap_tokens, count_tokens: segmentation (see :func:`segment_sections`).
        strict: raise :class:`DocumentBuildError` if any record or match is malformed or
            unresolvable (default: drop it and report it in ``issues``).
        min_mapping_score: region matches scoring below this are dropped (reported as skips).
        image_fallback: what happens to an image that no image-level match attaches to an entity
            (mKG-RAG's rule, read in its code, ``rag/multimodal/build.py``: object-level matches
            do not count; such an image is attached, among the entities and relations extracted
            from the image's text chunk, to the entity of highest relation degree, or, when none has
            a relation, to the entity whose description is most similar to the image under a
            text-image embedding, with weight 1.0; a chunk without entities attaches nothing):

            * ``"degree"`` (default): among the entities the image's segment mentions, the one with
              the most distinct relations extracted from that segment (ties: the first declared —
              ours; mKG-RAG takes the first in its edge order); when none has a relation, the most
              similar by `image_entity_scores` if given, else (ours, for offline builds without a
              text-image model) the one the segment mentions most often. An image in no segment
              uses the whole document (ours);
            * ``"similarity"``: always the entity `image_entity_scores` ranks first (ours);
            * ``"off"``: no fallback (the image hangs off its segment only).

            The fallback edge is a DEPICTS edge of weight 1.0 with the keyword ``fallback``. A
            document without entities keeps its images on their segments (reported as a skip).
        image_entity_scores: ``(pixels, descriptions [k]) -> scores [k]``, a text-image
            similarity (e.g. a ColPali-family model); needed for ``image_fallback="similarity"``.
    """
    _check_document(doc)
    if not isinstance(strict, bool):
        raise TypeError(f"strict: expected bool, got {type(strict).__name__}")
    if isinstance(min_mapping_score, bool) or not isinstance(min_mapping_score, (int, float)) \
            or not np.isfinite(min_mapping_score):
        raise ValueError(f"min_mapping_score: expected a finite number, got {min_mapping_score!r}")
    if image_fallback not in IMAGE_FALLBACKS:
        raise ValueError(f"image_fallback: expected one of {IMAGE_FALLBACKS}, got {image_fallback!r}")
    if image_entity_scores is not None and not callable(image_entity_scores):
        raise TypeError(f"image_entity_scores: expected a callable (pixels, descriptions) -> scores or None, "
                        f"got {type(image_entity_scores).__name__}")
    if image_fallback == "similarity" and image_entity_scores is None:
        raise ValueError('image_fallback: "similarity" needs image_entity_scores (a text-image similarity)')
    segments = list(doc.segments) if doc.segments is not None else segment_sections(
        doc.sections, max_tokens=max_tokens, overlap_tokens=overlap_tokens, count_tokens=count_tokens)
    if doc.extractions is not None:
        if isinstance(doc.extractions, (str, bytes)) or len(doc.extractions) != len(segments):
            got = "a str" if isinstance(doc.extractions, (str, bytes)) else f"{len(doc.extractions)}"
            raise ValueError(f"doc.extractions: expected one response per segment ({len(segments)}), got {got}")
    elif extractor is None:
        from .extract import PhraseExtractor
        extractor = PhraseExtractor()
    elif not callable(extractor):
        raise TypeError(f"extractor: expected a callable text -> str, got {type(extractor).__name__}")

    b = _Builder(doc.doc_id, doc.title)
    lenient = False  # parsers always run lenient here; strictness is decided once, below
    seg_nodes = []
    for s, seg in enumerate(segments):
        # the pages its sections came from, as the segment's source (kg.pages): what citations read
        pages = section_pages(doc.sections, *seg.sections) if doc.sections else ()
        v = b.node(NodeKind.SEGMENT, f"segment-{s}", "", seg.text, source=page_source(doc.doc_id, pages), prov=(s,))
        seg_nodes.append(v)
        b.edge(0, v, EdgeKind.CONTAINS)

    # text records -> entities and relations
    for s, seg in enumerate(segments):
        raw = doc.extractions[s] if doc.extractions is not None else extractor(seg.text)
        where = f"segment {s}"
        parsed = _as_parsed(raw, f"extraction of {where}", lambda t, _: parse_extraction(t, strict=lenient), strict)
        for issue in parsed.issues:
            b.note(where, issue)
        for rec in parsed.entities:
            b.mention(seg_nodes[s], b.entity(rec.name, rec.type, rec.description, s))
        for rec in parsed.relations:
            ends = []
            for name in (rec.source, rec.target):
                if normalize_name(name) not in b.entity_of:
                    b.note(where, _issue("undeclared entity", name, f"relation endpoint {name!r} created with type "
                                         f"{UNKNOWN_TYPE}", "warning"))
                ends.append(b.entity(name, "", "", s))
                b.mention(seg_nodes[s], ends[-1])
            u, v = ends
            b.edge(u, v, EdgeKind.RELATION, 1.0 if rec.weight is None else rec.weight,
                   _split_keywords(rec.keywords), (rec.description,), (s,), merge_key=("rel", min(u, v), max(u, v)))

    def segment_of_section(section: int | None) -> int | None:
        if section is None:
            return None
        for s, seg in enumerate(segments):
            if seg.sections[0] <= section <= seg.sections[1]:
                return s
        return None

    # tables
    for t, table in enumerate(doc.tables):
        s = segment_of_section(table.section)
        text = f"{table.caption}\n{table.text}" if table.caption else table.text
        v = b.node(NodeKind.TABLE, f"table-{t}", "", text, prov=() if s is None else (s,))
        if table.section is not None and s is None:
            b.note(f"table {t}", _issue("unknown section", str(table.section),
                                        "no segment holds this section; attached to the document", "warning"))
        b.edge(0 if s is None else seg_nodes[s], v, EdgeKind.CONTAINS)

    # images: every ref named by a segment, plus every ImageInput
    inputs = {im.ref: im for im in doc.images}
    image_segment: dict[str, int] = {}
    for s, seg in enumerate(segments):
        for ref in seg.images:
            image_segment.setdefault(ref, s)
    refs = list(image_segment) + [r for r in inputs if r not in image_segment]
    graph_pixels = {}
    named = figure_links(caption_texts(doc.sections, segments), [seg.images for seg in segments],  # "Figure N: ..."
                         {r: a for r, im in inputs.items() if (a := box_area(im.source)) is not None})
    for ref in refs:
        im = inputs.get(ref, ImageInput(ref))
        s = image_segment.get(ref)
        own_file = isinstance(im.pixels, (str, os.PathLike)) and not isinstance(im.pixels, SpooledImage)
        source = im.source or (str(im.pixels) if own_file else "")  # a spool's temporary path is no source
        caption = im.caption or " ".join(f"{label}: {cap}" for label, cap, _ in named.get(ref, ()))
        v = b.node(NodeKind.IMAGE, ref, "", caption, source=source, bbox=FULL_BOX, prov=() if s is None else (s,))
        for label, cap, cs in named.get(ref, ()):  # the image is what its caption's "Figure N" names
            e = b.entity(label, "table" if label.startswith("Table") else "figure", cap, cs)
            b.mention(seg_nodes[cs], e)
            b.edge(v, e, EdgeKind.DEPICTS, 1.0, ("caption",), (f"{label}: {cap}",), (cs,), merge_key=("dep", v, e))
        if isinstance(im.pixels, SpooledImage):
            graph_pixels[ref] = SpooledPixels(im.pixels)  # not a path: dropped with decoded images
        elif im.pixels is not None:
            graph_pixels[ref] = Path(im.pixels) if isinstance(im.pixels, os.PathLike) else im.pixels
        if s is None:
            b.note(f"image {ref!r}", _issue("image not in any section", ref, "attached to the document", "warning"))
        b.edge(0 if s is None else seg_nodes[s], v, EdgeKind.CONTAINS)
        image_level = _add_image_regions(b, v, im, s, min_mapping_score)
        if not image_level and image_fallback != "off" and ref not in named:  # a caption link is image-level
            _attach_unmatched_image(b, v, im, s, None if s is None else seg_nodes[s], image_fallback,
                                    image_entity_scores)

    if strict and any(i.severity == "error" for i in b.issues):
        raise DocumentBuildError(doc.doc_id, b.issues)
    graph = b.finish()
    graph.pixels = graph_pixels
    return graph


IMAGE_FALLBACKS = ("degree", "similarity", "off")


def _attach_unmatched_image(b: _Builder, image: int, im: ImageInput, s: int | None, segment_node: int | None,
                            rule: str, scores_fn) -> None:
    """The image-level fallback of :func:`build_document_graph` (see `image_fallback` there).

    Scope: mKG-RAG runs it per text chunk, over that chunk's entities and relations; ours is the
    image's segment (its entities: those the segment mentions; its relations: those extracted
    from it), and the whole document for an image in no segment."""
    if segment_node is None:
        entities = [v for v, k in enumerate(b.kind) if k == NodeKind.ENTITY]
        mentions = {v: int(b.weight[v]) for v in entities}
    else:
        mentions = {v: c for (seg, v), c in b.mentions.items() if seg == segment_node}
        entities = sorted(mentions)
    if not entities:
        b.note(f"image {im.ref!r}", _issue("no entity", im.ref, "no entity in the image's segment (or document) to "
                                           "attach the unmatched image to", "skip"))
        return
    target, how = None, ""
    if rule == "degree":
        degree = Counter()
        for e, kind in enumerate(b.ekind):
            if kind == EdgeKind.RELATION and (s is None or s in b.eprov[e]):
                degree[b.src[e]] += 1
                degree[b.dst[e]] += 1
        if degree:
            top = max(degree.values())
            target, how = min(v for v, d in degree.items() if d == top), "highest relation degree"
    if target is None and scores_fn is not None:
        descriptions = ["\n".join(b.entity_descriptions[v]) or b.name[v] for v in entities]
        try:
            scores = np.asarray(scores_fn(im.pixels, descriptions), np.float64).reshape(-1)
        except Exception as exc:  # a failing model must not fail the document
            b.note(f"image {im.ref!r}", _issue("similarity failed", im.ref, f"image_entity_scores raised {exc!r}",
                                               "warning"))
            scores = None
        if scores is not None and scores.size == len(entities) and np.isfinite(scores).all():
            target, how = entities[int(np.argmax(scores))], "most similar entity"
        elif scores is not None:
            b.note(f"image {im.ref!r}", _issue("bad similarity", im.ref, f"expected {len(entities)} finite scores, "
                                               f"got {scores.size}", "warning"))
    if target is None:
        top = max(mentions.values())
        target, how = min(v for v, c in mentions.items() if c == top), "most mentioned entity"
    b.edge(image, target, EdgeKind.DEPICTS, 1.0, ("fallback",), (f"unmatched image attached to the {how}",),
           merge_key=("dep", image, target))


def _add_image_regions(b: _Builder, image: int, im: ImageInput, s: int | None, min_score: float) -> bool:
    """Adds the image's scene-graph regions and region matches; True when some image-level match
    attached the whole image to an entity (mKG-RAG's test for its fallback)."""
    image_level = False
    prov = () if s is None else (s,)
    objects, scene_relations, region_of = {}, {}, {}
    if im.scene_graph is not None:
        where = f"image {im.ref!r} scene graph"
        sg = _as_parsed(im.scene_graph, f"doc.images[{im.ref!r}].scene_graph", lambda t, _: parse_scene_graph(t), False)
        for issue in sg.issues:
            b.note(where, issue)
        for obj in sg.objects:
            objects[obj.index] = obj
            region_of[obj.index] = b.node(NodeKind.REGION, f"object-{obj.index}", obj.category, obj.category,
                                          bbox=obj.bbox, prov=prov, image=image)
            b.edge(image, region_of[obj.index], EdgeKind.CONTAINS)
        for rel in sg.scene_relations:
            scene_relations[rel.index] = rel
            b.edge(region_of[rel.subject], region_of[rel.object], EdgeKind.SCENE, 1.0, (rel.predicate,),
                   (f"{objects[rel.subject].category} {rel.predicate} {objects[rel.object].category}",), prov)
    if im.mappings is None:
        return image_level
    where = f"image {im.ref!r} mappings"
    mp = _as_parsed(im.mappings, f"doc.images[{im.ref!r}].mappings", lambda t, _: parse_region_mappings(t), False)
    for issue in mp.issues:
        b.note(where, issue)
    relation_regions: dict[int, int] = {}
    for m in mp.mappings:
        raw = f"{m.kind} {m.ref} -> {m.entity or (m.source, m.target)}"
        if m.score < min_score:
            b.note(where, _issue("low score", raw, f"score {m.score} < min_mapping_score {min_score}", "skip"))
            continue
        names = [m.entity] if m.entity is not None else [m.source, m.target]
        ents = [b.entity_of.get(normalize_name(n)) for n in names]
        if None in ents:
            missing = names[ents.index(None)]
            b.note(where, _issue("unknown entity", raw, f"no entity {missing!r} in this document"))
            continue
        if len(ents) == 2 and b.edge_index.get(("rel", min(ents), max(ents))) is None:
            # mKG-RAG (rag/multimodal/build.py): a relation match whose entity pair has no text
            # relation attaches each endpoint to its own object (or to the whole image) with
            # weight max(score // 2, 1).
            half = max(m.score // 2, 1.0)
            if m.kind == "image":
                image_level = True
                for e in ents:
                    b.edge(image, e, EdgeKind.DEPICTS, half, merge_key=("dep", image, e))
                continue
            rel = scene_relations.get(m.ref)
            if rel is None:
                b.note(where, _issue("unknown relation", raw, f"no relation {m.ref} in the image's scene graph"))
                continue
            b.note(where, _issue("no such relation", raw, "the document has no relation between these entities; "
                                 "each object depicts its own entity at half weight", "warning"))
            for obj, e in ((rel.subject, ents[0]), (rel.object, ents[1])):
                b.edge(region_of[obj], e, EdgeKind.DEPICTS, half, merge_key=("dep", region_of[obj], e))
            continue
        if m.kind == "image":
            image_level = True
            for e in ents:
                b.edge(image, e, EdgeKind.DEPICTS, m.score, merge_key=("dep", image, e))
        elif m.kind == "object":
            if m.ref not in region_of:
                b.note(where, _issue("unknown object", raw, f"no object {m.ref} in the image's scene graph"))
                continue
            b.edge(region_of[m.ref], ents[0], EdgeKind.DEPICTS, m.score, merge_key=("dep", region_of[m.ref], ents[0]))
        else:
            rel = scene_relations.get(m.ref)
            if rel is None:
                b.note(where, _issue("unknown relation", raw, f"no relation {m.ref} in the image's scene graph"))
                continue
            r = relation_regions.get(m.ref)
            if r is None:
                a, c = objects[rel.subject].bbox, objects[rel.object].bbox
                union = (min(a[0], c[0]), min(a[1], c[1]), max(a[2], c[2]), max(a[3], c[3]))
                r = b.node(NodeKind.REGION, f"relation-{m.ref}", rel.predicate,
                           f"{objects[rel.subject].category} {rel.predicate} {objects[rel.object].category}",
                           bbox=union, prov=prov, image=image)
                relation_regions[m.ref] = r
                b.edge(image, r, EdgeKind.CONTAINS)
            for e in ents:
                b.edge(r, e, EdgeKind.DEPICTS_RELATION, m.score, merge_key=("deprel", r, e))
            edge = b.edge_index[("rel", min(ents), max(ents))]
            if b.node_edge[r] == -1:
                b.node_edge[r] = edge
    return image_level


__all__ = ["IMAGE_FALLBACKS", "DocumentBuildError", "DocumentGraph", "DocumentInput", "DocumentIssue", "ImageInput",
           "ImageSpool", "SpooledImage", "SpooledPixels", "TableInput", "build_document_graph", "ExtractionFormatError"]
