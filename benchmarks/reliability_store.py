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
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h  # noqa: E402
import colgraph_engine as cg  # noqa: E402
from colgraph_engine import PackedStore  # noqa: E402

# ------------------------------------------------------------------------------------------
# concurrency
# ------------------------------------------------------------------------------------------

COUNTS = ("searches", "wrong_results", "wrong_pairs", "errors", "cand_calls", "cand_wrong", "get_calls", "get_wrong")


def _items(rng: np.random.Generator, n: int, d: int) -> list[torch.Tensor]:
    return [torch.from_numpy(rng.standard_normal((int(rng.integers(1, 12)), d)).astype(np.float32)) for _ in range(n)]


def _plan(seed: int, steps: int, d: int, n0: int):
    """``(initial items, writer steps, stable ids)``: n0 items, then `steps` store calls ``(method, args)``
    (add, delete, add, delete, compact, ...); the stable ids are never deleted (candidates to score)."""
    rng = np.random.default_rng(seed)
    init = _items(rng, n0, d)
    ops, live, next_id = [], list(range(n0)), n0
    stable = set(range(0, n0, 7))
    for s in range(steps):
        if s % 5 in (0, 2):
            k = int(rng.integers(5, 40))
            ops.append(("add", (_items(rng, k, d),)))
            live += list(range(next_id, next_id + k))
            next_id += k
        elif s % 5 in (1, 3):
            cands = [i for i in live if i not in stable]
            pick = rng.choice(len(cands), size=min(len(cands), int(rng.integers(5, 40))), replace=False)
            dead = [cands[int(p)] for p in pick]
            ops.append(("delete", (dead,)))
            live = [i for i in live if i not in set(dead)]
        else:
            ops.append(("compact", ()))
    return init, ops, sorted(stable)


def _filled(d: int, items) -> PackedStore:
    s = PackedStore(d)
    s.add(items)
    return s


def _misses(ref, sc, ids) -> int:
    """How many (id, score) pairs of the result ``(sc, ids)`` differ from the oracle's `ref`."""
    rs, ri = ref
    if rs.shape == sc.shape and torch.equal(rs, sc) and torch.equal(ri, ids):
        return 0
    got, want = set(zip(ids[0].tolist(), sc[0].tolist())), set(zip(ri[0].tolist(), rs[0].tolist()))
    return max(rs.shape[1], sc.shape[1]) - len(got & want)


