"""Compiles the Triton MaxSim kernels ahead of time for real GPUs, without one, as the JIT would.

The JIT specialises every launch on its arguments: a pointer whose address is a multiple of 16,
and an int divisible by 16 (a row stride of 128, d = 80), get ``tt.divisibility = 16``; an int
equal to 1 becomes a constant unless the kernel lists it in ``do_not_specialize``. Those
attributes decide whether loads become 16-byte vectors. So this script does not write a
signature by hand: it runs Triton's own binder (``create_function_from_signature`` and
``JITFunction._pack_args``, the code ``JITFunction.run`` calls) on stand-in arguments with
16-byte-aligned addresses and the sizes a launcher passes, and compiles what it returns.

Per compiled kernel it records, from ptxas (``-v``) and the PTX: registers, spill bytes, shared
memory, resident programs per SM (registers, shared memory and warp slots of the target),
the MMA instruction kind (wgmma / mma.sync / none), and the 16-byte ``cp.async`` copies.

    python tests/compile_kernels.py --ci          # the kept configs + odd specialisations (CI)
    python tests/compile_kernels.py --sweep       # every candidate config; writes the table

Prints one JSON line per compile. ``--sweep`` also writes benchmarks/results/kernel_compile.md
and kernel_compile.json. Run without TRITON_INTERPRET.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import time
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    raise SystemExit("compile_kernels.py: run without TRITON_INTERPRET=1 (the interpreter compiles nothing)")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from colgraph_engine.kernels import maxsim as km  # noqa: E402

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
# Per-SM resources: registers, shared memory usable by resident blocks, warp slots. H100/H200
# (sm_90): 64K registers, 228 KB shared; A100 (sm_80): 64K registers, 164 KB shared. Each
# resident block also reserves 1 KB of shared memory; registers are allocated per warp in
# units of 256.
SM = {90: dict(regs=65536, smem=228 * 1024, warps=64, blocks=32),
      80: dict(regs=65536, smem=164 * 1024, warps=64, blocks=32)}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class DeviceArg:
    """Stands in for a tensor argument: what the JIT's specialisation reads (dtype, address)."""

    def __init__(self, dtype: torch.dtype, address: int = 1 << 21):
        self.dtype, self._address = dtype, address

    def data_ptr(self) -> int:
        return self._address


def launch_args(kernel: str, vt: str, d: int, g: int, lqp: int, pieces: int):
    """Positional arguments as the launcher passes them (values chosen like a real call)."""
    v, i64, f32 = DeviceArg(DTYPES[vt]), DeviceArg(torch.int64), DeviceArg(torch.float32)
    if kernel == "cross":
        # q, q_off, n_queries, x, x_off, n_docs, out, out_stride, n_groups, n_pieces
        return (v, i64, 32, v, i64, 8192, f32, 8192, 4, pieces)
    # q, q_off, x, x_off, out, pair_doc, pair_query, pair_slot, item_start, n_items, n_pieces
    return (v, i64, v, i64, f32, i64, i64, i64, i64, i64, pieces)


