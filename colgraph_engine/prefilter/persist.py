"""Save/load of a prefilter index: one checksummed array directory (:mod:`colgraph_engine._arraydir`).

Layout (atomic write: temporary folder, fsync, rename; no pickle)::

    manifest.json   format, version, nbits, dim, counts, drift bookkeeping, build options, file table
    centroids.bin   [C, d] float32        cutoffs.bin [2^b - 1] float32    weights.bin [2^b] float32
    codes.bin       [T] int16 or int32    residuals.bin [T, d*b/8] uint8
    offsets.bin     [N+1] int64           ids.bin [N] int64                alive.bin [N] uint8

The inverted lists are derived again on load (:func:`.layout.derive_lists`), so a directory
cannot carry lists that disagree with its codes.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from .. import _arraydir, _atomic
from ..packed import check_offsets
from . import codec
from .layout import IndexState, derive_lists

FORMAT_NAME = "colgraph_engine.prefilter"
FORMAT_VERSION = 1
FormatError = _arraydir.FormatError
_OPTION_KEYS = ("nbits", "n_centroids", "max_points", "iterations", "seed", "normalize", "normalize_decoded")


def save(state: IndexState, options: dict, path: str | os.PathLike) -> Path:
    arrays = {"centroids": state.centroids.cpu().numpy(), "cutoffs": state.cutoffs.cpu().numpy(),
              "weights": state.weights.cpu().numpy(), "codes": state.codes.cpu().numpy(),
              "residuals": state.residuals.cpu().numpy(), "offsets": state.offsets.cpu().numpy(),
              "ids": state.ids.cpu().numpy(), "alive": state.alive.cpu().numpy().astype(np.uint8)}
    meta = {"nbits": state.nbits, "dim": state.dim, "n_centroids": state.n_centroids, "n_items": state.n_slots,
            "n_tokens": state.n_tokens, "build_mse": state.build_mse, "added_sq_sum": state.added_sq_sum,
            "added_tokens": state.added_tokens, "next_id": state.next_id, "unit": state.unit,
            "options": {k: options[k] for k in _OPTION_KEYS if k in options}}
    return _arraydir.write(path, FORMAT_NAME, FORMAT_VERSION, meta, arrays)


def read(path: str | os.PathLike, *, verify: bool = True) -> tuple[dict[str, torch.Tensor], dict, dict]:
    """``(arrays, meta, options)`` of a saved directory, checked, without the inverted lists:
    `arrays` are CPU tensors (``centroids, cutoffs, weights, codes, residuals, offsets, ids``
    and ``alive`` as bool), `meta` holds ``nbits, unit, build_mse, added_sq_sum, added_tokens,
    next_id``. For callers that extend the arrays before :func:`assemble` (the carried
    prefilters' appended pieces, kg/index/prefilters.py) so the lists are derived once."""
    path = Path(path)
    with _atomic.reading(path):
        m = _arraydir.read_manifest(path, FORMAT_NAME, FORMAT_VERSION)
        c, n, t, d = (_arraydir.meta_int(m, key, path) for key in ("n_centroids", "n_items", "n_tokens", "dim"))
        nbits = m.get("nbits")
        if nbits not in codec.NBITS or d < 1 or c < 1 or d % (8 // nbits):
            raise FormatError(f"{path / 'manifest.json'}: nbits, dim or n_centroids invalid")
        w = codec.packed_width(d, nbits)
        code_np = np.int16 if codec.code_dtype(c) == torch.int16 else np.int32

        def read_one(name, dt, shape):
            return torch.from_numpy(_arraydir.read_array(path, m, name, dt, shape, verify=verify))
        arrays = dict(centroids=read_one("centroids", np.float32, (c, d)),
                      cutoffs=read_one("cutoffs", np.float32, ((1 << nbits) - 1,)),
                      weights=read_one("weights", np.float32, (1 << nbits,)), codes=read_one("codes", code_np, (t,)),
                      residuals=read_one("residuals", np.uint8, (t, w)), offsets=read_one("offsets", np.int64, (n + 1,)),
                      ids=read_one("ids", np.int64, (n,)), alive=read_one("alive", np.uint8, (n,)))
    try:
        check_offsets(arrays["offsets"], t, torch.device("cpu"), "offsets.bin")
    except ValueError as exc:
        raise FormatError(f"{path}: {exc}") from None
    codes = arrays["codes"]
    if t and (int(codes.min()) < 0 or int(codes.max()) >= c):
        raise FormatError(f"{path / 'codes.bin'}: centroid ids outside [0, {c})")
    if not bool(((arrays["alive"] == 0) | (arrays["alive"] == 1)).all()):
        raise FormatError(f"{path / 'alive.bin'}: expected only 0/1 bytes")
    arrays["alive"] = arrays["alive"].bool()
    ids = arrays["ids"]
    if torch.unique(ids).numel() != n or (n and int(ids.min()) < 0):
        raise FormatError(f"{path / 'ids.bin'}: ids must be unique and non-negative")
    floats = {k: m.get(k) for k in ("build_mse", "added_sq_sum")}
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in floats.values()):
        raise FormatError(f"{path / 'manifest.json'}: drift fields invalid")
    added, next_id = m.get("added_tokens"), m.get("next_id")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (added, next_id)):
        raise FormatError(f"{path / 'manifest.json'}: added_tokens or next_id invalid")
    options = m.get("options") if isinstance(m.get("options"), dict) else {}
    if not isinstance(m.get("unit"), bool):
        raise FormatError(f"{path / 'manifest.json'}: field 'unit' missing or invalid")
    meta = {"nbits": nbits, "unit": m["unit"], "build_mse": float(floats["build_mse"]),
            "added_sq_sum": float(floats["added_sq_sum"]), "added_tokens": added, "next_id": next_id}
    return arrays, meta, {k: options[k] for k in _OPTION_KEYS if k in options}


def assemble(arrays: dict[str, torch.Tensor], meta: dict, *, device="cpu") -> IndexState:
    """The state of checked `arrays` and `meta` (as :func:`read` returns them) on `device`,
    with its inverted lists derived (:func:`.layout.derive_lists`); ``next_id`` is raised past
    the largest id."""
    dev = torch.device(device)
    a = {k: v.to(dev) for k, v in arrays.items()}
    n = a["ids"].numel()
    lists = derive_lists(a["codes"], a["offsets"], a["centroids"].shape[0])
    return IndexState(nbits=meta["nbits"], centroids=a["centroids"], cutoffs=arrays["cutoffs"],
                      weights=arrays["weights"], codes=a["codes"], residuals=a["residuals"], offsets=a["offsets"],
                      ids=a["ids"], alive=a["alive"], cells_offsets=lists[0], cells=lists[1], ivf_offsets=lists[2],
                      ivf_docs=lists[3], unit=meta["unit"], build_mse=meta["build_mse"],
                      added_sq_sum=meta["added_sq_sum"], added_tokens=meta["added_tokens"],
                      next_id=max(meta["next_id"], int(arrays["ids"].max()) + 1 if n else 0))


def load(path: str | os.PathLike, *, device="cpu", verify: bool = True) -> tuple[IndexState, dict]:
    arrays, meta, options = read(path, verify=verify)
    return assemble(arrays, meta, device=device), options
