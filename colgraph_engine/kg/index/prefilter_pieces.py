"""Appended pieces of a carried prefilter: what one or more commits added to it and deleted
from it since its base folder was written (see kg/index/prefilters.py for when a piece or a new base
is written).

A piece is ONE file ``prefilter/<store>.<hex tag>.piece``, written once under a fresh name,
fsync'ed (and its folder), and never changed afterwards. It has no header: the index manifest's
entry for it (``{"file", "sha256", "items": k, "tokens": t, "deleted": r}``) fixes the offset
of every section and holds the sha256 of the whole file, so the manifest's atomic replace
commits the piece and its checksum chains from the manifest to every byte. Sections, raw
little-endian, in this order (the int64 sections first so every section starts aligned)::

    lengths    [k]     int64   token count of each added item
    ids        [k]     int64   the added items' uids
    deleted    [r]     int64   uids the change tombstoned (any earlier slot: base or piece)
    codes      [t]     int16 or int32 (the base's code type: int16 up to 32,768 centroids)
    residuals  [t, w]  uint8   w = dim * nbits / 8

Why one file per piece (our choice) rather than an ``_arraydir`` folder per piece or in-place
appends to long-lived files with committed lengths (as the index's vector files do): one file
is one create, one write and one fsync per commit (a folder would be six files, a manifest and
a rename); the counts and the checksum already travel in the index manifest, so a second
manifest would repeat them; and a file never appended to needs no truncation of an interrupted
append and no per-range checksums. Deletions are by uid and uids are never reused, so the order
in which pieces apply their deletions does not matter: loading concatenates the base and every
piece's added items and then tombstones the union of their deleted uids, and two adjacent
pieces merge into one by concatenating both sections.
"""
from __future__ import annotations

import hashlib
import os
import re
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ... import _arraydir, _atomic

SUFFIX = ".piece"
NAME = re.compile(r"([a-z_]{1,32})\.[0-9a-f]{8,32}\.piece")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_COUNTS = ("items", "tokens", "deleted")
FormatError = _arraydir.FormatError


@dataclass(frozen=True)
class Piece:
    """The contents of one piece (CPU tensors): ``lengths [k]``, ``ids [k]``, ``deleted [r]``
    int64; ``codes [t]`` int16/int32; ``residuals [t, w]`` uint8."""
    lengths: torch.Tensor
    ids: torch.Tensor
    deleted: torch.Tensor
    codes: torch.Tensor
    residuals: torch.Tensor

    @property
    def size(self) -> int:
        """Added items plus deleted uids: what the compaction bound counts (kg/index/prefilters.py)."""
        return int(self.ids.numel() + self.deleted.numel())


def size_of(entry: dict) -> int:
    """:attr:`Piece.size` of the piece a manifest entry describes."""
    return entry["items"] + entry["deleted"]


def nbytes(items: int, tokens: int, deleted: int, code_size: int, width: int) -> int:
    """The exact size of a piece file with these counts."""
    return 8 * (2 * items + deleted) + tokens * (code_size + width)


def entry_ok(e, store: str) -> bool:
    """Whether `e` is a well-formed manifest entry of a piece of `store` (untrusted input)."""
    if not isinstance(e, dict):
        return False
    g = NAME.fullmatch(e["file"]) if isinstance(e.get("file"), str) else None
    return (g is not None and g.group(1) == store and isinstance(e.get("sha256"), str)
            and _HEX64.fullmatch(e["sha256"]) is not None
            and all(isinstance(e.get(k), int) and not isinstance(e.get(k), bool)
                    and 0 <= e[k] <= _arraydir.MAX_COUNT for k in _COUNTS))


def _sections(p: Piece) -> list[np.ndarray]:
    out = []
    for t in (p.lengths, p.ids, p.deleted, p.codes, p.residuals):
        a = np.ascontiguousarray(t.detach().cpu().numpy())
        out.append(a.byteswap() if sys.byteorder != "little" else a)
    return out


def write(folder: Path, store: str, piece: Piece) -> dict:
    """Writes `piece` to a new file of `folder` (fsync'ed, and the folder); returns its
    manifest entry. A failure removes the partial file."""
    name = f"{store}.{uuid.uuid4().hex[:16]}{SUFFIX}"
    path = folder / name
    h = hashlib.sha256()
    try:
        with open(path, "xb") as f:
            for a in _sections(piece):
                if a.size:
                    view = memoryview(a).cast("B")
                    h.update(view)
                    f.write(view)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    _atomic.fsync_dir(folder)
    return {"file": name, "sha256": h.hexdigest(), "items": int(piece.ids.numel()),
            "tokens": int(piece.codes.numel()), "deleted": int(piece.deleted.numel())}


