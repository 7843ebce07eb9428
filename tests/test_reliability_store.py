"""Issue 12 reproducers for the in-memory store and the MaxSim ops: snapshot isolation under
concurrent writers, bounded memory of maxsim_topk(normalize=True), and bad input."""
import threading

import numpy as np
import pytest
import torch

import colgraph_engine as cg
from colgraph_engine import PackedStore
from colgraph_engine.ops import scoring

from .conftest import NATIVE


def _items(n, d=16, seed=0, lo=1, hi=10):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(int(torch.randint(lo, hi, (1,), generator=g)), d, generator=g) for _ in range(n)]


def _plan(steps, d, seed=0):
    ops, live, next_id = [], list(range(600)), 600
    rng = np.random.default_rng(seed)
    for s in range(steps):
        if s % 3 == 0:
            ops.append(("add", _items(20, d, seed=1000 + s)))
            live += list(range(next_id, next_id + 20))
            next_id += 20
        elif s % 3 == 1:
            dead = [live[int(i)] for i in rng.choice(len(live), 20, replace=False)]
            ops.append(("delete", dead))
            live = [i for i in live if i not in set(dead)]
        else:
            ops.append(("compact", None))
    return ops


def _apply(store, op):
    kind, payload = op
    if kind == "add":
        store.add(payload)
    elif kind == "delete":
        store.delete(payload)
    else:
        store.compact()


def test_searches_concurrent_with_add_delete_compact_see_one_snapshot():
    d, steps, k = 16, 24, 8
    init = _items(600, d)
    ops = _plan(steps, d)
    queries = [cg.pack([torch.randn(4, d, generator=torch.Generator().manual_seed(50 + i))]) for i in range(4)]
    oracle_store = PackedStore(d)
    oracle_store.add(init)
    oracle = []
    for s in range(steps + 1):
        oracle.append([oracle_store.search(*q, k=k) for q in queries])
        if s < steps:
            _apply(oracle_store, ops[s])

    store = PackedStore(d)
    store.add(init)
    done, errors, wrong, searches = [0], [], [0], [0]
    stop = threading.Event()

    def reader(r):
        i = r
        while not stop.is_set() or searches[0] < 300:
            qi = i % len(queries)
            i += 1
            s0 = done[0]
            try:
                sc, ids = store.search(*queries[qi], k=k)
                n = len(store)
            except Exception as exc:  # noqa: BLE001 - any error is a failure here
                errors.append(repr(exc))
                return
            s1 = min(steps, done[0] + 1)
            ok = any(torch.equal(sc, oracle[s][qi][0]) and torch.equal(ids, oracle[s][qi][1]) for s in range(s0, s1 + 1))
            wrong[0] += not ok
            searches[0] += 1
            assert n >= 0

    threads = [threading.Thread(target=reader, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for s in range(steps):
        _apply(store, ops[s])
        done[0] = s + 1
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors[:3]
    assert wrong[0] == 0, f"{wrong[0]} of {searches[0]} searches matched no snapshot"
    assert searches[0] >= 300


def test_reader_takes_one_snapshot_even_if_the_store_changes_mid_call(monkeypatch):
    """Deterministic: a compact() published while search is inside the scan changes nothing."""
    store = PackedStore(8)
    store.add(_items(50, 8))
    store.delete(list(range(0, 50, 2)))
    q = [torch.randn(3, 8)]
    expected = store.search(q, k=5)
    real = scoring.topk_scan
    fired = []

    def scan_then_compact(*args, **kw):
        if not fired:
            fired.append(1)
            store.compact()  # a writer publishes a new version mid-search
        return real(*args, **kw)

    monkeypatch.setattr(scoring, "topk_scan", scan_then_compact)
    got = store.search(q, k=5)
    assert fired and torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert store.n_slots == 25


def test_snapshot_is_immutable_across_writes():
    store = PackedStore(8)
    store.add(_items(10, 8))
    snap = store.snapshot()
    before = (snap.values.clone(), snap.offsets.clone(), snap.ids.clone(), snap.alive.clone())
    store.add(_items(30, 8, seed=3))
    store.delete([1, 2])
    store.compact()
    for a, b in zip(before, (snap.values, snap.offsets, snap.ids, snap.alive)):
        assert torch.equal(a, b)
    assert len(store) == 38 and snap.n_live == 10


def test_topk_normalize_normalises_chunk_by_chunk(monkeypatch):
    """The normalised copy never exceeds NORMALIZE_BLOCK_ELEMS values (one document longer than
    that aside), and results equal normalising everything first."""
    monkeypatch.setattr(scoring, "NORMALIZE_BLOCK_ELEMS", 64 * 16)
    xv, xo = cg.pack(_items(200, 16, lo=0, hi=20))
    qv, qo = cg.pack(_items(3, 16, seed=9))
    sizes = []
    real = scoring._normalized_block

    def spy(x, lo, hi, scratch):
        sizes.append(hi - lo)
        return real(x, lo, hi, scratch)

    monkeypatch.setattr(scoring, "_normalized_block", spy)
    for dtype in (torch.float32, torch.bfloat16):
        sizes.clear()
        x, q = xv.to(dtype), qv.to(dtype)
        got = cg.maxsim_topk(q, qo, x, xo, 7, normalize=True)
        exp = cg.maxsim_topk(scoring._unit(q), qo, scoring._unit(x), xo, 7)
        assert torch.equal(got[0], exp[0]) and torch.equal(got[1], exp[1])
        assert len(sizes) > 10 and max(sizes) <= 64


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_normalized_block_is_bit_identical_to_unit(dtype):
    x = (torch.randn(300, 24) * 5).to(dtype)
    x[7] = 0
    assert torch.equal(scoring._normalized_block(x, 0, 300, {}), scoring._unit(x))
    # blocks reuse one scratch buffer: a later, smaller block gives its own rows, unmixed
    scratch = {}
    first = scoring._normalized_block(x, 0, 300, scratch).clone()
    assert torch.equal(first, scoring._unit(x))
    assert torch.equal(scoring._normalized_block(x, 100, 150, scratch), scoring._unit(x)[100:150])


# -- bad input ---------------------------------------------------------------------------------

def _store(dtype=torch.float32):
    s = PackedStore(8, dtype)
    s.add(_items(4, 8))
    return s


def _state(s):
    snap = s.snapshot()
    return (snap.values.clone(), snap.offsets.clone(), snap.ids.clone(), snap.alive.clone(), snap.next_id)


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a[:4], b[:4])) and a[4] == b[4]


