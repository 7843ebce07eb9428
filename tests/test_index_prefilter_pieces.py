"""A carried prefilter is written append-only: a base folder plus one piece file per commit
(merged as a binary counter), compacted into a new base once the pieces hold more items than
the base. Reopening equals the prefilter in memory and one replayed from the same changes,
array for array; an add writes one piece whose size follows the added tokens, not the store;
interrupted commits and compactions leave the previous state; indexes written before pieces
existed open and grow."""
import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from colgraph_engine.cli import index as cli_index
from colgraph_engine.prefilter import PrefilterIndex
from colgraph_engine.prefilter import codec
from colgraph_engine.prefilter.layout import IndexState
from colgraph_engine.kg import IndexFormatError, KnowledgeIndex
from colgraph_engine.kg import index as index_module
from colgraph_engine.kg.index import commit as index_commit
from colgraph_engine.kg.index import prefilter_pieces as pieces_module
from colgraph_engine.kg.index import prefilters as pf_module

from .test_index_prefilter import ROOT, assert_same_results, listed_names, on_disk_folders, store_items, uids_of
from .test_kg_index import ENC
from .test_kg_index_growth import city_doc

FIXTURE = Path(__file__).parent / "fixtures" / "kg_index_v3_prefilter_folder"  # written by commit e8006bb
STATE_FIELDS = [f.name for f in dataclasses.fields(IndexState) if not f.name.startswith("_")]


def assert_same_state(a: PrefilterIndex, b: PrefilterIndex) -> None:
    """Every array (values and dtype) and every scalar of the two states is equal."""
    sa, sb = a.snapshot(), b.snapshot()
    for name in STATE_FIELDS:
        x, y = getattr(sa, name), getattr(sb, name)
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), name
        else:
            assert x == y, name


# A state rebuilt on this machine against one stored by another (the fixture): k-means centroids
# and bucket cutoffs differ there by reduction-order rounding, so floats compare within these
# tolerances (ours: far above float32 rounding of unit vectors, far below any real change), and a
# token whose residual sits on a quantile cutoff, or that is equidistant from two centroids, may
# fall on the other side: discrete codes must agree for CROSS_MACHINE_SHARE of the entries.
CROSS_MACHINE_RTOL, CROSS_MACHINE_ATOL, CROSS_MACHINE_SHARE = 1e-4, 1e-5, 0.99
DERIVED_FROM_CODES = ("cells_offsets", "cells", "ivf_offsets", "ivf_docs")


def assert_close_state(a: PrefilterIndex, b: PrefilterIndex) -> None:
    """`a` and `b` hold the same tokens and slots (ids, offsets, alive and scalars exact), their
    float arrays agree within the tolerances above and their codes for CROSS_MACHINE_SHARE of
    the entries; the inverted lists, a function of the codes, are compared exactly when every
    code agrees (and checked exactly elsewhere, by the same-machine tests)."""
    sa, sb = a.snapshot(), b.snapshot()
    codes_equal = torch.equal(sa.codes, sb.codes)
    for name in STATE_FIELDS:
        x, y = getattr(sa, name), getattr(sb, name)
        if not isinstance(x, torch.Tensor):
            if isinstance(x, float):
                assert x == pytest.approx(y, rel=CROSS_MACHINE_RTOL, abs=CROSS_MACHINE_ATOL), name
            else:
                assert x == y, name
            continue
        if name in DERIVED_FROM_CODES and not codes_equal:
            continue
        assert x.dtype == y.dtype, name
        if x.is_floating_point():
            torch.testing.assert_close(x, y, rtol=CROSS_MACHINE_RTOL, atol=CROSS_MACHINE_ATOL, msg=name)
        elif name in ("codes", "residuals"):
            assert x.shape == y.shape, name
            share = (x == y).double().mean().item() if x.numel() else 1.0
            assert share >= CROSS_MACHINE_SHARE, (name, share)
        else:
            assert x.shape == y.shape and torch.equal(x, y), name


