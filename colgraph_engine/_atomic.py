"""Crash-safe, concurrency-safe writes of whole directories.

Protocol for ``write_directory(path, fill)`` (``P`` = ``path.parent``, ``N`` = ``path.name``):

1. ``fill`` writes the new version into ``P/.N.tmp-<pid>-<rand>``, a name no other writer uses;
   every file and the folder are fsync'ed. No lock is held meanwhile.
2. Under an exclusive ``flock`` on the folder ``P`` (the *commit lock*; no file is created for it):
   finish any interrupted commit (below), remove leftovers of writers that are provably dead
   (their pid, part of every temporary name, no longer runs), then
   * if ``path`` does not exist: one ``rename(tmp, path)``;
   * else write the *journal* ``P/.N.journal`` (``{"new": tmp, "old": backup}``, written to a
     temporary file, fsync'ed, renamed), then ``rename(path, backup)``, ``rename(tmp, path)``,
     fsync ``P``, delete the journal, fsync ``P``.
3. After the lock is released, the writer deletes its backup ``P/.N.old-<pid>-<rand>``.

The journal is the commit point: once it exists the new version is complete on disk and *is*
the current one. Recovery (:func:`recover`, run under the commit lock by every writer and by
every reader that finds a journal) rolls forward: it repeats whichever of the two renames have
not happened, so it never puts back an older version while the new one is complete; only if the
new folder is gone (removed by hand) does it fall back to the backup. Without a journal a backup
is never restored: it is garbage of a writer killed while deleting it, removed once its writer is
dead. A successful save leaves no backup and no temporary folder of its own behind.

Readers (:func:`reading`) hold a shared ``flock`` on ``P`` while they read ``path``, so a commit
(exclusive) never swaps the directory under a reader: a reader sees the whole version that was
current when it took the lock. Files it memory-maps stay readable after a later commit replaces
and deletes them (POSIX keeps unlinked, open files alive).

Two writers of one path both succeed; the one that commits last wins. Pids identify writers, so
writers sharing a folder from different pid namespaces (containers) or hosts are not supported.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

_TMP_TAG = ".tmp-"
_BACKUP_TAG = ".old-"
_JOURNAL_TAG = ".journal"


def own_names(pattern: str) -> re.Pattern:
    """A regex matching names of `pattern` and the temporaries, backups and journals that
    :func:`write_directory` (and the hidden ``.<name>.tmp-<tag>`` files of atomic file writes)
    makes beside them: what a cleanup may delete as its own writer's, and nothing else."""
    tags = "|".join(re.escape(t) for t in (_TMP_TAG, _BACKUP_TAG, _JOURNAL_TAG))
    return re.compile(rf"(?:{pattern})|\.(?:{pattern})(?:{tags})[A-Za-z0-9._-]*")


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


def _writer_tag() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


