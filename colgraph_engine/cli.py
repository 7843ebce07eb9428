"""The ``colgraph`` command.

    colgraph demo [--out DIR] [--json] [--encoders SET] [--device D]   build the demo index offline and
                                                answer its questions (default encoders: hashing, no model)
    colgraph query INDEX QUESTION [--image PATH] [--caption TEXT] [--json] [--kd N --kg N --hops N --k N ...]
                  [--encoders SET] [--device cpu|cuda]
                  [--llm-url URL --llm-model NAME [--api-key-env VAR] [--timeout S]]   answer, with citations
                                                (cli_answer.py: exit codes, the --json schema)
    colgraph info INDEX                         counts, encoders, backends
    colgraph index build|add|remove|info|verify  files -> index, and index upkeep (see cli_index.py)

A new index gets the default encoders, MiniLM tokens + text and EfficientNet patches
(``--encoders models``); ``--encoders hashing`` is the model-free set (feature hashing, raw pixel
patches; ``offline`` is its deprecated name) and ``--encoders FAMILY:PATH`` a ColPali-family model
from a local folder (see ``colgraph_engine.encoders.sets``). An index reopens with the encoders
its manifest records, loaded once, without naming them; a different ``--encoders`` is refused
with the set the index needs. ``--device cpu|cuda`` places the models and the scoring (``cuda``
without CUDA: one line, exit 2). A command that runs out of disk space prints one line (the
path, the free space) and exits 1.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np


def _offline():
    from .kg import Encoders
    return Encoders.offline()


def _models():
    from .encoders.sets import load_encoders
    return load_encoders("models")


# the named sets (factories of Encoders on the CPU); ``--encoders`` also takes FAMILY:PATH
ENCODER_SETS = {"hashing": _offline, "models": _models}


def fail(message: str, code: int = 2):
    """Prints ``colgraph: <message>`` on one line to stderr and exits with `code`."""
    print(f"colgraph: {message}", file=sys.stderr)
    raise SystemExit(code)


def encoders_arg(text: str):
    """argparse type of ``--encoders``: an EncoderSpec (the error lists the valid names, or
    names the model folder and what it lacks)."""
    from .encoders.sets import parse_spec
    try:
        return parse_spec(text)
    except (ValueError, FileNotFoundError) as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("encoders: ")) from None


def add_encoder_options(p, *, new_index: bool = False, scoring: bool = True) -> None:
    """``--encoders`` and ``--device`` of a command that encodes (and, with `scoring`, scores)."""
    from .encoders.sets import valid_names
    what = ("encoders of a new index (default: models, MiniLM + EfficientNet); an existing index uses its own"
            if new_index else "the index's encoders (default: those its manifest records)")
    p.add_argument("--encoders", type=encoders_arg, default=None, metavar="SET", help=f"{what}: {valid_names()}")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]: where the models run"
                   + (" and the vectors are scored" if scoring else ""))


def checked_device(device: str) -> str:
    """`device` when it is usable here; else one line on stderr and exit 2."""
    from .encoders.sets import EncodersUnavailable, check_device
    try:
        return str(check_device(device))
    except (ValueError, EncodersUnavailable) as exc:
        fail(str(exc).removeprefix("device: "))


def load_set(spec, device: str = "cpu", timings: dict | None = None):
    """The encoders of `spec`, loaded once on `device` (their load seconds added to `timings`);
    a missing package or folder: one line on stderr, exit 2."""
    from .encoders.sets import EncodersUnavailable, load
    try:
        enc, seconds = load(spec, device)
    except EncodersUnavailable as exc:
        fail(str(exc))
    if timings is not None:
        timings.update(seconds)
    return enc


def _names(info: dict) -> str:
    return ", ".join(f"{r}={e['name']}" for r, e in (info or {}).items() if e)


def _open_index(path: str, which=None, device: str = "cpu", timings: dict | None = None):
    """``(index, encoders)``: the index at `path` opened with the encoders its manifest records
    (the set `which` names, when given, must be that set), each model loaded once."""
    from .encoders.sets import EncoderSpec, describe_spec, relocated, spec_of, without_source
    from .kg import KnowledgeIndex
    from .kg.index import _read_manifest

    if isinstance(which, str):  # a caller in Python naming the set
        try:
            which = encoders_arg(which)
        except argparse.ArgumentTypeError as exc:
            fail(f"--encoders: {exc}")
    recorded = _read_manifest(Path(path))["encoders"]
    want = spec_of(recorded)
    if which is not None and want is not None and which.kind != want.kind:
        fail(f"the index at {path} was built with the {describe_spec(want)} encoders ({_names(recorded)}); "
             f"--encoders {which} is another set: pass --encoders {want} or leave --encoders out")
    if which is None and want is None:
        fail(f"the index at {path} was built with encoders that no --encoders set provides ({_names(recorded)}); "
             "open it from Python with those encoders")
    spec = which or want
    if which is None and want.is_family and not Path(want.path).is_dir():
        fail(f"the index at {path} was built with the {want.kind} model in {want.path}, which is not a folder "
             f"any more; if it moved, name it: --encoders {want.kind}:NEWPATH")
    enc = load_set(spec, device, timings)
    got = enc.describe()
    if got != recorded:
        src = (recorded.get("tokens") or {}).get("source")
        if isinstance(spec, EncoderSpec) and spec.is_family and src and without_source(got) == without_source(recorded):
            print(f"colgraph: the index records the {spec.kind} model in {src.get('path')}; using {spec.path} "
                  "(same name and dimensions)", file=sys.stderr)
            enc = relocated(enc, tuple(src.items()))
        else:
            fail(f"the index at {path} was built with encoders {_names(recorded)}; --encoders {spec} gives "
                 f"{_names(got)}" + (f": pass --encoders {want}" if want is not None else ""))
    return KnowledgeIndex.open(path, enc), enc


def _fmt_box(b):
    return "-" if b is None else "(" + ", ".join(f"{x:.2f}" for x in b) + ")"


def print_result(r, out=None, *, context_chars: int = 1200) -> None:
    """Every stage of one result, with the citation (``[doc p.N]``, ``[doc p.N box (...)]``) of each
    image, source and record."""
    from .pipeline.citations import record_citation
    from .pipeline.evidence import by_score
    out = sys.stdout if out is None else out
    w = lambda s="": print(s, file=out)  # noqa: E731
    q = r.query
    w(f"Q: {q.question}" + (f"   [query image; caption: {q.caption!r}]" if q.image is not None else ""))
    w(f"  1 recall ({'+'.join(r.recall_sides)}): " + ", ".join(f"{d} {s:.4f}" for d, s in r.documents[:5]))
    w(f"  3 seeds: entities {r.seed_entities[:6]}  relations {[f'{a} - {b}' for a, b in r.seed_relations[:3]]}")
    c = r.counts
    w(f"  4 expansion: {c['expand']['nodes']} nodes, {c['expand']['relations']} relations kept "
      f"({r.config.filter} filter, l = {r.config.hops})")
    label = {"text_view": "text views: caption, OCR, region labels; no text-image model",
             "patches": "image patches"}.get(r.image_units, "off")
    why = "question tokens (no visual cue)" if r.visual_used_question else f"C_vis {list(r.visual_phrases.phrases)}"
    if q.caption.strip():
        why = (f"{why} + " if r.visual_phrases.has_visual_cue else "") + f"the caption {q.caption.strip()!r}"
    if q.image is not None and r.visual_used_question:
        why = "the query image's patches alone (no visual cue, no caption)"
    w(f"  5 images by {r.config.visual_ranker} of {why} vs {label}:")
    for h in r.images[:5]:
        what = h.image if h.kind == "image" else f"{h.image} / {h.name}"
        w(f"      {h.score:7.3f}  {h.kind:<6} {what:<32} box {_fmt_box(h.bbox)}  {h.cite or '[' + h.doc_id + ']'}")
    w("  6 records:")
    for rec in sorted(r.evidence.records, key=lambda x: -by_score(x.score))[:5]:
        where = f"{rec.image} {_fmt_box(rec.bbox)}" if rec.image else f"segments {list(rec.segments)}"
        w(f"      ({rec.subject} | {rec.predicate} | {rec.object})  {record_citation(rec).label()} {where}")
    w("    sources:")
    for s in r.evidence.sources[:5]:
        w(f"      {s['score']:7.3f}  {s['name']:<12} {s.get('cite', '[' + s['doc_id'] + ']')}")
    w(f"     G_e {r.evidence.ge_nodes.size} nodes -> G* {r.evidence.gstar_nodes.size} nodes")
    text = r.context.render()
    w(f"  7 context ({sum(r.context.tokens.values())} tokens):")
    for line in (text[:context_chars] + (" ..." if len(text) > context_chars else "")).splitlines():
        w(f"      {line}")
    if r.answer is not None:
        w(f"  answer: {r.answer.text!r}" + (f" (error: {r.answer.error})" if r.answer.error else ""))
    w("  ms per stage (batch): " + "  ".join(f"{k} {v * 1e3:.1f}" for k, v in r.timings.items()))
    for n in r.notes:
        w(f"  note: {n}")


def cmd_demo(args) -> int:
    from .demo_corpus import DEMO_QUESTIONS, _photo, demo_documents
    from .kg import KnowledgeIndex
    from .pipeline import Pipeline, PipelineConfig, Query

    tmp = None
    out = args.out
    if out is None:
        tmp = tempfile.TemporaryDirectory()
        out = Path(tmp.name) / "demo-index"
    from .encoders.sets import EncoderSpec, describe_spec
    spec = args.encoders or EncoderSpec("hashing")  # ours: the demo needs no model (and its notes fit hashing)
    enc = load_set(spec, checked_device(args.device))
    if not args.json:
        print(f"encoders: {describe_spec(spec)}: {_names(enc.describe())}")
    index = KnowledgeIndex.create(out, enc, overwrite=True)
    index.add_documents(demo_documents(), progress=not args.json)
    index = KnowledgeIndex.open(out, enc)
    cat_crop = _photo("chelsea")[30:270, 60:400]
    queries = [Query(q) for q in DEMO_QUESTIONS] + [
        Query("Where does this animal live?", image=cat_crop, caption="a tabby cat on a sill")]
    pipe = Pipeline(index, enc, PipelineConfig(kd=3), device=args.device)
    results = pipe.retrieve_batch(queries)
    pooled = Pipeline(index, enc, PipelineConfig(kd=3, visual_ranker="pooled"), device=args.device).retrieve(queries[0])
    if args.json:
        print(json.dumps({"index": str(out), "encoders": str(spec), "counts": index.counts,
                          "results": [r.as_dict() for r in results],
                          "pooled_first_question": pooled.as_dict()}, indent=1, default=_json_default))
    else:
        print(f"\nindex {out}: {index.counts}\n")
        for r in results:
            print_result(r)
            print()
        m, p = ([h for h in r.images if h.kind == "image"] for r in (results[0], pooled))
        print("MaxSim vs pooled visual ranking, first question, whole images (same candidates, same text views):")
        print("  MaxSim: " + ", ".join(f"{h.image} {h.score:.3f}" for h in m))
        print("  pooled: " + ", ".join(f"{h.image} {h.score:.3f}" for h in p))
        if m[0].image == p[0].image:
            print(f"  both rankers pick {m[0].image}")
        elif spec.kind != "hashing":
            print(f"  MaxSim picks {m[0].image}, pooled picks {p[0].image}.")
        else:
            print(f"  MaxSim picks {m[0].image}, pooled picks {p[0].image}. The question asks for a small detail, the "
                  "mission patch, which is one region label\n  in the portrait's long text view: MaxSim matches the "
                  "'patch' token to it, pooling averages it away and the rocket photo's short\n  caption, which shares "
                  "the broad word 'photo', wins.")
    if tmp is not None:
        tmp.cleanup()
    return 0


def cmd_query(args) -> int:
    from .cli_answer import answer_generator, finish_query
    from .pipeline import Pipeline, PipelineConfig, Query

    try:  # the model options are checked before anything loads
        generator = answer_generator(args)
    except (ImportError, ValueError) as exc:
        print(f"colgraph query: {exc}", file=sys.stderr)
        return 2
    index, enc = _open_index(args.index, args.encoders, checked_device(args.device))
    changes = {k: getattr(args, k) for k in ("kd", "kg", "hops", "k", "filter", "visual_ranker", "retrieval",
                                             "recall_side") if getattr(args, k) is not None}
    try:
        cfg = PipelineConfig().replace(**changes)
        r = Pipeline(index, enc, cfg, device=args.device).retrieve(Query(args.question, image=args.image, caption=args.caption or ""))
    except (TypeError, ValueError) as exc:
        print(f"colgraph: {exc}", file=sys.stderr)
        return 2
    return finish_query(r, args, generator, _json_default)  # answer (--llm-url), citations, text or --json


def cmd_info(args) -> int:
    from . import backends
    from .kg.index import _read_manifest

    m = _read_manifest(Path(args.index))
    info = {"index": args.index, "generation": m["generation"], "documents": len(m["documents"]),
            "totals": m.get("totals"), "dims": m["dims"], "dtype": m["dtype"], "encoders": m["encoders"],
            "backends": {k: v for k, v in backends().items() if k in ("native", "igraph_version", "cpu_isa_float32",
                                                                    "triton_importable", "cuda")}}
    print(json.dumps(info, indent=1, default=str))
    return 0


def _json_default(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, tuple):
        return list(x)
    return str(x)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="colgraph", description="multimodal GraphRAG retrieval engine")
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="build the demo index offline and answer its questions")
    d.add_argument("--out", type=Path, default=None, help="index directory (default: a temporary one)")
    d.add_argument("--json", action="store_true")
    d.add_argument("--encoders", type=encoders_arg, default=None, metavar="SET",
                   help="the demo index's encoders (default: hashing, no model; models for MiniLM + EfficientNet)")
    d.add_argument("--device", default="cpu", help="cpu or cuda[:N]: where the models run and the vectors are scored")
    q = sub.add_parser("query", help="answer a question from an index directory")
    q.add_argument("index")
    q.add_argument("question")
    q.add_argument("--image", default=None, help="a query image file")
    q.add_argument("--caption", default=None, help="a caption of the query image")
    q.add_argument("--json", action="store_true")
    add_encoder_options(q)
    for name in ("kd", "kg", "hops", "k"):
        q.add_argument(f"--{name}", type=int, default=None)
    q.add_argument("--filter", default=None)
    q.add_argument("--visual-ranker", dest="visual_ranker", default=None)
    q.add_argument("--retrieval", default=None)
    q.add_argument("--recall-side", dest="recall_side", default=None)
    from .cli_answer import add_answer_options
    add_answer_options(q)  # --llm-url, --llm-model, --api-key-env, --timeout
    i = sub.add_parser("info", help="what an index holds")
    i.add_argument("index")
    from .cli_index import add_parser, run
    add_parser(sub)
    from .cli_serve import add_parser as add_serve_parser, run as run_serve
    add_serve_parser(sub)
    args = ap.parse_args(argv)
    try:
        return {"demo": cmd_demo, "query": cmd_query, "info": cmd_info, "index": run,
                "serve": run_serve}[args.command](args)
    except OSError as exc:  # `colgraph demo --out` on a full disk: one line, not a traceback
        from .cli_index import disk_full_message, is_disk_full
        if not is_disk_full(exc):
            raise
        print(f"colgraph {args.command}: {disk_full_message(exc, getattr(args, 'out', None))}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
