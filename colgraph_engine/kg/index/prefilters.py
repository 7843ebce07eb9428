"""Centroid prefilters carried by a :class:`~colgraph_engine.kg.KnowledgeIndex`: settings, the
next prefilter of a store after a change, their folders inside the index directory, and the
checks that a loaded prefilter agrees with its store.

A carried prefilter is a :class:`~colgraph_engine.prefilter.PrefilterIndex` over one store's live
items, keyed by the store's stable uids (``doc_number << 32 | local_id``), never by slots, so
results map back to items exactly and a removed document's uids can be deleted from it. Rules
(all ours, not taken from PLAID or ColBERT):

* **deferred build**: a store whose live token count is below ``min_tokens`` (default
  :data:`DEFAULT_MIN_TOKENS` = 4096) carries none (k-means over a few hundred tokens gives
  centroids no better than the tokens themselves, and exact MaxSim over such a store is cheap);
  the first change that brings it to ``min_tokens`` or more builds it from the store's vectors.
  With ``min_tokens_d128`` set (as :meth:`KnowledgeIndex.create` sets it: :data:`AUTO_MIN_TOKENS`),
  a store of dimension d also waits for ``min_tokens_d128 * 128 / d`` tokens, the size where
  ``recall_ranker="auto"`` starts to read it: ``min_tokens`` alone is scaled by the widest store
  (a 1,280-d image store: 26,214 tokens), which built a 384-d segment store's prefilter at a
  third of the size where queries use it (87,382), a k-means a small ingest paid for nothing.
  Once built it is kept while the store has tokens (a store emptied by removals drops it).
* **additions** are encoded against the existing centroids (:meth:`PrefilterIndex.add`); the
  drift (mean squared residual of the tokens added since the build over that at build) is
  recorded, and when it passes ``rebuild_drift`` (default :data:`DEFAULT_REBUILD_DRIFT` = 1.5, the
  same as :data:`colgraph_engine.prefilter.prefilter_index.DEFAULT_REBUILD_DRIFT`; None: never) the
  prefilter is rebuilt from the store's original vectors (not from decoded ones) during that
  commit. The drift is judged only once the tokens added since the last build reach
  :data:`DRIFT_MIN_ADDED` (ours: 1.0) times the tokens it was built over, i.e. once the store has
  doubled since its build: a mean over a few added tokens says little, a build whose mean squared
  residual is near zero (about one distinct token per centroid: PLAID's count ``~16 sqrt(T)`` on a
  small or repetitive store) makes any addition read as a huge drift, and a rebuild costs a k-means
  plus an encoding of every token of the store. Judged at each 10 % of growth (as before), a
  10,000-document ingest in commits of 1,000 (``benchmarks/lightrag_peer.py``, hashing tokens,
  1.5M tokens by then) rebuilt at every commit from the 5,000th on, about 6 minutes each on one
  core of this project's CPU machine; judged once per doubling, drift rebuilds are geometric and
  all of them together cost about twice the last one. Between rebuilds the adaptive budget
  (:mod:`colgraph_engine.prefilter.adaptive`) keeps recall: a drifted prefilter costs candidates,
  not answers;
* **growth**: the centroid count is fixed at a build (PLAID's ``16 sqrt(T)`` rule, rounded
  down to a power of two, for the T tokens then); when the live tokens grow until that rule gives
  :data:`GROWTH_REBUILD` (ours: 2) times the built count (about 4x the tokens), the prefilter is
  rebuilt from the store's vectors during that commit, so a store that started small (a prefilter
  is built at ``min_tokens``) does not end with a few long inverted lists: the lists, and the
  candidates a query reaches, stay about ``sqrt(T)`` long. Rebuilds for growth cost a k-means
  per 4x of growth (geometric: about 4/3 of the last build's cost in all). Like drift rebuilds,
  off with ``rebuild_drift=None`` (no automatic rebuild, appends stay appends);
* **removals** tombstone the document's uids (positions are never renumbered); when tombstones
  outnumber live items the prefilter is rebuilt from the store (so dead slots stay bounded).

A build is deterministic (seeded k-means), so a carried prefilter equals one built from scratch
by :meth:`PrefilterIndex.build` over the same items in the same order.

On disk a carried prefilter is a **base** plus **appended pieces** (the principle of the index's
vector files: committed bytes never change, a commit writes O(the change)):

* the base is one checksummed folder ``prefilter/<store>.<hex tag>/`` (the layout of
  :mod:`colgraph_engine.prefilter.persist`: centroids, cutoffs, weights, codes, residuals, offsets,
  ids, alive and the drift bookkeeping at its writing), written by a build, a rebuild, a
  compaction or a settings change, named in the index manifest with the sha256 of its
  ``manifest.json``;
* each later commit that only updates the prefilter (adds encoded against the base's
  centroids, removals tombstoned) appends one piece file ``prefilter/<store>.<hex tag>.piece``:
  the added items' codes, residuals, token counts and uids and the deleted uids
  (:mod:`.prefilter_pieces`: format and why one file), listed in order in the entry's
  ``pieces`` with its sha256 and counts. An entry with pieces also holds the current drift
  bookkeeping (``added_sq_sum``, ``added_tokens``, ``next_id``; the base's build_mse stands);
* pieces merge as a binary counter (a new piece absorbs the trailing pieces no larger than what
  it has gathered; ours, as the index's parts merge), so a store keeps about log2(appended
  items) + 1 pieces, and a **compaction** writes a new base and drops the pieces once they would
  hold more than :data:`COMPACT_RATIO` (ours: 1.0) added-plus-deleted items per item of the base:
  a compaction then writes fewer than twice the items its pieces held (base + added < 2 x
  pieces), so compactions cost O(1) writes per appended item amortised and merges O(log); open
  reads at most about twice the base's items and log2 of them in files.

Every base and piece is written under a fresh name, fsync'ed, before the index manifest that
lists it replaces the old one, so that atomic replace commits a store's rows, its base and all its
pieces together; names written for a change that did not commit are removed at once
(:func:`discard`), or, after a crash, by the next change (:func:`remove_unlisted`: whatever no
entry lists). Opening reads the base, appends its pieces' items, tombstones their deleted uids and
derives the inverted lists once: the same state, array for array, as the prefilter in memory
after the same changes. Entries written before pieces existed (a base folder and no ``pieces``)
open unchanged and take pieces from their next change; an older writer reading an entry with
pieces sees only its base, which disagrees with the store (refused, or rebuilt with
``repair_prefilter=True``). ``KnowledgeIndex._pf_append = False`` writes the base whole on every
commit (the layout before pieces; benchmarks/index_prefilter_commit.py compares both: at 4,000
offline city documents, 88k segment tokens, an add wrote 2.0 kB of prefilter on average instead
of 5.2 MB and committed in 15.1 ms against 26.3 ms, 9.6 ms without a prefilter, on 2 shared cores;
what still grows with the store is in memory: :meth:`PrefilterIndex.add` concatenates the codes
and derives the inverted lists over every token).
"""
from __future__ import annotations

