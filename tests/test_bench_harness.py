"""benchmarks/_harness.py, the one harness the benchmarks are declared over: reference checks
raise before anything is timed, pairing interleaves rows, ratios and reports come out whole.
(No speed is asserted: only what was called, in which order, and what was written.)"""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import _harness as h  # noqa: E402


def test_checks_accept_equal_and_reject_wrong_results():
    assert h.equal("row", torch.ones(3, dtype=torch.bfloat16), torch.ones(3, dtype=torch.bfloat16)) == 0.0
    assert h.equal("row", np.arange(4), np.arange(4)) == 0.0
    with pytest.raises(h.CorrectnessError, match="row"):
        h.equal("row", torch.ones(3), torch.zeros(3))
    with pytest.raises(h.CorrectnessError, match="row"):
        h.equal("row", torch.ones(3), torch.ones(4))
    assert h.close(1e-3)("row", torch.ones(2), torch.ones(2) + 1e-4) == pytest.approx(1e-4, rel=1e-2)
    with pytest.raises(h.CorrectnessError, match="exceeds"):
        h.close(1e-6)("row", (torch.ones(2),), (torch.ones(2) + 1e-4,))
    with pytest.raises(h.CorrectnessError, match="shape"):
        h.close(1.0)("row", np.zeros(2), np.zeros(3))


def test_paired_interleaves_and_rotates_the_order():
    calls = []
    fns = {n: (lambda n=n: calls.append(n)) for n in "abc"}
    secs = h.paired(fns, 3, warmup=1)
    assert {n: len(v) for n, v in secs.items()} == {"a": 3, "b": 3, "c": 3}
    assert calls[:3] == ["a", "b", "c"]          # the warm-up round
    assert calls[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_compare_checks_every_row_before_timing_any():
    timed = []

    def build(tag, wrong=False):
        def make(x):
            def fn():
                timed.append(tag)
                return x + 1 if wrong else x
            return fn
        return make
    with pytest.raises(h.CorrectnessError, match="bad"):
        h.compare({"w": lambda: np.arange(3)}, {"good": build("good"), "bad": build("bad", wrong=True)},
                  reference=lambda x: x, check=h.equal, progress=False)
    assert timed == ["good", "bad"]  # one checking call each, no timed calls


def test_compare_rows_ratios_and_skips():
    rows = h.compare({"w1": lambda: 1, "w2": lambda: 2}, {"ours": lambda x: (lambda: x), "peer": lambda x: (lambda: x),
                                                         "absent": lambda x: (lambda: x)},
                     reference=lambda x: x, check=h.equal, baseline="peer", repeats=2, progress=False,
                     skip=lambda n: "not installed" if n == "absent" else None)
    assert [(r["workload"], r["impl"], r["status"]) for r in rows] == [
        ("w1", "ours", "ok"), ("w1", "peer", "ok"), ("w1", "absent", "skipped: not installed"),
        ("w2", "ours", "ok"), ("w2", "peer", "ok"), ("w2", "absent", "skipped: not installed")]
    for r in rows:
        if r["status"] == "ok":
            assert len(r["ms_all"]) == 2 and r["ms_min"] <= r["ms_median"]
            assert r["ratio"] == pytest.approx(next(p["ms_median"] for p in rows if p["impl"] == "peer"
                                                    and p["workload"] == r["workload"]) / r["ms_median"])
        else:
            assert "ratio" not in r


def test_write_gives_markdown_with_header_and_json(tmp_path):
    table = h.table([("row", "impl"), ("ms:", lambda r: f"{r['ms']:.1f}")], [{"impl": "ours", "ms": 1.25}])
    assert table == ["| row | ms |", "|---|---:|", "| ours | 1.2 |"]
    e = h.env(peer_version="9.9")
    out = h.write("demo", "Demo", ["body line", *table], {"rows": [1, 2]}, tmp_path, e=e, command="python x.py",
                  echo=False)
    md = (out / "demo.md").read_text()
    assert md.startswith("# Demo\n") and "commit " in md and "load average" in md and "threads: torch" in md
    assert "`python x.py`" in md and md.rstrip().endswith("| ours | 1.2 |")
    data = json.loads((out / "demo.json").read_text())
    assert data["rows"] == [1, 2] and data["command"] == "python x.py" and data["env"]["peer_version"] == "9.9"
    assert h.write("demo", "Demo", [], {}, None, e=e, echo=False) is None


def test_stem_and_percentile():
    class A:
        quick = True
    assert h.stem("x", A()) == "x_quick" and h.stem("x", object()) == "x"
    assert h.percentile([5, 1, 4, 2, 3], 50) == 3 and h.percentile([1, 2, 3], 99) == 3 and h.percentile([7], 0) == 7


def test_wait_idle_waits_out_work_a_process_does_after_answering():
    """A child that answers, then burns ~150 ms of CPU: wait_idle returns only after the burn
    (its CPU counted), and at once for a child that sleeps."""
    import subprocess
    code = ("import sys, time\n"
            "for line in sys.stdin:\n"
            "    print('ok', flush=True)\n"
            "    if line.strip() == 'burn':\n"
            "        t = time.process_time()\n"
            "        while time.process_time() - t < 0.15: pass\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        for ask in ("rest", "burn"):
            p.stdin.write(ask + "\n")
            p.stdin.flush()
            assert p.stdout.readline().strip() == "ok"
            waited, cpu = h.wait_idle(p.pid, max_s=5.0)
            if ask == "burn":
                assert cpu >= 0.1 and waited >= 0.1, (waited, cpu)
            else:
                assert cpu < 0.05 and waited < 1.0, (waited, cpu)
        assert h.cpu_seconds(p.pid) > 0.1
    finally:
        p.stdin.close()
        p.wait(10)
    assert h.cpu_seconds(p.pid) == 0.0  # gone: /proc does not say


def test_paired_settles_after_every_call_warm_ups_included():
    events = []
    fns = {n: (lambda n=n: events.append(("call", n)) or n) for n in "ab"}
    h.paired(fns, 2, warmup=1, after=lambda n, got: events.append(("after", got)),
             settle=lambda n: events.append(("settle", n)))
    starts = [i for i, e in enumerate(events) if e[0] == "call"] + [len(events)]
    segments = [events[a:b] for a, b in zip(starts, starts[1:])]
    assert len(segments) == 6  # 2 warm-ups, then 2 rounds of 2 rows
    for seg in segments[:2]:   # a warm-up call: settled, its result not recorded
        assert seg == [("call", seg[0][1]), ("settle", seg[0][1])]
    for seg in segments[2:]:   # a timed call: recorded, then settled, before the next row is called
        assert seg == [("call", seg[0][1]), ("after", seg[0][1]), ("settle", seg[0][1])]
