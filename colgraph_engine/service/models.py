"""Request and response bodies of the HTTP service (pydantic models; the OpenAPI schema comes from them).

Config overrides (``ConfigOverrides``) are generated from :class:`~colgraph_engine.pipeline.PipelineConfig`'s
fields, so every pipeline setting can be overridden per request, with strict types, the option
lists as enums, and the service's own caps on the sizes (``SERVICE_CAPS``, ours: they bound the
work one request can ask for; the pipeline's own limits are far higher). ``only_context`` is not
an override: the request's ``answer`` flag sets it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, create_model

from ..pipeline import config as _cfg
from ..pipeline.config import MAX_QUESTION_CHARS, PipelineConfig

# Per-request caps on the work a request may ask for (ours).
SERVICE_CAPS: dict[str, tuple[int, int]] = {
    "kd": (1, 100), "kg": (1, 100), "k": (1, 100), "chunks_k": (1, 100), "evidence_k": (1, 100),
    "rrf_k": (0, 1_000_000), "min_keep": (0, 100), "expansion_budget": (1, 100_000), "gstar_rounds": (0, 16),
    "gstar_budget": (1, 10_000), "budget_entities": (0, 100_000), "budget_relations": (0, 100_000),
    "budget_sources": (0, 100_000), "budget_images": (0, 100_000), "hops": (0, 3),
}
_CHOICES = {"recall_side": _cfg.RECALL_SIDES, "recall_ranker": _cfg.RECALL_RANKERS, "fusion": _cfg.FUSIONS,
            "retrieval": _cfg.RETRIEVALS, "filter": _cfg.FILTERS, "visual_ranker": _cfg.VISUAL_RANKERS,
            "visual_units": _cfg.VISUAL_UNITS, "context_mode": _cfg.CONTEXT_MODES}
_CHOICES["prefilter_mode"] = _cfg.PREFILTER_MODES
_CHOICES["prefilter_budget"] = _cfg.PREFILTER_BUDGETS
NOT_OVERRIDABLE = ("only_context",)
# Caps of the web page's routes (ours): nodes and edges one answer may describe, documents and
# nodes per page. 300 nodes keep the page's force layout (O(n^2) per step) well under a second.
VIEW_CAPS: dict[str, tuple[int, int, int]] = {  # name: (low, high, default)
    "graph_limit": (1, 1000, 300), "graph_hops": (0, 3, 2), "graph_edges": (1, 5000, 1500),
    "documents_limit": (1, 1000, 200), "nodes_limit": (1, 500, 100), "thumbnail_size": (16, 1024, 320),
}


def _override_field(f: dataclasses.Field):
    name = f.name
    if name in _CHOICES:
        return Optional[Literal[_CHOICES[name]]], Field(None)
    if name in SERVICE_CAPS:
        lo, hi = SERVICE_CAPS[name]
        return Optional[StrictInt], Field(None, ge=lo, le=hi)
    kind = str(f.type)
    if kind == "bool":
        return Optional[StrictBool], Field(None)
    if kind in ("float", "float | None"):
        bounds = {"threshold": (-1.0, 1.0), "text_weight": (0.0, 1.0)}.get(name, (None, None))
        return Optional[StrictFloat], Field(None, ge=bounds[0], le=bounds[1], allow_inf_nan=False)
    if kind == "int":
        return Optional[StrictInt], Field(None)
    if kind == "str":
        return Optional[StrictStr], Field(None)
    # a setting of a type not listed here: any JSON value, checked by PipelineConfig itself
    return Optional[Any], Field(None)


ConfigOverrides = create_model(
    "ConfigOverrides",
    __config__=ConfigDict(extra="forbid"),
    __doc__="Pipeline settings to change for this request (see PipelineConfig); unset ones keep the service's.",
    **{f.name: _override_field(f) for f in dataclasses.fields(PipelineConfig) if f.name not in NOT_OVERRIDABLE},
)


class QueryRequest(BaseModel):
    """One question. ``image_base64``: an optional query image (PNG, JPEG, ... as base64, optionally a
    ``data:image/...;base64,`` URL). ``answer``: also call the service's generator (refused with 422
    when the service has none)."""
    model_config = ConfigDict(extra="forbid")
    question: StrictStr = Field(min_length=1, max_length=MAX_QUESTION_CHARS)
    caption: StrictStr = Field("", max_length=MAX_QUESTION_CHARS)
    image_base64: Optional[StrictStr] = None
    config: Optional[ConfigOverrides] = None  # type: ignore[valid-type]
    answer: StrictBool = False
    view: StrictBool = Field(False, description="also describe the subgraph for drawing (at most 300 nodes, the "
                                                "edges among them) and the pages of the cited segments: ``view``")


class BatchQueryRequest(BaseModel):
    """Several questions; each joins the dynamic batcher on its own (so they may share batches
    with other clients' queries) and is answered in order."""
    model_config = ConfigDict(extra="forbid")
    queries: list[QueryRequest] = Field(min_length=1)


class DocumentHit(BaseModel):
    doc_id: str
    score: float


class ImageHitModel(BaseModel):
    """A ranked image or region with its citation: ``doc_id``, ``pages`` (the PDF pages it is on;
    empty for an image file), ``box`` (normalised x0, y0, x1, y1 on the page; in the image when
    it is on no page) and ``cite``, the label (``[report.pdf p.2 box (0.10, 0.20, 0.55, 0.60)]``).
    ``bbox`` is the box in the image. Evidence entities, relations, sources and records carry
    ``doc_id``, ``pages`` and ``box`` likewise (``box`` null for text)."""
    node: int
    kind: str
    doc_id: str
    image: Optional[str]
    name: str
    bbox: Optional[list[float]]
    score: float
    text: str
    pages: list[int] = Field(default_factory=list)
    box: Optional[list[float]] = None
    cite: str = ""


class BatchInfo(BaseModel):
    """How the query was run: ``size`` queries in its ``retrieve_batch`` call, milliseconds waited
    in the queue and milliseconds the call took (``timings`` are that call's, for all its queries)."""
    size: int
    queue_ms: float
    run_ms: float


class QueryResponse(BaseModel):
    """The pipeline's result (``Result.as_dict()``) plus ``batch``. ``timings``: seconds per stage
    of the whole batch the query ran in; ``counts``: this query's candidates per stage."""
    question: str
    caption: str
    has_image: bool
    documents: list[DocumentHit]
    recall_sides: list[str]
    seed_entities: list[str]
    seed_relations: list[list[str]]
    subgraph: dict[str, list[int]]
    visual_phrases: list[str]
    visual_text: str
    visual_used_question: bool
    image_units: str
    images: list[ImageHitModel]
    evidence: dict[str, Any]
    context: str
    answer: Optional[dict[str, Optional[str]]]
    timings: dict[str, float]
    counts: dict[str, dict[str, Any]]
    notes: list[str]
    batch: BatchInfo
    view: Optional[dict[str, Any]] = Field(None, description="only when asked for (``view: true``): ``nodes`` (id as "
                                           "in subgraph.nodes, doc_id, local, kind, name, type, text, hop, role: seed / "
                                           "expanded / visual / context, visual_rank), ``edges`` (src, dst, kind, label), "
                                           "``truncated``, ``pages`` {doc_id: {segment: [page, ...]}}")


class BatchItem(BaseModel):
    """One query of a batch request: ``status`` 200 with ``result``, or an error code with ``error``."""
    status: int
    result: Optional[QueryResponse] = None
    error: Optional[str] = None


class BatchQueryResponse(BaseModel):
    results: list[BatchItem]


class DocumentReportModel(BaseModel):
    file: str
    doc_id: str
    kind: str
    status: Literal["added", "present", "failed", "skipped", "pending"]
    failures: list[str]
    entities: int
    relations: int
    images: int
    segments: int


class DocumentsResponse(BaseModel):
    """What ``POST /documents`` did per file, and the index generation now served."""
    documents: list[DocumentReportModel]
    added: int
    generation: int
    total_documents: int


class RemovedResponse(BaseModel):
    removed: str
    generation: int
    total_documents: int


class HealthResponse(BaseModel):
    status: Literal["ok", "draining"]
    generation: int
    documents: int


class DocumentRow(BaseModel):
    doc_id: str
    title: str
    counts: dict[str, int]


class DocumentListResponse(BaseModel):
    """One page of the index's documents (insertion order)."""
    documents: list[DocumentRow]
    total: int
    offset: int
    limit: int
    generation: int


class GraphNode(BaseModel):
    id: int
    kind: str
    name: str
    type: str
    degree: int
    text: Optional[str] = None
    hop: Optional[int] = None
    hidden: Optional[int] = None
    bbox: Optional[list[float]] = None
    image: Optional[str] = None


class GraphEdge(BaseModel):
    id: int
    src: int
    dst: int
    kind: str
    label: str
    text: str


class DocumentGraphResponse(BaseModel):
    """A bounded neighbourhood of one node of a document's graph (local node ids): breadth first
    from ``center`` within ``hops``, at most ``limit`` nodes; ``truncated`` when more lie beyond.
    ``hidden``: a node's incident edges that are not drawn."""
    doc_id: str
    title: str
    counts: dict[str, int]
    center: int
    hops: int
    limit: int
    truncated: bool
    nodes: list[GraphNode]
    edges: list[GraphEdge]
    generation: int


class NodeListResponse(BaseModel):
    doc_id: str
    total: int
    offset: int
    limit: int
    nodes: list[GraphNode]
    generation: int


class ErrorResponse(BaseModel):
    detail: Any


__all__ = ["BatchInfo", "BatchItem", "BatchQueryRequest", "BatchQueryResponse", "ConfigOverrides", "DocumentGraphResponse",
           "DocumentHit", "DocumentListResponse", "DocumentReportModel", "DocumentRow", "DocumentsResponse",
           "ErrorResponse", "GraphEdge", "GraphNode", "HealthResponse", "ImageHitModel", "NodeListResponse",
           "QueryRequest", "QueryResponse", "RemovedResponse", "SERVICE_CAPS", "VIEW_CAPS"]
