"""benchmarks/gpu_headline.py (the one-run GPU driver) without a GPU: its time budgets, the kill
of a phase past its budget, the source layout it runs from, and the headline figures it reads out
of the phases' records. The whole run at tiny shapes is `bash benchmarks/gpu_all.sh --quick`
(minutes: not a unit test). No timing assertions."""
from __future__ import annotations

import importlib.util
import json
import pathlib
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gh():
    spec = importlib.util.spec_from_file_location("gpu_headline", ROOT / "benchmarks" / "gpu_headline.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_budgets_pass_unused_time_on_and_keep_the_least_for_later(gh):
    steps = gh.FULL_PLAN
    assert gh.phase_budget(steps, 0, 480.0) == 140.0 + (480.0 - 460.0)  # its share plus the spare 20 s
    assert gh.phase_budget(steps, 1, 380.0) == 100.0 + 60.0  # maxsim ran 100 s: 60 s saved
    assert gh.phase_budget(steps, 2, 190.0) == 190.0  # the last phase gets what is left
    # running late: the prefilter is cut so the pipeline still gets its least (120 s)
    assert gh.phase_budget(steps, 1, 200.0) == 80.0
    assert gh.phase_budget(steps, 1, 150.0) < steps[1][2]  # below its least: the driver skips it


def test_a_phase_past_its_budget_is_stopped(gh, monkeypatch, tmp_path):
    monkeypatch.setattr(gh, "KILL_GRACE_S", 0.5)
    t = time.monotonic()
    res = gh.run_phase("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], None, 0.5,
                       open(tmp_path / "log", "w"))
    assert res["killed"] and res["rc"] != 0
    assert time.monotonic() - t < 30
    res = gh.run_phase("quick", [sys.executable, "-c", "print('done')"], None, 30, open(tmp_path / "log2", "w"))
    assert res == {**res, "rc": 0, "killed": False}
    assert "done" in (tmp_path / "log2").read_text()
    assert not gh.RUNNING


def test_layout_is_the_installed_one(gh, tmp_path):
    src = gh.make_layout(tmp_path)
    pkg = src / "colgraph_engine"
    assert (pkg / "kernels").resolve() == (ROOT / "kernels").resolve()
    assert (pkg / "__init__.py").resolve() == (ROOT / "colgraph_engine" / "__init__.py").resolve()
    assert (pkg / "ops").resolve() == (ROOT / "colgraph_engine" / "ops").resolve()
    assert not list(pkg.glob("_core*.so"))  # the device links its own build in


def _maxsim_rows():
    shape = dict(lq=32, ld=1030, d=128)
    return [
        {"section": "env", "torch": "2.11", "gpu": "H200", "sms": 132},
        {"section": "ceilings", "what": "d2d_copy", "TBps": 4.3, "ms": 1.0},
        {"section": "correctness", "config": "rerank nq=32 nd=8192", "check": "cross_vs_fp64", "ok": True},
        {"section": "correctness", "config": "candidates nq=64", "check": "candidates_vs_cross_gathered", "ok": False},
        {"section": "rerank", "impl": "ours cg.maxsim", "nq": 32, "nd": 8192, **shape, "ms": 10.0, "TFLOPs": 222.0},
        {"section": "rerank", "impl": "lik.maxsim", "nq": 32, "nd": 8192, **shape, "ms": 15.0, "TFLOPs": 148.0},
        {"section": "rerank", "impl": "lik.maxsim_varlen", "nq": 32, "nd": 8192, **shape, "ms": 14.0, "TFLOPs": 151.0},
        {"section": "rerank", "impl": "ours cg.maxsim", "nq": 1, "nd": 1024, **shape, "ms": 0.05, "TFLOPs": 5.0},
        {"section": "rerank", "impl": "lik.maxsim", "nq": 1, "nd": 1024, **shape, "error": "RuntimeError()"},
        {"section": "store", "impl": "ours PackedStore.search", "nq": 1, "nd": 1024, "ms": 0.07},
        {"section": "candidates", "impl": "ours cg.maxsim_candidates", "nq": 64, "cand_per_query": 1000,
         "store": 10000, **shape, "ms": 6.4, "TFLOPs": 100.0, "ms_per_query": 0.1},
        {"section": "candidates", "impl": "lik score_pairs_packed", "ms": 9.6, "ms_per_query": 0.15},
        {"section": "candidates", "impl": "lik gathered+maxsim (16 q)", "ms_per_query": 0.18},
    ]


def test_maxsim_figures(gh):
    f = gh.maxsim_figures(_maxsim_rows(), {"rerank_big": (32, 8192), "latency_nd": 1024})
    assert f["rerank"]["ours_TFLOPs"] == 222.0 and f["rerank"]["lik_TFLOPs"] == 148.0
    assert f["rerank"]["speedup_vs_lik"] == round(14.0 / 10.0, 3)  # against the faster of its two kernels
    assert f["one_query"]["ours_ms"] == 0.05 and f["one_query"]["lik_ms"] is None  # the failed row is not a figure
    assert f["one_query"]["speedup_vs_lik"] is None and f["one_query"]["store_search_ms"] == 0.07
    assert f["candidates"]["best_peer"] == "lik score_pairs_packed"
    assert f["candidates"]["speedup_vs_best_peer"] == 1.5
    assert f["correctness"] == {"checks": 2, "failed": ["candidates nq=64: candidates_vs_cross_gathered"]}
    assert any("RuntimeError" in e for e in f["errors"])


def test_report_marks_quick_runs_and_missing_figures(gh):
    rep = {"quick": True, "header": {"machine": "no GPU", "commit": "abc", "source_hash": "0", "cpus": 2,
                                     "colgraph_threads": "1", "load_start": [1.0], "date": "d", "command": "c"},
           "figures": {"maxsim": gh.maxsim_figures(_maxsim_rows(), {"rerank_big": (32, 8192), "latency_nd": 1024})},
           "phases": {"maxsim": {"rc": 0, "seconds": 3.0, "budget_s": 10.0}}, "problems": ["x"], "phase_reports": [],
           "log_name": "gpu_all_quick.log"}
    md = gh.render(rep)
    assert "CPU QUICK CHECK" in md and "not GPU figures" in md
    assert "not measured" in md  # the 1-query late-interaction-kernels row that failed
    assert "| 1.4 |" in md
    assert json.dumps(rep)  # what the driver saves
