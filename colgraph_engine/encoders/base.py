"""What an encoder is, to the engine: a named callable with a fixed output dimension.

Three roles, each a callable over a batch:

* ``text``:    ``list[str] -> Tensor [k, d]``           one vector per text (entities, relations)
* ``tokens``:  ``list[str] -> list[Tensor [L_i, d]]``   a multi-vector per text (segments, tables)
* ``patches``: ``list[PIL.Image] -> list[Tensor [P_i, d]]`` a multi-vector per image (images, regions)

Any callable works; :class:`Encoder` attaches the ``name`` and ``dim`` that the index records in
its manifest, so that an index is never queried with vectors from a different model.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from ..packed import _all_finite

Role = Literal["text", "tokens", "patches"]
ROLES: tuple[Role, ...] = ("text", "tokens", "patches")


@dataclass(frozen=True)
class Encoder:
    """A batch encoder for one role.

    Args:
        fn: the callable (see the module docstring for its signature per role).
        name: a stable identifier of the model and its settings (recorded in index manifests).
        dim: the dimension d of every output vector.
        role: ``"text"``, ``"tokens"`` or ``"patches"``.
        source: ``(key, value)`` string pairs saying where the model was loaded from (e.g.
            ``(("family", "colqwen2"), ("path", "/models/colqwen2")))``), recorded in the manifest
            beside name and dim so that an index can be reopened with its model; empty for models
            that ship in packages (or need none).
    """
    fn: Callable
    name: str
    dim: int
    role: Role
    source: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        if not callable(self.fn):
            raise TypeError(f"fn: expected a callable, got {type(self.fn).__name__}")
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name: expected a non-empty str, got {self.name!r}")
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 1:
            raise ValueError(f"dim: expected a positive int, got {self.dim!r}")
        if self.role not in ROLES:
            raise ValueError(f"role: expected one of {ROLES}, got {self.role!r}")
        if not isinstance(self.source, tuple) or not all(
                isinstance(p, tuple) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in self.source):
            raise TypeError(f"source: expected a tuple of (str, str) pairs, got {self.source!r}")

    def __call__(self, batch: Sequence) -> torch.Tensor | list[torch.Tensor]:
        """Runs the encoder and checks what it returned (count, shape, finiteness)."""
        out = self.fn(list(batch))
        if self.role == "text":
            if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape != (len(batch), self.dim):
                raise ValueError(f"encoder {self.name!r}: expected a [{len(batch)}, {self.dim}] tensor, "
                                 f"got {_describe(out)}")
            _check_finite(out, self.name)
            return out
        if not isinstance(out, (list, tuple)) or len(out) != len(batch):
            raise ValueError(f"encoder {self.name!r}: expected {len(batch)} tensors, got {_describe(out)}")
        for i, t in enumerate(out):
            if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape[1] != self.dim:
                raise ValueError(f"encoder {self.name!r}: output {i} should be [L, {self.dim}], got {_describe(t)}")
            _check_finite(t, self.name)
        return list(out)


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor of shape {list(x.shape)}"
    if isinstance(x, (list, tuple)):
        return f"{type(x).__name__} of {len(x)}"
    return type(x).__name__


def _check_finite(t: torch.Tensor, name: str) -> None:
    if t.is_floating_point() and t.numel() and not _all_finite(t):
        raise ValueError(f"encoder {name!r}: output contains NaN or inf")
