"""The HTTP service: FastAPI routes over the dynamic batcher and the index writer.

    POST   /query              one question (JSON; image as base64)              -> QueryResponse
    POST   /query/form         one question (multipart: fields + image file)     -> QueryResponse
    POST   /query/batch        several questions (JSON)                          -> BatchQueryResponse
    GET    /documents          the documents with their counts, paged            -> DocumentListResponse
    POST   /documents          upload files (multipart ``files``), ingested      -> DocumentsResponse
    DELETE /documents/{doc_id} remove a document                                 -> RemovedResponse
    GET    /documents/{doc_id}/graph   a bounded neighbourhood of one node       -> DocumentGraphResponse
    GET    /documents/{doc_id}/nodes   the document's nodes, filtered and paged  -> NodeListResponse
    GET    /documents/{doc_id}/image   an image as a JPEG thumbnail (?ref=&size=)
    GET    /  and  /ui/documents       the web page (static files under /static/; see static/)
    GET    /health             liveness, generation, documents (never needs the token)
    GET    /info               index counts, encoders (and their load seconds), device, backends, defaults, limits
    GET    /metrics            Prometheus text format (see metrics.py)

Status codes: 200; 401 missing or wrong bearer token (when one is set); 404 unknown document or
route; 405 wrong method; 409 another process holds the index's writer lock, or the index is
read-only; 413 body over its limit; 422 every invalid input (schema, config value, question,
image, file name, asking for an answer without a generator, uploads none of which could be
added, images of one request over ``max_request_pixels`` in all), with a message naming the
field; 429 queue (or writer queue) full, with Retry-After; 503 shutting down, with Retry-After;
507 the disk (or quota) is full while writing an upload or a removal, the index unchanged
(``{"detail": ...}`` names what was being written, relative to the index's parent folder, and the
space free); 500 an unexpected failure of that query only. No answer names an absolute server
path (``/info`` gives the index folder's name).

The web page (``/``, ``/ui/documents``, ``/static/...``) is plain HTML, CSS and JavaScript
shipped in the package; it holds nothing of the index, so it is served without the token, and
reads everything through the JSON routes above with the token the user gives it. A query with
``"view": true`` also gets the subgraph described for drawing (see :mod:`.views`).

CORS is off unless origins are given. Writes go through :class:`~.writer.IndexWriter`; queries
through :class:`~.batcher.DynamicBatcher` over :class:`~.state.IndexState`'s current snapshot.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import io
import json
import logging
import math
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

try:
    import orjson
except ImportError:  # optional: the standard library's json gives the same output, slower
    orjson = None
from fastapi import FastAPI, File, Form, HTTPException, Query as Param, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import ValidationError

from ..encoders.sets import public_description
from ..kg import Encoders, IndexConflictError, KnowledgeIndex
from ..pipeline import PipelineConfig, Query
from . import views
from .batcher import Answered, DynamicBatcher, QueueFull, ShuttingDown
from .guards import BearerToken, BodyLimit, RequestMetrics
from .metrics import CONTENT_TYPE, ServiceMetrics
from .models import (_CHOICES, SERVICE_CAPS, VIEW_CAPS, BatchQueryRequest, BatchQueryResponse, ConfigOverrides,
                     DocumentGraphResponse, DocumentListResponse, DocumentsResponse, ErrorResponse, HealthResponse,
                     NodeListResponse, QueryRequest, QueryResponse, RemovedResponse)
from .state import IndexState
from .writer import DiskFull, IndexWriter, ReadOnly, WriterBusy

MiB = 1 << 20
log = logging.getLogger("colgraph_engine")
STATIC = Path(__file__).resolve().parent / "static"  # the web page: shipped in the package, no build step
PAGE_PATHS = ("/", "/ui/documents")  # each serves static/index.html, which picks its view from the path
# the page runs only its own files: no inline script, nothing from elsewhere, never framed
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache",
}


def _cap(name: str, **kw):
    lo, hi, default = VIEW_CAPS[name]
    return Param(default, ge=lo, le=hi, **kw)


@dataclass(frozen=True)
class ServiceConfig:
    """Settings of one service (every default is ours).

    Batching: ``max_batch`` queries per ``retrieve_batch`` (1: no batching), ``max_wait_ms`` the
    longest the oldest queued query waits for company, ``queue_size`` queries waiting before 429.
    ``max_wait_ms`` defaults to 0 (ours): a batch is what queued while the previous one ran, and
    a lone client never waits. In the load test here (benchmarks/service_load.py, 2026-11-30
    20:20 UTC, lean client) that answered 3.27x the unbatched rate at 32 clients and 1.63x at 4,
    against 3.42x and 2.01x with a 5 ms window, which cost a lone client its 5 ms (p50 38.4
    against 32.5 ms); steady concurrent loads may want a window.
    Limits: ``max_query_bytes`` per query request body (base64 images included),
    ``max_upload_bytes`` per ``POST /documents`` body, ``max_batch_queries`` questions per batch
    request, ``max_upload_files`` files per upload, ``max_image_pixels`` per query image,
    ``max_request_pixels`` over all the images of one request (50M, ours: two images at the
    per-image cap; checked from the image headers before any pixel is decoded. Blank PNGs of
    24 KB decode to 25M pixels each, so the body limit alone let one batch request hold 64 of
    them; serving a query image costs far more than its 3 bytes per pixel (decoding, the
    pipeline's copy, the encoder's float32 tensors): 2 such images, 50M pixels, grew the
    server's peak RSS by 1.16 GB with the offline encoders, 8 by 2.23 GB, in
    benchmarks/reliability_service.py), ``max_pending_writes`` index changes waiting.
    ``retry_after_s``: the Retry-After of a 429/503.
    ``token``: bearer token required by every route but ``/health`` (None: open).
    ``reload_interval_s``: how often the index directory is checked for commits made by other
    processes (one ``stat`` of the manifest), which are then served; 0 turns it off.
    ``cors_origins``: allowed origins (empty: no CORS headers at all).
    ``media_roots``: folders where documents' own files are looked for by document id (the
    folder given to ``colgraph index add``), so the web page can show PDF pages and their images
    as thumbnails; uploaded documents are found in their upload folders without it.
    """
    max_batch: int = 32
    max_wait_ms: float = 0.0
    queue_size: int = 256
    max_query_bytes: int = 16 * MiB
    max_upload_bytes: int = 64 * MiB
    max_batch_queries: int = 64
    max_upload_files: int = 64
    max_image_pixels: int = 25_000_000
    max_request_pixels: int = 50_000_000
    max_pending_writes: int = 8
    retry_after_s: int = 1
    reload_interval_s: float = 2.0
    token: str | None = None
    cors_origins: tuple[str, ...] = ()
    media_roots: tuple[str, ...] = ()

    def __post_init__(self):
        for name in ("max_batch", "queue_size", "max_query_bytes", "max_upload_bytes", "max_batch_queries",
                     "max_upload_files", "max_image_pixels", "max_request_pixels", "max_pending_writes",
                     "retry_after_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
        if isinstance(self.max_wait_ms, bool) or not isinstance(self.max_wait_ms, (int, float)) \
                or not 0 <= self.max_wait_ms <= 10_000:
            raise ValueError(f"max_wait_ms: expected milliseconds in [0, 10000], got {self.max_wait_ms!r}")
        if isinstance(self.reload_interval_s, bool) or not isinstance(self.reload_interval_s, (int, float)) \
                or not 0 <= self.reload_interval_s <= 86_400:
            raise ValueError(f"reload_interval_s: expected seconds in [0, 86400], got {self.reload_interval_s!r}")
        if self.token is not None and (not isinstance(self.token, str) or not self.token.strip()):
            raise ValueError("token: expected None or a non-empty string")
        if not isinstance(self.cors_origins, tuple) or not all(isinstance(o, str) and o for o in self.cors_origins):
            raise TypeError(f"cors_origins: expected a tuple of origin strings, got {self.cors_origins!r}")
        if not isinstance(self.media_roots, tuple) or not all(isinstance(r, str) and r for r in self.media_roots):
            raise TypeError(f"media_roots: expected a tuple of folder paths, got {self.media_roots!r}")


# -- helpers --------------------------------------------------------------------------------

def _plain(x):
    """JSON-ready value: numpy scalars and arrays as Python, non-finite floats as null."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return _plain(x.tolist())
    if isinstance(x, np.generic):
        return _plain(x.item())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    return str(x)


