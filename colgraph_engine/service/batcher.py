"""Dynamic batching: concurrent queries gathered into one ``retrieve_batch`` call.

A query waits in a bounded queue. One dispatcher task (on the server's event loop) takes the
oldest query and waits until ``max_batch`` queries are queued or ``max_wait_s`` has passed since
that oldest query arrived, whichever comes first; then it takes up to ``max_batch`` queries and
runs them in one worker thread, so the event loop keeps accepting requests while the pipeline
works (queries that arrive meanwhile form the next batch, usually without waiting at all).

Grouping (our choice): ``retrieve_batch`` takes one :class:`PipelineConfig`, so the queries of
one take are split by config (equal configs, compared as values, share a call), in the order
their first query arrived; the groups run one after another. Requests without overrides all
share the service's config, so under a uniform load every take is one call.

Isolation: each request is validated before it is queued (a bad question, image or config never
reaches a batch). Should a batch call still raise, every query of it is run again alone, so
only the query that fails gets the error; its neighbours get their results.

Back-pressure: :meth:`DynamicBatcher.submit` raises :class:`QueueFull` when ``queue_size``
queries are waiting (the route answers 429 with Retry-After); :meth:`close` refuses new queries
(:class:`ShuttingDown`) and returns once every queued query has been answered.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..pipeline import PipelineConfig, Query, Result
from .metrics import ServiceMetrics


class QueueFull(RuntimeError):
    """The queue holds ``queue_size`` queries; retry later."""


class ShuttingDown(RuntimeError):
    """The service is draining its queue and takes no new queries."""


@dataclass(frozen=True)
class Answered:
    """A query's result and how it ran: ``batch_size`` queries in its call, seconds queued and
    seconds of the call; ``payload``: what ``finish(result)`` returned (None without `finish`)."""
    result: Result
    batch_size: int
    queue_s: float
    run_s: float
    payload: object = None


@dataclass
class _Waiting:
    query: Query
    config: PipelineConfig
    future: asyncio.Future
    enqueued: float


RunBatch = Callable[[PipelineConfig, list[Query]], list[Result]]


class DynamicBatcher:
    """Gathers queries into ``run_batch(config, queries)`` calls (see the module docstring).

    Args:
        run_batch: called in the worker thread with one config and 1..max_batch queries; returns
            one :class:`Result` per query, in order (``Pipeline.retrieve_batch`` of the current
            index snapshot).
        max_batch: most queries per call (1 turns batching off: every query runs alone).
        max_wait_s: longest time the oldest queued query waits for others (0: take what is queued).
        queue_size: most queries waiting; more are refused with :class:`QueueFull`.
        metrics: where queue depth, batch sizes and stage timings are recorded (optional).
        finish: None, or ``callable(result) -> payload`` run in the worker thread on each result
            before the batch is answered (the service serialises results there: the answers of a
            batch then leave together, so their clients come back together and batch again,
            and the event loop only writes bytes). A query whose `finish` raises gets the error.
    """

    def __init__(self, run_batch: RunBatch, *, max_batch: int = 32, max_wait_s: float = 0.005,
                 queue_size: int = 256, metrics: ServiceMetrics | None = None,
                 finish: Callable[[Result], object] | None = None):
        if not callable(run_batch):
            raise TypeError(f"run_batch: expected a callable, got {type(run_batch).__name__}")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch: expected an int >= 1, got {max_batch!r}")
        if isinstance(max_wait_s, bool) or not isinstance(max_wait_s, (int, float)) or not 0 <= max_wait_s <= 10:
            raise ValueError(f"max_wait_s: expected seconds in [0, 10], got {max_wait_s!r}")
        if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
            raise ValueError(f"queue_size: expected an int >= 1, got {queue_size!r}")
        self.run_batch, self.max_batch, self.max_wait_s, self.queue_size = run_batch, max_batch, float(max_wait_s), queue_size
        if finish is not None and not callable(finish):
            raise TypeError(f"finish: expected None or a callable, got {type(finish).__name__}")
        self.metrics, self.finish = metrics, finish
        self._queue: deque[_Waiting] = deque()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closing = False
        self.batches_run = 0
        self.largest_batch = 0

    # -- life cycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Starts the dispatcher on the running event loop."""
        if self._task is not None:
            raise RuntimeError("the batcher is already started")
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="colgraph-batch")
        self._task = asyncio.get_running_loop().create_task(self._dispatch(), name="colgraph-batcher")

    async def close(self) -> None:
        """Refuses new queries, answers every queued one, then stops the worker."""
        self._closing = True
        if self._task is None:
            return
        self._wake.set()
        await self._task
        self._executor.shutdown(wait=True)

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def depth(self) -> int:
        return len(self._queue)

    def room(self) -> int:
        return self.queue_size - len(self._queue)

    # -- requests ---------------------------------------------------------------------------
    def enqueue(self, queries: Sequence[tuple[Query, PipelineConfig]]) -> list[asyncio.Future]:
        """Queues all `queries` or none (QueueFull when they do not all fit; ShuttingDown while
        draining); returns one future of :class:`Answered` per query."""
        if self._task is None:
            raise RuntimeError("the batcher is not started")
        if self._closing:
            raise ShuttingDown("the service is shutting down")
        if len(self._queue) + len(queries) > self.queue_size:
            raise QueueFull(f"{len(self._queue)} queries are queued (limit {self.queue_size})")
        loop = asyncio.get_running_loop()
        now = time.perf_counter()
        futures = []
        for q, cfg in queries:
            fut = loop.create_future()
            self._queue.append(_Waiting(q, cfg, fut, now))
            futures.append(fut)
        self._gauge()
        self._wake.set()
        return futures

    async def submit(self, query: Query, config: PipelineConfig) -> Answered:
        """Queues one query and waits for its answer (the pipeline's exception when it fails)."""
        return await self.enqueue([(query, config)])[0]

    # -- dispatcher -------------------------------------------------------------------------
    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(len(self._queue))

    async def _dispatch(self) -> None:
        while True:
            while not self._queue:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
            # the window opens when the oldest query arrived, so queries that queued up while the
            # previous batch ran go at once
            deadline = self._queue[0].enqueued + self.max_wait_s
            while len(self._queue) < self.max_batch and not self._closing:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), remaining)
                except asyncio.TimeoutError:
                    break
            take = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
            self._gauge()
            groups: dict[PipelineConfig, list[_Waiting]] = {}
            for w in take:
                if not w.future.done():  # a client that went away cancels its future: skip it
                    groups.setdefault(w.config, []).append(w)
            for cfg, waiting in groups.items():
                await self._run(cfg, waiting)

    async def _run(self, cfg: PipelineConfig, waiting: list[_Waiting]) -> None:
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            outcomes = await loop.run_in_executor(self._executor, self._call_and_finish, cfg,
                                                  [w.query for w in waiting])
        except Exception as exc:  # the executor itself failed: answer everyone with it
            outcomes = [exc] * len(waiting)
        run_s = time.perf_counter() - started
        self.batches_run += 1
        self.largest_batch = max(self.largest_batch, len(waiting))
        m = self.metrics
        if m is not None:
            m.batch_size.observe(len(waiting))
            m.batch_seconds.observe(run_s)
            first = next((o[0] for o in outcomes if isinstance(o, tuple)), None)
            if first is not None:
                for stage, secs in first.timings.items():
                    m.stage_seconds.observe(secs, stage=stage)
        for w, out in zip(waiting, outcomes):
            if m is not None:
                m.queue_seconds.observe(started - w.enqueued)
                m.queries.inc(outcome="ok" if isinstance(out, tuple) else "error")
            if w.future.done():
                continue
            if isinstance(out, BaseException):
                w.future.set_exception(out)
            else:
                w.future.set_result(Answered(out[0], len(waiting), started - w.enqueued, run_s, out[1]))

    def _call_and_finish(self, cfg: PipelineConfig, queries: list[Query]) -> list[tuple | BaseException]:
        """``(result, payload)`` or the exception, per query."""
        out: list[tuple | BaseException] = []
        for r in self._call(cfg, queries):
            if isinstance(r, BaseException) or self.finish is None:
                out.append(r if isinstance(r, BaseException) else (r, None))
                continue
            try:
                out.append((r, self.finish(r)))
            except Exception as exc:
                out.append(exc)
        return out

    def _call(self, cfg: PipelineConfig, queries: list[Query]) -> list[Result | BaseException]:
        """One call for all; when it raises, each query alone, so a failure stays with its query."""
        try:
            results = self.run_batch(cfg, queries)
            if len(results) != len(queries):
                raise RuntimeError(f"run_batch returned {len(results)} results for {len(queries)} queries")
            return list(results)
        except Exception as exc:
            if len(queries) == 1:
                return [exc]
        out: list[Result | BaseException] = []
        for q in queries:
            try:
                out.append(self.run_batch(cfg, [q])[0])
            except Exception as exc:
                out.append(exc)
        return out


__all__ = ["Answered", "DynamicBatcher", "QueueFull", "ShuttingDown"]
