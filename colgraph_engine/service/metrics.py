"""Prometheus-style metrics in the text exposition format (version 0.0.4), written by hand.

Three kinds, each with optional labels given as keyword arguments:

* :class:`Counter` — ``name{labels} value``, only goes up;
* :class:`Gauge` — ``name{labels} value``, set to the current value;
* :class:`Histogram` — cumulative ``name_bucket{labels,le="b"} n`` for every upper bound ``b``
  (plus ``le="+Inf"``), then ``name_sum`` and ``name_count``.

A :class:`Registry` holds them in registration order and renders the whole page
(``# HELP`` / ``# TYPE`` lines, then samples). Every update takes the metric's lock, so the
event loop, the batch worker and the writer thread can all record.
"""
from __future__ import annotations

import bisect
import math
import threading

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Latency buckets in seconds (ours): 0.5 ms to 30 s, roughly x2-x2.5 apart.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _number(x: float) -> str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return repr(float(x))


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str, labels: tuple[str, ...] = ()):
        if not name.replace("_", "").isalnum() or name[0].isdigit():
            raise ValueError(f"name: expected a metric name of letters, digits and '_', got {name!r}")
        self.name, self.help, self.label_names = name, help_text, tuple(labels)
        self._lock = threading.Lock()
        self._values: dict[tuple[str, ...], object] = {}

    def _key(self, labels: dict) -> tuple[str, ...]:
        if set(labels) != set(self.label_names):
            raise ValueError(f"{self.name}: expected labels {list(self.label_names)}, got {sorted(labels)}")
        return tuple(str(labels[n]) for n in self.label_names)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def inc(self, amount: float = 1.0, **labels) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: a counter only goes up, got {amount}")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels) -> float:
        with self._lock:
            return float(self._values.get(self._key(labels), 0.0))

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return self.header() + [f"{self.name}{_labels(self.label_names, k)} {_number(v)}" for k, v in items]


class Gauge(Counter):
    kind = "gauge"

    def set(self, value: float, **labels) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def inc(self, amount: float = 1.0, **labels) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, help_text: str, labels: tuple[str, ...] = (), buckets=LATENCY_BUCKETS):
        super().__init__(name, help_text, labels)
        b = tuple(float(x) for x in buckets)
        if not b or any(y <= x for x, y in zip(b, b[1:])):
            raise ValueError(f"buckets: expected increasing upper bounds, got {buckets!r}")
        self.buckets = b

    def observe(self, value: float, **labels) -> None:
        key = self._key(labels)
        at = bisect.bisect_left(self.buckets, value)  # first bound >= value (le is inclusive)
        with self._lock:
            counts, total = self._values.get(key, ([0] * (len(self.buckets) + 1), 0.0))
            counts[at] += 1
            self._values[key] = (counts, total + value)

    def count(self, **labels) -> int:
        with self._lock:
            got = self._values.get(self._key(labels))
        return 0 if got is None else sum(got[0])

    def snapshot(self, **labels) -> tuple[list[int], float]:
        """``(per-bucket counts [len(buckets) + 1] (not cumulative; last = above every bound), sum)``."""
        with self._lock:
            counts, total = self._values.get(self._key(labels), ([0] * (len(self.buckets) + 1), 0.0))
            return list(counts), total

    def render(self) -> list[str]:
        with self._lock:
            items = sorted((k, (list(c), s)) for k, (c, s) in self._values.items())
        out = self.header()
        for key, (counts, total) in items:
            running = 0
            for bound, n in zip(self.buckets + (math.inf,), counts):
                running += n
                le = 'le="' + _number(bound) + '"'
                out.append(f"{self.name}_bucket{_labels(self.label_names, key, le)} {running}")
            out.append(f"{self.name}_sum{_labels(self.label_names, key)} {_number(total)}")
            out.append(f"{self.name}_count{_labels(self.label_names, key)} {running}")
        return out


class Registry:
    """Metrics of one service, rendered in registration order."""

    def __init__(self):
        self._metrics: dict[str, _Metric] = {}

    def _add(self, metric: _Metric):
        if metric.name in self._metrics:
            raise ValueError(f"name: a metric named {metric.name!r} is already registered")
        self._metrics[metric.name] = metric
        return metric

    def counter(self, name: str, help_text: str, labels: tuple[str, ...] = ()) -> Counter:
        return self._add(Counter(name, help_text, labels))

    def gauge(self, name: str, help_text: str, labels: tuple[str, ...] = ()) -> Gauge:
        return self._add(Gauge(name, help_text, labels))

    def histogram(self, name: str, help_text: str, labels: tuple[str, ...] = (), buckets=LATENCY_BUCKETS) -> Histogram:
        return self._add(Histogram(name, help_text, labels, buckets))

    def render(self) -> str:
        lines: list[str] = []
        for m in self._metrics.values():
            lines.extend(m.render())
        return "\n".join(lines) + "\n"


class ServiceMetrics:
    """The metrics ``colgraph serve`` exports (all names start with ``colgraph_``)."""

    def __init__(self):
        r = self.registry = Registry()
        self.requests = r.counter("colgraph_requests_total", "HTTP requests answered, by route and status code.",
                                  ("route", "method", "status"))
        self.request_seconds = r.histogram("colgraph_request_seconds", "HTTP request latency in seconds, by route.",
                                           ("route",))
        self.queries = r.counter("colgraph_queries_total", "Queries run by the pipeline, by outcome.", ("outcome",))
        self.rejected = r.counter("colgraph_rejected_total", "Queries refused before queueing, by reason.",
                                  ("reason",))
        self.queue_depth = r.gauge("colgraph_queue_depth", "Queries waiting for a batch now.")
        self.queue_seconds = r.histogram("colgraph_queue_wait_seconds", "Seconds a query waited before its batch ran.")
        self.batch_size = r.histogram("colgraph_batch_size", "Queries per retrieve_batch call.",
                                      buckets=BATCH_SIZE_BUCKETS)
        self.batch_seconds = r.histogram("colgraph_batch_seconds", "Seconds per retrieve_batch call.")
        self.stage_seconds = r.histogram("colgraph_stage_seconds",
                                         "Seconds per pipeline stage per batch (the pipeline's own timings).",
                                         ("stage",))
        self.writes = r.counter("colgraph_writes_total", "Index writes, by operation and outcome.",
                                ("operation", "outcome"))
        self.write_seconds = r.histogram("colgraph_write_seconds", "Seconds per index write (ingest or removal, "
                                         "reopening the committed generation included).", ("operation",))
        self.documents = r.gauge("colgraph_index_documents", "Documents in the index generation being served.")
        self.generation = r.gauge("colgraph_index_generation", "The index generation being served.")

    def render(self) -> str:
        return self.registry.render()


__all__ = ["CONTENT_TYPE", "Counter", "Gauge", "Histogram", "Registry", "ServiceMetrics"]
