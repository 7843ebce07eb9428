"""Parenthesised tuple records: LightRAG legacy, GraphRAG, nano-graphrag, and mKG-RAG mappings."""
from __future__ import annotations

import re

from ..records import MappingRecord, ParseResult, Position, clean_field, normalize_name
from ._common import (
    _MAX_INDEX_DIGITS, _NUMBER, TUPLE_DELIMITER, _blank_fences, _Collector, _cut_at_completion, _index,
    _judge_completion, _kind, _split_fields, _strip_reasoning,
)

_REF = re.compile(r"^<?\s*(?:(image)|(object|relation)[-_ ]?(\d+))\s*>?$", re.IGNORECASE)

_RECORD_KINDS = r"(?:entity|relationship|relation|content_keywords|mapping|matching)"

# Where one record ends and the next begins:
#   "##" (LightRAG legacy, GraphRAG, nano-graphrag), "<|RECORD|>" (mKG-RAG's record delimiter),
#   a line break followed by an opening parenthesis (so a description that wraps onto a second
#   line stays whole), and a ")" followed, after spaces or tabs only, by the opening of another
#   record, as in mKG-RAG's paper figure, where records stand one after another on one line.
# Each alternative starts at a fixed character; the last one only right after a ")", so every
# whitespace run is scanned by at most one attempt (linear time).
_TUPLE_SEPARATOR = re.compile(
    r"#{2,}"
    r"|<\|RECORD\|>"
    r"|\n(?=[ \t]*(?:[-*][ \t]+)?\()"
    r"|(?<=\))[ \t]*(?=\(\s*[\"']?" + _RECORD_KINDS + r"[\"']?\s*(?:<|\|))",
    re.IGNORECASE)

_MIN_FIELDS = {"entity": 3, "relationship": 3, "relation": 3, "mapping": 3, "matching": 3}  # after the kind
_PLACEHOLDERS = {"", "n/a", "na", "none", "null", "unknown", "-", "nan"}


def _parse_tuple(text: str, strict: bool, dialect: str) -> ParseResult:
    col = _Collector(text, strict)
    body, complete = _cut_at_completion(col, _blank_fences(_strip_reasoning(col, text)))
    chunks = []
    start = 0
    for match in [*_TUPLE_SEPARATOR.finditer(body), None]:
        end = match.start() if match else len(body)
        chunk = _split_chunk(body, start, end)
        if chunk is not None:
            chunks.append(chunk)
        start = match.end() if match else end
    # Names declared by entity records decide whether an entity record with a numeric last
    # field is a relation written as an entity (its second field a declared name) or an
    # entity with extra trailing fields (upstream reads both as entities). Issues are then
    # reported in one pass, in the order of the text.
    declared = {normalize_name(clean_field(c[5][1])) for c in chunks
                if c[5] is not None and _kind(c[5][0]) == "entity" and len(c[5]) >= 4}
    for chunk in chunks:
        row = _chunk_issues(col, body, chunk)
        if row is not None:
            _record(col, *row, declared)
    if dialect == "tuple" and not (col.entities or col.relations) and col.mappings:
        dialect = "mkg_mapping"
    _judge_completion(col, text, complete)
    return col.finish(dialect, complete, no_records_check=not (complete and not body.strip()))


def _split_chunk(body: str, start: int, end: int):
    """One record's text -> ``(start, end, open, close, odd delimiters, fields)`` (``fields``
    None when the chunk has no parenthesised record), or ``None`` for a blank chunk."""
    chunk = body[start:end]
    if not chunk.strip():
        return None
    open_, close = chunk.find("("), chunk.rfind(")")
    if open_ < 0 or close < open_:
        return start, end, open_, close, [], None
    inner = chunk[open_ + 1:close]
    fields, odd = _split_fields(inner, TUPLE_DELIMITER)
    if len(fields) == 1 and "|" in inner:
        # mKG-RAG's own examples use a bare "|"; elsewhere it is a damaged "<|>".
        fields, odd = inner.split("|"), []
        if _kind(fields[0]) not in ("mapping", "matching"):
            odd = ["|"]
    return start, end, open_, close, odd, fields


def _chunk_issues(col: _Collector, body: str, chunk):
    """Reports what surrounds a record and the repairs made to it; returns the record's
    ``(position, raw, kind, fields after the kind)`` or ``None``."""
    start, end, open_, close, odd, fields = chunk
    text = body[start:end]
    if fields is None:
        raw = text.strip()
        pos = col.pos(start + text.find(raw[0]))
        if open_ >= 0:
            col.reject(pos, "unclosed record", raw)
        else:
            col.warn(pos, "text outside records", raw, "ignored")
        return None
    for outside, where in ((text[:open_], start), (text[close + 1:], start + close + 1)):
        if outside.strip():
            col.warn(col.pos(where), "text outside records", outside.strip(), "ignored")
    pos, raw = col.pos(start + open_), text[open_:close + 1]
    if odd:
        col.warn(pos, "repaired delimiter", raw, f"read {', '.join(odd)} as {TUPLE_DELIMITER}")
    kind, rest = _kind(fields[0]), fields[1:]
    minimum = _MIN_FIELDS.get(kind)
    if minimum is not None and len(rest) > minimum and not clean_field(rest[-1]):
        # "(...<|>description<|>)": a delimiter left dangling before the closing parenthesis.
        while len(rest) > minimum and not clean_field(rest[-1]):
            rest = rest[:-1]
        col.warn(pos, "dangling delimiter", raw, "empty last field dropped")
    return pos, raw, kind, rest


