"""benchmarks/gpu_pipeline.py (the pipeline's one-run GPU check) in quick mode on the CPU: it
builds its synthetic index with precomputed vectors, ranks images by patches, runs its
device-vs-CPU correctness check (CPU against CPU here, so it must pass) and writes the report.
Plus the comparison rules of that check on made-up inputs. No timing assertions."""
from __future__ import annotations

import importlib.util
import json
import math
import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gp():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # it imports pipeline_report's corpus helpers
    spec = importlib.util.spec_from_file_location("gpu_pipeline", ROOT / "benchmarks" / "gpu_pipeline.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def quick(gp, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_pipeline")
    rc = gp.main(["--quick", "--device", "cpu", "--out", str(out)])
    return rc, out


def test_quick_run_writes_the_report(quick):
    rc, out = quick
    assert rc == 0
    rep = json.loads((out / "gpu_pipeline_quick.json").read_text())
    md = (out / "gpu_pipeline_quick.md").read_text()
    assert {"date", "machine", "settings", "index", "pipeline", "check", "runs", "ratios", "targets",
            "total_s", "errors"} <= set(rep)
    assert rep["phase_done"] == "done" and not rep["errors"]
    s = rep["settings"]
    assert (s["docs"], s["images_per_doc"], s["patches"], s["device"], s["quick"]) == (40, 2, 64, "cpu", True)
    assert s["encoders"]["tokens"]["name"] == "synthetic-li:queries"
    assert s["encoders"]["patches"]["name"] == "synthetic-li:images"
    ix = rep["index"]
    c = ix["counts"]
    assert c["documents"] == 40 and c["images"] == 80 and c["segments"] == 200
    assert c["entities"] == 400 and c["relations"] == 400 and 3 * 80 <= c["regions"] <= 4 * 80
    assert c["image_vectors"] == 80 and c["region_vectors"] == c["regions"] and c["segment_vectors"] == 200
    assert ix["patch_tokens"]["image"] == 80 * 64 and 0 < ix["mean_region_patches"] <= 64
    assert ix["vector_bytes"]["image"] == 80 * 64 * 128 * 2  # bf16
    assert rep["pipeline"]["image_units"] == "patches"
    for mode in ("device:single", "device:batch_4", "device:batch_16", "cpu:single", "cpu:batch_4"):
        r = rep["runs"][mode]
        assert r["queries"] > 0 and r["p50_ms"] > 0 and r["qps"] > 0
        assert set(r["stage_ms_per_query"]) == {"recall", "merge", "seeds", "expand", "visual", "evidence",
                                                "context", "results"}
    assert len(rep["targets"]) == 2 and all(isinstance(t["met"], bool) for t in rep["targets"].values())
    assert "## Correctness" in md and "PASS" in md and "## Per stage" in md


def test_quick_run_correctness_check_ran_and_passed(quick):
    _, out = quick
    ck = json.loads((out / "gpu_pipeline_quick.json").read_text())["check"]
    assert ck["passed"] and not ck["failures"]
    assert ck["questions"] == 6 and len(ck["rows"]) == 6
    assert ck["documents_equal_up_to_ties"] == 6 and ck["images_equal_up_to_ties"] == 6
    assert ck["documents_identical"] == 6 and ck["images_identical"] == 6  # CPU against CPU
    assert ck["images_ranked_total"] > 0 and ck["image_units"] == ["patches"]
    assert ck["batched_equals_single"] and ck["max_doc_score_diff"] == 0 and ck["max_image_score_diff"] == 0


def test_corpus_is_deterministic(gp):
    shared = gp.shared_names(40)
    a, b = gp.make_document(3, shared, 4), gp.make_document(3, shared, 4)
    assert a == b and len(a.images) == 4 and all(im.pixels is None for im in a.images)
    assert sorted(r for s in a.segments for r in s.images) == [f"photo-{j}" for j in range(4)]
    assert gp.make_questions(6, 40, 2) == gp.make_questions(6, 40, 2)


def test_region_rows_cover_the_bbox_cells(gp):
    boxes = np.array([[0.0, 0.0, 1.0, 1.0], [0.5, 0.25, 0.75, 0.5], [np.nan] * 4, [0.99, 0.99, 1.0, 1.0]])
    counts, rows = gp.region_rows(boxes, 4)
    assert counts.tolist() == [16, 1, 16, 1]
    assert rows[16] == 1 * 4 + 2 and rows[-1] == 15
    assert rows[:16].tolist() == list(range(16)) and rows[17:33].tolist() == list(range(16))


def test_compare_images_up_to_ties(gp):
    a = [(1, 5.0), (2, 4.0), (3, 3.0)]
    assert gp.compare_images(a, list(a), 1e-3)[:2] == (True, "")
    ok, why, _ = gp.compare_images(a, [(2, 4.0), (1, 4.0005), (3, 3.0)], 1e-3)
    assert not ok  # node 1 moved, but its own score changed beyond the tolerance
    ok, why, _ = gp.compare_images([(1, 5.0), (2, 4.0), (3, 4.0)], [(1, 5.0), (3, 4.0), (2, 4.0)], 1e-3)
    assert ok and "tied" in why
    ok, why, _ = gp.compare_images([(1, 5.0), (2, 3.0)], [(1, 5.0), (9, 3.0001)], 1e-3)
    assert ok  # node 9 replaces node 2 at the boundary: they tie
    assert not gp.compare_images([(1, 5.0), (2, 3.0)], [(1, 5.0), (9, 2.5)], 1e-3)[0]
    assert not gp.compare_images(a, a[:2], 1e-3)[0]
    assert math.isinf(gp.compare_images(a, a[:2], 1e-3)[2])


def test_compare_docs_up_to_ties(gp):
    a = [("d1", 0.0164), ("d2", 0.0161), ("d3", 0.0159)]
    assert gp.compare_docs(a, list(a), None, 1e-3)[0]
    b = [("d1", 0.0164), ("d3", 0.0161), ("d2", 0.0159)]
    assert not gp.compare_docs(a, b, None, 1e-3)[0]  # swapped without reference scores
    assert gp.compare_docs(a, b, {"d1": 9.0, "d2": 7.0, "d3": 7.0001}, 1e-3)[0]
    assert not gp.compare_docs(a, b, {"d1": 9.0, "d2": 7.0, "d3": 6.0}, 1e-3)[0]
    assert not gp.compare_docs(a, a[:2], None, 1e-3)[0]


def test_reference_document_scores_follow_recall_order(gp):
    import torch

    from colgraph_engine.pipeline import Pipeline

    encoders, _ = gp.make_encoders()
    index, info = gp.build_index(30, 1, 16, encoders, seed=0, chunk=8, builder=gp.GraphBuilder(1),
                                 gen_device=torch.device("cpu"), progress=False)
    assert info["counts"]["documents"] == 30 and info["graph_backend"] in ("native", "reference")
    pipe = Pipeline(index, encoders, device="cpu")
    for q in gp.make_questions(4, 30, 1):
        docs = [d for d, _ in pipe.retrieve(q).documents]
        ref = gp.doc_text_scores(pipe, q, docs)
        scores = [ref[d] for d in docs]
        assert all(math.isfinite(s) for s in scores)
        assert all(x >= y - 1e-3 * max(1.0, abs(x)) for x, y in zip(scores, scores[1:]))  # recall ranks by them
