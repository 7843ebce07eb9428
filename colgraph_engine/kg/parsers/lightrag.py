"""LightRAG's current line format: ``entity<|#|>...`` / ``relation<|#|>...`` records, one per line."""
from __future__ import annotations

from ..records import ParseResult, clean_field, normalize_name
from ._common import (
    CURRENT_DELIMITER, _blank_fences, _Collector, _cut_at_completion, _judge_completion, _kind, _records_by_line,
    _split_fields, _strip_reasoning,
)

_KINDS = ("entity", "relation", "relationship")
_FIELDS = {"entity": 3, "relation": 4, "relationship": 4}  # fields after the kind


def _parse_lightrag(text: str, strict: bool, dialect: str) -> ParseResult:
    col = _Collector(text, strict)
    body, complete = _cut_at_completion(col, _blank_fences(_strip_reasoning(col, text)))
    rows = []  # (pos, raw, kind, fields, odd delimiters)
    for pos, raw, content in _records_by_line(col, body):
        fields, odd = _split_fields(content, CURRENT_DELIMITER)
        kind = _kind(fields[0])
        if len(fields) == 1:
            if kind.split("<")[0].split(":")[0] in _KINDS:
                col.reject(pos, "missing delimiter", raw, "no <|#|> between fields")
            else:
                # Prose around the records ("Here are the entities:") is noted, not an error.
                col.warn(pos, "text outside records", raw, "ignored")
            continue
        pieces = _split_joined(fields)
        if len(pieces) > 1:
            col.warn(pos, "records joined on one line", raw, f"read as {len(pieces)} records")
        for piece in pieces:
            rows.append((pos, raw, _kind(piece[0]), piece[1:], odd))

    # Entity names declared anywhere in the response decide whether a 5-field "entity" is a
    # relation in disguise, so they are collected before records are built.
    declared = {normalize_name(f[0]) for _, _, kind, f, _ in rows if kind == "entity" and len(f) == 3}
    for pos, raw, kind, fields, odd in rows:
        if odd:
            col.warn(pos, "repaired delimiter", raw, f"read {', '.join(odd)} as {CURRENT_DELIMITER}")
        if kind in _FIELDS and len(fields) > _FIELDS[kind] and not clean_field(fields[-1]):
            # "...<|#|>description<|#|>": a delimiter left dangling at the end of the line.
            while len(fields) > _FIELDS[kind] and not clean_field(fields[-1]):
                fields = fields[:-1]
            col.warn(pos, "dangling delimiter", raw, "empty last field dropped")
        if kind == "entity":
            if len(fields) == 3:
                col.add_entity(pos, raw, *fields)
            elif len(fields) == 4 and normalize_name(fields[1]) in declared:
                # entity<|#|>A<|#|>B<|#|>kw<|#|>desc where B is a declared entity: the shape of
                # a relation, not of an entity whose type happens to be a name.
                col.warn(pos, "reclassified entity as relation", raw, "5 fields and a declared entity as target")
                col.add_relation(pos, raw, fields[0], fields[1], fields[2], fields[3], None)
            else:
                col.reject(pos, "wrong field count", raw, f"entity needs 4 fields, got {len(fields) + 1}")
        elif kind in ("relation", "relationship"):
            if len(fields) == 4:
                col.add_relation(pos, raw, *fields, None)
            else:
                col.reject(pos, "wrong field count", raw, f"relation needs 5 fields, got {len(fields) + 1}")
        else:
            col.reject(pos, "unknown record type", raw, f"got {clean_field(fields[0])!r}")
    _judge_completion(col, text, complete)
    return col.finish(dialect, complete, no_records_check=not (complete and not body.strip()))


def _split_joined(fields: list[str]) -> list[list[str]]:
    """Cuts one line holding several records (``entity<|#|>A<|#|>t<|#|>d<|#|>entity<|#|>B...``,
    the delimiter used as record separator; LightRAG repairs the same slip) into records.

    A cut is made only where a record of the first kind is complete and the next field is a
    record kind, so an entity whose type is literally "relation" is not cut.
    """
    pieces, start = [], 0
    while True:
        kind = _kind(fields[start])
        need = _FIELDS.get(kind)
        cut = start + need + 1 if need is not None else len(fields)
        if cut < len(fields) and _kind(fields[cut]) in _KINDS:
            pieces.append(fields[start:cut])
            start = cut
        else:
            pieces.append(fields[start:])
            return pieces