def entry(path: Path, store: str = "segment") -> dict:
    return json.loads((path / "manifest.json").read_text())["prefilter"]["stores"][store]


def new_files(before: set[Path], path: Path) -> set[Path]:
    return {p for p in path.rglob("*") if p.is_file()} - before


def files_of(path: Path) -> set[Path]:
    return {p for p in path.rglob("*") if p.is_file()}


def grown(path: Path, n: int) -> KnowledgeIndex:
    idx = KnowledgeIndex.create(path, ENC)
    idx.add_documents([city_doc(i) for i in range(n)])
    idx.enable_prefilter(min_tokens=50, rebuild_drift=None)  # never rebuilt for drift: appends stay appends
    return idx


class Replay:
    """The carried prefilter's changes replayed on a copy of its first state, by hand."""

    def __init__(self, idx: KnowledgeIndex):
        first = idx.prefilter("segment")
        self.idx, self.pf = idx, PrefilterIndex(first.snapshot(), first.build_options)

    def add(self, *docs):
        self.idx.add_documents(list(docs))
        uids = torch.cat([uids_of(self.idx, "segment", d.doc_id) for d in docs])
        self.pf.add(*store_items(self.idx, "segment", uids), ids=uids, rebuild_drift=None)

    def remove(self, doc_id: str):
        uids = uids_of(self.idx, "segment", doc_id)
        self.idx.remove_document(doc_id)
        self.pf.delete(uids)


def test_reopened_prefilter_equals_memory_and_replay_array_for_array_after_each_commit(tmp_path):
    path = tmp_path / "ix"
    idx = grown(path, 12)
    base = entry(path)["folder"]
    replay = Replay(idx)
    steps = [lambda: replay.add(city_doc(20)), lambda: replay.add(city_doc(21), city_doc(22)),
             lambda: replay.remove("d3"), lambda: replay.remove("d21"), lambda: replay.add(city_doc(23)),
             lambda: replay.remove("d0")]
    for step in steps:
        step()
        back = KnowledgeIndex.open(path, ENC)
        assert_same_state(back.prefilter("segment"), idx.prefilter("segment"))
        assert_same_state(back.prefilter("segment"), replay.pf)
        assert_same_results(back.prefilter("segment"), replay.pf, k=len(replay.pf))
        e = entry(path)
        assert e["folder"] == base and e["pieces"]  # the base is never rewritten: only pieces appended
        assert on_disk_folders(path) == listed_names(path)
    s = idx.prefilter("segment").snapshot()
    assert s.n_slots - s.n_live == 3 and s.added_tokens == 4 * 22 and s.added_sq_sum > 0
    e = entry(path)
    assert (e["added_sq_sum"], e["added_tokens"], e["next_id"]) == (s.added_sq_sum, s.added_tokens, s.next_id)


def test_an_add_writes_one_piece_whose_bytes_follow_the_added_tokens_not_the_store(tmp_path):
    sizes = {}
    for n in (12, 48):
        path = tmp_path / f"ix{n}"
        idx = grown(path, n)
        s = idx.prefilter("segment").snapshot()
        per_token = codec.code_dtype(s.n_centroids).itemsize + codec.packed_width(s.dim, s.nbits)
        before = files_of(path / "prefilter")
        idx.add_document(city_doc(100))
        written = new_files(before, path / "prefilter")
        assert len(written) == 1 and written.pop().suffix == ".piece"  # one file, no folder
        before = files_of(path / "prefilter")
        idx.add_documents([city_doc(101), city_doc(102)])  # absorbs the first piece (1 item <= 2 new)
        written = new_files(before, path / "prefilter")
        assert len(written) == 1
        t = idx.stores["segment"].offsets.diff()[-3:].sum().item()  # the three added documents' tokens
        # the merged piece: 3 items (length and uid each) and their tokens (code and residual bytes)
        assert written.pop().stat().st_size == 3 * 16 + t * per_token
        before = files_of(path / "prefilter")
        idx.remove_document("d101")  # a removal appends its deleted uid alone
        removal = new_files(before, path / "prefilter")
        assert len(removal) == 1 and removal.pop().stat().st_size == 8
        base_bytes = sum(p.stat().st_size for p in (path / "prefilter" / entry(path)["folder"]).iterdir())
        sizes[n] = (entry(path)["pieces"], base_bytes)
    # the same changes write the same bytes onto a store four times as large; its base is larger
    assert [{k: p[k] for k in ("items", "tokens", "deleted")} for p in sizes[12][0]] == \
           [{k: p[k] for k in ("items", "tokens", "deleted")} for p in sizes[48][0]]
    assert sizes[48][1] > 2 * sizes[12][1]