def json_bytes(obj) -> bytes:
    """`obj` as compact JSON: numpy values as Python, tuples as lists, NaN and infinities as null,
    anything else by ``str``. orjson when installed (a 42 kB result: about 0.1 ms against 0.85 ms
    for ``json`` on this project's machine), else the standard library; both give the same JSON."""
    if orjson is not None:
        try:
            return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY, default=_orjson_default)
        except TypeError:  # a type orjson refuses even through default (e.g. a non-str dict key)
            pass
    try:  # the common case: already plain and finite
        return json.dumps(obj, allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError):
        return json.dumps(_plain(obj), allow_nan=False, separators=(",", ":")).encode()


def _orjson_default(x):
    if isinstance(x, np.generic):
        return _plain(x.item())
    if isinstance(x, np.ndarray):  # one orjson does not take natively (dtype or layout)
        return _plain(x.tolist())
    return str(x)


def result_bytes(result) -> bytes:
    """``Result.as_dict()`` as JSON, without its closing brace (the batch's figures follow)."""
    data = json_bytes(result.as_dict())
    if not data.endswith(b"}"):  # as_dict always gives an object; anything else is a bug here
        raise RuntimeError("a result did not serialise to a JSON object")
    return data[:-1]


def answer_bytes(a: Answered) -> bytes:
    """The result's JSON with ``"batch": {size, queue_ms, run_ms}`` added (spliced into the bytes
    the worker thread made, so the event loop does no serialising)."""
    batch = json_bytes({"size": a.batch_size, "queue_ms": round(a.queue_s * 1e3, 3), "run_ms": round(a.run_s * 1e3, 3)})
    body = a.payload if a.payload is not None else result_bytes(a.result)
    return body + b',"batch":' + batch + b"}"


