"""Encoders: named batch callables that turn texts and images into (multi-)vectors."""
from .base import ROLES, Encoder
from .hashing import HashingTextEncoder
from .pixels import PixelPatchEncoder, to_rgb_tensor

__all__ = ["ROLES", "Encoder", "HashingTextEncoder", "PixelPatchEncoder", "to_rgb_tensor"]
