"""What every dialect's parser shares: delimiter and marker patterns, the collector that turns
fields into checked records and issues, and line/field helpers."""
from __future__ import annotations

import bisect
import math
import re

from ..records import (
    EntityRecord, ExtractionFormatError, MappingRecord, ParseIssue, ParseResult, Position,
    RelationRecord, SceneObject, SceneRelation, clean_field, normalize_name,
)

CURRENT_DELIMITER = "<|#|>"
TUPLE_DELIMITER = "<|>"

# Linear time by construction: every pattern in this package is written so that no two
# unbounded quantifiers can share the same characters (a whitespace run is always followed by a
# token that cannot be whitespace, and optional pieces carry their own whitespace), and no
# pattern that starts with whitespace is tried at every offset of a whitespace run. Backtracking
# then costs at most one step per character of the run a match attempt started next to, and each
# run borders a bounded number of attempts. Where a record's shape needs a lazy field between
# two delimiters (scene graphs), the line is cut with str methods instead of a regex.

# Anything that looks like a field delimiter, including the corruptions models produce:
# <|#|> <|#> <#|> <#> <<|#|>> (hash forms), <|> <||> <<|>> (pipe forms), and the hash form
# with one bracket lost. Which spelling is "clean" depends on the dialect; the rest are repairs.
# (``\s*(?:\|{1,2}\s*)?`` is ``\s*\|{0,2}\s*`` without its two adjacent whitespace runs.)
_DELIM = re.compile(
    r"<{1,2}\s*(?:\|{1,2}\s*)?#{1,2}\s*(?:\|{1,2}\s*)?>{1,2}"
    r"|<{1,2}\s*\|{1,2}\s*>{1,2}"
    r"|<\|#\|"
    r"|\|#\|>"
)
_COMPLETE = re.compile(r"<\|?\s*COMPLETE\s*\|?>", re.IGNORECASE)
_FENCE_LINE = re.compile(r"^[ \t]*```[\w-]*[ \t]*$", re.MULTILINE)
_BULLET = re.compile(r"^\s*(?:[-*]\s+)?")
# Reasoning blocks of "thinking" models (DeepSeek-R1, Qwen3, ...). Exact tags, no inner
# whitespace, so that a run of spaces after "<" costs nothing.
_THINK_TAG = re.compile(r"<(/?)think(?:ing)?>", re.IGNORECASE)
# A strength/score field that spells a number (what ``float`` reads, minus "nan"/"inf" words).
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


# Python refuses to convert longer digit strings (sys.get_int_max_str_digits, default 4300)
# and converts shorter ones in quadratic time; an index past this is reported, not converted.
_MAX_INDEX_DIGITS = 4300


def _index(digits: str) -> int | None:
    """The integer an index's digits spell, or ``None`` when it is too long to be an index."""
    if len(digits) > _MAX_INDEX_DIGITS:
        return None
    try:
        return int(digits)
    except ValueError:  # a lower interpreter limit (sys.set_int_max_str_digits)
        return None


def _check_args(text: object, strict: object) -> None:
    if not isinstance(text, str):
        raise TypeError(f"text: expected str, got {type(text).__name__}")
    if not isinstance(strict, bool):
        raise TypeError(f"strict: expected bool, got {type(strict).__name__}")


MAX_LISTED_ISSUES = 10_000  # per response; beyond it one summary issue counts the rest


