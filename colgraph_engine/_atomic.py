"""Crash-safe writes of whole directories.

A directory is written under a temporary sibling name, every file and the directory are
fsync'ed, and only then is it renamed into place. A crash before the rename leaves the previous
version untouched (the temporary folder is ignored by readers and removed on the next write).
Replacing an existing directory takes two renames (old -> backup, new -> target); a crash
between them leaves the complete previous version under the backup name, which
:func:`recover` restores.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

_BACKUP_TAG = ".old-"


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def recover(path: Path) -> None:
    """If a replace was interrupted between its two renames, puts the previous version back."""
    path = Path(path)
    if path.exists():
        return
    backups = sorted(path.parent.glob(f".{path.name}{_BACKUP_TAG}*"))
    if backups:
        os.rename(backups[-1], path)


def write_directory(path: str | os.PathLike, fill: Callable[[Path], None]) -> Path:
    """Creates or replaces directory `path` with what `fill(tmp_dir)` writes, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover(path)
    for stale in path.parent.glob(f".{path.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        fill(tmp)
        for f in tmp.rglob("*"):
            if f.is_file():
                fsync_file(f)
        fsync_dir(tmp)
        if path.exists():
            backup = path.parent / f".{path.name}{_BACKUP_TAG}{uuid.uuid4().hex}"
            os.rename(path, backup)
            os.rename(tmp, path)
            shutil.rmtree(backup, ignore_errors=True)
        else:
            os.rename(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path
