"""Shared test set-up.

Triton kernels run under the interpreter on CPU tensors here (no GPU in CI). The variable must
be set before triton is imported, hence at the top of conftest. On a CUDA machine the real
kernels are tested instead.
"""
import importlib.util
import os
import pathlib
import sys

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

import colgraph_engine as cg  # noqa: E402
from colgraph_engine import _native, _triton  # noqa: E402
from colgraph_engine._kernels_name import load_installed_kernels  # noqa: E402

# `python -m pytest` puts the checkout's root first on sys.path, where our kernels/ would hide the
# installed `kernels` package that transformers imports (tests import transformers directly).
load_installed_kernels()

NATIVE = pytest.mark.skipif(not _native.available(), reason=f"native module unavailable: {_native.reason_unavailable}")
TRITON = pytest.mark.skipif(_triton.why_not(torch.device("cuda" if torch.cuda.is_available() else "cpu")) is not None,
                            reason="Triton cannot run here")
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def random_packed(lengths, d, dtype=torch.float32, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    items = [torch.randn(n, d, generator=g) for n in lengths]
    v, o = cg.pack(items, dtype=dtype)
    return v.to(device), o.to(device)


def assert_scores_match(got, ref64, torch_same_dtype, what=""):
    """Yardstick: error vs the fp64 reference may be at most about twice the error that torch
    makes computing the same thing in the input dtype (plus a floor for exact cases)."""
    got64 = got.double().cpu()
    ref64 = ref64.double().cpu()
    inf = torch.isinf(ref64)
    assert torch.equal(torch.isinf(got64), inf), f"{what}: -inf pattern differs (empty documents)"
    assert torch.equal(got64[inf], ref64[inf]), f"{what}: infinite scores differ"
    assert not torch.isnan(got64).any(), f"{what}: NaN in output (unwritten element?)"
    fin = ~inf
    err = (got64[fin] - ref64[fin]).abs().max().item() if fin.any() else 0.0
    base = (torch_same_dtype.double().cpu()[fin] - ref64[fin]).abs().max().item() if fin.any() else 0.0
    scale = ref64[fin].abs().max().item() if fin.any() else 1.0
    tol = 2.0 * base + 1e-6 * max(1.0, scale)
    assert err <= tol, f"{what}: max error {err:.3g} exceeds yardstick {tol:.3g} (torch in dtype: {base:.3g})"


def recall_benchmark():
    """``benchmarks/recall_default.py`` as a module (its topic corpora, exact top-k and measure)."""
    if "recall_default" in sys.modules:
        return sys.modules["recall_default"]
    bench = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location("recall_default", bench / "recall_default.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["recall_default"] = mod  # its dataclass looks its module up
    spec.loader.exec_module(mod)
    return mod
