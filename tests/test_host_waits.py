"""The store's query path (search, score_candidates) never waits on the device.

No GPU here, so the device is played by the CPU and device memory by :class:`DeviceOnly`: a
tensor subclass whose values the host may not read. Every torch function called on it (or on
anything computed from it, which stays a DeviceOnly) goes through ``__torch_function__``,
which raises :class:`HostRead` for the operations that make a CUDA host thread wait for the
device:

* copies to the host: ``item``, ``tolist``, ``numpy``, ``cpu``, ``to("cpu")``, ``bool``/``int``/
  ``float``/``index`` conversions, printing, ``torch.equal``/``allclose``/``is_nonzero``;
* operations whose output size depends on the values (the host must read a count first):
  ``nonzero``/``argwhere``, ``masked_select``, ``unique*``, ``bincount``, indexing or assigning
  with a bool mask, one-argument ``torch.where``, ``repeat_interleave`` with tensor repeats
  and no ``output_size``.

The Triton launch itself is the device's side (on a GPU it reads nothing on the host); under
the interpreter it runs the kernel on the host, so reads inside it are allowed. What this does
not see: a ``torch.cuda.synchronize()`` call or a CUDA event wait (none exist on these paths:
grep), and the autotuner's timing runs on the first call per key (warm-up's job). The GPU
benchmark confirms on a GPU with ``torch.cuda.set_sync_debug_mode("error")``.
"""
from __future__ import annotations

import threading

import pytest
import torch

import colgraph_engine as cg
from colgraph_engine.ops import reference as ref
from colgraph_engine.store import PackedStore, StoreSnapshot

from .conftest import TRITON, TRITON_DEVICE, assert_scores_match

pytestmark = [TRITON, pytest.mark.skipif(TRITON_DEVICE != "cpu", reason="the stand-in device is the CPU")]


class HostRead(AssertionError):
    """The host read a device tensor's values (a device wait on a GPU)."""


_inside_kernel = threading.local()

_READS = {
    torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu, torch.Tensor.__bool__,
    torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.__complex__,
    torch.Tensor.__array__, torch.Tensor.__repr__, torch.Tensor.__format__, torch.equal, torch.Tensor.equal,
    torch.allclose, torch.Tensor.allclose, torch.is_nonzero, torch.Tensor.is_nonzero,
}
_DATA_DEPENDENT = {
    torch.nonzero, torch.Tensor.nonzero, torch.argwhere, torch.Tensor.argwhere, torch.masked_select,
    torch.Tensor.masked_select, torch.unique, torch.Tensor.unique, torch.unique_consecutive,
    torch.Tensor.unique_consecutive, torch.bincount, torch.Tensor.bincount,
}


def _has_bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


class DeviceOnly(torch.Tensor):
    """A CPU tensor standing for device memory: host reads of its values raise HostRead."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not getattr(_inside_kernel, "on", False):
            name = getattr(func, "__name__", repr(func))
            if func in _READS:
                raise HostRead(f"host read: {name}")
            if func in _DATA_DEPENDENT:
                raise HostRead(f"data-dependent output size: {name}")
            if func in (torch.repeat_interleave, torch.Tensor.repeat_interleave):
                # torch.repeat_interleave(repeats) alone, or (input, repeats)
                alone = func is torch.repeat_interleave and len(args) == 1
                repeats = args[1] if len(args) > 1 else kwargs.get("repeats", args[0] if alone else None)
                if isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None:
                    raise HostRead("repeat_interleave with tensor repeats and no output_size")
            if func is torch.where and len(args) + len(kwargs) == 1:
                raise HostRead("one-argument torch.where (nonzero)")
            if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and _has_bool_index(args[1]):
                raise HostRead(f"bool-mask indexing: {name}")
            if func is torch.Tensor.to and any(
                    (isinstance(a, (str, torch.device)) and torch.device(a).type == "cpu" and a != args[0].device)
                    for a in (*args[1:], kwargs.get("device"))):
                raise HostRead("copy to the host: to(cpu)")
        return super().__torch_function__(func, types, args, kwargs)


def device_only(t: torch.Tensor) -> DeviceOnly:
    return t.as_subclass(DeviceOnly)


@pytest.fixture()
def kernels_run_on_the_device(monkeypatch):
    """Reads inside a Triton launch are the kernel's own (the interpreter runs it on the host)."""
    from colgraph_engine.kernels import maxsim as km
    for kernel in (km._cross_kernel, km._candidates_kernel):
        original = kernel.run

        def run(*args, _original=original, **kwargs):
            _inside_kernel.on = True
            try:
                return _original(*args, **kwargs)
            finally:
                _inside_kernel.on = False
        monkeypatch.setattr(kernel, "run", run)


