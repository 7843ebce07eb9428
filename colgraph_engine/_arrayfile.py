"""One file of named raw arrays behind a checksummed JSON header (no pickle).

Layout::

    bytes [0, 8)          magic b"CGARRAYS"
    bytes [8, 16)         header length H, uint64 little-endian
    bytes [16, 16 + H)    header: UTF-8 JSON {"format", "version", caller metadata...,
                          "arrays": {name: {"offset", "dtype", "shape", "bytes", "sha256"}}}
    from align64(16 + H)  the data: each array's raw little-endian bytes at ``offset`` (relative
                          to the data start, a multiple of 64), in header order, without overlap

The sha256 of bytes ``[0, 16 + H)`` (:attr:`ArrayFile.header_sha256`, returned by :func:`write`)
identifies the whole file: a caller that records it elsewhere (the knowledge index manifest) checks
the header against it, and the header's per-array sha256 covers every array (checked by
:meth:`ArrayFile.verify`). One file means one fsync per write, where a directory of arrays needs
one per array.

The file is untrusted input: the magic, a header bounded in size and nesting
(:func:`colgraph_engine._arraydir.loads_bounded`), dtypes from a fixed set, extents that are counts,
byte counts equal to the shapes', aligned ranges that lie inside the file and do not overlap; else
:class:`~colgraph_engine._arraydir.FormatError`. Arrays are views of a private (copy-on-write)
memory mapping of the file: pages load on first touch, and writes through a view never reach the
file. Checksums are computed by reading the file, not through the mapping, so verifying does not
keep the file's pages in this process's memory.
"""
from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import struct
import sys
from pathlib import Path

import numpy as np

from ._arraydir import MAX_COUNT, FormatError, loads_bounded

MAGIC = b"CGARRAYS"
ALIGN = 64
MAX_HEADER_BYTES = 1 << 26
_PREFIX = len(MAGIC) + 8
_DTYPES = ("u1", "i1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8")
_BLOCK = 1 << 22


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _dtype_name(dtype: np.dtype) -> str:
    return np.dtype(dtype).str.lstrip("<|=")


