"""Issue 12, file side: saves that cannot roll back, writers that do not delete each other's
temporaries, index readers that see one generation whole during commits, and crafted files
that give only format errors. Reproducers at full size: benchmarks/reliability_files.py."""
import json
import os
import random
import signal
import subprocess
import sys
import time
from unittest import mock

import numpy as np
import pytest
import torch

from colgraph_engine import _atomic
from colgraph_engine.graph import KnowledgeGraph
from colgraph_engine.kg import DocumentInput, Encoders, IndexFormatError, KnowledgeIndex, build_document_graph
from colgraph_engine.kg import index as index_module
from colgraph_engine.store import PackedStore, StoreFormatError

BASE = 10_000
ENC = Encoders.offline(text_dim=16, patch_grid=4, patch_cell=2)


def make_store(n=40, tokens=4, dim=16, version=1):
    g = torch.Generator().manual_seed(0)
    s = PackedStore(dim)
    s.add((torch.randn(n * tokens, dim, generator=g), torch.arange(0, n * tokens + 1, tokens, dtype=torch.int64)))
    s._next_id = BASE + version
    return s


def version_of(path):
    return PackedStore.load(path)._next_id - BASE


def siblings(path):
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name)


# -- silent rollback -------------------------------------------------------------------------------

def test_leftover_backup_is_never_restored_over_the_interrupted_save(tmp_path):
    """The issue's two-kill shape, deterministic: v2's backup deletion is cut off (v1's backup
    stays), v3 is cut off between its renames. Old code restored a random backup (v1: 45/80)."""
    path = tmp_path / "st"
    s = make_store(version=1)
    s.save(path)
    s._next_id = BASE + 2
    with mock.patch.object(_atomic.shutil, "rmtree", lambda *a, **k: None):
        s.save(path)
    s._next_id = BASE + 3
    real, calls = os.rename, []

    def rename(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("power cut")
        real(src, dst)
    with mock.patch.object(_atomic.os, "rename", rename), pytest.raises(OSError):
        s.save(path)
    assert version_of(path) == 3  # rolled forward from the journal
    s._next_id = BASE + 4
    s.save(path)
    assert version_of(path) == 4
    # v1's backup belongs to this (live) process, so it stays until its writer is gone
    assert all(".old-" in n for n in siblings(path))


@pytest.mark.parametrize("crash_at", range(6))
def test_a_crash_at_any_step_of_a_replace_leaves_the_old_or_the_new_version(tmp_path, crash_at):
    path = tmp_path / "st"
    make_store(version=1).save(path)
    steps = {"n": 0}
    real = {name: getattr(_atomic.os, name) for name in ("rename", "replace")}
    real_fsync_dir = _atomic.fsync_dir

    def step(fn):
        def wrapped(*a, **k):
            if steps["n"] == crash_at:
                steps["n"] += 1
                raise OSError("crash")
            steps["n"] += 1
            return fn(*a, **k)
        return wrapped
    with mock.patch.object(_atomic.os, "rename", step(real["rename"])), \
            mock.patch.object(_atomic.os, "replace", step(real["replace"])), \
            mock.patch.object(_atomic, "fsync_dir", step(real_fsync_dir)):
        try:
            make_store(version=2).save(path)
            crashed = False
        except OSError:
            crashed = True
    assert version_of(path) in ((1, 2) if crashed else (2,))
    make_store(version=3).save(path)
    assert version_of(path) == 3
    assert not [n for n in siblings(path) if ".journal" in n or ".tmp-" in n]


def test_a_successful_save_leaves_no_backup_or_temporary(tmp_path):
    path = tmp_path / "st"
    for v in range(4):
        make_store(version=v).save(path)
    assert siblings(path) == []


def test_leftovers_of_a_dead_writer_are_removed_and_a_live_writers_kept(tmp_path):
    path = tmp_path / "st"
    make_store().save(path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    (tmp_path / f".st.tmp-{dead_pid}-0123456789ab").mkdir()
    (tmp_path / f".st.old-{dead_pid}-0123456789ab").mkdir()
    live = tmp_path / f".st.tmp-{os.getpid()}-ba9876543210"  # another thread of this process, mid-save
    live.mkdir()
    make_store(version=2).save(path)
    assert siblings(path) == [live.name]


_CHILD_PRELUDE = """
import os, sys, time
import torch
from colgraph_engine.store import PackedStore
def make_store(n, version):
    g = torch.Generator().manual_seed(0)
    s = PackedStore(16)
    s.add((torch.randn(n * 4, 16, generator=g), torch.arange(0, n * 4 + 1, 4, dtype=torch.int64)))
    s._next_id = 10_000 + version
    return s
"""

# a fresh interpreter (forking pytest, which runs threads, can deadlock the child)
_SAVER = _CHILD_PRELUDE + """
real_rename = os.rename
def slow_rename(*a, **k):  # widen the window between the two renames, as a slow disk would
    real_rename(*a, **k)
    time.sleep(0.004)
os.rename = slow_rename
path, v = sys.argv[1], int(sys.argv[2])
s = make_store(300, v)
print("ready", flush=True)
while True:
    s._next_id = 10_000 + v
    s.save(path)
    print(v, flush=True)
    v += 1
"""


def _run_and_kill(path, start, delay):
    p = subprocess.Popen([sys.executable, "-c", _SAVER, str(path), str(start)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(delay)
    p.send_signal(signal.SIGKILL)
    out, _ = p.communicate(timeout=60)
    return max([int(x) for x in out.split()], default=-1)


def test_two_kill_sequences_never_roll_back_and_leave_nothing_behind(tmp_path):
    rng = random.Random(1)
    for i in range(4):
        path = tmp_path / f"s{i}" / "st"
        make_store(version=1).save(path)
        floor = max(1, _run_and_kill(path, 2, rng.uniform(0.01, 0.25)))
        floor = max(floor, _run_and_kill(path, 100_000, rng.uniform(0.01, 0.25)))
        assert version_of(path) >= floor  # never older than a save that returned
        make_store(version=999_999).save(path)
        assert siblings(path) == []  # killed writers' temporaries and backups are gone too


# -- concurrent writers and readers ----------------------------------------------------------------

_TWO_SAVERS = _CHILD_PRELUDE + """
path, k = sys.argv[1], int(sys.argv[2])
s = make_store(200, 0)
for j in range(15):
    s._next_id = 10_000 + 1000 * k + j
    s.save(path)
"""


def test_two_processes_saving_one_store_path_both_succeed(tmp_path):
    path = tmp_path / "st"
    procs = [subprocess.Popen([sys.executable, "-c", _TWO_SAVERS, str(path), str(k)], stderr=subprocess.PIPE, text=True)
             for k in range(2)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs  # before: 40 of 60 saves failed (FileNotFoundError)
    assert version_of(path) in (14, 1014)
    assert siblings(path) == []


def _small_doc(i):
    return build_document_graph(DocumentInput(f"d{i}", [f"Document {i} is about Tokyo and Mount Fuji."]))


_COMMITTER = """
import sys
from colgraph_engine.kg import DocumentInput, Encoders, KnowledgeIndex, build_document_graph
enc = Encoders.offline(text_dim=16, patch_grid=4, patch_cell=2)
wi = KnowledgeIndex.open(sys.argv[1], enc)
extra = build_document_graph(DocumentInput("d9", ["Document 9 is about Tokyo and Mount Fuji."]))
print("ready", flush=True)
for _ in range(40):
    wi.remove_document("d9") if "d9" in wi.documents else wi.add_documents([extra])
"""


def test_index_opens_never_fail_while_another_process_commits(tmp_path):
    path = tmp_path / "idx"
    idx = KnowledgeIndex.create(path, ENC)
    idx.add_documents([_small_doc(0), _small_doc(1)])
    p = subprocess.Popen([sys.executable, "-c", _COMMITTER, str(path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    opened, failures = 0, []
    deadline = time.monotonic() + 120
    while p.poll() is None and time.monotonic() < deadline:
        try:
            got = KnowledgeIndex.open(path)
            assert got.documents[:2] == ["d0", "d1"]
            opened += 1
        except IndexFormatError as exc:
            failures.append(str(exc))
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert opened > 0 and failures == []  # before: 99 of 541 opens failed (300 commits)
    # with no reader left, the next commit removes every part the manifest does not name
    last = KnowledgeIndex.open(path, ENC)
    last.add_documents([_small_doc(2)])
    assert sorted(q.name for q in (path / "parts").iterdir()) == sorted(last._parts)


def test_a_commit_keeps_old_parts_while_a_reader_holds_the_index(tmp_path):
    path = tmp_path / "idx"
    idx = KnowledgeIndex.create(path, ENC)
    idx.add_documents([_small_doc(0)])
    (first,) = list(idx._parts)
    with index_module._readers_lock(path, exclusive=False, wait=True) as held:
        assert held
        idx.remove_document("d0")
        assert (path / "parts" / first).is_file()  # a reader of the old manifest may still need it
    idx.add_documents([_small_doc(1)])
    assert not (path / "parts" / first).exists()


# -- crafted files ---------------------------------------------------------------------------------

def _index_pointing_at(tmp_path, name_of):
    a, other = tmp_path / "idx", tmp_path / "other"
    KnowledgeIndex.create(a, ENC)
    o = KnowledgeIndex.create(other, ENC)
    o.add_documents([_small_doc(0)])
    (p,) = o._parts
    m = json.loads((other / "manifest.json").read_text())
    m["parts"][0]["name"] = name_of(other, p)
    (a / "manifest.json").write_text(json.dumps(m))
    (a / "parts").mkdir(exist_ok=True)
    return a


@pytest.mark.parametrize("name_of", [
    lambda other, p: f"../../other/parts/{p}",
    lambda other, p: str(other / "parts" / p),
    lambda other, p: f"x/../../../other/parts/{p}",
    lambda other, p: "..",
    lambda other, p: f".{p}",
    lambda other, p: f"{p}\\..",
], ids=["dotdot", "absolute", "inner-dotdot", "parent", "hidden", "backslash"])
def test_part_names_that_are_not_plain_names_are_refused_by_the_manifest_reader(tmp_path, name_of):
    with pytest.raises(IndexFormatError, match="plain file or folder name"):
        KnowledgeIndex.open(_index_pointing_at(tmp_path, name_of))


def _peak_rss_child(code):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_alias_group_id_far_beyond_the_node_count_is_a_format_error_without_allocation(tmp_path):
    g = KnowledgeGraph.from_arrays([1, 1, 1, 1], [0, 0, 1, 1], [0, 2], [1, 3])
    path = tmp_path / "g"
    g.save(path)
    import hashlib
    data = np.array([2**27, 2**27, -1, -1], "<i8").tobytes()
    (path / "alias_of.bin").write_bytes(data)
    m = json.loads((path / "manifest.json").read_text())
    m["files"]["alias_of.bin"]["sha256"] = hashlib.sha256(data).hexdigest()
    (path / "manifest.json").write_text(json.dumps(m))
    res = _peak_rss_child(f"""
import json, resource
from colgraph_engine.graph import KnowledgeGraph
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    KnowledgeGraph.load({str(path)!r}); err = None
except Exception as exc:
    err = type(exc).__name__ + ": " + str(exc)
print(json.dumps({{"err": err, "extra_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base}}))
""")
    assert res["err"].startswith("FormatError") and "alias group id" in res["err"]
    assert res["extra_kb"] < 64 * 1024  # before: +2 GB


def test_set_aliases_renumbers_sparse_group_ids_densely():
    g = KnowledgeGraph.from_arrays([1, 1, 1, 1], [0, 0, 1, 1], [0, 2], [1, 3])
    g.set_aliases([2**30, -1, 2**30, 7])
    assert g.alias_of.tolist() == [1, -1, 1, 0]
    g.set_aliases([1, -1, 1, 0])  # ids below the node count are kept as given
    assert g.alias_of.tolist() == [1, -1, 1, 0]


def test_native_alias_table_rejects_ids_not_below_the_node_count():
    g = KnowledgeGraph.from_arrays([1, 1, 1, 1], [0, 0, 1, 1], [0, 2], [1, 3], backend="native")
    with pytest.raises(ValueError, match="alias_group"):
        g._impl.set_aliases(np.array([2**27, 2**27, -1, -1], np.int64))


@pytest.mark.parametrize("how,needle", [
    ("nesting", "nested deeper"),
    ("digits", "number of 5000 characters"),
    ("float_digits", "number of"),
    ("wrap", "bytes on disk"),
    ("huge_count", "n_tokens"),
])
def test_crafted_manifests_give_only_format_errors(tmp_path, how, needle):
    path = tmp_path / "st"
    make_store(n=4, tokens=2, dim=4).save(path)
    mf = path / "manifest.json"
    m = json.loads(mf.read_text())
    if how == "nesting":
        text = "[" * 100_000 + "]" * 100_000
    elif how == "digits":
        text = json.dumps(m)[:-1] + ', "huge": ' + "9" * 5000 + "}"
    elif how == "float_digits":
        text = json.dumps(m)[:-1] + ', "huge": 0.' + "9" * 5000 + "}"
    elif how == "wrap":  # 2^52 x 2^12 float32 = 2^64 * 4 bytes: an int64 product wraps to 0
        m["n_tokens"], m["dim"] = 2**52, 2**12
        m["files"]["values.bin"].update(shape=[2**52, 2**12], bytes=0,
                                        sha256="e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        (path / "values.bin").write_bytes(b"")
        text = json.dumps(m)
    else:
        m["n_tokens"] = 2**62
        text = json.dumps(m)
    mf.write_text(text)
    with pytest.raises(StoreFormatError, match=needle):
        PackedStore.load(path)


# -- never delete what is not ours -----------------------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda p: make_store().save(p),
    lambda p: KnowledgeGraph.from_arrays([1, 1], [0, 0], [0], [1]).save(p),
    lambda p: KnowledgeIndex.create(p, ENC, overwrite=True),
    lambda p: KnowledgeIndex(ENC).save(p, overwrite=True),
], ids=["store.save", "graph.save", "index.create", "index.save"])
def test_saving_onto_a_folder_of_other_files_is_refused_and_deletes_nothing(tmp_path, call):
    folder = tmp_path / "thesis"
    folder.mkdir()
    (folder / "chapter1.txt").write_text("precious")
    (folder / "manifest.json").write_text(json.dumps({"format": "someone-else"}))
    with pytest.raises(ValueError, match="path"):
        call(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["chapter1.txt", "manifest.json"]
    empty = tmp_path / "empty"
    empty.mkdir()
    call(empty)  # an empty folder is fine
    call(empty)  # and so is one holding our own format