def test_pieces_merge_as_a_binary_counter_and_compaction_writes_an_equal_base(tmp_path, capsys):
    path = tmp_path / "ix"
    idx = grown(path, 16)
    replay = Replay(idx)
    base = entry(path)["folder"]
    for i in range(16):  # one item per document: the pieces' sizes are the binary digits of i + 1
        replay.add(city_doc(100 + i))
        e = entry(path)
        assert e["folder"] == base
        assert [p["items"] for p in e["pieces"]] == [1 << b for b in reversed(range(5)) if (i + 1) >> b & 1]
        assert len(on_disk_folders(path)) == 1 + len(e["pieces"])  # absorbed pieces were removed
        if i == 2:  # pieces of 2 and 1 items
            assert cli_index.main(["index", "info", str(path)]) == 0
            out = capsys.readouterr().out
            assert ", segment built (19 items, 0 deleted, drift " in out and ", 2 appended pieces)" in out
    assert pf_module.COMPACT_RATIO == 1.0
    replay.add(city_doc(200))  # pieces would hold 17 items > the base's 16: a new base, no pieces
    e = entry(path)
    assert e["folder"] != base and e["pieces"] == [] and "added_tokens" not in e
    assert on_disk_folders(path) == {e["folder"]}
    back = KnowledgeIndex.open(path, ENC)
    assert_same_state(back.prefilter("segment"), replay.pf)
    assert_same_state(back.prefilter("segment"), idx.prefilter("segment"))
    replay.add(city_doc(201))  # and the next change appends onto the new base
    assert entry(path)["folder"] == e["folder"] and len(entry(path)["pieces"]) == 1
    assert_same_state(KnowledgeIndex.open(path, ENC).prefilter("segment"), replay.pf)


def test_the_whole_folder_write_is_kept_for_comparison_and_gives_the_same_prefilter(tmp_path):
    appended, whole = grown(tmp_path / "a", 12), grown(tmp_path / "w", 12)
    whole._pf_append = False
    for idx in (appended, whole):
        idx.add_documents([city_doc(20), city_doc(21)])
        idx.remove_document("d2")
    assert entry(tmp_path / "w")["pieces"] == []
    assert [p["items"] + p["deleted"] for p in entry(tmp_path / "a")["pieces"]] == [2, 1]
    assert_same_state(KnowledgeIndex.open(tmp_path / "a", ENC).prefilter("segment"),
                      KnowledgeIndex.open(tmp_path / "w", ENC).prefilter("segment"))


def test_an_index_written_before_pieces_opens_unchanged_and_grows_by_pieces(tmp_path):
    path = tmp_path / "old"
    shutil.copytree(FIXTURE, path)
    assert "pieces" not in entry(path)
    old = KnowledgeIndex.open(path, ENC)
    mem = KnowledgeIndex(ENC)  # the fixture's history rebuilt here (the fixture's was on another machine)
    mem.add_documents([city_doc(i) for i in range(12)])
    mem.enable_prefilter(min_tokens=50, rebuild_drift=None)
    mem.add_documents([city_doc(20), city_doc(21)])
    mem.remove_document("d3")
    assert_close_state(old.prefilter("segment"), mem.prefilter("segment"))
    folder = entry(path)["folder"]
    first = old.prefilter("segment")
    replay = PrefilterIndex(first.snapshot(), first.build_options)  # the old state, grown by hand
    for idx in (old, mem):
        idx.add_document(city_doc(22))
    uids = uids_of(old, "segment", "d22")
    replay.add(*store_items(old, "segment", uids), ids=uids, rebuild_drift=None)
    e = entry(path)
    assert e["folder"] == folder and len(e["pieces"]) == 1  # a piece onto the old writer's folder
    reopened = KnowledgeIndex.open(path, ENC).prefilter("segment")
    assert_same_state(reopened, old.prefilter("segment"))  # same machine: bit-exact
    assert_same_state(reopened, replay)
    assert_close_state(reopened, mem.prefilter("segment"))


