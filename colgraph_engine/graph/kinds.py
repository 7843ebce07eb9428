"""Node and edge kinds of the multimodal knowledge graph.

The graph itself accepts any kind in [0, 64); the enums name the ones the builder in
:mod:`colgraph_engine.kg` writes.
"""
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


class EdgeKind(IntEnum):
    """Edges written by the document graph builder (direction: container -> contained,
    text -> what it mentions, picture -> what it depicts)."""
    CONTAINS = 0         # document -> segment, segment -> image/table, image -> region
    MENTIONS = 1         # segment -> entity (weight: mentions in the segment)
    RELATION = 2         # entity -> entity, an extracted relation (weight: summed strength)
    DEPICTS = 3          # image or object region -> entity (weight: match score)
    DEPICTS_RELATION = 4  # relation region -> each endpoint entity of the relation
    SCENE = 5            # region -> region, a scene-graph relation (text: the predicate)


class _Plain:
    """The members of an enum as plain ints under the same names (``NODE.ENTITY == 2``).

    For numpy comparisons on the query path: numpy compares an int *subclass* (an IntEnum
    member) through its slow path for unknown objects, measured 3-4 us a comparison of a numpy
    scalar on Python 3.11 against 0.04 us for an int, and the query stages make thousands of
    them per query (``view.node_kind[x] == NODE.ENTITY`` rather than ``== NodeKind.ENTITY``)."""

    def __init__(self, enum_type):
        for member in enum_type:
            setattr(self, member.name, int(member))

    def __setattr__(self, name, value):
        if name in self.__dict__:
            raise AttributeError(f"{name}: the kinds are constants")
        object.__setattr__(self, name, value)


NODE = _Plain(NodeKind)
EDGE = _Plain(EdgeKind)
