"""Per-stage time against corpus size, before and after the item-3 fixes (issue 23), in one run;
and the recall stage's default path (``recall_ranker="auto"``) on an index that carries its
prefilters.

Usage (from the repository root)::

    .venv/bin/python benchmarks/stage_scaling.py                      # 1,000 and 10,000 documents
    .venv/bin/python benchmarks/stage_scaling.py --sizes 200 --quick  # a smoke run

Corpus and questions: ``benchmarks/pipeline_report.py``'s generator (5 segments per document,
10 entities with alias groups spanning about 40 documents, 10 relations, one image), indexes
cached there (``benchmarks/.cache/``). Each size runs single queries (``retrieve``) twice per
variant, alternating: **before** (the code paths as they were, restored by this script: the
seeds stage's entity and relation norms recomputed over the whole store for every batch,
``TextScorer._norms``; mKG filter alias-group members found by scanning every node,
``_group_members``; every candidate scoring call re-validating the whole store's offsets,
``ops.maxsim_candidates`` from ``scoring.score_pairs``) and **after** (the library as it is:
norms once per view snapshot, ``Vectors.norms``; members from a per-view alias CSR,
``IndexView.alias_members``; the kernel called on the view's snapshot with only the queries and
candidates checked, ``scoring._candidates_trusted``). Recall is
``recall_ranker="maxsim"`` in both (the same documents reach stages 2-7, so the per-stage times
compare the same work); filter ``default`` and ``mkg`` (the alias scan runs only under mkg).
Median ms per query per stage.

``--carried N``: also an index of N documents that carries prefilters
(``KnowledgeIndex.enable_prefilter()`` defaults), and its recall stage with the default config
against ``recall_ranker="maxsim"`` (same run, alternating; the documents the two recall).

Writes ``results/stage_scaling.md`` / ``.json`` (``stage_scaling_quick.*`` with ``--quick``).
"""
from __future__ import annotations

import contextlib
import pathlib
import statistics
import sys

import numpy as np
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import _harness as h  # noqa: E402
import pipeline_report as pr  # noqa: E402
from colgraph_engine.kg import Encoders  # noqa: E402
from colgraph_engine.pipeline import STAGES, Pipeline, PipelineConfig  # noqa: E402
from colgraph_engine.pipeline import graph_retrieval as gr  # noqa: E402
from colgraph_engine.pipeline import scoring  # noqa: E402
from colgraph_engine.pipeline.scoring import item_norms  # noqa: E402


def _old_norms(self, store):  # before: item_norms over the whole store, once per TextScorer (batch)
    if store not in self.norms:
        self.norms[store] = item_norms(self.view.vectors[store])
    return self.norms[store]


def _old_group_members(view, nodes, allowed_docs):  # before: a scan of every node's alias group
    groups = view.alias_of[nodes]
    groups = groups[groups >= 0]
    if not groups.size:
        return nodes
    members = np.flatnonzero(np.isin(view.alias_of, groups))
    members = members[np.isin(view.node_doc[members], allowed_docs)]
    return np.union1d(nodes, members)


def _old_candidates(store, qv, qo, co, ci):  # before: ops.maxsim_candidates re-validating the store's offsets
    from colgraph_engine import ops
    return ops.maxsim_candidates(scoring.as_store_dtype(qv, store), qo.to(store.device), store.values, store.offsets,
                                 co.to(store.device), ci.to(store.device), assume_finite=True)


class Before:
    """Restores the code paths as they were while inside the block."""

    def __enter__(self):
        self.saved = gr.TextScorer._norms, gr._group_members, scoring._candidates_trusted
        gr.TextScorer._norms, gr._group_members, scoring._candidates_trusted = \
            _old_norms, _old_group_members, _old_candidates

    def __exit__(self, *exc):
        gr.TextScorer._norms, gr._group_members, scoring._candidates_trusted = self.saved


def stage_times(pipe: Pipeline, questions: list[str], before: bool) -> dict[str, list[float]]:
    """ms per stage of each question, on a fresh view (the before path has nothing cached either)
    warmed by the first question, with the code paths as they were when `before`."""
    with Before() if before else contextlib.nullcontext():
        pipe._view = None
        pipe.retrieve(questions[0])
        timings = [pipe.retrieve(q).timings for q in questions[1:]]
    return {s: [t.get(s, 0.0) * 1e3 for t in timings] for s in STAGES}


