"""Per-document multimodal knowledge graphs: record formats and parsers for extraction output.

Only the parsing layer lives here for now: :func:`parse_extraction` reads one model response
in any supported dialect into typed records, reporting every record it could not use.
"""
from .parsers import DIALECTS, detect_dialect, parse_extraction, parse_region_mappings, parse_scene_graph
from .records import (
    EntityRecord, ExtractionFormatError, MappingRecord, ParseIssue, ParseResult, RelationRecord,
    SceneObject, SceneRelation, normalize_name,
)

__all__ = [
    "DIALECTS", "detect_dialect", "parse_extraction", "parse_region_mappings", "parse_scene_graph",
    "EntityRecord", "RelationRecord", "MappingRecord", "SceneObject", "SceneRelation",
    "ParseIssue", "ParseResult", "ExtractionFormatError", "normalize_name",
]
