"""mKG-RAG scene graphs: ``<object-i>: category, (x1, y1, x2, y2)`` and relations between objects."""
from __future__ import annotations

import re

from ..records import ParseResult, Position, SceneObject, SceneRelation, clean_field
from ._common import _MAX_INDEX_DIGITS, _blank_fences, _Collector, _index, _records_by_line, _strip_reasoning

_OBJ = r"<\s*object[-_ ]?(\d+)\s*>"
# Only the fixed-shape heads are regexes; the free-text middle of a line (category, predicate)
# is cut out with str methods from both ends, so a line is read in one linear pass.
_OBJECT_HEAD = re.compile(r"<\s*object[-_ ]?(\d+)\s*>\s*:", re.IGNORECASE)
_RELATION_HEAD = re.compile(r"<\s*relation[-_ ]?(\d+)\s*>\s*:\s*" + _OBJ, re.IGNORECASE)
_OBJECT_REF = re.compile(_OBJ, re.IGNORECASE)


def _without_end_dot(content: str) -> str:
    """Drops a final ``.`` and the whitespace before it (both optional)."""
    return content[:-1].rstrip() if content.endswith(".") else content


def _split_object(content: str) -> tuple[str, str, str] | None:
    """``<object-i>: category, (x1, y1, x2, y2)`` -> (index digits, category, coordinates).

    Reads what ``<object-i>:\\s*(.*?)\\s*,?\\s*[(\\[]([^()\\[\\]]*)[)\\]]\\s*\\.?$`` would, without
    backtracking: the box is the last bracket pair, the category everything between the colon
    and the box, less one separating comma.
    """
    head = _OBJECT_HEAD.match(content)
    if head is None:
        return None
    body = _without_end_dot(content)
    if len(body) <= head.end() or body[-1] not in ")]":
        return None
    opener = max(body.rfind(c, head.end(), len(body) - 1) for c in "()[]")
    if opener < 0 or body[opener] not in "([":
        return None
    category = body[head.end():opener].rstrip()
    if category.endswith(","):
        category = category[:-1]
    return head.group(1), category.strip(), body[opener + 1:-1]


def _split_relation(content: str) -> tuple[str, str, str, str] | None:
    """``<relation-j>: <object-a> predicate <object-b>`` -> (j, a, predicate, b), digits as text.

    Reads what ``<relation-j>:\\s*<object-a>\\s+(.+?)\\s+<object-b>\\s*\\.?$`` would: the second
    object is the last ``<`` to the end, the predicate what lies between, which must start and
    end with whitespace around at least one character.
    """
    head = _RELATION_HEAD.match(content)
    if head is None:
        return None
    body = _without_end_dot(content)
    start = body.rfind("<", head.end())
    tail = _OBJECT_REF.match(body, start) if start >= 0 else None
    if tail is None or tail.end() != len(body):
        return None
    middle = body[head.end():start]
    if len(middle) < 3 or not middle[0].isspace() or not middle[-1].isspace():
        return None
    return head.group(1), head.group(2), " ".join(middle.split()), tail.group(1)


def _parse_scene_graph(text: str, strict: bool, dialect: str) -> ParseResult:
    col = _Collector(text, strict)
    body = _blank_fences(_strip_reasoning(col, text))
    objects: dict[int, SceneObject] = {}
    pending: list[tuple[Position, str, int, int, str, int]] = []
    for pos, raw, content in _records_by_line(col, body):
        head = content.lower().replace(" ", "")
        if head.startswith("<object"):
            _scene_object(col, pos, raw, content, objects)
        elif head.startswith("<relation"):
            parts = _split_relation(content)
            if parts is None:
                col.reject(pos, "malformed relation", raw, "expected <relation-j>: <object-a> predicate <object-b>")
                continue
            index, subject, obj = _index(parts[0]), _index(parts[1]), _index(parts[3])
            if index is None or subject is None or obj is None:
                col.reject(pos, "index too large", raw, f"more than {_MAX_INDEX_DIGITS} digits")
                continue
            pending.append((pos, raw, index, subject, parts[2], obj))
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
    parts = _split_object(content)
    if parts is None:
        col.reject(pos, "malformed object", raw, "expected <object-i>: category, (x1, y1, x2, y2)")
        return
    index, category, coords = _index(parts[0]), clean_field(parts[1]), parts[2]
    if index is None:
        col.reject(pos, "index too large", raw, f"more than {_MAX_INDEX_DIGITS} digits")
        return
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
