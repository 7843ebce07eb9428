"""Stage 4 of the prefilter search on the CPU: the per-query column gather
(``index.stages.full_scores``) against the broadcast gather it replaced
(``index.stages._full_scores_generic``), same index, same queries, same run, turns interleaved.

    .venv/bin/python benchmarks/prefilter_stage4.py        # ~2 minutes (one 45 s index build)

Corpus: ``prefilter_pages.py``'s MiniLM page tokens (MMLongBench-Doc dev; cached in
``benchmarks/.cache/prefilter_pages/``, encoded from ../shared/data when missing), nbits 2, the
exact stage on the original vectors. Settings: PLAID's k <= 10 defaults and ncells 2 / ndocs 1024.
Checks that both give identical ids and scores. Writes ``results/prefilter_stage4.{md,json}``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _impls import cpu_model  # noqa: E402
from prefilter_pages import build_index, encode  # noqa: E402

from colgraph_engine.index import stages  # noqa: E402
from colgraph_engine.store import PackedStore  # noqa: E402

SETTINGS = {"defaults (ncells 1, threshold 0.5, ndocs 256)": {}, "ncells 2, ndocs 1024": {"ncells": 2, "ndocs": 1024}}
PATHS = {"broadcast gather (before)": stages._full_scores_generic, "per-query gather (now)": stages.full_scores}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=pathlib.Path, default=HERE.parent.parent / "shared" / "data" / "mmlongbench-dev")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=pathlib.Path, default=HERE / "results")
    args = ap.parse_args()
    torch.set_num_threads(2)
    (pv, po), (qv, qo), info = encode(args.data)
    idx, build_s = build_index(pv, po, 2)
    store = PackedStore(pv.shape[1])
    store.add((pv, po))
    nq = qo.numel() - 1
    rows = []
    current = stages.full_scores
    try:
        for label, kw in SETTINGS.items():
            secs, got = {p: [] for p in PATHS}, {}
            for _ in range(args.repeats):
                for name, fn in PATHS.items():
                    stages.full_scores = fn  # the search calls stages.full_scores
                    t0 = time.perf_counter()
                    res = idx.search(qv, qo, k=10, store=store, **kw)
                    secs[name].append(time.perf_counter() - t0)
                    got[name] = res
            a, b = got.values()
            if not (torch.equal(a.ids, b.ids) and torch.equal(a.scores, b.scores)):
                raise SystemExit(f"{label}: the two stage-4 paths gave different results")
            qps = {name: nq / statistics.median(v) for name, v in secs.items()}
            before, now = qps.values()
            rows.append({"settings": label, **{f"qps {k}": v for k, v in qps.items()}, "ratio": now / before})
    finally:
        stages.full_scores = current
    rep = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "machine": f"{cpu_model()}, {len(os.sched_getaffinity(0))} usable cores (shared)", "corpus": info,
           "build_s": build_s, "repeats": args.repeats, "rows": rows}
    md = [f"# Prefilter stage 4 on the CPU: per-query gather vs broadcast gather ({rep['date']})", "",
          f"Command: `python benchmarks/prefilter_stage4.py`. Machine: {rep['machine']}, torch threads 2. "
          f"MiniLM page tokens: {info['pages']:,} pages, {info['questions']} questions, nbits 2 (build {build_s:.0f} s); "
          f"exact stage on the original vectors; QPS = all questions in one call, median of {args.repeats} turns, "
          "the two paths interleaved. Identical ids and scores in every setting (checked).", "",
          "| settings | broadcast gather (before) QPS | per-query gather (now) QPS | now / before |", "|---|---:|---:|---:|"]
    for r in rows:
        md.append(f"| {r['settings']} | {r['qps broadcast gather (before)']:.1f} | {r['qps per-query gather (now)']:.1f} | "
                  f"{r['ratio']:.2f}x |")
    text = "\n".join(md) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefilter_stage4.md").write_text(text)
    (args.out / "prefilter_stage4.json").write_text(json.dumps(rep, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
