"""Reliability reproducers for the in-memory store and the MaxSim ops (issue 12).

Three parts, each printing figures that go into ``benchmarks/results/reliability_store.md``:

* ``concurrency``: reader threads search (and score candidates, and read ``len``/``get``)
  while one writer thread runs a fixed sequence of add / delete / compact. Every result is
  compared with a serial oracle: the same searches run on each state the writer passes
  through. A result is right when it equals the oracle of a state that was current at some
  moment during the search (a window of writer steps); otherwise every (id, score) pair that
  differs from the nearest such state counts as wrong. Exceptions count as spurious errors.
* ``memory``: peak extra RSS of ``maxsim_topk`` with ``normalize=False`` and ``True`` on a large
  packed fp32 collection, each in its own subprocess (VmHWM reset through
  ``/proc/self/clear_refs`` after the data is built, else RSS sampled).
* ``bad_input``: a battery of bad arguments to the public API of store/, ops/ and packed.py:
  silent wrong behaviours, errors that do not name the argument, errors of other types than
  TypeError/ValueError.

Usage: ``python benchmarks/reliability_store.py [concurrency|memory|bad_input|all] [--json PATH]``
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time

import numpy as np
import torch

import colgraph_engine as cg
from colgraph_engine import PackedStore

# ------------------------------------------------------------------------------------------
# concurrency
# ------------------------------------------------------------------------------------------


def _items(rng: np.random.Generator, n: int, d: int) -> list[torch.Tensor]:
    return [torch.from_numpy(rng.standard_normal((int(rng.integers(1, 12)), d)).astype(np.float32)) for _ in range(n)]


def _plan(seed: int, steps: int, d: int, n0: int):
    """A writer script: (kind, payload) steps over an initial store of n0 items."""
    rng = np.random.default_rng(seed)
    init = _items(rng, n0, d)
    ops = []
    live = list(range(n0))
    next_id = n0
    stable = set(range(0, n0, 7))  # never deleted: candidates for score_candidates
    for s in range(steps):
        r = s % 5
        if r in (0, 2):
            k = int(rng.integers(5, 40))
            ops.append(("add", _items(rng, k, d)))
            live += list(range(next_id, next_id + k))
            next_id += k
        elif r in (1, 3):
            cands = [i for i in live if i not in stable]
            pick = rng.choice(len(cands), size=min(len(cands), int(rng.integers(5, 40))), replace=False)
            dead = [cands[int(p)] for p in pick]
            ops.append(("delete", dead))
            live = [i for i in live if i not in set(dead)]
        else:
            ops.append(("compact", None))
    return init, ops, sorted(stable)


def _apply(store: PackedStore, op) -> None:
    kind, payload = op
    if kind == "add":
        store.add(payload)
    elif kind == "delete":
        store.delete(payload)
    else:
        store.compact()


def concurrency(seed: int = 0, steps: int = 60, readers: int = 3, d: int = 32, n0: int = 1500, k: int = 10,
                n_queries: int = 6, min_searches: int = 300, backend: str | None = None) -> dict:
    init, ops, stable = _plan(seed, steps, d, n0)
    g = torch.Generator().manual_seed(seed + 1)
    queries = [cg.pack([torch.randn(int(torch.randint(2, 9, (1,), generator=g)), d, generator=g)]) for _ in range(n_queries)]
    cand = torch.tensor(stable[:50], dtype=torch.int64)
    cand_off = torch.tensor([0, cand.numel()])

    # serial oracle: results on every state 0..steps
    store = PackedStore(d)
    store.add(init)
    oracle = []
    for s in range(steps + 1):
        oracle.append([store.search(qv, qo, k=k, backend=backend) for qv, qo in queries])
        if s < steps:
            _apply(store, ops[s])
    cand_ref = PackedStore(d)
    cand_ref.add(init)
    cand_expected = [cand_ref.score_candidates(qv, qo, cand_off, cand, backend=backend) for qv, qo in queries]
    get_expected = {int(i): init[int(i)] for i in cand[:10]}

    store = PackedStore(d)
    store.add(init)
    done = [0]  # writer steps completed
    stop = threading.Event()
    stats = dict(searches=0, wrong_results=0, wrong_pairs=0, errors=0, cand_calls=0, cand_wrong=0, get_calls=0,
                 get_wrong=0, error_kinds={})
    lock = threading.Lock()

    def note_error(exc):
        with lock:
            stats["errors"] += 1
            key = f"{type(exc).__name__}: {str(exc)[:80]}"
            stats["error_kinds"][key] = stats["error_kinds"].get(key, 0) + 1

    def reader(rid: int):
        i = rid
        while not stop.is_set() or stats["searches"] < min_searches:
            qi = i % n_queries
            i += 1
            s0 = done[0]
            try:
                sc, ids = store.search(*queries[qi], k=k, backend=backend)
            except Exception as exc:  # noqa: BLE001 - counted
                note_error(exc)
                continue
            s1 = min(steps, done[0] + 1)
            best = None
            for s in range(s0, s1 + 1):
                rs, ri = oracle[s][qi]
                if rs.shape == sc.shape and torch.equal(rs, sc) and torch.equal(ri, ids):
                    best = 0
                    break
                width = max(rs.shape[1], sc.shape[1])
                got = set(zip(ids[0].tolist(), sc[0].tolist()))
                ref = set(zip(ri[0].tolist(), rs[0].tolist()))
                miss = width - len(got & ref)
                best = miss if best is None else min(best, miss)
            with lock:
                stats["searches"] += 1
                if best:
                    stats["wrong_results"] += 1
                    stats["wrong_pairs"] += best
            # readers of stable items: candidates and get
            try:
                got = store.score_candidates(*queries[qi], cand_off, cand, backend=backend)
                ok = torch.equal(got, cand_expected[qi])
                item = int(cand[i % 10])
                v = store.get(item)
                ok_get = torch.equal(v, get_expected[item])
            except Exception as exc:  # noqa: BLE001 - counted
                note_error(exc)
                continue
            with lock:
                stats["cand_calls"] += 1
                stats["cand_wrong"] += int(not ok)
                stats["get_calls"] += 1
                stats["get_wrong"] += int(not ok_get)

    threads = [threading.Thread(target=reader, args=(r,)) for r in range(readers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for s in range(steps):
        _apply(store, ops[s])
        done[0] = s + 1
        time.sleep(0.002)
    stop.set()
    for t in threads:
        t.join()
    stats["seconds"] = round(time.perf_counter() - t0, 2)
    stats["writer_steps"] = steps
    # final state equals the serial one
    final = [store.search(qv, qo, k=k, backend=backend) for qv, qo in queries]
    stats["final_state_equal"] = all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(final, oracle[-1]))
    return stats


# ------------------------------------------------------------------------------------------
# memory
# ------------------------------------------------------------------------------------------

def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def _memory_child(normalize: bool, gib: float, dtype_name: str, nq: int, legacy: bool = False) -> dict:
    dtype = getattr(torch, dtype_name)
    d, per_doc = 128, 32
    elem = torch.empty(0, dtype=dtype).element_size()
    n_docs = int(gib * (1 << 30) / (per_doc * d * elem))
    torch.manual_seed(0)
    xv = torch.empty((n_docs * per_doc, d), dtype=dtype)
    for a in range(0, xv.shape[0], 1 << 18):  # fill in pieces: no [T, d] fp32 temporary
        xv[a:a + (1 << 18)] = torch.randn(min(1 << 18, xv.shape[0] - a), d)
    xo = torch.arange(0, n_docs * per_doc + 1, per_doc, dtype=torch.int64)
    qv, qo = cg.pack([torch.randn(32, d).to(dtype) for _ in range(nq)])
    cg.maxsim_topk(qv[:1], torch.tensor([0, 1]), xv[:per_doc], xo[:2], k=1, normalize=normalize)  # warm-up
    reset = True
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        reset = False
    base = _rss_kib("VmRSS")
    peak = [base]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _rss_kib("VmRSS"))
            time.sleep(0.002)

    th = threading.Thread(target=sample)
    th.start()
    t0 = time.perf_counter()
    if legacy and normalize:  # what maxsim_topk(normalize=True) did before: normalise everything, then scan
        from colgraph_engine.ops import scoring
        cg.maxsim_topk(scoring._unit(qv), qo, scoring._unit(xv), xo, k=10)
    else:
        cg.maxsim_topk(qv, qo, xv, xo, k=10, normalize=normalize)
    secs = time.perf_counter() - t0
    stop.set()
    th.join()
    hwm = _rss_kib("VmHWM") if reset else peak[0]
    return dict(normalize=normalize, legacy=legacy, dtype=dtype_name, queries=nq, docs=n_docs, store_mib=round(xv.numel() * elem / 2**20, 1),
                extra_mib=round((max(hwm, peak[0]) - base) / 1024, 1), seconds=round(secs, 3), hwm_reset=reset)


def memory(gib: float = 1.0, dtypes=("float32", "bfloat16"), nqs=(1, 32)) -> list[dict]:
    """Each row in a fresh process; ``legacy`` re-enacts the code before the fix (normalise the
    whole collection, then scan)."""
    out = []
    for dt in dtypes:
        for nq in nqs:
            for norm, legacy in ((False, False), (True, True), (True, False)):
                r = subprocess.run([sys.executable, __file__, "memory-child", "--normalize", str(int(norm)), "--gib",
                                    str(gib), "--dtype", dt, "--nq", str(nq), "--legacy", str(int(legacy))],
                                   capture_output=True, text=True, check=True)
                out.append(json.loads(r.stdout.strip().splitlines()[-1]))
    return out


# ------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------

def _store(dtype=torch.float32, d=8):
    s = PackedStore(d, dtype)
    g = torch.Generator().manual_seed(0)
    s.add([torch.randn(n, d, generator=g) for n in (3, 1, 4, 2)])
    return s


def _q(d=8, **kw):
    return [torch.randn(3, d, **kw)]


def _probe_requires_grad_add():
    s = _store()
    s.add([torch.randn(2, 8, requires_grad=True)])
    return s.search(_q(), k=2)


def _probe_max_id():
    s = _store()
    s.add([torch.randn(2, 8)], ids=[2**63 - 1])
    return s.add([torch.randn(2, 8)])


def _probe_fp16_overflow():
    s = PackedStore(8, torch.float16)
    s.add([torch.full((2, 8), 1e6)])
    return "stored inf" if bool(torch.isinf(s.values).any()) else "ok"


def _nan_docs(backend):
    xv, xo = cg.pack([torch.randn(3, 8), torch.randn(2, 8)])
    xv[1, 2] = float("nan")
    qv, qo = cg.pack([torch.randn(2, 8)])
    return cg.maxsim(qv, qo, xv, xo, backend=backend)


def _nan_consistent():
    a, b = _nan_docs("native"), _nan_docs("torch")
    return "consistent" if torch.equal(torch.isnan(a), torch.isnan(b)) else f"native={a.tolist()} torch={b.tolist()}"


QV, QO = cg.pack([torch.randn(3, 8), torch.randn(2, 8)])
XV, XO = cg.pack([torch.randn(4, 8), torch.randn(1, 8), torch.randn(5, 8)])

# (case, argument that should be named, call). A call returning normally is "silent" when the
# expected behaviour is an error; where it returns a string, that string is the verdict.
PROBES = [
    ("store.search(k=2, chunk_docs=-1)", "chunk_docs", lambda: _store().search(_q(), k=2, chunk_docs=-1)),
    ("store.search(k=2, chunk_docs=0)", "chunk_docs", lambda: _store().search(_q(), k=2, chunk_docs=0)),
    ("store.search(k=2, chunk_docs=1.5)", "chunk_docs", lambda: _store().search(_q(), k=2, chunk_docs=1.5)),
    ("store.delete([0, 0])", "ids", lambda: _store().delete([0, 0])),
    ("store.add(requires_grad item) then search", "items", _probe_requires_grad_add),
    ("store.search(requires_grad query)", "queries", lambda: _store().search(_q(requires_grad=True), k=2)),
    ("store.add(ids=[2**63-1]) then add()", "ids", _probe_max_id),
    ("PackedStore(device='foo')", "device", lambda: PackedStore(8, device="foo")),
    ("PackedStore(device=3.5)", "device", lambda: PackedStore(8, device=3.5)),
    ("fp16 store add(1e6)", "items", _probe_fp16_overflow),
    ("maxsim NaN in a document: native vs torch", "docs_values", _nan_consistent),
    ("store.search(NaN query)", "queries", lambda: _store().search([torch.full((2, 8), float("nan"))], k=2)),
    ("store.search('abc')", "queries", lambda: _store().search("abc", k=2)),
    ("store.search([])", "queries", lambda: _store().search([], k=2)),
    ("store.search(2-D tensor, no q_offsets)", "queries", lambda: _store().search(torch.randn(3, 8), k=2)),
    ("store.search([float64 query])", "queries", lambda: _store().search([torch.randn(3, 8, dtype=torch.float64)], k=2)),
    ("store.search([int query])", "queries", lambda: _store().search([torch.ones(3, 8, dtype=torch.int32)], k=2)),
    ("store.search(qv, q_offsets=list)", "q_offsets", lambda: _store().search(QV, [0, 3, 5], k=2)),
    ("store.search(qv, q_offsets=int32)", "q_offsets", lambda: _store().search(QV, QO.int(), k=2)),
    ("store.search(5)", "queries", lambda: _store().search(5, k=2)),
    ("store.search(k=np.int64(2))", None, lambda: _store().search(_q(), k=np.int64(2))),
    ("store.search(backend=3)", "backend", lambda: _store().search(_q(), k=2, backend=3)),
    ("store.add([float64 item])", "items", lambda: _store().add([torch.randn(2, 8, dtype=torch.float64)])),
    ("store.add(5)", "items", lambda: _store().add(5)),
    ("store.add((values, int32 offsets))", "items", lambda: _store().add((XV, XO.int()))),
    ("store.add(ids=[2**64-1])", "ids", lambda: _store().add([torch.randn(2, 8)], ids=np.array([2**64 - 1], np.uint64))),
    ("store.add(ids=[2**70])", "ids", lambda: _store().add([torch.randn(2, 8)], ids=[2**70])),
    ("store.get(999)", "item_id", lambda: _store().get(999)),
    ("store.get('a')", "item_id", lambda: _store().get("a")),
    ("store.get(1.0)", "item_id", lambda: _store().get(1.0)),
    ("store.ids_between('a', 5)", "low", lambda: _store().ids_between("a", 5)),
    ("store.ids_between(0, 2**70) (a range: may exceed int64)", None, lambda: _store().ids_between(0, 2**70)),
    ("store.ids_between(0.5, 3)", "low", lambda: _store().ids_between(0.5, 3)),
    ("store.positions('a')", "ids", lambda: _store().positions("a")),
    ("store.delete(5)", "ids", lambda: _store().delete(5)),
    ("store.delete([2**70])", "ids", lambda: _store().delete([2**70])),
    ("store.delete(['a'])", "ids", lambda: _store().delete(["a"])),
    ("store.to('foo')", "device", lambda: _store().to("foo")),
    ("store.score_candidates(cand_offsets=list)", "cand_offsets",
     lambda: _store().score_candidates(_q(), None, [0, 1], torch.tensor([0]))),
    ("store.score_candidates(cand_ids=999)", "cand_ids",
     lambda: _store().score_candidates(_q(), None, torch.tensor([0, 1]), torch.tensor([999]))),
    ("store.score_candidates(cand_offsets bad length)", "cand_offsets",
     lambda: _store().score_candidates(_q(), None, torch.tensor([0, 0, 1]), torch.tensor([1]))),
    ("store.score_candidates(q_offsets=list)", "q_offsets",
     lambda: _store().score_candidates(QV, [0, 3, 5], torch.tensor([0, 1, 1]), torch.tensor([1]))),
    ("PackedStore(dim=True)", "dim", lambda: PackedStore(True)),
    ("PackedStore(dim='8')", "dim", lambda: PackedStore("8")),
    ("PackedStore(dtype='float32')", "dtype", lambda: PackedStore(8, "float32")),
    ("maxsim(requires_grad query, native)", "queries_values",
     lambda: cg.maxsim(QV.clone().requires_grad_(), QO, XV, XO, backend="native")),
    ("maxsim(NaN query, native vs torch)", "queries_values",
     lambda: (lambda a, b: "consistent" if torch.equal(torch.isnan(a), torch.isnan(b)) else "inconsistent")(
         cg.maxsim(torch.where(torch.arange(QV.numel()).view_as(QV) == 3, float("nan"), QV), QO, XV, XO, backend="native"),
         cg.maxsim(torch.where(torch.arange(QV.numel()).view_as(QV) == 3, float("nan"), QV), QO, XV, XO, backend="torch"))),
    ("maxsim_topk(k=np.int64(2))", None, lambda: cg.maxsim_topk(QV, QO, XV, XO, np.int64(2))),
    ("maxsim_topk(chunk_docs=2.5)", "chunk_docs", lambda: cg.maxsim_topk(QV, QO, XV, XO, 2, chunk_docs=2.5)),
    ("maxsim_topk(chunk_docs=True)", "chunk_docs", lambda: cg.maxsim_topk(QV, QO, XV, XO, 2, chunk_docs=True)),
    ("maxsim_topk(alive=list)", "alive", lambda: cg.maxsim_topk(QV, QO, XV, XO, 2, alive=[True] * 3)),
    ("maxsim_topk(alive wrong shape)", "alive", lambda: cg.maxsim_topk(QV, QO, XV, XO, 2, alive=torch.ones(2, dtype=torch.bool))),
    ("maxsim(normalize=1)", "normalize", lambda: cg.maxsim(QV, QO, XV, XO, normalize=1)),
    ("maxsim(backend='cuda')", "backend", lambda: cg.maxsim(QV, QO, XV, XO, backend="cuda")),
    ("maxsim(queries_values=None)", "queries_values", lambda: cg.maxsim(None, QO, XV, XO)),
    ("maxsim(docs_offsets=None)", "docs_offsets", lambda: cg.maxsim(QV, QO, XV, None)),
    ("maxsim(queries_values 3-D)", "queries_values", lambda: cg.maxsim(QV[None], QO, XV, XO)),
    ("maxsim_candidates(cand_ids=list)", "cand_ids",
     lambda: cg.maxsim_candidates(QV, QO, XV, XO, torch.tensor([0, 1, 1]), [0])),
    ("maxsim_candidates(cand_offsets=None)", "cand_offsets",
     lambda: cg.maxsim_candidates(QV, QO, XV, XO, None, torch.tensor([0]))),
    ("maxsim_candidates(requires_grad docs, native)", "docs_values",
     lambda: cg.maxsim_candidates(QV, QO, XV.clone().requires_grad_(), XO, torch.tensor([0, 1, 1]),
                                  torch.tensor([0]), backend="native")),
    ("pooled_scores(queries_values=None)", "queries_values", lambda: cg.pooled_scores(None, QO, XV, XO)),
    ("pooled_scores(float64 docs)", "docs_values", lambda: cg.pooled_scores(QV, QO, XV.double(), XO)),
    ("pack(5)", "items", lambda: cg.pack(5)),
    ("pack(None)", "items", lambda: cg.pack(None)),
    ("pack([], dtype)", "items", lambda: cg.pack([])),
    ("pack([x], dtype=torch.int32)", "dtype", lambda: cg.pack([torch.randn(2, 3)], dtype=torch.int32)),
    ("pack([x], dtype='float32')", "dtype", lambda: cg.pack([torch.randn(2, 3)], dtype="float32")),
    ("pack([int item])", "items", lambda: cg.pack([torch.ones(2, 3, dtype=torch.int64)])),
    ("pack([1-D item])", "items", lambda: cg.pack([torch.ones(3)])),
    ("unpack(values, list)", "offsets", lambda: cg.unpack(XV, [0, 4, 5, 10])),
    ("unpack(values, bad offsets)", "offsets", lambda: cg.unpack(XV, torch.tensor([0, 4, 50]))),
    ("unpack(None, offsets)", "values", lambda: cg.unpack(None, XO)),
]


def bad_input() -> dict:
    rows = []
    for case, arg, fn in PROBES:
        try:
            res = fn()
        except Exception as exc:  # noqa: BLE001 - classified
            kind = type(exc).__name__
            msg = str(exc).splitlines()[0][:140] if str(exc) else ""
            good_type = isinstance(exc, (TypeError, ValueError)) and kind in ("TypeError", "ValueError", "FormatError")
            named = arg is None or arg in msg
            verdict = "ok" if good_type and named else ("wrong type" if not good_type else "argument not named")
            rows.append(dict(case=case, outcome=f"{kind}: {msg}", verdict=verdict))
            continue
        if isinstance(res, str):
            verdict = "ok" if res in ("ok", "consistent") else "silent"
            rows.append(dict(case=case, outcome=res[:140], verdict=verdict))
        elif arg is None:
            rows.append(dict(case=case, outcome="accepted", verdict="ok"))
        else:
            desc = res if isinstance(res, int) else "returned " + (
                f"{tuple(res[0].shape)}" if isinstance(res, tuple) else type(res).__name__)
            rows.append(dict(case=case, outcome=f"no error ({desc})", verdict="silent"))
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("ok", "silent", "argument not named", "wrong type")}
    return dict(rows=rows, counts=counts)


# ------------------------------------------------------------------------------------------

def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("part", nargs="?", default="all", choices=["all", "concurrency", "memory", "bad_input", "memory-child"])
    p.add_argument("--json")
    p.add_argument("--normalize", type=int, default=0)
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--nq", type=int, default=1)
    p.add_argument("--legacy", type=int, default=0)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--seeds", type=int, default=3)
    a = p.parse_args(argv)
    if a.part == "memory-child":
        print(json.dumps(_memory_child(bool(a.normalize), a.gib, a.dtype, a.nq, bool(a.legacy))))
        return
    out = {}
    if a.part in ("all", "concurrency"):
        runs = [concurrency(seed=s) for s in range(a.seeds)]
        tot = {key: sum(r[key] for r in runs) for key in ("searches", "wrong_results", "wrong_pairs", "errors",
                                                         "cand_calls", "cand_wrong", "get_calls", "get_wrong")}
        kinds: dict = {}
        for r in runs:
            for kk, v in r["error_kinds"].items():
                kinds[kk] = kinds.get(kk, 0) + v
        tot["error_kinds"] = kinds
        tot["final_state_equal"] = all(r["final_state_equal"] for r in runs)
        out["concurrency"] = tot
        print("concurrency:", json.dumps(tot, indent=1))
    if a.part in ("all", "memory"):
        out["memory"] = memory(a.gib)
        for r in out["memory"]:
            print("memory:", json.dumps(r))
    if a.part in ("all", "bad_input"):
        out["bad_input"] = bad_input()
        for r in out["bad_input"]["rows"]:
            print(f"  [{r['verdict']:>18}] {r['case']}: {r['outcome']}")
        print("bad_input:", out["bad_input"]["counts"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
