"""benchmarks/_colsearch.py: the optional colsearch peer adapter imports only the standard library,
refuses bad input with errors that name the argument, and reports why colsearch is absent.
(Building a colsearch index takes minutes on this machine: the measured runs live in
benchmarks/prefilter_report.py, not here.)"""
import importlib.util
import pathlib
import subprocess
import sys

import pytest
import torch

ADAPTER = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "_colsearch.py"


def _adapter():
    spec = importlib.util.spec_from_file_location("_colsearch_under_test", ADAPTER)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_import_pulls_in_only_the_standard_library():
    loaded = _run(
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('a', {str(ADAPTER)!r})\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['a'] = m; spec.loader.exec_module(m)\n"
        "print(sorted(x for x in ('numpy', 'torch', 'colsearch', 'faiss') if x in sys.modules))")
    assert loaded == "[]"


def test_load_reports_why_when_colsearch_is_absent():
    got = _run(
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('a', {str(ADAPTER)!r})\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['a'] = m; spec.loader.exec_module(m)\n"
        "sys.modules['colsearch'] = None\n"
        "mod, ver, why = m.load(None)\n"
        "print(mod is None, ver is None, why.split(':')[0])")
    assert got == "True True ModuleNotFoundError"


@pytest.mark.parametrize("kwargs, error, word", [
    (dict(lane="int4"), ValueError, "lane"),
    (dict(device="tpu"), ValueError, "device"),
])
def test_build_refuses_bad_settings(kwargs, error, word):
    cs = _adapter()
    values, offsets = torch.randn(6, 8), torch.tensor([0, 2, 6])
    with pytest.raises(error, match=word):
        cs.build(values, offsets, **kwargs)


@pytest.mark.parametrize("values, offsets, error, word", [
    ([[0.0] * 8], torch.tensor([0, 1]), TypeError, "values"),
    (torch.randn(6, 8), [0, 6], TypeError, "offsets"),
    (torch.randn(6, 8), torch.tensor([0, 2, 5]), ValueError, "offsets"),
    (torch.randn(6, 8), torch.tensor([0, 2, 2, 6]), ValueError, "empty"),
])
def test_build_refuses_bad_packed_input(values, offsets, error, word):
    cs = _adapter()
    with pytest.raises(error, match=word):
        cs.build(values, offsets)


def test_search_refuses_bad_k_and_query_shape():
    cs = _adapter()
    with pytest.raises(ValueError, match="k"):
        cs.search(None, torch.randn(2, 4, 8), k=0)
    with pytest.raises(TypeError, match="queries"):
        cs.search(None, torch.randn(4, 8), k=10)


def test_vector_bytes_reads_safetensors_headers(tmp_path):
    """fp16 rows count for the fp16 lane, only rroq158_* code tensors for the rroq158 lane."""
    import json
    import struct
    header = {"embeddings": {"dtype": "F16", "shape": [10, 128], "data_offsets": [0, 2560]},
              "rroq158_sign_plane": {"dtype": "U8", "shape": [10, 16], "data_offsets": [2560, 2720]},
              "rroq158_centroid_id": {"dtype": "I32", "shape": [10], "data_offsets": [2720, 2760]},
              "__metadata__": {"format": "np"}}
    raw = json.dumps(header).encode()
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "shard_0.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(2760))
    cs = _adapter()
    assert cs._vector_bytes(str(tmp_path), "fp16") == 2560
    assert cs._vector_bytes(str(tmp_path), "rroq158") == 160 + 40
