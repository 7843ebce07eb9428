"""Node kinds of the multimodal knowledge graph. Edge kinds are free small ints (0..63)."""
from __future__ import annotations

from enum import IntEnum

MAX_KIND = 64  # kinds are bits of a 64-bit mask in the expansion filters


class NodeKind(IntEnum):
    DOCUMENT = 0
    SEGMENT = 1
    ENTITY = 2
    IMAGE = 3
    REGION = 4
    TABLE = 5


def kind_mask(kinds) -> int:
    """64-bit mask with the bit of every kind in `kinds` set; None means every kind."""
    if kinds is None:
        return (1 << MAX_KIND) - 1
    mask = 0
    for k in kinds:
        k = int(k)
        if not 0 <= k < MAX_KIND:
            raise ValueError(f"kinds: expected kinds in [0, {MAX_KIND}), got {k}")
        mask |= 1 << k
    return mask