def concurrency(seed: int = 0, steps: int = 60, readers: int = 3, d: int = 32, n0: int = 1500, k: int = 10,
                n_queries: int = 6, min_searches: int = 300, backend: str | None = None) -> dict:
    """One run of `readers` reader threads against the writer of :func:`_plan` (the module's docstring)."""
    init, ops, stable = _plan(seed, steps, d, n0)
    g = torch.Generator().manual_seed(seed + 1)
    queries = [cg.pack([torch.randn(int(torch.randint(2, 9, (1,), generator=g)), d, generator=g)])
               for _ in range(n_queries)]
    cand = torch.tensor(stable[:50], dtype=torch.int64)
    cand_off = torch.tensor([0, cand.numel()])
    store, oracle = _filled(d, init), []  # the serial oracle: results on every state 0..steps
    for s in range(steps + 1):
        oracle.append([store.search(qv, qo, k=k, backend=backend) for qv, qo in queries])
        if s < steps:
            getattr(store, ops[s][0])(*ops[s][1])
    ref = _filled(d, init)
    cand_expected = [ref.score_candidates(qv, qo, cand_off, cand, backend=backend) for qv, qo in queries]
    get_expected = {int(i): init[int(i)] for i in cand[:10]}

    store, done, stop, lock = _filled(d, init), [0], threading.Event(), threading.Lock()  # done: writer steps
    stats, kinds = Counter(dict.fromkeys(COUNTS, 0)), Counter()

    def count(**add):
        with lock:
            stats.update(add)

    def error(exc):
        count(errors=1)
        with lock:
            kinds[f"{type(exc).__name__}: {str(exc)[:80]}"] += 1

    def reader(rid: int):
        i = rid
        while not stop.is_set() or stats["searches"] < min_searches:
            qi, i, s0 = i % n_queries, i + 1, done[0]
            try:
                sc, ids = store.search(*queries[qi], k=k, backend=backend)
            except Exception as exc:  # noqa: BLE001 - counted
                error(exc)
                continue
            best = min(_misses(oracle[s][qi], sc, ids) for s in range(s0, min(steps, done[0] + 1) + 1))
            count(searches=1, wrong_results=int(best > 0), wrong_pairs=best)
            try:  # readers of stable items: candidates and get
                ok = torch.equal(store.score_candidates(*queries[qi], cand_off, cand, backend=backend),
                                 cand_expected[qi])
                item = int(cand[i % 10])
                ok_get = torch.equal(store.get(item), get_expected[item])
            except Exception as exc:  # noqa: BLE001 - counted
                error(exc)
                continue
            count(cand_calls=1, cand_wrong=int(not ok), get_calls=1, get_wrong=int(not ok_get))

    threads = [threading.Thread(target=reader, args=(r,)) for r in range(readers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for s in range(steps):
        getattr(store, ops[s][0])(*ops[s][1])
        done[0] = s + 1
        time.sleep(0.002)
    stop.set()
    for t in threads:
        t.join()
    final = [store.search(qv, qo, k=k, backend=backend) for qv, qo in queries]  # equals the serial one?
    return {**stats, "error_kinds": dict(kinds), "seconds": round(time.perf_counter() - t0, 2), "writer_steps": steps,
            "final_state_equal": all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                                     for a, b in zip(final, oracle[-1]))}


# ------------------------------------------------------------------------------------------
# memory
# ------------------------------------------------------------------------------------------

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
    reset = h.reset_peak()
    base = h.proc_bytes("VmRSS")
    peak, stop = [base], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], h.proc_bytes("VmRSS"))
            time.sleep(0.002)
    th = threading.Thread(target=sample)
    th.start()
    if legacy and normalize:  # what maxsim_topk(normalize=True) did before: normalise everything, then scan
        from colgraph_engine.ops import scoring
        _, secs = h.timed(cg.maxsim_topk, scoring._unit(qv), qo, scoring._unit(xv), xo, k=10)
    else:
        _, secs = h.timed(cg.maxsim_topk, qv, qo, xv, xo, k=10, normalize=normalize)
    stop.set()
    th.join()
    hwm = h.proc_bytes("VmHWM") if reset else peak[0]
    return dict(normalize=normalize, legacy=legacy, dtype=dtype_name, queries=nq, docs=n_docs,
                store_mib=round(xv.numel() * elem / 2**20, 1), extra_mib=round((max(hwm, peak[0]) - base) / 2**20, 1),
                seconds=round(secs, 3), hwm_reset=reset)


def memory(gib: float = 1.0, dtypes=("float32", "bfloat16"), nqs=(1, 32)) -> list[dict]:
    """Each row in a fresh process; ``legacy`` re-enacts the code before the fix (normalise the
    whole collection, then scan)."""
    return [h.in_fresh_process(_memory_child, norm, gib, dt, nq, legacy)
            for dt in dtypes for nq in nqs for norm, legacy in ((False, False), (True, True), (True, False))]


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


def _native_vs_torch(call) -> str:
    """"consistent" when ``call(backend)`` gives NaN at the same places with backend native and torch."""
    a, b = call("native"), call("torch")
    return "consistent" if torch.equal(torch.isnan(a), torch.isnan(b)) else f"native={a.tolist()} torch={b.tolist()}"


def _nan_docs(backend):
    xv, xo = cg.pack([torch.randn(3, 8), torch.randn(2, 8)])
    xv[1, 2] = float("nan")
    qv, qo = cg.pack([torch.randn(2, 8)])
    return cg.maxsim(qv, qo, xv, xo, backend=backend)


