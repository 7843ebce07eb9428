"""A response cache for chat-model calls: one JSON file per request, keyed by its content hash.

Key: ``sha256`` (hex) of the canonical JSON (sorted keys, no spaces, UTF-8 kept) of
``{"model": str, "messages": [...], "params": {...}}``, i.e. the model name, the exact messages
(images included as their data URLs) and every generation parameter that changes the answer
(temperature, max_tokens, ...). The endpoint's URL and key are not part of it: one model name
served elsewhere is taken to answer alike (LightRAG's extraction cache, too, is keyed by the
prompt alone). Re-ingesting with the same prompts therefore costs no calls; a changed prompt,
model or parameter is a new key.

Layout: ``<folder>/<key[:2]>/<key>.json``, 256 shard folders so that no folder grows past a few
thousand entries on a large corpus. An entry is ``{"format": "colgraph-chat-cache", "version": 1,
"key": <key>, "text": <reply>, "model": str, "finish_reason": str | null, "purpose": str,
"created": <unix seconds>}``; the request itself is not stored (images would bloat it).

Writes: temporary file in the shard folder (a name no other writer uses: pid, thread and a random
part), flush + fsync, ``os.replace`` onto the final name, fsync the folder. A reader sees either
no entry or a whole one; two writers of one key (threads or processes) both succeed and the last
rename wins, with the same content for a deterministic model. Entries are never edited in place.

Corrupted entries (not JSON, wrong format or key, text not a string) are treated as misses: they
are reported (``warnings.warn`` once per key and listed in :attr:`ResponseCache.corrupted`) and
overwritten by the next successful reply, never raised.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

from .._atomic import fsync_dir

CACHE_FORMAT = "colgraph-chat-cache"
CACHE_VERSION = 1
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class CachedReply:
    """One cache entry: the reply text and what produced it."""
    key: str
    text: str
    model: str
    finish_reason: str | None
    purpose: str
    created: float


def request_key(model: str, messages: list, params: dict) -> str:
    """The cache key of one request (see the module docstring); raises TypeError for values JSON
    cannot hold (the key must not depend on ``repr`` of arbitrary objects)."""
    payload = {"model": model, "messages": messages, "params": params}
    try:
        canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                               allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"messages/params: expected JSON-serialisable values ({exc})") from None
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class ResponseCache:
    """Reply cache in ``folder`` (created if missing). Thread- and process-safe; see module docstring.

    Args:
        folder: a directory path (str or PathLike); an existing file there is a ValueError.
    """

    def __init__(self, folder: str | os.PathLike):
        if not isinstance(folder, (str, os.PathLike)):
            raise TypeError(f"folder: expected a path (str or PathLike), got {type(folder).__name__}")
        path = Path(folder)
        if path.exists() and not path.is_dir():
            raise ValueError(f"folder: {str(path)!r} exists and is not a directory")
        path.mkdir(parents=True, exist_ok=True)
        self.folder = path
        self._lock = threading.Lock()
        self._corrupted: dict[str, str] = {}
        self.hits = 0
        self.misses = 0
        self.writes = 0

    def __repr__(self) -> str:
        return f"ResponseCache({str(self.folder)!r})"

    @property
    def corrupted(self) -> dict[str, str]:
        """``{path: reason}`` of every corrupted entry met so far (a copy)."""
        with self._lock:
            return dict(self._corrupted)

    def path_of(self, key: str) -> Path:
        _check_key(key)
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> CachedReply | None:
        """The cached reply for `key`, or None (missing or corrupted: never raises for content)."""
        path = self.path_of(key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            self._count(hit=False)
            return None
        except OSError as exc:  # unreadable (permissions, a folder in its place): a miss, reported
            self._report(path, f"unreadable: {exc}")
            self._count(hit=False)
            return None
        entry = _decode(raw, key)
        if isinstance(entry, str):
            self._report(path, entry)
            self._count(hit=False)
            return None
        self._count(hit=True)
        return entry

    def put(self, key: str, text: str, *, model: str, finish_reason: str | None = None, purpose: str = "") -> Path:
        """Stores a reply atomically (temp + fsync + rename + fsync of the shard folder)."""
        path = self.path_of(key)
        if not isinstance(text, str):
            raise TypeError(f"text: expected str, got {type(text).__name__}")
        entry = {"format": CACHE_FORMAT, "version": CACHE_VERSION, "key": key, "text": text, "model": str(model),
                 "finish_reason": finish_reason, "purpose": str(purpose), "created": time.time()}
        data = json.dumps(entry, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{key}.{os.getpid()}.{threading.get_ident()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(path.parent)
        with self._lock:
            self.writes += 1
            self._corrupted.pop(str(path), None)
        return path

    def __len__(self) -> int:
        return sum(1 for _ in self.folder.glob("??/*.json"))

    def _count(self, hit: bool) -> None:
        with self._lock:
            if hit:
                self.hits += 1
            else:
                self.misses += 1

    def _report(self, path: Path, reason: str) -> None:
        with self._lock:
            first = str(path) not in self._corrupted
            self._corrupted[str(path)] = reason
        if first:
            warnings.warn(f"response cache: ignoring corrupted entry {str(path)!r} ({reason})", RuntimeWarning,
                          stacklevel=3)


def _check_key(key: object) -> None:
    if not isinstance(key, str):
        raise TypeError(f"key: expected str, got {type(key).__name__}")
    if len(key) != 64 or not set(key) <= _HEX:
        raise ValueError(f"key: expected 64 lowercase hex digits (sha256), got {key!r}")


def _decode(raw: bytes, key: str) -> CachedReply | str:
    """The entry, or the reason it is corrupted."""
    try:
        entry = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return f"not JSON: {exc}"
    if not isinstance(entry, dict):
        return f"expected a JSON object, got {type(entry).__name__}"
    if entry.get("format") != CACHE_FORMAT or entry.get("version") != CACHE_VERSION:
        return f"format {entry.get('format')!r} version {entry.get('version')!r}, expected {CACHE_FORMAT!r} {CACHE_VERSION}"
    if entry.get("key") != key:
        return f"holds key {entry.get('key')!r}"
    if not isinstance(entry.get("text"), str):
        return "text is not a string"
    finish = entry.get("finish_reason")
    created = entry.get("created")
    return CachedReply(key, entry["text"], str(entry.get("model", "")), finish if isinstance(finish, str) else None,
                       str(entry.get("purpose", "")), float(created) if isinstance(created, (int, float)) else 0.0)