def read(folder: Path, entry: dict, code_dtype: torch.dtype, width: int, *, verify: bool = True) -> Piece:
    """The piece a (checked, see :func:`entry_ok`) manifest entry names; FormatError naming the
    file when it is missing, has another size than the counts give, or (with `verify`) another
    sha256."""
    path = folder / entry["file"]
    k, t, r = (entry[c] for c in _COUNTS)
    code_np = np.dtype(np.int16 if code_dtype == torch.int16 else np.int32)
    want = nbytes(k, t, r, code_np.itemsize, width)
    if not path.is_file():
        raise FormatError(f"{path}: prefilter piece is missing (the manifest lists it)")
    if path.stat().st_size != want:
        raise FormatError(f"{path}: {path.stat().st_size} bytes on disk, expected {want} for {k} items, "
                          f"{t} tokens and {r} deleted uids (truncated or wrong file)")
    data = np.fromfile(path, dtype=np.uint8)
    if data.size != want:  # the file changed between the two looks
        raise FormatError(f"{path}: changed while being read")
    if verify and hashlib.sha256(memoryview(data)).hexdigest() != entry["sha256"]:
        raise FormatError(f"{path}: prefilter piece checksum mismatch (changed after it was committed)")
    at = 0

    def take(dtype: np.dtype, count: int, shape: tuple[int, ...]) -> torch.Tensor:
        nonlocal at
        n = count * dtype.itemsize
        a = data[at:at + n].view(dtype.newbyteorder("<")).astype(dtype, copy=True).reshape(shape)
        at += n
        return torch.from_numpy(a)
    i64 = np.dtype(np.int64)
    return Piece(lengths=take(i64, k, (k,)), ids=take(i64, k, (k,)), deleted=take(i64, r, (r,)),
                 codes=take(code_np, t, (t,)), residuals=take(np.dtype(np.uint8), t * width, (t, width)))


def since(state, slot: int, token: int, deleted: torch.Tensor) -> Piece:
    """The piece holding `state`'s items from position `slot` (whose tokens start at `token`)
    on, and the uids `deleted`."""
    return Piece(lengths=state.offsets[slot:].diff().cpu(), ids=state.ids[slot:].cpu(),
                 deleted=deleted.to(torch.int64).cpu(), codes=state.codes[token:].cpu(),
                 residuals=state.residuals[token:].cpu())


def continues(before, after) -> bool:
    """Whether state `after` is state `before` with items appended and items tombstoned only
    (the same centroids object, every slot and token of `before` kept in place, none revived):
    what :meth:`PrefilterIndex.add` and :meth:`~PrefilterIndex.delete` make, and what a piece
    can express. Checks the cheap invariants (O(slots) on booleans); the arrays' prefixes are
    equal by construction of those two methods."""
    n0, t0 = before.n_slots, before.n_tokens
    if after.centroids is not before.centroids or after.n_slots < n0 or after.n_tokens < t0:
        return False
    if int(after.offsets[n0]) != t0:
        return False
    return not bool((after.alive[:n0] & ~before.alive).any())


def apply(arrays: dict[str, torch.Tensor], pieces: list[Piece], where) -> dict[str, torch.Tensor]:
    """The base `arrays` (as :func:`colgraph_engine.prefilter.persist.read` returns them) with every
    piece's items appended and their deleted uids tombstoned; FormatError naming `where` for
    codes outside the centroids, negative lengths or ids, repeated ids, or a deleted uid that
    is not a live item."""
    if not pieces:
        return arrays
    c = arrays["centroids"].shape[0]
    lengths = torch.cat([p.lengths for p in pieces])
    codes = torch.cat([p.codes for p in pieces])
    ids = torch.cat([arrays["ids"], *(p.ids for p in pieces)])
    deleted = torch.cat([p.deleted for p in pieces])
    if lengths.numel() and int(lengths.min()) < 0:
        raise FormatError(f"{where}: a piece lists a negative token count")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= c):
        raise FormatError(f"{where}: a piece holds centroid ids outside [0, {c})")
    if torch.unique(ids).numel() != ids.numel() or (ids.numel() and int(ids.min()) < 0):
        raise FormatError(f"{where}: the base's and pieces' ids must be unique and non-negative")
    alive = torch.cat([arrays["alive"], torch.ones(lengths.numel(), dtype=torch.bool)])
    if deleted.numel():
        order = torch.argsort(ids)
        sorted_ids = ids[order]
        at = torch.searchsorted(sorted_ids, deleted).clamp(max=sorted_ids.numel() - 1)
        pos = order[at]
        if (torch.unique(deleted).numel() != deleted.numel() or not bool((sorted_ids[at] == deleted).all())
                or not bool(alive[pos].all())):
            raise FormatError(f"{where}: a piece deletes a uid that is not a live item (or deletes one twice)")
        alive[pos] = False
    offsets = torch.cat([arrays["offsets"], arrays["offsets"][-1] + torch.cumsum(lengths, 0)])
    return {**arrays, "codes": torch.cat([arrays["codes"], codes]),
            "residuals": torch.cat([arrays["residuals"], *(p.residuals for p in pieces)]),
            "offsets": offsets, "ids": ids, "alive": alive}


def absorbed_from(entries: list[dict], size: int) -> int:
    """The index of the first of the trailing pieces `entries` that a new piece of `size`
    absorbs: going back from the last, each piece no larger than what the new one has gathered
    so far (a binary counter, as the index's parts merge; ours). So a store keeps at most about
    log2(appended items) + 1 pieces, and an appended item is rewritten O(log) times amortised."""
    first, gathered = len(entries), size
    for i in range(len(entries) - 1, -1, -1):
        if size_of(entries[i]) > gathered:
            break
        gathered += size_of(entries[i])
        first = i
    return first
