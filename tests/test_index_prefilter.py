"""A KnowledgeIndex carries centroid prefilters for named stores: keyed by the stores' uids, built
(or deferred) by enable_prefilter, maintained by adds and removals in the same atomic commit,
checked against the stores on open, used by the pipeline's recall (which reports the path)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from colgraph_engine.cli import index as cli_index
from colgraph_engine.prefilter import PrefilterIndex
from colgraph_engine.kg import IndexFormatError, KnowledgeIndex
from colgraph_engine.kg import index as index_module
from colgraph_engine.kg.index import commit as index_commit
from colgraph_engine.kg.index import prefilters as pf_module
from colgraph_engine.pipeline import Pipeline, PipelineConfig

from .test_kg_index import ENC, small_docs
from .test_kg_index_growth import FIXTURES, city_doc

QUESTIONS = ["How is Tokyo linked to Osaka?", "Which castle is in Kyoto?", "Where is Mount Fuji?",
             "Does Sendai have a castle?"]
QUERIES = ENC.tokens(QUESTIONS)
ROOT = Path(__file__).resolve().parents[1]


def top(pf: PrefilterIndex, k: int):
    res = pf.search(QUERIES, k=k)
    return res.ids.clone(), res.scores.clone()


def assert_same_results(a: PrefilterIndex, b: PrefilterIndex, k: int):
    ia, sa = top(a, k)
    ib, sb = top(b, k)
    assert torch.equal(ia, ib)
    assert torch.equal(sa, sb)


def grown(path, n=12, **options) -> KnowledgeIndex:
    idx = KnowledgeIndex.create(path, ENC)
    idx.add_documents([city_doc(i) for i in range(n)])
    idx.enable_prefilter(**{"min_tokens": 50, **options})
    return idx


def uids_of(idx: KnowledgeIndex, store: str, doc_id: str) -> torch.Tensor:
    n = idx.doc_number(doc_id)
    return idx.stores[store].ids_between(n << 32, (n + 1) << 32)


def store_items(idx: KnowledgeIndex, store: str, uids: torch.Tensor):
    """``(values, offsets)`` of the store's items `uids`, in that order."""
    st = idx.stores[store]
    pos = st.positions(uids)
    rows = [st.values[int(st.offsets[p]):int(st.offsets[p + 1])] for p in pos.tolist()]
    offsets = torch.zeros(len(rows) + 1, dtype=torch.int64)
    torch.cumsum(torch.tensor([r.shape[0] for r in rows]), 0, out=offsets[1:])
    return torch.cat(rows), offsets


def listed_folders(path: Path) -> set[str]:
    """The base folders the manifest lists."""
    m = json.loads((path / "manifest.json").read_text())
    return {e["folder"] for e in m.get("prefilter", {}).get("stores", {}).values() if e["folder"]}


def listed_names(path: Path) -> set[str]:
    """Every name under prefilter/ the manifest lists: base folders and appended pieces."""
    m = json.loads((path / "manifest.json").read_text())
    entries = [e for e in m.get("prefilter", {}).get("stores", {}).values() if e["folder"]]
    return {e["folder"] for e in entries} | {p["file"] for e in entries for p in e.get("pieces", [])}


def on_disk_folders(path: Path) -> set[str]:
    """Every name under prefilter/ (folders and piece files)."""
    return {p.name for p in (path / "prefilter").iterdir()} if (path / "prefilter").is_dir() else set()