def _record(col: _Collector, pos: Position, raw: str, kind: str, rest: list[str], declared: set[str]) -> None:
    if kind == "entity":
        if len(rest) == 3:
            col.add_entity(pos, raw, *rest)
        elif len(rest) in (4, 5) and _is_number(rest[-1]) and _relation_shaped(rest, declared):
            col.warn(pos, "reclassified entity as relation", raw,
                     "ends with a numeric strength and its second field is a declared entity")
            _tuple_relation(col, pos, raw, rest)
        elif len(rest) > 3:
            # Upstream reads the first three fields and ignores the rest (a custom prompt's
            # quote field, an importance score).
            col.warn(pos, "extra fields ignored", raw, f"entity has {len(rest) + 1} fields, read the first 4")
            col.add_entity(pos, raw, *rest[:3])
        else:
            col.reject(pos, "wrong field count", raw, f"entity needs 4 fields, got {len(rest) + 1}")
    elif kind in ("relationship", "relation"):
        _tuple_relation(col, pos, raw, rest)
    elif kind == "content_keywords":
        col.ignored += 1
        col.last_ok = True
    elif kind in ("mapping", "matching"):
        _mapping(col, pos, raw, rest)
    elif not rest:
        col.reject(pos, "missing delimiter", raw, f"no {TUPLE_DELIMITER} between fields")
    else:
        col.reject(pos, "unknown record type", raw, f"got {kind!r}")


def _relation_shaped(rest: list[str], declared: set[str]) -> bool:
    target = normalize_name(clean_field(rest[1]))
    return target in declared and target != normalize_name(clean_field(rest[0]))


def _is_number(field: str) -> bool:
    return _NUMBER.fullmatch(clean_field(field)) is not None


def _tuple_relation(col: _Collector, pos: Position, raw: str, rest: list[str]) -> None:
    """Field layouts, after source, target and description:

    * ``strength`` (GraphRAG, nano-graphrag, mKG-RAG);
    * ``keywords, strength`` (LightRAG legacy);
    * nothing, or a strength that is not a number (``N/A``, ``high``, empty): weight 1.0 with a
      warning, as upstream does; a non-number that is not a placeholder is read as keywords
      (LightRAG legacy with the strength left out);
    * more fields: the layouts above, the rest ignored with a warning; with no number where one
      of them expects it, the last field is the strength if it is a number (upstream's rule).
    """
    if len(rest) < 3:
        col.reject(pos, "wrong field count", raw, f"relationship needs at least 4 fields, got {len(rest) + 1}")
        return
    source, target, description, more = rest[0], rest[1], rest[2], rest[3:]
    keywords, strength, extra = "", None, False
    if not more:
        pass
    elif _is_number(more[0]):                              # source, target, description, strength
        strength, extra = more[0], len(more) > 1
    elif len(more) >= 2 and _is_number(more[1]):           # ..., keywords, strength
        keywords, strength, extra = more[0], more[1], len(more) > 2
    elif len(more) == 1:
        if clean_field(more[0]).lower() in _PLACEHOLDERS:
            strength = more[0]
        else:
            keywords = more[0]
    else:
        keywords = "" if clean_field(more[0]).lower() in _PLACEHOLDERS else more[0]
        strength = more[-1] if _is_number(more[-1]) else more[1]
        extra = len(more) > 2
    if extra:
        col.warn(pos, "extra fields ignored", raw, f"relationship has {len(rest) + 1} fields")
    weight = col.weight(strength, pos, raw)
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
    # the whole image may match an entity (4 fields) or a relation (5 fields: mKG-RAG's matching
    # prompt lets <image> stand for either); objects match entities, scene relations relations
    want = (4, 5) if kind == "image" else (5,) if kind == "relation" else (4,)
    if len(rest) + 1 not in want:
        col.reject(pos, "wrong field count", raw, f"{kind} mapping needs {' or '.join(map(str, want))} fields, "
                                                  f"got {len(rest) + 1}")
        return
    score = col.weight(rest[-1], pos, raw, "score")
    if score is None:
        return
    names = [clean_field(f) for f in rest[1:-1]]
    if not all(normalize_name(n) for n in names):
        col.reject(pos, "empty name", raw, f"{kind} mapping")
        return
    if len(names) == 2:
        if normalize_name(names[0]) == normalize_name(names[1]):
            col.reject(pos, "self-loop", raw, f"{names[0]!r} -> {names[1]!r}", severity="skip")
            return
        col.mappings.append(MappingRecord(kind, index, None, names[0], names[1], score, pos))
    else:
        col.mappings.append(MappingRecord(kind, index, names[0], None, None, score, pos))
    col.last_ok = True
