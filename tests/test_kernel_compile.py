"""The Triton kernels compile for real GPUs (Hopper sm_90, Ampere sm_80) without one, as the JIT
compiles them, and the compiled code has the properties the speed targets need.

The interpreter checks numerics but not lowering. tests/compile_kernels.py (a process without
TRITON_INTERPRET) compiles every kept autotune config and the odd specialisations the
launchers produce, with the JIT's own specialisation of 16-byte-aligned arguments; here we
assert on what ptxas and the PTX say.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
SCRIPT = Path(__file__).with_name("compile_kernels.py")


@pytest.fixture(scope="module")
def compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--ci"], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if rows and all("ptxas" in r.get("error", "") for r in rows):
        pytest.skip("this Triton build has no ptxas")
    return rows


def kept_rows(compiled):
    from colgraph_engine.kernels import maxsim as km
    kept = {(rows, *c) for rows, cs in km.KEPT.items() for c in cs}
    return [r for r in compiled if (r["rows"], r["BLOCK_N"], r["num_warps"], r["num_stages"]) in kept
            and r["dtype"] == "bf16" and r["d"] == 128 and r["pieces"] == 1]


def test_every_specialisation_compiles(compiled):
    assert len(compiled) >= 30
    failed = [r for r in compiled if not r["ok"]]
    assert not failed, failed


def test_the_jit_specialisation_marks_pointers_and_strides_divisible(compiled):
    # Aligned pointers get tt.divisibility = 16 (as in a real launch); per-call sizes do not
    # specialise (do_not_specialize), so they never make a kernel of their own.
    for r in compiled:
        assert {"q_ptr", "x_ptr", "x_offsets_ptr"} <= set(r["divisible_args"]), r
        assert not {"n_queries", "n_docs", "n_groups", "n_pieces", "out_row_stride", "n_items_ptr"} \
            & set(r["divisible_args"]), r


def test_no_config_spills_and_each_keeps_two_programs_per_sm(compiled):
    bad = [(r["arch"], r["kernel"], r["dtype"], r["d"], r["rows"], r["regs"], r["spill_bytes"], r["programs_per_sm"])
           for r in compiled if r["spill_bytes"] or r["programs_per_sm"] < 2]
    assert not bad, bad


def test_document_tiles_are_copied_with_16_byte_cp_async(compiled):
    for r in compiled:
        if r["d"] * {"bf16": 2, "fp16": 2, "fp32": 4}[r["dtype"]] % 16 == 0:  # 16-byte rows
            assert r["cp_async_16B"] > 0 and r["ld_b16_scalar"] == 0, r
    assert kept_rows(compiled), "no kept config compiled"


def test_hopper_uses_wgmma_for_tiles_of_64_rows_or_more(compiled):
    for r in compiled:
        if r["arch"] == 90 and r["dtype"] != "fp32" and r["rows"] >= 64:
            assert r["mma"] == "wgmma", r  # wgmma, not the older mma.sync path
        if r["arch"] == 80 and r["dtype"] != "fp32":
            assert r["mma"] == "mma.sync", r


def test_the_streaming_loop_keeps_tiles_in_flight(compiled):
    # The cross kernel streams all of a program's documents in one pipelined loop: when it waits
    # for a tile, later tiles (possibly of the next document) are already being copied.
    for r in compiled:
        if r["num_stages"] >= 3:
            assert r["prefetch"] == r["num_stages"] - 2, r


@pytest.mark.parametrize("d,g,lqp,ieee", [(128, 1, 32, False), (128, 8, 32, False), (128, 4, 32, False),
                                          (200, 2, 32, False), (128, 1, 32, True)])
def test_autotune_tries_only_the_kept_configs_of_a_tile_height(monkeypatch, d, g, lqp, ieee):
    """What the autotuner benchmarks on a GPU: KEPT[rows] (WIDE for wide rows), never more than two,
    so a store's shapes compile a handful of kernels."""
    from colgraph_engine.kernels import maxsim as km
    monkeypatch.setattr(km, "INTERPRET", False)
    every = km._configs()
    got = km._prune_configs(every, {}, D=d, G=g, LQP=lqp, IEEE=ieee)
    want = (km.WIDE,) if d > 128 or ieee else km.KEPT[g * lqp]
    assert sorted((c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in got) == sorted(want)
    assert len(got) <= 2
