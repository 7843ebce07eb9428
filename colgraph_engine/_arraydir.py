"""Directories of raw arrays with a versioned, checksummed JSON manifest (no pickle).

Layout: ``manifest.json`` plus one ``NAME.bin`` per array (raw little-endian bytes). The manifest
holds ``format``, ``version``, caller metadata, and per file its dtype, shape, byte count and
sha256. Writing is atomic (:mod:`colgraph_engine._atomic`) and refuses to replace an existing
folder that is not a directory of the same format (ValueError naming ``path``); reading checks
format, version, every file's presence, size and (optionally) checksum, and raises
:class:`FormatError` (a ``ValueError``) with the reason.

Manifests are untrusted input: JSON nesting deeper than :data:`MAX_JSON_DEPTH`, integers longer
than :data:`MAX_NUMBER_CHARS` digits, counts above :data:`MAX_COUNT` and shapes whose byte count
differs from the file's real size all raise ``FormatError``; nothing is allocated from a count the
file's size does not back.
"""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from . import _atomic


class FormatError(ValueError):
    """A directory is missing, truncated, tampered with or inconsistent."""


MAX_JSON_DEPTH = 32       # our manifests nest at most 4 deep
MAX_NUMBER_CHARS = 40     # an int64 has 19 digits; a float repr needs < 25 characters
MAX_COUNT = 2**53         # item, token, node, dimension counts and array extents


def loads_bounded(text: str, where) -> object:
    """``json.loads`` for untrusted text: bounded nesting and number length, else FormatError."""
    def number(kind):
        def parse(s: str):
            if len(s) > MAX_NUMBER_CHARS:
                raise FormatError(f"{where}: a number of {len(s)} characters (at most {MAX_NUMBER_CHARS})")
            return kind(s)
        return parse
    try:
        value = json.loads(text, parse_int=number(int), parse_float=number(float))
    except RecursionError:
        raise FormatError(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FormatError(f"{where}: not valid JSON ({exc})") from None
    stack = [(value, 1)]
    while stack:  # iterative: the depth check itself cannot recurse
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                raise FormatError(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH}")
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return value


def _replaceable(format_name: str):
    """A check for :func:`_atomic.write_directory`: `path` may be replaced only when it is an
    empty folder or holds a manifest of `format_name` (any version)."""
    def check(path: Path) -> None:
        if not path.is_dir() or path.is_symlink():
            raise ValueError(f"path: {path} exists and is not a folder; refusing to replace it")
        if not any(path.iterdir()):
            return
        try:
            m = loads_bounded((path / "manifest.json").read_text(encoding="utf-8"), path / "manifest.json")
        except (OSError, UnicodeDecodeError, FormatError):
            m = None
        if not isinstance(m, dict) or m.get("format") != format_name:
            raise ValueError(f"path: {path} is a non-empty folder that holds no {format_name} directory; "
                             f"refusing to replace it (remove it yourself or choose another path)")
    return check


def write(path: str | os.PathLike, format_name: str, version: int, meta: dict, arrays: dict[str, np.ndarray]) -> Path:
    """Atomically writes `arrays` and a manifest with `meta` to directory `path`."""
    def fill(tmp: Path) -> None:
        files = {}
        for name, arr in arrays.items():
            arr = np.ascontiguousarray(arr)
            if sys.byteorder != "little":
                arr = arr.byteswap()
            fname = f"{name}.bin"
            with open(tmp / fname, "wb") as f:
                f.write(memoryview(arr).cast("B") if arr.size else b"")
            files[fname] = {"shape": list(arr.shape), "dtype": arr.dtype.str.lstrip("<|="), "bytes": arr.nbytes,
                            "sha256": _atomic.sha256_file(tmp / fname)}
        manifest = {"format": format_name, "version": version, **meta, "files": files}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))

    return _atomic.write_directory(path, fill, check_existing=_replaceable(format_name))


def read_manifest(path: Path, format_name: str, version: int) -> dict:
    """The manifest of an array directory: :func:`read_versioned_json` plus its file table."""
    m = read_versioned_json(path, format_name, version)
    if not isinstance(m.get("files"), dict):
        raise FormatError(f"{path / 'manifest.json'}: field 'files' missing or invalid")
    return m


def read_versioned_json(path: Path, format_name: str, version: int) -> dict:
    """``path/manifest.json`` as a dict, checked to exist, parse, and carry `format_name` and `version`."""
    mf = path / "manifest.json"
    if not mf.is_file():
        raise FormatError(f"{path}: not a {format_name} directory (no manifest.json)")
    try:
        text = mf.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"{mf}: not valid JSON ({exc})") from None
    m = loads_bounded(text, mf)
    if not isinstance(m, dict) or m.get("format") != format_name:
        raise FormatError(f"{mf}: not a {format_name} manifest")
    if m.get("version") != version:
        raise FormatError(f"{mf}: format version {m.get('version')!r}, this build reads {version}")
    return m


def read_array(path: Path, manifest: dict, name: str, dtype: np.dtype, shape: tuple[int, ...], *,
               verify: bool = True, mmap: bool = False) -> np.ndarray:
    """Reads ``NAME.bin`` after checking it against the manifest and the expected dtype/shape."""
    dtype = np.dtype(dtype)
    fname = f"{name}.bin"
    info = manifest["files"].get(fname)
    if not isinstance(info, dict):
        raise FormatError(f"{path}: manifest lists no {fname}")
    if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_COUNT for x in shape):
        raise FormatError(f"{path / fname}: expected extents {list(shape)} are not counts in [0, 2^53]")
    if not isinstance(info.get("shape"), list) or info["shape"] != list(shape) \
            or info.get("dtype") != dtype.str.lstrip("<|="):
        raise FormatError(f"{path / fname}: manifest says shape {info.get('shape')} {info.get('dtype')}, "
                          f"expected {list(shape)} {dtype.str.lstrip('<|=')}")
    f = path / fname
    if not f.is_file():
        raise FormatError(f"{f}: missing")
    want = math.prod(shape) * dtype.itemsize  # exact (Python ints): a product cannot wrap
    size = f.stat().st_size
    if size != want or info.get("bytes") != want:
        raise FormatError(f"{f}: {size} bytes on disk, expected {want} (truncated or wrong file)")
    if verify and _atomic.sha256_file(f) != info.get("sha256"):
        raise FormatError(f"{f}: checksum mismatch (file changed after it was written)")
    if want == 0:
        return np.zeros(shape, dtype)
    if mmap:  # copy-on-write: callers get a writable view, the file is never modified
        return np.memmap(f, dtype=dtype, mode="c", shape=tuple(shape))
    return np.fromfile(f, dtype=dtype).reshape(shape)


def meta_int(manifest: dict, key: str, path: Path) -> int:
    value = manifest.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise FormatError(f"{path / 'manifest.json'}: field {key!r} missing or invalid")
    return value