def _nan_query(backend):
    qv = torch.where(torch.arange(QV.numel()).view_as(QV) == 3, float("nan"), QV)
    return cg.maxsim(qv, QO, XV, XO, backend=backend)


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
    ("maxsim NaN in a document: native vs torch", "docs_values", lambda: _native_vs_torch(_nan_docs)),
    ("store.search(NaN query)", "queries", lambda: _store().search([torch.full((2, 8), float("nan"))], k=2)),
    ("store.search('abc')", "queries", lambda: _store().search("abc", k=2)),
    ("store.search([])", "queries", lambda: _store().search([], k=2)),
    ("store.search(2-D tensor, no q_offsets)", "queries", lambda: _store().search(torch.randn(3, 8), k=2)),
    ("store.search([float64 query])", "queries",
     lambda: _store().search([torch.randn(3, 8, dtype=torch.float64)], k=2)),
    ("store.search([int query])", "queries", lambda: _store().search([torch.ones(3, 8, dtype=torch.int32)], k=2)),
    ("store.search(qv, q_offsets=list)", "q_offsets", lambda: _store().search(QV, [0, 3, 5], k=2)),
    ("store.search(qv, q_offsets=int32)", "q_offsets", lambda: _store().search(QV, QO.int(), k=2)),
    ("store.search(5)", "queries", lambda: _store().search(5, k=2)),
    ("store.search(k=np.int64(2))", None, lambda: _store().search(_q(), k=np.int64(2))),
    ("store.search(backend=3)", "backend", lambda: _store().search(_q(), k=2, backend=3)),
    ("store.add([float64 item])", "items", lambda: _store().add([torch.randn(2, 8, dtype=torch.float64)])),
    ("store.add(5)", "items", lambda: _store().add(5)),
    ("store.add((values, int32 offsets))", "items", lambda: _store().add((XV, XO.int()))),
    ("store.add(ids=[2**64-1])", "ids",
     lambda: _store().add([torch.randn(2, 8)], ids=np.array([2**64 - 1], np.uint64))),
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
    ("maxsim(NaN query, native vs torch)", "queries_values", lambda: _native_vs_torch(_nan_query)),
    ("maxsim_topk(k=np.int64(2))", None, lambda: cg.maxsim_topk(QV, QO, XV, XO, np.int64(2))),
    ("maxsim_topk(chunk_docs=2.5)", "chunk_docs", lambda: cg.maxsim_topk(QV, QO, XV, XO, 2, chunk_docs=2.5)),
    ("maxsim_topk(chunk_docs=True)", "chunk_docs", lambda: cg.maxsim_topk(QV, QO, XV, XO, 2, chunk_docs=True)),
    ("maxsim_topk(alive=list)", "alive", lambda: cg.maxsim_topk(QV, QO, XV, XO, 2, alive=[True] * 3)),
    ("maxsim_topk(alive wrong shape)", "alive",
     lambda: cg.maxsim_topk(QV, QO, XV, XO, 2, alive=torch.ones(2, dtype=torch.bool))),
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


def verdict(arg: str | None, fn) -> tuple[str, str]:
    """``(outcome, verdict)`` of one probe: an error must be a TypeError/ValueError naming `arg`."""
    try:
        res = fn()
    except Exception as exc:  # noqa: BLE001 - classified
        kind, msg = type(exc).__name__, (str(exc).splitlines() or [""])[0][:140]
        good_type = isinstance(exc, (TypeError, ValueError)) and kind in ("TypeError", "ValueError", "FormatError")
        named = arg is None or arg in msg
        return f"{kind}: {msg}", "ok" if good_type and named else "argument not named" if good_type else "wrong type"
    if isinstance(res, str):
        return res[:140], "ok" if res in ("ok", "consistent") else "silent"
    if arg is None:
        return "accepted", "ok"
    desc = res if isinstance(res, int) else "returned " + (
        f"{tuple(res[0].shape)}" if isinstance(res, tuple) else type(res).__name__)
    return f"no error ({desc})", "silent"


def bad_input() -> dict:
    rows = []
    for case, arg, fn in PROBES:
        outcome, v = verdict(arg, fn)
        rows.append(dict(case=case, outcome=outcome, verdict=v))
    return dict(rows=rows, counts={v: sum(r["verdict"] == v for r in rows)
                                   for v in ("ok", "silent", "argument not named", "wrong type")})


# ------------------------------------------------------------------------------------------

def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", nargs="?", default="all", choices=["all", "concurrency", "memory", "bad_input"])
    p.add_argument("--json")
    p.add_argument("--gib", type=float, default=1.0, help="memory: the collection's size")
    p.add_argument("--seeds", type=int, default=3, help="concurrency: runs")
    a = p.parse_args(argv)
    out = {}
    if a.part in ("all", "concurrency"):
        runs = [concurrency(seed=s) for s in range(a.seeds)]
        out["concurrency"] = {**{key: sum(r[key] for r in runs) for key in COUNTS},
                              "error_kinds": dict(sum((Counter(r["error_kinds"]) for r in runs), Counter())),
                              "final_state_equal": all(r["final_state_equal"] for r in runs)}
        print("concurrency:", json.dumps(out["concurrency"], indent=1))
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
