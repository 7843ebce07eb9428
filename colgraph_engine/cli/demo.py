"""``colgraph demo``: builds the demo index (:mod:`colgraph_engine.demos.corpus`) offline and answers
its questions, saying which encoders it used."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from .answer import print_result
from .common import _json_default, _names, checked_device, load_set


def cmd_demo(args) -> int:
    from ..demos.corpus import DEMO_QUESTIONS, _photo, demo_documents
    from ..kg import KnowledgeIndex
    from ..pipeline import Pipeline, PipelineConfig, Query

    tmp = None
    out = args.out
    if out is None:
        tmp = tempfile.TemporaryDirectory()
        out = Path(tmp.name) / "demo-index"
    from ..encoders.sets import EncoderSpec, describe_spec
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
    # the rankers side by side on their own scores: graph support off (β = 0) in both
    rankers = [Pipeline(index, enc, PipelineConfig(kd=3, graph_weight=0.0, visual_ranker=v), device=args.device
                        ).retrieve(queries[0]) for v in ("maxsim", "pooled")]
    pooled = rankers[1]
    if args.json:
        print(json.dumps({"index": str(out), "encoders": str(spec), "counts": index.counts,
                          "results": [r.as_dict() for r in results],
                          "pooled_first_question": pooled.as_dict()}, indent=1, default=_json_default))
    else:
        print(f"\nindex {out}: {index.counts}\n")
        for r in results:
            print_result(r)
            print()
        m, p = ([h for h in r.images if h.kind == "image"] for r in rankers)
        print("MaxSim vs pooled visual ranking, first question, whole images (same candidates, same text views, "
              "graph support off):")
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
