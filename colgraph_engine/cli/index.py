"""``colgraph index``: build, grow, shrink, describe and check an index directory.

    colgraph index build DIR --out INDEX [options]   read every file under DIR into a new index
                                                     (an existing INDEX is resumed: documents
                                                     already in it are not read again)
    colgraph index add INDEX PATH... [options]       add folders or files to an index
    colgraph index remove INDEX DOC_ID...            remove documents (exactly: nothing remains)
    colgraph index info INDEX [--json]               counts, carried prefilters, one row per document
    colgraph index verify INDEX                      every checksum, count and structure; exit 1 if damaged
    colgraph index prefilter INDEX [options]         make stores carry a centroid prefilter, committed
                                                     with every later change (``--stores``, ``--nbits``,
                                                     ``--min-tokens``, ``--rebuild-drift``; ``--off``
                                                     stops; ``--repair`` rebuilds one that disagrees)

Options of build and add: ``--encoders SET`` (a new index: ``models``, MiniLM + EfficientNet, by
default; ``hashing``, no model; ``FAMILY:PATH``, a ColPali-family model folder; an existing index
keeps its own), ``--device cpu|cuda`` (where the models encode); readers: ``--ocr`` (RapidOCR for pages
without a text layer), ``--no-page-images``, ``--no-embedded-images``, ``--scale``,
``--sections headings|pages``, ``--max-page-pixels`` (pixel budget of one page render); model
hooks on an OpenAI-compatible endpoint: ``--llm-url`` with ``--llm-model`` (text extraction),
``--vision-model`` (scene graphs and region matches), ``--caption-model``, ``--api-key-env``
(the variable holding the key), ``--gleaning``, ``--concurrency``, ``--timeout``, ``--cache``
(reply cache folder; default ``INDEX.llm-cache`` beside the index, so that a rebuild costs no
calls); ``--batch-size``, ``--max-tokens``, ``--json``.

Each file is read, built and encoded in a supervised worker process (see
:mod:`colgraph_engine.ingest.isolate`): a file that crashes a native library, runs out of memory
or hangs is reported as failed and the rest is indexed. ``--no-isolate`` processes files in
this process (for debugging: breakpoints, profilers). Limits per file: ``--max-file-mb``
(larger files are not read), ``--max-pages`` (pages of a PDF beyond are not read, with a
warning), ``--max-text-mb`` (likewise the text of a text or Markdown file), ``--file-timeout`` (seconds; the worker is killed and restarted),
``--worker-memory-gb`` (GiB the worker may grow by; past it MemoryError fails the file); 0
turns a limit off.

A command that runs out of disk space (ENOSPC, EDQUOT) prints one line naming the path and the
free space, and exits 1; the index keeps its last commit.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from .common import disk_full_message, is_disk_full
from .ingest_options import _clients, _hooks, _limits, file_worker, isolation_options

# A new index's vectors: float16 halves float32's bytes per token (256 instead of 512 at d = 128)
# and kept the exact top-10 of every measured question (benchmarks/vector_dtype.py); bfloat16 scores
# faster on CPUs with AVX512-BF16 but its 8-bit mantissa moved some near-ties. Our choice.
VECTOR_DTYPES = ("float16", "bfloat16", "float32")
DEFAULT_VECTOR_DTYPE = "float16"


def add_parser(sub) -> None:
    ix = sub.add_parser("index", help="build, grow, shrink, describe or check an index directory")
    isub = ix.add_subparsers(dest="index_command", required=True)
    b = isub.add_parser("build", help="read every file under DIR into an index")
    b.add_argument("dir", type=Path)
    b.add_argument("--out", type=Path, required=True, help="the index directory")
    b.add_argument("--overwrite", action="store_true", help="start over instead of resuming an existing index")
    b.add_argument("--no-prefilter", dest="prefilter", action="store_false",
                   help="a new index carries no centroid prefilter (recall stays exact MaxSim at every size)")
    b.add_argument("--dtype", choices=VECTOR_DTYPES, default=DEFAULT_VECTOR_DTYPE,
                   help="how a new index stores its token vectors (default float16: half the bytes of float32, "
                        "recall of the exact top-10 unchanged in benchmarks/results/vector_dtype.md)")
    b.add_argument("--item-vectors", choices=("spans", "direct"), default=None,
                   help="how a new index's MiniLM entity and relation vectors are made: spans (the default of "
                        "--encoders models: pooled from the segment pass, no second MiniLM pass) or direct (each "
                        "item's text encoded on its own; benchmarks/results/pipeline_quality_spans.md compares them)")
    b.add_argument("--token-windows", action="store_true",
                   help="--encoders models: a long segment's MiniLM token vectors from every window of it, not "
                        "its first 254 pieces (about 2.3x the tokens on real PDFs; trade-off measured in "
                        "benchmarks/results/pipeline_quality_windows.md and pipeline_quality_all_windows.md)")
    _ingest_options(b, new_index=True)
    a = isub.add_parser("add", help="add folders or files to an index")
    a.add_argument("index", type=Path)
    a.add_argument("paths", nargs="+", type=Path)
    _ingest_options(a)
    r = isub.add_parser("remove", help="remove documents by id")
    r.add_argument("index", type=Path)
    r.add_argument("doc_ids", nargs="+")
    r.add_argument("--encoders", default=None, help="ignored: removing encodes nothing (kept for old scripts)")
    i = isub.add_parser("info", help="counts and one row per document")
    i.add_argument("index", type=Path)
    i.add_argument("--json", action="store_true")
    v = isub.add_parser("verify", help="check every checksum, count and structure")
    v.add_argument("index", type=Path)
    p = isub.add_parser("prefilter", help="make stores carry a centroid prefilter (or stop)")
    p.add_argument("index", type=Path)
    p.add_argument("--stores", nargs="+", default=None, help="store names (default: segment table)")
    p.add_argument("--nbits", type=int, default=2, help="residual bits per dimension: 1, 2 or 4")
    p.add_argument("--min-tokens", type=int, default=None, help="defer a store's build below this many tokens")
    p.add_argument("--rebuild-drift", type=float, default=None, help="rebuild when additions drift past this")
    p.add_argument("--off", action="store_true", help="stop carrying prefilters")
    p.add_argument("--repair", action="store_true", help="rebuild a carried prefilter that disagrees with its store")


def _ingest_options(p, new_index: bool = False) -> None:
    from .common import add_encoder_options

    add_encoder_options(p, new_index=new_index, scoring=False)
    p.add_argument("--ocr", action="store_true", help="OCR pages without a text layer (RapidOCR)")
    p.add_argument("--no-page-images", dest="render_pages", action="store_false")
    p.add_argument("--no-embedded-images", dest="extract_images", action="store_false")
    p.add_argument("--scale", type=float, default=None, help="page render scale (1.0 = 72 dpi)")
    p.add_argument("--sections", choices=("headings", "pages"), default=None)
    p.add_argument("--max-page-pixels", type=int, default=None,
                   help="pixel budget of one page render (page image or OCR); larger pages are drawn smaller "
                        "(default: the PDF reader's)")
    p.add_argument("--batch-size", type=int, default=8, help="documents per commit")
    p.add_argument("--max-tokens", type=int, default=1200, help="segment size in words")
    p.add_argument("--llm-url", default=None, help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1")
    p.add_argument("--llm-model", default=None, help="model for text extraction")
    p.add_argument("--vision-model", default=None, help="model for scene graphs and region matches")
    p.add_argument("--caption-model", default=None, help="model for captions of images without one")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    p.add_argument("--gleaning", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--cache", type=Path, default=None, help="model reply cache folder")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    isolation_options(p)


def run(args) -> int:
    from ..ingest.isolate import WorkerError

    where = getattr(args, "out", None) or getattr(args, "index", None)
    try:
        return {"build": _build, "add": _add, "remove": _remove, "info": _info,
                "verify": _verify, "prefilter": _prefilter}[args.index_command](args)
    except (TypeError, ValueError) as exc:
        print(f"colgraph index {args.index_command}: {exc}", file=sys.stderr)
        return 2
    except WorkerError as exc:
        print(f"colgraph index {args.index_command}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        print(f"colgraph index {args.index_command}: {disk_full_message(exc, where)}", file=sys.stderr)
        return 1


def _worker_encodes(args) -> bool:
    """True when a worker process encodes the files (the default): this process then loads a
    model only if it comes to encode something itself."""
    return bool(getattr(args, "isolate", False))


def _build(args) -> int:
    from .common import _names, _open_index, checked_device, load_set
    from ..encoders.sets import DEFAULT, EncoderSpec, describe_spec
    from ..kg import KnowledgeIndex

    if not args.dir.is_dir():
        raise ValueError(f"DIR: not a folder: {args.dir}")
    device = checked_device(args.device)
    resume = (args.out / "manifest.json").exists() and not args.overwrite
    if resume:
        index, _ = _open_index(str(args.out), args.encoders, device, deferred=_worker_encodes(args))
        if not args.json:
            print(f"resuming {args.out}: {len(index)} documents already indexed are not read again")
    else:
        spec = args.encoders or EncoderSpec(DEFAULT)
        if args.item_vectors is not None:
            if args.item_vectors == "spans" and spec.kind != "models":
                raise ValueError(f"--item-vectors spans: needs --encoders models (MiniLM tokens); {spec} has other "
                                 "token vectors")
            spec = replace(spec, items=args.item_vectors)
        if args.token_windows:
            if spec.kind != "models":
                raise ValueError(f"--token-windows: needs --encoders models (MiniLM tokens); {spec} has other token "
                                 "vectors")
            spec = replace(spec, windows=True)
        enc = load_set(spec, device, deferred=_worker_encodes(args))
        if not args.json:
            print(f"encoders: {describe_spec(spec)}: {_names(enc.describe())}")
        import torch
        # a new index carries the recall stores' deferred prefilters from its first commit
        index = KnowledgeIndex.create(args.out, enc, overwrite=args.overwrite, dtype=getattr(torch, args.dtype),
                                      prefilters=args.prefilter)
        if not args.prefilter:
            index.disable_prefilter()  # recorded: the service's writer does not turn them on
    return _ingest_and_report(index, [args.dir], args, args.out)


def _add(args) -> int:
    from .common import _open_index, checked_device

    index, _ = _open_index(str(args.index), args.encoders, checked_device(args.device),
                           deferred=_worker_encodes(args))
    for p in args.paths:
        if not p.exists():
            raise ValueError(f"PATH: no such file or folder: {p}")
    return _ingest_and_report(index, args.paths, args, args.index)


def _ingest_and_report(index, sources, args, where: Path) -> int:
    from ..ingest.folder import IngestReport, ingest

    max_file_mb, max_pages, max_text_mb, file_timeout, memory_gb = _limits(args)
    reader_options = {"render_pages": args.render_pages, "extract_images": args.extract_images}
    if args.scale is not None:
        reader_options["scale"] = args.scale
    if args.sections is not None:
        reader_options["sections"] = args.sections
    if max_pages is not None:
        reader_options["max_pages"] = max_pages
    if max_text_mb is not None:
        reader_options["max_text_mb"] = max_text_mb
    if args.max_page_pixels is not None:
        reader_options["max_page_pixels"] = args.max_page_pixels
    worker, hooks = None, {}
    if args.isolate:
        worker = file_worker(args, index.encoders, where, file_timeout, memory_gb, getattr(args, "device", "cpu"))
    else:
        hooks = _hooks(args, where)
        if args.ocr:
            from ..encoders.ocr import RapidOcr
            reader_options["ocr"] = RapidOcr()
    total = IngestReport()
    try:
        for source in sources:
            report = ingest(index, source, reader_options=reader_options, batch_size=args.batch_size,
                            max_tokens=args.max_tokens, progress=not args.json, isolate=worker or False,
                            max_file_mb=max_file_mb, **hooks)
            total.documents += report.documents
            total.seconds += report.seconds
    finally:
        if worker is not None:
            worker.close()
    calls = worker.model_calls if worker is not None else {
        c.model: {**{k: getattr(c.stats, k) for k in ("calls", "requests", "cache_hits", "retries")},
                  "failures": c.failures} for c in _clients(hooks)}
    failed_calls = [vars(f) for c in calls.values() for f in c["failures"]]
    if args.json:
        print(json.dumps({"index": str(where), **total.as_dict(), "failed_model_calls": failed_calls},
                         indent=1, default=str))
    else:
        print(total.table())
        t = total.totals
        pages = t["pages"]
        rate = f", {pages / total.seconds:.1f} pages/s" if pages and total.seconds > 0 else ""
        print(f"{where}: {len(index)} documents in the index; this run {total.seconds:.1f} s{rate}")
        for model, c in calls.items():
            print(f"model {model}: {c['calls']} calls, {c['cache_hits']} from the cache, {c['retries']} retries, "
                  f"{len(c['failures'])} failed")
    return 0


def _remove(args) -> int:
    from ..kg import KnowledgeIndex

    index = KnowledgeIndex.open(args.index)  # removing encodes nothing: no model is loaded
    missing = [d for d in args.doc_ids if d not in index]
    if missing:
        raise ValueError(f"DOC_ID: not in the index: {missing[:5]}" + (" ..." if len(missing) > 5 else ""))
    for doc_id in args.doc_ids:
        index.remove_document(doc_id)
        print(f"removed {doc_id}")
    print(f"{args.index}: {len(index)} documents remain")
    return 0


def _info(args) -> int:
    from ..kg.index import _read_manifest

    m = _read_manifest(args.index)
    docs = list(m["documents"])  # format 3: read from the part files
    if args.json:
        print(json.dumps({"index": str(args.index), "generation": m["generation"], "totals": m.get("totals"),
                          "encoders": m["encoders"], "dims": m["dims"], "dtype": m["dtype"],
                          "prefilter": m.get("prefilter"), "documents": docs}, indent=1))
        return 0
    keys = ("segments", "entities", "relations", "images", "regions", "tables")
    print(f"{args.index}: generation {m['generation']}, {len(docs)} documents, vectors {m['dtype']}, "
          f"encoders " + ", ".join(f"{r}={e['name']}" for r, e in m["encoders"].items() if e))
    print(_prefilter_line(m.get("prefilter")))
    width = min(max([len(d["doc_id"]) for d in docs] + [8]), 48)
    print("document".ljust(width) + "".join(k.rjust(11) for k in keys))
    for d in docs:
        c = d.get("counts", {})
        print(d["doc_id"][:width].ljust(width) + "".join(str(c.get(k, "")).rjust(11) for k in keys))
    t = m.get("totals") or {}
    print("total".ljust(width) + "".join(str(t.get(k, "")).rjust(11) for k in keys))
    return 0


def _prefilter(args) -> int:
    from ..kg import KnowledgeIndex
    from ..kg.index import prefilters
    from ..kg.index import _read_manifest

    index = KnowledgeIndex.open(args.index, repair_prefilter=args.repair)
    if args.off:
        index.disable_prefilter()
    else:
        options = {"nbits": args.nbits}
        if args.stores is not None:
            options["stores"] = args.stores
        options["min_tokens"] = prefilters.DEFAULT_MIN_TOKENS if args.min_tokens is None else args.min_tokens
        options["rebuild_drift"] = prefilters.DEFAULT_REBUILD_DRIFT if args.rebuild_drift is None else args.rebuild_drift
        for store, what in index.enable_prefilter(**options, progress=True).items():
            print(f"{store}: {what}")
    print(_prefilter_line(_read_manifest(args.index).get("prefilter")))
    return 0


def _prefilter_line(p) -> str:
    """One line on the carried prefilters of a manifest's ``prefilter`` field (checked on load)."""
    if not p:
        return "prefilter: none carried (KnowledgeIndex.enable_prefilter adds one)"
    stores = []
    for s, e in p["stores"].items():
        if e.get("folder") is None:
            scaled = f", or {p['min_tokens_d128']} tokens of d = 128" if p.get("min_tokens_d128") else ""
            stores.append(f"{s} deferred (below {p['min_tokens']} tokens{scaled})")
        else:
            pieces = f", {len(e['pieces'])} appended pieces" if e.get("pieces") else ""
            stores.append(f"{s} built ({e['items']} items, {e['deleted']} deleted, drift {e['drift']:.3f}{pieces})")
    return ("prefilter: " + ", ".join(stores)
            + f"; nbits {p['nbits']}, min_tokens {p['min_tokens']}, rebuild_drift {p['rebuild_drift']}")


def _verify(args) -> int:
    from ..kg import KnowledgeIndex
    from ..kg.index import IndexFormatError

    try:
        index = KnowledgeIndex.open(args.index, verify=True)
        graph = index.graph  # the merged graph assembles: ids, offsets and aliases are consistent
    except (IndexFormatError, OSError) as exc:
        print(f"colgraph index verify: DAMAGED: {exc}", file=sys.stderr)
        return 1
    c = index.counts
    print(f"{args.index}: OK ({len(index)} documents, {graph.n_nodes} nodes, {graph.n_edges} edges, "
          + ", ".join(f"{v} {k}" for k, v in c.items() if k.endswith("_vectors") and v) + "; every checksum matches)")
    return 0


def main(argv=None) -> int:  # for `python -m colgraph_engine.cli.index`
    ap = argparse.ArgumentParser(prog="colgraph")
    add_parser(ap.add_subparsers(dest="command", required=True))
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
