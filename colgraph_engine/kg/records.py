"""Typed records produced by the knowledge-graph extraction parsers.

Every record is frozen and carries ``position = (line, offset)``: ``line`` is the 1-based line
on which the record starts in the parsed text and ``offset`` the 0-based character offset of
its first character. JSON-mode records are the exception: there ``line`` is the 0-based index
of the record inside its JSON list and ``offset`` the offset of the JSON document, because the
standard JSON decoder does not report where nested values start.

Names keep the text the model wrote (minus surrounding quotes and whitespace); comparisons go
through :func:`normalize_name`, exposed on the records as ``key`` / ``source_key`` /
``target_key``, so that "MOUNT FUJI" in a mapping and "Mount Fuji" in an entity meet.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..graph.knowledge_graph import normalize_name

Position = tuple[int, int]
Severity = Literal["error", "skip", "warning"]
MappingKind = Literal["image", "object", "relation"]

# Quote characters models put around fields; stripped from both ends of every field.
QUOTES = "\"'`\u201c\u201d\u2018\u2019"


# Every character ``str.strip()`` removes (``str.isspace``); all of them lie below U+3001.
_WHITESPACE = "".join(c for c in map(chr, range(0x3001)) if c.isspace())
_EDGE = _WHITESPACE + QUOTES


def clean_field(text: str) -> str:
    """Strips surrounding whitespace and quote characters (repeatedly: ` "'x'" ` -> ``x``).

    One pass in linear time: the fixed point of alternately stripping whitespace and quotes is
    the text with every leading and trailing whitespace-or-quote character removed.
    """
    return text.strip(_EDGE)


@dataclass(frozen=True)
class EntityRecord:
    name: str
    type: str
    description: str
    position: Position

    @property
    def key(self) -> str:
        return normalize_name(self.name)


@dataclass(frozen=True)
class RelationRecord:
    source: str
    target: str
    keywords: str
    description: str
    weight: float | None
    position: Position

    @property
    def source_key(self) -> str:
        return normalize_name(self.source)

    @property
    def target_key(self) -> str:
        return normalize_name(self.target)


@dataclass(frozen=True)
class MappingRecord:
    """An image region matched to a text entity (image/object) or relation (relation).

    ``ref`` is the object or relation index from the scene graph, ``None`` for the whole image.
    Object mappings and image-to-entity mappings set ``entity``; relation mappings and
    image-to-relation mappings (the whole image showing a relation) set ``source`` and ``target``.
    """
    kind: MappingKind
    ref: int | None
    entity: str | None
    source: str | None
    target: str | None
    score: float
    position: Position


@dataclass(frozen=True)
class SceneObject:
    """A detected object; ``bbox = (x1, y1, x2, y2)`` normalised to [0, 1], top-left origin."""
    index: int
    category: str
    bbox: tuple[float, float, float, float]
    position: Position


@dataclass(frozen=True)
class SceneRelation:
    """``subject`` and ``object`` are object indices of the same scene graph."""
    index: int
    subject: int
    predicate: str
    object: int
    position: Position


@dataclass(frozen=True, slots=True)  # slots: a response can hold one issue per few bytes
class ParseIssue:
    """Something the parser noticed.

    severity: ``error`` (malformed; the record was dropped, strict mode raises), ``skip``
    (well-formed but dropped by rule in both modes, e.g. a self-loop) or ``warning`` (repaired
    or reinterpreted and kept). ``reason`` is a short stable phrase; ``detail`` says more.
    """
    position: Position
    reason: str
    raw_text: str
    severity: Severity = "error"
    detail: str = ""

    def __str__(self) -> str:
        line, offset = self.position
        extra = f" ({self.detail})" if self.detail else ""
        return f"{self.severity}: {self.reason}{extra} at line {line}, offset {offset}: {self.raw_text!r}"


@dataclass(frozen=True)
class ParseResult:
    """What one response parsed into.

    ``dialect`` is the dialect used (``None`` when nothing recognisable was found),
    ``complete`` whether the response is whole (completion marker present, JSON parsed),
    ``skipped`` how many records were dropped (errors and rule skips), ``ignored`` how many
    well-formed records were read and deliberately not kept (LightRAG ``content_keywords``).
    """
    dialect: str | None
    entities: tuple[EntityRecord, ...] = ()
    relations: tuple[RelationRecord, ...] = ()
    mappings: tuple[MappingRecord, ...] = ()
    objects: tuple[SceneObject, ...] = ()
    scene_relations: tuple[SceneRelation, ...] = ()
    issues: tuple[ParseIssue, ...] = ()
    complete: bool = True
    skipped: int = 0
    ignored: int = 0

    @property
    def errors(self) -> tuple[ParseIssue, ...]:
        return tuple(i for i in self.issues if i.severity == "error")

    @property
    def warnings(self) -> tuple[ParseIssue, ...]:
        return tuple(i for i in self.issues if i.severity == "warning")

    @property
    def counts(self) -> dict[str, int]:
        return {
            "entities": len(self.entities),
            "relations": len(self.relations),
            "mappings": len(self.mappings),
            "objects": len(self.objects),
            "scene_relations": len(self.scene_relations),
            "issues": len(self.issues),
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "skipped": self.skipped,
            "ignored": self.ignored,
        }


class ExtractionFormatError(ValueError):
    """Raised in strict mode; ``issues`` holds every issue found, the message names the first error."""

    def __init__(self, issues: list[ParseIssue] | tuple[ParseIssue, ...]):
        self.issues = tuple(issues)
        errors = [i for i in self.issues if i.severity == "error"]
        first = errors[0] if errors else self.issues[0]
        more = f" (and {len(errors) - 1} more error(s))" if len(errors) > 1 else ""
        super().__init__(f"text: malformed extraction output: {first}{more}")
        self.first = first


__all__ = [
    "Position", "Severity", "MappingKind", "clean_field", "normalize_name",
    "EntityRecord", "RelationRecord", "MappingRecord", "SceneObject", "SceneRelation",
    "ParseIssue", "ParseResult", "ExtractionFormatError",
]
