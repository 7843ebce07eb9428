"""Parsers for knowledge-graph extraction responses, in the dialects models really emit.

Dialects (``dialect=`` names):

``lightrag``       LightRAG's current line format: one record per line, fields separated by
                   ``<|#|>``: ``entity<|#|>name<|#|>type<|#|>description`` and
                   ``relation<|#|>source<|#|>target<|#|>keywords<|#|>description``; the
                   response ends with ``<|COMPLETE|>``. Relations carry no weight (``None``).
``lightrag_json``  LightRAG's JSON mode: ``{"entities": [...], "relationships": [...]}``,
                   possibly inside a ```json fence or surrounded by prose. No completion marker.
                   Also LightRAG's ``entity_name`` / ``source_entity`` / ``target_entity`` keys and
                   fast-graphrag's ``desc`` and ``other_relationships``.
``tuple``          LightRAG legacy, GraphRAG, nano-graphrag and mKG-RAG: parenthesised records,
                   fields separated by ``<|>``, records by ``##``, mKG-RAG's ``<|RECORD|>``, new
                   lines, or spaces between ``)`` and the next record's ``(``, ending with
                   ``<|COMPLETE|>``. Relationships: source, target, description, then a strength
                   (GraphRAG, nano-graphrag, mKG-RAG) or keywords and a strength (LightRAG
                   legacy). A strength that is absent or not a number (``N/A``, ``high``) is 1.0
                   with a warning, as upstream. Extra trailing fields are ignored with a warning
                   (upstream reads >= 4 entity / >= 5 relationship fields). An entity record
                   with a numeric last field is a relation only when its second field names a
                   declared entity. ``content_keywords`` records are read and counted in
                   ``ignored``; mKG-RAG ``mapping`` / ``matching`` records are accepted here too.
``mkg_mapping``    the same parser, for mKG-RAG region-mapping responses:
                   ``("mapping"|<image>|ENTITY|8)``, ``("matching"|<object-3>|ENTITY|9)``,
                   ``("mapping"|<relation-2>|SOURCE|TARGET|7)``; ``|`` or ``<|>`` between fields.
``scene_graph``    mKG-RAG scene graphs: ``<object-i>: category, (x1, y1, x2, y2)`` with
                   coordinates in [0, 1], and ``<relation-j>: <object-a> predicate <object-b>``.
                   ``object_0`` spellings, ``- `` bullets and code fences are accepted.

Policy, the same for every dialect: each record is checked; a malformed one becomes an
``error`` issue and is dropped (lenient, the default) or makes the call raise
:class:`ExtractionFormatError` once the whole text has been read (``strict=True``). Repairs
(mangled or dangling delimiters, a relation written as an entity, extra fields, a default
weight, records joined on one line) keep the record and leave a ``warning``. Self-loops are
dropped in both modes with a ``skip`` issue. Nothing is dropped silently.

Reasoning models: ``<think>...</think>`` blocks (and everything before a leading orphan
``</think>``) are blanked before detection and parsing, with a warning; a completion marker
inside them does not end the answer. A well-formed empty answer (the completion marker alone;
JSON with empty lists) is a valid empty result, also in strict mode. A missing completion
marker is a warning when the last record read is whole, an error when it is malformed (the
answer was probably cut off); ``complete`` stays ``False`` either way.

Modules: one per dialect family (``lightrag``, ``tuples``, ``json_mode``, ``scene``); the shared
collector, delimiter patterns and helpers are in ``_common``; detection and the public
functions are here.
"""
from __future__ import annotations

import re

from ..records import ParseResult
from ._common import (
    _COMPLETE, _DELIM, CURRENT_DELIMITER, TUPLE_DELIMITER, _blank_fences, _check_args, _Collector, _strip_reasoning,
    _without_reasoning,
)
from .json_mode import _parse_json
from .lightrag import _parse_lightrag
from .scene import _parse_scene_graph
from .tuples import _parse_tuple

DIALECTS = ("lightrag", "lightrag_json", "tuple", "mkg_mapping", "scene_graph")

# Detection signals (counted per response; the dialect with most signals wins). A line's leading
# whitespace is ``[^\S\n]*``, not ``\s*``: the count is the same (the match would only start at
# an earlier blank line), but no attempt runs on across the following lines, so blank lines
# cost one step each instead of one step per remaining line.
_LIGHTRAG_LINE = re.compile(
    r"^[^\S\n]*(?:[-*]\s+)?[\"']?(?:entity|relation|relationship)[\"']?\s*(?:" + _DELIM.pattern + ")",
    re.IGNORECASE | re.MULTILINE)
_TUPLE_RECORD = re.compile(
    r"\(\s*[\"']?(?:entity|relationship|relation|content_keywords|mapping|matching)[\"']?\s*(?:"
    + _DELIM.pattern + r"|\|)", re.IGNORECASE)
_SCENE_LINE = re.compile(r"^[^\S\n]*(?:[-*]\s+)?<\s*(?:object|relation)[-_ ]?\d+\s*>\s*:", re.IGNORECASE | re.MULTILINE)
_JSON_KEYS = re.compile(r"\"(?:entities|relationships|relations)\"\s*:\s*\[")

_PARSERS = {
    "lightrag": _parse_lightrag,
    "lightrag_json": _parse_json,
    "tuple": _parse_tuple,
    "mkg_mapping": _parse_tuple,
    "scene_graph": _parse_scene_graph,
}


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
        return _no_dialect(text, strict)
    return _PARSERS[dialect](text, strict, dialect)


def _no_dialect(text: str, strict: bool) -> ParseResult:
    """A response with no record of any dialect: valid and empty when it is only a completion
    marker (after reasoning and code fences), otherwise an error (``no records``)."""
    col = _Collector(text, strict)
    body = _blank_fences(_strip_reasoning(col, text))
    marker = _COMPLETE.search(body)
    if marker is not None and not (body[:marker.start()] + body[marker.end():]).strip():
        return col.finish(None, complete=True, no_records_check=False)
    return col.finish(None, complete=False, no_records_check=True)


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
    # Records written while "thinking" are drafts, not the answer: they do not vote.
    text = _without_reasoning(text)[0]
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


__all__ = ["CURRENT_DELIMITER", "DIALECTS", "TUPLE_DELIMITER", "detect_dialect", "parse_extraction",
           "parse_region_mappings", "parse_scene_graph"]
