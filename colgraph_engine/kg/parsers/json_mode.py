"""LightRAG's JSON mode: ``{"entities": [...], "relationships": [...]}``, possibly fenced or in prose."""
from __future__ import annotations

import json
import re

from ..records import ParseResult, Position
from ._common import _MAX_INDEX_DIGITS, _Collector, _strip_reasoning


# Key spellings, first found wins: LightRAG's JSON mode, the ``entity_name`` / ``source_entity``
# / ``target_entity`` keys of LightRAG's JSON prompt of 2024 (and of prompts copied from it),
# fast-graphrag's ``desc``, and ``src_id`` / ``tgt_id`` as LightRAG stores edges.
_ENTITY_KEYS = (("name", "entity_name", "entity"), ("type", "entity_type"),
                ("description", "entity_description", "desc"))
_RELATION_KEYS = (("source", "source_entity", "src_id", "src"), ("target", "target_entity", "tgt_id", "tgt"),
                  ("description", "relationship_description", "relation_description", "desc"))
_KEYWORD_KEYS = ("keywords", "relationship_keywords", "relation_keywords")
_WEIGHT_KEYS = ("weight", "strength", "relationship_strength", "relation_strength")
# fast-graphrag answers relations in two lists; both are relations.
_RELATION_LISTS = ("relationships", "relations", "other_relationships")


def _parse_json(text: str, strict: bool, dialect: str) -> ParseResult:
    col = _Collector(text, strict)
    start, data, error = _find_json(_strip_reasoning(col, text))
    if error is not None:
        col.reject(col.pos(start), "invalid JSON", text[start:start + 200], error)
        return col.finish(dialect, complete=False, no_records_check=False)
    pos0 = col.pos(start)
    if not isinstance(data, dict):
        col.reject(pos0, "invalid JSON", text[start:start + 200], f"expected an object, got {type(data).__name__}")
        return col.finish(dialect, complete=False, no_records_check=False)
    entities = data.get("entities", [])
    relation_lists = [(key, data[key]) for key in _RELATION_LISTS if key in data]
    for key, items in (("entities", entities), *relation_lists):
        if not isinstance(items, list):
            col.reject(pos0, "wrong JSON shape", _dumps(items, ensure_ascii=True)[:200], f"{key!r} must be a list")
    if isinstance(entities, list):
        for i, item in enumerate(entities):
            raw = _dumps(item)
            if not isinstance(item, dict):  # (the check _json_fields would make, without the call)
                col.reject((i, start), "wrong JSON shape", raw, f"expected an object, got {type(item).__name__}")
                continue
            # A missing description is "" (an "empty description" warning), as for the other dialects.
            fields = _json_fields(col, (i, start), item, raw, _ENTITY_KEYS[:2], _ENTITY_KEYS[2:])
            if fields is not None:
                col.add_entity((i, start), raw, *fields)
    offset = 0  # relation positions count on across the lists
    for _, items in relation_lists:
        if not isinstance(items, list):
            continue
        for i, item in enumerate(items, offset):
            pos, raw = (i, start), _dumps(item)
            fields = _json_fields(col, pos, item, raw, _RELATION_KEYS[:2], (_RELATION_KEYS[2], _KEYWORD_KEYS))
            if fields is None:
                continue
            if not fields[2].strip():
                col.warn(pos, "empty description", raw, f"relation {fields[0]!r} -> {fields[1]!r}")
            weight = None
            value = _first(item, _WEIGHT_KEYS)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                weight = col.number(_text(value), pos, raw, "weight")  # a JSON number: judged as one
                if weight is None:
                    continue
            elif value is not None:
                weight = col.weight(_text(value), pos, raw)
                if weight is None:
                    continue
            source, target, description, keywords = fields
            col.add_relation(pos, raw, source, target, keywords, description, weight)
        offset += len(items)
    # {"entities": [], "relationships": []} is a whole, empty answer, not a missing one.
    listed = isinstance(entities, list) and "entities" in data or any(isinstance(v, list) for _, v in relation_lists)
    return col.finish(dialect, complete=True, no_records_check=not listed)


def _first(item: dict, keys: tuple[str, ...]):
    """The value of the first of ``keys`` that ``item`` holds with a non-null value, else None."""
    for key in keys:
        value = item.get(key)
        if value is not None:
            return value
    return None


def _find_json(text: str) -> tuple[int, object, str | None]:
    """Locates the JSON object: a ```json fence if there is one, else first "{" to last "}"."""
    fence = re.search(r"```(?:json)?[ \t]*\n(.*?)```", text, re.DOTALL | re.IGNORECASE)
    if fence and "{" in fence.group(1):
        start, candidate = fence.start(1), fence.group(1)
    else:
        start, end = text.find("{"), text.rfind("}")
        if start < 0 or end < start:
            return max(start, 0), None, "no JSON object found"
        candidate = text[start:end + 1]
    start += len(candidate) - len(candidate.lstrip())
    try:
        return start, json.loads(candidate, parse_int=_parse_int), None
    except json.JSONDecodeError as exc:
        return start, None, str(exc)
    except RecursionError:
        return start, None, "nested too deeply"


def _parse_int(digits: str) -> int | float:
    """JSON integers as ``json`` reads them, except that one too long for ``int()`` (Python's
    digit limit, and quadratic below it) becomes the float it spells (``inf`` past 1e308):
    the record holding it is judged by the usual checks instead of the whole response failing."""
    if len(digits) - digits.startswith("-") <= _MAX_INDEX_DIGITS:
        try:
            return int(digits)
        except ValueError:  # a lower interpreter limit (sys.set_int_max_str_digits)
            pass
    return float(digits)


def _text(value: object) -> str:
    """``str(value)``, or the type's name where that would exceed the recursion limit."""
    try:
        return str(value)
    except RecursionError:
        return f"<{type(value).__name__}>"


_ENCODE = json.JSONEncoder(ensure_ascii=False).encode  # json.dumps(..., ensure_ascii=False), built once


def _dumps(value: object, ensure_ascii: bool = False) -> str:
    """``json.dumps`` for the raw text of an issue; never raises (depth, odd values)."""
    try:
        if ensure_ascii:
            return json.dumps(value)
        if type(value) is int:  # the common malformed item; what json.dumps writes, without its set-up
            return int.__repr__(value)
        return _ENCODE(value)
    except (RecursionError, ValueError, TypeError):
        return f"<{type(value).__name__}>"


def _json_fields(col: _Collector, pos: Position, item: object, raw: str, required: tuple[tuple[str, ...], ...],
                 optional: tuple[tuple[str, ...], ...]) -> list[str] | None:
    """The string values of ``required`` then ``optional`` fields, each given by its accepted key
    spellings; a missing optional field is ``""``; keywords may be a list of strings."""
    if not isinstance(item, dict):
        col.reject(pos, "wrong JSON shape", raw, f"expected an object, got {type(item).__name__}")
        return None
    values = []
    for keys in required + optional:
        value = _first(item, keys)
        if value is None and keys in optional:
            value = ""
        if isinstance(value, list) and keys is _KEYWORD_KEYS and all(isinstance(v, str) for v in value):
            value = ", ".join(value)
        if not isinstance(value, str):
            col.reject(pos, "wrong JSON shape", raw, f"{keys[0]!r} must be a string, got {type(value).__name__}")
            return None
        values.append(value)
    return values
