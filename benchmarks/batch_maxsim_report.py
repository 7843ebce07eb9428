"""Batched vs one-at-a-time native MaxSim on recall-shaped inputs (short questions against many
short segments), the pipeline's stage-1 workload.

    .venv/bin/python benchmarks/batch_maxsim_report.py [--queries 64] [--repeats 3] [--quick]

The same kernel scores the same queries two ways, interleaved in one run: one call for the whole
batch (all queries' tokens packed into shared 16-lane blocks) and one call per query. Scores
must be bit-identical before anything is timed. Writes results/batch_maxsim.{md,json}.
"""
from __future__ import annotations

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _harness as h  # noqa: E402
import colgraph_engine as cg  # noqa: E402

SHAPE = "queries of 12 tokens vs 5,000 segments x 57 tokens, d = 128"


def inputs(n_queries: int, dtype: torch.dtype, segments: int = 5000, seg_len: int = 57, q_len: int = 12, d: int = 128):
    """``(queries [n_queries x [q_len, d]], packed segments [segments*seg_len, d], offsets)``."""
    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(segments * seg_len, d, generator=g), dim=1).to(dtype)
    qs = [torch.nn.functional.normalize(torch.randn(q_len, d, generator=g), dim=1).to(dtype) for _ in range(n_queries)]
    return qs, x, torch.arange(0, segments * seg_len + 1, seg_len)


def batch(a):
    qs, x, xo = a
    qv, qo = cg.pack(qs)
    return lambda: cg.maxsim(qv, qo, x, xo, backend="native")


def singles(a):
    qs, x, xo = a
    return lambda: torch.cat([cg.maxsim(*cg.pack([q]), x, xo, backend="native") for q in qs])


def main(argv=None) -> int:
    p = h.parser(__doc__)
    p.add_argument("--queries", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    nq, reps = (8, 1) if args.quick else (args.queries, args.repeats)
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    rows = h.compare({k: (lambda dt=dt: inputs(nq, dt)) for k, dt in dtypes.items()},
                     {"batch": batch, "one at a time": singles},
                     reference=lambda a: singles(a)(), check=h.equal, baseline="one at a time", repeats=reps)
    by = {(r["workload"], r["impl"]): r for r in rows}
    table = [{"dtype": k, "queries": nq, "bit_identical": True,
              "batch_ms_per_query": by[k, "batch"]["ms_median"] / nq,
              "single_ms_per_query": by[k, "one at a time"]["ms_median"] / nq,
              "ratio": by[k, "batch"]["ratio"]} for k in dtypes]
    body = [f"{SHAPE} · median of {reps} interleaved · scores checked bit-identical before timing", "",
            *h.table([("dtype", "dtype"), ("queries:", "queries"),
                      ("batch ms/query:", lambda r: f"{r['batch_ms_per_query']:.2f}"),
                      ("one at a time ms/query:", lambda r: f"{r['single_ms_per_query']:.2f}"),
                      ("ratio:", lambda r: f"{r['ratio']:.2f}x"), ("bit-identical", "bit_identical")], table)]
    h.write(h.stem("batch_maxsim", args), "Batched vs one-at-a-time native MaxSim (recall-shaped)", body,
            {"shape": SHAPE, "isa": cg.backends().get("cpu_isa_float32"), "rows": table, "timings": rows}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