def run_size(n: int, encoders, args) -> dict:
    """Median ms per stage, before and after, for filter default and mkg; two rounds each, alternating."""
    index, info = pr.load_or_build(n, encoders, HERE / ".cache", seed=0, dtype=torch.float32, progress=True)
    questions = pr.make_questions(args.queries + 2, n)
    rows = {}
    for filt in ("default", "mkg"):
        pipe = Pipeline(index, encoders, PipelineConfig(recall_ranker="maxsim", filter=filt))
        for q in questions[:2]:  # warm: the view, its caches
            pipe.retrieve(q)
        acc = {m: {s: [] for s in STAGES} for m in ("before", "after")}
        for _ in range(2):
            for m in acc:
                for s, v in stage_times(pipe, [questions[0], *questions[2:]], m == "before").items():
                    acc[m][s] += v
        rows[filt] = {m: {s: statistics.median(v) for s, v in t.items()} for m, t in acc.items()}
    return {"documents": n, "how": info["how"], "segments": int(index.stores["segment"].offsets.numel() - 1),
            "segment_tokens": int(index.stores["segment"].offsets[-1]),
            "entities": int(index.stores["entity"].offsets.numel() - 1), "stages": rows}


def run_carried(n: int, encoders, args) -> dict:
    """The recall stage with the default config (auto) and with maxsim on an index carrying prefilters."""
    index = pr.build_index(n, encoders, progress=True)
    events, built = h.timed(index.enable_prefilter, progress=True)
    questions = pr.make_questions(args.queries + 2, n)
    pipes = {"auto": Pipeline(index, encoders),
             "maxsim": Pipeline(index, encoders, PipelineConfig(recall_ranker="maxsim"))}
    for p in pipes.values():
        for q in questions[:2]:
            p.retrieve(q)
    times = {k: [] for k in pipes}
    same = 0
    paths = None
    for q in questions[2:]:
        got = {}
        for k, p in pipes.items():
            r = p.retrieve(q)
            times[k].append(r.timings["recall"] * 1e3)
            got[k] = [d for d, _ in r.documents]
            if k == "auto":
                paths = r.counts["recall"]["paths"]
        same += len(set(got["auto"]) & set(got["maxsim"])) / max(1, len(got["maxsim"]))
    return {"documents": n, "segment_tokens": int(index.stores["segment"].offsets[-1]), "prefilter_build_s": built,
            "events": events, "recall_ms": {k: statistics.median(v) for k, v in times.items()},
            "recall_overlap": same / len(questions[2:]), "paths": paths}


def _stage_cell(filt: str, stage: str):
    return lambda row: f"{row['r']['stages'][filt][row['variant']][stage]:.2f}"


def to_markdown(rep: dict) -> list[str]:
    lines = [f"Single queries (`retrieve`), median ms per query per stage over {rep['queries']} questions "
             "x 2 alternations; recall `maxsim` in both variants.", ""]
    rows = [{"documents": f"{r['documents']:,}", "tokens": f"{r['segment_tokens']:,}", "variant": m, "r": r}
            for r in rep["sizes"] for m in ("before", "after")]
    for filt in ("default", "mkg"):
        columns = [("documents:", "documents"), ("segment tokens:", "tokens"), ("variant", "variant")]
        lines += [f"## filter={filt}", "", *h.table(columns + [(s + ":", _stage_cell(filt, s)) for s in STAGES], rows),
                  ""]
    for c in rep.get("carried", []):
        lines += [f"## Recall stage with carried prefilters, {c['documents']:,} documents "
                  f"({c['segment_tokens']:,} segment tokens)", "",
                  f"enable_prefilter(): {c['events']} in {c['prefilter_build_s']:.1f} s. Recall stage, median ms per "
                  f"query: default config (auto) {c['recall_ms']['auto']:.1f}, maxsim {c['recall_ms']['maxsim']:.1f}; "
                  f"top-10 overlap with maxsim {c['recall_overlap']:.3f}. Paths: {c['paths']}", ""]
    return lines


def main(argv=None) -> int:
    p = h.parser(__doc__)
    p.add_argument("--sizes", default="1000,10000")
    p.add_argument("--queries", type=int, default=16)
    p.add_argument("--carried", type=int, default=0, help="documents of the index with carried prefilters (0: none)")
    p.add_argument("--torch-threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    encoders = Encoders.offline()
    e = h.env()
    rep = {"queries": args.queries, "sizes": [], "carried": []}
    for n in [int(x) for x in args.sizes.split(",")]:
        rep["sizes"].append(run_size(n, encoders, args))
        print(rep["sizes"][-1]["stages"], flush=True)
    if args.carried:
        rep["carried"].append(run_carried(args.carried, encoders, args))
    h.write(h.stem("stage_scaling", args), "Per-stage time against corpus size, before / after (issue 23 item 3)",
            to_markdown(rep), rep, args.out, e=e)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