import logging
import math
import numbers
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ... import _arraydir, _atomic
from ...prefilter import kmeans
from ...prefilter.row_parts import RowParts
from . import prefilter_pieces as _pieces

DEFAULT_STORES = ("segment", "table", "image")  # the recall stores: text side, then image side
DEFAULT_MIN_TOKENS = 4096
DEFAULT_REBUILD_DRIFT = 1.5
AUTO_MIN_TOKENS = 1 << 18  # where recall_ranker="auto" turns to a carried prefilter (PipelineConfig.prefilter_min_tokens)
AUTO_DIM = 128  # AUTO_MIN_TOKENS counts tokens of this dimension: a store of dimension d counts tokens x d / 128
DRIFT_MIN_ADDED = 1.0  # drift is judged once the added tokens reach this fraction of the built ones
GROWTH_REBUILD = 2  # rebuilt once PLAID's centroid count for the live tokens is this many times the built count
NBITS = (1, 2, 4)
FOLDER = "prefilter"
COMPACT_RATIO = 1.0  # pieces may hold at most this many items (added + deleted) per item of the base
_BOOKKEEPING = ("added_sq_sum", "added_tokens", "next_id")  # an entry with pieces holds the current ones
_MAX_UID = 1 << 63
_FOLDER_NAME = re.compile(r"([a-z_]{1,32})\.[0-9a-f]{8,32}")
_OWN_FOLDER = _atomic.own_names(_FOLDER_NAME.pattern)
_OWN_PIECE = _atomic.own_names(r"[a-z_]{1,32}\.[0-9a-f]{16}" + re.escape(_pieces.SUFFIX))
_HEX64 = re.compile(r"[0-9a-f]{64}")