def test_carried_prefilter_equals_one_built_from_scratch_and_reopens_the_same(tmp_path):
    idx = grown(tmp_path / "ix")
    pf = idx.prefilter("segment")
    assert pf is not None and idx.prefilter("table") is None  # no table items: deferred
    fresh = PrefilterIndex.from_store(idx.stores["segment"], nbits=2)
    assert_same_results(pf, fresh, k=5)
    # keyed by the store's uids (not slots): every returned id names a segment of the index
    ids, _ = top(pf, 5)
    assert set(ids.flatten().tolist()) <= set(idx.stores["segment"].ids.tolist())
    idx.nodes_of_uids(ids.flatten())  # raises for an id no node has
    back = KnowledgeIndex.open(tmp_path / "ix", ENC)
    assert_same_results(back.prefilter("segment"), fresh, k=5)
    assert listed_folders(tmp_path / "ix") == on_disk_folders(tmp_path / "ix") and len(listed_folders(tmp_path / "ix")) == 1
    info = back.prefilter_info()
    assert info["nbits"] == 2 and info["stores"]["segment"]["state"] == "built"
    assert info["stores"]["segment"]["items"] == len(idx.stores["segment"])
    assert info["stores"]["table"]["state"] == "deferred"


def test_adds_and_removals_then_reopen_equal_the_same_operations_on_the_same_centroids(tmp_path):
    idx = grown(tmp_path / "ix", rebuild_drift=None)  # never rebuild: centroids stay the built ones
    first = idx.prefilter("segment")
    expected = PrefilterIndex(first.snapshot(), first.build_options)  # replays every change below

    def added(*doc_ids):
        uids = torch.cat([uids_of(idx, "segment", d) for d in doc_ids])
        expected.add(*store_items(idx, "segment", uids), ids=uids, rebuild_drift=None)

    removed = []

    def remove(doc_id):
        removed.append(uids_of(idx, "segment", doc_id))
        idx.remove_document(doc_id)
        expected.delete(removed[-1])
    remove("d3")
    idx.add_documents([city_doc(20), city_doc(21)])
    added("d20", "d21")
    idx.add_document(city_doc(22))
    added("d22")
    remove("d21")
    assert first.snapshot() is not idx.prefilter("segment").snapshot()
    assert len(first) == 12  # the carried object is replaced by each commit, never changed
    back = KnowledgeIndex.open(tmp_path / "ix", ENC)
    carried = back.prefilter("segment")
    assert len(carried) == len(back.stores["segment"]) == len(expected)
    got_ids, got_scores = top(carried, len(carried))
    exp_ids, exp_scores = top(expected, len(expected))
    assert torch.equal(got_ids, exp_ids) and torch.equal(got_scores, exp_scores)
    gone = torch.cat(removed)
    assert not torch.isin(got_ids, gone).any()  # a removed document is never returned
    s = carried.snapshot()
    assert s.n_slots - s.n_live == 2 and torch.equal(s.centroids, first.snapshot().centroids)
    m = json.loads((tmp_path / "ix" / "manifest.json").read_text())["prefilter"]["stores"]["segment"]
    assert m["deleted"] == 2 and m["drift"] == pytest.approx(carried.drift(), rel=1e-5) and m["drift"] != 1.0


def test_drift_past_the_threshold_rebuilds_from_the_store_during_the_commit(tmp_path):
    idx = grown(tmp_path / "ix", n=20, rebuild_drift=1.0001)
    idx.add_documents([city_doc(i) for i in range(30, 40)])  # half as many tokens again: not judged yet
    info = idx.prefilter_info()["stores"]["segment"]
    assert pf_module.DRIFT_MIN_ADDED == 1.0 and info["drift"] > 1.0001
    assert info["last_change"].startswith("updated (drift ")
    idx.add_documents([city_doc(i) for i in range(40, 52)])  # more than doubled since the build: judged
    info = idx.prefilter_info()["stores"]["segment"]
    assert info["last_change"].startswith("rebuilt (drift ") and info["drift"] == 1.0 and info["deleted"] == 0
    # a rebuild is a build from scratch over the store's vectors (not the decoded ones)
    assert_same_results(idx.prefilter("segment"), PrefilterIndex.from_store(idx.stores["segment"], nbits=2), k=6)
    assert_same_results(KnowledgeIndex.open(tmp_path / "ix").prefilter("segment"), idx.prefilter("segment"), k=6)


