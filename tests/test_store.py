"""PackedStore: ids, tombstones, compaction, search, persistence and crash safety."""
import json
import os

import numpy as np
import pytest
import torch

import colgraph_engine as cg
from colgraph_engine import PackedStore, StoreFormatError, _atomic

from .conftest import DTYPES


def items(lengths, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, d, generator=g) for n in lengths]


def make_store(dtype=torch.float32, d=16):
    s = PackedStore(d, dtype)
    s.add(items([3, 0, 10, 7, 1], d))          # ids 0..4
    s.add(items([5, 2], d, seed=1), ids=[100, 50])
    return s


def snapshot(s):
    return (s.values.clone(), s.offsets.clone(), s.ids.clone(), s.alive.clone(), s._next_id)


def assert_same_state(a, b):
    for x, y in zip(a[:4], b[:4]):
        assert torch.equal(x, y)
    assert a[4] == b[4]


def test_add_assigns_ids_and_packs_rows():
    s = make_store()
    assert s.ids.tolist() == [0, 1, 2, 3, 4, 100, 50]
    assert s.offsets.tolist() == [0, 3, 3, 13, 20, 21, 26, 28]
    assert len(s) == 7 and s.values.shape == (28, 16)
    assert s.add(items([2])).tolist() == [101]  # next id follows the largest
    torch.testing.assert_close(s.get(50), items([5, 2], seed=1)[1])


def test_add_packed_form_and_normalize_on_entry():
    s = PackedStore(4, normalize=True)
    v, o = cg.pack([torch.full((2, 4), 3.0), torch.zeros(1, 4)])
    s.add((v, o))
    torch.testing.assert_close(s.values.norm(dim=1), torch.tensor([1.0, 1.0, 0.0]))


@pytest.mark.parametrize("bad,exc,needle", [
    (dict(items=[torch.randn(2, 8)]), ValueError, "dimension"),
    (dict(items=[torch.tensor([[float("nan")] * 16])]), ValueError, "finite"),
    (dict(items=[torch.tensor([[float("inf")] * 16])]), ValueError, "finite"),
    (dict(items=[torch.randn(2, 16)], ids=[3]), ValueError, "already in the store"),
    (dict(items=[torch.randn(2, 16)] * 2, ids=[7, 7]), ValueError, "unique"),
    (dict(items=[torch.randn(2, 16)], ids=[-1]), ValueError, "non-negative"),
    (dict(items=[torch.randn(2, 16)], ids=[1, 2]), ValueError, "one per item"),
    (dict(items=[torch.randn(2, 16)], ids=[1.5]), TypeError, "ids"),
    (dict(items=[torch.randn(2, 16)], ids="x"), TypeError, "ids"),
    (dict(items=[torch.randn(2, 16, dtype=torch.float64)]), TypeError, "dtype"),
])
def test_bad_add_leaves_store_untouched(bad, exc, needle):
    s = make_store()
    before = snapshot(s)
    with pytest.raises(exc, match=needle):
        s.add(**bad)
    assert_same_state(before, snapshot(s))


def test_delete_is_all_or_nothing_and_search_skips_deleted():
    s = make_store()
    before = snapshot(s)
    with pytest.raises(ValueError, match="not in the store"):
        s.delete([2, 999])
    assert_same_state(before, snapshot(s))
    assert s.delete([2, 100]) == 2
    with pytest.raises(ValueError, match="deleted"):
        s.delete([2])
    q = items([4], seed=3)
    _, ids = s.search(q, k=10)
    assert ids.shape == (1, 5) and not ({2, 100} & set(ids[0].tolist()))


def test_compact_keeps_live_items_and_scores():
    s = make_store()
    s.delete([0, 3])
    q = items([4, 2], seed=3)
    before_s, before_i = s.search(q, k=10)
    s.compact()
    assert s.n_slots == 5 and len(s) == 5 and s.ids.tolist() == [1, 2, 4, 100, 50]
    after_s, after_i = s.search(q, k=10)
    assert torch.equal(before_s, after_s) and torch.equal(before_i, after_i)


def test_search_matches_functional_topk_and_candidates_use_external_ids():
    s = make_store()
    q = items([4, 2], seed=3)
    qv, qo = cg.pack(q)
    scores, ids = s.search(q, k=3)
    ref_s, ref_i = cg.maxsim_topk(qv, qo, s.values, s.offsets, 3)
    assert torch.equal(scores, ref_s) and torch.equal(ids, s.ids[ref_i])
    cand = s.score_candidates(qv, qo, torch.tensor([0, 2, 3]), torch.tensor([100, 4, 50]))
    full = cg.maxsim(qv, qo, s.values, s.offsets)
    torch.testing.assert_close(cand, torch.stack([full[0, 5], full[0, 4], full[1, 6]]))
    with pytest.raises(ValueError, match="cand_ids"):
        s.score_candidates(qv, qo, torch.tensor([0, 1, 1]), torch.tensor([12345]))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mmap", [True, False])
