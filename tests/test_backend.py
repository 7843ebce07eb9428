"""Backend resolution: explicit choices run or raise with the reason; automatic ones fall back."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import colgraph_engine as cg
from colgraph_engine import backend

from .conftest import NATIVE, random_packed


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "COLGRAPH_BACKEND")}
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=300)


@NATIVE
def test_auto_picks_native_on_cpu(monkeypatch):
    monkeypatch.delenv("COLGRAPH_BACKEND", raising=False)
    assert backend.resolve("maxsim", torch.device("cpu")) == "native"


def test_environment_override(monkeypatch):
    monkeypatch.setenv("COLGRAPH_BACKEND", "torch")
    assert backend.resolve("maxsim", torch.device("cpu")) == "torch"
    monkeypatch.setenv("COLGRAPH_BACKEND", "gpu-please")
    with pytest.raises(ValueError, match="COLGRAPH_BACKEND"):
        backend.resolve("maxsim", torch.device("cpu"))


def test_explicit_backend_that_cannot_run_raises_with_reason():
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    with pytest.raises(ValueError, match="native.*CPU tensors"):
        backend.resolve("maxsim", torch.device("meta"), "native")
    proc = run_python("""
        import torch, colgraph_engine as cg
        v, o = cg.pack([torch.randn(2, 4)])
        try:
            cg.maxsim(v, o, v, o, backend="triton")
        except ValueError as e:
            print("ERR", e)
    """)
    assert "ERR backend 'triton' cannot run maxsim" in proc.stdout and "CUDA" in proc.stdout, proc.stderr


def test_disabled_native_falls_back_to_torch_and_says_why():
    proc = run_python("""
        import torch, colgraph_engine as cg
        v, o = cg.pack([torch.randn(3, 8), torch.randn(5, 8)])
        s = cg.maxsim(v, o, v, o)
        info = cg.backends()
        print("NATIVE", info["native"], info["native_reason"])
        print("SHAPE", tuple(s.shape))
    """, COLGRAPH_DISABLE_NATIVE="1")
    assert "NATIVE False disabled by COLGRAPH_DISABLE_NATIVE" in proc.stdout, proc.stderr
    assert "SHAPE (2, 2)" in proc.stdout
    assert "falls back to the torch reference" in proc.stderr  # logged once, with the reason


@NATIVE
def test_backends_agree_on_the_same_input():
    qv, qo = random_packed([5, 32], 48, seed=3)
    xv, xo = random_packed([1, 70, 12], 48, seed=4)
    a = cg.maxsim(qv, qo, xv, xo, backend="native")
    b = cg.maxsim(qv, qo, xv, xo, backend="torch")
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)
