"""Deterministic offline image patch encoder on raw pixels (no model, no download).

The image is resized to ``grid * cell`` pixels square (area averaging), cut into ``grid x grid``
patches of ``cell x cell`` RGB pixels, and each patch becomes the vector of its pixels minus the
image's mean colour, L2-normalised: ``d = 3 * cell^2``. Patches are emitted row-major. A colour
and layout baseline that makes image and region items real multi-vectors offline; the
EfficientNet and ColPali encoders replace it where weights exist.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .base import Encoder


def to_rgb_tensor(image) -> torch.Tensor:
    """``[3, H, W]`` float32 in [0, 1] from a PIL image or an ``[H, W, 3]`` / ``[H, W]`` uint8 array."""
    if hasattr(image, "convert"):  # PIL
        image = np.asarray(image.convert("RGB"))
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim not in (2, 3):
        raise TypeError(f"images: expected PIL images or uint8 [H, W, 3] arrays, got {type(image).__name__}")
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)
    if image.shape[2] != 3 or image.shape[0] < 1 or image.shape[1] < 1:
        raise ValueError(f"images: expected [H, W, 3] with H, W >= 1, got {list(image.shape)}")
    return torch.from_numpy(np.array(image, copy=True)).permute(2, 0, 1).float() / 255.0


class PixelPatchEncoder:
    """Args: grid (patches per side), cell (pixels per patch side after resizing)."""

    def __init__(self, grid: int = 8, cell: int = 4):
        for name, v in (("grid", grid), ("cell", cell)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        self.grid, self.cell = grid, cell
        self.dim = 3 * cell * cell
        self.name = f"pixel-patches-g{grid}-c{cell}"

    def patch_vectors(self, images: list) -> list[torch.Tensor]:
        """``[grid^2, 3 * cell^2]`` per image."""
        out = []
        side = self.grid * self.cell
        for image in images:
            x = to_rgb_tensor(image)[None]
            x = F.interpolate(x, size=(side, side), mode="area")[0]
            x = x - x.mean(dim=(1, 2), keepdim=True)
            patches = x.unfold(1, self.cell, self.cell).unfold(2, self.cell, self.cell)  # [3, g, g, c, c]
            patches = patches.permute(1, 2, 0, 3, 4).reshape(self.grid * self.grid, self.dim)
            out.append(F.normalize(patches, dim=1).contiguous())
        return out

    def patch_encoder(self) -> Encoder:
        return Encoder(self.patch_vectors, self.name, self.dim, "patches")