class _Collector:
    """Accumulates records and issues for one response, then builds the result.

    At most :data:`MAX_LISTED_ISSUES` issues are listed one by one; the rest are counted in one
    ``more issues`` summary (an error when any of them is). ``skipped`` still counts every dropped
    record. A response with that many problems is garbage either way, and a list of one object
    per record made such a response cost ~1.5 s per MB, mostly in the garbage collector.
    """

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
        self.unlisted = 0           # issues past MAX_LISTED_ISSUES
        self.unlisted_errors = 0
        self.unlisted_last: Position | None = None
        self.last_ok = False        # whether the last record read was well formed (kept or skipped by rule)

    def pos(self, offset: int) -> Position:
        return (bisect.bisect_right(self._line_starts, offset), offset)

    def _note(self, issue_args: tuple, severity: str) -> None:
        if len(self.issues) < MAX_LISTED_ISSUES:
            self.issues.append(ParseIssue(*issue_args))
        else:
            self.unlisted += 1
            self.unlisted_errors += severity == "error"
            self.unlisted_last = issue_args[0]

    def warn(self, pos: Position, reason: str, raw: str, detail: str = "") -> None:
        self._note((pos, reason, raw, "warning", detail), "warning")

    def reject(self, pos: Position, reason: str, raw: str, detail: str = "", severity: str = "error") -> None:
        """Drops a record: an ``error`` (malformed) or a ``skip`` (dropped by rule)."""
        self._note((pos, reason, raw, severity, detail), severity)
        self.skipped += 1
        self.last_ok = severity != "error"

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

    def weight(self, value: str | None, pos: Position, raw: str, what: str = "weight") -> float | None:
        """A relation strength or mapping score: a number written as digits is read (and must be
        finite and >= 0, else the record is rejected); anything else (absent, empty, ``N/A``,
        ``high``, ``nan``) is 1.0 with a ``default weight`` warning.

        1.0 is what LightRAG, nano-graphrag and mKG-RAG use when the last field is not a number
        (``is_float_regex`` fails); GraphRAG does the same when ``float()`` fails.
        """
        cleaned = "" if value is None else clean_field(value)
        if _NUMBER.fullmatch(cleaned):
            return self.number(cleaned, pos, raw, what)
        self.warn(pos, f"default {what}", raw, "absent" if value is None else f"got {cleaned!r}; read as 1.0")
        return 1.0

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
        self.last_ok = True

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
        self.last_ok = True

    def finish(self, dialect: str | None, complete: bool, no_records_check: bool = True) -> ParseResult:
        """Builds the result. ``no_records_check``: an answer with no record at all is an error
        (pass ``False`` where the answer says itself that it is empty and whole: a completion
        marker, or JSON with its lists present and empty)."""
        found = self.entities or self.relations or self.mappings or self.objects or self.scene_relations
        if no_records_check and not found and not self.skipped and not self.ignored:
            self.issues.append(ParseIssue(self.pos(0), "no records", self.text[:200], "error",
                                          f"no {dialect or 'known-dialect'} record found"))
            complete = False
        if self.unlisted:
            self.issues.append(ParseIssue(self.unlisted_last, "more issues", "",
                                          "error" if self.unlisted_errors else "warning",
                                          f"{self.unlisted} more not listed ({self.unlisted_errors} errors); "
                                          "its position is the last one's"))
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
    """Returns the text before the completion marker and whether the marker was there.

    A missing marker is judged once the records are read: see :func:`_judge_completion`.
    """
    match = _COMPLETE.search(text)
    if match is None:
        return text, False
    tail = text[match.end():]
    if tail.strip():
        col.warn(col.pos(match.end()), "text after completion marker", tail.strip()[:200], "ignored")
    # Keep the length so that offsets stay valid.
    return text[:match.start()] + " " * (len(text) - match.start()), True


def _judge_completion(col: _Collector, text: str, complete: bool) -> None:
    """Reports a missing completion marker: a ``warning`` when records were read and the last
    one is whole (the answer most likely just left the marker out; mKG-RAG's paper figure does),
    an ``error`` when the last record is malformed (the answer was probably cut off) or when
    nothing was read."""
    if complete:
        return
    whole = col.last_ok and bool(col.entities or col.relations or col.mappings or col.ignored or col.skipped)
    col.issues.append(ParseIssue(col.pos(len(text)), "no completion marker", text[-80:],
                                 "warning" if whole else "error",
                                 "the records read are whole" if whole else "the response may have been cut off"))


def _without_reasoning(text: str) -> tuple[str, list[tuple[int, int]], int | None]:
    """Blanks the reasoning of "thinking" models, keeping every offset valid.

    Returns ``(text with each reasoning span replaced by spaces, the spans, offset of an
    unclosed <think> or None)``. A span is ``<think>...</think>`` (or ``<thinking>``), or, when
    the first tag is a closing one (APIs that strip the opening tag), everything before it. An
    opening tag never closed is blanked alone and reported: the answer is then read as written.
    One pass over the tags; linear time.
    """
    spans: list[tuple[int, int]] = []
    opened: int | None = None
    first = True
    for tag in _THINK_TAG.finditer(text):
        closing = bool(tag.group(1))
        if not closing:
            if opened is None:
                opened = tag.start()
        elif opened is not None:
            spans.append((opened, tag.end()))
            opened = None
        elif first:
            spans.append((0, tag.end()))
        else:
            spans.append(tag.span())  # a stray closing tag
        first = False
    unclosed = opened
    if unclosed is not None:
        spans.append((unclosed, text.index(">", unclosed) + 1))
    if not spans:
        return text, spans, None
    pieces, at = [], 0
    for start, end in spans:
        pieces += [text[at:start], " " * (end - start)]
        at = end
    pieces.append(text[at:])
    return "".join(pieces), spans, unclosed


def _strip_reasoning(col: _Collector, text: str) -> str:
    """:func:`_without_reasoning`, with a warning per span (what was left out is never silent)."""
    blanked, spans, unclosed = _without_reasoning(text)
    for start, end in spans:
        if start == unclosed:
            col.warn(col.pos(start), "unclosed reasoning", text[start:end], "<think> never closed; only the tag removed")
        else:
            col.warn(col.pos(start), "reasoning removed", text[start:start + 80],
                     f"{end - start} characters of <think> not parsed")
    return blanked


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