def piece_path(path: Path) -> Path:
    return path / "prefilter" / entry(path)["pieces"][-1]["file"]


def test_a_damaged_missing_or_malformed_piece_is_refused_and_repaired(tmp_path):
    path = tmp_path / "ix"
    idx = grown(path, 12)
    idx.add_document(city_doc(30))
    good = piece_path(path).read_bytes()
    piece_path(path).write_bytes(good[:-1])
    with pytest.raises(IndexFormatError, match="bytes on disk"):
        KnowledgeIndex.open(path, ENC)
    piece_path(path).write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(IndexFormatError, match="piece checksum mismatch"):
        KnowledgeIndex.open(path, ENC)
    assert KnowledgeIndex.open(path, ENC, verify=False).prefilter("segment") is not None  # sizes still checked
    piece_path(path).unlink()
    with pytest.raises(IndexFormatError, match="piece is missing"):
        KnowledgeIndex.open(path, ENC)
    fixed = KnowledgeIndex.open(path, ENC, repair_prefilter=True)
    assert fixed.prefilter_info()["stores"]["segment"]["last_change"].startswith("repaired: built")
    assert entry(path)["pieces"] == [] and on_disk_folders(path) == listed_names(path)
    fixed.add_document(city_doc(31))
    mf = path / "manifest.json"
    m = json.loads(mf.read_text())
    for bad in ("x", [{"file": "../x.piece"}], [entry(path)["pieces"][0]] * 2):
        m["prefilter"]["stores"]["segment"]["pieces"] = bad
        mf.write_text(json.dumps(m))
        with pytest.raises(IndexFormatError, match="pieces: a list of distinct files"):
            KnowledgeIndex.open(path, ENC)


def test_a_piece_that_deletes_what_is_not_live_is_refused(tmp_path):
    path = tmp_path / "ix"
    idx = grown(path, 12)
    idx.add_document(city_doc(30))
    e = entry(path)
    s = idx.prefilter("segment").snapshot()
    live = s.ids[s.alive]
    for deleted, why in ((torch.tensor([live.max() + 1]), "not a live item"),
                         (live[:1].repeat(2), "deletes one twice")):
        bad = pieces_module.Piece(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), deleted,
                                  s.codes[:0], s.residuals[:0])
        written = pieces_module.write(path / "prefilter", "segment", bad)
        m = json.loads((path / "manifest.json").read_text())
        m["prefilter"]["stores"]["segment"]["pieces"] = e["pieces"] + [written]
        (path / "manifest.json").write_text(json.dumps(m))
        with pytest.raises(IndexFormatError, match=why):
            KnowledgeIndex.open(path, ENC)


def test_a_failed_commit_discards_its_piece_and_memory_is_unchanged(tmp_path, monkeypatch):
    path = tmp_path / "ix"
    idx = grown(path, 12)
    idx.add_document(city_doc(30))
    before = idx.prefilter("segment")
    written = []
    real_write = pieces_module.write

    def recording_write(*a, **k):  # the real write; the test only notes the name
        e = real_write(*a, **k)
        written.append(e["file"])
        return e
    monkeypatch.setattr(pieces_module, "write", recording_write)

    def fail(*a, **k):
        raise OSError("injected: disk full")
    monkeypatch.setattr(index_commit, "_replace_file", fail)
    for change in (lambda: idx.add_document(city_doc(31)), lambda: idx.remove_document("d1")):
        with pytest.raises(OSError, match="injected"):
            change()
    assert len(written) == 2 and not any((path / "prefilter" / n).exists() for n in written)
    assert idx.prefilter("segment") is before and on_disk_folders(path) == listed_names(path)
    monkeypatch.undo()
    assert_same_state(KnowledgeIndex.open(path, ENC).prefilter("segment"), before)


