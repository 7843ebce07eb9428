"""One encoder per role: the set an index is built with and records in its manifest.

``Encoders(text, tokens, patches)`` holds an :class:`~colgraph_engine.encoders.base.Encoder` per role
(None: that role's stores stay empty); :meth:`Encoders.describe` is what a manifest records, so an
index reopens only with encoders that produce the same vectors. The named sets a user picks on the
command line (``models``, ``hashing``, a ColPali-family folder) are built in :mod:`.sets`.
"""
from __future__ import annotations

from dataclasses import dataclass

from .base import Encoder
from .hashing import HashingTextEncoder
from .pixels import PixelPatchEncoder


@dataclass(frozen=True)
class Encoders:
    """The encoders of an index, one per role (None: the role's stores stay empty)."""
    text: Encoder | None = None
    tokens: Encoder | None = None
    patches: Encoder | None = None

    def __post_init__(self):
        for role in ("text", "tokens", "patches"):
            enc = getattr(self, role)
            if enc is not None and (not isinstance(enc, Encoder) or enc.role != role):
                raise TypeError(f"{role}: expected an Encoder with role {role!r} or None, got {enc!r}")

    @classmethod
    def offline(cls, text_dim: int = 128, patch_grid: int = 8, patch_cell: int = 4) -> Encoders:
        """Deterministic model-free encoders (feature hashing for text, raw pixel patches)."""
        h = HashingTextEncoder(text_dim)
        return cls(h.text_encoder(), h.token_encoder(), PixelPatchEncoder(patch_grid, patch_cell).patch_encoder())

    def describe(self) -> dict:
        """``{role: {"name", "dim"} or None}`` as recorded in an index manifest, with
        ``"source": {key: value}`` added for an encoder that says where its model was loaded from
        (a ColPali-family folder: ``{"family", "path"}``)."""
        return {role: None if (e := getattr(self, role)) is None else
                {"name": e.name, "dim": e.dim, **({"source": dict(e.source)} if e.source else {})}
                for role in ("text", "tokens", "patches")}
