"""Per-document multimodal knowledge graphs: extraction records, their parsers, segmentation.

So far: :func:`parse_extraction` reads one model response in any supported dialect into typed
records, reporting every record it could not use; :func:`segment_sections` cuts a document
into retrieval units by mKG-RAG's rule. Graph building and the index directory come next.
"""
from .parsers import DIALECTS, detect_dialect, parse_extraction, parse_region_mappings, parse_scene_graph
from .segment import Section, Segment, segment_sections
from .records import (
    EntityRecord, ExtractionFormatError, MappingRecord, ParseIssue, ParseResult, RelationRecord,
    SceneObject, SceneRelation, normalize_name,
)

__all__ = [
    "DIALECTS", "detect_dialect", "parse_extraction", "parse_region_mappings", "parse_scene_graph",
    "EntityRecord", "RelationRecord", "MappingRecord", "SceneObject", "SceneRelation",
    "ParseIssue", "ParseResult", "ExtractionFormatError", "normalize_name",
    "Section", "Segment", "segment_sections",
]