def test_tombstones_outnumbering_live_items_rebuild(tmp_path):
    idx = grown(tmp_path / "ix", n=6, rebuild_drift=None, min_tokens=1)
    for d in ("d0", "d1", "d2", "d3"):
        idx.remove_document(d)
    info = idx.prefilter_info()["stores"]["segment"]
    assert info["last_change"].startswith("rebuilt (") and info["deleted"] == 0 and info["items"] == 2
    assert_same_results(idx.prefilter("segment"), PrefilterIndex.from_store(idx.stores["segment"], nbits=2), k=2)
    for d in ("d4", "d5"):
        idx.remove_document(d)
    assert idx.prefilter("segment") is None  # emptied: dropped
    assert KnowledgeIndex.open(tmp_path / "ix").prefilter("segment") is None


def test_small_stores_defer_the_build_until_a_commit_crosses_min_tokens(tmp_path):
    idx = KnowledgeIndex.create(tmp_path / "ix", ENC)
    idx.add_documents([city_doc(i) for i in range(3)])
    tokens = len(idx.stores["segment"].values)
    events = idx.enable_prefilter(min_tokens=tokens + 30)
    assert events["segment"].startswith("deferred (") and idx.prefilter("segment") is None
    assert listed_folders(tmp_path / "ix") == set()
    idx.add_document(city_doc(3))  # still below
    assert idx.prefilter("segment") is None
    idx.add_documents([city_doc(4), city_doc(5)])  # crosses: built from the store's vectors
    assert idx.prefilter_info()["stores"]["segment"]["last_change"].startswith("built (")
    assert_same_results(idx.prefilter("segment"), PrefilterIndex.from_store(idx.stores["segment"], nbits=2), k=4)
    assert_same_results(KnowledgeIndex.open(tmp_path / "ix").prefilter("segment"), idx.prefilter("segment"), k=4)


def test_a_failure_inside_the_commit_leaves_memory_and_directory_as_they_were(tmp_path, monkeypatch):
    idx = grown(tmp_path / "ix")
    before_pf, before_docs = idx.prefilter("segment"), idx.documents
    before_results = top(before_pf, 5)

    def fail(*a, **k):
        raise OSError("injected: disk full")
    monkeypatch.setattr(index_commit, "_replace_file", fail)
    with pytest.raises(OSError, match="injected"):
        idx.add_document(city_doc(40))
    with pytest.raises(OSError, match="injected"):
        idx.remove_document("d1")
    assert idx.documents == before_docs and idx.prefilter("segment") is before_pf
    assert on_disk_folders(tmp_path / "ix") == listed_names(tmp_path / "ix")  # the new pieces were discarded
    monkeypatch.undo()
    back = KnowledgeIndex.open(tmp_path / "ix", ENC)
    assert back.documents == before_docs
    assert all(torch.equal(a, b) for a, b in zip(top(back.prefilter("segment"), 5), before_results))
    idx.add_document(city_doc(40))  # the same object commits afterwards
    assert "d40" in KnowledgeIndex.open(tmp_path / "ix") and len(idx.prefilter("segment")) == 13


CHILD = """
import os, sys
from colgraph_engine.kg import KnowledgeIndex
from colgraph_engine.kg.index import commit as m
from tests.test_kg_index import ENC
from tests.test_kg_index_growth import city_doc
path, point, action = sys.argv[1:4]
if point == "before_manifest":   # every file of the change is written and fsync'ed; the manifest is not replaced
    m._replace_file = lambda *a, **k: os._exit(17)
else:                            # the manifest is replaced; the old prefilter folder is not yet deleted
    m._pf.remove_unlisted = lambda *a, **k: os._exit(17)
idx = KnowledgeIndex.open(path, ENC)
if action == "add":
    idx.add_document(city_doc(50))
else:
    idx.remove_document(action)
"""


