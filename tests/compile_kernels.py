"""Compiles the Triton MaxSim kernel ahead of time for real GPUs, without one.

Run as a script (outside the interpreter, which replaces kernels with Python functions); prints
one JSON line per (arch, specialisation): ok, wgmma present, shared memory, or the error.
"""
import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") != "1", "run without TRITON_INTERPRET"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from colgraph_engine.kernels import maxsim as km  # noqa: E402

SPECS = [
    # (name, value type, G, LQP, BLOCK_K, NUM_K, EVEN_K, CANDIDATES, IEEE)
    ("rerank-32x32-bf16", "bf16", 4, 32, 128, 1, True, False, False),
    ("one-query-bf16", "bf16", 1, 32, 128, 1, True, False, False),
    ("candidates-bf16", "bf16", 4, 32, 128, 1, True, True, False),
    ("d96-fp16", "fp16", 8, 16, 128, 1, False, False, False),
    ("d300-candidates-bf16", "bf16", 1, 128, 256, 2, False, True, False),
    ("fp32-ieee", "fp32", 4, 32, 128, 1, True, False, True),
]


def signature(value_type: str) -> dict:
    sig = {}
    for p in km._maxsim_kernel.fn.params:
        if p.is_constexpr:
            sig[p.name] = "constexpr"
        elif p.name in ("q_ptr", "x_ptr"):
            sig[p.name] = "*" + value_type
        elif p.name == "out_ptr":
            sig[p.name] = "*fp32"
        elif p.name.endswith("_ptr"):
            sig[p.name] = "*i64"
        else:
            sig[p.name] = "i32"
    return sig


def main() -> int:
    for arch in (90, 80):
        for name, vt, g, lqp, bk, nk, even, cand, ieee in SPECS:
            constexprs = dict(G=g, LQP=lqp, BLOCK_K=bk, NUM_K=nk, EVEN_K=even, CANDIDATES=cand, IEEE=ieee,
                              UPCAST=False, BLOCK_N=64)
            row = {"arch": arch, "spec": name, "rows": g * lqp, "value_type": vt}
            try:
                src = ASTSource(fn=km._maxsim_kernel.fn, signature=signature(vt), constexprs=constexprs)
                k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": 8, "num_stages": 3})
                ptx = k.asm["ptx"]
                row.update(ok=".entry _maxsim_kernel" in ptx, wgmma="wgmma" in ptx, shared=k.metadata.shared)
            except Exception as exc:  # report every failure, keep going
                row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:500])
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
