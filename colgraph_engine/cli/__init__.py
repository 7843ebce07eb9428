"""The ``colgraph`` command.

    colgraph demo [--out DIR] [--json] [--encoders SET] [--device D]   build the demo index offline and
                                                answer its questions (default encoders: hashing, no model)
    colgraph demo store|kg [options]            the store demo (colgraph-demo) and the knowledge-graph
                                                demo (colgraph-kg-demo), colgraph_engine.demos
    colgraph query INDEX QUESTION [--image PATH] [--caption TEXT] [--json] [--kd N --kg N --hops N --k N ...]
                  [--encoders SET] [--device cpu|cuda]
                  [--llm-url URL --llm-model NAME [--api-key-env VAR] [--timeout S]]   answer, with citations
                                                (cli/answer.py: exit codes, the --json schema)
    colgraph info INDEX                         counts, encoders, backends
    colgraph index build|add|remove|info|verify  files -> index, and index upkeep (see cli/index.py)

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
import sys
from pathlib import Path

# the shared pieces, importable from here as before the package split
from .answer import print_result  # noqa: F401
from .common import ENCODER_SETS, _json_default, _open_index, add_encoder_options, encoders_arg  # noqa: F401
from .demo import cmd_demo
from .info import cmd_info
from .query import cmd_query


DEMOS = {"store": "store_demo", "kg": "kg_demo"}  # colgraph demo NAME [its options]: colgraph_engine.demos.<module>


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) >= 2 and argv[0] == "demo" and argv[1] in DEMOS:  # the other demos keep their own options
        import importlib
        return importlib.import_module(f"..demos.{DEMOS[argv[1]]}", __name__).main(argv[2:]) or 0
    ap = argparse.ArgumentParser(prog="colgraph", description="multimodal GraphRAG retrieval engine")
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="build the demo index offline and answer its questions "
                                    "(colgraph demo store | kg [options]: the store and knowledge-graph demos)")
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
    from .answer import add_answer_options
    add_answer_options(q)  # --llm-url, --llm-model, --api-key-env, --timeout
    i = sub.add_parser("info", help="what an index holds")
    i.add_argument("index")
    from .index import add_parser, run
    add_parser(sub)
    from .serve import add_parser as add_serve_parser, run as run_serve
    add_serve_parser(sub)
    args = ap.parse_args(argv)
    try:
        return {"demo": cmd_demo, "query": cmd_query, "info": cmd_info, "index": run,
                "serve": run_serve}[args.command](args)
    except OSError as exc:  # `colgraph demo --out` on a full disk: one line, not a traceback
        from .common import disk_full_message, is_disk_full
        if not is_disk_full(exc):
            raise
        print(f"colgraph {args.command}: {disk_full_message(exc, getattr(args, 'out', None))}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