def make_store(lengths, d, dtype, seed, delete=()):
    g = torch.Generator().manual_seed(seed)
    store = PackedStore(d, dtype)
    store.add([torch.randn(n, d, generator=g) for n in lengths], ids=torch.arange(100, 100 + len(lengths)))
    if delete:
        store.delete(list(delete))
    return store


def guard(store: PackedStore) -> PackedStore:
    """The same store with its device tensors replaced by DeviceOnly views; the host copies a
    first call makes (:meth:`StoreSnapshot.host`) are made before, from the plain tensors."""
    snap = store.snapshot()
    host = snap.host()
    sorted_ids, order = snap.lookup()
    store._snap = StoreSnapshot(device_only(snap.values), device_only(snap.offsets), device_only(snap.ids),
                                device_only(snap.alive), snap.next_id, snap.n_live,
                                (device_only(sorted_ids), device_only(order)),
                                type(host)(*(t.clone() for t in host)))
    return store


def test_the_guard_catches_every_kind_of_wait():
    x = device_only(torch.tensor([0, 2, 2, 5]))
    waits = [lambda: x.item() if x.numel() == 1 else x[0].item(), x.tolist, x.cpu, lambda: bool(x[0]),
             lambda: int(x[1]), x.nonzero, lambda: torch.unique(x), lambda: x[x > 1],
             lambda: torch.repeat_interleave(torch.arange(3), x.diff()), lambda: torch.where(x > 1),
             lambda: torch.bincount(x), lambda: x.to("cpu"), lambda: print(x), x.numpy]
    for wait in waits:
        with pytest.raises(HostRead):
            wait()
    # ...and lets the device-side work through
    y = torch.repeat_interleave(torch.arange(3), x.diff(), output_size=5)
    assert isinstance(y, DeviceOnly) and isinstance(torch.cumsum(x, 0)[1:] - x[:-1], DeviceOnly)


