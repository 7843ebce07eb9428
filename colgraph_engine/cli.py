"""The ``colgraph`` command.

    colgraph demo [--out DIR] [--json]          build the demo index offline and answer its questions
    colgraph query INDEX QUESTION [--image PATH] [--caption TEXT] [--json] [--kd N --kg N --hops N --k N ...]
    colgraph info INDEX                         counts, encoders, backends
    colgraph index build|add|remove|info|verify  files -> index, and index upkeep (see cli_index.py)

An index built with the offline encoders (``Encoders.offline()``) or with MiniLM + EfficientNet
(``--encoders models``) is reopened with the same encoders; names recorded in the manifest must
match, otherwise the command says which encoders the index needs. A command that runs out of
disk space prints one line (the path, the free space) and exits 1.
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
    from .encoders import EfficientNetPatchEncoder, MiniLMEncoder
    from .kg import Encoders
    m = MiniLMEncoder()
    return Encoders(text=m.text_encoder(), tokens=m.token_encoder(), patches=EfficientNetPatchEncoder().patch_encoder())


ENCODER_SETS = {"offline": _offline, "models": _models}


def _open_index(path: str, which: str | None):
    from .kg import KnowledgeIndex
    from .kg.index import _read_manifest

    recorded = _read_manifest(Path(path))["encoders"]
    names = [which] if which else list(ENCODER_SETS)
    for name in names:
        try:
            enc = ENCODER_SETS[name]()
        except Exception as exc:  # a model package that is not installed
            if which:
                raise SystemExit(f"colgraph: --encoders {name}: cannot load ({exc})") from None
            continue
        if enc.describe() == recorded:
            return KnowledgeIndex.open(path, enc), enc
    raise SystemExit(f"colgraph: the index at {path} was built with encoders {recorded}; "
                     f"none of {names} matches (build with Encoders.offline() or --encoders models)")


def _fmt_box(b):
    return "-" if b is None else "(" + ", ".join(f"{x:.2f}" for x in b) + ")"


def print_result(r, out=None, *, context_chars: int = 1200) -> None:
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
        w(f"      {h.score:7.3f}  {h.kind:<6} {what:<32} box {_fmt_box(h.bbox)}  [{h.doc_id}]")
    w("  6 records:")
    for rec in sorted(r.evidence.records, key=lambda x: -by_score(x.score))[:5]:
        where = f"{rec.image} {_fmt_box(rec.bbox)}" if rec.image else f"segments {list(rec.segments)}"
        w(f"      ({rec.subject} | {rec.predicate} | {rec.object})  {rec.doc_id} {where}")
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
    enc = _offline()
    index = KnowledgeIndex.create(out, enc, overwrite=True)
    index.add_documents(demo_documents(), progress=not args.json)
    index = KnowledgeIndex.open(out, enc)
    cat_crop = _photo("chelsea")[30:270, 60:400]
    queries = [Query(q) for q in DEMO_QUESTIONS] + [
        Query("Where does this animal live?", image=cat_crop, caption="a tabby cat on a sill")]
    pipe = Pipeline(index, enc, PipelineConfig(kd=3))
    results = pipe.retrieve_batch(queries)
    pooled = Pipeline(index, enc, PipelineConfig(kd=3, visual_ranker="pooled")).retrieve(queries[0])
    if args.json:
        print(json.dumps({"index": str(out), "counts": index.counts,
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
        else:
            print(f"  MaxSim picks {m[0].image}, pooled picks {p[0].image}. The question asks for a small detail, the "
                  "mission patch, which is one region label\n  in the portrait's long text view: MaxSim matches the "
                  "'patch' token to it, pooling averages it away and the rocket photo's short\n  caption, which shares "
                  "the broad word 'photo', wins.")
    if tmp is not None:
        tmp.cleanup()
    return 0


def cmd_query(args) -> int:
    from .pipeline import Pipeline, PipelineConfig, Query

    index, enc = _open_index(args.index, args.encoders)
    changes = {k: getattr(args, k) for k in ("kd", "kg", "hops", "k", "filter", "visual_ranker", "retrieval",
                                             "recall_side") if getattr(args, k) is not None}
    try:
        cfg = PipelineConfig().replace(**changes)
        r = Pipeline(index, enc, cfg).retrieve(Query(args.question, image=args.image, caption=args.caption or ""))
    except (TypeError, ValueError) as exc:
        print(f"colgraph: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(r.as_dict(), indent=1, default=_json_default))
    else:
        print_result(r)
    return 0


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
    q = sub.add_parser("query", help="answer a question from an index directory")
    q.add_argument("index")
    q.add_argument("question")
    q.add_argument("--image", default=None, help="a query image file")
    q.add_argument("--caption", default=None, help="a caption of the query image")
    q.add_argument("--json", action="store_true")
    q.add_argument("--encoders", choices=sorted(ENCODER_SETS), default=None)
    for name in ("kd", "kg", "hops", "k"):
        q.add_argument(f"--{name}", type=int, default=None)
    q.add_argument("--filter", default=None)
    q.add_argument("--visual-ranker", dest="visual_ranker", default=None)
    q.add_argument("--retrieval", default=None)
    q.add_argument("--recall-side", dest="recall_side", default=None)
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
