"""Batched vs one-at-a-time native MaxSim on recall-shaped inputs (short questions against many
short segments), the pipeline's stage-1 workload.

    .venv/bin/python benchmarks/batch_maxsim_report.py [--queries 64] [--repeats 3]

The same kernel scores the same queries two ways in one run: one call for the whole batch (all
queries' tokens packed into shared 16-lane blocks) and one call per query. Scores are checked
bit-identical first. Writes results/batch_maxsim.md and .json.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import time

import torch

import colgraph_engine as cg

HERE = pathlib.Path(__file__).parent


def run(n_queries: int, repeats: int, dtype: torch.dtype, segments: int = 5000, seg_len: int = 57,
        q_len: int = 12, d: int = 128) -> dict:
    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(segments * seg_len, d, generator=g), dim=1).to(dtype)
    xo = torch.arange(0, segments * seg_len + 1, seg_len)
    qs = [torch.nn.functional.normalize(torch.randn(q_len, d, generator=g), dim=1).to(dtype) for _ in range(n_queries)]
    qv, qo = cg.pack(qs)
    batch = lambda: cg.maxsim(qv, qo, x, xo, backend="native")  # noqa: E731
    singles = lambda: torch.cat([cg.maxsim(*cg.pack([q]), x, xo, backend="native") for q in qs])  # noqa: E731
    same = torch.equal(batch(), singles())
    tb, ts = [], []
    for _ in range(repeats):
        t = time.perf_counter(); batch(); tb.append(time.perf_counter() - t)  # noqa: E702
        t = time.perf_counter(); singles(); ts.append(time.perf_counter() - t)  # noqa: E702
    b, s = statistics.median(tb), statistics.median(ts)
    return {"dtype": str(dtype).replace("torch.", ""), "queries": n_queries, "bit_identical": same,
            "batch_ms_per_query": b / n_queries * 1e3, "single_ms_per_query": s / n_queries * 1e3, "ratio": s / b}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=pathlib.Path, default=HERE / "results")
    args = ap.parse_args(argv)
    rows = [run(args.queries, args.repeats, dt) for dt in (torch.float32, torch.bfloat16)]
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.machine()) if pathlib.Path("/proc/cpuinfo").exists() else platform.machine()
    info = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": f"{cpu}, {torch.get_num_threads()} threads",
            "isa": cg.backends().get("cpu_isa_float32"),
            "shape": "queries of 12 tokens vs 5,000 segments x 57 tokens, d = 128"}
    lines = ["# Batched vs one-at-a-time native MaxSim (recall-shaped)", "",
             f"{info['date']} · {info['cpu']} · {info['shape']} · median of {args.repeats} · "
             "`benchmarks/batch_maxsim_report.py`", "",
             "| dtype | queries | batch ms/query | one at a time ms/query | ratio | bit-identical |",
             "|---|---:|---:|---:|---:|---|"]
    lines += [f"| {r['dtype']} | {r['queries']} | {r['batch_ms_per_query']:.2f} | {r['single_ms_per_query']:.2f} | "
              f"{r['ratio']:.2f}x | {r['bit_identical']} |" for r in rows]
    args.out.mkdir(exist_ok=True)
    (args.out / "batch_maxsim.md").write_text("\n".join(lines) + "\n")
    (args.out / "batch_maxsim.json").write_text(json.dumps({"info": info, "rows": rows}, indent=1))
    print("\n".join(lines))
    return 0 if all(r["bit_identical"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