def test_the_guard_sees_the_waits_of_the_checking_free_function(kernels_run_on_the_device):
    """The free functions validate device offsets (reads): the guard must catch that, or it
    would prove nothing about the store path."""
    g = torch.Generator().manual_seed(1)
    qv, qo = cg.pack([torch.randn(3, 16, generator=g)])
    xv, xo = cg.pack([torch.randn(5, 16, generator=g)])
    with pytest.raises(HostRead):
        cg.maxsim(device_only(qv), device_only(qo), device_only(xv), device_only(xo), backend="triton")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_store_search_and_candidates_read_nothing_back(kernels_run_on_the_device, dtype):
    d = 24
    lengths = [0, 1, 64, 65, 7, 30, 0, 3, 129]
    plain = make_store(lengths, d, dtype, seed=2, delete=(103,))
    want_values, want_offsets = plain.values.clone(), plain.offsets.clone()
    store = guard(make_store(lengths, d, dtype, seed=2, delete=(103,)))
    g = torch.Generator().manual_seed(3)
    q_lengths = [5, 1, 150]  # a query past MAX_LQP runs in pieces
    qv_host, qo_host = cg.pack([torch.randn(n, d, generator=g) for n in q_lengths], dtype=dtype)

    # Queries already on the device (values), their offsets known on the host.
    scores, ids = store.search(device_only(qv_host), qo_host, k=4, backend="triton", chunk_docs=4,
                               assume_finite=True)
    assert isinstance(scores, torch.Tensor) and scores.shape == (3, 4)
    # Queries on the host (checked there for NaN/inf, then copied).
    scores2, ids2 = store.search(list(cg.unpack(qv_host, qo_host)), k=4, backend="triton")

    lists = [[101, 101, 100, 108], [], [102, 104, 105, 108, 108, 101, 100, 106, 107, 102, 102]]
    co = torch.tensor([0] + [len(x) for x in lists]).cumsum(0)
    flat = [i for x in lists for i in x]
    cand = store.score_candidates(device_only(qv_host), qo_host, co, torch.tensor(flat), backend="triton",
                                  assume_finite=True)

    # The answers are right, too (compared outside the guarded calls).
    full = ref.maxsim_cross_reference(qv_host.double(), qo_host, want_values.double(), want_offsets, torch.float64)
    same = ref.maxsim_cross_reference(qv_host, qo_host, want_values, want_offsets, dtype)
    full[:, 3] = float("-inf")  # deleted
    for s, i in ((scores, ids), (scores2, ids2)):
        s, i = s.as_subclass(torch.Tensor), i.as_subclass(torch.Tensor)
        pos = i - 100
        assert_scores_match(s, full.gather(1, pos), same.gather(1, pos), "search")
        best4 = torch.topk(full, 4, dim=1).values  # the 4 best live scores (up to ties and rounding)
        assert torch.allclose(s.double(), best4, atol=0.05, rtol=0.01) and bool((pos != 3).all())
    owner = torch.repeat_interleave(torch.arange(3), co.diff())
    pos = torch.tensor(flat) - 100
    assert_scores_match(cand.as_subclass(torch.Tensor), full[owner, pos], same[owner, pos], "candidates")


def test_warmup_compiles_then_queries_read_nothing_back(kernels_run_on_the_device):
    store = make_store([3, 9, 0, 17], 16, torch.float32, seed=4)
    spent = store.warmup(query_lengths=(4,), n_queries=(1, 2), candidates_per_query=3, backend="triton")
    assert set(spent) == {"search_s", "candidates_s"} and spent["search_s"] > 0 and spent["candidates_s"] > 0
    guard(store)
    q = device_only(torch.randn(4, 16))
    scores, ids = store.search(q, torch.tensor([0, 4]), k=2, backend="triton", assume_finite=True)
    assert scores.shape == ids.shape == (1, 2)


def test_graphed_search_equals_search_and_follows_writes(kernels_run_on_the_device):
    """The graph path itself needs CUDA (the GPU benchmark runs it); here the same object runs
    the eager device work, which must read nothing back and equal :meth:`search`."""
    from colgraph_engine.store.graphed_search import GraphedSearch
    store = make_store([3, 9, 0, 17, 64, 65], 16, torch.float32, seed=8)
    fast = GraphedSearch(store, n_queries=2, query_len=5, k=3, backend="triton")
    q = torch.randn(10, 16, generator=torch.Generator().manual_seed(9))
    want = store.search(q, torch.tensor([0, 5, 10]), k=3, backend="triton")
    guard(store)
    got = fast(device_only(q))
    for g, w in zip(got, want):
        assert torch.equal(g.as_subclass(torch.Tensor), w)
    with pytest.raises(ValueError, match="queries: expected shape"):
        fast(q[:9])


def test_graphed_search_sees_a_new_snapshot():
    from colgraph_engine.store.graphed_search import GraphedSearch
    store = make_store([3, 9], 16, torch.float32, seed=10)
    fast = GraphedSearch(store, n_queries=1, query_len=4, k=1, backend="triton")
    q = torch.randn(4, 16, generator=torch.Generator().manual_seed(11))
    store.add([q.clone()], ids=[7])  # the query itself: it must win after the write
    assert fast(q)[1].tolist() == [[7]]
