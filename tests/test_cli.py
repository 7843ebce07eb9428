"""The colgraph command, run in-process: demo (text and JSON), query and info on a saved index."""
from __future__ import annotations

import json

import pytest

from colgraph_engine.cli import main
from colgraph_engine.demos.corpus import DEMO_QUESTIONS, _photo, demo_documents
from colgraph_engine.kg import Encoders, KnowledgeIndex


@pytest.fixture(scope="module")
def saved_index(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "index"
    KnowledgeIndex.create(path, Encoders.offline()).add_documents(demo_documents())
    return path


def test_demo_prints_every_stage_and_the_ranker_comparison(capsys, tmp_path):
    assert main(["demo", "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    for marker in ("1 recall", "3 seeds", "4 expansion", "5 images", "6 records", "7 context", "ms per stage",
                   "[query image", "box (0.26, 0.67, 0.41, 0.83)"):
        assert marker in out, marker
    assert "MaxSim picks collins-portrait, pooled picks falcon-pad" in out
    assert (tmp_path / "demo" / "manifest.json").is_file()


def test_demo_json_is_parseable(capsys, tmp_path):
    assert main(["demo", "--out", str(tmp_path / "demo"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["question"] for r in data["results"]][:3] == list(DEMO_QUESTIONS)
    assert data["results"][3]["has_image"] and data["results"][3]["documents"][0]["doc_id"] == "harbour-cafe"
    assert set(data["results"][0]["timings"]) >= {"recall", "seeds", "expand", "visual", "evidence", "context"}


def test_query_and_info_on_a_saved_index(capsys, saved_index, tmp_path):
    assert main(["query", str(saved_index), DEMO_QUESTIONS[1], "--json", "--kd", "2", "--hops", "2"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["documents"][0]["doc_id"] == "shuttle-commander" and len(r["documents"]) == 2
    photo = tmp_path / "cat.png"
    from PIL import Image
    Image.fromarray(_photo("chelsea")).save(photo)
    assert main(["query", str(saved_index), "Where does this animal live?", "--image", str(photo)]) == 0
    assert "harbour-cafe" in capsys.readouterr().out
    assert main(["info", str(saved_index)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["documents"] == 4 and info["encoders"]["text"]["name"].startswith("hashing")


def test_query_reports_bad_settings_without_a_traceback(capsys, saved_index):
    assert main(["query", str(saved_index), "Who?", "--kd", "0"]) == 2
    assert "kd" in capsys.readouterr().err
    assert main(["query", str(saved_index), "   "]) == 2
    assert "question" in capsys.readouterr().err
