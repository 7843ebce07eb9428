"""Reproducers for the file-side reliability findings of issue 12 (saves, recovery, concurrent
readers and writers, crafted files). Prints one JSON object per experiment.

    python benchmarks/reliability_files.py [rollback|kills|opens|saves|crafted|overwrite|all] [--seqs 80]
        [--commits 300]

* rollback: the issue's two-kill shape made deterministic, in process (see :func:`rollback`).
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
import hashlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from unittest import mock

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
torch.set_num_threads(1)

import _harness as h  # noqa: E402
from colgraph_engine.store import PackedStore  # noqa: E402

BASE = 10_000  # a store's version is its _next_id - BASE
ENC = dict(text_dim=32, patch_grid=4, patch_cell=2)  # small offline encoders


def _store(n=1500, tokens=8, dim=64):
    g = torch.Generator().manual_seed(0)
    s = PackedStore(dim)
    s.add((torch.randn(n * tokens, dim, generator=g), torch.arange(0, n * tokens + 1, tokens, dtype=torch.int64)))
    return s


def _save(s: PackedStore, path, version: int) -> None:
    s._next_id = BASE + version
    s.save(path)


def _leftovers(folder: Path) -> list[str]:
    """What a save left beside the store ``st`` (locks excluded)."""
    return [p.name for p in folder.iterdir() if p.name != "st" and not p.name.endswith(".lock")]


def _fork(child) -> tuple[int, int]:
    """``(pid, read end of a pipe)``: the forked child runs ``child(write_fd)`` and exits (1 if it raised)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 1
        try:
            child(w)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def _drain(fd: int) -> bytes:
    """Everything left to read from `fd`, which is then closed."""
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    os.close(fd)
    return data


def _slow_disk() -> None:
    """In a forked child only: every rename and every file removal takes a few milliseconds, so
    that random kill moments land inside the short windows a real slow disk would widen."""
    def slowed(real, pause):
        def call(*a, **k):
            real(*a, **k)
            time.sleep(pause)
        return call
    os.rename, os.replace, os.unlink = slowed(os.rename, 0.004), slowed(os.replace, 0.004), slowed(os.unlink, 0.002)


def _run_and_kill(path: str, start: int, delay: float) -> int:
    """A child saves versions start, start + 1, ... to `path` until SIGKILL after `delay` s; the
    newest version a save returned for (-1 if none)."""
    def saver(w):
        _slow_disk()
        s = _store()
        for v in range(start, sys.maxsize):
            _save(s, path, v)
            os.write(w, f"{v}\n".encode())
    pid, r = _fork(saver)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return max([int(x) for x in _drain(r).split()], default=-1)


