"""The on-disk format of a knowledge index, what a reader needs: the format's constants, the
manifest's loading and validation (untrusted input: names, counts, sha256s), part lists, vector
file names and their mapped rows, the readers' shared lock, and :class:`IndexFormatError`."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ... import _arraydir, _atomic
from ...store.packed_store import _DISK_NP, _DTYPES_BY_NAME
from ..parts import MappedPart
from ..vectors import STORES


INDEX_FORMAT = "colgraph-kg-index"


INDEX_VERSION = 3


READABLE_VERSIONS = (1, 2, 3)


UID_SHIFT = 32


MAX_DOC_NUMBER = 2**31 - 1


_OPEN_ATTEMPTS = 8


_PART_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


_MAX_DIM = 1 << 20


def _stat_key(path: Path) -> tuple | None:
    """What identifies one written version of a file: device, inode, size, change time."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _generation_on_disk(path: Path):
    try:
        return _load_manifest(path)["generation"]
    except (IndexFormatError, OSError):
        return None


def _check_part_sha(path: Path, expected: str) -> None:
    """IndexFormatError unless the part folder `path` exists with the manifest checksum the
    index manifest lists for it (folder parts: versions 1 and 2)."""
    got = _part_sha(path)
    if got is None:
        raise IndexFormatError(f"{path}: part is missing (the manifest lists it)")
    if got != expected:
        raise IndexFormatError(f"{path}: part manifest checksum mismatch (expected {expected[:12]}…, "
                               f"got {str(got)[:12]}…)")


def _part_sha(path: Path) -> str | None:
    mf = path / "manifest.json"
    return _atomic.sha256_file(mf) if mf.is_file() else None


_EMPTY_SHA = hashlib.sha256(b"").hexdigest()


_VECTOR_NAME = re.compile(r"([a-z_]{1,32})\.[0-9a-f]{8,32}\.bin")


