"""Store search for one fixed query shape, replayed from a CUDA graph.

:meth:`PackedStore.search` issues a few dozen small device ops and one kernel launch per call,
planned in Python. For one query against about a thousand documents the kernel reads ~270 MB
(~60 µs on an H200), while the host path costs about 100 µs on this project's CI CPU
(benchmarks/results/launch_overhead.md): the host, not the device, may set the latency. A CUDA
graph records the device work of one call once and replays it with one launch; the query path
reads nothing back from the device (tests/test_host_waits.py), which is what makes it
capturable.

On a device without CUDA graphs (the CPU) the same object runs the eager search, so code that
uses it runs everywhere.
"""
from __future__ import annotations

import torch

from .. import backend as _backend
from ..ops import scoring as _ops
from .packed_store import PackedStore
from .snapshot import StoreSnapshot


class GraphedSearch:
    """``search(queries)`` for `n_queries` queries of exactly `query_len` tokens each, top `k`.

    The graph is recorded on the first call and again whenever the store publishes a new
    snapshot (after add/delete/compact), so results always reflect the snapshot current at the
    call. Queries must already be on the store's device, in its dtype, finite (the caller
    vouches, as with ``assume_finite=True``); they are copied into the graph's input buffer.

    Returns ``(scores [Nq, k'], ids [Nq, k'])``. On CUDA these are the graph's output buffers,
    overwritten by the next call: clone them to keep them. One object per thread.
    """

    def __init__(self, store: PackedStore, n_queries: int, query_len: int, k: int = 10, *,
                 backend: str | None = None, chunk_docs: int | None = None):
        if not isinstance(store, PackedStore):
            raise TypeError(f"store: expected a PackedStore, got {type(store).__name__}")
        self.store = store
        self.n_queries = _ops.check_positive_int(n_queries, "n_queries")
        self.query_len = _ops.check_positive_int(query_len, "query_len")
        self.k = _ops.check_positive_int(k, "k")
        self.chunk_docs = _ops.check_positive_int(chunk_docs, "chunk_docs", allow_none=True)
        self.backend = backend
        self.uses_graph = store.device.type == "cuda"
        rows = self.n_queries * self.query_len
        self._q_offsets_host = torch.arange(self.n_queries + 1, dtype=torch.int64) * self.query_len
        self._lengths = torch.full((self.n_queries,), self.query_len, dtype=torch.int64)
        self._q_offsets = self._q_offsets_host.to(store.device)
        self._q = torch.zeros((rows, store.dim), dtype=store.dtype, device=store.device)
        self._graph = None
        self._snap: StoreSnapshot | None = None
        self._out = None

    def _check(self, queries: torch.Tensor) -> None:
        want = (self.n_queries * self.query_len, self.store.dim)
        if not isinstance(queries, torch.Tensor):
            raise TypeError(f"queries: expected a torch.Tensor, got {type(queries).__name__}")
        if tuple(queries.shape) != want:
            raise ValueError(f"queries: expected shape [{want[0]}, {want[1]}] (n_queries x query_len rows), "
                             f"got {tuple(queries.shape)}")
        if queries.dtype != self.store.dtype or queries.device != self.store.device:
            raise ValueError(f"queries: expected {self.store.dtype} on {self.store.device}, "
                             f"got {queries.dtype} on {queries.device}")

    def _run(self, snap: StoreSnapshot):
        name = _backend.resolve("store.search", self.store.device, self.backend)
        q = torch.nn.functional.normalize(self._q.float(), dim=-1).to(self.store.dtype) if self.store.normalize \
            else self._q
        return PackedStore._scan(snap, q, self._q_offsets, self._lengths, self.k, name, self.chunk_docs)

    def _record(self, snap: StoreSnapshot) -> None:
        snap.host()  # host copies first: nothing may be read back while recording
        side = torch.cuda.Stream(device=self.store.device)
        side.wait_stream(torch.cuda.current_stream(self.store.device))
        with torch.cuda.stream(side):  # compiles and autotunes outside the recording
            for _ in range(2):
                self._run(snap)
        torch.cuda.current_stream(self.store.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._out = self._run(snap)
        self._graph, self._snap = graph, snap

    def __call__(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self._check(queries)
        snap = self.store.snapshot()
        if not self.uses_graph:
            self._q.copy_(queries)
            return self._run(snap)
        if self._graph is None or self._snap is not snap:
            self._record(snap)
        self._q.copy_(queries)
        self._graph.replay()
        return self._out
