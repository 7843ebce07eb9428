"""Candidate MaxSim on the CPU: the row tiles (query tokens in the 16 lanes) against the
document-lane kernel (a document's rows in the lanes, csrc/maxsim_cpu.cpp) and the per-document
choice between them that ``maxsim_candidates`` makes by default.

Each workload scores every document of a float16 store once per query (the candidate lists of
the pipeline's exact stages), for a query length and document length: 4-32 tokens, 16-128
rows, one or two queries listing each document. Rows are forced with COLGRAPH_CANDIDATE_KERNEL
(``rows``, ``lanes``; ``auto`` is the default); every row's scores are checked bit-equal to the
row tiles' before anything is timed, calls interleaved, one native thread. On a CPU without
AVX-512 the lane kernel does not exist and every row runs the row tiles.

    .venv/bin/python benchmarks/candidate_kernel.py           # writes results/candidate_kernel.{md,json,png}
    .venv/bin/python benchmarks/candidate_kernel.py --quick   # two workloads, fewer calls
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as h  # noqa: E402
from colgraph_engine.ops import _native_impl  # noqa: E402

D, N_DOCS = 128, 4000
KERNELS = ("rows", "lanes", "auto")


def workload(q_len: int, rows: int, per_doc: int, n_docs: int):
    """``inputs()`` for queries of `q_len` tokens, documents of `rows` rows, `per_doc` queries each."""
    def make():
        g = torch.Generator().manual_seed(q_len * 1000 + rows * 10 + per_doc)
        xv = torch.randn(n_docs * rows, D, generator=g).half()
        xo = torch.arange(0, n_docs * rows + 1, rows, dtype=torch.int64)
        qv = torch.randn(q_len * per_doc, D, generator=g).half()
        qo = torch.arange(0, q_len * per_doc + 1, q_len, dtype=torch.int64)
        ci = torch.arange(n_docs, dtype=torch.int64).repeat(per_doc)
        co = torch.arange(0, n_docs * per_doc + 1, n_docs, dtype=torch.int64)
        return qv, qo, xv, xo, co, ci
    return make


def kernel(name: str):
    """``build(inputs) -> fn``: candidate scores with the kernel `name` forced."""
    def build(x):
        def fn():
            os.environ["COLGRAPH_CANDIDATE_KERNEL"] = name
            try:
                return _native_impl.maxsim_candidates(*x)
            finally:
                os.environ.pop("COLGRAPH_CANDIDATE_KERNEL", None)
        return fn
    return build


def bit_equal(name, got, ref):
    if not torch.equal(got.view(torch.int32), ref.view(torch.int32)):
        raise h.CorrectnessError(f"{name}: scores differ from the row tiles' bits")
    return 0.0


def main(argv=None) -> int:
    args = h.parser(__doc__).parse_args(argv)
    os.environ["COLGRAPH_NUM_THREADS"] = "1"
    shapes = [(9, 64, 1), (20, 64, 2)] if args.quick else \
        [(q, r, p) for r in (16, 64, 128) for q in (4, 8, 9, 12, 16, 24, 32) for p in (1, 2)]
    n_docs = 500 if args.quick else N_DOCS
    workloads = {f"{q} tok x {r} rows, {p}/doc": workload(q, r, p, n_docs) for q, r, p in shapes}
    rows = h.compare(workloads, {k: kernel(k) for k in KERNELS},
                     reference=lambda x: kernel("rows")(x)(), check=bit_equal, baseline="rows",
                     repeats=3 if args.quick else 7)
    e = h.env()
    body = [f"{n_docs} float16 documents, d = {D}, every document a candidate of each query; one native thread; "
            f"CPU kernel ISA `{_native_impl.core.cpu_kernel_isa('float16')}`. `ratio` = the row tiles' median / "
            "the row's (above 1: faster than the row tiles); every row's scores were bit-equal to the row tiles'.", "",
            *h.table([("workload", "workload"), ("kernel", "impl"), ("ms (median):", h.cell("ms_median", ".2f")),
                      ("ratio:", h.cell("ratio", ".2f"))], rows)]
    stem = h.stem("candidate_kernel", args)
    out = h.write(stem, "Candidate MaxSim on the CPU: row tiles vs document lanes", body, {"rows": rows}, args.out, e=e)
    groups, series = h.ms_series(rows)
    h.bar_plot(out / f"{stem}.png" if out else None, groups, series, ylabel="ms per call (median)",
               title="Candidate MaxSim: row tiles vs document lanes (CPU, 1 thread)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
