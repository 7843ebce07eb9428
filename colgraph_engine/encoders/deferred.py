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
