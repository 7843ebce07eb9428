"""One file of arrays behind a checksummed header: round trip, and crafted or damaged files are
clear FormatErrors (nothing read outside the file, nothing allocated from an unchecked count)."""
import hashlib
import json
import struct

import numpy as np
import pytest

from colgraph_engine import _arrayfile
from colgraph_engine._arraydir import FormatError

ARRAYS = {"a": np.arange(10, dtype=np.int64), "empty": np.zeros(0, np.float32),
          "m": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.frombuffer("Zürich".encode(), np.uint8)}


def test_round_trip_views_and_checksums(tmp_path):
    path = tmp_path / "x.arr"
    sha = _arrayfile.write(path, "fmt", 3, {"note": "hi"}, ARRAYS)
    f = _arrayfile.ArrayFile(path, "fmt", (3,), header_sha256=sha)
    f.verify()
    assert f.meta == {"format": "fmt", "version": 3, "note": "hi"} and sorted(f.names) == sorted(ARRAYS)
    for name, arr in ARRAYS.items():
        got = f.array(name, arr.dtype, arr.shape)
        np.testing.assert_array_equal(got, arr)
    v = f.array("a", np.int64, (10,))
    v[0] = 99  # copy-on-write: the file keeps its bytes
    assert _arrayfile.ArrayFile(path, "fmt", (3,)).array("a", np.int64, (10,))[0] == 0
    assert f.read_bytes("b", 1, 3) == "Zürich".encode()[1:3]
    with pytest.raises(FormatError, match="expected \\[5\\] i8"):
        f.array("a", np.int64, (5,))
    with pytest.raises(FormatError, match="holds no array 'zz'"):
        f.array("zz", np.int64, (1,))
    with pytest.raises(FileExistsError):
        _arrayfile.write(path, "fmt", 3, {}, ARRAYS)  # never overwrites
    with pytest.raises(FormatError, match="header checksum mismatch"):
        _arrayfile.ArrayFile(path, "fmt", (3,), header_sha256="0" * 64)
    with pytest.raises(FormatError, match="format version 3, this build reads \\[4\\]"):
        _arrayfile.ArrayFile(path, "fmt", (4,))
    with pytest.raises(FormatError, match="not a other file"):
        _arrayfile.ArrayFile(path, "other", (3,))


def crafted(tmp_path, table: dict, data_bytes: int = 256, magic: bytes = _arrayfile.MAGIC, header_len=None):
    header = json.dumps({"format": "fmt", "version": 1, "arrays": table}).encode()
    prefix = magic + struct.pack("<Q", len(header) if header_len is None else header_len) + header
    start = -(-len(prefix) // 64) * 64
    path = tmp_path / "c.arr"
    path.write_bytes(prefix + b"\0" * (start - len(prefix) + data_bytes))
    return path


def entry(offset, shape, dtype="i8"):
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return {"offset": offset, "dtype": dtype, "shape": list(shape), "bytes": n, "sha256": hashlib.sha256(b"").hexdigest()}


@pytest.mark.parametrize("table, match", [
    ({"a": entry(0, (8,)), "b": entry(32, (8,))}, "invalid or overlapping"),
    ({"a": entry(8, (2,))}, "invalid or overlapping"),                      # not aligned
    ({"a": entry(0, (40,))}, "runs past the end of the file"),
    ({"a": entry(0, (2**40,))}, "runs past the end of the file"),           # never allocated
    ({"a": {**entry(0, (2,)), "bytes": 8}}, "do not fit shape"),
    ({"a": {**entry(0, (2,)), "dtype": "O"}}, "invalid or overlapping"),
    ({"a": {**entry(0, (2,)), "shape": [-1]}}, "invalid or overlapping"),
    ({"a": "x"}, "invalid or overlapping"),
], ids=["overlap", "misaligned", "past-end", "huge", "bytes", "object-dtype", "negative", "not-a-dict"])
def test_crafted_tables_are_format_errors(tmp_path, table, match):
    with pytest.raises(FormatError, match=match):
        _arrayfile.ArrayFile(crafted(tmp_path, table), "fmt", (1,))


def test_bad_magic_and_header_length_are_format_errors(tmp_path):
    with pytest.raises(FormatError, match="bad magic"):
        _arrayfile.ArrayFile(crafted(tmp_path, {}, magic=b"NOTMAGIC"), "fmt", (1,))
    with pytest.raises(FormatError, match="header of .* bytes in a file of"):
        _arrayfile.ArrayFile(crafted(tmp_path, {}, header_len=1 << 40), "fmt", (1,))
    (tmp_path / "short").write_bytes(b"CGA")
    with pytest.raises(FormatError, match="bad magic"):
        _arrayfile.ArrayFile(tmp_path / "short", "fmt", (1,))
    with pytest.raises(FormatError, match="unreadable"):
        _arrayfile.ArrayFile(tmp_path / "missing", "fmt", (1,))
