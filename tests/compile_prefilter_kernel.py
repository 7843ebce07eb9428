"""Compiles the prefilter's fused decode-and-score kernel and the dense stages' centroid-interaction
kernel (kernels/prefilter.py) for sm_90 and
sm_80 without a GPU, with the JIT's own argument specialisation (as tests/compile_kernels.py
does for the MaxSim kernels), and prints one JSON line per compile: registers, spills, shared
memory, MMA kind. Run without TRITON_INTERPRET."""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys

if os.environ.get("TRITON_INTERPRET") == "1":
    raise SystemExit("compile_prefilter_kernel.py: run without TRITON_INTERPRET=1")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from compile_kernels import DeviceArg  # noqa: E402

from colgraph_engine.kernels import prefilter as kp  # noqa: E402


def _compile(fn, arch: int, args: tuple, kw: dict, row: dict) -> dict:
    """Compiles JITFunction `fn` for sm_`arch` with the JIT's own argument specialisation and
    adds to `row`: ok, registers, spill bytes, shared memory and the MMA kind (or the error)."""
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    try:
        bound, spec, opts = binder(*args, **kw)
        options, signature, constexprs, attrs = fn._pack_args(backend, kw, bound, spec, opts)
        log = io.StringIO()
        triton.knobs.nvidia.dump_ptxas_log = True
        triton.knobs.compilation.always_compile = True
        with contextlib.redirect_stdout(log):
            k = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)
    except Exception as exc:  # report every failure
        row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:600])
        return row
    finally:
        triton.knobs.nvidia.dump_ptxas_log = False
    ptx, text = k.asm["ptx"], log.getvalue()
    regs = re.search(r"Used (\d+) registers", text)
    row.update(ok=f".entry {fn.__name__}" in ptx, regs=int(regs.group(1)) if regs else None,
               spill_bytes=sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", text)),
               shared=int(k.metadata.shared),
               mma="wgmma" if "wgmma.mma_async" in ptx else "mma.sync" if "mma.sync" in ptx else "fma")
    return row


def compile_one(arch: int, d: int, nbits: int, code_dtype: torch.dtype) -> dict:
    """The fused decode-and-score kernel (a JITFunction, no autotuner around it)."""
    bm, bn, bd = kp.block_sizes(d)
    row = dict(arch=arch, d=d, nbits=nbits, codes=str(code_dtype).split(".")[-1], BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd)
    f32, i64, u8 = DeviceArg(torch.float32), DeviceArg(torch.int64), DeviceArg(torch.uint8)
    args = (f32, i64, f32, f32, DeviceArg(code_dtype), u8, i64, i64, i64, f32)
    kw = dict(D=d, W=d * nbits // 8, NBITS=nbits, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd, HALF=True, UNIT=True,
              num_warps=kp.NUM_WARPS, num_stages=kp.NUM_STAGES)
    return _compile(kp._pairs_kernel, arch, args, kw, row)


def compile_interaction(arch: int, L: int = 32) -> dict:
    """The dense stages' centroid-interaction kernel (one program per document), same report."""
    block_l = max(16, triton.next_power_of_2(L))
    row = dict(kernel="_interaction_kernel", arch=arch, L=L, BLOCK_L=block_l)
    f32, i64, i32, u8 = (DeviceArg(t) for t in (torch.float32, torch.int64, torch.int32, torch.uint8))
    return _compile(kp._interaction_kernel, arch, (f32, u8, u8, i32, i64, f32, f32, i32, L),
                    dict(BLOCK_L=block_l, num_warps=1), row)

if __name__ == "__main__":
    failed = 0
    one = "--one" in sys.argv  # CI: sm_90, d = 128, 2 bits only
    for arch in (90,) if one else (90, 80):
        for d, nbits, cd in ((128, 2, torch.int16),) if one else (
                (128, 2, torch.int16), (128, 4, torch.int32), (128, 1, torch.int16), (96, 2, torch.int16)):
            r = compile_one(arch, d, nbits, cd)
            failed += not r.get("ok")
            print(json.dumps(r), flush=True)
        for L in (32,) if one else (32, 1, 100):
            r = compile_interaction(arch, L)
            failed += not r.get("ok")
            print(json.dumps(r), flush=True)
    sys.exit(1 if failed else 0)