log = logging.getLogger("colgraph_engine")
FormatError = _arraydir.FormatError


def auto_min_tokens(dims: dict[str, int]) -> int:
    """``min_tokens`` for a new index's deferred prefilters: the live token count at which the
    default ``recall_ranker="auto"`` starts to read them (:data:`AUTO_MIN_TOKENS` tokens of
    d = :data:`AUTO_DIM`, scaled by the widest recall store), never below
    :data:`DEFAULT_MIN_TOKENS`. A small index so never pays a k-means; a large one has its
    prefilters built by the commit that makes it large and kept up to date by later commits."""
    widest = max((d for s, d in dims.items() if s in DEFAULT_STORES), default=AUTO_DIM)
    return max(DEFAULT_MIN_TOKENS, AUTO_MIN_TOKENS * AUTO_DIM // widest)


def auto_options(dims: dict[str, int]) -> dict:
    """The :meth:`KnowledgeIndex.enable_prefilter` options of the default carried prefilters
    (what :meth:`KnowledgeIndex.create` and the service's writer use): each store deferred until
    ``recall_ranker="auto"`` would read it."""
    return {"min_tokens": auto_min_tokens(dims), "min_tokens_d128": AUTO_MIN_TOKENS}


@dataclass(frozen=True)
class PrefilterSettings:
    """Which stores carry a prefilter and how it is built and maintained (see the module
    docstring for the rules)."""
    stores: tuple[str, ...]
    nbits: int = 2
    min_tokens: int = DEFAULT_MIN_TOKENS
    rebuild_drift: float | None = DEFAULT_REBUILD_DRIFT  # None: never rebuild for drift
    # None, or tokens of d = AUTO_DIM: a store of dimension d is also deferred below
    # min_tokens_d128 * AUTO_DIM / d tokens (where recall_ranker="auto" starts to read it)
    min_tokens_d128: int | None = None

    def threshold(self, dim: int) -> int:
        """The live tokens at which a store of dimension `dim` gets its prefilter built."""
        if self.min_tokens_d128 is None:
            return self.min_tokens
        return max(self.min_tokens, -(-self.min_tokens_d128 * AUTO_DIM // int(dim)))

    @classmethod
    def checked(cls, stores, nbits, min_tokens, rebuild_drift, dims: dict[str, int],
                min_tokens_d128=None) -> PrefilterSettings:
        """Validated settings for an index whose stores have dimensions `dims` (ValueError or
        TypeError naming the argument)."""
        if isinstance(stores, str) or not isinstance(stores, (list, tuple)):
            raise TypeError(f"stores: expected a list or tuple of store names, got {type(stores).__name__}")
        if not stores or len(set(stores)) != len(stores) or any(s not in dims for s in stores):
            raise ValueError(f"stores: expected distinct names from this index's stores {list(dims)}, got {stores!r}")
        if isinstance(nbits, bool) or not isinstance(nbits, int) or nbits not in NBITS:
            raise ValueError(f"nbits: expected one of {NBITS}, got {nbits!r}")
        for s in stores:
            if dims[s] % (8 // nbits):
                raise ValueError(f"nbits: {nbits} bits cannot pack store {s!r} of dimension {dims[s]} "
                                 f"(needs a multiple of {8 // nbits})")
        if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 1:
            raise ValueError(f"min_tokens: expected a positive int, got {min_tokens!r}")
        if rebuild_drift is not None and (isinstance(rebuild_drift, bool) or not isinstance(rebuild_drift, numbers.Real)
                                          or not math.isfinite(rebuild_drift) or rebuild_drift <= 0):
            raise ValueError(f"rebuild_drift: expected a positive finite number or None, got {rebuild_drift!r}")
        if min_tokens_d128 is not None and (isinstance(min_tokens_d128, bool) or not isinstance(min_tokens_d128, int)
                                            or min_tokens_d128 < 1):
            raise ValueError(f"min_tokens_d128: expected a positive int or None, got {min_tokens_d128!r}")
        return cls(tuple(stores), nbits, min_tokens, None if rebuild_drift is None else float(rebuild_drift),
                   min_tokens_d128)

    def to_manifest(self) -> dict:
        out = {"nbits": self.nbits, "min_tokens": self.min_tokens, "rebuild_drift": self.rebuild_drift}
        if self.min_tokens_d128 is not None:  # absent in manifests written before it existed
            out["min_tokens_d128"] = self.min_tokens_d128
        return out


def section(settings: PrefilterSettings, files: dict[str, dict]) -> dict:
    """The index manifest's ``prefilter`` field: the settings and per store its folder entry
    (``{"folder": None}`` while deferred)."""
    return {**settings.to_manifest(), "stores": {s: files.get(s, {"folder": None}) for s in settings.stores}}


def parse_section(m: dict, dims: dict[str, int], mf: Path) -> tuple[PrefilterSettings, dict[str, dict]] | None:
    """``(settings, per-store folder entries)`` from an index manifest `m` (None when it carries
    no prefilter); untrusted input: anything malformed raises FormatError naming `mf`."""
    p = m.get("prefilter")
    if p is None:
        return None
    stores = p.get("stores") if isinstance(p, dict) else None
    try:
        if not isinstance(stores, dict):
            raise ValueError("no store table")
        settings = PrefilterSettings.checked(list(stores), p.get("nbits"), p.get("min_tokens"),
                                             p.get("rebuild_drift"), dims, p.get("min_tokens_d128"))
    except (TypeError, ValueError) as exc:
        raise FormatError(f"{mf}: field 'prefilter' invalid ({exc})") from None
    files = {}
    for s, e in stores.items():
        if not isinstance(e, dict) or "folder" not in e:
            raise FormatError(f"{mf}: prefilter entry of store {s!r} invalid")
        if e["folder"] is None:
            continue
        g = _FOLDER_NAME.fullmatch(e["folder"]) if isinstance(e["folder"], str) else None
        ok = g is not None and g.group(1) == s and isinstance(e.get("sha256"), str) and _HEX64.fullmatch(e["sha256"])
        ok = ok and all(isinstance(e.get(k), int) and not isinstance(e.get(k), bool) and 0 <= e[k] <= _arraydir.MAX_COUNT
                        for k in ("items", "deleted"))
        ok = ok and isinstance(e.get("drift"), (int, float)) and not isinstance(e.get("drift"), bool)
        if not ok:
            raise FormatError(f"{mf}: prefilter entry of store {s!r} invalid (a folder '<store>.<hex>', its "
                              f"manifest's sha256, items, deleted, drift)")
        if not _pieces_ok(e, s):
            raise FormatError(f"{mf}: prefilter entry of store {s!r} invalid (pieces: a list of distinct files "
                              f"'<store>.<hex>.piece' with sha256, items, tokens, deleted; with pieces, the "
                              f"current {', '.join(_BOOKKEEPING)})")
        files[s] = dict(e)
    return settings, files


def _pieces_ok(e: dict, store: str) -> bool:
    """Whether entry `e`'s pieces (absent in entries written before pieces existed) and, when
    it has any, its drift bookkeeping are well formed."""
    pieces = e.get("pieces", [])
    if not isinstance(pieces, list) or not all(_pieces.entry_ok(p, store) for p in pieces):
        return False
    if len({p["file"] for p in pieces}) != len(pieces):
        return False
    if not pieces:
        return True
    sq, tokens, next_id = (e.get(k) for k in _BOOKKEEPING)
    return (isinstance(sq, (int, float)) and not isinstance(sq, bool) and sq >= 0
            and all(isinstance(v, int) and not isinstance(v, bool) for v in (tokens, next_id))
            and 0 <= tokens <= _arraydir.MAX_COUNT and 0 <= next_id <= _MAX_UID)


# -- the next prefilter of a store ---------------------------------------------------------------

def _gather(values: torch.Tensor, offsets: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed ``(values, offsets)`` of items `keep` (ascending positions) of packed `values`/`offsets`."""
    lo, hi = offsets[keep], offsets[keep + 1]
    lengths = hi - lo
    out_off = torch.zeros(keep.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=out_off[1:])
    rows = torch.repeat_interleave(lo - out_off[:-1], lengths) + torch.arange(int(out_off[-1]))
    return values[rows], out_off


def contents_after(store, added: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
                   removed: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(values [T, d], offsets [N+1], uids [N])``: the live items of PackedStore `store` without
    the uids `removed`, then `added` ``(values, offsets, uids)``: the store after the change.
    With additions, `values` is a :class:`~colgraph_engine.prefilter.row_parts.RowParts` over the
    store's rows and the added ones: a build reads them in place (joining them would copy the
    whole store, its largest allocation)."""
    snap = store.snapshot()
    keep = torch.nonzero(snap.alive).squeeze(1)
    if removed is not None and removed.numel():
        keep = keep[~torch.isin(snap.ids[keep], removed)]
    if keep.numel() == snap.n_slots:
        values, offsets, ids = snap.values, snap.offsets, snap.ids
    else:
        (values, offsets), ids = _gather(snap.values, snap.offsets, keep), snap.ids[keep]
    if added is not None and added[2].numel():
        values = RowParts([values, added[0].to(values.dtype)])
        offsets = torch.cat([offsets, added[1][1:] + offsets[-1]])
        ids = torch.cat([ids, added[2]])
    return values, offsets, ids


def build(settings: PrefilterSettings, values, offsets, uids, progress: bool = False):
    """A prefilter over packed items keyed by `uids` (deterministic: seeded k-means); `progress`:
    a tqdm bar over the k-means iterations."""
    from ...prefilter import PrefilterIndex
    return PrefilterIndex.build(values, offsets, uids, nbits=settings.nbits, progress=progress)


def next_prefilter(settings: PrefilterSettings, current, store, added=None, removed=None, progress: bool = False):
    """``(prefilter or None, what happened)`` for `store` (a PackedStore, before the change)
    after adding ``added = (values [t, d], offsets [k+1], uids [k])`` and removing the uids
    `removed` ``[r]``. `current` is never modified (the caller swaps in the result once the
    change is committed). See the module docstring for the rules."""
    from ...prefilter import PrefilterIndex
    n_added = int(added[2].numel()) if added is not None else 0
    n_removed = int(removed.numel()) if removed is not None else 0
    if current is not None and not n_added and not n_removed:
        return current, "unchanged"
    snap = store.snapshot()
    tokens = int((snap.offsets.diff() * snap.alive).sum())
    if n_added:
        tokens += int(added[1][-1])
    if n_removed:
        pos = store.positions(removed)
        tokens -= int((snap.offsets[pos + 1] - snap.offsets[pos]).sum())
    if current is None:
        need = settings.threshold(store.dim)
        if tokens < need:
            return None, f"deferred ({tokens} tokens < min_tokens {need})"
        return build(settings, *contents_after(store, added, removed), progress), f"built ({tokens} tokens)"
    if tokens == 0:
        return None, "dropped (the store is empty)"
    nxt = PrefilterIndex(current.snapshot(), current.build_options)
    if n_removed:
        nxt.delete(removed)
    if n_added:
        nxt.add(added[0], added[1], ids=added[2], rebuild_drift=None)
    s = nxt.snapshot()
    drift = nxt.drift()
    judged = s.added_tokens >= DRIFT_MIN_ADDED * (s.n_tokens - s.added_tokens)
    live_tokens = int(((s.offsets[1:] - s.offsets[:-1]) * s.alive).sum())
    due = kmeans.default_centroid_count(max(1, live_tokens))
    if settings.rebuild_drift is not None and judged and drift > settings.rebuild_drift:
        why = f"rebuilt (drift {drift:.3f} > {settings.rebuild_drift})"
    elif settings.rebuild_drift is not None and due >= GROWTH_REBUILD * s.n_centroids:
        why = (f"rebuilt (grown to {live_tokens} live tokens: PLAID's count {due} >= {GROWTH_REBUILD} x the "
               f"{s.n_centroids} centroids built)")
    elif s.n_slots - s.n_live > s.n_live:
        why = f"rebuilt ({s.n_slots - s.n_live} deleted > {s.n_live} live items)"
    else:
        return nxt, f"updated (drift {drift:.3f})"
    return build(settings, *contents_after(store, added, removed), progress), why


# -- folders -------------------------------------------------------------------------------------

def _entry(prefilter, folder: str, sha256: str, pieces: list[dict]) -> dict:
    s = prefilter.snapshot()
    e = {"folder": folder, "sha256": sha256, "items": s.n_live, "deleted": s.n_slots - s.n_live,
         "drift": round(float(prefilter.drift()), 6), "pieces": pieces}
    if pieces:  # the base's manifest holds the values at its writing; the pieces changed them
        e.update(added_sq_sum=s.added_sq_sum, added_tokens=s.added_tokens, next_id=s.next_id)
    return e


def write(index_path: Path, store: str, prefilter) -> dict:
    """Saves `prefilter` whole as a new base folder ``prefilter/<store>.<tag>`` of the index
    directory (atomic, fsync'ed, and the parent folder too); returns its manifest entry (no
    pieces)."""
    parent = index_path / FOLDER
    if not parent.is_dir():
        parent.mkdir()
        _atomic.fsync_dir(index_path)
    name = f"{store}.{uuid.uuid4().hex[:16]}"
    prefilter.save(parent / name)
    return _entry(prefilter, name, _atomic.sha256_file(parent / name / "manifest.json"), [])


def write_next(index_path: Path, store: str, prefilter, why: str, committed=None, entry: dict | None = None, *,
               append: bool = True) -> tuple[dict, list[str]]:
    """Writes what the next index manifest needs to commit `prefilter` (the plan's next one for
    `store`, `why` as :func:`next_prefilter` says): one appended piece when `committed` (the
    prefilter the committed `entry` holds) was only updated into it, else a new base (a build,
    a rebuild, a compaction, or `append` False: the whole folder, as before pieces existed).
    Returns ``(entry for the next manifest, names written now under prefilter/)``; nothing
    committed is changed (a merged piece is written anew; the merged ones go once unlisted)."""
    if append and committed is not None and entry is not None and why.startswith("updated"):
        out = _append(index_path, store, prefilter, committed, entry)
        if out is not None:
            return out
    e = write(index_path, store, prefilter)
    return e, [e["folder"]]


def _append(index_path: Path, store: str, prefilter, committed, entry: dict) -> tuple[dict, list[str]] | None:
    """The new piece for a change from `committed` to `prefilter` (absorbing the trailing pieces
    :func:`.prefilter_pieces.absorbed_from` names), or None when a new base is due: the change
    is not an append, the pieces would pass :data:`COMPACT_RATIO` times the base's items, or a
    piece to absorb cannot be read back (memory is the truth then: the base is written from it)."""
    before, after = committed.snapshot(), prefilter.snapshot()
    if (entry["items"], entry["deleted"]) != (before.n_live, before.n_slots - before.n_live) \
            or not _pieces.continues(before, after):
        return None  # `committed` is not what `entry` holds, or the change is no append
    listed = list(entry.get("pieces", ()))
    base_slots = before.n_slots - sum(p["items"] for p in listed)
    base_tokens = before.n_tokens - sum(p["tokens"] for p in listed)
    deleted = before.ids[before.alive & ~after.alive[:before.n_slots]]
    size = after.n_slots - before.n_slots + int(deleted.numel())
    if sum(map(_pieces.size_of, listed)) + size > COMPACT_RATIO * base_slots:
        return None
    first = _pieces.absorbed_from(listed, size)
    parent = index_path / FOLDER
    try:
        earlier = [_pieces.read(parent, e, before.codes.dtype, before.residuals.shape[1]).deleted
                   for e in listed[first:]]
    except (FormatError, OSError) as exc:
        log.warning("colgraph_engine: %s; writing the prefilter of store %r whole instead", exc, store)
        return None
    slot = base_slots + sum(p["items"] for p in listed[:first])
    token = base_tokens + sum(p["tokens"] for p in listed[:first])
    piece = _pieces.write(parent, store, _pieces.since(after, slot, token, torch.cat([*earlier, deleted.cpu()])))
    return _entry(prefilter, entry["folder"], entry["sha256"], listed[:first] + [piece]), [piece["file"]]


def _listed(entry: dict) -> list[str]:
    return [entry["folder"], *(p["file"] for p in entry.get("pieces", ()))]


def discard(index_path: Path, names) -> None:
    """Removes the folders and piece files written for a change that did not commit."""
    import shutil
    for name in names:
        path = index_path / FOLDER / name
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def remove_unlisted(index_path: Path, files: dict[str, dict]) -> None:
    """Removes every folder and piece file under prefilter/ that no entry of `files` names
    (only names the prefilter writes: anything else there is not ours to delete)."""
    import shutil
    parent = index_path / FOLDER
    if not parent.is_dir():
        return
    listed = {n for e in files.values() for n in _listed(e)}
    for entry in parent.iterdir():
        if entry.name in listed or entry.is_symlink():
            continue
        if _OWN_FOLDER.fullmatch(entry.name) or _OWN_PIECE.fullmatch(entry.name):
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)


def load(index_path: Path, store_name: str, entry: dict, store, settings: PrefilterSettings, *, verify: bool):
    """The prefilter a manifest entry names: its base folder (checked against the entry's
    sha256) with its pieces appended (each checked against its own), the inverted lists
    derived once over the whole; then checked against `store` (the same live uids with the same
    token counts, the settings' nbits, the store's dimension). FormatError naming the folder
    or piece otherwise."""
    from ...prefilter import PrefilterIndex, persist
    folder = index_path / FOLDER / entry["folder"]
    if not (folder / "manifest.json").is_file():
        raise FormatError(f"{folder}: prefilter of store {store_name!r} is missing (the manifest lists it)")
    if _atomic.sha256_file(folder / "manifest.json") != entry["sha256"]:
        raise FormatError(f"{folder}: prefilter manifest checksum mismatch (changed after it was committed)")
    arrays, meta, options = persist.read(folder, verify=verify)
    pieces = entry.get("pieces", [])
    if pieces:
        width = int(arrays["residuals"].shape[1])
        got = [_pieces.read(index_path / FOLDER, p, arrays["codes"].dtype, width, verify=verify) for p in pieces]
        arrays = _pieces.apply(arrays, got, f"{folder} and its {len(pieces)} pieces")
        meta = {**meta, **{k: entry[k] for k in _BOOKKEEPING}, "added_sq_sum": float(entry["added_sq_sum"])}
    pf = PrefilterIndex(persist.assemble(arrays, meta), options)
    check_agrees(pf, store, store_name, settings, folder)
    return pf


def check_agrees(pf, store, store_name: str, settings: PrefilterSettings, where) -> None:
    """FormatError unless prefilter `pf` indexes exactly the live items of `store` (uids and
    token counts) with the settings' nbits and the store's dimension."""
    s = pf.snapshot()
    snap = store.snapshot()
    why = None
    if s.nbits != settings.nbits or s.dim != store.dim:
        why = f"nbits {s.nbits} / dimension {s.dim}, expected {settings.nbits} / {store.dim}"
    else:
        live = torch.nonzero(s.alive).squeeze(1)
        p_ids, p_len = s.ids[live].cpu(), (s.offsets[live + 1] - s.offsets[live]).cpu()
        keep = torch.nonzero(snap.alive).squeeze(1)
        s_ids, s_len = snap.ids[keep].cpu(), (snap.offsets[keep + 1] - snap.offsets[keep]).cpu()
        po, so = torch.argsort(p_ids), torch.argsort(s_ids)
        if p_ids.numel() != s_ids.numel() or not torch.equal(p_ids[po], s_ids[so]):
            diff = np.setxor1d(p_ids.numpy(), s_ids.numpy())
            why = (f"it holds {p_ids.numel()} live items, the store {s_ids.numel()} "
                   f"(uids differ, e.g. {int(diff[0]) if diff.size else '?'})")
        elif not torch.equal(p_len[po], s_len[so]):
            why = "an item's token count differs from the store's"
    if why is not None:
        raise FormatError(f"{where}: the prefilter of store {store_name!r} disagrees with the store: {why}; open "
                          f"the index with repair_prefilter=True to rebuild it from the store's vectors")