@pytest.mark.parametrize("chunk,exc", [(-1, ValueError), (0, ValueError), (1.5, TypeError), (True, TypeError)])
def test_search_rejects_bad_chunk_docs(chunk, exc):
    with pytest.raises(exc, match="chunk_docs"):
        _store().search([torch.randn(2, 8)], k=2, chunk_docs=chunk)
    with pytest.raises(exc, match="chunk_docs"):
        cg.maxsim_topk(*cg.pack([torch.randn(2, 8)]), *cg.pack(_items(3, 8)), 2, chunk_docs=chunk)


def test_numpy_ints_are_ints():
    s = _store()
    assert s.search([torch.randn(2, 8)], k=np.int64(2))[1].shape == (1, 2)
    assert s.search([torch.randn(2, 8)], k=2, chunk_docs=np.int32(1))[1].shape == (1, 2)


def test_delete_rejects_repeated_ids_and_deletes_nothing():
    s = _store()
    before = _state(s)
    with pytest.raises(ValueError, match="ids: expected each id once"):
        s.delete([0, 0])
    assert _same(before, _state(s))
    assert s.delete([0, 1]) == 2


def test_requires_grad_is_rejected_and_the_store_stays_usable():
    s = _store()
    before = _state(s)
    with pytest.raises(ValueError, match="items.*requires grad"):
        s.add([torch.randn(2, 8, requires_grad=True)])
    assert _same(before, _state(s))
    with pytest.raises(ValueError, match="queries.*requires grad"):
        s.search([torch.randn(2, 8, requires_grad=True)], k=2)
    assert s.search([torch.randn(2, 8)], k=2)[1].shape == (1, 2)


@NATIVE
def test_native_ops_reject_requires_grad_torch_keeps_the_graph():
    qv, qo = cg.pack([torch.randn(3, 8)])
    xv, xo = cg.pack(_items(3, 8))
    with pytest.raises(ValueError, match="queries_values.*native"):
        cg.maxsim(qv.requires_grad_(), qo, xv, xo, backend="native")
    out = cg.maxsim(qv, qo, xv, xo, backend="torch")
    out.sum().backward()
    assert qv.grad is not None


def test_default_ids_never_overflow_int64():
    s = _store()
    s.add([torch.randn(2, 8)], ids=[2**63 - 1])
    before = _state(s)
    with pytest.raises(ValueError, match="ids: .*2\\*\\*63 - 1.*pass ids="):
        s.add([torch.randn(2, 8)])
    assert _same(before, _state(s))
    assert s.add([torch.randn(2, 8)], ids=[7]).tolist() == [7]


@pytest.mark.parametrize("device,exc", [("foo", ValueError), (3.5, TypeError), ("meta", ValueError)])
def test_bad_device_names_device(device, exc):
    with pytest.raises(exc, match="device"):
        PackedStore(8, device=device)
    with pytest.raises(exc, match="device"):
        _store().to(device)


def test_fp16_overflow_is_rejected_not_stored_as_inf():
    s = PackedStore(8, torch.float16)
    with pytest.raises(ValueError, match="items: expected values within the torch.float16 range.*row 3"):
        s.add([torch.randn(3, 8), torch.full((1, 8), 1e6)])
    assert s.n_slots == 0
    with pytest.raises(ValueError, match="queries"):
        s.search([torch.full((2, 8), 1e6)], k=1)