def _owner_pid(name: str, prefix: str) -> int | None:
    """The pid in a temporary/backup name this module made (``<prefix><pid>-<hex>``), else None."""
    pid, sep, rand = name[len(prefix):].partition("-")
    if not (sep and pid.isdigit() and len(pid) < 10 and rand and all(c in "0123456789abcdef" for c in rand)):
        return None
    return int(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _journal(path: Path) -> Path:
    return path.parent / f".{path.name}{_JOURNAL_TAG}"


@contextlib.contextmanager
def _folder_lock(folder: Path, exclusive: bool) -> Iterator[int | None]:
    """``flock`` on the folder itself (no lock file). Yields the fd (None where the file system
    has no flock: then nothing is locked)."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            yield None
            return
        yield fd
    finally:
        os.close(fd)  # closing releases the lock


def _needs_recovery(path: Path) -> bool:
    return _journal(path).exists()


def _finish(path: Path, new: Path, old: Path) -> None:
    """Completes a journaled replace (idempotent; commit lock held)."""
    if new.is_dir():
        if path.exists():
            os.rename(path, old)
        os.rename(new, path)
    elif not path.exists() and old.is_dir():  # the new folder was removed by hand: keep the old one
        os.rename(old, path)
    fsync_dir(path.parent)
    _journal(path).unlink(missing_ok=True)
    fsync_dir(path.parent)


def _recover_locked(path: Path) -> None:
    j = _journal(path)
    if not j.exists():
        return
    pre = f".{path.name}"
    try:
        data = json.loads(j.read_text(encoding="utf-8"))
        new, old = data["new"], data["old"]
        ok = isinstance(new, str) and isinstance(old, str) and new.startswith(pre + _TMP_TAG) \
            and old.startswith(pre + _BACKUP_TAG) and "/" not in new + old and os.sep not in new + old
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        ok = False
    if not ok:  # written atomically, so only tampering gets here: it names nothing we may move
        j.unlink(missing_ok=True)
        return
    _finish(path, path.parent / new, path.parent / old)
    shutil.rmtree(path.parent / old, ignore_errors=True)


def _remove_dead_leftovers(path: Path) -> None:
    """Removes temporaries and backups of `path` whose writer no longer runs (commit lock held;
    recovery has run, so no journal names them)."""
    pre = f".{path.name}"
    with contextlib.suppress(FileNotFoundError):
        for entry in path.parent.iterdir():
            for tag in (_TMP_TAG, _BACKUP_TAG, _JOURNAL_TAG + _TMP_TAG):
                if entry.name.startswith(pre + tag):
                    pid = _owner_pid(entry.name, pre + tag)
                    if pid is not None and not _alive(pid):
                        if entry.is_dir() and not entry.is_symlink():
                            shutil.rmtree(entry, ignore_errors=True)
                        else:
                            entry.unlink(missing_ok=True)


def recover(path: str | os.PathLike) -> None:
    """Finishes a replace of `path` that was interrupted (see the module docstring)."""
    path = Path(path)
    if not path.parent.is_dir() or not _needs_recovery(path):
        return
    with _folder_lock(path.parent, exclusive=True):
        _recover_locked(path)


@contextlib.contextmanager
def reading(path: str | os.PathLike) -> Iterator[None]:
    """Context for reading directory `path`: finishes an interrupted replace first, then holds
    a shared lock so that no commit swaps `path` while the caller reads it."""
    path = Path(path)
    if not path.parent.is_dir():
        yield
        return
    with _folder_lock(path.parent, exclusive=False) as fd:
        if fd is not None and _needs_recovery(path):
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                _recover_locked(path)
            except PermissionError:  # a read-only folder: the reader reports what it finds
                pass
            fcntl.flock(fd, fcntl.LOCK_SH)
        yield


def write_directory(path: str | os.PathLike, fill: Callable[[Path], None],
                    check_existing: Callable[[Path], None] | None = None) -> Path:
    """Creates or replaces directory `path` with what `fill(tmp_dir)` writes, atomically.

    `check_existing(path)` runs before anything is written and again under the commit lock
    when `path` exists; it raises to refuse replacing what is there.
    """
    path = Path(path)
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    if check_existing is not None:
        # early refusal, before anything is written; under the shared lock so that no other
        # writer's swap of `path` is half-seen (a missing manifest read as "not ours")
        with _folder_lock(parent, exclusive=False):
            if path.exists():
                check_existing(path)
    tag = _writer_tag()
    tmp = parent / f".{path.name}{_TMP_TAG}{tag}"
    backup = parent / f".{path.name}{_BACKUP_TAG}{tag}"
    tmp.mkdir()
    committed = False
    try:
        fill(tmp)
        for f in tmp.rglob("*"):
            if f.is_file():
                fsync_file(f)
        fsync_dir(tmp)
        with _folder_lock(parent, exclusive=True):
            _recover_locked(path)
            _remove_dead_leftovers(path)
            if path.exists():
                if check_existing is not None:
                    check_existing(path)
                journal = _journal(path)
                jtmp = parent / f".{path.name}{_JOURNAL_TAG}{_TMP_TAG}{tag}"
                with open(jtmp, "w", encoding="utf-8") as f:
                    f.write(json.dumps({"new": tmp.name, "old": backup.name}))
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(jtmp, journal)
                committed = True  # from here on the new version is the current one
                _finish(path, tmp, backup)
            else:
                os.rename(tmp, path)
                committed = True
                fsync_dir(parent)
    except BaseException:
        if not committed:
            shutil.rmtree(tmp, ignore_errors=True)
            with contextlib.suppress(OSError):
                (parent / f".{path.name}{_JOURNAL_TAG}{_TMP_TAG}{tag}").unlink(missing_ok=True)
        raise
    shutil.rmtree(backup, ignore_errors=True)
    return path
