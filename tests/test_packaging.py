"""A built wheel carries the native module and the Triton kernels, and imports on its own."""
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    pytest.importorskip("scikit_build_core")
    if shutil.which("cmake") is None:
        pytest.skip("cmake not installed")
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation",
                           "-w", str(out), "-q", "--config-settings=build-dir=" + str(out / "build")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = out.glob("colgraph_engine-*.whl")
    return whl


def test_wheel_contents(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("colgraph_engine/_core") and n.endswith(".so") for n in names)
    for needed in ("colgraph_engine/kernels/maxsim.py", "colgraph_engine/ops/scoring.py", "colgraph_engine/store/packed_store.py"):
        assert needed in names
    assert not any(n.startswith(("tests/", "benchmarks/", "kernels/")) for n in names)


def test_installed_wheel_imports_without_the_source_tree(wheel, tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    code = textwrap.dedent("""
        import sys
        # hide the editable install of the source tree so only the wheel can answer
        sys.meta_path = [f for f in sys.meta_path if "ScikitBuild" not in type(f).__name__]
        import torch, colgraph_engine as cg
        from colgraph_engine.kernels import maxsim as km
        v, o = cg.pack([torch.randn(3, 8), torch.randn(2, 8)])
        print(cg.__file__)
        print("native", cg.backends()["native"], cg.maxsim(v, o, v, o).shape)
    """)
    env = dict(os.environ, PYTHONPATH=str(site))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert str(site) in run.stdout and "native True torch.Size([2, 2])" in run.stdout
