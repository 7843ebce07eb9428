"""Reproducers for the file-side reliability findings of issue 12 (saves, recovery, concurrent
readers and writers, crafted files). Prints one JSON object per experiment.

    python benchmarks/reliability_files.py [kills|opens|saves|crafted|overwrite|all] [--seqs 80]

* kills: two-kill sequences: a child process saves one store path over and over (each save a new
  version), is killed with SIGKILL at a random moment, a second child continues and is killed too,
  then the parent loads. A load older than the newest version a save *returned* for is a silent
  rollback; a load that fails is an unrecoverable state. Backups/temporaries left beside the store
  after one more successful save are counted.
* opens: one process commits 300 times to an index (add / remove one document) while another
  opens it in a loop; every failed open of the (intact) index counts.
* saves: two processes save one store path 30 times each; failed saves count.
* crafted: hand-made manifests and arrays (part names escaping the index, alias group 2^27, deep
  nesting, 5,000-digit numbers, shapes whose element count wraps int64), each loaded in a fresh
  subprocess: exception type and peak RSS above the interpreter's baseline.
* overwrite: save()/create(overwrite=True) onto a folder that holds other files.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

torch.set_num_threads(1)

from colgraph_engine.store import PackedStore  # noqa: E402

BASE = 10_000


def _store(n=1500, tokens=8, dim=64):
    g = torch.Generator().manual_seed(0)
    values = torch.randn(n * tokens, dim, generator=g)
    offsets = torch.arange(0, n * tokens + 1, tokens, dtype=torch.int64)
    s = PackedStore(dim)
    s.add((values, offsets))
    return s


def _slow_disk() -> None:
    """In a forked child only: every rename and every file removal takes a few milliseconds, so
    that random kill moments land inside the short windows a real slow disk would widen."""
    real_rename, real_replace, real_unlink = os.rename, os.replace, os.unlink

    def rename(*a, **k):
        real_rename(*a, **k)
        time.sleep(0.004)

    def replace(*a, **k):
        real_replace(*a, **k)
        time.sleep(0.004)

    def unlink(*a, **k):
        real_unlink(*a, **k)
        time.sleep(0.002)
    os.rename, os.replace, os.unlink = rename, replace, unlink


def _saver(path: str, start: int, wfd: int) -> None:  # runs in a forked child, never returns
    try:
        _slow_disk()
        s = _store()
        v = start
        while True:
            s._next_id = BASE + v
            s.save(path)
            os.write(wfd, f"{v}\n".encode())
            v += 1
    finally:
        os._exit(0)


def _run_and_kill(path: str, start: int, delay: float) -> int:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _saver(path, start, w)
    os.close(w)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    done = [int(x) for x in data.split()]
    return max(done) if done else -1


def kills(seqs: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    out = {"sequences": seqs, "silent_rollbacks": 0, "unrecoverable": 0, "ok": 0, "errors": {},
           "leftovers_after_successful_save": 0, "sequences_with_leftovers": 0, "leftover_kinds": {}}
    root = Path(tempfile.mkdtemp(prefix="kills-"))
    for i in range(seqs):
        d = root / f"s{i}"
        d.mkdir()
        path = d / "st"
        s = _store()
        s._next_id = BASE + 1
        s.save(path)
        floor = 1
        floor = max(floor, _run_and_kill(str(path), 2, rng.uniform(0.01, 0.4)))
        floor = max(floor, _run_and_kill(str(path), 100_000, rng.uniform(0.01, 0.4)))
        try:
            got = PackedStore.load(path)._next_id - BASE
            if got < floor:
                out["silent_rollbacks"] += 1
            else:
                out["ok"] += 1
        except Exception as exc:  # noqa: BLE001
            out["unrecoverable"] += 1
            out["errors"][type(exc).__name__] = out["errors"].get(type(exc).__name__, 0) + 1
        try:
            s._next_id = BASE + 999_999
            s.save(path)
            left = [p.name for p in d.iterdir() if p.name != "st" and not p.name.endswith(".lock")]
            for name in left:
                kind = name.split("-")[0]
                out["leftover_kinds"][kind] = out["leftover_kinds"].get(kind, 0) + 1
            out["leftovers_after_successful_save"] += len(left)
            out["sequences_with_leftovers"] += bool(left)
        except Exception as exc:  # noqa: BLE001
            out["errors"]["save_after:" + type(exc).__name__] = out["errors"].get("save_after:" + type(exc).__name__, 0) + 1
        shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    return out


def rollback(trials: int = 80) -> dict:
    """The issue's two-kill shape made deterministic, in process: save v2 is cut off while it
    deletes its backup (the backup of v1 stays behind), save v3 is cut off between its two
    renames (power cut); then load. Anything older than v2 is a silent rollback."""
    from unittest import mock

    from colgraph_engine import _atomic
    out = {"trials": trials, "silent_rollbacks": 0, "unrecoverable": 0, "got": {}, "errors": {}}
    root = Path(tempfile.mkdtemp(prefix="rollback-"))
    for i in range(trials):
        path = root / f"t{i}" / "st"
        s = _store(n=50)
        s._next_id = BASE + 1
        s.save(path)
        s._next_id = BASE + 2
        with mock.patch.object(_atomic.shutil, "rmtree", lambda *a, **k: None):
            s.save(path)  # v2 committed, v1's backup left behind
        s._next_id = BASE + 3
        real, calls = os.rename, []

        def rename(src, dst):
            calls.append(dst)
            if len(calls) == 2:
                raise OSError("power cut")
            real(src, dst)
        with mock.patch.object(_atomic.os, "rename", rename):
            try:
                s.save(path)
            except OSError:
                pass
        try:
            got = PackedStore.load(path)._next_id - BASE
            out["got"][f"v{got}"] = out["got"].get(f"v{got}", 0) + 1
            out["silent_rollbacks"] += got < 2
        except Exception as exc:  # noqa: BLE001
            out["unrecoverable"] += 1
            out["errors"][type(exc).__name__] = out["errors"].get(type(exc).__name__, 0) + 1
    shutil.rmtree(root, ignore_errors=True)
    return out


def opens(commits: int = 300) -> dict:
    from colgraph_engine.kg import DocumentInput, Encoders, KnowledgeIndex, build_document_graph
    enc = Encoders.offline(text_dim=32, patch_grid=4, patch_cell=2)
    root = Path(tempfile.mkdtemp(prefix="opens-"))
    path = root / "idx"
    idx = KnowledgeIndex.create(path, enc)
    docs = [build_document_graph(DocumentInput(f"d{i}", [f"Document {i} is about Tokyo and Mount Fuji {i}."]))
            for i in range(4)]
    idx.add_documents(docs[:2])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the writer
        os.close(r)
        code = 0
        try:
            wi = KnowledgeIndex.open(path, enc)
            extra = build_document_graph(DocumentInput("x", ["Extra document about Osaka Castle."]))
            for k in range(commits):
                if "x" in wi.documents:
                    wi.remove_document("x")
                else:
                    wi.add_documents([extra])
        except BaseException:  # noqa: BLE001
            code = 1
        os.write(w, b"done")
        os._exit(code)
    os.close(w)
    os.set_blocking(r, False)
    res = {"commits": commits, "opens": 0, "failed_opens": 0, "errors": {}}
    while True:
        try:
            if os.read(r, 16):
                break
        except BlockingIOError:
            pass
        try:
            KnowledgeIndex.open(path)
            res["opens"] += 1
        except Exception as exc:  # noqa: BLE001
            res["opens"] += 1
            res["failed_opens"] += 1
            res["errors"][type(exc).__name__] = res["errors"].get(type(exc).__name__, 0) + 1
    _, status = os.waitpid(pid, 0)
    res["writer_ok"] = os.waitstatus_to_exitcode(status) == 0
    shutil.rmtree(root, ignore_errors=True)
    return res


def saves(per_process: int = 30) -> dict:
    root = Path(tempfile.mkdtemp(prefix="saves-"))
    path = root / "st"
    pids = []
    pipes = []
    for k in range(2):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            s = _store(n=600)
            fails = []
            for j in range(per_process):
                try:
                    s._next_id = BASE + 1000 * k + j
                    s.save(path)
                except Exception as exc:  # noqa: BLE001
                    fails.append(type(exc).__name__)
            os.write(w, json.dumps(fails).encode())
            os._exit(0)
        os.close(w)
        pids.append(pid)
        pipes.append(r)
    fails = []
    for pid, r in zip(pids, pipes):
        os.waitpid(pid, 0)
        data = b""
        while chunk := os.read(r, 65536):
            data += chunk
        fails += json.loads(data)
    try:
        PackedStore.load(path)
        final = "ok"
    except Exception as exc:  # noqa: BLE001
        final = type(exc).__name__
    left = [p.name for p in root.iterdir() if p.name != "st" and not p.name.endswith(".lock")]
    shutil.rmtree(root, ignore_errors=True)
    errors = {}
    for f in fails:
        errors[f] = errors.get(f, 0) + 1
    return {"saves": 2 * per_process, "failed_saves": len(fails), "errors": errors, "final_load": final,
            "leftovers": len(left)}


# -- crafted files ---------------------------------------------------------------------------------

_CHILD = r"""
import json, os, resource, sys, traceback
if os.environ.get("CG_ROOT"):  # measure another checkout (the code before a fix)
    sys.meta_path = [f for f in sys.meta_path
                     if "editable" not in type(f).__name__.lower() and "skbc" not in type(f).__module__.lower()]
    sys.path.insert(0, os.environ["CG_ROOT"])