def compile_one(arch: int, kernel: str, vt: str, d: int, g: int, lqp: int, pieces: int,
                block_n: int, warps: int, stages: int) -> dict:
    fn = (km._cross_kernel if kernel == "cross" else km._candidates_kernel).fn
    g_, lqp_, pieces_, block_k, num_k, even_k = km.tile_plan(lqp * pieces, g, d, g * lqp, vt == "fp32")
    row = dict(arch=arch, kernel=kernel, dtype=vt, d=d, G=g, LQP=lqp, rows=g * lqp, pieces=pieces,
               BLOCK_N=block_n, num_warps=warps, num_stages=stages, BLOCK_K=block_k, NUM_K=num_k)
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kw = dict(D=d, G=g, LQP=lqp, BLOCK_N=block_n, BLOCK_K=block_k, NUM_K=num_k, EVEN_K=even_k, IEEE=vt == "fp32",
              UPCAST=False, PIECED=pieces > 1, num_warps=warps, num_stages=stages)
    t = time.time()
    try:
        bound, spec, opts = binder(*launch_args(kernel, vt, d, g, lqp, pieces), **kw)
        options, signature, constexprs, attrs = fn._pack_args(backend, kw, bound, spec, opts)
        log = io.StringIO()
        triton.knobs.nvidia.dump_ptxas_log = True  # ptxas -v output, printed by Triton
        triton.knobs.compilation.always_compile = True  # a cache hit would skip ptxas and its log
        with contextlib.redirect_stdout(log):
            k = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)
    except Exception as exc:  # report every failure, keep going
        row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:600])
        return row
    finally:
        triton.knobs.nvidia.dump_ptxas_log = False
    ptx, text = k.asm["ptx"], log.getvalue()
    regs = int(re.search(r"Used (\d+) registers", text).group(1))
    spill = sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", text))
    shared = int(k.metadata.shared)
    res = SM[arch]
    per_warp = -(-regs * 32 // 256) * 256
    programs = min(res["regs"] // per_warp // warps, res["smem"] // (shared + 1024), res["warps"] // warps,
                   res["blocks"])
    mma = "wgmma" if "wgmma.mma_async" in ptx else "mma.sync" if "mma.sync" in ptx else "fma"
    row.update(ok=f".entry _{kernel}_kernel" in ptx, regs=regs, spill_bytes=spill, shared=shared,
               programs_per_sm=programs, mma=mma,
               cp_async_16B=len(re.findall(r"cp\.async\.cg\.shared\.global[^;]*, 0x10", ptx)),
               cp_async_small=len(re.findall(r"cp\.async\.ca\.shared\.global[^;]*, 0x0?[1-8],", ptx)),
               tma=ptx.count("cp.async.bulk.tensor"),
               # copies still in flight when the loop waits for a tile: num_stages - 2 when the loop is
               # pipelined (with 2 stages the next copy is issued just after the wait)
               prefetch=max((int(n) for n in re.findall(r"ttg\.async_wait [^\n]*\{num = (\d+)", k.asm["ttgir"])),
                            default=0), ld_b16_scalar=len(re.findall(r"ld\.global[^ ]*\.b16 ", ptx)),
               divisible_args=sorted(signature_name(fn, p) for p, a in attrs.items() if ["tt.divisibility", 16] in a),
               compile_s=round(time.time() - t, 2))
    return row


def signature_name(fn, path) -> str:
    return fn.arg_names[path[0]]


def kept_configs():
    for rows, kept in km.KEPT.items():
        for block_n, warps, stages in kept:
            yield rows, block_n, warps, stages


def ci_specs():
    """(kernel, dtype, d, G, LQP, pieces, BLOCK_N, warps, stages): every kept config on the
    kernel that uses it, plus the odd specialisations the launchers produce."""
    shapes = {16: (1, 16), 32: (1, 32), 64: (2, 32), 128: (4, 32), 256: (8, 32)}
    for rows, block_n, warps, stages in kept_configs():
        g, lqp = shapes[rows]
        yield "cross", "bf16", 128, g, lqp, 1, block_n, warps, stages
        yield "candidates", "bf16", 128, g, lqp, 1, block_n, warps, stages
    yield "cross", "fp16", 80, 8, 16, 1, *km.KEPT[128][0]     # d = 80: masked columns
    yield "candidates", "bf16", 200, 2, 32, 1, *km.WIDE         # d = 200: BLOCK_K 256, masked
    yield "cross", "bf16", 300, 1, 64, 4, *km.WIDE             # d = 300: 3 column chunks; a 200-token query, 4 pieces
    yield "candidates", "bf16", 128, 1, 128, 2, *km.KEPT[128][0]  # pieced candidates
    yield "cross", "fp32", 128, 1, 32, 1, *km.WIDE             # fp32 (exact FMA products, FP32_ROWS = 32)
    yield "candidates", "fp32", 128, 1, 32, 2, *km.WIDE            # fp32, a 33..64-token query in 2 pieces


def sweep_specs():
    shapes = {16: (1, 16), 32: (1, 32), 64: (2, 32), 128: (4, 32), 256: (8, 32)}
    for rows, (g, lqp) in shapes.items():
        for block_n in (32, 64, 128):
            for warps in (4, 8):
                for stages in (2, 3, 4):
                    yield "cross", "bf16", 128, g, lqp, 1, block_n, warps, stages


def write_table(rows: list[dict], ci_rows: list[dict]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    kept = {(r, bn, w, s) for r, bn, w, s in kept_configs()}
    lines = ["# Triton MaxSim kernels compiled for sm_90 and sm_80 (no GPU)", "",
             f"Triton {triton.__version__}; JIT specialisation of 16-byte-aligned arguments (see "
             "tests/compile_kernels.py); bf16, d = 128, cross kernel. `kept`: in kernels/maxsim.py KEPT "
             "(no spills and >= 2 resident programs per SM on both architectures; at most two per tile height). "
             "`cp.async 16B`: 16-byte asynchronous copies to shared memory in the PTX (document tiles).", "",
             "| arch | rows (G x LQP) | BLOCK_N | warps | stages | regs | spill B | shared KB | programs/SM | MMA | cp.async 16B | kept |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r.get("ok"):
            lines.append(f"| sm_{r['arch']} | {r['rows']} ({r['G']}x{r['LQP']}) | {r['BLOCK_N']} | {r['num_warps']} | "
                         f"{r['num_stages']} | error: {r.get('error', '')[:80]} |||||||")
            continue
        k = (r["rows"], r["BLOCK_N"], r["num_warps"], r["num_stages"]) in kept
        lines.append(f"| sm_{r['arch']} | {r['rows']} ({r['G']}x{r['LQP']}) | {r['BLOCK_N']} | {r['num_warps']} | "
                     f"{r['num_stages']} | {r['regs']} | {r['spill_bytes']} | {r['shared'] / 1024:.0f} | "
                     f"{r['programs_per_sm']} | {r['mma']} | {r['cp_async_16B']} | {'**kept**' if k else ''} |")
    lines += ["", "## What the launchers compile (the CI set: kept configs on both kernels, odd shapes)", "",
              "| arch | kernel | dtype | d | rows | pieces | BLOCK_N/warps/stages | regs | spill B | shared KB | "
              "programs/SM | MMA | cp.async 16B | cp.async < 16B |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in ci_rows:
        lines.append(f"| sm_{r['arch']} | {r['kernel']} | {r['dtype']} | {r['d']} | {r['rows']} | {r['pieces']} | "
                     f"{r['BLOCK_N']}/{r['num_warps']}/{r['num_stages']} | {r.get('regs')} | {r.get('spill_bytes')} | "
                     f"{r.get('shared', 0) / 1024:.0f} | {r.get('programs_per_sm')} | {r.get('mma')} | "
                     f"{r.get('cp_async_16B')} | {r.get('cp_async_small')} |")
    (RESULTS / "kernel_compile.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "kernel_compile.json").write_text(json.dumps({"sweep": rows, "ci": ci_rows}, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true", help="every candidate config; writes the table")
    ap.add_argument("--ci", action="store_true", help="kept configs and odd specialisations (default)")
    args = ap.parse_args()
    sets = {"ci": list(ci_specs())}
    if args.sweep:
        sets["sweep"] = list(sweep_specs())
    out = {}
    for name, specs in sets.items():
        out[name] = []
        for arch in (90, 80):
            for spec in specs:
                row = compile_one(arch, *spec)
                out[name].append(row)
                print(json.dumps(row), flush=True)
    if args.sweep:
        write_table(out["sweep"], out["ci"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
