"""A read-only sequence of strings over one UTF-8 blob, decoded only when read.

An index opened from disk holds every node's name, type, text and source and every edge's keywords
and text: millions of short strings. As Python ``str`` objects they cost several times their
UTF-8 bytes; kept as the part file's blob plus offsets (a memory-mapped view, so untouched pages
are never loaded), they cost their bytes and are decoded one at a time when a consumer reads them.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np


class StringColumn(Sequence):
    """Strings ``blob[offsets[i]:offsets[i+1]].decode("utf-8")`` for ``i < len(offsets) - 1``.

    Args:
        blob: ``[B]`` uint8 (any buffer-backed array, e.g. a view of a mapped file).
        offsets: ``[k+1]`` int64 ascending byte offsets into `blob` (they need not start at 0:
            a slice of a column shares its blob).

    Behaves as a read-only ``list[str]``: ``len``, indexing (negative too), slices (a
    :class:`StringColumn` for step 1), iteration, ``in``, ``index``/``count``, and ``==`` with any
    sequence of the same strings (a list compares equal). Pickles as a plain ``list``. The caller
    has checked that each string is valid UTF-8 (the part reader does, on open).
    """

    __slots__ = ("_blob", "_offsets")
    only_str = True  # every item reads as a str: checks need not decode the column to know it

    def __init__(self, blob: np.ndarray, offsets: np.ndarray):
        self._blob = blob
        self._offsets = offsets

    @classmethod
    def from_strings(cls, strings: Sequence[str]) -> StringColumn:
        encoded = [s.encode("utf-8") for s in strings]
        offsets = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        return cls(np.frombuffer(b"".join(encoded), np.uint8), offsets)

    def __len__(self) -> int:
        return self._offsets.size - 1

    def _decode(self, i: int) -> str:
        return self._blob[self._offsets[i]:self._offsets[i + 1]].tobytes().decode("utf-8")

    def __getitem__(self, i):
        if isinstance(i, slice):
            a, b, step = i.indices(len(self))
            if step != 1:
                return [self._decode(j) for j in range(a, b, step)]
            return StringColumn(self._blob, self._offsets[a:max(a, b) + 1])
        try:
            j = i.__index__()
        except AttributeError:
            raise TypeError(f"StringColumn indices must be integers or slices, not {type(i).__name__}") from None
        n = len(self)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError("StringColumn index out of range")
        return self._decode(j)

    def take(self, positions) -> list[str]:
        """The strings at ``positions`` (ints in ``[0, len)``, any order), decoded from one copy
        of the bytes they span: reading a few hundred names this way costs one call, not one
        ``__getitem__`` (bounds checks, a slice and a copy) per name."""
        at = np.asarray(positions, np.int64)
        if not at.size:
            return []
        if int(at.min()) < 0 or int(at.max()) >= len(self):
            raise IndexError("StringColumn index out of range")
        o = self._offsets
        lo, hi = int(o[at.min()]), int(o[at.max() + 1])
        data = self._blob[lo:hi].tobytes()
        return [data[a:b].decode("utf-8") for a, b in zip((o[at] - lo).tolist(), (o[at + 1] - lo).tolist())]

    def __iter__(self) -> Iterator[str]:
        if len(self) == 0:
            return
        o = self._offsets
        base = int(o[0])
        data = self._blob[base:int(o[-1])].tobytes()  # one copy of this column's bytes, decoded item by item
        rel = (o - base).tolist()
        for a, b in zip(rel[:-1], rel[1:]):
            yield data[a:b].decode("utf-8")

    def __eq__(self, other) -> bool:
        if isinstance(other, StringColumn) and other._blob is self._blob and np.array_equal(other._offsets, self._offsets):
            return True
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)) or len(other) != len(self):
            return NotImplemented if not isinstance(other, Sequence) else False
        return all(a == b for a, b in zip(self, other))

    __hash__ = None

    def __reduce__(self):
        return list, (list(self),)

    def __repr__(self) -> str:
        head = [self[i] for i in range(min(3, len(self)))]
        return f"StringColumn({head!r}{' ...' if len(self) > 3 else ''}, n={len(self)})"

    @property
    def nbytes(self) -> int:
        """UTF-8 bytes of the strings in this column."""
        return int(self._offsets[-1] - self._offsets[0]) if len(self._offsets) else 0


__all__ = ["StringColumn"]