import numpy as np
from colgraph_engine.graph import KnowledgeGraph
from colgraph_engine.kg import KnowledgeIndex
from colgraph_engine.store import PackedStore
kind, path = sys.argv[1], sys.argv[2]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
res = {}
try:
    if kind == "store":
        s = PackedStore.load(path); res["loaded"] = f"store n={s.n_slots}"
    elif kind == "graph":
        g = KnowledgeGraph.load(path); res["loaded"] = f"graph n={g.n_nodes} alias_max={int(g.alias_of.max())}"
    elif kind == "index":
        i = KnowledgeIndex.open(path); res["loaded"] = f"index docs={i.documents}"
    res["error"] = None
except BaseException as exc:
    res["error"] = type(exc).__name__
    res["message"] = str(exc)[:160]
res["peak_extra_mb"] = round((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024, 1)
print(json.dumps(res))
"""


def _rewrite_manifest(path: Path, edit) -> None:
    mf = path / "manifest.json"
    m = json.loads(mf.read_text())
    edit(m)
    mf.write_text(json.dumps(m))


def _set_file(path: Path, name: str, arr: np.ndarray) -> None:
    import hashlib
    (path / name).write_bytes(arr.tobytes())
    m = json.loads((path / "manifest.json").read_text())
    m["files"][name]["sha256"] = hashlib.sha256(arr.tobytes()).hexdigest()
    (path / "manifest.json").write_text(json.dumps(m))


def _load_child(kind: str, path: Path) -> dict:
    import colgraph_engine
    root = Path(colgraph_engine.__file__).parent.parent
    env = dict(os.environ, CG_ROOT=str(root)) if root != Path(__file__).resolve().parent.parent else dict(os.environ)
    p = subprocess.run([sys.executable, "-c", _CHILD, kind, str(path)], capture_output=True, text=True, timeout=600,
                       env=env)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except Exception:  # noqa: BLE001
        return {"error": f"child died rc={p.returncode}", "stderr": p.stderr[-300:]}


def crafted() -> dict:
    from colgraph_engine.graph import KnowledgeGraph
    from colgraph_engine.kg import DocumentInput, Encoders, KnowledgeIndex
    root = Path(tempfile.mkdtemp(prefix="crafted-"))
    out = {}
    enc = Encoders.offline(text_dim=32, patch_grid=4, patch_cell=2)
    # part names escaping the index directory
    for label, make_name in (("part_name_dotdot", lambda other, p: f"../../other/parts/{p}"),
                             ("part_name_absolute", lambda other, p: str(other / "parts" / p))):
        a, other = root / label / "idx", root / label / "other"
        KnowledgeIndex.create(a, enc)
        (a / "parts").mkdir(exist_ok=True)
        o = KnowledgeIndex.create(other, enc)
        o.add_documents([DocumentInput("secret", ["A secret document about Kyoto."])])
        (p, h), = o._parts.items()
        m = json.loads((other / "manifest.json").read_text())
        m["parts"] = {make_name(other, p): h}
        for d in m["documents"]:
            d["part"] = make_name(other, p)
        m["generation"] = 99
        (a / "manifest.json").write_text(json.dumps(m))
        out[label] = _load_child("index", a)
    # alias group 2^27 in a 4-node graph
    g = KnowledgeGraph.from_arrays([1, 1, 1, 1], [0, 0, 1, 1], [0, 2], [1, 3])
    gp = root / "alias" / "g"
    g.save(gp)
    _set_file(gp, "alias_of.bin", np.array([2**27, 2**27, -1, -1], "<i8"))
    out["alias_group_2^27"] = _load_child("graph", gp)
    s = _store(n=4, tokens=2, dim=4)
    sp = root / "store" / "st"
    s.save(sp)
    good = (sp / "manifest.json").read_text()
    (sp / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    out["deep_nesting"] = _load_child("store", sp)
    m = json.loads(good)
    (sp / "manifest.json").write_text(json.dumps(m)[:-1] + ', "huge": ' + "9" * 5000 + "}")
    out["number_5000_digits"] = _load_child("store", sp)
    m = json.loads(good)
    m["n_items"] = 123456789
    (sp / "manifest.json").write_text(json.dumps(m).replace('"n_items": 123456789', '"n_items": ' + "9" * 5000))
    out["n_items_5000_digits"] = _load_child("store", sp)
    # shape whose element count wraps int64: t = 2^62, d = 4 -> 2^64 = 0 (mod 2^64)
    m = json.loads(good)
    m["n_tokens"], m["dim"] = 2**62, 4
    m["files"]["values.bin"].update(shape=[2**62, 4], bytes=0,
                                    sha256="e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    (sp / "values.bin").write_bytes(b"")
    (sp / "manifest.json").write_text(json.dumps(m))
    out["shape_wraps_int64"] = _load_child("store", sp)
    m["n_tokens"], m["dim"] = 2**52, 2**12  # each extent a sane count, the product 2^64 wraps to 0
    m["files"]["values.bin"].update(shape=[2**52, 2**12])
    (sp / "manifest.json").write_text(json.dumps(m))
    out["shape_wraps_int64_small_extents"] = _load_child("store", sp)
    (sp / "manifest.json").write_text(good)
    shutil.rmtree(root, ignore_errors=True)
    return out


def overwrite() -> dict:
    from colgraph_engine.graph import KnowledgeGraph
    from colgraph_engine.kg import Encoders, KnowledgeIndex
    root = Path(tempfile.mkdtemp(prefix="overwrite-"))
    out = {}

    def folder(name):
        f = root / name
        f.mkdir()
        for k in range(3):
            (f / f"thesis-{k}.txt").write_text("precious")
        return f

    for label, call in (
            ("store.save", lambda f: _store(n=4).save(f)),
            ("graph.save", lambda f: KnowledgeGraph.from_arrays([1, 1], [0, 0], [0], [1]).save(f)),
            ("index.create(overwrite=True)", lambda f: KnowledgeIndex.create(f, Encoders.offline(text_dim=8), overwrite=True)),
            ("index.save(overwrite=True)", lambda f: KnowledgeIndex(Encoders.offline(text_dim=8)).save(f, overwrite=True)),
    ):
        f = folder(label.replace("(", "_").replace(")", "").replace("=", "_"))
        try:
            call(f)
            err = None
        except Exception as exc:  # noqa: BLE001
            err = f"{type(exc).__name__}: {str(exc)[:100]}"
        kept = len(list(f.glob("thesis-*.txt")))
        out[label] = {"files_deleted": 3 - kept, "error": err}
    shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", nargs="?", default="all")
    ap.add_argument("--seqs", type=int, default=80)
    ap.add_argument("--commits", type=int, default=300)
    a = ap.parse_args()
    todo = ["rollback", "kills", "opens", "saves", "crafted", "overwrite"] if a.what == "all" else a.what.split(",")
    for what in todo:
        t = time.perf_counter()
        res = {"rollback": rollback, "kills": lambda: kills(a.seqs), "opens": lambda: opens(a.commits), "saves": saves,
               "crafted": crafted, "overwrite": overwrite}[what]()
        print(json.dumps({what: res, "seconds": round(time.perf_counter() - t, 1)}), flush=True)


if __name__ == "__main__":
    main()
