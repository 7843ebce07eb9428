"""CPU MaxSim report: the comparisons of ``test_cpu_maxsim.py`` as a table, JSON and a chart.

Usage (from the repository root)::

    .venv/bin/python benchmarks/cpu_report.py [--repeats 5] [--topk-repeats 3] [--only fp32]

Each row is checked against fp64 first (``_impls.check``), then called once more as warmup
and timed ``--repeats`` times with ``time.perf_counter``; the median is reported. GFLOP/s
counts the similarity GEMM only, ``2 * Nq * Lq * Nd * Ld * d``. Speedup is
``colpali_ms / impl_ms`` against colpali-engine on an fp32 store with the same values.

Writes ``results/cpu_maxsim.md``, ``results/cpu_maxsim.json`` and ``results/cpu_maxsim.png``
beside this file (or under ``--out``).
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # _data, _impls beside us

from tqdm import tqdm  # noqa: E402

import _data  # noqa: E402
import _impls  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="timed calls per row, cross cases")
    p.add_argument("--topk-repeats", type=int, default=3, help="timed calls per row, top-k cases")
    p.add_argument("--only", default="", help="run only cases whose name contains this text")
    p.add_argument("--out", type=pathlib.Path, default=HERE / "results")
    return p.parse_args(argv)


def time_calls(fn, repeats: int) -> list[float]:
    """Seconds of `repeats` calls of `fn`, after one untimed warmup call."""
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def run_row(case: _data.Case, name: str, repeats: int) -> dict:
    """Checks then times row `name` of `case`; a dict of the results (or the skip reason)."""
    row = {"case": case.name, "kind": case.kind, "dtype": case.dtype_name, "impl": name}
    reason = _impls.skip_reason(name)
    if reason:
        return {**row, "status": f"skipped: {reason}"}
    data = _data.make_data(case)
    fn = _impls.build(name, data)
    err = _impls.check(name, data, fn())  # raises before timing if the result is wrong
    secs = time_calls(fn, repeats)
    med = statistics.median(secs)
    return {**row, "status": "ok", "ms_median": med * 1e3, "ms_min": min(secs) * 1e3,
            "ms_all": [s * 1e3 for s in secs], "gflops": case.flops / med / 1e9,
            "max_abs_err": err, "tol": _impls.oracle(data)[1]}


def add_speedups(rows: list[dict]) -> None:
    """Adds ``speedup_vs_colpali = colpali_ms / impl_ms`` to each timed row, per case."""
    base = {r["case"]: r["ms_median"] for r in rows if r["impl"] == _impls.BASELINE and r["status"] == "ok"}
    for r in rows:
        if r["status"] == "ok" and r["case"] in base:
            r["speedup_vs_colpali"] = base[r["case"]] / r["ms_median"]


def run_all(cases, repeats: int, topk_repeats: int) -> list[dict]:
    jobs = [(c, n) for c in cases for n in _impls.impl_names(c)]
    rows = []
    bar = tqdm(jobs, unit="row")
    for case, name in bar:
        bar.set_description(f"{case.kind} {case.dtype_name} {name}")
        rows.append(run_row(case, name, repeats if case.kind == "cross" else topk_repeats))
    add_speedups(rows)
    return rows


def _fmt_info(info: dict) -> list[str]:
    backends = info["colgraph_backends"]
    return [
        f"- CPU: {info['cpu_model']} ({info['cpu_count']} logical cores, {info['cpus_usable']} usable)",
        f"- torch {info['torch']}, torch.get_num_threads() = {info['torch_num_threads']}",
        f"- colgraph_engine {info['colgraph_engine']}, backends: {json.dumps(backends)}",
        f"- colpali-engine {info['colpali_engine']} (COLPALI_SCORES_BACKEND={info['COLPALI_SCORES_BACKEND']})",
        f"- python {info['python']}",
    ]


def to_markdown(info: dict, rows: list[dict], stamp: str) -> str:
    """The report: machine info, then one table of all rows grouped by case."""
    lines = [f"# CPU MaxSim benchmark ({stamp})", "", *_fmt_info(info), "",
             "Median of N calls after one warmup. GFLOP/s counts 2·Nq·Lq·Nd·Ld·d. "
             f"Speedup = {_impls.BASELINE} ms / row ms (in bf16 cases colpali-engine fp32 scores an "
             "fp32 copy of the same bf16 values, made before timing). Error = max |score − fp64| on "
             "the checked subset, with the tolerance (2 × plain-torch error in the input dtype). "
             "On shared or virtualised machines run-to-run noise can exceed 2× on the large rows; "
             "compare ms (min) as well, and the raw per-call times in the JSON.", "",
             "| case | implementation | ms (median) | ms (min) | GFLOP/s | speedup vs colpali | max err (tol) |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['case']} | {r['impl']} | — | — | — | — | {r['status']} |")
            continue
        sp = f"{r['speedup_vs_colpali']:.2f}×" if "speedup_vs_colpali" in r else "—"
        lines.append(f"| {r['case']} | {r['impl']} | {r['ms_median']:.1f} | {r['ms_min']:.1f} | "
                     f"{r['gflops']:.1f} | {sp} | {r['max_abs_err']:.2g} ({r['tol']:.2g}) |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: pathlib.Path, title: str) -> None:
    """Grouped bar chart: one group per case, one bar per implementation, log-scale ms."""
    import matplotlib
    matplotlib.use("Agg")  # headless: no display on benchmark machines
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(r["case"] for r in rows))
    # Legend in table order: the bf16 cross case lists every row name there is.
    order = _impls.impl_names(_data.CROSS_BF16)
    impls = sorted(dict.fromkeys(r["impl"] for r in rows), key=lambda n: order.index(n) if n in order else len(order))
    ms = {(r["case"], r["impl"]): r["ms_median"] for r in rows if r["status"] == "ok"}
    width = 0.8 / len(impls)
    fig, ax = plt.subplots(figsize=(12, 5.5))
    for j, name in enumerate(impls):
        xs = [i + (j - (len(impls) - 1) / 2) * width for i, c in enumerate(cases) if (c, name) in ms]
        ys = [ms[(c, name)] for c in cases if (c, name) in ms]
        bars = ax.bar(xs, ys, width, label=name)
        ax.bar_label(bars, labels=[f"{y:.0f}" for y in ys], fontsize=7, rotation=90, padding=2)
    ax.set_yscale("log")
    ax.set_xticks(range(len(cases)), cases, fontsize=9)
    ax.set_ylabel("ms per call (median, log scale)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, ncol=3)
    ax.margins(y=0.2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    cases = [c for c in _data.CASES if args.only in c.name]
    info = _impls.machine_info()
    stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    rows = run_all(cases, args.repeats, args.topk_repeats)
    md = to_markdown(info, rows, stamp)
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cpu_maxsim.md").write_text(md)
    meta = {"timestamp": stamp, "machine": info, "repeats": args.repeats, "topk_repeats": args.topk_repeats,
            "cases": [{"name": c.name, "kind": c.kind, "nq": c.nq, "lq": c.lq, "nd": c.nd, "ld": c.ld,
                       "d": c.d, "dtype": c.dtype_name, "k": c.k, "gflop": c.flops / 1e9} for c in cases],
            "rows": rows}
    (args.out / "cpu_maxsim.json").write_text(json.dumps(meta, indent=2) + "\n")
    plot(rows, args.out / "cpu_maxsim.png", f"CPU MaxSim — {info['cpu_model']}, "
         f"{info['torch_num_threads']} threads, torch {info['torch']}, colpali-engine {info['colpali_engine']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