def killed_child(path: Path, point: str, action: str) -> None:
    r = subprocess.run([sys.executable, "-c", CHILD, str(path), point, action], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 17, r.stderr


@pytest.mark.parametrize("action", ["add", "d2"])
def test_a_writer_killed_between_writes_leaves_the_old_or_the_new_state_consistent(tmp_path, action):
    path = tmp_path / "ix"
    idx = grown(path)
    old_docs, old_results = idx.documents, top(idx.prefilter("segment"), 5)
    killed_child(path, "before_manifest", action)
    back = KnowledgeIndex.open(path, ENC)  # checks the carried prefilter against the store
    assert back.documents == old_docs
    assert all(torch.equal(a, b) for a, b in zip(top(back.prefilter("segment"), 5), old_results))
    assert len(on_disk_folders(path)) == 2  # the killed writer's piece is left for the next change
    killed_child(path, "after_manifest", action)
    new = KnowledgeIndex.open(path, ENC)
    want = old_docs + ["d50"] if action == "add" else [d for d in old_docs if d != action]
    assert new.documents == want
    pf = new.prefilter("segment")
    assert set(pf.snapshot().ids[pf.snapshot().alive].tolist()) == set(new.stores["segment"].ids.tolist())
    new.add_document(city_doc(60))  # the next change removes every folder no manifest lists
    # one base and one merged piece: two adds (or a removal and an add) stay far below
    # DRIFT_MIN_ADDED of the built tokens, so nothing was rebuilt
    assert on_disk_folders(path) == listed_names(path) and len(listed_folders(path)) == 1
    assert len(listed_names(path)) == 2
    assert "d60" in KnowledgeIndex.open(path)


def test_a_prefilter_that_disagrees_with_its_store_is_refused_or_repaired(tmp_path):
    path = tmp_path / "ix"
    idx = grown(path)
    # a buggy writer: the committed prefilter lacks one item the store holds (checksums all valid)
    bad = PrefilterIndex(idx.prefilter("segment").snapshot(), idx.prefilter("segment").build_options)
    bad.delete(uids_of(idx, "segment", "d5"))
    mf = path / "manifest.json"
    m = json.loads(mf.read_text())
    entry = pf_module.write(path, "segment", bad)
    m["prefilter"]["stores"]["segment"] = entry
    mf.write_text(json.dumps(m))
    with pytest.raises(IndexFormatError, match=r"prefilter of store 'segment' disagrees with the store.*repair_prefilter"):
        KnowledgeIndex.open(path, ENC)
    fixed = KnowledgeIndex.open(path, ENC, repair_prefilter=True)
    assert fixed.prefilter_info()["stores"]["segment"]["last_change"].startswith("repaired: built")
    again = KnowledgeIndex.open(path, ENC)  # the repair was committed
    assert_same_results(again.prefilter("segment"), PrefilterIndex.from_store(again.stores["segment"], nbits=2), k=5)
    # a damaged folder (bytes changed) is refused too
    folder = path / "prefilter" / next(iter(listed_folders(path)))
    with open(folder / "codes.bin", "r+b") as f:
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(IndexFormatError, match="checksum"):
        KnowledgeIndex.open(path, ENC)
    shutil.rmtree(folder)
    with pytest.raises(IndexFormatError, match="missing"):
        KnowledgeIndex.open(path, ENC)


@pytest.mark.parametrize("kwargs,err,name", [
    (dict(nbits=3), ValueError, "nbits"), (dict(stores=["segment", "nope"]), ValueError, "stores"),
    (dict(stores=[]), ValueError, "stores"), (dict(stores="segment"), TypeError, "stores"),
    (dict(min_tokens=0), ValueError, "min_tokens"), (dict(rebuild_drift=0.0), ValueError, "rebuild_drift"),
    (dict(rebuild_drift=float("nan")), ValueError, "rebuild_drift")])
def test_bad_settings_raise_naming_the_argument_and_change_nothing(tmp_path, kwargs, err, name):
    idx = KnowledgeIndex.create(tmp_path / "ix", ENC, prefilters=False)
    idx.add_documents([city_doc(i) for i in range(3)])
    before = (tmp_path / "ix" / "manifest.json").read_bytes()
    with pytest.raises(err, match=name):
        idx.enable_prefilter(**kwargs)
    assert (tmp_path / "ix" / "manifest.json").read_bytes() == before and idx.prefilter_info() is None
    with pytest.raises(ValueError, match="store"):
        idx.prefilter("nope")


def test_indexes_without_a_prefilter_open_as_before_and_old_formats_upgrade(tmp_path):
    idx = KnowledgeIndex.create(tmp_path / "plain", ENC, prefilters=False)
    idx.add_documents(small_docs())
    assert "prefilter" not in json.loads((tmp_path / "plain" / "manifest.json").read_text())
    back = KnowledgeIndex.open(tmp_path / "plain", ENC)
    assert back.prefilter_info() is None and back.prefilter("segment") is None
    assert not (tmp_path / "plain" / "prefilter").exists()
    # a format-2 directory: enabling upgrades it (one commit of the same contents) then builds
    shutil.copytree(FIXTURES[2], tmp_path / "v2")
    old = KnowledgeIndex.open(tmp_path / "v2")
    old.enable_prefilter(stores=["segment"], min_tokens=1)
    assert json.loads((tmp_path / "v2" / "manifest.json").read_text())["version"] == 3
    up = KnowledgeIndex.open(tmp_path / "v2")
    assert up.documents == old.documents
    assert_same_results(up.prefilter("segment"), PrefilterIndex.from_store(up.stores["segment"], nbits=2),
                        k=min(3, len(up.stores["segment"])))
    # disabling commits a manifest without it; the folders go
    up.disable_prefilter()
    assert KnowledgeIndex.open(tmp_path / "v2").prefilter_info() is None and on_disk_folders(tmp_path / "v2") == set()


def test_an_in_memory_index_carries_it_and_save_writes_it(tmp_path):
    mem = KnowledgeIndex(ENC)
    mem.add_documents([city_doc(i) for i in range(8)])
    mem.enable_prefilter(min_tokens=50, rebuild_drift=None)
    mem.add_document(city_doc(9))
    mem.remove_document("d0")
    assert len(mem.prefilter("segment")) == len(mem.stores["segment"])
    mem.save(tmp_path / "saved")
    back = KnowledgeIndex.open(tmp_path / "saved", ENC)
    assert_same_results(back.prefilter("segment"), mem.prefilter("segment"), k=5)


def recall_of(index, **cfg):
    config = PipelineConfig(kd=4, recall_side="text", recall_ranker="prefilter", **cfg)
    return Pipeline(index, ENC, config).retrieve_batch(QUESTIONS)


def test_pipeline_recall_uses_the_carried_prefilter_and_says_so(tmp_path):
    idx = grown(tmp_path / "ix", n=14, rebuild_drift=None)
    idx.remove_document("d4")
    mem = KnowledgeIndex(ENC)  # the same documents, no carried prefilter: the view builds one over slots
    mem.add_documents([city_doc(i) for i in range(14) if i != 4])
    carried = recall_of(idx, prefilter_mode="prefilter", prefilter_units=6, prefilter_budget="plaid")
    built = recall_of(mem, prefilter_mode="prefilter", prefilter_units=6, prefilter_budget="plaid")
    for a, b in zip(carried, built):
        assert a.counts["recall"]["paths"]["segment"] == \
            "prefilter (prefilter requested; carried by the index, nbits 2; exact stage on the store)"
        assert b.counts["recall"]["paths"]["segment"] == "prefilter (prefilter requested; exact stage on the store)"
        # the same vectors in the same order give the same centroids: the same recall
        assert [d for d, _ in a.documents] == [d for d, _ in b.documents]
        assert np.allclose([s for _, s in a.documents], [s for _, s in b.documents])
        assert "d4" not in [d for d, _ in a.documents]
    auto = recall_of(KnowledgeIndex.open(tmp_path / "ix", ENC))
    why = auto[0].counts["recall"]["paths"]["segment"]
    assert why.startswith("exact (auto: ") and why.endswith("; carried by the index, nbits 2)")
    # a pipeline over the grown index follows its changes (a new view takes the new prefilter)
    pipe = Pipeline(idx, ENC, PipelineConfig(kd=13, recall_side="text", recall_ranker="prefilter",
                                             prefilter_mode="prefilter", prefilter_units=50,
                                             prefilter_budget="plaid"))
    assert "d7" in [d for d, _ in pipe.retrieve(QUESTIONS[1]).documents]
    idx.remove_document("d7")
    assert "d7" not in [d for d, _ in pipe.retrieve(QUESTIONS[1]).documents]


def test_index_info_shows_the_carried_prefilter(tmp_path, capsys):
    grown(tmp_path / "ix")
    assert cli_index.main(["index", "info", str(tmp_path / "ix")]) == 0
    out = capsys.readouterr().out
    # every recall store is configured (the image store too: these documents have no images)
    assert "prefilter: image deferred (below 50 tokens), segment built (12 items, 0 deleted, drift 1.000), " \
           "table deferred (below 50 tokens); nbits 2, min_tokens 50, rebuild_drift 1.5" in out
    assert cli_index.main(["index", "info", str(tmp_path / "ix"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["prefilter"]["stores"]["segment"]["items"] == 12
    plain = KnowledgeIndex.create(tmp_path / "plain", ENC, prefilters=False)
    plain.add_documents([city_doc(0)])
    cli_index.main(["index", "info", str(tmp_path / "plain")])
    assert "prefilter: none carried" in capsys.readouterr().out
    assert cli_index.main(["index", "verify", str(tmp_path / "ix")]) == 0
    assert os.path.isdir(tmp_path / "ix" / "prefilter")


def test_index_prefilter_command_enables_refuses_bad_settings_and_stops(tmp_path, capsys):
    idx = KnowledgeIndex.create(tmp_path / "ix", ENC)
    idx.add_documents([city_doc(i) for i in range(6)])
    assert cli_index.main(["index", "prefilter", str(tmp_path / "ix"), "--min-tokens", "50"]) == 0
    out = capsys.readouterr().out
    assert "segment: built (" in out and "segment built (6 items" in out and "image deferred (below 50" in out
    assert KnowledgeIndex.open(tmp_path / "ix").prefilter("segment") is not None
    assert cli_index.main(["index", "prefilter", str(tmp_path / "ix"), "--nbits", "3"]) == 2
    assert "nbits: expected one of (1, 2, 4), got 3" in capsys.readouterr().err
    assert cli_index.main(["index", "prefilter", str(tmp_path / "ix"), "--stores", "nope"]) == 2
    assert "stores:" in capsys.readouterr().err
    assert cli_index.main(["index", "prefilter", str(tmp_path / "ix"), "--off"]) == 0
    assert "prefilter: none carried" in capsys.readouterr().out
    assert KnowledgeIndex.open(tmp_path / "ix").prefilter_info() is None


def test_a_new_directory_index_carries_deferred_prefilters_that_its_growth_builds(tmp_path, monkeypatch):
    # the auto rule's size, scaled down so a dozen city documents cross it (the rule itself is unchanged)
    monkeypatch.setattr(pf_module, "AUTO_MIN_TOKENS", 16)
    monkeypatch.setattr(pf_module, "DEFAULT_MIN_TOKENS", 1)
    idx = KnowledgeIndex.create(tmp_path / "ix", ENC)
    info = KnowledgeIndex.open(tmp_path / "ix", ENC).prefilter_info()  # recorded by the creating commit
    assert info["min_tokens"] == pf_module.auto_min_tokens(idx.dims) == 16 * 128 // idx.dims["segment"]
    assert set(info["stores"]) == {"segment", "table", "image"} & set(idx.dims)
    assert all(s["state"] == "deferred" for s in info["stores"].values())
    assert idx.prefilter_info()["stores"]["segment"]["last_change"].startswith("deferred (0 tokens")
    idx.add_documents([city_doc(0)])  # one segment of fewer tokens: still deferred
    assert 0 < len(idx.stores["segment"].values) < info["min_tokens"]
    assert idx.prefilter("segment") is None
    idx.add_documents([city_doc(i) for i in range(1, 12)])
    back = KnowledgeIndex.open(tmp_path / "ix", ENC)
    pf = back.prefilter("segment")
    assert pf is not None and pf.snapshot().n_live == len(back.stores["segment"])
    r = Pipeline(back, ENC, PipelineConfig(kd=3, prefilter_min_tokens=16)).retrieve("Which river flows past Basel?")
    assert r.counts["recall"]["paths"]["segment"].startswith("prefilter (auto: ")
    exact = Pipeline(back, ENC, PipelineConfig(kd=3, recall_ranker="maxsim")).retrieve("Which river flows past Basel?")
    assert r.documents == exact.documents


def test_create_without_prefilters_and_a_bad_flag(tmp_path):
    assert KnowledgeIndex.create(tmp_path / "plain", ENC, prefilters=False).prefilter_info() is None
    assert KnowledgeIndex.open(tmp_path / "plain", ENC).prefilter_info() is None
    with pytest.raises(TypeError, match="prefilters: expected a bool"):
        KnowledgeIndex.create(tmp_path / "bad", ENC, prefilters="yes")
    assert not (tmp_path / "bad").exists()


def test_min_tokens_d128_defers_each_store_until_auto_recall_reads_it(tmp_path):
    """With ``min_tokens_d128`` a store of dimension d waits for ``max(min_tokens,
    ceil(min_tokens_d128 * 128 / d))`` tokens; the setting is committed, read back, and a store
    below its own threshold opens without a prefilter; manifests without it keep min_tokens alone."""
    s = pf_module.PrefilterSettings(("segment",), min_tokens=100, min_tokens_d128=1000)
    assert s.threshold(128) == 1000 and s.threshold(384) == 334 and s.threshold(1280) == 100
    assert pf_module.PrefilterSettings(("segment",), min_tokens=100).threshold(384) == 100
    idx = KnowledgeIndex.create(tmp_path / "idx", ENC)
    idx.add_documents([city_doc(i) for i in range(12)])
    tokens = int(idx.stores["segment"].offsets[-1])
    dim = idx.dims["segment"]
    high = (tokens + 1) * dim // 128 + 1  # just above the store's tokens, in tokens of d = 128
    events = idx.enable_prefilter(stores=("segment",), min_tokens=50, min_tokens_d128=high)
    assert events["segment"].startswith("deferred") and idx.prefilter_info()["stores"]["segment"]["min_tokens"] > tokens
    m = json.loads((tmp_path / "idx" / "manifest.json").read_text())["prefilter"]
    assert m["min_tokens_d128"] == high and m["stores"]["segment"]["folder"] is None
    again = KnowledgeIndex.open(tmp_path / "idx", ENC)  # below its own threshold: no "must carry" error
    assert again.prefilter_info()["stores"]["segment"]["state"] == "deferred"
    events = again.enable_prefilter(stores=("segment",), min_tokens=50, min_tokens_d128=tokens * dim // 128)
    assert events["segment"].startswith("built")
    with pytest.raises(ValueError, match="min_tokens_d128"):
        again.enable_prefilter(min_tokens_d128=0)
    with pytest.raises(ValueError, match="min_tokens_d128"):
        again.enable_prefilter(min_tokens_d128=True)


def test_created_index_defers_by_store_dimension(tmp_path):
    idx = KnowledgeIndex.create(tmp_path / "idx", ENC)
    info = idx.prefilter_info()
    assert info["min_tokens_d128"] == pf_module.AUTO_MIN_TOKENS
    for s, e in info["stores"].items():  # where recall_ranker="auto" starts to read each store
        want = max(info["min_tokens"], -(-pf_module.AUTO_MIN_TOKENS * pf_module.AUTO_DIM // idx.dims[s]))
        assert e["min_tokens"] == want
