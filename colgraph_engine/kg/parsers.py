"""Parsers for knowledge-graph extraction responses, in the dialects models really emit.

Dialects (``dialect=`` names):

``lightrag``       LightRAG's current line format: one record per line, fields separated by
                   ``<|#|>``: ``entity<|#|>name<|#|>type<|#|>description`` and
                   ``relation<|#|>source<|#|>target<|#|>keywords<|#|>description``; the
                   response ends with ``<|COMPLETE|>``. Relations carry no weight (``None``).
``lightrag_json``  LightRAG's JSON mode: ``{"entities": [...], "relationships": [...]}``,
                   possibly inside a ```json fence or surrounded by prose. No completion marker.
``tuple``          LightRAG legacy, GraphRAG, nano-graphrag and mKG-RAG: parenthesised records,
                   fields separated by ``<|>``, records by ``##`` (or new lines), ending with
                   ``<|COMPLETE|>``. Relationships end with a numeric strength: 6 fields with
                   keywords (LightRAG legacy: source, target, description, keywords, strength),
                   5 without (GraphRAG: source, target, description, strength).
                   ``content_keywords`` records are read and counted in ``ignored``; mKG-RAG
                   ``mapping`` records are accepted here too (its combined prompt mixes them in).
``mkg_mapping``    the same parser, for mKG-RAG region-mapping responses:
                   ``("mapping"|<image>|ENTITY|8)``, ``("mapping"|<object-3>|ENTITY|9)``,
                   ``("mapping"|<relation-2>|SOURCE|TARGET|7)``; ``|`` or ``<|>`` between fields.
``scene_graph``    mKG-RAG scene graphs: ``<object-i>: category, (x1, y1, x2, y2)`` with
                   coordinates in [0, 1], and ``<relation-j>: <object-a> predicate <object-b>``.
                   ``object_0`` spellings, ``- `` bullets and code fences are accepted.

Policy, the same for every dialect: each record is checked; a malformed one becomes an
``error`` issue and is dropped (lenient, the default) or makes the call raise
:class:`ExtractionFormatError` once the whole text has been read (``strict=True``). Repairs
(mangled delimiters, a relation written as an entity) keep the record and leave a ``warning``.
Self-loops are dropped in both modes with a ``skip`` issue. Nothing is dropped silently.
"""
from __future__ import annotations

import bisect
import json
import math
import re

from .records import (
    EntityRecord, ExtractionFormatError, MappingRecord, ParseIssue, ParseResult, Position,
    RelationRecord, SceneObject, SceneRelation, clean_field, normalize_name,
)

DIALECTS = ("lightrag", "lightrag_json", "tuple", "mkg_mapping", "scene_graph")

CURRENT_DELIMITER = "<|#|>"
TUPLE_DELIMITER = "<|>"

# Anything that looks like a field delimiter, including the corruptions models produce:
# <|#|> <|#> <#|> <#> <<|#|>> (hash forms), <|> <||> <<|>> (pipe forms), and the hash form
# with one bracket lost. Which spelling is "clean" depends on the dialect; the rest are repairs.
_DELIM = re.compile(
    r"<{1,2}\s*\|{0,2}\s*#{1,2}\s*\|{0,2}\s*>{1,2}"
    r"|<{1,2}\s*\|{1,2}\s*>{1,2}"
    r"|<\|#\|"
    r"|\|#\|>"
)
_COMPLETE = re.compile(r"<\|?\s*COMPLETE\s*\|?>", re.IGNORECASE)
_FENCE_LINE = re.compile(r"^[ \t]*```[\w-]*[ \t]*$", re.MULTILINE)
_BULLET = re.compile(r"^\s*(?:[-*]\s+)?")

# Detection signals (counted per response; the dialect with most signals wins).
_LIGHTRAG_LINE = re.compile(
    r"^\s*(?:[-*]\s+)?[\"']?(?:entity|relation|relationship)[\"']?\s*(?:" + _DELIM.pattern + ")",
    re.IGNORECASE | re.MULTILINE)
