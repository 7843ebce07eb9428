"""mKG-RAG scene graphs: ``<object-i>: category, (x1, y1, x2, y2)`` and relations between objects."""
from __future__ import annotations

import re

from ..records import ParseResult, Position, SceneObject, SceneRelation, clean_field
from ._common import _blank_fences, _Collector, _records_by_line

_OBJ = r"<\s*object[-_ ]?(\d+)\s*>"
_SCENE_OBJECT = re.compile(
    r"^<\s*object[-_ ]?(\d+)\s*>\s*:\s*(.*?)\s*,?\s*[(\[]([^()\[\]]*)[)\]]\s*\.?$", re.IGNORECASE)
_SCENE_RELATION = re.compile(
    r"^<\s*relation[-_ ]?(\d+)\s*>\s*:\s*" + _OBJ + r"\s+(.+?)\s+" + _OBJ + r"\s*\.?$", re.IGNORECASE)


def _parse_scene_graph(text: str, strict: bool, dialect: str) -> ParseResult:
    col = _Collector(text, strict)
    body = _blank_fences(text)
    objects: dict[int, SceneObject] = {}
    pending: list[tuple[Position, str, int, int, str, int]] = []
    for pos, raw, content in _records_by_line(col, body):
        head = content.lower().replace(" ", "")
        if head.startswith("<object"):
            _scene_object(col, pos, raw, content, objects)
        elif head.startswith("<relation"):
            match = _SCENE_RELATION.match(content)
            if match is None:
                col.reject(pos, "malformed relation", raw, "expected <relation-j>: <object-a> predicate <object-b>")
                continue
            index, subject, predicate, obj = match.groups()
            pending.append((pos, raw, int(index), int(subject), " ".join(predicate.split()), int(obj)))
        else:
            col.warn(pos, "text outside records", raw, "ignored")
    col.objects.extend(objects.values())
    # Relations are checked after all objects are known: a graph may list them in any order.
    seen: set[int] = set()
    for pos, raw, index, subject, predicate, obj in pending:
        missing = [i for i in (subject, obj) if i not in objects]
        if index in seen:
            col.reject(pos, "duplicate index", raw, f"relation {index} already defined")
        elif missing:
            col.reject(pos, "unknown object", raw, f"no object {missing[0]} in this scene graph")
        elif subject == obj:
            col.reject(pos, "self-loop", raw, f"object {subject} relates to itself", severity="skip")
        else:
            seen.add(index)
            col.scene_relations.append(SceneRelation(index, subject, predicate, obj, pos))
    return col.finish(dialect, complete=True)


def _scene_object(col: _Collector, pos: Position, raw: str, content: str, objects: dict[int, SceneObject]) -> None:
    match = _SCENE_OBJECT.match(content)
    if match is None:
        col.reject(pos, "malformed object", raw, "expected <object-i>: category, (x1, y1, x2, y2)")
        return
    index, category, coords = int(match.group(1)), clean_field(match.group(2)), match.group(3)
    if not category:
        col.reject(pos, "empty name", raw, f"object {index} has no category")
        return
    try:
        box = tuple(float(c) for c in coords.split(","))
    except ValueError:
        col.reject(pos, "bad bbox", raw, f"non-numeric coordinate in {coords!r}")
        return
    if len(box) != 4:
        col.reject(pos, "bad bbox", raw, f"expected 4 coordinates, got {len(box)}")
        return
    x1, y1, x2, y2 = box
    if not all(0.0 <= c <= 1.0 for c in box):  # also false for NaN
        col.reject(pos, "bad bbox", raw, f"coordinates must lie in [0, 1], got {box}")
    elif x2 < x1 or y2 < y1:
        col.reject(pos, "bad bbox", raw, f"expected x1 <= x2 and y1 <= y2, got {box}")
    elif index in objects:
        col.reject(pos, "duplicate index", raw, f"object {index} already defined")
    else:
        objects[index] = SceneObject(index, category, (x1, y1, x2, y2), pos)
