"""benchmarks/_harness.py, the reproducers' part: child processes answer one JSON line, another
checkout is imported through PYTHONPATH with the editable install's redirection off, and the
blank PDF and line panels come out whole."""
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import _harness as h  # noqa: E402


def test_timed_returns_the_value_and_the_seconds():
    value, seconds = h.timed(lambda a, b=0: a + b, 2, b=3)
    assert value == 5 and 0 <= seconds < 5


def test_run_json_reads_the_last_line_and_names_a_dead_child():
    assert h.run_json([sys.executable, "-c", "print('noise'); print('{\"a\": 1}')"]) == {"a": 1}
    with pytest.raises(h.ChildFailed) as err:
        h.run_json([sys.executable, "-c", "import sys; sys.stderr.write('boom'); sys.exit(3)"])
    assert err.value.rc == 3 and "boom" in err.value.stderr


def test_checkout_env_leaves_this_checkout_alone_and_points_at_another(tmp_path):
    assert h.checkout_env(None, X="1") == dict(os.environ, X="1")
    assert h.checkout_env(h.ROOT).get("PYTHONPATH") == os.environ.get("PYTHONPATH")
    env = h.checkout_env(tmp_path)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path)


def test_proc_memory_helpers_read_this_process():
    assert h.proc_bytes("VmRSS") > 0 or not Path("/proc/self/status").exists()
    assert h.reset_peak() in (True, False)


def test_blank_pdf_has_the_pages_asked_for(tmp_path):
    pdfium = pytest.importorskip("pypdfium2")
    size = h.blank_pdf(tmp_path / "b.pdf", 3)
    assert size == (tmp_path / "b.pdf").stat().st_size > 0
    assert len(pdfium.PdfDocument(tmp_path / "b.pdf")) == 3


def test_line_panels_writes_one_figure(tmp_path):
    pytest.importorskip("matplotlib")
    note = h.line_panels(tmp_path / "p.png", [1, 10, 100],
                         {"a": {"ylabel": "ms", "series": {"x": [1, 2, 3]}},
                          "b": {"ylabel": "bytes", "log_y": True, "series": {"y": [10, 100, 1000]}}},
                         xlabel="n", styles={"x": ("o:", "tab:gray")})
    assert note is None and (tmp_path / "p.png").stat().st_size > 0


def test_free_port_can_be_bound():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", h.free_port()))