@pytest.mark.parametrize("backend", [pytest.param("native", marks=NATIVE), "torch"])
@pytest.mark.parametrize("where", ["queries_values", "docs_values"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_ops_reject_non_finite_on_every_backend(backend, where, bad):
    qv, qo = cg.pack([torch.randn(3, 8)])
    xv, xo = cg.pack(_items(3, 8))
    (qv if where == "queries_values" else xv)[1, 2] = bad
    co, ci = torch.tensor([0, 2]), torch.tensor([0, 2])
    for call in (lambda: cg.maxsim(qv, qo, xv, xo, backend=backend),
                 lambda: cg.maxsim_topk(qv, qo, xv, xo, 2, backend=backend),
                 lambda: cg.maxsim_candidates(qv, qo, xv, xo, co, ci, backend=backend)):
        with pytest.raises(ValueError, match=f"{where}: expected finite values"):
            call()


def test_candidates_check_only_the_listed_documents():
    qv, qo = cg.pack([torch.randn(3, 8)])
    xv, xo = cg.pack(_items(40, 8))
    xv[int(xo[39])] = float("nan")  # an unlisted document
    co, ci = torch.tensor([0, 2]), torch.tensor([0, 5])
    assert torch.isfinite(cg.maxsim_candidates(qv, qo, xv, xo, co, ci)).all()
    with pytest.raises(ValueError, match="docs_values"):
        cg.maxsim_candidates(qv, qo, xv, xo, co, torch.tensor([0, 39]))


def test_store_search_rejects_non_finite_queries():
    with pytest.raises(ValueError, match="queries: expected finite"):
        _store().search([torch.full((2, 8), float("nan"))], k=2)


@pytest.mark.parametrize("call,exc,needle", [
    (lambda s: s.search("abc", k=2), TypeError, "queries"),
    (lambda s: s.search([], k=2), ValueError, "queries"),
    (lambda s: s.search(5, k=2), TypeError, "queries"),
    (lambda s: s.search(torch.randn(3, 8), k=2), ValueError, "queries"),
    (lambda s: s.search([torch.randn(3, 8, dtype=torch.float64)], k=2), TypeError, "queries"),
    (lambda s: s.search(torch.randn(3, 8), [0, 3], k=2), TypeError, "q_offsets"),
    (lambda s: s.search(torch.randn(3, 8), torch.tensor([0, 3], dtype=torch.int32), k=2), TypeError, "q_offsets"),
    (lambda s: s.score_candidates(torch.randn(3, 8), [0, 3], torch.tensor([0, 1]), torch.tensor([1])), TypeError,
     "q_offsets"),
    (lambda s: s.add([torch.randn(2, 8, dtype=torch.float64)]), TypeError, "items"),
    (lambda s: s.add(5), TypeError, "items"),
    (lambda s: s.add([torch.randn(2, 8)], ids=np.array([2**64 - 1], np.uint64)), ValueError, "ids: .*int64 range"),
    (lambda s: s.add([torch.randn(2, 8)], ids=[2**70]), ValueError, "ids: .*int64 range"),
    (lambda s: s.get(999), ValueError, "item_id"),
    (lambda s: s.get("a"), TypeError, "item_id"),
    (lambda s: s.get(1.0), TypeError, "item_id"),
    (lambda s: s.ids_between("a", 5), TypeError, "low"),
    (lambda s: s.ids_between(0.5, 3), TypeError, "low"),
    (lambda s: s.ids_between(0, None), TypeError, "high"),
    (lambda s: s.delete([2**70]), ValueError, "ids"),
    (lambda s: PackedStore("8"), TypeError, "dim"),
])
def test_store_bad_input_names_the_argument_and_mutates_nothing(call, exc, needle):
    s = _store()
    before = _state(s)
    with pytest.raises(exc, match=needle):
        call(s)
    assert _same(before, _state(s))


def test_ids_between_accepts_any_int_range():
    s = _store()
    s.add([torch.randn(1, 8)], ids=[2**63 - 1])
    assert s.ids_between(-5, 2**70).tolist() == [0, 1, 2, 3, 2**63 - 1]
    assert s.ids_between(3, 1).tolist() == []


@pytest.mark.parametrize("call,exc,needle", [
    (lambda: cg.pack(5), TypeError, "items"),
    (lambda: cg.pack("ab"), TypeError, "items"),
    (lambda: cg.pack([torch.ones(2, 3, dtype=torch.int64)]), TypeError, r"items\[0\]"),
    (lambda: cg.unpack(torch.randn(4, 2), [0, 4]), TypeError, "offsets"),
    (lambda: cg.unpack(torch.randn(4, 2), torch.tensor([0, 9])), ValueError, "offsets"),
    (lambda: cg.unpack(None, torch.tensor([0])), TypeError, "values"),
])
def test_packed_bad_input(call, exc, needle):
    with pytest.raises(exc, match=needle):
        call()
