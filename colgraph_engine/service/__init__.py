"""``colgraph serve``: the pipeline behind an HTTP API (FastAPI on uvicorn) with dynamic batching.

    from colgraph_engine.service import ServiceConfig, create_app
    app = create_app(KnowledgeIndex.open("my-index", enc), enc, service=ServiceConfig(max_batch=32))
    uvicorn.run(app, host="127.0.0.1", port=8000)

One module per job: ``app`` (routes and status codes), ``models`` (request/response bodies, the
OpenAPI schema), ``batcher`` (dynamic batching, back-pressure, draining), ``state`` (index
snapshots for readers, the writer's index), ``writer`` (uploads and removals, one at a time),
``guards`` (body limits, bearer token, request metrics), ``metrics`` (Prometheus text format),
``views`` (what the web page reads: document lists, bounded neighbourhoods, thumbnails, a
query's drawn subgraph). ``static/`` is the web page itself (``/`` and ``/ui/documents``: plain
HTML, CSS and JavaScript modules, no build step, nothing loaded from elsewhere).
Needs the ``serve`` extra (fastapi, uvicorn, python-multipart).
"""
from .app import ServiceConfig, create_app
from .batcher import DynamicBatcher, QueueFull, ShuttingDown
from .metrics import ServiceMetrics

__all__ = ["DynamicBatcher", "QueueFull", "ServiceConfig", "ServiceMetrics", "ShuttingDown", "create_app"]
