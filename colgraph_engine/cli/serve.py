"""``colgraph serve``: the HTTP service over an index directory (see ``colgraph_engine.service``).

    colgraph serve INDEX [--host 127.0.0.1] [--port 8000] [--encoders SET] [--device cpu|cuda]
                         [--max-batch 32] [--max-wait-ms 5] [--queue-size 256]
                         [--token TOKEN | --token-env VAR] [--cors-origin URL ...]
                         [--max-query-mb 16] [--max-upload-mb 64] [--kd N --kg N --hops N --k N]
                         [--generator-model M [--generator-url URL]] [--api-key-env VAR]
                         [--llm-url URL --llm-model M --vision-model M --caption-model M ...] [--ocr]

The index's encoders (those its manifest records, or the set ``--encoders`` names: ``models``,
``hashing``, ``FAMILY:PATH``) are loaded once, at start, on ``--device`` (where queries are also
scored; the graph stays on the CPU); ``/info`` reports each model's load time
(``encoder_load_s``) and the device.

``--generator-model`` answers requests that ask for it (``"answer": true``) through an
OpenAI-compatible endpoint (``--generator-url``; the key from ``--api-key-env``, default
``OPENAI_API_KEY``). Uploads (``POST /documents``) are ingested offline unless the model hooks of
``colgraph index add`` are named: ``--llm-url`` with ``--llm-model`` (text extraction),
``--vision-model``, ``--caption-model``, ``--gleaning``, ``--concurrency``, ``--timeout``,
``--cache`` (default ``INDEX.llm-cache``); ``--ocr`` reads pages without a text layer.
Uploaded files are read, built and encoded in a supervised worker process, as ``colgraph index
add`` does (``--no-isolate``, ``--max-file-mb``, ``--max-pages``, ``--max-text-mb``,
``--file-timeout``, ``--worker-memory-gb``): a file that crashes a native library, runs out of
memory or hangs fails its upload, never the server.

The server listens on 127.0.0.1 unless told otherwise. On SIGINT/SIGTERM it stops accepting
connections, answers every request already received (the batcher drains its queue), then exits.
A token on the command line is visible to other users of the machine (``ps``); ``--token-env``
reads it from an environment variable instead.
"""
from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path