_TUPLE_RECORD = re.compile(
    r"\(\s*[\"']?(?:entity|relationship|relation|content_keywords|mapping)[\"']?\s*(?:"
    + _DELIM.pattern + r"|\|)", re.IGNORECASE)
_SCENE_LINE = re.compile(r"^\s*(?:[-*]\s+)?<\s*(?:object|relation)[-_ ]?\d+\s*>\s*:", re.IGNORECASE | re.MULTILINE)
_JSON_KEYS = re.compile(r"\"(?:entities|relationships|relations)\"\s*:\s*\[")

_REF = re.compile(r"^<\s*(?:(image)|(object|relation)[-_ ]?(\d+))\s*>$", re.IGNORECASE)
_OBJ = r"<\s*object[-_ ]?(\d+)\s*>"
_SCENE_OBJECT = re.compile(
    r"^<\s*object[-_ ]?(\d+)\s*>\s*:\s*(.*?)\s*,?\s*[(\[]([^()\[\]]*)[)\]]\s*\.?$", re.IGNORECASE)
_SCENE_RELATION = re.compile(
    r"^<\s*relation[-_ ]?(\d+)\s*>\s*:\s*" + _OBJ + r"\s+(.+?)\s+" + _OBJ + r"\s*\.?$", re.IGNORECASE)


# --------------------------------------------------------------------------------------------
# Public API


def parse_extraction(text: str, *, strict: bool = False, dialect: str | None = None) -> ParseResult:
    """Parses one extraction response; the dialect is detected from this response alone.

    Args:
        text: the model's raw response.
        strict: raise :class:`ExtractionFormatError` (a ``ValueError``) if any record is
            malformed, the completion marker is missing or nothing was found; by default such
            records are reported in ``issues``, counted in ``skipped`` and left out.
        dialect: one of ``DIALECTS`` to skip detection, or ``None`` to detect.

    Returns:
        a :class:`ParseResult`. Text with no recognisable record gives an empty result with
        ``dialect=None``, ``complete=False`` and a ``no records`` issue.
    """
    _check_args(text, strict)
    if dialect is not None:
        if not isinstance(dialect, str):
            raise TypeError(f"dialect: expected str or None, got {type(dialect).__name__}")
        if dialect not in DIALECTS:
            raise ValueError(f"dialect: expected one of {DIALECTS} or None, got {dialect!r}")
    else:
        dialect = detect_dialect(text)
    if dialect is None:
        return _Collector(text, strict).finish(None, complete=False, no_records_check=True)
    return _PARSERS[dialect](text, strict, dialect)


def parse_scene_graph(text: str, strict: bool = False) -> ParseResult:
    """Parses an mKG-RAG scene graph (objects with normalised boxes, and relations between them)."""
    _check_args(text, strict)
    return _parse_scene_graph(text, strict, "scene_graph")


def parse_region_mappings(text: str, strict: bool = False) -> ParseResult:
    """Parses mKG-RAG region mappings (image / object / relation matched to text entities)."""
    _check_args(text, strict)
    return _parse_tuple(text, strict, "mkg_mapping")


def detect_dialect(text: str) -> str | None:
    """Guesses the dialect of one response, or ``None`` if it has no recognisable record."""
    if not isinstance(text, str):
        raise TypeError(f"text: expected str, got {type(text).__name__}")
    # JSON first: descriptions inside JSON may quote other formats, the reverse is rare.
    if _JSON_KEYS.search(text):
        return "lightrag_json"
    scores = {
        "lightrag": len(_LIGHTRAG_LINE.findall(text)),
        "tuple": len(_TUPLE_RECORD.findall(text)),
        "scene_graph": len(_SCENE_LINE.findall(text)),
    }
    best = max(scores, key=lambda name: scores[name])  # ties go to the earlier entry
    return best if scores[best] > 0 else None


# --------------------------------------------------------------------------------------------
# Shared machinery


