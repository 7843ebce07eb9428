"""Options that ``colgraph index build/add`` and ``colgraph serve`` share for reading files: the
reader limits, the per-file worker (isolation) and the model hooks (LLM extraction, vision,
captions, OCR) with their reply cache."""
from __future__ import annotations

import argparse
import os
from pathlib import Path


# Ours: a 512 MiB file is a large scanned book; 5,000 pages is past the longest manuals and
# standards we know of, and bounds the time one PDF takes (about 4 minutes for 5,000 blank pages
# here). The file timeout is the worker's (colgraph_engine.ingest.isolate.DEFAULT_FILE_TIMEOUT).
DEFAULT_MAX_FILE_MB = 512.0


DEFAULT_MAX_PAGES = 5000


DEFAULT_MAX_TEXT_MB = 4.0


DEFAULT_FILE_TIMEOUT = 1800.0


def isolation_options(p) -> None:
    """The worker and per-file limit flags, shared by ``index build/add`` and ``serve``."""
    p.add_argument("--no-isolate", dest="isolate", action="store_false",
                   help="process files in this process, not in a worker (debugging; a crash ends the run)")
    p.add_argument("--max-file-mb", type=float, default=DEFAULT_MAX_FILE_MB,
                   help=f"files larger than this (MiB) are not read; 0: no limit (default {DEFAULT_MAX_FILE_MB:g})")
    p.add_argument("--max-pages", type=int, default=DEFAULT_MAX_PAGES,
                   help=f"pages read per PDF, the rest left out with a warning; 0: all (default {DEFAULT_MAX_PAGES})")
    p.add_argument("--max-text-mb", type=float, default=DEFAULT_MAX_TEXT_MB,
                   help=f"MiB read per text or Markdown file, the rest left out with a warning; 0: all "
                        f"(default {DEFAULT_MAX_TEXT_MB:g})")
    p.add_argument("--file-timeout", type=float, default=None,
                   help=f"seconds per file, then the worker is killed; 0: none (default {DEFAULT_FILE_TIMEOUT:g})")
    p.add_argument("--worker-memory-gb", type=float, default=None,
                   help="GiB the worker's address space may grow past its start; 0: no cap (default)")


def _limits(args) -> tuple[float | None, int | None, float | None, float | None, float | None]:
    """``--max-file-mb``, ``--max-pages``, ``--max-text-mb``, ``--file-timeout``, ``--worker-memory-gb``
    (0: None)."""
    if not args.isolate:
        for flag, value in (("--file-timeout", args.file_timeout), ("--worker-memory-gb", args.worker_memory_gb)):
            if value:
                raise ValueError(f"{flag}: needs the worker process; drop --no-isolate")
    timeout = DEFAULT_FILE_TIMEOUT if args.file_timeout is None else args.file_timeout
    out = []
    for flag, value, kind in (("--max-file-mb", args.max_file_mb, float), ("--max-pages", args.max_pages, int),
                              ("--max-text-mb", args.max_text_mb, float), ("--file-timeout", timeout, float),
                              ("--worker-memory-gb", args.worker_memory_gb or 0, float)):
        if not value >= 0 or value == float("inf"):
            raise ValueError(f"{flag}: expected a finite number >= 0 (0: no limit), got {value!r}")
        out.append(kind(value) if value else None)
    return tuple(out)


_HOOK_FLAGS = ("llm_url", "llm_model", "vision_model", "caption_model", "api_key_env", "gleaning", "concurrency",
               "timeout", "cache", "ocr")


def file_worker(args, encoders, where: Path, file_timeout: float | None, memory_gb: float | None,
                device: str = "cpu"):
    """The supervised worker for files to ingest into the index at `where` (started on its first
    file): the encoders rebuilt in it from the set they describe (on `device`; from the folder
    ``args.encoders`` names, when it names one), the model hooks and OCR engine `args` ask for."""
    from functools import partial

    from ..encoders.sets import load_encoders, spec_of, with_recorded_rule
    from ..ingest.isolate import FileWorker, Isolation

    _check_hooks(args)  # here; the worker builds its own hooks and OCR engine
    described = encoders.describe()
    named = getattr(args, "encoders", None)
    spec = named if named is not None and not isinstance(named, str) else spec_of(described)
    if spec is not None:
        spec = with_recorded_rule(spec, spec_of(described))  # the worker's text rule is the index's
    if spec is None:
        raise ValueError(f"encoders: {described} are no named set; the worker cannot rebuild them (use --no-isolate)")
    src = (described.get("tokens") or {}).get("source")
    # a moved model folder: the worker loads it from where it is now and describes it as recorded
    moved = tuple(src.items()) if src and src.get("path") != spec.path else None
    factory = partial(load_encoders, (spec.kind, spec.path, spec.items, spec.windows), device, moved)
    return FileWorker(Isolation(encoders=factory, timeout=file_timeout, memory_gb=memory_gb,
                                setup=partial(_worker_setup, _hook_options(args), str(where))), encoders)


def reader_limits(max_pages: int | None, max_text_mb: float | None) -> dict:
    """The reader options of the page and text limits (None: no limit)."""
    return {k: v for k, v in (("max_pages", max_pages), ("max_text_mb", max_text_mb)) if v is not None}


def _hook_options(args) -> dict:
    return {k: getattr(args, k) for k in _HOOK_FLAGS}


def _worker_setup(options: dict, where: str) -> dict:
    """Run in the ingest worker: the model hooks and the OCR engine the options ask for."""
    out = dict(_hooks(argparse.Namespace(**options), Path(where)))
    if options["ocr"]:
        from ..encoders.ocr import RapidOcr
        out["ocr"] = RapidOcr()
    return out


def _check_hooks(args) -> bool:
    """ValueError unless the model options fit together; whether any model is asked for."""
    if not any((args.llm_model, args.vision_model, args.caption_model)):
        if args.llm_url:
            raise ValueError("--llm-url: name at least one of --llm-model, --vision-model, --caption-model")
        return False
    if not args.llm_url:
        raise ValueError("--llm-model / --vision-model / --caption-model: --llm-url (the endpoint) is needed")
    return True


def _hooks(args, where: Path) -> dict:
    """The model hooks the options ask for (none by default: the offline build)."""
    if not _check_hooks(args):
        return {}
    from ..ingest.cache import ResponseCache
    from ..ingest.chat import ChatClient
    from ..ingest.hooks import CaptionHook, LLMExtractor, VisionHook

    cache = ResponseCache(args.cache if args.cache is not None else where.with_name(where.name + ".llm-cache"))
    key = os.environ.get(args.api_key_env)
    clients = {}

    def client(model):
        if model not in clients:
            clients[model] = ChatClient(args.llm_url, model, api_key=key, timeout=args.timeout,
                                        concurrency=args.concurrency, cache=cache)
        return clients[model]

    out = {}
    if args.llm_model:
        out["extractor"] = LLMExtractor(client(args.llm_model), gleaning=args.gleaning)
    if args.vision_model:
        out["vision"] = VisionHook(client(args.vision_model))
    if args.caption_model:
        out["caption"] = CaptionHook(client(args.caption_model))
    return out


def _clients(hooks: dict) -> list:
    seen, out = set(), []
    for h in hooks.values():
        c = getattr(h, "client", None)
        if c is not None and id(c) not in seen:
            seen.add(id(c))
            out.append(c)
    return out
