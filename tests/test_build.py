"""The package installs with its native module, linked to the real igraph C library."""
import re

import torch

import colgraph_engine as cg
from colgraph_engine import _native

from .conftest import NATIVE


@NATIVE
def test_native_module_links_igraph():
    core = _native.core
    assert re.match(r"^\d+\.\d+", core.igraph_version())
    assert core.igraph_self_test() == 2  # a 3-vertex path built through igraph has 2 edges


@NATIVE
def test_cpu_kernel_isa_is_reported():
    assert _native.core.cpu_kernel_isa("float32") in {"avx512f", "avx2", "portable"}
    assert _native.core.cpu_kernel_isa("bfloat16") in {"avx512bf16", "avx512f", "avx2", "portable"}


def test_backends_report_explains_absences():
    info = cg.backends()
    assert isinstance(info["native"], bool)
    if not info["native"]:
        assert info["native_reason"]
    if not torch.cuda.is_available() and not info["triton_interpreter"]:
        assert "CUDA" in info["triton_reason"]


def test_kernels_ship_inside_the_package():
    from colgraph_engine.kernels import maxsim as km
    assert callable(km.maxsim_cross) and callable(km.maxsim_candidates)
