"""Shared plumbing of the model-backed encoders: argument checks, batching with progress, packing."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
from tqdm.auto import tqdm

from ..packed import FLOAT_DTYPES


def check_common(device, dtype, batch_size) -> tuple[torch.device, torch.dtype, int]:
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype: expected one of {FLOAT_DTYPES}, got {dtype}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device: {exc}") from None
    return device, dtype, batch_size


def batches(items: Sequence, batch_size: int, progress: bool, desc: str) -> Iterator[Sequence]:
    bar = tqdm(total=len(items), desc=desc, unit="item", disable=not progress)
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        yield chunk
        bar.update(len(chunk))
    bar.close()


def pack_list(vectors: list[torch.Tensor], dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values [T, d], offsets [N+1])`` from N ``[L_i, d]`` tensors."""
    offsets = torch.zeros(len(vectors) + 1, dtype=torch.int64)
    if vectors:
        torch.cumsum(torch.tensor([v.shape[0] for v in vectors], dtype=torch.int64), 0, out=offsets[1:])
        values = torch.cat([v.to(dtype) for v in vectors])
    else:
        values = torch.zeros((0, dim), dtype=dtype)
    return values, offsets


def check_texts(texts, name: str = "texts") -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"{name}: expected a sequence of str, got {type(texts).__name__}")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"{name}[{i}]: expected str, got {type(t).__name__}")
    return list(texts)


def check_images(images, name: str = "images") -> list:
    """PIL images or uint8 [H, W, 3] arrays -> RGB PIL images."""
    import numpy as np
    from PIL import Image

    if not isinstance(images, Sequence) or isinstance(images, (str, bytes)):
        raise TypeError(f"{name}: expected a sequence of PIL images or uint8 arrays, got {type(images).__name__}")
    out = []
    for i, im in enumerate(images):
        if isinstance(im, np.ndarray):
            if im.dtype != np.uint8 or im.ndim not in (2, 3) or (im.ndim == 3 and im.shape[2] != 3) or 0 in im.shape:
                raise ValueError(f"{name}[{i}]: expected a uint8 [H, W, 3] or [H, W] array, got {im.dtype} {list(im.shape)}")
            im = Image.fromarray(im)
        if not hasattr(im, "convert") or not hasattr(im, "size"):
            raise TypeError(f"{name}[{i}]: expected a PIL image or uint8 array, got {type(im).__name__}")
        if min(im.size) < 1:
            raise ValueError(f"{name}[{i}]: empty image {im.size}")
        out.append(im.convert("RGB"))
    return out


Runner = Callable[[Sequence], list[torch.Tensor]]