def test_save_load_round_trip_gives_identical_scores(tmp_path, dtype, mmap):
    s = make_store(dtype)
    s.delete([4])
    s.save(tmp_path / "store")
    t = PackedStore.load(tmp_path / "store", mmap=mmap)
    assert t.dtype == dtype and torch.equal(t.values, s.values) and torch.equal(t.ids, s.ids)
    assert torch.equal(t.alive, s.alive) and t._next_id == s._next_id
    q = items([4, 2], seed=3)
    a, b = s.search(q, k=10), t.search(q, k=10)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    t.add(items([3], seed=9))  # a loaded (memory-mapped) store stays writable
    assert len(t) == len(s) + 1 and torch.equal(PackedStore.load(tmp_path / "store").values, s.values)


def test_manifest_lists_checksums(tmp_path):
    s = make_store()
    s.save(tmp_path / "st")
    m = json.loads((tmp_path / "st" / "manifest.json").read_text())
    assert m["format"] == "colgraph_engine.packed_store" and m["version"] == 1
    assert m["files"]["values.bin"]["sha256"] == _atomic.sha256_file(tmp_path / "st" / "values.bin")


def _corrupt(path, how):
    mf = path / "manifest.json"
    if how == "truncate_values":
        data = (path / "values.bin").read_bytes()
        (path / "values.bin").write_bytes(data[:-4])
    elif how == "flip_byte":
        data = bytearray((path / "values.bin").read_bytes())
        data[10] ^= 0xFF
        (path / "values.bin").write_bytes(bytes(data))
    elif how == "bad_offsets":
        import numpy as np
        arr = np.fromfile(path / "offsets.bin", dtype=np.int64)
        arr[2], arr[3] = arr[3], arr[2]
        arr.tofile(path / "offsets.bin")
        m = json.loads(mf.read_text())
        m["files"]["offsets.bin"]["sha256"] = _atomic.sha256_file(path / "offsets.bin")
        mf.write_text(json.dumps(m))
    elif how == "missing_file":
        os.remove(path / "ids.bin")
    elif how == "manifest_garbage":
        mf.write_text("{not json")
    elif how == "manifest_truncated":
        mf.write_text(mf.read_text()[:40])
    elif how == "future_version":
        m = json.loads(mf.read_text())
        m["version"] = 99
        mf.write_text(json.dumps(m))
    elif how == "no_manifest":
        os.remove(mf)


@pytest.mark.parametrize("how,needle", [
    ("truncate_values", "truncated"), ("flip_byte", "checksum"), ("bad_offsets", "non-decreasing"),
    ("missing_file", "missing"), ("manifest_garbage", "JSON"), ("manifest_truncated", "JSON"),
    ("future_version", "version"), ("no_manifest", "manifest"),
])
def test_corrupted_store_fails_to_load_clearly(tmp_path, how, needle):
    make_store().save(tmp_path / "st")
    _corrupt(tmp_path / "st", how)
    with pytest.raises(StoreFormatError, match=needle):
        PackedStore.load(tmp_path / "st")


def test_crash_while_writing_keeps_previous_version(tmp_path, monkeypatch):
    path = tmp_path / "st"
    old = make_store()
    old.save(path)
    new = make_store()
    new.add(items([4], seed=5))

    def fail(*_):
        raise OSError("disk full")
    monkeypatch.setattr(_atomic, "fsync_dir", fail)  # fails after files are written, before the rename
    with pytest.raises(OSError):
        new.save(path)
    monkeypatch.undo()
    assert not list(tmp_path.glob(".st.tmp-*"))
    assert PackedStore.load(path).n_slots == old.n_slots


def test_crash_between_the_two_renames_rolls_forward(tmp_path, monkeypatch):
    path = tmp_path / "st"
    old = make_store()
    old.save(path)
    new = make_store()
    new.add(items([4], seed=5))
    real_rename, calls = os.rename, []

    def rename_then_die(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # old version already moved aside, new one not yet in place
            raise OSError("power cut")
        real_rename(src, dst)
    monkeypatch.setattr(_atomic.os, "rename", rename_then_die)
    with pytest.raises(OSError):
        new.save(path)
    monkeypatch.undo()
    assert not path.exists()
    # the journal written before the renames is the commit point: recovery completes the
    # replace with the new version, complete on disk, and never goes back to an older one
    assert PackedStore.load(path).n_slots == new.n_slots
    assert [p.name for p in path.parent.iterdir()] == ["st"]  # journal and backup gone
    old.save(path)
    assert PackedStore.load(path).n_slots == old.n_slots


def test_constructor_rejects_bad_arguments():
    with pytest.raises(ValueError, match="dim"):
        PackedStore(0)
    with pytest.raises(TypeError, match="dtype"):
        PackedStore(8, torch.float64)
    with pytest.raises(TypeError, match="normalize"):
        PackedStore(8, normalize="yes")


def test_ids_between_lists_live_ids_in_range():
    store = cg.PackedStore(4)
    store.add([torch.randn(2, 4) for _ in range(5)], ids=[40, 3, 17, 25, 8])
    store.delete([17])
    assert store.ids_between(5, 30).tolist() == [8, 25]
    assert store.ids_between(0, 3).tolist() == []
    assert store.ids_between(0, 100).tolist() == [3, 8, 25, 40]
    live = store.live_ids()                       # the same ids as one ascending host array
    assert live.dtype == np.int64 and live.tolist() == [3, 8, 25, 40]