def _to_disk_rows(values: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    v = values.detach().cpu().to(dtype).contiguous()
    return (v.view(torch.int16) if dtype == torch.bfloat16 else v).numpy()


def _map_rows(path: Path, rows: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """``[rows, dim]`` over the first rows of raw file `path`, memory-mapped copy-on-write
    (pages load on first touch; writes through it would never reach the file)."""
    if rows == 0:
        return torch.empty((0, dim), dtype=dtype)
    values = torch.from_numpy(np.memmap(path, dtype=_DISK_NP[dtype], mode="c", shape=(rows, dim)))
    return values.view(dtype) if dtype == torch.bfloat16 else values


def _sha_rows(path: Path, first_row: int, n_rows: int, row_bytes: int, h=None) -> str:
    """sha256 of rows ``[first_row, first_row + n_rows)`` of raw file `path`, read in blocks
    (through the page cache, not into this process's memory); `h`: a hash to continue."""
    h = hashlib.sha256() if h is None else h
    with open(path, "rb") as f:
        for block in read_range(f, first_row * row_bytes, n_rows * row_bytes, path):
            h.update(block)
    return h.hexdigest()


def read_range(f, start: int, size: int, path: Path):
    """The `size` bytes of the open file `f` from `start`, in blocks of at most ``_COPY_BLOCK``
    (memory stays bounded whatever the file's size); a file that ends early is refused."""
    f.seek(start)
    while size:
        block = f.read(min(size, _COPY_BLOCK))
        if not block:
            raise IndexFormatError(f"{path}: shorter than its committed rows")
        yield block
        size -= len(block)


def _load_manifest(path: Path) -> dict:
    """The index manifest of `path` (any readable version), validated as untrusted input."""
    mf = path / "manifest.json"
    m = None
    for version in sorted(READABLE_VERSIONS, reverse=True):
        try:
            m = _arraydir.read_versioned_json(path, INDEX_FORMAT, version)
            break
        except IndexFormatError as exc:
            if "format version" not in str(exc):
                raise
            if version == READABLE_VERSIONS[0]:
                raise IndexFormatError(f"{mf}: format version {_version_of(mf)!r}, this build reads "
                                       f"{list(READABLE_VERSIONS)}") from None

    def count(x, top=_arraydir.MAX_COUNT):
        return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= top

    ok = (m.get("dtype") in _DTYPES_BY_NAME and isinstance(m.get("dims"), dict)
          and all(s in STORES and count(d, _MAX_DIM) and d > 0 for s, d in m["dims"].items())
          and isinstance(m.get("encoders"), dict) and count(m.get("generation"))
          and count(m.get("next_doc_number"), MAX_DOC_NUMBER + 1))
    if ok and m["version"] != 1:
        vec = m.get("vectors")
        ok = isinstance(vec, dict) and set(vec) == set(m["dims"]) and all(
            isinstance(v, dict) and isinstance(v.get("file"), str)
            and (g := _VECTOR_NAME.fullmatch(v["file"])) is not None and g.group(1) == s
            and count(v.get("rows")) for s, v in vec.items())
        if not ok:
            raise IndexFormatError(f"{mf}: field 'vectors' missing or invalid (one entry per store: a file named "
                                   f"'<store>.<hex>.bin' and its committed rows)")
    if ok and m["version"] == 3:
        _check_part_list(m, mf, count)
        return m
    ok = ok and isinstance(m.get("parts"), dict) and all(isinstance(h, str) for h in m["parts"].values()) \
        and isinstance(m.get("documents"), list)
    if ok:
        _check_part_names(m["parts"], mf)
        numbers, ids = set(), set()
        for d in m["documents"]:
            if not (isinstance(d, dict) and isinstance(d.get("doc_id"), str) and count(d.get("number"))
                    and d["number"] < m["next_doc_number"] and d.get("part") in m["parts"]
                    and count(d.get("nodes")) and count(d.get("edges"))
                    and d["number"] not in numbers and d["doc_id"] not in ids):
                ok = False
                break
            numbers.add(d["number"])
            ids.add(d["doc_id"])
    if not ok:
        raise IndexFormatError(f"{mf}: fields missing or inconsistent")
    return m


def _version_of(mf: Path):
    try:
        m = _arraydir.loads_bounded(mf.read_text(encoding="utf-8"), mf)
    except (OSError, UnicodeDecodeError, IndexFormatError):
        return None
    return m.get("version") if isinstance(m, dict) else None


def _check_part_names(names, mf: Path) -> None:
    bad = [p for p in names if not _PART_NAME.fullmatch(p)]
    if bad:  # checked here, once, so no caller can be led outside parts/
        raise IndexFormatError(f"{mf}: part name {bad[0][:80]!r} is not a plain file or folder name "
                               f"(letters, digits, '._-', no leading dot, at most 128 characters)")


def _check_part_list(m: dict, mf: Path, count) -> None:
    """Version 3: ``parts`` is a list of ``{"name", "sha256", "documents", "counts"}`` (unique
    plain names, a hex sha256, bounded counts), and ``totals`` are their sums."""
    parts = m.get("parts")
    ok = isinstance(parts, list) and all(
        isinstance(p, dict) and isinstance(p.get("name"), str) and isinstance(p.get("sha256"), str)
        and len(p["sha256"]) == 64 and all(c in "0123456789abcdef" for c in p["sha256"])
        and count(p.get("documents")) and p["documents"] > 0 and isinstance(p.get("counts"), dict)
        and set(p["counts"]) == set(_COUNTED) and all(count(v) for v in p["counts"].values()) for p in parts)
    if not ok:
        raise IndexFormatError(f"{mf}: field 'parts' missing or invalid (a list of name, sha256, documents, counts)")
    names = [p["name"] for p in parts]
    _check_part_names(names, mf)
    if len(set(names)) != len(names):
        raise IndexFormatError(f"{mf}: a part is listed twice")
    totals = {"documents": sum(p["documents"] for p in parts),
              **{k: sum(p["counts"][k] for p in parts) for k in _COUNTED}}
    if m.get("totals") != totals:
        raise IndexFormatError(f"{mf}: 'totals' are not the sums of the parts' counts")


class _DocumentList(Sequence):
    """``documents`` of a version-3 manifest for readers of the version-2 layout (``colgraph
    index info``): its length comes from the manifest; the entries (doc_id, number, part, nodes,
    edges, counts, in document order) are read from the part files on first use."""

    def __init__(self, path: Path, m: dict):
        self._path, self._m, self._docs = path, m, None
        self._n = sum(p["documents"] for p in m["parts"])

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if self._docs is None:
            self._docs = _documents_of(self._path, self._m)
        return self._docs[i]


def _documents_of(path: Path, m: dict) -> list[dict]:
    """The documents of the generation committed when the readers' lock is taken (`m` if it
    is still the current one): under that lock no commit deletes a part being read."""
    with _readers_lock(path, exclusive=False, wait=True):
        now = _load_manifest(path)
        return _documents_of_locked(path, now if now["version"] == 3 else m)


def _documents_of_locked(path: Path, m: dict) -> list[dict]:
    if m["version"] != 3:
        return list(m["documents"])
    docs = []
    for entry in m["parts"]:
        part = MappedPart(path / "parts" / entry["name"], m["dims"], _DTYPES_BY_NAME[m["dtype"]],
                          header_sha256=entry["sha256"], verify=False)
        for i, doc_id in enumerate(part.doc_ids):
            c = part.document(i).counts
            docs.append({"doc_id": doc_id, "number": int(part.numbers[i]), "part": entry["name"],
                         "nodes": c["nodes"], "edges": c["edges"], "counts": {k: c[k] for k in _COUNTED}})
    return docs


def _read_manifest(path: str | os.PathLike) -> dict:
    """The manifest as the command line reads it: :func:`_load_manifest`, and for version 3 a
    ``documents`` list (see :class:`_DocumentList`) in the version-2 shape."""
    path = Path(path)
    m = _load_manifest(path)
    if m["version"] == 3:
        m["documents"] = _DocumentList(path, m)
    return m


def read_documents(path: str | os.PathLike) -> list[dict]:
    """Every document of the index committed in `path`, in order: ``{"doc_id", "number",
    "part", "nodes", "edges", "counts"}`` (read from the part files; any version)."""
    return list(_read_manifest(_as_dir(path))["documents"])


@contextlib.contextmanager
def _readers_lock(path: Path, *, exclusive: bool, wait: bool):
    """``flock`` on the index folder itself. Yields True when held; False when it is not (a
    writer asking without waiting while readers read, or a file system without flock)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # missing folder: the manifest reader reports it
        yield False
        return
    try:
        flags = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB)
        try:
            fcntl.flock(fd, flags)
            held = True
        except BlockingIOError:
            held = False
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            held = False
        yield held
    finally:
        os.close(fd)


_COPY_BLOCK = 1 << 24


IndexFormatError = _arraydir.FormatError


log = logging.getLogger("colgraph_engine")


def _as_dir(path, name: str = "path") -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name}: expected a str or os.PathLike folder, got {type(path).__name__}")
    return Path(path)


_COUNTED = ("nodes", "edges", "segments", "entities", "relations", "images", "regions", "tables")


def _add_counts(totals: dict[str, int], counts: dict[str, int], sign: int = 1) -> dict[str, int]:
    """Adds (``sign=-1``: subtracts) a document's or part's `counts` to `totals` in place."""
    for k in _COUNTED:
        totals[k] += sign * counts[k]
    return totals