def _check_args(text: object, strict: object) -> None:
    if not isinstance(text, str):
        raise TypeError(f"text: expected str, got {type(text).__name__}")
    if not isinstance(strict, bool):
        raise TypeError(f"strict: expected bool, got {type(strict).__name__}")


class _Collector:
    """Accumulates records and issues for one response, then builds the result."""

    def __init__(self, text: str, strict: bool):
        self.text = text
        self.strict = strict
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.entities: list[EntityRecord] = []
        self.relations: list[RelationRecord] = []
        self.mappings: list[MappingRecord] = []
        self.objects: list[SceneObject] = []
        self.scene_relations: list[SceneRelation] = []
        self.issues: list[ParseIssue] = []
        self.skipped = 0
        self.ignored = 0

    def pos(self, offset: int) -> Position:
        return (bisect.bisect_right(self._line_starts, offset), offset)

    def warn(self, pos: Position, reason: str, raw: str, detail: str = "") -> None:
        self.issues.append(ParseIssue(pos, reason, raw, "warning", detail))

    def reject(self, pos: Position, reason: str, raw: str, detail: str = "", severity: str = "error") -> None:
        """Drops a record: an ``error`` (malformed) or a ``skip`` (dropped by rule)."""
        self.issues.append(ParseIssue(pos, reason, raw, severity, detail))
        self.skipped += 1

    def number(self, value: str, pos: Position, raw: str, what: str) -> float | None:
        """Tolerant float parsing ("8", "8.0", " 0.9 ", '"7"'); rejects the record otherwise."""
        cleaned = clean_field(value)
        try:
            number = float(cleaned)
        except ValueError:
            self.reject(pos, f"non-numeric {what}", raw, f"got {cleaned!r}")
            return None
        if not math.isfinite(number) or number < 0:
            self.reject(pos, f"invalid {what}", raw, f"expected a finite number >= 0, got {cleaned!r}")
            return None
        return number

    def add_entity(self, pos: Position, raw: str, name: str, type_: str, description: str) -> None:
        name, type_, description = clean_field(name), clean_field(type_), clean_field(description)
        if not normalize_name(name):
            self.reject(pos, "empty name", raw, "entity name")
            return
        if not type_:
            self.reject(pos, "empty type", raw, f"entity {name!r}")
            return
        if not description:
            self.warn(pos, "empty description", raw, f"entity {name!r}")
        self.entities.append(EntityRecord(name, type_, description, pos))

    def add_relation(self, pos: Position, raw: str, source: str, target: str, keywords: str,
                     description: str, weight: float | None) -> None:
        source, target = clean_field(source), clean_field(target)
        if not normalize_name(source) or not normalize_name(target):
            self.reject(pos, "empty name", raw, "relation source" if not normalize_name(source) else "relation target")
            return
        # A relation from a node to itself adds no edge worth retrieving and breaks undirected
        # merging; it is dropped in both modes, but reported.
        if normalize_name(source) == normalize_name(target):
            self.reject(pos, "self-loop", raw, f"{source!r} -> {target!r}", severity="skip")
            return
        self.relations.append(RelationRecord(source, target, clean_field(keywords), clean_field(description), weight, pos))

    def finish(self, dialect: str | None, complete: bool, no_records_check: bool = True) -> ParseResult:
        found = self.entities or self.relations or self.mappings or self.objects or self.scene_relations
        if no_records_check and not found and not self.skipped and not self.ignored:
            self.issues.append(ParseIssue(self.pos(0), "no records", self.text[:200], "error",
                                          f"no {dialect or 'known-dialect'} record found"))
            complete = False
        result = ParseResult(
            dialect=dialect, entities=tuple(self.entities), relations=tuple(self.relations),
            mappings=tuple(self.mappings), objects=tuple(self.objects),
            scene_relations=tuple(self.scene_relations), issues=tuple(self.issues),
            complete=complete, skipped=self.skipped, ignored=self.ignored)
        if self.strict and result.errors:
            raise ExtractionFormatError(result.issues)
        return result


