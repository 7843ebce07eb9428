"""CPU MaxSim report: the comparisons of ``test_cpu_maxsim.py`` as a table, JSON and a chart.

    .venv/bin/python benchmarks/cpu_report.py [--repeats 5] [--topk-repeats 3] [--only fp32] [--quick]

Workloads: ``_data.CASES``; rows and their fp64 check: ``_impls`` (every row of a case is checked
before any is timed); the rows of a case are timed interleaved (``_harness.paired``), median
reported. GFLOP/s counts the similarity GEMM only, ``2 * Nq * Lq * Nd * Ld * d``. Speedup is
``colpali_ms / impl_ms`` against colpali-engine on an fp32 store with the same values.
``--quick``: the cross cases, 2 calls per row. Writes ``results/cpu_maxsim.{md,json,png}``.
"""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # _data, _impls beside us

import _data  # noqa: E402
import _harness as h  # noqa: E402
import _impls  # noqa: E402

NOTE = ("Median of N interleaved calls after one warmup. GFLOP/s counts 2·Nq·Lq·Nd·Ld·d. "
        f"Speedup = {_impls.BASELINE} ms / row ms (in bf16 cases colpali-engine fp32 scores an "
        "fp32 copy of the same bf16 values, made before timing). Error = max |score − fp64| on "
        "the checked subset, with the tolerance (2 × plain-torch error in the input dtype). "
        "On shared or virtualised machines run-to-run noise can exceed 2× on the large rows; "
        "compare ms (min) as well, and the raw per-call times in the JSON.")
COLUMNS = [("case", "workload"), ("implementation", "impl"),
           ("ms (median):", lambda r: h.fmt(r.get("ms_median"), ".1f")),
           ("ms (min):", lambda r: h.fmt(r.get("ms_min"), ".1f")),
           ("GFLOP/s:", lambda r: h.fmt(r.get("gflops"), ".1f")),
           ("speedup vs colpali:", lambda r: h.fmt(r.get("ratio"), ".2f") + ("×" if "ratio" in r else "")),
           ("max err (tol)", lambda r: f"{r['err']:.2g} ({r['tol']:.2g})" if r["status"] == "ok" else r["status"])]


def run(cases, repeats: int, topk_repeats: int, only: tuple[str, ...] = ()) -> list[dict]:
    """Checked, timed rows of `cases` (one row per case x implementation; `only`: these rows)."""
    by_name = {c.name: c for c in cases}
    rows = []
    for kind, reps in (("cross", repeats), ("topk", topk_repeats)):
        work = {c.name: (lambda c=c: _data.make_data(c)) for c in cases if c.kind == kind}
        rows += h.compare(work, {n: (lambda d, n=n: _impls.build(n, d)) for n in _impls.impl_names(_data.CROSS_BF16)},
                          names=lambda w: [n for n in _impls.impl_names(by_name[w]) if not only or n in only],
                          skip=_impls.skip_reason, reference=lambda d: d,
                          check=lambda n, got, d: _impls.check(n, d, got),  # fp64 oracle
                          repeats=reps, baseline=_impls.BASELINE)
    for r in rows:
        c = by_name[r["workload"]]
        r.update(case=c.name, kind=c.kind, dtype=c.dtype_name)
        if r["status"] == "ok":
            r.update(gflops=c.flops / (r["ms_median"] / 1e3) / 1e9, tol=_impls.tolerance(c))
    return rows


def headline(quick: bool = True) -> h.Headline:
    """MaxSim vs colpali-engine on the fp32 cross case (the headline suite's row)."""
    rows = run([_data.CROSS_FP32], 3 if quick else 7, 1, only=("colgraph native", _impls.BASELINE))
    ours = next(r for r in rows if r["impl"] == "colgraph native")
    peer = next(r for r in rows if r["impl"] == _impls.BASELINE)
    if ours["status"] != "ok" or peer["status"] != "ok":
        return h.Headline("MaxSim CPU, fp32 8x32 vs 512x1030", "—", "—", None,
                          note=ours["status"] + "; " + peer["status"])
    return h.Headline("MaxSim CPU, fp32 8x32 vs 512x1030", f"{ours['ms_median']:.0f} ms",
                      f"colpali-engine {peer['ms_median']:.0f} ms", ours["ratio"], "peer ms / ours ms")


def main(argv=None) -> int:
    p = h.parser(__doc__)
    p.add_argument("--repeats", type=int, default=5, help="timed calls per row, cross cases")
    p.add_argument("--topk-repeats", type=int, default=3, help="timed calls per row, top-k cases")
    p.add_argument("--only", default="", help="run only cases whose name contains this text")
    args = p.parse_args(argv)
    cases = [c for c in _data.CASES if args.only in c.name and (c.kind == "cross" or not args.quick)]
    reps = (2, 1) if args.quick else (args.repeats, args.topk_repeats)
    e = _impls.machine_info()
    rows = run(cases, *reps)
    meta = {"repeats": reps[0], "topk_repeats": reps[1], "rows": rows,
            "cases": [{"name": c.name, "kind": c.kind, "nq": c.nq, "lq": c.lq, "nd": c.nd, "ld": c.ld,
                       "d": c.d, "dtype": c.dtype_name, "k": c.k, "gflop": c.flops / 1e9} for c in cases]}
    body = [f"- colpali-engine {e['colpali_engine']} (COLPALI_SCORES_BACKEND={e['COLPALI_SCORES_BACKEND']})", "",
            NOTE, "", *h.table(COLUMNS, rows)]
    stem = h.stem("cpu_maxsim", args)
    out = h.write(stem, "CPU MaxSim benchmark", body, meta, args.out, e=e)
    if out is not None:
        h.bar_plot(out / f"{stem}.png", *h.ms_series(rows), ylabel="ms per call (median, log scale)",
                   title=f"CPU MaxSim — {e['cpu_model']}, {e['torch_num_threads']} threads, torch {e['torch']}, "
                         f"colpali-engine {e['colpali_engine']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