def kills(seqs: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    out = {"sequences": seqs, "silent_rollbacks": 0, "unrecoverable": 0, "ok": 0, "errors": Counter(),
           "leftovers_after_successful_save": 0, "sequences_with_leftovers": 0, "leftover_kinds": Counter()}
    root = Path(tempfile.mkdtemp(prefix="kills-"))
    for i in range(seqs):
        d = root / f"s{i}"
        d.mkdir()
        path = d / "st"
        s = _store()
        _save(s, path, 1)
        floor = max(1, _run_and_kill(str(path), 2, rng.uniform(0.01, 0.4)),
                    _run_and_kill(str(path), 100_000, rng.uniform(0.01, 0.4)))
        try:
            out["silent_rollbacks" if PackedStore.load(path)._next_id - BASE < floor else "ok"] += 1
        except Exception as exc:  # noqa: BLE001
            out["unrecoverable"] += 1
            out["errors"][type(exc).__name__] += 1
        try:
            _save(s, path, 999_999)
            left = _leftovers(d)
            out["leftover_kinds"].update(name.split("-")[0] for name in left)
            out["leftovers_after_successful_save"] += len(left)
            out["sequences_with_leftovers"] += bool(left)
        except Exception as exc:  # noqa: BLE001
            out["errors"]["save_after:" + type(exc).__name__] += 1
        shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    return out


def rollback(trials: int = 80) -> dict:
    """The issue's two-kill shape made deterministic, in process: save v2 is cut off while it
    deletes its backup (the backup of v1 stays behind), save v3 is cut off between its two
    renames (power cut); then load. Anything older than v2 is a silent rollback."""
    from colgraph_engine import _atomic
    out = {"trials": trials, "silent_rollbacks": 0, "unrecoverable": 0, "got": Counter(), "errors": Counter()}
    root = Path(tempfile.mkdtemp(prefix="rollback-"))
    for i in range(trials):
        path = root / f"t{i}" / "st"
        s = _store(n=50)
        _save(s, path, 1)
        with mock.patch.object(_atomic.shutil, "rmtree", lambda *a, **k: None):
            _save(s, path, 2)  # v2 committed, v1's backup left behind
        real, calls = os.rename, []

        def rename(src, dst):
            calls.append(dst)
            if len(calls) == 2:
                raise OSError("power cut")
            real(src, dst)
        with mock.patch.object(_atomic.os, "rename", rename):
            try:
                _save(s, path, 3)
            except OSError:
                pass
        try:
            got = PackedStore.load(path)._next_id - BASE
            out["got"][f"v{got}"] += 1
            out["silent_rollbacks"] += got < 2
        except Exception as exc:  # noqa: BLE001
            out["unrecoverable"] += 1
            out["errors"][type(exc).__name__] += 1
    shutil.rmtree(root, ignore_errors=True)
    return out


def opens(commits: int = 300) -> dict:
    from colgraph_engine.kg import DocumentInput, Encoders, KnowledgeIndex, build_document_graph
    enc = Encoders.offline(**ENC)
    root = Path(tempfile.mkdtemp(prefix="opens-"))
    path = root / "idx"
    KnowledgeIndex.create(path, enc).add_documents(
        [build_document_graph(DocumentInput(f"d{i}", [f"Document {i} is about Tokyo and Mount Fuji {i}."]))
         for i in range(2)])

    def writer(w):
        try:
            wi = KnowledgeIndex.open(path, enc)
            extra = build_document_graph(DocumentInput("x", ["Extra document about Osaka Castle."]))
            for _ in range(commits):  # add and remove one document in turn
                if "x" in wi.documents:
                    wi.remove_document("x")
                else:
                    wi.add_documents([extra])
        finally:
            os.write(w, b"done")
    pid, r = _fork(writer)
    os.set_blocking(r, False)
    res = {"commits": commits, "opens": 0, "failed_opens": 0, "errors": Counter()}
    while True:
        try:
            os.read(r, 16)
            break  # "done", or end of file: the writer is gone
        except BlockingIOError:
            pass
        res["opens"] += 1
        try:
            KnowledgeIndex.open(path)
        except Exception as exc:  # noqa: BLE001
            res["failed_opens"] += 1
            res["errors"][type(exc).__name__] += 1
    os.close(r)
    res["writer_ok"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    shutil.rmtree(root, ignore_errors=True)
    return res


def saves(per_process: int = 30) -> dict:
    root = Path(tempfile.mkdtemp(prefix="saves-"))
    path = root / "st"

    def saver(k, w):
        s, fails = _store(n=600), []
        for j in range(per_process):
            try:
                _save(s, path, 1000 * k + j)
            except Exception as exc:  # noqa: BLE001
                fails.append(type(exc).__name__)
        os.write(w, json.dumps(fails).encode())
    children = [_fork(lambda w, k=k: saver(k, w)) for k in range(2)]
    fails = Counter()
    for pid, r in children:
        os.waitpid(pid, 0)
        fails.update(json.loads(_drain(r)))
    try:
        PackedStore.load(path)
        final = "ok"
    except Exception as exc:  # noqa: BLE001
        final = type(exc).__name__
    left = _leftovers(root)
    shutil.rmtree(root, ignore_errors=True)
    return {"saves": 2 * per_process, "failed_saves": fails.total(), "errors": fails, "final_load": final,
            "leftovers": len(left)}


# -- crafted files ---------------------------------------------------------------------------------

# Loads argv[2] as a store, graph or index (argv[1]) in a fresh process: the error type and the
# peak RSS it took above the interpreter's baseline.
_CHILD = r"""
import json, resource, sys
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


def _load_child(kind: str, path: Path) -> dict:
    """:data:`_CHILD` on `path`, importing the checkout this process imported (the code before a fix, say)."""
    import colgraph_engine
    env = h.checkout_env(Path(colgraph_engine.__file__).parent.parent)
    try:
        return h.run_json([sys.executable, "-c", _CHILD, kind, str(path)], timeout=600, env=env)
    except h.ChildFailed as exc:
        return {"error": f"child died rc={exc.rc}", "stderr": exc.stderr[-300:]}


def crafted() -> dict:
    from colgraph_engine.graph import KnowledgeGraph
    from colgraph_engine.kg import DocumentInput, Encoders, KnowledgeIndex
    root = Path(tempfile.mkdtemp(prefix="crafted-"))
    out = {}
    enc = Encoders.offline(**ENC)
    # part names escaping the index directory
    for label, make_name in (("part_name_dotdot", lambda other, p: f"../../other/parts/{p}"),
                             ("part_name_absolute", lambda other, p: str(other / "parts" / p))):
        a, other = root / label / "idx", root / label / "other"
        KnowledgeIndex.create(a, enc)
        (a / "parts").mkdir(exist_ok=True)
        o = KnowledgeIndex.create(other, enc)
        o.add_documents([DocumentInput("secret", ["A secret document about Kyoto."])])
        m = json.loads((other / "manifest.json").read_text())
        for part in m["parts"]:  # index format 3: the manifest lists parts by name, not documents
            part["name"] = make_name(other, part["name"])
        m["generation"] = 99
        (a / "manifest.json").write_text(json.dumps(m))
        out[label] = _load_child("index", a)
    # alias group 2^27 in a 4-node graph (its file and sha256 rewritten)
    gp = root / "alias" / "g"
    KnowledgeGraph.from_arrays([1, 1, 1, 1], [0, 0, 1, 1], [0, 2], [1, 3]).save(gp)
    alias = np.array([2**27, 2**27, -1, -1], "<i8").tobytes()
    (gp / "alias_of.bin").write_bytes(alias)
    m = json.loads((gp / "manifest.json").read_text())
    m["files"]["alias_of.bin"]["sha256"] = hashlib.sha256(alias).hexdigest()
    (gp / "manifest.json").write_text(json.dumps(m))
    out["alias_group_2^27"] = _load_child("graph", gp)
    # store manifests
    sp = root / "store" / "st"
    _store(n=4, tokens=2, dim=4).save(sp)
    good = (sp / "manifest.json").read_text()

    def store_case(label: str, manifest: str) -> None:
        (sp / "manifest.json").write_text(manifest)
        out[label] = _load_child("store", sp)
    store_case("deep_nesting", "[" * 100_000 + "]" * 100_000)
    store_case("number_5000_digits", json.dumps(json.loads(good))[:-1] + ', "huge": ' + "9" * 5000 + "}")
    store_case("n_items_5000_digits", json.dumps({**json.loads(good), "n_items": "N"}).replace(
        '"n_items": "N"', '"n_items": ' + "9" * 5000))
    # shape whose element count wraps int64: t = 2^62, d = 4 -> 2^64 = 0 (mod 2^64)
    m = json.loads(good)
    m["n_tokens"], m["dim"] = 2**62, 4
    m["files"]["values.bin"].update(shape=[2**62, 4], bytes=0, sha256=hashlib.sha256(b"").hexdigest())
    (sp / "values.bin").write_bytes(b"")
    store_case("shape_wraps_int64", json.dumps(m))
    m["n_tokens"], m["dim"] = 2**52, 2**12  # each extent a sane count, the product 2^64 wraps to 0
    m["files"]["values.bin"].update(shape=[2**52, 2**12])
    store_case("shape_wraps_int64_small_extents", json.dumps(m))
    shutil.rmtree(root, ignore_errors=True)
    return out


def overwrite() -> dict:
    from colgraph_engine.graph import KnowledgeGraph
    from colgraph_engine.kg import Encoders, KnowledgeIndex
    root = Path(tempfile.mkdtemp(prefix="overwrite-"))
    out = {}
    for label, call in (
            ("store.save", lambda f: _store(n=4).save(f)),
            ("graph.save", lambda f: KnowledgeGraph.from_arrays([1, 1], [0, 0], [0], [1]).save(f)),
            ("index.create(overwrite=True)", lambda f: KnowledgeIndex.create(f, Encoders.offline(text_dim=8),
                                                                             overwrite=True)),
            ("index.save(overwrite=True)", lambda f: KnowledgeIndex(Encoders.offline(text_dim=8)).save(f,
                                                                                                  overwrite=True)),
    ):
        f = root / label.replace("(", "_").replace(")", "").replace("=", "_")
        f.mkdir()
        for k in range(3):
            (f / f"thesis-{k}.txt").write_text("precious")
        try:
            call(f)
            err = None
        except Exception as exc:  # noqa: BLE001
            err = f"{type(exc).__name__}: {str(exc)[:100]}"
        out[label] = {"files_deleted": 3 - len(list(f.glob("thesis-*.txt"))), "error": err}
    shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", nargs="?", default="all")
    ap.add_argument("--seqs", type=int, default=80)
    ap.add_argument("--commits", type=int, default=300)
    a = ap.parse_args()
    runs = {"rollback": rollback, "kills": lambda: kills(a.seqs), "opens": lambda: opens(a.commits), "saves": saves,
            "crafted": crafted, "overwrite": overwrite}
    for what in runs if a.what == "all" else a.what.split(","):
        res, seconds = h.timed(runs[what])
        print(json.dumps({what: res, "seconds": round(seconds, 1)}), flush=True)


if __name__ == "__main__":
    main()