def _blank_fences(text: str) -> str:
    """Replaces code-fence lines by spaces, keeping every offset valid."""
    return _FENCE_LINE.sub(lambda m: " " * len(m.group(0)), text)


def _cut_at_completion(col: _Collector, text: str) -> tuple[str, bool]:
    """Returns the text before the completion marker and whether the marker was there."""
    match = _COMPLETE.search(text)
    if match is None:
        col.issues.append(ParseIssue(col.pos(len(text)), "no completion marker", text[-80:], "error",
                                     "the response may have been cut off"))
        return text, False
    tail = text[match.end():]
    if tail.strip():
        col.warn(col.pos(match.end()), "text after completion marker", tail.strip()[:200], "ignored")
    # Keep the length so that offsets stay valid.
    return text[:match.start()] + " " * (len(text) - match.start()), True


def _split_fields(body: str, clean: str) -> tuple[list[str], list[str]]:
    """Splits on anything delimiter-like; returns the fields and the non-clean delimiters seen."""
    fields = _DELIM.split(body)
    if clean.join(fields) == body:  # every delimiter was the clean one (the common case)
        return fields, []
    odd = sorted({m.group(0) for m in _DELIM.finditer(body) if m.group(0) != clean})
    return fields, odd


def _kind(field: str) -> str:
    return clean_field(field).lower().replace(" ", "_")


def _looks_numeric(field: str) -> bool:
    try:
        float(clean_field(field))
    except ValueError:
        return False
    return True


def _records_by_line(col, body: str):
    """Yields ``(position, stripped line, line without a leading bullet)`` for non-blank lines."""
    offset = 0
    for line in body.splitlines(keepends=True):
        start, offset = offset, offset + len(line)
        raw = line.strip()
        if raw:
            yield col.pos(start + len(line) - len(line.lstrip())), raw, _BULLET.sub("", raw, count=1)


# --------------------------------------------------------------------------------------------
# LightRAG current line format


def _parse_lightrag(text: str, strict: bool, dialect: str) -> ParseResult:
    col = _Collector(text, strict)
    body, complete = _cut_at_completion(col, _blank_fences(text))
    rows = []  # (pos, raw, kind, fields, odd delimiters)
    for pos, raw, content in _records_by_line(col, body):
        fields, odd = _split_fields(content, CURRENT_DELIMITER)
        kind = _kind(fields[0])
        if len(fields) == 1:
            if kind.split("<")[0].split(":")[0] in ("entity", "relation", "relationship"):
                col.reject(pos, "missing delimiter", raw, "no <|#|> between fields")
            else:
                # Prose around the records ("Here are the entities:") is noted, not an error.
                col.warn(pos, "text outside records", raw, "ignored")
            continue
        rows.append((pos, raw, kind, fields[1:], odd))

    # Entity names declared anywhere in the response decide whether a 5-field "entity" is a
    # relation in disguise, so they are collected before records are built.
    declared = {normalize_name(f[0]) for _, _, kind, f, _ in rows if kind == "entity" and len(f) == 3}
    for pos, raw, kind, fields, odd in rows:
        if odd:
            col.warn(pos, "repaired delimiter", raw, f"read {', '.join(odd)} as {CURRENT_DELIMITER}")
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
    return col.finish(dialect, complete)


# --------------------------------------------------------------------------------------------
# Parenthesised tuple records (LightRAG legacy, GraphRAG, nano-graphrag, mKG-RAG)

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
    index = None if kind == "image" else int(ref.group(3))
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


# --------------------------------------------------------------------------------------------
# LightRAG JSON mode


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


# --------------------------------------------------------------------------------------------
# mKG-RAG scene graphs


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


_PARSERS = {
    "lightrag": _parse_lightrag,
    "lightrag_json": _parse_json,
    "tuple": _parse_tuple,
    "mkg_mapping": _parse_tuple,
    "scene_graph": _parse_scene_graph,
}

__all__ = ["DIALECTS", "parse_extraction", "parse_scene_graph", "parse_region_mappings", "detect_dialect"]