class PixelBudget:
    """The pixels the images of one request may hold in all (``max_request_pixels``), counted
    from their headers as they are opened, so a request over it is refused before any decoding."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0

    def take(self, w: int, h: int, what: str) -> None:
        self.used += w * h
        if self.used > self.limit:
            raise HTTPException(422, f"{what}: the request's images hold {self.used} pixels with this one ({w}x{h}); "
                                     f"expected at most {self.limit} in all (max_request_pixels)")


def open_image(data: bytes, what: str, max_pixels: int, budget: PixelBudget | None = None):
    """The PIL image of encoded bytes with only its header read (``Image.open`` decodes no
    pixels): size checked against `max_pixels` and taken from `budget` (422 naming `what`)."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise HTTPException(422, f"{what}: the image is empty")
    try:
        im = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise HTTPException(422, f"{what}: cannot read the image ({exc})") from None
    w, h = im.size
    try:
        if w * h > max_pixels:
            raise HTTPException(422, f"{what}: expected at most {max_pixels} pixels, got {w}x{h}")
        if budget is not None:
            budget.take(w, h, what)
    except HTTPException:
        im.close()
        raise
    return im


def image_pixels(im, what: str) -> np.ndarray:
    """``[H, W, 3]`` uint8 pixels of an image from :func:`open_image` (decoded now, then closed)."""
    from PIL import Image

    try:
        with im:
            return np.asarray(im.convert("RGB"), dtype=np.uint8)
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise HTTPException(422, f"{what}: cannot read the image ({exc})") from None


def decode_image(data: bytes, what: str, max_pixels: int, budget: PixelBudget | None = None) -> np.ndarray:
    """``[H, W, 3]`` uint8 pixels of an encoded image (422 naming `what` when it cannot be read)."""
    return image_pixels(open_image(data, what, max_pixels, budget), what)


