"""LightRAG's JSON mode: ``{"entities": [...], "relationships": [...]}``, possibly fenced or in prose."""
from __future__ import annotations

import json
import re

from ..records import ParseResult, Position
from ._common import _Collector


def _parse_json(text: str, strict: bool, dialect: str) -> ParseResult:
    col = _Collector(text, strict)
    start, data, error = _find_json(text)
    if error is not None:
        col.reject(col.pos(start), "invalid JSON", text[start:start + 200], error)
        return col.finish(dialect, complete=False, no_records_check=False)
    pos0 = col.pos(start)
    if not isinstance(data, dict):
        col.reject(pos0, "invalid JSON", text[start:start + 200], f"expected an object, got {type(data).__name__}")
        return col.finish(dialect, complete=False, no_records_check=False)
    entities = data.get("entities", [])
    relations = data.get("relationships", data.get("relations", []))
    for key, items in (("entities", entities), ("relationships", relations)):
        if not isinstance(items, list):
            col.reject(pos0, "wrong JSON shape", json.dumps(items)[:200], f"{key!r} must be a list")
    if isinstance(entities, list):
        for i, item in enumerate(entities):
            fields = _json_fields(col, (i, start), item, ("name", "type", "description"), ())
            if fields is not None:
                col.add_entity((i, start), json.dumps(item, ensure_ascii=False), *fields)
    if isinstance(relations, list):
        for i, item in enumerate(relations):
            pos, raw = (i, start), json.dumps(item, ensure_ascii=False)
            fields = _json_fields(col, pos, item, ("source", "target", "description"), ("keywords",))
            if fields is None:
                continue
            weight = None
            if isinstance(item, dict) and item.get("weight") is not None:
                weight = col.number(str(item["weight"]), pos, raw, "weight")
                if weight is None:
                    continue
            source, target, description, keywords = fields
            col.add_relation(pos, raw, source, target, keywords, description, weight)
    return col.finish(dialect, complete=True)


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
        return start, json.loads(candidate), None
    except json.JSONDecodeError as exc:
        return start, None, str(exc)


def _json_fields(col: _Collector, pos: Position, item: object, required: tuple[str, ...],
                 optional: tuple[str, ...]) -> list[str] | None:
    raw = json.dumps(item, ensure_ascii=False)
    if not isinstance(item, dict):
        col.reject(pos, "wrong JSON shape", raw, f"expected an object, got {type(item).__name__}")
        return None
    values = []
    for key in required + optional:
        value = item.get(key)
        if value is None and key in optional:
            value = ""
        if isinstance(value, list) and key == "keywords" and all(isinstance(v, str) for v in value):
            value = ", ".join(value)
        if not isinstance(value, str):
            col.reject(pos, "wrong JSON shape", raw, f"{key!r} must be a string, got {type(value).__name__}")
            return None
        values.append(value)
    return values
