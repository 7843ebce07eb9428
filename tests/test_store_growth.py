"""PackedStore grows in O(k) amortised per add of k items: offsets, ids, alive and the sorted-id
lookup live in capacity-doubling buffers (counted here, not timed), published snapshots stay
unchanged, and the lookup kept incrementally equals a fresh sort on every path."""
import pytest
import torch

from colgraph_engine.store import PackedStore

D = 4


def frozen(snap) -> dict:
    s, o = snap.lookup()
    return {"offsets": snap.offsets.clone(), "ids": snap.ids.clone(), "alive": snap.alive.clone(),
            "sorted": s.clone(), "order": o.clone(), "values": snap.values.clone()}


def assert_lookup_fresh(store: PackedStore):
    snap = store.snapshot()
    s, o = snap.lookup()
    ref = torch.sort(snap.ids)
    assert torch.equal(s, ref.values)
    assert torch.equal(snap.ids[o], s)  # positions point at the ids they claim


class SortCounter:
    """Counts the elements torch.sort is asked to sort (instrumentation, the real sort runs)."""

    def __init__(self, monkeypatch):
        self.elements = 0
        real = torch.sort

        def counting(t, *a, **kw):
            self.elements += t.numel()
            return real(t, *a, **kw)
        monkeypatch.setattr(torch, "sort", counting)


def test_adds_copy_amortised_o_k_and_never_resort(monkeypatch):
    store = PackedStore(D)
    rng = torch.Generator().manual_seed(0)
    store.add([torch.randn(2, D, generator=rng)], ids=[5])
    store.snapshot().lookup()  # a lookup exists (as after a first query); adds must keep it without sorting
    sorts = SortCounter(monkeypatch)
    kept = []
    n_adds, per = 3000, 2
    for i in range(n_adds):
        ids = [(i + 1) << 32 | 1, (i + 1) << 32]  # a new document's uids: above every stored id, unsorted inside
        store.add([torch.randn(1, D, generator=rng), torch.randn(3, D, generator=rng)], ids=ids)
        if i % 500 == 0:
            kept.append((store.snapshot(), frozen(store.snapshot())))
    total = 1 + n_adds * per
    assert len(store) == total
    # every column's copies into new buffers sum to less than 2x its final size (doubling), and
    # nothing was re-sorted: only the k new ids of each add
    assert store._cols.copied <= 5 * 2 * (total + 1)
    assert sorts.elements == n_adds * per
    assert store.snapshot()._lookup is not None
    assert_lookup_fresh(store)
    for snap, before in kept:  # earlier snapshots are unchanged by later appends
        after = frozen(snap)
        for k in before:
            assert torch.equal(before[k], after[k]), k


def test_out_of_order_ids_merge_into_the_lookup():
    store = PackedStore(D)
    store.add([torch.ones(1, D)] * 4, ids=[10, 30, 50, 70])
    store.snapshot().lookup()
    store.add([torch.ones(1, D)] * 3, ids=[60, 5, 40])  # below, between and inside the stored range
    assert_lookup_fresh(store)
    assert store.positions([5, 10, 30, 40, 50, 60, 70]).tolist() == [5, 0, 1, 6, 2, 4, 3]
    with pytest.raises(ValueError, match="already in the store"):
        store.add([torch.ones(1, D)], ids=[40])
    store.add([torch.ones(1, D)], ids=[100])  # back on the appending path after a merge
    assert_lookup_fresh(store)
    assert store.ids_between(30, 65).tolist() == [30, 40, 50, 60]


def test_delete_compact_then_add_keep_columns_consistent():
    store = PackedStore(D)
    for i in range(50):
        store.add([torch.full((i % 3 + 1, D), float(i))], ids=[i])
    store.snapshot().lookup()
    store.delete([3, 7, 20])
    store.add([torch.full((2, D), 99.0)], ids=[200])
    assert len(store) == 48 and store.positions([200]).tolist() == [50]
    assert_lookup_fresh(store)
    store.compact()
    store.add([torch.full((1, D), 7.0)], ids=[201])
    assert_lookup_fresh(store)
    assert torch.equal(store.get(201), torch.full((1, D), 7.0))
    assert torch.equal(store.get(49), torch.full((49 % 3 + 1, D), 49.0))
    assert int(store.offsets[-1]) == store.values.shape[0]


def test_extend_wrapped_grows_in_place():
    values = torch.randn(6, D)
    store = PackedStore.wrap(values[:3], torch.tensor([0, 1, 3]), torch.tensor([0, 1]))
    store.extend_wrapped(values[:4], torch.tensor([0, 1]), torch.tensor([2]))
    first = store.snapshot()
    store.extend_wrapped(values, torch.tensor([0, 2]), torch.tensor([3]))
    assert first.offsets.tolist() == [0, 1, 3, 4] and first.ids.tolist() == [0, 1, 2]  # unchanged
    assert store.offsets.tolist() == [0, 1, 3, 4, 6] and store.ids.tolist() == [0, 1, 2, 3]
    copied = store._cols.copied
    big = torch.randn(6 + 1000, D)
    big[:6] = values
    for i in range(1000):
        store.extend_wrapped(big[:7 + i], torch.tensor([0, 1]), torch.tensor([4 + i]))
    assert store._cols.copied - copied <= 3 * 2 * 1010  # offsets, ids, alive: doubling only
    assert torch.equal(store.get(900), big[6 + 896:6 + 897])
    assert_lookup_fresh(store)


def test_wrap_takes_rising_ids_as_their_own_lookup_and_still_checks_others(monkeypatch):
    values = torch.randn(5, D)
    offsets = torch.tensor([0, 1, 2, 3, 5])
    sorts = SortCounter(monkeypatch)
    rising = PackedStore.wrap(values, offsets, torch.tensor([3, 7, 1 << 40, (1 << 40) + 1]))
    assert rising.positions([1 << 40, 3]).tolist() == [2, 0] and sorts.elements == 0  # no sort needed
    assert_lookup_fresh(rising)
    shuffled = PackedStore.wrap(values, offsets, torch.tensor([9, 2, 5, 4]))
    assert shuffled.positions([2, 4, 5, 9]).tolist() == [1, 3, 2, 0]
    assert_lookup_fresh(shuffled)
    for bad in ([1, 1, 2, 3], [5, 2, 5, 1], [-1, 0, 1, 2]):
        with pytest.raises(ValueError, match="unique non-negative"):
            PackedStore.wrap(values, offsets, torch.tensor(bad))
