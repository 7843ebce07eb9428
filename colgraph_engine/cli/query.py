"""``colgraph query INDEX QUESTION``: one question (with an optional image and caption) through the
pipeline of the index's encoders, printed as text or as the ``--json`` schema of :mod:`.answer`."""
from __future__ import annotations

import sys

from .answer import answer_generator, finish_query
from .common import _json_default, _open_index, checked_device


def cmd_query(args) -> int:
    from ..pipeline import Pipeline, PipelineConfig, Query

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
