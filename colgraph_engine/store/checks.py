"""Argument checks of the store: devices, single ids, id sequences and the ids an append hands out.

Ids are int64 in ``[0, 2**63 - 1]``; deleted ids stay reserved until ``compact``.
"""
from __future__ import annotations

import numbers

import numpy as np
import torch

from .snapshot import StoreSnapshot

_MAX_ID = 2**63 - 1


def _check_device(device, name: str = "device") -> torch.device:
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{name}: expected a str or torch.device, got {type(device).__name__}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(f"{name}: expected 'cpu' or a CUDA device such as 'cuda:0', got {device!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: expected 'cpu' or a CUDA device, got {str(dev)!r}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name}: expected an available device, got {str(dev)!r} but CUDA is not available here")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{name}: expected a CUDA index below {torch.cuda.device_count()}, got {dev.index}")
    return dev


def _check_id_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    return int(value)


def _new_ids(snap: StoreSnapshot, ids, k: int, device: torch.device) -> torch.Tensor:
    if ids is None:
        if snap.next_id > _MAX_ID + 1 - k:
            raise ValueError(f"ids: the next {k} default ids would pass the largest int64 id 2**63 - 1 "
                             f"(the store holds ids up to {snap.next_id - 1}); pass ids= explicitly")
        return torch.arange(snap.next_id, snap.next_id + k, dtype=torch.int64, device=device)
    t = _as_id_tensor(ids, "ids").to(device)
    if t.numel() != k:
        raise ValueError(f"ids: expected {k} ids (one per item), got {t.numel()}")
    if k and int(t.min()) < 0:
        raise ValueError(f"ids: expected non-negative ids, got {int(t.min())}")
    if torch.unique(t).numel() != k:
        raise ValueError("ids: expected unique ids, got duplicates")
    if k and snap.n_slots and int(t.min()) < snap.next_id:  # every stored id is below next_id
        s, _ = snap.lookup()
        at = torch.searchsorted(s, t).clamp(max=s.numel() - 1)
        clash = s[at] == t
        if bool(clash.any()):
            raise ValueError(f"ids: id {int(t[clash][0])} is already in the store (deleted ids stay reserved until compact)")
    return t


def _as_id_tensor(ids, name: str) -> torch.Tensor:
    if isinstance(ids, torch.Tensor):
        if ids.dtype != torch.int64:
            raise TypeError(f"{name}: expected dtype torch.int64, got {ids.dtype}")
        if ids.dim() != 1:
            raise ValueError(f"{name}: expected shape [K], got {tuple(ids.shape)}")
        return ids
    if isinstance(ids, (list, tuple, range, np.ndarray)):
        try:
            arr = np.asarray(ids)
        except Exception as exc:
            raise TypeError(f"{name}: expected a sequence of ints ({exc})") from None
        if arr.dtype == object and arr.ndim == 1 and all(
                isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in arr.tolist()):
            bad = next(int(x) for x in arr.tolist() if not -2**63 <= int(x) <= _MAX_ID)
            raise ValueError(f"{name}: expected ids in the int64 range [0, 2**63 - 1], got {bad}")
        if arr.size and arr.dtype.kind not in "iu":
            raise TypeError(f"{name}: expected integers, got dtype {arr.dtype}")
        if arr.ndim > 1:
            raise ValueError(f"{name}: expected a flat sequence, got shape {arr.shape}")
        if arr.dtype.kind == "u" and arr.size and int(arr.max()) > _MAX_ID:
            raise ValueError(f"{name}: expected ids in the int64 range [0, 2**63 - 1], got {int(arr.max())}")
        return torch.as_tensor(arr.astype(np.int64).reshape(-1))
    raise TypeError(f"{name}: expected a torch.int64 tensor or a sequence of ints, got {type(ids).__name__}")
