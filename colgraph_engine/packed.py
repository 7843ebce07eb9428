"""Packed multi-vectors (the varlen convention) and their validation.

A collection of N variable-length vector sets is two tensors:
  ``values  [T, d]``   float32, float16 or bfloat16; item i owns rows offsets[i]:offsets[i+1]
  ``offsets [N+1]``    int64, offsets[0] = 0, non-decreasing, offsets[N] = T
No padding is stored anywhere.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def pack(items: Sequence[torch.Tensor], dtype: torch.dtype | None = None, *,
         name: str = "items") -> tuple[torch.Tensor, torch.Tensor]:
    """Packs a sequence of ``[L_i, d]`` tensors into ``(values [sum L_i, d], offsets [N+1])``.

    All items must share ``d``, device and (unless `dtype` is given) dtype, a floating dtype
    (float32, float16 or bfloat16). An item may have zero rows. `name` is the argument named in
    error messages.
    """
    if isinstance(items, torch.Tensor):
        if items.dim() != 3:
            raise ValueError(f"{name}: expected a sequence of [L, d] tensors or a [N, L, d] tensor, "
                             f"got a tensor of shape {tuple(items.shape)}")
        items = list(items)
    if not isinstance(items, Sequence) or isinstance(items, (str, bytes)):
        raise TypeError(f"{name}: expected a sequence of [L, d] tensors, got {type(items).__name__}")
    if len(items) == 0:
        raise ValueError(f"{name}: expected a non-empty sequence of [L, d] tensors, got an empty one")
    for i, x in enumerate(items):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}[{i}]: expected a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 2:
            raise ValueError(f"{name}[{i}]: expected shape [L, d], got {tuple(x.shape)}")
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype: expected one of {FLOAT_DTYPES}, got {dtype}")
    d = items[0].shape[1]
    for i, x in enumerate(items):
        if x.shape[1] != d:
            raise ValueError(f"{name}[{i}]: expected dimension d={d}, got {x.shape[1]}")
        if x.device != items[0].device:
            raise ValueError(f"{name}[{i}]: expected device {items[0].device}, got {x.device}")
        if dtype is None and x.dtype != items[0].dtype:
            raise TypeError(f"{name}[{i}]: expected dtype {items[0].dtype}, got {x.dtype} (pass dtype= to convert)")
    out_dtype = dtype or items[0].dtype
    if out_dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}[0]: expected dtype float32, float16 or bfloat16, got {out_dtype}")
    lengths = torch.tensor([x.shape[0] for x in items], dtype=torch.int64)
    offsets = torch.zeros(len(items) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    values = torch.cat([x.to(out_dtype) for x in items], 0) if offsets[-1] > 0 else items[0].new_zeros((0, d), dtype=out_dtype)
    return values, offsets.to(items[0].device)


def unpack(values: torch.Tensor, offsets: torch.Tensor) -> list[torch.Tensor]:
    """Inverse of :func:`pack`: a list of ``[L_i, d]`` views."""
    values = check_values(values, "values")
    bounds = check_offsets(offsets, values.shape[0], values.device, "offsets").tolist()
    return [values[bounds[i]:bounds[i + 1]] for i in range(len(bounds) - 1)]


def check_values(values: object, name: str) -> torch.Tensor:
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(values).__name__}")
    if values.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected dtype float32, float16 or bfloat16, got {values.dtype}")
    if values.dim() != 2:
        raise ValueError(f"{name}: expected shape [T, d], got {tuple(values.shape)}")
    if values.shape[1] == 0:
        raise ValueError(f"{name}: expected d >= 1, got shape {tuple(values.shape)}")
    return values


def check_offsets_layout(offsets: object, device: torch.device, name: str) -> torch.Tensor:
    """The O(1) part of :func:`check_offsets`: type, dtype, shape ``[N+1]`` and device, without
    reading a value (no pass over the items, no device-to-host read); returns it unchanged."""
    if not isinstance(offsets, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.int64 tensor, got {type(offsets).__name__}")
    if offsets.dtype != torch.int64:
        raise TypeError(f"{name}: expected dtype torch.int64, got {offsets.dtype}")
    if offsets.dim() != 1 or offsets.numel() < 1:
        raise ValueError(f"{name}: expected shape [N+1] with N >= 0, got {tuple(offsets.shape)}")
    if offsets.device != device:
        raise ValueError(f"{name}: expected device {device} (same as the values), got {offsets.device}")
    return offsets


def check_offsets(offsets: object, n_rows: int, device: torch.device, name: str) -> torch.Tensor:
    """Validates an offsets tensor against `n_rows` rows; returns it unchanged."""
    check_offsets_layout(offsets, device, name)
    if offsets.device.type == "cpu":  # numpy reads it in place: ~3 us against ~30 us for the torch ops
        o = offsets.detach().numpy()
        first, last, decreasing = int(o[0]), int(o[-1]), bool((o[1:] < o[:-1]).any())
    else:  # one device-to-host transfer for all three checks (each .item() on CUDA is a sync)
        first, last, decreasing = torch.stack(
            [offsets[0], offsets[-1], (offsets.diff() < 0).any().to(torch.int64)]).tolist()
    if first != 0:
        raise ValueError(f"{name}: expected offsets[0] == 0, got {first}")
    if last != n_rows:
        raise ValueError(f"{name}: expected offsets[-1] == {n_rows} (rows in values), got {last}")
    if decreasing:
        bad = int(torch.nonzero(offsets[1:] < offsets[:-1])[0, 0])
        raise ValueError(f"{name}: expected non-decreasing offsets, got offsets[{bad + 1}] < offsets[{bad}]")
    return offsets


def check_packed(values: object, offsets: object, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    v = check_values(values, f"{name}_values")
    o = check_offsets(offsets, v.shape[0], v.device, f"{name}_offsets")
    return v, o


def _all_finite(values: torch.Tensor) -> bool:
    # min and max propagate NaN and show inf, without the [T, d] bool tensor isfinite makes
    lo, hi = torch.aminmax(values)
    return bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))


def check_finite(values: torch.Tensor, name: str, source: torch.Tensor | None = None) -> None:
    """Rejects NaN or inf (done when vectors enter a store, not on every query of a store).

    `source`: the tensor `values` was cast from; when it was finite, the message says that the
    cast overflowed (e.g. float32 values beyond the float16 range).
    """
    if values.numel() and not _all_finite(values):
        row = int(torch.nonzero(~torch.isfinite(values))[0, 0])
        if source is not None and bool(torch.isfinite(source[row]).all()):
            big = float(source[row].abs().max())
            raise ValueError(f"{name}: expected values within the {values.dtype} range "
                             f"(|x| <= {torch.finfo(values.dtype).max:g}), got {big:g} in row {row}")
        raise ValueError(f"{name}: expected finite values, found NaN or inf in row {row}")


def check_no_grad(values: torch.Tensor, name: str, why: str) -> None:
    """Rejects a tensor that requires grad where no gradient can flow (`why` says where)."""
    if values.requires_grad:
        raise ValueError(f"{name}: expected a tensor without requires_grad ({why}); got one that requires grad, "
                         f"pass {name}.detach()")


def segment_ids(offsets: torch.Tensor) -> torch.Tensor:
    """``[T]`` int64: the item that owns each row."""
    n = offsets.numel() - 1
    return torch.repeat_interleave(torch.arange(n, device=offsets.device), offsets.diff())
