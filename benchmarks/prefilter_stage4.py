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

import pathlib
import statistics
import sys

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _harness as h  # noqa: E402
from prefilter_pages import build_index, encode  # noqa: E402

from colgraph_engine.prefilter import stages  # noqa: E402
from colgraph_engine.store import PackedStore  # noqa: E402

SETTINGS = {"defaults (ncells 1, threshold 0.5, ndocs 256)": {}, "ncells 2, ndocs 1024": {"ncells": 2, "ndocs": 1024}}
PATHS = {"broadcast gather (before)": stages._full_scores_generic, "per-query gather (now)": stages.full_scores}


def path(name: str, search):
    """``search()`` with stage 4 of the search switched to path `name` (the search calls
    ``stages.full_scores``); the module's own function is put back after each call."""
    def run():
        current, stages.full_scores = stages.full_scores, PATHS[name]
        try:
            return search()
        finally:
            stages.full_scores = current
    return run


def main(argv=None) -> int:
    ap = h.parser(__doc__, quick=False)
    ap.add_argument("--data", type=pathlib.Path, default=HERE.parent.parent / "shared" / "data" / "mmlongbench-dev")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    (pv, po), (qv, qo), info = encode(args.data)
    idx, build_s = build_index(pv, po, 2)
    store = PackedStore(pv.shape[1])
    store.add((pv, po))
    nq = qo.numel() - 1
    rows = []
    for label, kw in SETTINGS.items():
        fns = {name: path(name, lambda kw=kw: idx.search(qv, qo, k=10, store=store, **kw)) for name in PATHS}
        a, b = (fn() for fn in fns.values())  # the check before timing (also the warmup)
        if not (torch.equal(a.ids, b.ids) and torch.equal(a.scores, b.scores)):
            raise h.CorrectnessError(f"{label}: the two stage-4 paths gave different results")
        qps = {name: nq / statistics.median(v) for name, v in h.paired(fns, args.repeats, warmup=0).items()}
        before, now = qps.values()
        rows.append({"settings": label, **{f"qps {k}": v for k, v in qps.items()}, "ratio": now / before})
    body = [f"torch threads 2. MiniLM page tokens: {info['pages']:,} pages, {info['questions']} questions, nbits 2 "
            f"(build {build_s:.0f} s); exact stage on the original vectors; QPS = all questions in one call, median of "
            f"{args.repeats} turns, the two paths interleaved. Identical ids and scores in every setting (checked).", "",
            *h.table([("settings", "settings"),
                      ("broadcast gather (before) QPS:", lambda r: f"{r['qps broadcast gather (before)']:.1f}"),
                      ("per-query gather (now) QPS:", lambda r: f"{r['qps per-query gather (now)']:.1f}"),
                      ("now / before:", lambda r: f"{r['ratio']:.2f}x")], rows)]
    h.write("prefilter_stage4", "Prefilter stage 4 on the CPU: per-query gather vs broadcast gather", body,
            {"corpus": info, "build_s": build_s, "repeats": args.repeats, "rows": rows}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