def add_parser(sub) -> None:
    from .common import add_encoder_options

    p = sub.add_parser("serve", help="serve an index over HTTP (queries with dynamic batching, uploads, removals)")
    p.add_argument("index", help="the index directory")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    add_encoder_options(p)
    p.add_argument("--max-batch", dest="max_batch", type=int, default=32, help="queries per batch (1: no batching)")
    p.add_argument("--max-wait-ms", dest="max_wait_ms", type=float, default=0.0,
                   help="longest wait of the oldest queued query for a batch to fill")
    p.add_argument("--queue-size", dest="queue_size", type=int, default=256,
                   help="queued queries before new ones get 429")
    p.add_argument("--token", default=None, help="bearer token every route but /health requires")
    p.add_argument("--token-env", dest="token_env", default=None, help="environment variable holding the token")
    p.add_argument("--cors-origin", dest="cors_origins", action="append", default=[],
                   help="an allowed CORS origin (repeat; default: CORS off)")
    p.add_argument("--reload-interval", dest="reload_interval", type=float, default=2.0,
                   help="seconds between checks for commits of other processes (0: off)")
    p.add_argument("--max-query-mb", dest="max_query_mb", type=float, default=16.0)
    p.add_argument("--max-upload-mb", dest="max_upload_mb", type=float, default=64.0)
    p.add_argument("--log-level", dest="log_level", default="info",
                   choices=("critical", "error", "warning", "info", "debug"))
    for name in ("kd", "kg", "hops", "k"):
        p.add_argument(f"--{name}", type=int, default=None, help=f"default {name} of queries without overrides")
    p.add_argument("--generator-model", dest="generator_model", default=None,
                   help="model answering requests with answer=true (OpenAI-compatible endpoint)")
    p.add_argument("--generator-url", dest="generator_url", default=None, help="its endpoint, e.g. http://host/v1")
    p.add_argument("--api-key-env", dest="api_key_env", default="OPENAI_API_KEY",
                   help="environment variable holding the endpoint's API key")
    p.add_argument("--llm-url", dest="llm_url", default=None, help="endpoint of the upload model hooks")
    p.add_argument("--llm-model", dest="llm_model", default=None, help="model for text extraction of uploads")
    p.add_argument("--vision-model", dest="vision_model", default=None)
    p.add_argument("--caption-model", dest="caption_model", default=None)
    p.add_argument("--gleaning", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--cache", default=None, help="model reply cache folder (default INDEX.llm-cache)")
    p.add_argument("--ocr", action="store_true", help="OCR uploaded pages without a text layer (RapidOCR)")
    from .ingest_options import isolation_options
    isolation_options(p)


def build_app(args):
    """The FastAPI app ``args`` describe (ValueError/TypeError for bad settings)."""
    from .common import _open_index, checked_device
    from ..pipeline import PipelineConfig
    from ..service import ServiceConfig, create_app

    token = args.token
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            raise ValueError(f"--token-env: the environment variable {args.token_env} is not set or empty")
    changes = {k: getattr(args, k) for k in ("kd", "kg", "hops", "k") if getattr(args, k) is not None}
    config = PipelineConfig().replace(**changes)
    service = ServiceConfig(max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, queue_size=args.queue_size,
                            token=token, cors_origins=tuple(args.cors_origins), reload_interval_s=args.reload_interval,
                            max_query_bytes=int(args.max_query_mb * (1 << 20)),
                            max_upload_bytes=int(args.max_upload_mb * (1 << 20)))
    generator = None
    if args.generator_url and not args.generator_model:
        raise ValueError("--generator-url: name the model too (--generator-model)")
    if args.generator_model:
        from ..pipeline import OpenAIGenerator
        generator = OpenAIGenerator(args.generator_model, base_url=args.generator_url,
                                    api_key=os.environ.get(args.api_key_env), timeout=args.timeout)
    from .ingest_options import _hooks, _limits, file_worker, reader_limits  # as `colgraph index add` does
    if args.cache is not None:
        args.cache = Path(args.cache)
    max_file_mb, max_pages, max_text_mb, file_timeout, memory_gb = _limits(args)
    device = checked_device(getattr(args, "device", "cpu"))
    load_s: dict[str, float] = {}
    index, enc = _open_index(args.index, args.encoders, device, load_s)
    reader_options = reader_limits(max_pages, max_text_mb)
    ingest_options = {"max_file_mb": max_file_mb}
    if args.isolate and enc is not None:
        worker = file_worker(args, enc, Path(args.index), file_timeout, memory_gb, device)
        atexit.register(worker.close)  # the worker also exits when this process does (its socket closes)
        ingest_options["isolate"] = worker
    else:
        ingest_options.update(_hooks(args, Path(args.index)))
        if args.ocr:
            from ..encoders.ocr import RapidOcr
            reader_options["ocr"] = RapidOcr()
    ingest_options["reader_options"] = reader_options
    return create_app(index, enc, pipeline_config=config, service=service, generator=generator,
                      ingest_options=ingest_options, device=device, encoder_load_s=load_s)


def run(args) -> int:
    try:
        import uvicorn
    except ImportError as exc:
        print(f"colgraph serve: needs the serve extra (pip install 'colgraph_engine[serve]'): {exc}", file=sys.stderr)
        return 2
    if not 0 < args.port < 65536:
        print(f"colgraph serve: --port: expected 1..65535, got {args.port}", file=sys.stderr)
        return 2
    try:
        app = build_app(args)
    except (TypeError, ValueError) as exc:
        print(f"colgraph serve: {exc}", file=sys.stderr)
        return 2
    # graceful shutdown: uvicorn waits for in-flight requests (up to 60 s), then the app's
    # lifespan drains the batcher
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=60,
                access_log=False)
    return 0