CHILD = """
import os, sys
from colgraph_engine import _atomic
from colgraph_engine.kg import KnowledgeIndex
from colgraph_engine.kg.index import commit as m
from colgraph_engine.kg.index import prefilter_pieces as pieces
from tests.test_kg_index import ENC
from tests.test_kg_index_growth import city_doc
path, point = sys.argv[1:3]
if point == "piece_written":        # the piece is written and fsync'ed; the manifest is not replaced
    real = pieces.write
    def write(*a, **k):
        real(*a, **k)
        os._exit(17)
    pieces.write = write
elif point == "compaction_midway":  # the new base folder is half written (its third file)
    real, calls = _atomic.fsync_file, []
    def fsync_file(p):
        calls.append(p)
        if len(calls) == 3:
            os._exit(17)
        real(p)
    _atomic.fsync_file = fsync_file
else:                               # "compaction_written": the new base is in place, the manifest not replaced
    m._replace_file = lambda *a, **k: os._exit(17)
idx = KnowledgeIndex.open(path, ENC)
idx.add_document(city_doc(500))
"""


def killed_child(path: Path, point: str) -> None:
    r = subprocess.run([sys.executable, "-c", CHILD, str(path), point], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 17, r.stderr


def test_a_writer_killed_after_writing_a_piece_leaves_the_previous_state(tmp_path):
    path = tmp_path / "ix"
    idx = grown(path, 12)
    idx.add_document(city_doc(30))
    before_names = listed_names(path)
    killed_child(path, "piece_written")
    orphans = on_disk_folders(path) - before_names
    assert len(orphans) == 1 and next(iter(orphans)).endswith(".piece")
    back = KnowledgeIndex.open(path, ENC)
    assert_same_state(back.prefilter("segment"), idx.prefilter("segment"))
    back.add_document(city_doc(31))  # the next change removes the orphan
    assert on_disk_folders(path) == listed_names(path)
    assert_same_state(KnowledgeIndex.open(path, ENC).prefilter("segment"), back.prefilter("segment"))


@pytest.mark.parametrize("point", ["compaction_midway", "compaction_written"])
def test_a_writer_killed_during_a_compaction_leaves_the_previous_state(tmp_path, point):
    path = tmp_path / "ix"
    idx = grown(path, 4)
    idx.add_documents([city_doc(10 + i) for i in range(4)])  # the pieces hold as many items as the base
    e = entry(path)
    assert sum(p["items"] for p in e["pieces"]) == 4
    killed_child(path, point)  # its add passes the bound: it writes a new base and dies
    assert entry(path) == e
    back = KnowledgeIndex.open(path, ENC)
    assert back.documents == idx.documents
    assert_same_state(back.prefilter("segment"), idx.prefilter("segment"))
    assert on_disk_folders(path) != listed_names(path)  # the dead writer's leftovers
    back.add_document(city_doc(500))  # the compaction, done by the next writer
    e = entry(path)
    assert e["pieces"] == [] and on_disk_folders(path) == listed_names(path) == {e["folder"]}
    replayed = Replay.__new__(Replay)
    replayed.pf = PrefilterIndex(idx.prefilter("segment").snapshot(), idx.prefilter("segment").build_options)
    uids = uids_of(back, "segment", "d500")
    replayed.pf.add(*store_items(back, "segment", uids), ids=uids, rebuild_drift=None)
    assert_same_state(KnowledgeIndex.open(path, ENC).prefilter("segment"), replayed.pf)
