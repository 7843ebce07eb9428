"""The pipeline latency report's core (benchmarks/pipeline_report.py) on a tiny index: every
stage is reported with sane numbers, and batched results equal single ones. No timing targets."""
from __future__ import annotations

import importlib.util
import math
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pr():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the report imports _impls for the machine info
    spec = importlib.util.spec_from_file_location("pipeline_report", ROOT / "benchmarks" / "pipeline_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny(pr):
    from colgraph_engine.kg import Encoders
    encoders = Encoders.offline(text_dim=128)
    index = pr.build_index(50, encoders, progress=False)
    return encoders, index, pr.make_questions(4, 50)


def test_corpus_is_deterministic_and_well_formed(pr, tiny):
    _, index, questions = tiny
    assert pr.make_questions(4, 50) == questions
    a, b = pr.make_document(7, pr.shared_names(50)), pr.make_document(7, pr.shared_names(50))
    assert a.extractions == b.extractions and a.segments == b.segments
    assert (a.images[0].pixels == b.images[0].pixels).all() and a.images[0].pixels.shape == (32, 32, 3)
    c = index.counts
    assert c["documents"] == 50 and c["segments"] == 250 and c["images"] == 50
    assert c["entities"] == 500 and c["relations"] == 500 and 100 <= c["regions"] <= 200
    for doc_id in index.documents:
        g = index.document(doc_id)
        assert not [i for i in g.issues if i.severity == "error"], g.issues
    assert all(q.startswith(("What is the relation between", "Which photo shows the")) for q in questions)


def test_core_reports_every_stage(pr, tiny):
    from colgraph_engine.pipeline import STAGES
    encoders, index, questions = tiny
    rep = pr.core(index, encoders, questions, n_single=4, batch_sizes=(2, 4), n_batches=1, warmup=1, check=4,
                  memory=True)
    assert rep["documents"] == 50
    assert rep["checked_batched_equal_single"] == 4
    assert rep["encode"]["queries"] == 4 and rep["encode"]["seconds"] > 0
    for mode, n in (("single", 4), ("batch_2", 2), ("batch_4", 4)):
        r = rep[mode]
        assert r["queries"] == n
        assert 0 < r["p50_ms"] <= r["p99_ms"] and math.isfinite(r["p99_ms"])
        assert r["qps"] > 0
        assert set(r["stage_ms_per_query"]) == set(STAGES) | {"results"}
        assert all(r["stage_ms_per_query"][s] > 0 for s in STAGES)
        assert r["pipeline_encode_ms_per_query"] > 0
    assert rep["batch_4"]["ratio_qps_vs_single"] > 0
    mem = rep["memory"]
    assert mem["dense_nodes_x_64_float32_bytes"] == rep["nodes"] * 64 * 4
    if mem["batch_1_peak_rss_growth_bytes"] is not None:  # Linux only
        assert mem["batch_64_peak_rss_growth_bytes"] >= 0


def test_batched_equals_single(pr, tiny):
    from colgraph_engine.pipeline import Pipeline
    encoders, index, questions = tiny
    pipe = Pipeline(index, encoders)
    single = [pr.signature(pipe.retrieve(q)) for q in questions]
    batched = [pr.signature(r) for r in pipe.retrieve_batch(questions)]
    assert batched == single
    assert all(docs for docs, _ in single) and any(images for _, images in single)


def test_size_planning(pr):
    per_doc = 200 * 1024
    assert pr.plan_size(1000, per_doc, 10 << 30, cached=False) == "build+save"
    assert pr.plan_size(1000, per_doc, 10 << 30, cached=True) == "open"
    assert pr.plan_size(20000, per_doc, 10 << 30, cached=False) == "build"
    assert pr.plan_size(100000, per_doc, 10 << 30, cached=True) is None
