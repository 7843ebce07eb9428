"""Parenthesised tuple records: LightRAG legacy, GraphRAG, nano-graphrag, and mKG-RAG mappings."""
from __future__ import annotations

import re

from ..records import MappingRecord, ParseResult, Position, clean_field, normalize_name
from ._common import (
    _MAX_INDEX_DIGITS, TUPLE_DELIMITER, _blank_fences, _Collector, _cut_at_completion, _index, _kind, _looks_numeric,
    _split_fields,
)

_REF = re.compile(r"^<\s*(?:(image)|(object|relation)[-_ ]?(\d+))\s*>$", re.IGNORECASE)


# Records end at "##" or at a line break followed by an opening parenthesis, so that a record
# whose description wraps onto a second line still stays whole.
_TUPLE_SEPARATOR = re.compile(r"#{2,}|\n(?=[ \t]*(?:[-*][ \t]+)?\()")


def _parse_tuple(text: str, strict: bool, dialect: str) -> ParseResult:
    col = _Collector(text, strict)
    body, complete = _cut_at_completion(col, _blank_fences(text))
    start = 0
    for match in [*_TUPLE_SEPARATOR.finditer(body), None]:
        end = match.start() if match else len(body)
        _tuple_chunk(col, body, start, end)
        start = match.end() if match else end
    if dialect == "tuple" and not (col.entities or col.relations) and col.mappings:
        dialect = "mkg_mapping"
    return col.finish(dialect, complete)


def _tuple_chunk(col: _Collector, body: str, start: int, end: int) -> None:
    chunk = body[start:end]
    if not chunk.strip():
        return
    open_, close = chunk.find("("), chunk.rfind(")")
    if open_ < 0 or close < open_:
        raw = chunk.strip()
        reason = "unclosed record" if open_ >= 0 else "text outside records"
        pos = col.pos(start + chunk.find(raw[0]))
        if open_ >= 0:
            col.reject(pos, reason, raw)
        else:
            col.warn(pos, reason, raw, "ignored")
        return
    for outside, where in ((chunk[:open_], start), (chunk[close + 1:], start + close + 1)):
        if outside.strip():
            col.warn(col.pos(where), "text outside records", outside.strip(), "ignored")
    pos, raw = col.pos(start + open_), chunk[open_:close + 1]
    inner = chunk[open_ + 1:close]
    fields, odd = _split_fields(inner, TUPLE_DELIMITER)
    kind = _kind(fields[0])
    if len(fields) == 1 and "|" in inner:
        # mKG-RAG's own examples use a bare "|"; elsewhere it is a damaged "<|>".
        fields, odd = inner.split("|"), []
        kind = _kind(fields[0])
        if kind != "mapping":
            odd = ["|"]
    if odd:
        col.warn(pos, "repaired delimiter", raw, f"read {', '.join(odd)} as {TUPLE_DELIMITER}")
    rest = fields[1:]
    if kind == "entity":
        if len(rest) == 3:
            col.add_entity(pos, raw, *rest)
        elif len(rest) in (4, 5) and _looks_numeric(rest[-1]):
            col.warn(pos, "reclassified entity as relation", raw, "ends with a numeric strength")
            _tuple_relation(col, pos, raw, rest)
        else:
            col.reject(pos, "wrong field count", raw, f"entity needs 4 fields, got {len(fields)}")
    elif kind in ("relationship", "relation"):
        _tuple_relation(col, pos, raw, rest)
    elif kind == "content_keywords":
        col.ignored += 1
    elif kind == "mapping":
        _mapping(col, pos, raw, rest)
    elif not rest:
        col.reject(pos, "missing delimiter", raw, f"no {TUPLE_DELIMITER} between fields")
    else:
        col.reject(pos, "unknown record type", raw, f"got {clean_field(fields[0])!r}")


def _tuple_relation(col: _Collector, pos: Position, raw: str, rest: list[str]) -> None:
    if len(rest) == 5:    # LightRAG legacy: source, target, description, keywords, strength
        source, target, description, keywords, strength = rest
    elif len(rest) == 4:  # GraphRAG / nano-graphrag: source, target, description, strength
        source, target, description, strength = rest
        keywords = ""
    else:
        col.reject(pos, "wrong field count", raw, f"relationship needs 5 or 6 fields, got {len(rest) + 1}")
        return
    weight = col.number(strength, pos, raw, "weight")
    if weight is not None:
        col.add_relation(pos, raw, source, target, keywords, description, weight)


def _mapping(col: _Collector, pos: Position, raw: str, rest: list[str]) -> None:
    if not rest:
        col.reject(pos, "wrong field count", raw, "mapping has no fields")
        return
    ref = _REF.match(clean_field(rest[0]))
    if ref is None:
        col.reject(pos, "bad region reference", raw, f"expected <image>, <object-N> or <relation-N>, got {clean_field(rest[0])!r}")
        return
    kind = "image" if ref.group(1) else ref.group(2).lower()
    index = None if kind == "image" else _index(ref.group(3))
    if kind != "image" and index is None:
        col.reject(pos, "index too large", raw, f"more than {_MAX_INDEX_DIGITS} digits in {kind} index")
        return
    want = 5 if kind == "relation" else 4
    if len(rest) + 1 != want:
        col.reject(pos, "wrong field count", raw, f"{kind} mapping needs {want} fields, got {len(rest) + 1}")
        return
    score = col.number(rest[-1], pos, raw, "score")
    if score is None:
        return
    names = [clean_field(f) for f in rest[1:-1]]
    if not all(normalize_name(n) for n in names):
        col.reject(pos, "empty name", raw, f"{kind} mapping")
        return
    if kind == "relation":
        if normalize_name(names[0]) == normalize_name(names[1]):
            col.reject(pos, "self-loop", raw, f"{names[0]!r} -> {names[1]!r}", severity="skip")
            return
        col.mappings.append(MappingRecord("relation", index, None, names[0], names[1], score, pos))
    else:
        col.mappings.append(MappingRecord(kind, index, names[0], None, None, score, pos))