def write(path: str | os.PathLike, format_name: str, version: int, meta: dict, arrays: dict[str, np.ndarray], *,
          fsync: bool = True) -> str:
    """Writes `arrays` and `meta` to the new file `path` (which must not exist); returns the
    header's sha256. With ``fsync=False`` the caller fsyncs the file (e.g. together with others);
    on failure nothing is left at `path`."""
    path = Path(path)
    table, blobs, offset = {}, [], 0
    for name, arr in arrays.items():
        arr = np.ascontiguousarray(arr)
        if sys.byteorder != "little":
            arr = arr.byteswap()
        if _dtype_name(arr.dtype) not in _DTYPES:
            raise TypeError(f"arrays[{name!r}]: dtype {arr.dtype} cannot be stored")
        data = memoryview(arr).cast("B") if arr.size else b""
        table[name] = {"offset": offset, "dtype": _dtype_name(arr.dtype), "shape": list(arr.shape),
                       "bytes": arr.nbytes, "sha256": hashlib.sha256(data).hexdigest()}
        blobs.append((offset, data))
        offset = _align(offset + arr.nbytes)
    header = json.dumps({"format": format_name, "version": version, **meta, "arrays": table},
                        separators=(",", ":"), sort_keys=True).encode("utf-8")
    prefix = MAGIC + struct.pack("<Q", len(header)) + header
    start = _align(len(prefix))
    f = open(path, "xb")  # never replaces a file; on failure only what this call created is removed
    try:
        with f:
            f.write(prefix)
            for off, data in blobs:
                f.seek(start + off)
                f.write(data)
            f.truncate(start + offset)  # the last array's padding, so sizes are exact
            f.flush()
            if fsync:
                os.fsync(f.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return hashlib.sha256(prefix).hexdigest()


class ArrayFile:
    """A file written by :func:`write`, opened and checked (see the module docstring).

    Args:
        path: the file.
        format_name, versions: what the header must say.
        header_sha256: when given, the header's sha256 must equal it.
    Attributes: ``meta`` (the header without its array table), ``version``, ``header_sha256``.
    """

    def __init__(self, path: str | os.PathLike, format_name: str, versions: tuple[int, ...], *,
                 header_sha256: str | None = None):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(_PREFIX)
                if len(head) < _PREFIX or head[:len(MAGIC)] != MAGIC:
                    raise FormatError(f"{self.path}: not a {format_name} file (bad magic)")
                (h,) = struct.unpack("<Q", head[len(MAGIC):])
                if h > min(MAX_HEADER_BYTES, size - _PREFIX):
                    raise FormatError(f"{self.path}: header of {h} bytes in a file of {size} (truncated or damaged)")
                header = f.read(h)
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else None
        except OSError as exc:
            raise FormatError(f"{self.path}: unreadable ({exc})") from None
        self.header_sha256 = hashlib.sha256(head + header).hexdigest()
        if header_sha256 is not None and self.header_sha256 != header_sha256:
            raise FormatError(f"{self.path}: header checksum mismatch (expected {header_sha256[:12]}…, "
                              f"got {self.header_sha256[:12]}…)")
        try:
            m = loads_bounded(header.decode("utf-8"), self.path)
        except UnicodeDecodeError as exc:
            raise FormatError(f"{self.path}: header is not UTF-8 ({exc})") from None
        if not isinstance(m, dict) or m.get("format") != format_name:
            raise FormatError(f"{self.path}: not a {format_name} file")
        if m.get("version") not in versions:
            raise FormatError(f"{self.path}: format version {m.get('version')!r}, this build reads {list(versions)}")
        table = m.pop("arrays", None)
        if not isinstance(table, dict):
            raise FormatError(f"{self.path}: header field 'arrays' missing or invalid")
        self.version = m["version"]
        self.meta = m
        self._start = _align(_PREFIX + h)
        self._table = {}
        end = 0
        def position(kv):  # empty arrays share the next array's offset: they sort first
            info = kv[1]
            ok = isinstance(info, dict) and all(isinstance(info.get(k), int) for k in ("offset", "bytes"))
            return (info["offset"], info["bytes"]) if ok else (-1, -1)
        for name, info in sorted(table.items(), key=position):
            self._table[name] = self._check_entry(name, info, size, end)
            end = info["offset"] + info["bytes"]

    def _check_entry(self, name: str, info, size: int, end: int) -> dict:
        def count(x):
            return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_COUNT
        ok = (isinstance(info, dict) and count(info.get("offset")) and info["offset"] % ALIGN == 0
              and info["offset"] >= end and info.get("dtype") in _DTYPES and isinstance(info.get("shape"), list)
              and all(count(x) for x in info["shape"]) and count(info.get("bytes"))
              and isinstance(info.get("sha256"), str) and len(info["sha256"]) == 64)
        if not ok:
            raise FormatError(f"{self.path}: array {name[:80]!r}: header entry invalid or overlapping")
        if info["bytes"] != math.prod(info["shape"]) * np.dtype(info["dtype"]).itemsize:
            raise FormatError(f"{self.path}: array {name!r}: {info['bytes']} bytes do not fit shape {info['shape']}")
        if self._start + info["offset"] + info["bytes"] > size:
            raise FormatError(f"{self.path}: array {name!r} runs past the end of the file (truncated)")
        return info

    @property
    def names(self) -> list[str]:
        return list(self._table)

    def array(self, name: str, dtype, shape: tuple[int, ...]) -> np.ndarray:
        """The array `name`, checked to have `dtype` and `shape`: a writable copy-on-write view
        of the mapped file (a fresh zero-size array when empty)."""
        dtype = np.dtype(dtype)
        info = self._table.get(name)
        if info is None:
            raise FormatError(f"{self.path}: holds no array {name!r}")
        if info["shape"] != list(shape) or info["dtype"] != _dtype_name(dtype):
            raise FormatError(f"{self.path}: array {name!r} is {info['shape']} {info['dtype']}, expected "
                              f"{list(shape)} {_dtype_name(dtype)}")
        n = math.prod(shape)
        if n == 0:
            return np.zeros(shape, dtype)
        return np.frombuffer(self._map, dtype.newbyteorder("<"), n, self._start + info["offset"]).reshape(shape)

    def read_bytes(self, name: str, lo: int, hi: int) -> bytes:
        """Bytes ``[lo, hi)`` of array `name`, read from the file (not through the mapping)."""
        info = self._table[name]
        if not 0 <= lo <= hi <= info["bytes"]:
            raise ValueError(f"lo, hi: expected 0 <= lo <= hi <= {info['bytes']}, got {lo}, {hi}")
        with open(self.path, "rb") as f:
            return os.pread(f.fileno(), hi - lo, self._start + info["offset"] + lo)

    def verify(self) -> None:
        """Checks every array's sha256 (reads the file once)."""
        with open(self.path, "rb") as f:
            for name, info in self._table.items():
                h = hashlib.sha256()
                pos, left = self._start + info["offset"], info["bytes"]
                while left:
                    block = os.pread(f.fileno(), min(left, _BLOCK), pos)
                    if not block:
                        raise FormatError(f"{self.path}: array {name!r} truncated")
                    h.update(block)
                    pos += len(block)
                    left -= len(block)
                if h.hexdigest() != info["sha256"]:
                    raise FormatError(f"{self.path}: array {name!r} checksum mismatch (file changed after it was "
                                      f"written)")


__all__ = ["ALIGN", "ArrayFile", "MAGIC", "write"]
