"""A model made on its first use, once: a process that only needs a set's names and dimensions
(the CLI's main process when an isolated worker does the encoding) never loads its weights."""
from __future__ import annotations

import threading
from collections.abc import Callable


class Deferred:
    """``get()`` returns ``make()``, called at most once (the first ``get``), thread-safe."""

    def __init__(self, make: Callable[[], object]):
        if not callable(make):
            raise TypeError(f"make: expected a callable, got {type(make).__name__}")
        self._make, self._value, self._lock = make, None, threading.Lock()

    @property
    def made(self) -> bool:
        return self._value is not None

    def get(self):
        if self._value is None:
            with self._lock:
                if self._value is None:
                    self._value = self._make()
        return self._value


def resolved(source):
    """`source` itself, or what it defers to when it is a :class:`Deferred` (made now if needed)."""
    return source.get() if isinstance(source, Deferred) else source


def warm_in_background(encoders) -> threading.Thread | None:
    """Starts making, in a daemon thread, every model the encoder set `encoders` defers (each
    role's callable holds its :class:`Deferred` as ``_source``), so that an ingest worker loads
    its models while it reads its first file rather than after; None when nothing is deferred.
    A failure there is left for the first real use to raise again, where it is reported."""
    pending = []
    for role in ("text", "tokens", "patches"):
        enc = getattr(encoders, role, None)
        src = getattr(getattr(enc, "fn", None), "_source", None)
        if isinstance(src, Deferred) and not src.made and all(src is not p for p in pending):
            pending.append(src)
    if not pending:
        return None

    def make_all():
        for d in pending:
            try:
                d.get()
            except Exception:  # noqa: BLE001 - the first real get() raises it again, where it is reported
                pass
    thread = threading.Thread(target=make_all, name="colgraph-model-warmup", daemon=True)
    thread.start()
    return thread