def base64_bytes(text: str, what: str) -> bytes:
    if text.startswith("data:"):
        head, sep, text = text.partition(",")
        if not sep or not head.endswith(";base64"):
            raise HTTPException(422, f"{what}: expected a base64 data URL (data:image/...;base64,...)")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise HTTPException(422, f"{what}: not valid base64") from None


def decode_base64_image(text: str, what: str, max_pixels: int, budget: PixelBudget | None = None) -> np.ndarray:
    return decode_image(base64_bytes(text, what), what, max_pixels, budget)


def _validation_message(exc: ValidationError | RequestValidationError, prefix: str = "") -> list[dict]:
    out = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in (prefix, *e.get("loc", ())) if p != "")
        out.append({"loc": loc, "msg": e.get("msg", ""), "type": e.get("type", "")})
    return out


# -- the application -----------------------------------------------------------------------

def create_app(index: KnowledgeIndex, encoders: Encoders | None = None, *, pipeline_config: PipelineConfig | None = None,
               service: ServiceConfig | None = None, generator=None, ingest_options: dict | None = None,
               device: str = "cpu", encoder_load_s: dict[str, float] | None = None) -> FastAPI:
    """The service for `index` (see the module docstring).

    Args:
        index: the index to serve, opened from its directory (writes go there); an in-memory
            index is served read-only.
        encoders: the index's encoders (None: the index's own).
        pipeline_config: the config of queries without overrides (None: the pipeline's defaults).
        service: batching, limits, token and CORS (:class:`ServiceConfig`).
        generator: the pipeline generator for requests with ``answer: true`` (None: refused).
        ingest_options: keyword options of :func:`~colgraph_engine.ingest.folder.ingest` for
            uploads (``extractor``, ``vision``, ``caption``, ``reader_options``, ``batch_size``, ...).
        device: where queries are scored (``"cpu"`` or ``"cuda"``).
        encoder_load_s: seconds each model of the encoders took to load (``{model: s}``, as
            ``colgraph_engine.encoders.sets.load`` measures them), shown by ``/info``.
    """
    service = ServiceConfig() if service is None else service
    if not isinstance(service, ServiceConfig):
        raise TypeError(f"service: expected a ServiceConfig, got {type(service).__name__}")
    state = IndexState(index, encoders, pipeline_config, generator, device=device)
    load_s = dict(encoder_load_s or {})
    metrics = ServiceMetrics()
    batcher = DynamicBatcher(state.run_batch, max_batch=service.max_batch, max_wait_s=service.max_wait_ms / 1e3,
                             queue_size=service.queue_size, metrics=metrics, finish=result_bytes)
    writer = IndexWriter(state, max_pending=service.max_pending_writes, metrics=metrics,
                         ingest_options=ingest_options)

    async def watch_directory():
        while True:
            await asyncio.sleep(service.reload_interval_s)
            try:
                if await writer.reload_if_changed():
                    _publish_index_metrics(metrics, state)
            except Exception as exc:  # a damaged commit of another process: keep serving, say so
                log.warning("colgraph serve: cannot open the index's new generation (%s); still serving %d",
                            exc, state.snapshot.generation)

    @asynccontextmanager
    async def lifespan(app):
        await batcher.start()
        await writer.start()  # sweeps orphan upload folders before the first change
        watcher = asyncio.get_running_loop().create_task(watch_directory()) \
            if service.reload_interval_s > 0 and state.writable else None
        try:
            yield
        finally:
            if watcher is not None:
                watcher.cancel()
            await batcher.close()  # every queued query is answered first
            writer.close()

    app = FastAPI(title="colgraph_engine", version="1",
                  description="Multimodal GraphRAG retrieval: mKG-RAG dual-stage retrieval with late-interaction "
                              "visual ranking, served with dynamic batching.", lifespan=lifespan)
    app.state.colgraph = state
    app.state.batcher = batcher
    app.state.writer = writer
    app.state.metrics = metrics
    app.state.service = service
    _publish_index_metrics(metrics, state)

    retry = {"Retry-After": str(service.retry_after_s)}
    errors = {c: {"model": ErrorResponse} for c in (401, 413, 422, 429, 503)}

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return JSONResponse({"detail": _validation_message(exc)}, status_code=422)

    @app.exception_handler(DiskFull)
    async def _disk_full(request: Request, exc: DiskFull):
        # 507 Insufficient Storage: the server could not store what the request needs stored
        return JSONResponse({"detail": str(exc)}, status_code=507)

    def config_for(overrides, answer: bool, what: str) -> PipelineConfig:
        changes = {} if overrides is None else overrides.model_dump(exclude_none=True)
        if answer and state.generator is None:
            raise HTTPException(422, f"{what}answer: this service has no generator; ask without answer")
        try:
            return state.default.replace(**changes, only_context=not answer)
        except (TypeError, ValueError) as exc:
            raise HTTPException(422, f"{what}config: {exc}") from None

    def make_query(question: str, caption: str, image, what: str) -> Query:
        try:
            return Query(question, image=image, caption=caption)
        except (TypeError, ValueError) as exc:
            raise HTTPException(422, f"{what}{exc}") from None

    def open_request_images(reqs, whats: list[str]) -> list:
        """Every query image of one request opened (headers only) against the request's pixel
        budget: a request over it is refused before any image is decoded."""
        budget = PixelBudget(service.max_request_pixels)
        opened = []
        try:
            for req, what in zip(reqs, whats):
                opened.append(None if req.image_base64 is None else open_image(
                    base64_bytes(req.image_base64, f"{what}image_base64"), f"{what}image_base64",
                    service.max_image_pixels, budget))
        except BaseException:
            for im in opened:
                if im is not None:
                    im.close()
            raise
        return opened

    def prepare(req: QueryRequest, im, what: str = "") -> tuple[Query, PipelineConfig]:
        image = None if im is None else image_pixels(im, f"{what}image_base64")
        return make_query(req.question, req.caption, image, what), config_for(req.config, req.answer, what)

    def prepare_all(reqs, whats: list[str]) -> list[tuple[Query, PipelineConfig]]:
        opened = open_request_images(reqs, whats)
        try:
            return [prepare(r, im, what) for r, im, what in zip(reqs, opened, whats)]
        finally:
            for im in opened:  # those not decoded (a query before them was refused)
                if im is not None:
                    im.close()

    def refuse(exc: Exception):
        if isinstance(exc, QueueFull):
            metrics.rejected.inc(reason="queue_full")
            raise HTTPException(429, f"too many queries waiting: {exc}; retry later", headers=retry)
        if isinstance(exc, ShuttingDown):
            metrics.rejected.inc(reason="shutting_down")
            raise HTTPException(503, f"{exc}", headers=retry)
        raise exc

    def failure(exc: BaseException) -> tuple[int, str]:
        if isinstance(exc, (TypeError, ValueError)):
            return 422, str(exc)
        return 500, f"{type(exc).__name__}: {exc}"

    async def viewed(answered: Answered) -> bytes:
        """The answer's bytes with ``"view"`` added (described in a worker thread, on the snapshot
        the query ran on); a description that fails leaves ``"view": null`` and a log line."""
        body = answer_bytes(answered)
        snap = getattr(answered.result, "served_by", None) or state.snapshot
        try:
            described = await run_in_threadpool(views.describe_view, snap, answered.result,
                                                VIEW_CAPS["graph_limit"][2], VIEW_CAPS["graph_edges"][2])
        except Exception as exc:
            log.warning("colgraph serve: cannot describe a query's subgraph (%s: %s)", type(exc).__name__, exc)
            described = None
        return body[:-1] + b',"view":' + json_bytes(described) + b"}"

    async def answer_one(q, cfg, view: bool = False) -> Response:
        """One query through the batcher: 429/503 when refused, its own failure as 422/500."""
        try:
            fut = batcher.enqueue([(q, cfg)])[0]
        except (QueueFull, ShuttingDown) as exc:
            refuse(exc)
        try:
            answered = await fut
        except Exception as exc:
            code, msg = failure(exc)
            raise HTTPException(code, msg) from None
        body = await viewed(answered) if view else answer_bytes(answered)
        return Response(body, media_type="application/json")

    # -- queries ----------------------------------------------------------------------------
    @app.post("/query", response_model=QueryResponse, responses=errors, tags=["query"])
    async def query(req: QueryRequest):
        """Runs one question through the pipeline (batched with concurrent requests)."""
        [(q, cfg)] = prepare_all([req], [""])
        return await answer_one(q, cfg, req.view)

    @app.post("/query/form", response_model=QueryResponse, responses=errors, tags=["query"])
    async def query_form(question: str = Form(..., max_length=8192), caption: str = Form("", max_length=8192),
                         config: str | None = Form(None, description="ConfigOverrides as JSON text"),
                         answer: bool = Form(False), view: bool = Form(False),
                         image: UploadFile | None = File(None)):
        """The same as ``POST /query`` with the image as a multipart file."""
        overrides = None
        if config:
            try:
                overrides = ConfigOverrides.model_validate_json(config)
            except ValidationError as exc:
                raise HTTPException(422, _validation_message(exc, "config")) from None
        pixels = None
        if image is not None:
            pixels = decode_image(await image.read(), "image", service.max_image_pixels,
                                  PixelBudget(service.max_request_pixels))
        q = make_query(question, caption, pixels, "")
        cfg = config_for(overrides, answer, "")
        return await answer_one(q, cfg, view)

    @app.post("/query/batch", response_model=BatchQueryResponse, responses=errors, tags=["query"])
    async def query_batch(req: BatchQueryRequest):
        """Runs several questions; each joins the batcher on its own; answers in order. A query
        that fails at run time gets its own status and error; the others their results."""
        if len(req.queries) > service.max_batch_queries:
            raise HTTPException(422, f"queries: expected at most {service.max_batch_queries}, got {len(req.queries)}")
        prepared = prepare_all(req.queries, [f"queries[{i}]." for i in range(len(req.queries))])
        try:
            futures = batcher.enqueue(prepared)
        except (QueueFull, ShuttingDown) as exc:
            refuse(exc)
        items = []
        for fut, r in zip(futures, req.queries):
            try:
                answered = await fut
                items.append(b'{"status":200,"result":' + (await viewed(answered) if r.view else answer_bytes(answered))
                             + b"}")
            except Exception as exc:
                code, msg = failure(exc)
                items.append(json_bytes({"status": code, "error": msg}))
        return Response(b'{"results":[' + b",".join(items) + b"]}", media_type="application/json")

    # -- documents --------------------------------------------------------------------------
    def document_graph(doc_id: str):
        """(snapshot, adjacency) of a document (404 when the served snapshot has none)."""
        snap = state.snapshot
        if doc_id not in snap.index:
            raise HTTPException(404, f"doc_id: no document {doc_id!r} in the index")
        return snap, views.adjacency(snap, doc_id)

    @app.get("/documents", response_model=DocumentListResponse, responses=errors, tags=["documents"])
    def list_documents(offset: int = Param(0, ge=0), limit: int = _cap("documents_limit")):
        """The index's documents (insertion order) with their titles and counts, one page at a time."""
        snap = state.snapshot
        return Response(json_bytes(views.document_rows(snap.index, offset, limit) | {"generation": snap.generation}),
                        media_type="application/json")

    @app.get("/documents/{doc_id:path}/graph", response_model=DocumentGraphResponse,
             responses={**errors, 404: {"model": ErrorResponse}}, tags=["documents"])
    def graph_of_document(doc_id: str, center: int = Param(0, ge=0, description="local node id (0: the document)"),
                          hops: int = _cap("graph_hops"), limit: int = _cap("graph_limit"),
                          max_edges: int = _cap("graph_edges")):
        """A bounded neighbourhood of node `center` of the document's graph: breadth first within
        `hops`, at most `limit` nodes (a hop that does not fit keeps its nodes of highest degree)
        and at most `max_edges` edges among them, so a graph of any size is answered in a page."""
        snap, adj = document_graph(doc_id)
        if center >= adj.n:
            raise HTTPException(422, f"center: expected a node id in [0, {adj.n}), got {center}")
        body = views.neighbourhood(adj, center, hops, limit, max_edges) | {"generation": snap.generation}
        return Response(json_bytes(body), media_type="application/json")

    @app.get("/documents/{doc_id:path}/nodes", response_model=NodeListResponse,
             responses={**errors, 404: {"model": ErrorResponse}}, tags=["documents"])
    def nodes_of_document(doc_id: str, match: str = Param("", max_length=200, description="part of the name"),
                          kind: str | None = Param(None, pattern="^(" + "|".join(views.KIND_OF_NAME) + ")$"),
                          offset: int = Param(0, ge=0), limit: int = _cap("nodes_limit")):
        """The document's nodes (local ids, ascending) whose name contains `match` (any case) and
        of `kind`, one page at a time."""
        snap, adj = document_graph(doc_id)
        body = views.node_rows(adj, match, kind, offset, limit) | {"generation": snap.generation}
        return Response(json_bytes(body), media_type="application/json")

    @app.get("/documents/{doc_id:path}/image", responses={**errors, 404: {"model": ErrorResponse},
                                                           200: {"content": {"image/jpeg": {}}}}, tags=["documents"])
    def image_of_document(doc_id: str, ref: str = Param(..., min_length=1, max_length=1000),
                          size: int = _cap("thumbnail_size")):
        """The document's image `ref` as a JPEG of at most `size` pixels a side (404 when the index
        keeps no pixels for it). Region boxes are normalised to the image, so they apply to the
        thumbnail as they are. Headers: ``X-Image-Width`` / ``X-Image-Height`` of the original."""
        snap = state.snapshot
        uploads = None if state.path is None else writer.uploads
        try:
            data, w, h, w0, h0 = views.thumbnail(snap, doc_id, ref, size, uploads, service.media_roots,
                                                 service.max_image_pixels)
        except views.NoPixels as exc:
            raise HTTPException(404, str(exc)) from None
        except views.BadImage as exc:
            raise HTTPException(422, f"ref: {exc}") from None
        return Response(data, media_type="image/jpeg",
                        headers={"Cache-Control": "private, max-age=300", "X-Image-Width": str(w0),
                                 "X-Image-Height": str(h0), "X-Content-Type-Options": "nosniff"})

    @app.post("/documents", response_model=DocumentsResponse,
              responses={**errors, 409: {"model": ErrorResponse}, 507: {"model": ErrorResponse}}, tags=["documents"])
    async def add_documents(files: list[UploadFile] = File(..., description="document files and their sidecars")):
        """Ingests the uploaded files (document id = file name) through the index's one writer;
        queries keep running on the previous generation until the new one is published."""
        if len(files) > service.max_upload_files:
            raise HTTPException(422, f"files: expected at most {service.max_upload_files} files, got {len(files)}")
        pairs = [(f.filename, await f.read()) for f in files]
        try:
            report = await writer.add_files(pairs)
        except WriterBusy as exc:
            raise HTTPException(429, str(exc), headers=retry) from None
        except ReadOnly as exc:
            raise HTTPException(409, str(exc)) from None
        except IndexConflictError as exc:
            raise HTTPException(409, str(exc)) from None
        except (TypeError, ValueError) as exc:
            raise HTTPException(422, str(exc)) from None
        _publish_index_metrics(metrics, state)
        docs = [{k: getattr(d, k) for k in ("file", "doc_id", "kind", "status", "failures", "entities", "relations",
                                            "images", "segments")} for d in report.documents]
        for d in docs:
            d["file"] = d["doc_id"]  # the server-side path is not the client's business
        added = len(report.by_status("added"))
        snap = state.snapshot
        body = {"documents": docs, "added": added, "generation": snap.generation,
                "total_documents": snap.documents}
        if not added:
            present = report.by_status("present")
            code = 409 if present and len(present) == len([d for d in docs if d["status"] != "skipped"]) else 422
            what = "every document is already in the index" if code == 409 else "no document could be added"
            return JSONResponse({"detail": f"files: {what}", **body}, status_code=code)
        return Response(json_bytes(body), media_type="application/json")

    @app.delete("/documents/{doc_id:path}", response_model=RemovedResponse,
                responses={**errors, 404: {"model": ErrorResponse}, 409: {"model": ErrorResponse},
                           507: {"model": ErrorResponse}}, tags=["documents"])
    async def remove_document(doc_id: str):
        """Removes a document (its nodes, edges, aliases and vectors) through the index's one writer."""
        if doc_id not in state.snapshot.index and (state._writer_index is None or doc_id not in state._writer_index):
            raise HTTPException(404, f"doc_id: no document {doc_id!r} in the index")
        try:
            await writer.remove(doc_id)
        except WriterBusy as exc:
            raise HTTPException(429, str(exc), headers=retry) from None
        except (ReadOnly, IndexConflictError) as exc:
            raise HTTPException(409, str(exc)) from None
        except ValueError as exc:  # removed by an earlier change in the writer's queue
            raise HTTPException(404, str(exc)) from None
        _publish_index_metrics(metrics, state)
        snap = state.snapshot
        return {"removed": doc_id, "generation": snap.generation, "total_documents": snap.documents}

    # -- service ----------------------------------------------------------------------------
    @app.get("/health", response_model=HealthResponse, tags=["service"])
    async def health():
        snap = state.snapshot
        return {"status": "draining" if batcher.closing else "ok", "generation": snap.generation,
                "documents": snap.documents}

    @app.get("/info", tags=["service"])
    async def info():
        """Index counts, encoders (each model's load seconds, the device), backends, the default config,
        batching and limits."""
        from .. import backends
        snap = state.snapshot
        b = backends()
        return Response(json_bytes({
            # the folder's name only: an answer never shows the server's layout (absolute paths)
            "index": {"name": None if state.path is None else state.path.name, "generation": snap.generation,
                      "counts": snap.index.counts, "writable": state.writable},
            "encoders": public_description(state.encoders.describe()),
            # seconds each model took to load at start ({} for model-free encoders), and where they run
            "encoder_load_s": load_s, "device": str(state.device),
            "backends": {k: v for k, v in b.items() if k in ("native", "igraph_version", "cpu_isa_float32",
                                                             "triton_importable", "cuda")},
            "pipeline_config": state.default.as_dict(), "generator": state.generator is not None,
            "service": {k: v for k, v in asdict(service).items() if k != "token"} | {"token": service.token is not None},
            "caps": SERVICE_CAPS, "view_caps": {k: list(v) for k, v in VIEW_CAPS.items()},
            "choices": {k: list(v) for k, v in _CHOICES.items()},
            "batcher": {"queued": batcher.depth, "batches_run": batcher.batches_run,
                        "largest_batch": batcher.largest_batch}}), media_type="application/json")

    @app.get("/metrics", response_class=PlainTextResponse, tags=["service"])
    async def metrics_page():
        metrics.queue_depth.set(batcher.depth)
        return PlainTextResponse(metrics.render(), media_type=CONTENT_TYPE)

    # -- the web page -----------------------------------------------------------------------
    def page():
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)

    for path in PAGE_PATHS:
        app.add_api_route(path, page, methods=["GET"], include_in_schema=False)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    # middlewares, innermost first: metrics see every answer (the guards' 401/413 included)
    def limit_for(path: str) -> int:
        return service.max_upload_bytes if path.startswith("/documents") else service.max_query_bytes

    app.add_middleware(BodyLimit, limit_for=limit_for)
    if service.token is not None:
        app.add_middleware(BearerToken, token=service.token, open_paths=("/health", *PAGE_PATHS),
                           open_prefixes=("/static/",))
    if service.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware
        app.add_middleware(CORSMiddleware, allow_origins=list(service.cors_origins), allow_methods=["*"],
                           allow_headers=["*"])
    app.add_middleware(RequestMetrics, metrics=metrics)
    return app


def _publish_index_metrics(metrics: ServiceMetrics, state: IndexState) -> None:
    snap = state.snapshot
    metrics.documents.set(snap.documents)
    metrics.generation.set(snap.generation)


__all__ = ["PixelBudget", "ServiceConfig", "create_app", "decode_image", "json_bytes"]
