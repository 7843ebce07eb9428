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

import argparse
import datetime
import importlib.util
import json
import pathlib
import statistics
import sys
import time

import numpy as np
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from colgraph_engine.kg import Encoders  # noqa: E402
from colgraph_engine.pipeline import STAGES, Pipeline, PipelineConfig  # noqa: E402
from colgraph_engine.pipeline import graph_retrieval as gr  # noqa: E402
from colgraph_engine.pipeline import scoring  # noqa: E402
from colgraph_engine.pipeline.scoring import item_norms  # noqa: E402


def _pipeline_report():
    spec = importlib.util.spec_from_file_location("pipeline_report", HERE / "pipeline_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


def stage_times(pipe: Pipeline, questions: list[str]) -> dict[str, list[float]]:
    out = {s: [] for s in STAGES}
    for q in questions:
        r = pipe.retrieve(q)
        for s in STAGES:
            out[s].append(r.timings.get(s, 0.0) * 1e3)
    return out


def run_size(pr, n: int, encoders, args) -> dict:
    index, info = pr.load_or_build(n, encoders, HERE / ".cache", seed=0, dtype=torch.float32, progress=True)
    questions = pr.make_questions(args.queries + 2, n)
    rows = {}
    for filt in ("default", "mkg"):
        pipe = Pipeline(index, encoders, PipelineConfig(recall_ranker="maxsim", filter=filt))
        for q in questions[:2]:  # warm: the view, its caches
            pipe.retrieve(q)
        acc = {"before": {s: [] for s in STAGES}, "after": {s: [] for s in STAGES}}
        for _ in range(2):
            with Before():
                pipe._view = None  # a fresh view: the before path has nothing cached either
                pipe.retrieve(questions[0])
                for s, v in stage_times(pipe, questions[2:]).items():
                    acc["before"][s] += v
            pipe._view = None
            pipe.retrieve(questions[0])
            for s, v in stage_times(pipe, questions[2:]).items():
                acc["after"][s] += v
        rows[filt] = {m: {s: statistics.median(v) for s, v in t.items()} for m, t in acc.items()}
    return {"documents": n, "how": info["how"], "segments": int(index.stores["segment"].offsets.numel() - 1),
            "segment_tokens": int(index.stores["segment"].offsets[-1]),
            "entities": int(index.stores["entity"].offsets.numel() - 1), "stages": rows}


def run_carried(pr, n: int, encoders, args) -> dict:
    index = pr.build_index(n, encoders, progress=True)
    t = time.perf_counter()
    events = index.enable_prefilter(progress=True)
    built = time.perf_counter() - t
    questions = pr.make_questions(args.queries + 2, n)
    pipes = {"auto": Pipeline(index, encoders), "maxsim": Pipeline(index, encoders, PipelineConfig(recall_ranker="maxsim"))}
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


def to_markdown(rep: dict) -> str:
    L = [f"# Per-stage time against corpus size, before / after (issue 23 item 3) ({rep['date']})", "",
         f"Command: `{rep['command']}`. Single queries (`retrieve`), median ms per query per stage over "
         f"{rep['queries']} questions x 2 alternations; recall `maxsim` in both variants.", ""]
    for filt in ("default", "mkg"):
        L += [f"## filter={filt}", "", "| documents | segment tokens | variant | " + " | ".join(STAGES) + " |",
              "|---:|---:|---|" + "---:|" * len(STAGES)]
        for r in rep["sizes"]:
            for m in ("before", "after"):
                t = r["stages"][filt][m]
                L.append(f"| {r['documents']:,} | {r['segment_tokens']:,} | {m} | " +
                         " | ".join(f"{t[s]:.2f}" for s in STAGES) + " |")
        L.append("")
    for c in rep.get("carried", []):
        L += [f"## Recall stage with carried prefilters, {c['documents']:,} documents "
              f"({c['segment_tokens']:,} segment tokens)", "",
              f"enable_prefilter(): {c['events']} in {c['prefilter_build_s']:.1f} s. Recall stage, median ms per query: "
              f"default config (auto) {c['recall_ms']['auto']:.1f}, maxsim {c['recall_ms']['maxsim']:.1f}; "
              f"top-10 overlap with maxsim {c['recall_overlap']:.3f}. Paths: {c['paths']}", ""]
    return "\n".join(L)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000,10000")
    p.add_argument("--queries", type=int, default=16)
    p.add_argument("--carried", type=int, default=0, help="documents of the index with carried prefilters (0: none)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--out", default=str(HERE / "results"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    pr = _pipeline_report()
    encoders = Encoders.offline()
    rep = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": "python benchmarks/stage_scaling.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "queries": args.queries, "sizes": [], "carried": []}
    for n in [int(x) for x in args.sizes.split(",")]:
        rep["sizes"].append(run_size(pr, n, encoders, args))
        print(json.dumps(rep["sizes"][-1]["stages"]), flush=True)
    if args.carried:
        rep["carried"].append(run_carried(pr, args.carried, encoders, args))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "stage_scaling_quick" if args.quick else "stage_scaling"
    (out / f"{stem}.json").write_text(json.dumps(rep, indent=1, default=str))
    (out / f"{stem}.md").write_text(to_markdown(rep))
    print(to_markdown(rep))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
